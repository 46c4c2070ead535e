#!/usr/bin/env bash
# tools/partition_probe.cu, built here from the tree (nvcc, sm_90a): a memory-bound stand-in on
# a share of the SMs beside an issue-bound one (the lead "the quantizer beside the forward");
# then, only on an H200, the harness in turn at 20 rounds on main's tree (job17.sh).
# Carried: .ab/main, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/partition_probe.cu -o /tmp/flamia_partition_probe &&
  /tmp/flamia_partition_probe --reps ${REPS:-10} 2>&1 | tee $OUT/partition_probe.txt
echo "probe done at $(( $(date +%s) - T0 )) s"
LIMIT=$(( ${LIMIT:-570} - ($(date +%s) - T0) )) bash docs/bench/runs/2026-12-07_main_check/job17.sh
