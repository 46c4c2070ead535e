#!/usr/bin/env bash
# An A/A with the rotated A/B tool: main's kernels (.ab/head) against themselves,
# tools/ab_bench.sh A=.ab/head B=.ab/head, ROUNDS rounds (default 6; A first in the odd rounds,
# B in the even ones), fp8 and fp8_mixed, four workloads, 20 iterations. It says how far two
# trees of the same kernels read apart (the floor under an A/B verdict) and, from the same
# runs, whether the tree run second in a round reads differently from the one run first
# (aa_position.py). On an H200, the harness in turn at 20 rounds first (job12.sh).
# Carried: .ab/head, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
HERE=docs/bench/runs/2026-12-07_aa
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $gpu == *H200* ]]; then
  mkdir -p $OUT/h200
  OUT=$OUT/h200 ITERS=20 DEADLINE=300 bash docs/bench/runs/2026-12-07_rounds/job12.sh > $OUT/h200/job12_console.txt 2>&1
  echo "job12 (H200) done at $(( $(date +%s) - T0 )) s"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
cat .ab/head/prebuilt/COMMIT | tee -a $OUT/gpu.txt
left=$(( ${LIMIT:-560} - ($(date +%s) - T0) ))
OUT=$OUT/aa ROUNDS=${ROUNDS:-6} RECIPES=fp8,fp8_mixed ITERS=20 WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama1b-pack \
  WHAT="A/A: main's kernels (45c145e) as two trees, rotated rounds" \
  timeout $left bash tools/ab_bench.sh A=.ab/head B=.ab/head > $OUT/aa_console.txt 2>&1
echo "A/A rc $? at $(( $(date +%s) - T0 )) s"
grep "^|" $OUT/aa/ab_bench.md
python3 $HERE/aa_position.py $OUT/aa/ab_bench_runs.json | tee $OUT/aa_position.txt
rm -f $OUT/aa/ab_rounds.tar.gz
