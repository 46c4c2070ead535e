#!/usr/bin/env bash
# v129b (59db37f: four dK/dV stages in fp8's D = 64 pass) and v129c (5e579b8: four dQ stages
# in fp8's D = 64 pass) against main: each tree's backward checks (both dQ forms), then the
# A/B on llama1b-pack, both recipes (fp8_mixed runs main's kernels in both: the control). On
# an H200 the harness on main's kernels runs first (the README's H200 table is from v102e's).
# Trees: tools/make_trees.sh main=c98d83e v129b=59db37f v129c=5e579b8, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v129b, .ab/v129c, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $gpu == *H200* ]]; then
  DEADLINE=290 bash docs/bench/runs/2026-12-06_h200_harness/job.sh
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v129b/prebuilt/COMMIT .ab/v129c/prebuilt/COMMIT
left=$(( 570 - ($(date +%s) - T0) ))
echo "==== checks (~220 s) and A/B ($left s left)"
OUT=$OUT CHECKS=backward WORKLOADS=llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=5 PHASES=bwd,step \
  AB_SECONDS=$(( left - 230 < 150 ? left - 230 : 150 )) bash tools/ab_forward.sh .ab/main .ab/v129b .ab/v129c
echo "done at $(( $(date +%s) - T0 )) s"
