#!/usr/bin/env bash
# (kept with its outputs; head = main f9a292c, v96 = fwd-ready64b f3a6984, cur = main 787eb0c; trees prebuilt by tools/prebuild_trees.sh)
# (.ab/prebuilt_lib.sh, a local helper not kept in the repository, only adds the CUDA libraries to LD_LIBRARY_PATH.)
# All binaries prebuilt. (1) v96 (D = 64: the key-scale warp's values waited for after the row
# maxima) smoke; (2) A/B of the fp8 forward, head (main's kernels) vs v96, 3 rounds; (3) the
# current main's (cur) whole GPU suite in the time left.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/head"
timeout 150 .ab/v96/prebuilt/flamia_gpu_tests --gtest_filter='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*' > $OUT/v96_smoke.txt 2>&1 && trees="$trees .ab/v96"
echo "v96 smoke at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/v96_smoke.txt | head -2 | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/v96_smoke.txt | head -5
mkdir -p $OUT/ab
WORKLOADS=llama1b-pack,fixed-16k,pack-32k RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  WHAT="main's kernels (head) against v96 (D = 64: the key-scale warp's values waited for after the row maxima)" \
  OUT=$OUT/ab timeout 200 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
left=$(( 480 - $(el) ))
if [ $left -gt 60 ]; then
  timeout $left .ab/cur/prebuilt/flamia_gpu_tests > $OUT/cur_suite.txt 2>&1
  echo "cur suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/cur_suite.txt | head -3 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/cur_suite.txt | head -5; tail -2 $OUT/cur_suite.txt
fi
echo "done at $(el) s"
