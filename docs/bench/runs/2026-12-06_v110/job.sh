#!/usr/bin/env bash
# v110 (the tile's row sums reach l in the fold, after P·V and the next S are issued) and
# v110b (the same on v109: the lazy pass's check from P8's codes) against main's kernels: GPU
# checks of both (the forward's specification, causal and isolation cases, D = 64 and 128),
# fp8 forward and step A/B, 3 rounds, the phase clocks of the three at fixed-16k, then
# compute-sanitizer racecheck and synccheck of v110 on the small forward cases.
# Trees: tools/make_trees.sh main=main v110=fwd-lfold v110b=fwd-p8check-lfold, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v110, .ab/v110b.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v110/prebuilt/COMMIT .ab/v110b/prebuilt/COMMIT
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
FILTER='*Shapes.MatchesSpec/*:*Matrix*:*QStart*:*LazyReference*:*HugeLogits*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
trees=.ab/main
for t in v110 v110b; do
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
for t in $trees; do
  n=${t#.ab/}
  FLAMIA_FWD_TRACE=$OUT/fwd_$n.trace timeout 30 $t/prebuilt/flamia_bench --workloads fixed-16k --recipes fp8 --iters 1 \
    > /dev/null 2>&1
  echo "== phase clocks, $n"; python3 tools/fwd_trace_summary.py $OUT/fwd_$n.trace | tail -16
  rm -f $OUT/fwd_$n.trace
done
last=$(echo $trees | tr ' ' '\n' | grep -x '.ab/v110' || true)
[ -n "$last" ] || exit 0
for tool in racecheck synccheck; do
  (( SECONDS < 480 )) || break
  timeout 90 "$SANITIZER" --tool $tool --error-exitcode 1 $last/prebuilt/flamia_gpu_tests \
    --gtest_filter='*Shapes.MatchesSpec/Small*:*LargeLogits*/fp8_D128*:*NonFinite*/fp8_D128*' > $OUT/$tool.txt 2>&1
  echo "$tool of ${last#.ab/} rc $? after $SECONDS s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1) $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/$tool.txt | head -1)"
  grep -v "^\[ RUN\|^\[       OK" $OUT/$tool.txt > $OUT/$tool.short.txt; rm $OUT/$tool.txt
done
