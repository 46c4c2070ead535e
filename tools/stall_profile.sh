#!/usr/bin/env bash
# Where each kernel's warps wait, per SASS instruction: Nsight Compute's warp-state sampling
# on one launch of each kernel at fixed-16k fp8, exported as the source page (one row per
# SASS instruction: executed count, stall samples by reason) and summarized by
# tools/stall_summary.py (the most-stalled instructions and the samples per opcode).
#   bash tools/stall_profile.sh     (OUT: log folder, default ./out; BUILD_DIR: build-gpu)
# KERNELS (default "dkdv_kernel dq_kernel forward_fast_kernel") picks the kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
BUILD=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
GEN=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
{ cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD" -j"$(nproc)" --target flamia_bench; } >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
command -v ncu >/dev/null 2>&1 || { echo "stall_profile: ncu not found"; exit 2; }
for k in ${KERNELS:-dkdv_kernel dq_kernel forward_fast_kernel}; do
  echo "==== ncu source counters: $k, fixed-16k fp8"
  timeout 240 ncu --clock-control none -k "regex:$k" -c 1 --section WarpStateStats --section SourceCounters \
    --section InstructionStats -f -o "$OUT/src_$k" \
    "$BUILD/flamia_bench" --workloads fixed-16k --recipes fp8 --iters 1 --warmup 0 >"$OUT/ncu_src_$k.log" 2>&1 ||
    { tail -5 "$OUT/ncu_src_$k.log"; continue; }
  ncu -i "$OUT/src_$k.ncu-rep" --page source --csv --print-source sass >"$OUT/sass_$k.csv" 2>"$OUT/sass_$k.err" ||
    { head -5 "$OUT/sass_$k.err"; continue; }
  python3 tools/stall_summary.py "$OUT/sass_$k.csv" | tee "$OUT/stalls_$k.txt" | head -70
done
