#!/usr/bin/env bash
# All binaries prebuilt. v97 (fwd-lazy: P against a lazy reference, the D = 128 consumer's p
# before its maximum, the fold one FFMA): (1) smoke of the forward's specification tests;
# (2) A/B of the fp8 forward, head (main's kernels) vs lazy, four workloads, 3 rounds;
# (3) the rest of lazy's GPU suite while time is left.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/head"
f='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*'
timeout 150 .ab/lazy/prebuilt/flamia_gpu_tests --gtest_filter="$f" > $OUT/lazy_smoke.txt 2>&1 && trees="$trees .ab/lazy"
echo "lazy smoke at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/lazy_smoke.txt | head -2 | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/lazy_smoke.txt | head -8
mkdir -p $OUT/ab
WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  WHAT="main's kernels (head) against v97 (lazy: P against a lazy reference, p before the maximum at D = 128)" \
  OUT=$OUT/ab timeout 240 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
left=$(( 570 - $(el) ))
if [ $left -gt 30 ]; then
  timeout $left .ab/lazy/prebuilt/flamia_gpu_tests --gtest_filter="-$f" > $OUT/lazy_rest.txt 2>&1
  echo "lazy rest rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/lazy_rest.txt | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/lazy_rest.txt | head -8
  tail -3 $OUT/lazy_rest.txt
fi
echo "done at $(el) s"
