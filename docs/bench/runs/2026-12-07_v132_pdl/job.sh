#!/usr/bin/env bash
# One call, all programs prebuilt (tools/prebuild_trees.sh pdl=a8d24e7): v132's correctness
# (the GPU suite, the graph-capture tests with the overlap on and off, memcheck on the graph,
# isolation and causal-safety cases, the fuzzer), then its A/B: one build, FLAMIA_PDL=0
# against unset, alternated three rounds (tools/env_ab.sh), both recipes, four workloads,
# phases fwdq (the quantizing forward), fwd (on a filled qkv8), bwd and step.
# Carried: .ab/pdl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/pdl/prebuilt/COMMIT | tee -a $OUT/gpu.txt
H=.ab/pdl/prebuilt
timeout 150 $H/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|GraphCapture|StoredDq' $OUT/suite.txt | grep -v "^\[ RUN" > $OUT/suite.short.txt
FLAMIA_PDL=0 timeout 40 $H/flamia_gpu_tests --gtest_filter='GraphCapture*' > $OUT/graph_pdl0.txt 2>&1
echo "graph tests FLAMIA_PDL=0 rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/graph_pdl0.txt | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests \
  --gtest_filter='GraphCapture*:*DocumentIsolation*fp8_D128*:*CausalSafety*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
timeout 60 $H/flamia_fuzz --cases 100 > $OUT/fuzz.txt 2>&1
echo "fuzz rc $? at $(el) s: $(tail -1 $OUT/fuzz.txt)"
mkdir -p $OUT/env
left=$(( 560 - $(el) ))
BUILD_DIR=$H WORKLOADS=fixed-4k,pack-32k,fixed-16k,llama1b-pack RECIPES=fp8_mixed,fp8 ROUNDS=3 PHASES=fwdq,fwd,bwd,step \
  WHAT="v132 (a8d24e7): FLAMIA_PDL=0 against unset, one build" \
  OUT=$OUT/env timeout $left bash .ab/pdl/tools/env_ab.sh off=FLAMIA_PDL=0 pdl= > $OUT/env_console.txt 2>&1
echo "env rc $? at $(el) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
echo "done at $(el) s"
