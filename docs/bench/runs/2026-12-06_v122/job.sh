#!/usr/bin/env bash
# v122 (the maxima-first softmax packs P8 as it forms each pair of n8-tiles) against main: the
# forward's GPU checks, then the fp8 forward A/B on three workloads (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v122=fwd-pack-inline, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v122.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v122/prebuilt/COMMIT
WORKLOADS=fixed-16k,pack-32k,llama1b-pack PHASES=fwd AB_SECONDS=150 bash tools/ab_forward.sh .ab/main .ab/v122
