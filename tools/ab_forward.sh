#!/usr/bin/env bash
# One GPU call's comparison of forward versions (or, with FILTER, RECIPES and PHASES, of
# backward ones): each candidate tree's prebuilt GPU tests on the forward's checks (the
# specification's shapes, the D = 64 and 128 matrix, q_start, the lazy reference, large, huge
# and non-finite logits, causal safety, isolation, determinism), then tools/ab_bench.sh of the
# reference tree against the candidates that passed. Trees are tools/make_trees.sh trees
# built by tools/prebuild_trees.sh; the reference is not checked.
#   OUT=... bash tools/ab_forward.sh .ab/main .ab/v111 .ab/v111b
# Environment: OUT (required: gpu_checks_<tree>.txt here, the A/B's ab_bench.md and
# ab_bench_runs.json under $OUT/ab), FILTER (the checks' gtest filter), CHECKS=backward (each
# candidate's checks are tools/backward_checks.sh's instead: the backward's, in both dQ forms;
# verdicts under $OUT/checks_<tree>/), and ab_bench.sh's
# WORKLOADS (default the four D = 128 workloads and llama1b-pack), RECIPES (fp8), ROUNDS (3),
# PHASES (fwd,step); AB_SECONDS bounds the A/B (default 300).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 REF_TREE TREE [TREE ...]"; exit 2; }
: "${OUT:?OUT: the folder for the logs}"
FILTER=${FILTER:-'*Shapes.MatchesSpec/*:*Matrix*:*QStart*:*LazyReference*:*HugeLogits*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'}
trees=$1
shift
for t in "$@"; do
  n=$(basename "$t")
  if [ "${CHECKS:-}" = backward ]; then
    mkdir -p "$OUT/checks_$n"
    OUT=$OUT/checks_$n bash "$ROOT/tools/backward_checks.sh" "$t" && trees="$trees $t"
    continue
  fi
  timeout 120 "$t/prebuilt/flamia_gpu_tests" --gtest_filter="$FILTER" >"$OUT/gpu_checks_$n.txt" 2>&1
  rc=$?
  echo "GPU checks $n exit $rc after $SECONDS s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_checks_$n.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/gpu_checks_$n.txt" | head -5
  [ $rc = 0 ] && trees="$trees $t"
done
[ "$trees" != "${trees%% *}" ] || { echo "no candidate passed its checks"; exit 1; }
mkdir -p "$OUT/ab"
# shellcheck disable=SC2086  # the trees, split on purpose
OUT=$OUT/ab WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack} RECIPES=${RECIPES:-fp8} \
  ROUNDS=${ROUNDS:-3} PHASES=${PHASES:-fwd,step} timeout "${AB_SECONDS:-300}" bash "$ROOT/tools/ab_bench.sh" $trees 2>&1 | tail -12
# The per-run JSONs are in ab_bench_runs.json; the bundle is not worth a device call's return.
rm -f "$OUT"/ab/bench_* "$OUT"/ab/ab_rounds.tar.gz
