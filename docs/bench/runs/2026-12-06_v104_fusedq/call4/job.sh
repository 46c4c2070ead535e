#!/usr/bin/env bash
# Main's forward with its shared memory padded to v104d's (pad; +48 KiB at D = 128, +36 KiB at
# D = 64, unused) against main d040efa: what the size alone costs. Then the new GPU tests on main
# (tmain: the backward after a forward that quantizes by itself).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/base/prebuilt/COMMIT .ab/pad/prebuilt/COMMIT .ab/tmain/prebuilt/COMMIT
echo "==== A/B base vs pad"
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  timeout 200 bash tools/ab_bench.sh .ab/base .ab/pad 2>&1 | tail -8
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "at $(( $(date +%s) - T0 )) s"
echo "==== GPU tests (tmain)"
timeout 150 .ab/tmain/prebuilt/flamia_gpu_tests --gtest_filter='*Determinism*:*NonFinite*' > $OUT/gpu_tests_tmain.txt 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_tests_tmain.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_tests_tmain.txt | head
