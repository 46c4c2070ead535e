#!/usr/bin/env bash
# Where the time goes: Nsight Compute on one launch of each backward kernel (dK/dV, dQ) and
# of the fast forward at fixed-16k, fp8 — throughput, occupancy, issue and stall reasons,
# and the executed instructions per score (fixed-16k computes 2 docs x 16 heads x 8,256
# tiles of 128 x 128 = 4.33e9 scores per matmul, masked diagonal tiles included; the same
# count serves the forward).
#   bash tools/backward_profile.sh          (OUT: log folder, default ./out; BUILD_DIR: build-gpu)
# KERNELS (default "dkdv_kernel dq_kernel forward_fast_kernel") picks the kernels. STALLS=1
# instead samples where each kernel's warps wait per SASS instruction (the source page:
# executed count and stall samples by reason), kept as sass_KERNEL.csv and summarized by
# tools/stall_summary.py (the most-stalled instructions, the samples per opcode).
# WORKLOAD (default fixed-16k) and RECIPE (default fp8) pick what flamia_bench runs; the
# per-score count is printed for fixed-16k only. fp8_mixed at head dim 128 stores dS by
# default, so its dQ is dq_stored_kernel (KERNELS="dkdv_kernel dq_stored_kernel"), or
# dq_kernel with FLAMIA_BWD_DQ=recompute. MEMORY=1 instead reports each kernel's memory
# side: DRAM and L2 throughput, the L2 hit rate, bytes read and written at DRAM. BENCH names a
# flamia_bench built already (a tree of tools/prebuild_trees.sh), which is then not rebuilt.
set -uo pipefail
WORKLOAD=${WORKLOAD:-fixed-16k}
RECIPE=${RECIPE:-fp8}
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
BUILD=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
if [ -z "${BENCH:-}" ]; then
  GEN=()
  command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
  { cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$BUILD" -j"$(nproc)" --target flamia_bench; } >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  BENCH=$BUILD/flamia_bench
fi
[ -x "$BENCH" ] || { echo "backward_profile: $BENCH is not an executable"; exit 2; }
command -v ncu >/dev/null 2>&1 || { echo "backward_profile: ncu not found"; exit 2; }
for k in ${KERNELS:-dkdv_kernel dq_kernel forward_fast_kernel}; do
  if [ "${STALLS:-0}" = 1 ]; then
    echo "==== ncu source counters: $k, $WORKLOAD $RECIPE"
    timeout 240 ncu --clock-control none -k "regex:$k" -c 1 --section WarpStateStats --section SourceCounters \
      --section InstructionStats -f -o "$OUT/src_$k" \
      "$BENCH" --workloads "$WORKLOAD" --recipes "$RECIPE" --iters 1 --warmup 0 >"$OUT/ncu_src_$k.log" 2>&1 ||
      { tail -5 "$OUT/ncu_src_$k.log"; continue; }
    ncu -i "$OUT/src_$k.ncu-rep" --page source --csv --print-source sass >"$OUT/sass_$k.csv" 2>"$OUT/sass_$k.err" ||
      { head -5 "$OUT/sass_$k.err"; continue; }
    python3 tools/stall_summary.py "$OUT/sass_$k.csv" >"$OUT/stalls_$k.txt"
    head -70 "$OUT/stalls_$k.txt"
    continue
  fi
  if [ "${MEMORY:-0}" = 1 ]; then
    echo "==== ncu memory: $k, $WORKLOAD $RECIPE"
    timeout 240 ncu --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
      --print-details all "$BENCH" --workloads "$WORKLOAD" --recipes "$RECIPE" --iters 1 --warmup 0 \
      >"$OUT/ncu_mem_$k.txt" 2>&1
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Mem Busy|Max Bandwidth|dram__bytes|lts__t_sector_hit_rate" \
      "$OUT/ncu_mem_$k.txt" | head -20
    continue
  fi
  echo "==== ncu: $k, $WORKLOAD $RECIPE"
  timeout 240 ncu --clock-control none -k "regex:$k" -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --print-details all \
    "$BENCH" --workloads "$WORKLOAD" --recipes "$RECIPE" --iters 1 --warmup 0 >"$OUT/ncu_$k.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Compute \(SM\) Throughput|Memory Throughput|Stall [A-Z]|Warp Cycles Per Issued" \
    "$OUT/ncu_$k.txt" | head -45
  # ncu counts warp instructions; x32 threads / 4.33e9 scores.
  [ "$WORKLOAD" = fixed-16k ] && awk '/ Executed Instructions  /{gsub(",","",$NF); printf "thread instructions per score: %.1f\n", $NF*32/4.3285e9; exit}'     "$OUT/ncu_$k.txt"
done
