#!/usr/bin/env bash
# v126 (fp8_mixed's stored dS copied out after dK's product, its proxy fence in the product's
# shadow) against main, in one call: its landing checks (tools/landing_checks.sh; logs packed
# into checks.tar.xz), the fp8_mixed backward and step A/B, 3 rounds (tools/ab_bench.sh), then
# where its step waits (ncu source counters, as in 2026-12-06_harness_stalls/job.sh).
# Trees: tools/make_trees.sh v126=bwd-ds-after-dk, then tools/prebuild_trees.sh; .ab/main is
# main's prebuilt tree; carried: .ab/main, .ab/v126.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v126/prebuilt/COMMIT
mkdir -p /tmp/checks/v126 $OUT/ab
echo "==== v126: landing checks"
OUT=/tmp/checks/v126 bash tools/landing_checks.sh .ab/v126
tar -C /tmp/checks -cJf $OUT/checks.tar.xz .
echo "==== A/B at $(( $(date +%s) - T0 )) s"
OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed ROUNDS=3 \
  PHASES=bwd,step timeout $(( 540 - ($(date +%s) - T0) )) bash tools/ab_bench.sh .ab/main .ab/v126 2>&1 | tail -14
[ -s $OUT/ab/ab_bench.md ] && rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "==== ncu source counters: dkdv_kernel, fixed-16k fp8_mixed, v126 at $(( $(date +%s) - T0 )) s"
timeout 60 ncu --clock-control none -k "regex:dkdv_kernel" -c 1 --section WarpStateStats --section SourceCounters \
  --section InstructionStats -f -o /tmp/src_v126 .ab/v126/prebuilt/flamia_bench --workloads fixed-16k \
  --recipes fp8_mixed --iters 1 --warmup 0 > /tmp/ncu_v126.log 2>&1 &&
  ncu -i /tmp/src_v126.ncu-rep --page source --csv --print-source sass > /tmp/sass_v126.csv 2>/dev/null &&
  python3 tools/stall_summary.py /tmp/sass_v126.csv --regions > $OUT/stalls_v126.txt && sed -n 1,12p $OUT/stalls_v126.txt | cut -c1-100
echo "done at $(( $(date +%s) - T0 )) s"
