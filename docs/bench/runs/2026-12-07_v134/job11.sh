#!/usr/bin/env bash
# v134 (branch bases-in-quant, 64f464a, .ab/v134 prebuilt): the stored dS's document bases
# built by the dO quantizer's block 0 instead of a one-block launch. Correctness (the GPU
# suite; the stored-dS tests with FLAMIA_DS_BASES=kernel too; memcheck on them), then one
# build, FLAMIA_DS_BASES=kernel (before) against unset (v134), alternated three rounds
# (tools/env_ab.sh), fp8_mixed (whose default at D = 128 is the stored dS), phases bwd, step.
# LIMIT: the seconds the call may take (default 560); AB_WORKLOADS, AB_ROUNDS: a shorter A/B.
# Carried: .ab/v134.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/v134/prebuilt/COMMIT | tee -a $OUT/gpu.txt
H=.ab/v134/prebuilt
timeout 150 $H/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|StoredDq' $OUT/suite.txt | grep -v "^\[ RUN" > $OUT/suite.short.txt
rm -f $OUT/suite.txt
FLAMIA_DS_BASES=kernel timeout 60 $H/flamia_gpu_tests --gtest_filter='StoredDq*' > $OUT/stored_kernel.txt 2>&1
echo "StoredDq* with FLAMIA_DS_BASES=kernel rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/stored_kernel.txt | tr '\n' ' ')"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests \
  --gtest_filter='StoredDqSlabs*:StoredDqDefault*:StoredDqQStart*:*DocumentIsolation*fp8_mixed_D128*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
mkdir -p $OUT/env
left=$(( ${LIMIT:-560} - $(el) ))
BUILD_DIR=$H WORKLOADS=${AB_WORKLOADS:-fixed-4k,pack-32k,fixed-16k,llama8b-pack} RECIPES=fp8_mixed ROUNDS=${AB_ROUNDS:-3} ITERS=20 PHASES=bwd,step \
  WHAT="v134 (64f464a): FLAMIA_DS_BASES=kernel against unset, one build" \
  OUT=$OUT/env timeout $left bash .ab/v134/tools/env_ab.sh kernel=FLAMIA_DS_BASES=kernel v134= > $OUT/env_console.txt 2>&1
echo "env rc $? at $(el) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
echo "done at $(el) s"
