#!/usr/bin/env bash
# v128c (dc27292, branch bwd-dq-two-ahead: the dQ pass's ring two key tiles ahead, v128b's half
# that does not touch the dK/dV pass) against main: the backward's GPU checks on its tree (both
# dQ forms), then the A/B, both recipes, backward and step, three rounds (fp8_mixed at head dim
# 128 does not run the dQ pass: the control).
# Trees: tools/make_trees.sh v128c=dc27292, then tools/prebuild_trees.sh; .ab/main is main's
# prebuilt tree; carried: .ab/main, .ab/v128c.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v128c/prebuilt/COMMIT
OUT=$OUT bash tools/backward_checks.sh .ab/v128c
left=$(( 570 - ($(date +%s) - T0) ))
echo "==== A/B ($left s left)"
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 \
  PHASES=bwd,step timeout $(( left - 20 )) bash tools/ab_bench.sh .ab/main .ab/v128c 2>&1 | tail -22
[ -s $OUT/ab/ab_bench.md ] && rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "done at $(( $(date +%s) - T0 )) s"
