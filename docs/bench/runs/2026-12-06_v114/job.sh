#!/usr/bin/env bash
# v114 (the next tile's stage waited for after P·V(n) is issued, just before its S) against
# main's kernels (v110c): the forward's GPU checks, then the fp8 forward A/B, 3 rounds, on
# three workloads (the last minutes of a day's device time; tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v114=fwd-pv-before-wait, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v114.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v114/prebuilt/COMMIT
WORKLOADS=fixed-16k,pack-32k,llama1b-pack PHASES=fwd AB_SECONDS=90 bash tools/ab_forward.sh .ab/main .ab/v114
