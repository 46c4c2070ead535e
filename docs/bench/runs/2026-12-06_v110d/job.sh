#!/usr/bin/env bash
# v110c (v110 at D = 128 only: the row sums into l in the fold) and v110d (the same, the
# shuffles after the fold's FFMAs) against main's kernels: GPU checks of both (the forward's
# specification, causal and isolation cases, D = 64 and 128), fp8 forward and step A/B, 3 rounds.
# Trees: tools/make_trees.sh main=main v110c=fwd-lfold128 v110d=fwd-lfold-late, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v110c, .ab/v110d.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v110c/prebuilt/COMMIT .ab/v110d/prebuilt/COMMIT
FILTER='*Shapes.MatchesSpec/*:*Matrix*:*QStart*:*LazyReference*:*HugeLogits*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
trees=.ab/main
for t in v110c v110d; do
  timeout 120 .ab/$t/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_$t.txt 2>&1
  rc=$?
  echo "GPU checks $t exit $rc after $SECONDS s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_checks_$t.txt | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/gpu_checks_$t.txt | head -5
  [ $rc = 0 ] && trees="$trees .ab/$t"
done
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd,step \
  timeout 300 bash tools/ab_bench.sh $trees 2>&1 | tail -12
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
