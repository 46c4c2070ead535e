#!/usr/bin/env bash
# One GPU call for the fast forward's state: build, the GPU suite with the default forward
# and with FLAMIA_FORWARD_KERNEL=fast, and the forward time of each tuning variant
# (FLAMIA_FAST_CHAINS x FLAMIA_FAST_SKIP). Logs under ${OUT:-./out}; a summary at the end.
#   bash tools/fast_forward_tune.sh [workloads]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
WORKLOADS=${1:-fixed-16k,pack-32k,llama1b-pack}
JOBS=$(nproc 2>/dev/null || echo 8)
{ date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"; } >"$OUT/environment.txt"
GEN=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
{ cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD" -j"$JOBS" --target flamia flamia_gpu_tests flamia_bench flamia_fuzz; } >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -30; exit 1; }

for k in default fast; do
  if [ $k = default ]; then unset FLAMIA_FORWARD_KERNEL; else export FLAMIA_FORWARD_KERNEL=$k; fi
  timeout 300 "$BUILD/flamia_gpu_tests" >"$OUT/gpu_$k.log" 2>&1
  echo "== GPU suite, forward $k: exit $? $(grep -E '^\[  PASSED  \]' "$OUT/gpu_$k.log")"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu_$k.log" | sort -u | head -20
done

export FLAMIA_FORWARD_KERNEL=fast
: >"$OUT/bench.log"
for chains in 1 2 4; do
  for skip in 1 0; do
    [ $chains != 4 ] && [ $skip = 0 ] && continue
    echo "-- FLAMIA_FAST_CHAINS=$chains FLAMIA_FAST_SKIP=$skip" | tee -a "$OUT/bench.log"
    FLAMIA_FAST_CHAINS=$chains FLAMIA_FAST_SKIP=$skip timeout 120 "$BUILD/flamia_bench" --workloads "$WORKLOADS" \
      --recipes fp8 --iters 10 2>&1 | sed -n '/^-----/,/^$/p' | tee -a "$OUT/bench.log"
  done
done
