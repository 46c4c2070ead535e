#!/usr/bin/env bash
# (kept with its outputs; main = 0c83cfe, dcodes = ec0402d, prebuilt by tools/prebuild_trees.sh)
# All binaries prebuilt: the backward and step time of D from dO's codes (landed) against the
# library before it: main = 0c83cfe, dcodes = ec0402d; fp8 and fp8_mixed, 2 rounds.
# (.ab/prebuilt_lib.sh, a local helper not kept in the repository, only adds the CUDA libraries to LD_LIBRARY_PATH.)
set -uo pipefail
T0=$(date +%s)
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
mkdir -p $OUT/ab
WORKLOADS=fixed-16k,llama8b-pack,pack-32k RECIPES=fp8,fp8_mixed ROUNDS=2 PHASES=bwd,step \
  WHAT="the library before D from dO's codes (main, 0c83cfe) against the landed kernels (dcodes, ec0402d)" \
  OUT=$OUT/ab timeout 300 bash tools/ab_bench.sh .ab/main .ab/dcodes > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -rf $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
