#!/usr/bin/env bash
# The day's landings together (v116, v122b) against the morning's main (d4c8428): fp8 forward
# and fp8_mixed step, four workloads, 3 rounds (tools/ab_bench.sh).
# Trees: tools/make_trees.sh morning=d4c8428 main=main, then tools/prebuild_trees.sh;
# carried: .ab/morning, .ab/main.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/morning/prebuilt/COMMIT .ab/main/prebuilt/COMMIT
OUT=$OUT/fwd WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 PHASES=fwd ROUNDS=3 \
  timeout 110 bash tools/ab_bench.sh .ab/morning .ab/main 2>&1 | tail -6
OUT=$OUT/step WORKLOADS=fixed-16k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed PHASES=step ROUNDS=3 \
  timeout 110 bash tools/ab_bench.sh .ab/morning .ab/main 2>&1 | tail -5
rm -f "$OUT"/*/bench_* "$OUT"/*/ab_rounds.tar.gz
