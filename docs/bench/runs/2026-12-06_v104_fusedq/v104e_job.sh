#!/usr/bin/env bash
# v104e's and v104f's A/B and v104e's GPU checks (not run: no GPU time was left). To run it, from
# the repository root, for X in e f:
#   git checkout -b fwd-fusedq-X main && git apply docs/bench/runs/2026-12-06_v104_fusedq/v104X.diff &&
#     git add -A src && git commit -m v104X && git checkout main
#   bash tools/make_trees.sh base=main v104e=fwd-fusedq-e v104f=fwd-fusedq-f &&
#     JOBS=2 bash tools/prebuild_trees.sh base=main v104e=fwd-fusedq-e v104f=fwd-fusedq-f
#   then this script on the GPU machine, carrying .ab/base, .ab/v104e, .ab/v104f and this file
#   (about five minutes).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/base/prebuilt/COMMIT .ab/v104e/prebuilt/COMMIT .ab/v104f/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd,fwdq,step \
  timeout 240 bash tools/ab_bench.sh .ab/base .ab/v104e .ab/v104f 2>&1 | tail -17
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*:*FusedQkv*'
timeout 200 .ab/v104e/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v104e.txt 2>&1
echo "GPU checks exit $? $(grep -E '^\[  PASSED  \]' $OUT/gpu_checks_v104e.txt)"
