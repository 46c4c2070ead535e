#!/usr/bin/env bash
# One GPU call for a release candidate: build, the GPU suite with the default kernels, the
# C++ benchmark, the Python harness against the baselines present (cuDNN SDPA, cuDNN ragged,
# cuDNN FP8, FA2 varlen), and the fuzzer with its memcheck subset. Everything is logged to
# ${OUT}/run.log; JSON next to it.
#   bash tools/gpu_release_check.sh
# Environment: HARNESS_WORKLOADS (default fixed-16k,pack-32k), FUZZ_CASES (default 2000).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=$(nproc 2>/dev/null || echo 8)
LOG=$OUT/run.log
exec > >(tee "$LOG") 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ
git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
GEN=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
{ cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD" -j"$JOBS" --target flamia flamia_gpu_tests flamia_bench flamia_fuzz; } >"$BUILD.log" 2>&1 ||
  { grep -E "error" "$BUILD.log" | head -30; exit 1; }

echo "==== GPU suite (default kernels)"
timeout 200 "$BUILD/flamia_gpu_tests" >"$BUILD/gpu.log" 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]' "$BUILD/gpu.log")"
grep -E '^\[  FAILED  \] [A-Za-z]' "$BUILD/gpu.log" | sort -u | head -20

echo "==== C++ benchmark (default kernels)"
timeout 120 "$BUILD/flamia_bench" --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --iters 10 --json "$OUT/bench.json" 2>&1 | sed -n '/^workload /,$p'

echo "==== Python harness (baselines in the same process)"
# Wheels in .whl/ (ignored by git; e.g. the cuDNN Python frontend for the cudnn_thd and
# cudnn_fp8 baselines, on a machine that cannot download) are installed for the harness only.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/flamia-site .whl/*.whl &&
    export PYTHONPATH=/tmp/flamia-site${PYTHONPATH:+:$PYTHONPATH}
fi
FLAMIA_LIBRARY="$PWD/$BUILD/libflamia.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" timeout 200 \
  python3 -m flamia.bench --quick --workloads "${HARNESS_WORKLOADS:-fixed-16k,pack-32k}" \
  --impls flamia,sdpa_cudnn,cudnn_thd,cudnn_fp8,fa2_varlen_torch --out "$OUT/harness" 2>&1 | tail -40

echo "==== fuzzer"
OUT="$BUILD/fuzz" BUILD_DIR="$BUILD" SANITIZER_CASES=${SANITIZER_CASES:-8} SANITIZER_TIMEOUT=60 \
  timeout 220 bash tools/fuzz_gpu.sh "${FUZZ_CASES:-2000}" 150 1 2>&1 | tail -15
