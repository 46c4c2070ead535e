#!/usr/bin/env bash
# v104b (v104 + the next item announced as soon as its Q buffer is free, three Q buffers; a9f71f8) against main d040efa:
# its GPU checks (smoke subset + determinism + non-finite + fused-QKV views), the fp8 A/B
# (fwd, fwdq, step), memcheck and the fuzzer.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/base/prebuilt/COMMIT .ab/v104b/prebuilt/COMMIT
echo "==== GPU checks (v104b)"
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*:*FusedQkv*'
timeout 200 .ab/v104b/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v104b.txt 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_checks_v104b.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_checks_v104b.txt | head
grep -E 'Failure|differs|Expected' $OUT/gpu_checks_v104b.txt | head -5
echo "==== A/B base vs v104b"
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=quant,fwd,fwdq,step \
  timeout 240 bash tools/ab_bench.sh .ab/base .ab/v104b 2>&1 | tail -30
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "at $(( $(date +%s) - T0 )) s"
echo "==== memcheck (v104b)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 .ab/v104b/prebuilt/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck_v104b.txt 2>&1
echo "memcheck exit $? $(grep -E 'ERROR SUMMARY|^\[  PASSED' $OUT/memcheck_v104b.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
echo "==== fuzz (v104b)"
timeout 100 .ab/v104b/prebuilt/flamia_fuzz --cases 200 > $OUT/fuzz_v104b.txt 2>&1
echo "fuzz exit $? $(tail -2 $OUT/fuzz_v104b.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
