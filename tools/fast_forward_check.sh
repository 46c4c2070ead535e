#!/usr/bin/env bash
# The fast forward on a GPU machine, in one call: build, SASS opcode histogram, the GPU suite
# with FLAMIA_FORWARD_KERNEL=fast, and the benchmark of the fast and the reference forward.
# Logs under ${OUT:-./out}; a summary at the end.
#   bash tools/fast_forward_check.sh [gtest filter] [bench workloads]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
FILTER=${1:-*}
WORKLOADS=${2:-fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack}
JOBS=$(nproc 2>/dev/null || echo 8)
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
} | tee "$OUT/environment.txt"
GEN=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
cmake --build "$BUILD" -j"$JOBS" --target flamia flamia_gpu_tests flamia_bench >>"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }

if command -v cuobjdump >/dev/null 2>&1; then
  cuobjdump -sass "$BUILD/libflamia.so" >"$BUILD/all.sass" 2>/dev/null
  # Each head dim's default kernel: beside the quantizer at 128 (Lb1), after it at 64 (Lb0).
  for d in 64 128; do
    python3 tools/sass_histogram.py "$BUILD/all.sass" "forward_fast_kernelILi${d}ELb$([ $d = 128 ] && echo 1 || echo 0)" \
      --scores-per-thread 64 \
      $([ $d = 128 ] && echo --listing) 2>&1
  done >"$OUT/sass_fast.txt"
  head -30 "$OUT/sass_fast.txt"
fi

echo "==== smoke: one small case with the fast forward"
FLAMIA_FORWARD_KERNEL=fast timeout 120 "$BUILD/flamia_gpu_tests" --gtest_filter='Gpu/Matrix.*fp8_D128_gqa1_causal' \
  >"$OUT/gpu_fast.log" 2>&1
rc=$?
tail -25 "$OUT/gpu_fast.log"
if [ $rc -eq 124 ]; then echo "smoke timed out (hang?)"; exit 1; fi

echo "==== GPU suite, fast forward (filter $FILTER)"
FLAMIA_FORWARD_KERNEL=fast timeout 400 "$BUILD/flamia_gpu_tests" --gtest_filter="$FILTER" >"$OUT/gpu_fast.log" 2>&1
echo "gpu suite exit $?"
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] " "$OUT/gpu_fast.log" | sort -u | head -40
grep -B2 -A12 "Failure" "$OUT/gpu_fast.log" | head -60

if [ -n "${NCU:-}" ] && command -v ncu >/dev/null 2>&1; then
  echo "==== ncu: fast forward, fixed-16k (stall reasons)"
  FLAMIA_FORWARD_KERNEL=fast timeout 300 ncu --clock-control none -k regex:forward_fast_kernel -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --print-details all \
    "$BUILD/flamia_bench" --workloads fixed-16k --recipes fp8 --iters 1 --warmup 0 >"$OUT/ncu.txt" 2>&1
  grep -E "Duration|Issued Warp|No Eligible|Stall|stall" "$OUT/ncu.txt" | head -40
fi

echo "==== benchmark"
for k in ${KERNELS:-fast mma_sync}; do
  FLAMIA_FORWARD_KERNEL=$k timeout 300 "$BUILD/flamia_bench" --workloads "$WORKLOADS" --recipes fp8 --iters 10 \
    --json "$OUT/bench_$k.json" >"$OUT/bench.log" 2>&1
  echo "-- forward kernel $k (exit $?)"
  sed -n '/^workload /,$p' "$OUT/bench.log"
done
