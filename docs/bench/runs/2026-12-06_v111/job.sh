#!/usr/bin/env bash
# v111 (the next tile's key-scale values tested present with S's issue, the softmax's wait
# skipped when so) and v111b (also the tile after next tested landed before the fold) against
# main's kernels (v110c landed): GPU checks of both (the forward's specification, causal and
# isolation cases, D = 64 and 128), fp8 forward and step A/B, 3 rounds.
# Trees: tools/make_trees.sh main=main v111=fwd-ready-probe v111b=fwd-full-probe, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v111, .ab/v111b.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v111/prebuilt/COMMIT .ab/v111b/prebuilt/COMMIT
FILTER='*Shapes.MatchesSpec/*:*Matrix*:*QStart*:*LazyReference*:*HugeLogits*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
trees=.ab/main
for t in v111 v111b; do
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
