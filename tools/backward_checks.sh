#!/usr/bin/env bash
# The backward's GPU checks on one prebuilt tree (tools/prebuild_trees.sh), with each dQ form
# (FLAMIA_BWD_DQ=hbm: fp8_mixed's stored dS at head dim 128; recompute: the dQ pass
# everywhere): specification agreement, the matrix of shapes, the stored dS, large logits,
# non-finite inputs, causal safety, document isolation and determinism. Faster than
# tools/landing_checks.sh (the whole suite, the sanitizer, the fuzzer), for a change to the
# backward's kernels before it is timed. Verdicts in $OUT/checks_FORM.txt; one line per form
# on stdout; exit status nonzero if a form failed.
#   OUT=... bash tools/backward_checks.sh .ab/v128
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 TREE (a tools/prebuild_trees.sh tree)"; exit 2; }
: "${OUT:?OUT: the folder for the verdicts}"
tests=$1/prebuilt/flamia_gpu_tests
[ -x "$tests" ] || { echo "$tests: missing (tools/prebuild_trees.sh builds it)"; exit 2; }
filter='*Shapes.MatchesSpec/*:*Matrix*:*StoredDq*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
failed=0
for form in hbm recompute; do
  log=$(mktemp)
  FLAMIA_BWD_DQ=$form timeout 100 "$tests" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || failed=1
  echo "backward checks (FLAMIA_BWD_DQ=$form) exit $rc after $SECONDS s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$log" | head -5
  grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$log" >"$OUT/checks_$form.txt"
  rm -f "$log"
done
exit $failed
