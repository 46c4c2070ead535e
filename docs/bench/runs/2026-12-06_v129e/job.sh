#!/usr/bin/env bash
# v129b (59db37f) against main (c98d83e) at head dim 128 (fixed-4k, fixed-16k, pack-32k,
# llama8b-pack), both recipes, three rounds, then v129b's landing checks.
# Carried: .ab/main, .ab/v129b.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 PHASES=bwd,step \
  timeout 120 bash tools/ab_bench.sh .ab/main .ab/v129b 2>&1 | tail -18
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
mkdir -p $OUT/landing && OUT=$OUT/landing bash tools/landing_checks.sh .ab/v129b
echo "done after $SECONDS s"
