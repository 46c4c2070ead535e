#!/usr/bin/env bash
# v132b (fp8's code transposes overlapped with the dO quantizer), both trees prebuilt: the GPU
# suite and memcheck of fp8's backward cases on v132b, then tools/ab_bench.sh v132 (a8d24e7,
# .ab/pdl) against v132b, five rounds of 20 iterations, fp8 (and fp8_mixed as the control: it
# runs no transposes).
# Carried: .ab/pdl, .ab/v132b.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/pdl/prebuilt/COMMIT .ab/v132b/prebuilt/COMMIT | tee -a $OUT/gpu.txt
H=.ab/v132b/prebuilt
timeout 150 $H/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED' $OUT/suite.txt > $OUT/suite.short.txt; rm -f $OUT/suite.txt
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests \
  --gtest_filter='GraphCapture*:*DocumentIsolation*fp8_D*:*CausalSafety*fp8_*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
left=$(( 560 - $(el) ))
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=5 ITERS=20 \
  PHASES=fwdq,bwd,step WHAT="v132 (a8d24e7) against v132b" timeout $left \
  bash tools/ab_bench.sh v132=.ab/pdl v132b=.ab/v132b > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -f $OUT/ab/ab_rounds.tar.gz
