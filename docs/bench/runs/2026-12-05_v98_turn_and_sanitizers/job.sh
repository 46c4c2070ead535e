#!/usr/bin/env bash
# All binaries prebuilt. (1) v98 (fwd-lazy-turn, 66594c7: the D = 128 softmaxes in turn on the
# lazy reference) smoke; (2) A/B of the fp8 forward: head (main before v97, f9a292c), lazy
# (main's kernels now, = 2dbc3a4), turn; 4 workloads, 3 rounds; (3) compute-sanitizer
# memcheck, racecheck, synccheck of main's kernels (lazy) on the small forward cases.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/head .ab/lazy"
f='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:PhaseTrace*'
timeout 150 .ab/turn/prebuilt/flamia_gpu_tests --gtest_filter="$f" > $OUT/turn_smoke.txt 2>&1 && trees="$trees .ab/turn"
echo "turn smoke at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/turn_smoke.txt | head -2 | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/turn_smoke.txt | head -8
mkdir -p $OUT/ab
WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  WHAT="main before v97 (head) against main's kernels (lazy, v97b) and v98 (turn: softmaxes in turn on the lazy reference)" \
  OUT=$OUT/ab timeout 240 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz $OUT/ab/ab_bench_runs.json
H=.ab/lazy/prebuilt
# The speculative pass needs a row's third tile unmasked (rows >= 256 causal, any row of a
# non-causal document longer than 128): LargeLogits' 333-token and primes' 1021-token documents.
for tool in memcheck racecheck synccheck; do
  left=$(( 570 - $(el) )); [ $left -lt 40 ] && break
  t=$(( left < 110 ? left : 110 ))
  filt='*Shapes.MatchesSpec/Small*:*LargeLogits*/fp8_D128*:*NonFinite*/fp8_D128*'
  [ $tool = memcheck ] && filt="$filt:*Shapes.MatchesSpec/primes_mixed_D128_full"
  timeout $t "$SANITIZER" --tool $tool --error-exitcode 1 $H/flamia_gpu_tests --gtest_filter="$filt" > $OUT/lazy_$tool.txt 2>&1
  echo "$tool rc $? at $(el) s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/lazy_$tool.txt | tail -1) $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/lazy_$tool.txt | head -1)"
  grep -v "^\[ RUN\|^\[       OK" $OUT/lazy_$tool.txt > $OUT/lazy_$tool.short.txt; rm $OUT/lazy_$tool.txt
done
echo "done at $(el) s"
