#!/usr/bin/env bash
# v113 (the lazy pass's check: P8's codes for the first six n8-tile pairs, the last two pairs'
# maximum) against main's kernels (v110c): the forward's GPU checks, then fp8 forward and step
# A/B, 3 rounds (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v113=fwd-p8check-hybrid, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v113.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v113/prebuilt/COMMIT
bash tools/ab_forward.sh .ab/main .ab/v113
