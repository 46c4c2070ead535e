#!/usr/bin/env bash
# v129 (c3b8679), v129b (59db37f) and v129c (5e579b8) against main (c98d83e) on llama1b-pack,
# both recipes, seven rounds (every tree's checks passed in the v129 and v129b jobs). On an
# H200 the harness on main's kernels runs first (the README's H200 table is from v102e's).
# Carried: .ab/main, .ab/v129, .ab/v129b, .ab/v129c, .whl.
set -uo pipefail
: "${OUT:?}"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ $gpu == *H200* ]] && DEADLINE=200 bash docs/bench/runs/2026-12-06_h200_harness/job.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ
OUT=$OUT/ab WORKLOADS=llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=7 PHASES=bwd,step \
  timeout 150 bash tools/ab_bench.sh .ab/main .ab/v129 .ab/v129b .ab/v129c 2>&1 | tail -8
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "done after $SECONDS s"
