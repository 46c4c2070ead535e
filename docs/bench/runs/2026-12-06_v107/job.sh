#!/usr/bin/env bash
# v107 (the two D = 128 consumers started half a warp-tile apart, two Q buffers) and v107b
# (two Q buffers alone) against main's kernels: fp8 forward and step, 3 rounds; then the phase
# clocks of main and v107 at fixed-16k (do the consumers' softmaxes stay apart?), then v107's
# GPU checks. Trees (from the branches, or main with v107.diff / v107b.diff applied):
# tools/make_trees.sh main=main v107=fwd-apart v107b=fwd-apart-q2, tools/prebuild_trees.sh for
# main and v107, the library and flamia_bench for v107b; carried: .ab/main, .ab/v107, .ab/v107b.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v107/prebuilt/COMMIT .ab/v107b/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd,step \
  timeout 240 bash tools/ab_bench.sh .ab/main .ab/v107 .ab/v107b 2>&1 | tail -10
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
for t in main v107; do
  FLAMIA_FWD_TRACE=$OUT/fwd_$t.trace timeout 30 .ab/$t/prebuilt/flamia_bench --workloads fixed-16k --recipes fp8 --iters 1 \
    > /dev/null 2>&1
  echo "== phase clocks, $t"; python3 tools/fwd_trace_summary.py $OUT/fwd_$t.trace | tail -16
  rm -f $OUT/fwd_$t.trace
done
FILTER='*Shapes.MatchesSpec/*:*Matrix*D128*:*QStart*:*LazyReference*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
timeout 150 .ab/v107/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v107.txt 2>&1
echo "GPU checks exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/gpu_checks_v107.txt | tr '\n' ' ')"
