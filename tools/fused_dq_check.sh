#!/usr/bin/env bash
# The fused dQ (FLAMIA_BWD_DQ=fused) on a GPU machine, in one call: build, the GPU suite (the
# fused tests and everything else), memcheck and racecheck on the fused tests, the timing of
# the deterministic and the fused backward alternated (tools/env_ab.sh), and ncu on the fused
# dK/dV pass. Logs under ${OUT:-./out} (few files: a device call returns at most eight).
#   bash tools/fused_dq_check.sh
# Environment: BUILD_DIR (default build-gpu), WORKLOADS (env_ab's), ROUNDS (3), PROFILE (1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
BUILD=${BUILD_DIR:-build-gpu}
exec > >(tee "$OUT/summary.txt") 2>&1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>/dev/null
} | tee "$OUT/logs/environment.txt"
t0=$SECONDS
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
  cmake --build "$BUILD" -j"$(nproc)" --target flamia flamia_gpu_tests flamia_bench; } >"$OUT/logs/build.log" 2>&1 ||
  { grep -E "error" "$OUT/logs/build.log" | head -30; exit 1; }
echo "build: $((SECONDS - t0)) s"

echo "==== fused dQ tests"
timeout 180 "$BUILD/flamia_gpu_tests" --gtest_filter='*FusedDq*' >"$OUT/logs/fused_tests.log" 2>&1
echo "exit $?"; grep -E '^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure|worst|Expected|Which' "$OUT/logs/fused_tests.log" | head -30

SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SANITIZER" ]; then
  for tool in memcheck racecheck; do
    timeout 240 "$SANITIZER" --tool $tool --error-exitcode 1 "$BUILD/flamia_gpu_tests" \
      --gtest_filter='Gpu/FusedDq.DkDvBitwiseDqToRounding/0:FusedDqQStart.*' >"$OUT/logs/fused_$tool.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/fused_$tool.log" | tail -1)"
  done
fi

echo "==== timing: deterministic vs fused dQ (fp8_mixed)"
BUILD_DIR="$BUILD" OUT="$OUT/logs/ab" ROUNDS="${ROUNDS:-3}" bash tools/env_ab.sh det= fused=FLAMIA_BWD_DQ=fused
cp "$OUT/logs/ab/env_ab_runs.json" "$OUT/env_ab_runs.json" 2>/dev/null

if [ "${PROFILE:-1}" = 1 ]; then
  echo "==== ncu: the fused dK/dV pass and the deterministic passes, fixed-16k fp8_mixed"
  BUILD_DIR="$BUILD" OUT="$OUT/logs/prof_fused" RECIPE=fp8_mixed KERNELS=dkdv_kernel FLAMIA_BWD_DQ=fused \
    timeout 200 bash tools/backward_profile.sh 2>&1 |
    grep -E '^==== ncu|Duration|Registers Per|Issued Warp Per Scheduler  |per score|Stall (Long|Wait|Barrier|Math|Short)|Memory Throughput'
  BUILD_DIR="$BUILD" OUT="$OUT/logs/prof_det" RECIPE=fp8_mixed KERNELS="dkdv_kernel dq_kernel" \
    timeout 200 bash tools/backward_profile.sh 2>&1 |
    grep -E '^==== ncu|Duration|Issued Warp Per Scheduler  |per score'
fi

echo "==== GPU suite"
timeout 400 "$BUILD/flamia_gpu_tests" >"$OUT/logs/gpu_suite.log" 2>&1
echo "exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/logs/gpu_suite.log" | head -1)"
grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/logs/gpu_suite.log" | sort -u | head -20
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
