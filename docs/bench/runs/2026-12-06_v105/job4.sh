#!/usr/bin/env bash
# v103b rebuilt (branch fwd-lazy64b, the lazy pass at D = 64) against main's kernels
# (.ab/head): llama1b-pack fp8 forward, 3 rounds; fixed-16k as the control (D = 128 kernels
# byte-identical). Carried: .ab/head, .ab/l64.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/l64/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=llama1b-pack,fixed-16k RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  timeout 150 bash tools/ab_bench.sh .ab/head .ab/l64 2>&1 | tail -4
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
