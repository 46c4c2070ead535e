#!/usr/bin/env bash
# The checks a kernel change lands with, on one prebuilt tree (tools/prebuild_trees.sh): the
# whole GPU suite, compute-sanitizer memcheck on the isolation, causal-safety, D = 64
# non-finite and determinism cases, and the fuzzer's 200 cases. Logs in $OUT: gpu_suite.txt,
# memcheck.short.txt (the sanitizer's summary and gtest's verdicts), fuzz.txt; one line per
# check on stdout; exit status nonzero if any check failed.
#   OUT=... bash tools/landing_checks.sh .ab/main
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 TREE (a tools/prebuild_trees.sh tree)"; exit 2; }
: "${OUT:?OUT: the folder for the logs}"
T=$1/prebuilt
for b in flamia_gpu_tests flamia_fuzz; do
  [ -x "$T/$b" ] || { echo "$T/$b: missing (tools/prebuild_trees.sh builds it)"; exit 2; }
done
failed=0
timeout 150 "$T/flamia_gpu_tests" >"$OUT/gpu_suite.txt" 2>&1
rc=$?
[ $rc = 0 ] || failed=1
echo "GPU suite exit $rc after $SECONDS s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' "$OUT/gpu_suite.txt" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$OUT/gpu_suite.txt" | head -5
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 "$T/flamia_gpu_tests" \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' >"$OUT/memcheck.txt" 2>&1
rc=$?
[ $rc = 0 ] || failed=1
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/memcheck.txt" >"$OUT/memcheck.short.txt"
rm -f "$OUT/memcheck.txt"
echo "memcheck exit $rc after $SECONDS s: $(grep 'ERROR SUMMARY' "$OUT/memcheck.short.txt" | tail -1)"
timeout 90 "$T/flamia_fuzz" --cases 200 >"$OUT/fuzz.txt" 2>&1
rc=$?
[ $rc = 0 ] || failed=1
echo "fuzz exit $rc after $SECONDS s: $(tail -1 "$OUT/fuzz.txt")"
exit $failed
