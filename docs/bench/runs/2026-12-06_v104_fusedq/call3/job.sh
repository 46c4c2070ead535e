#!/usr/bin/env bash
# v104c (early announce only when quantizing q; d41fed4) and v104d (v104c with two Q buffers; dc4d886) against main d040efa:
# its GPU checks (smoke subset + determinism + non-finite + fused-QKV views), the fp8 A/B
# (fwd, fwdq, step), memcheck and the fuzzer.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/base/prebuilt/COMMIT .ab/v104c/prebuilt/COMMIT .ab/v104d/prebuilt/COMMIT
echo "==== A/B base vs v104c vs v104d"
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=quant,fwd,fwdq,step \
  timeout 330 bash tools/ab_bench.sh .ab/base .ab/v104c .ab/v104d 2>&1 | tail -30
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "at $(( $(date +%s) - T0 )) s"
echo "==== GPU checks (v104d)"
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*:*FusedQkv*'
timeout 200 .ab/v104d/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v104d.txt 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_checks_v104d.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_checks_v104d.txt | head
grep -E 'Failure|differs|Expected' $OUT/gpu_checks_v104d.txt | head -5
echo "==== memcheck (v104d)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 .ab/v104d/prebuilt/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck_v104d.txt 2>&1
echo "memcheck exit $? $(grep -E 'ERROR SUMMARY|^\[  PASSED' $OUT/memcheck_v104d.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
echo "==== fuzz (v104d)"
timeout 100 .ab/v104d/prebuilt/flamia_fuzz --cases 200 > $OUT/fuzz_v104d.txt 2>&1
echo "fuzz exit $? $(tail -2 $OUT/fuzz_v104d.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
