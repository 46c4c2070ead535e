#!/usr/bin/env bash
# v129 (c3b8679, branch bwd-four-stages: four backward stages where the shared memory holds
# them, loaded two steps ahead) against main: the backward's GPU checks on its tree (both dQ
# forms), the A/B (both recipes, backward and step, three rounds; fp8_mixed at head dim 128
# keeps three stages and runs unchanged kernels: the control), then, if there is time, the
# landing checks of the tree.
# Trees: tools/make_trees.sh main=main v129=c3b8679, then tools/prebuild_trees.sh; carried:
# .ab/main, .ab/v129.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v129/prebuilt/COMMIT
OUT=$OUT bash tools/backward_checks.sh .ab/v129
left=$(( 560 - ($(date +%s) - T0) ))
echo "==== A/B ($left s left)"
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 \
  PHASES=bwd,step timeout $(( left - 130 )) bash tools/ab_bench.sh .ab/main .ab/v129 2>&1 | tail -22
[ -s $OUT/ab/ab_bench.md ] && rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
if [ $(( 560 - ($(date +%s) - T0) )) -gt 120 ]; then
  mkdir -p $OUT/landing
  OUT=$OUT/landing bash tools/landing_checks.sh .ab/v129
fi
echo "done at $(( $(date +%s) - T0 )) s"
