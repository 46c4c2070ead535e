#!/usr/bin/env bash
# v106 (fp8_mixed's stored dS by warp) against main's kernels (.ab/head): first its stored-dS
# and fp8_mixed specification tests, then fp8_mixed's backward and step, 3 rounds. Trees:
# tools/make_trees.sh v106=bwd-ds-pieces, tools/prebuild_trees.sh; carried: .ab/head, .ab/v106.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/v106/prebuilt/COMMIT
FILTER='*StoredDq*:*Matrix*fp8_mixed*:*Shapes*mixed*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
timeout 150 .ab/v106/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v106.txt 2>&1
rc=$?; echo "GPU checks exit $rc $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_checks_v106.txt | tr '\n' ' ')"
grep -E "^\[  FAILED  \]" $OUT/gpu_checks_v106.txt | head
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack RECIPES=fp8_mixed ROUNDS=3 PHASES=bwd,step \
  timeout 200 bash tools/ab_bench.sh .ab/head .ab/v106 2>&1 | tail -10
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
