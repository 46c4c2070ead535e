#!/usr/bin/env bash
# main's landing checks after v110c (the forward's row sums into l in the fold at D = 128):
# the whole GPU suite, memcheck on the isolation, causal-safety, non-finite and determinism
# cases, and the fuzzer (v110c changes no Python code).
# Carried: .ab/main (tools/make_trees.sh main=main, then tools/prebuild_trees.sh main=main).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
T=.ab/main/prebuilt
timeout 150 $T/flamia_gpu_tests > $OUT/gpu_suite.txt 2>&1
echo "GPU suite exit $? after $SECONDS s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/gpu_suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/gpu_suite.txt | head -5
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $T/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck exit $? after $SECONDS s: $(grep -E 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
timeout 90 $T/flamia_fuzz --cases 200 > $OUT/fuzz.txt 2>&1; echo "fuzz exit $? after $SECONDS s: $(tail -1 $OUT/fuzz.txt)"
