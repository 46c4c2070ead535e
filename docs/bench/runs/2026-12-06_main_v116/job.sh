#!/usr/bin/env bash
# main's landing checks after v116 (the D = 64 forward's next-stage wait after the fold): the
# whole GPU suite, memcheck on the isolation, causal-safety, non-finite and determinism cases,
# the fuzzer; then v119 (the D = 64 forward with S in flight during the fold): the forward's
# GPU checks and its A/B against main on llama1b-pack (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v119=fwd-inflight64, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v119.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v119/prebuilt/COMMIT
T=.ab/main/prebuilt
timeout 150 $T/flamia_gpu_tests > $OUT/gpu_suite.txt 2>&1
echo "GPU suite exit $? after $SECONDS s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/gpu_suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/gpu_suite.txt | head -5
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $T/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck exit $? after $SECONDS s: $(grep -E 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
timeout 90 $T/flamia_fuzz --cases 200 > $OUT/fuzz.txt 2>&1; echo "fuzz exit $? after $SECONDS s: $(tail -1 $OUT/fuzz.txt)"
mkdir -p $OUT/v119
OUT=$OUT/v119 WORKLOADS=llama1b-pack PHASES=fwd AB_SECONDS=120 bash tools/ab_forward.sh .ab/main .ab/v119
