#!/usr/bin/env bash
# v127b (branch bwd-cross-step: fp8_mixed's D = 128 dK/dV step leaves its dK and dV products in
# flight into the next step, whose Sᵀ and dPᵀ are issued before the one wait) against main, in
# one call. Its stored-dS kernel is serialized by ptxas (registers), so the A/B runs both trees
# with the recomputing dQ (BENCH_ENV=FLAMIA_BWD_DQ=recompute), where v127b's kernel is clean:
# a probe of the lever, not a landing. First the backward's GPU checks on the tree (both dQ
# forms), then the A/B, then where its step waits (ncu source counters).
# Trees: tools/make_trees.sh v127=bwd-cross-step, then tools/prebuild_trees.sh; .ab/main is
# main's prebuilt tree; carried: .ab/main, .ab/v127.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v127/prebuilt/COMMIT
mkdir -p $OUT/ab
FILTER='*Shapes.MatchesSpec/*:*Matrix*:*StoredDq*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*'
for dq in hbm recompute; do
  FLAMIA_BWD_DQ=$dq timeout 100 .ab/v127/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > /tmp/checks_$dq.txt 2>&1
  echo "GPU checks (FLAMIA_BWD_DQ=$dq) exit $? at $(( $(date +%s) - T0 )) s: $(grep -E '^\[  (PASSED|FAILED)  \]' /tmp/checks_$dq.txt | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' /tmp/checks_$dq.txt | head -5
  grep -E '^\[  (PASSED|FAILED|SKIPPED)|^\[  FAILED' /tmp/checks_$dq.txt > $OUT/checks_$dq.txt
done
echo "==== A/B (recomputing dQ)"
OUT=$OUT/ab BENCH_ENV=FLAMIA_BWD_DQ=recompute WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack \
  RECIPES=fp8_mixed ROUNDS=3 PHASES=bwd,step timeout 240 bash tools/ab_bench.sh .ab/main .ab/v127 2>&1 | tail -14
[ -s $OUT/ab/ab_bench.md ] && rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "==== ncu source counters: dkdv_kernel, fixed-16k fp8_mixed recomputing, v127 at $(( $(date +%s) - T0 )) s"
FLAMIA_BWD_DQ=recompute timeout 60 ncu --clock-control none -k "regex:dkdv_kernel" -c 1 --section WarpStateStats \
  --section SourceCounters --section InstructionStats -f -o /tmp/src_v127 .ab/v127/prebuilt/flamia_bench \
  --workloads fixed-16k --recipes fp8_mixed --iters 1 --warmup 0 > /tmp/ncu_v127.log 2>&1 &&
  ncu -i /tmp/src_v127.ncu-rep --page source --csv --print-source sass > /tmp/sass_v127.csv 2>/dev/null &&
  python3 tools/stall_summary.py /tmp/sass_v127.csv --regions > $OUT/stalls_v127.txt && sed -n 1,12p $OUT/stalls_v127.txt | cut -c1-100
echo "done at $(( $(date +%s) - T0 )) s"
