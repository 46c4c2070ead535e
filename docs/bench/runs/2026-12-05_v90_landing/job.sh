#!/usr/bin/env bash
# All binaries prebuilt. v90 on today's main (bwd-pdl-main, 9827fa9) against main's kernels
# (lazy tree: the same sources as main but for v90): (1) v90's whole GPU suite; (2) A/B of
# the backward and step, fp8_mixed and fp8, five workloads, 3 rounds.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/lazy"
timeout 200 .ab/pdlm/prebuilt/flamia_gpu_tests > $OUT/pdlm_suite.txt 2>&1 && trees="$trees .ab/pdlm"
echo "pdlm suite at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/pdlm_suite.txt | head -2 | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/pdlm_suite.txt | head -8
grep -v "^\[ RUN\|^\[       OK" $OUT/pdlm_suite.txt > $OUT/pdlm_suite.short.txt; rm $OUT/pdlm_suite.txt
mkdir -p $OUT/ab
WORKLOADS=fixed-4k,pack-32k,llama8b-pack,llama1b-pack,fixed-16k RECIPES=fp8_mixed,fp8 ROUNDS=3 PHASES=bwd,step \
  WHAT="main's kernels (lazy) against v90 on main (pdlm: the backward's launches overlapped)" \
  OUT=$OUT/ab timeout 330 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz $OUT/ab/ab_bench_runs.json
echo "done at $(el) s"
