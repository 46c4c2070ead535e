#!/usr/bin/env bash
# v124 (fp8_mixed's D = 128 dK/dV step forms Pᵀ while dPᵀ runs) and v123 (the D = 64 forward
# on D = 128's plan: two consumers) against main, in one call:
#   v124: the landing checks on its tree (tools/landing_checks.sh: GPU suite, memcheck subset,
#         fuzzer), so that a gain can land from this call, then the fp8_mixed backward and step
#         A/B, 3 rounds (tools/ab_bench.sh);
#   v123: the forward's GPU checks, then the fp8 forward A/B, 3 rounds (tools/ab_forward.sh).
# Trees: tools/make_trees.sh main=main v123=fwd-two64 v124=bwd-scores-first, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v123, .ab/v124.
# JOB_SECONDS (default 560): the call's limit; v123 runs only with 150 s of it left.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
LIMIT=${JOB_SECONDS:-560}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v123/prebuilt/COMMIT .ab/v124/prebuilt/COMMIT
mkdir -p $OUT/v124/checks $OUT/v124/ab $OUT/v123
echo "==== v124: landing checks"
OUT=$OUT/v124/checks bash tools/landing_checks.sh .ab/v124
echo "==== v124: A/B at $(( $(date +%s) - T0 )) s"
OUT=$OUT/v124/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed ROUNDS=3 \
  PHASES=bwd,step timeout $(( LIMIT - ($(date +%s) - T0) - 10 )) bash tools/ab_bench.sh .ab/main .ab/v124 2>&1 | tail -12
[ -s $OUT/v124/ab/ab_bench.md ] && rm -f $OUT/v124/ab/bench_* $OUT/v124/ab/ab_rounds.tar.gz
left=$(( LIMIT - ($(date +%s) - T0) ))
echo "==== v123 at $(( $(date +%s) - T0 )) s, $left s left"
[ $left -ge 150 ] && OUT=$OUT/v123 WORKLOADS=fixed-16k,llama1b-pack PHASES=fwd AB_SECONDS=$(( left - 80 )) \
  bash tools/ab_forward.sh .ab/main .ab/v123
echo "done at $(( $(date +%s) - T0 )) s"
