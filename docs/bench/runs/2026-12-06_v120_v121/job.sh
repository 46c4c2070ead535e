#!/usr/bin/env bash
# On an H200: the training share on main's kernels (docs/bench/runs/2026-12-06_h200_share/job.sh)
# and nothing else. Elsewhere: v120 (the consumer's waits poll with test_wait) and v121 (D = 64:
# O's rescale after P·V's issue) against main, the forward's GPU checks then the fp8 forward
# A/B (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v120=fwd-spin-wait v121=fwd-rescale-beside-pv, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v120, .ab/v121, .ab/data.
set -uo pipefail
: "${OUT:?}"
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]]; then
  exec bash docs/bench/runs/2026-12-06_h200_share/job.sh
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v120/prebuilt/COMMIT .ab/v121/prebuilt/COMMIT
WORKLOADS=fixed-16k,pack-32k,llama1b-pack PHASES=fwd AB_SECONDS=200 bash tools/ab_forward.sh .ab/main .ab/v120 .ab/v121
