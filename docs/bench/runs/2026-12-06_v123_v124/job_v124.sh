#!/usr/bin/env bash
# v124 (fp8_mixed's D = 128 dK/dV step forms Pᵀ while dPᵀ runs) against main: the landing
# checks on v124's tree (tools/landing_checks.sh: GPU suite, memcheck subset, fuzzer), then the
# fp8_mixed backward and step A/B, 3 rounds (tools/ab_bench.sh).
# Trees: tools/make_trees.sh main=main v124=bwd-scores-first, then tools/prebuild_trees.sh;
# carried: .ab/main, .ab/v124.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v124/prebuilt/COMMIT
mkdir -p $OUT/checks $OUT/ab
OUT=$OUT/checks bash tools/landing_checks.sh .ab/v124
echo "==== A/B at $(( $(date +%s) - T0 )) s"
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed ROUNDS=3 PHASES=bwd,step \
  timeout $(( 590 - ($(date +%s) - T0) )) bash tools/ab_bench.sh .ab/main .ab/v124 2>&1 | tail -12
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "done at $(( $(date +%s) - T0 )) s"
