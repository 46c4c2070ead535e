#!/usr/bin/env bash
# v115 (fp8_mixed's dK/dV pass waits for the next step's stage while its products run)
# against main's kernels: GPU checks of the backward's cases, then the fp8_mixed backward and
# step A/B, 3 rounds (tools/ab_forward.sh with the backward's filter and phases).
# Trees: tools/make_trees.sh main=main v115=bwd-next-wait, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v115.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v115/prebuilt/COMMIT
FILTER='*Shapes.MatchesSpec/*:*Matrix*:*StoredDq*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*' \
  RECIPES=fp8_mixed PHASES=bwd,step bash tools/ab_forward.sh .ab/main .ab/v115
