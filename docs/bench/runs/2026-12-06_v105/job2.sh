#!/usr/bin/env bash
# After job.sh hung (v105's retake was decided per warp; its wgmma needs the whole
# warpgroup): v105 (191408c) and v105b (995c9dd) rebuilt. First the tests that take the
# retake (a minute at most, so a hang costs little), then the fp8 forward A/B against main's
# kernels (.ab/head), then more of v105's GPU suite. Carried: .ab/head, .ab/v105, .ab/v105b.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/v105/prebuilt/COMMIT .ab/v105b/prebuilt/COMMIT
timeout 60 .ab/v105/prebuilt/flamia_gpu_tests --gtest_filter='*HugeLogits*:*LazyReference*' > $OUT/gpu_retake_v105.txt 2>&1
rc=$?; echo "retake tests exit $rc $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_retake_v105.txt | tr '\n' ' ')"
[ $rc -eq 0 ] || { tail -5 $OUT/gpu_retake_v105.txt; exit 1; }
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  timeout 220 bash tools/ab_bench.sh .ab/head .ab/v105 .ab/v105b 2>&1 | tail -8
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
FILTER='*Shapes.MatchesSpec/*:*Matrix*D128*:*QStart*:*NonFinite*:*LargeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
timeout 150 .ab/v105/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v105.txt 2>&1
echo "GPU checks exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_checks_v105.txt | tr '\n' ' ')"
grep -E "^\[  FAILED  \]" $OUT/gpu_checks_v105.txt | head
