#!/usr/bin/env bash
# All binaries prebuilt. v97b (fwd-lazy, 2dbc3a4: v97 with the rescale only where a reference
# moved, the phase marks once a tile): (1) smoke + the phase-clock test; (2) A/B of the fp8
# forward, head (main's kernels) vs lazy, four workloads, 3 rounds; (3) lazy's phase clocks on
# fixed-16k and llama8b-pack (the traced kernel); (4) the rest of lazy's GPU suite if time is left.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/head"
f='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:PhaseTrace*'
timeout 150 .ab/lazy/prebuilt/flamia_gpu_tests --gtest_filter="$f" > $OUT/lazy_smoke.txt 2>&1 && trees="$trees .ab/lazy"
echo "lazy smoke at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/lazy_smoke.txt | head -2 | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/lazy_smoke.txt | head -8
mkdir -p $OUT/ab
WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  WHAT="main's kernels (head) against v97b (lazy: P against a lazy reference, p before the maximum at D = 128)" \
  OUT=$OUT/ab timeout 240 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
H=.ab/lazy/prebuilt
for w in fixed-16k llama8b-pack; do
  [ $(el) -gt 400 ] && break
  FLAMIA_FWD_TRACE=$OUT/fwd_$w.trace timeout 30 $H/flamia_bench --workloads $w --recipes fp8 --iters 1 > $OUT/trace_bench_$w.txt 2>&1
  python3 .ab/lazy/tools/fwd_trace_summary.py $OUT/fwd_$w.trace > $OUT/trace_$w.txt 2>&1
  echo "== $w"; cat $OUT/trace_$w.txt
  rm -f $OUT/fwd_$w.trace
done
left=$(( 560 - $(el) ))
if [ $left -gt 30 ]; then
  timeout $left $H/flamia_gpu_tests --gtest_filter="-$f" > $OUT/lazy_rest.txt 2>&1
  echo "lazy rest rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/lazy_rest.txt | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/lazy_rest.txt | head -8
fi
echo "done at $(el) s"
