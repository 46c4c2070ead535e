#!/usr/bin/env bash
# Where v105's +16-19 % comes from: a timing probe (branch probe-pv-beside-novote, 599aba6;
# results wrong where a row moves its reference, rare on these random inputs) that keeps
# v105's order but votes per warp and never retakes, so no warpgroup barrier a tile; against
# main's kernels (.ab/head) and v105. fp8 forward, 3 rounds. Carried: .ab/head, .ab/v105, .ab/v105p.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/v105/prebuilt/COMMIT .ab/v105p/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  timeout 200 bash tools/ab_bench.sh .ab/head .ab/v105 .ab/v105p 2>&1 | tail -6
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
