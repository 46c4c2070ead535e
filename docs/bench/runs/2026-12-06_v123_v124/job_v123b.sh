#!/usr/bin/env bash
# v123b (v123 with the guard-zeroed item counter: the 128-row list everywhere) against main:
# the forward's GPU checks, then the fp8 forward A/B, 3 rounds (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v123=fwd-two64 (22b06b3), then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v123.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v123/prebuilt/COMMIT
WORKLOADS=fixed-16k,llama1b-pack PHASES=fwd AB_SECONDS=150 bash tools/ab_forward.sh .ab/main .ab/v123
