#!/usr/bin/env bash
# v105 (P·V(n) during tile n + 1's lazy pass) and v105b (the same with a fourth key/value
# stage) against main's kernels (.ab/head: 273a1c1's source, whose kernels are main's today),
# fp8 forward and step, 3 rounds; then v105's whole GPU suite (its new GpuLazyReference test
# included). Trees: tools/make_trees.sh v105=fwd-pv-beside v105b=fwd-pv-beside-s4, then
# tools/prebuild_trees.sh (v105b: the library and flamia_bench only); carried: .ab/head,
# .ab/v105, .ab/v105b, this file.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/v105/prebuilt/COMMIT .ab/v105b/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd,step \
  timeout 330 bash tools/ab_bench.sh .ab/head .ab/v105 .ab/v105b 2>&1 | tail -14
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
timeout 240 .ab/v105/prebuilt/flamia_gpu_tests > $OUT/gpu_suite_v105.txt 2>&1
echo "GPU suite exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_suite_v105.txt | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|LazyReference.*(OK|FAILED)" $OUT/gpu_suite_v105.txt | head -20
