#!/usr/bin/env bash
# The issue probe (main, tools/issue_probe.cu, built with nvcc -O3 for sm_90a): the mix alone and
# beside a tensor warpgroup whose products are chained, without accumulator input, or none.
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
timeout 200 .ab/probe_bin/flamia_issue_probe --tiles 4000 > $OUT/issue_probe.txt 2>&1
echo "probe rc $?"; cat $OUT/issue_probe.txt
