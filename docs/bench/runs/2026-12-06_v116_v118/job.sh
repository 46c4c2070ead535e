#!/usr/bin/env bash
# v116 + v117 (tree v117: the forward's and fp8_mixed's dK/dV pass's next-stage waits moved
# at D = 64 only) and v118 (tree v118: v117 and the key-scale wait in S's shadow) against
# main: the GPU checks of v118's tree (forward and backward cases: every change is in it),
# the fp8 forward A/B of the three trees, then fp8_mixed's backward and step at D = 64.
# Trees: tools/make_trees.sh main=main v117=d64-waits v118=fwd-ready-in-shadow, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v117, .ab/v118.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v117/prebuilt/COMMIT .ab/v118/prebuilt/COMMIT
timeout 240 .ab/v118/prebuilt/flamia_gpu_tests \
  --gtest_filter='*Shapes.MatchesSpec/*:*Matrix*:*QStart*:*LazyReference*:*HugeLogits*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*:*StoredDq*' \
  >"$OUT/gpu_checks_v118.txt" 2>&1
rc=$?
echo "GPU checks v118 exit $rc after $SECONDS s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu_checks_v118.txt" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$OUT/gpu_checks_v118.txt" | head -5
[ $rc = 0 ] || exit 1
OUT=$OUT/fwd WORKLOADS=fixed-16k,pack-32k,llama1b-pack RECIPES=fp8 PHASES=fwd ROUNDS=3 \
  timeout 200 bash tools/ab_bench.sh .ab/main .ab/v117 .ab/v118 2>&1 | tail -6
OUT=$OUT/bwd WORKLOADS=llama1b-pack RECIPES=fp8_mixed PHASES=bwd,step ROUNDS=5 \
  timeout 150 bash tools/ab_bench.sh .ab/main .ab/v117 2>&1 | tail -5
rm -f "$OUT"/*/bench_* "$OUT"/*/ab_rounds.tar.gz
