#!/usr/bin/env bash
# One of the backward's dQ options (FLAMIA_BWD_DQ=fused, hbm or auto, the default) on a GPU
# machine, in one call: build, the option's tests, memcheck / racecheck / synccheck on some of
# them, the timing of the recomputing dQ pass and the option alternated (tools/env_ab.sh;
# EXTRA: more NAME=VAR=value settings, e.g. ds1g=FLAMIA_BWD_DS_MIB=1024), each kernel of a step alone with
# the option (tools/step_kernels.sh), ncu on the option's kernels (STALLS=1: where they wait,
# per SASS instruction) and the whole GPU suite. Logs under ${OUT:-./out} (few files: a device
# call returns at most eight).
#   bash tools/dq_mode_check.sh fused|hbm|auto
# Environment: BUILD_DIR (default build-gpu), WORKLOADS (env_ab's), RECIPES (default: fused
# and auto fp8_mixed, hbm fp8,fp8_mixed), ROUNDS (3), EXTRA (more env_ab settings), PROFILE
# (1), STALLS (0), SUITE (1).
set -uo pipefail
MODE=${1:-}
case "$MODE" in
  fused) TESTS='*FusedDq*'; SANITIZE='Gpu/FusedDq.DkDvBitwiseDqToRounding/0:FusedDqQStart.*'
         KERNELS=dkdv_kernel; RECIPES=${RECIPES:-fp8_mixed} ;;
  hbm) TESTS='*StoredDq*'; SANITIZE='Gpu/StoredDq.*/fp8_mixed_d128_gqa1_causal_short:StoredDqSlabs.*'
       KERNELS="dkdv_kernel dq_stored_kernel"; RECIPES=${RECIPES:-fp8,fp8_mixed} ;;
  auto) TESTS='*StoredDq*:*FusedDq*:Hostile*'; SANITIZE='StoredDqDefault.*:Gpu/StoredDq.*/fp8_mixed_d128_gqa4_causal_short'
        KERNELS="dkdv_kernel dq_stored_kernel"; RECIPES=${RECIPES:-fp8_mixed} ;;
  *) echo "usage: $0 fused|hbm|auto"; exit 2 ;;
esac
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

echo "==== $MODE tests"
timeout 180 "$BUILD/flamia_gpu_tests" --gtest_filter="$TESTS" >"$OUT/logs/mode_tests.log" 2>&1
echo "exit $?"; grep -E '^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure|worst|Expected|Which' "$OUT/logs/mode_tests.log" | head -30

SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SANITIZER" ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 240 "$SANITIZER" --tool $tool --error-exitcode 1 "$BUILD/flamia_gpu_tests" \
      --gtest_filter="$SANITIZE" >"$OUT/logs/mode_$tool.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/mode_$tool.log" | tail -1)"
  done
fi

echo "==== timing: the recomputing dQ pass vs $MODE ($RECIPES)"
BUILD_DIR="$BUILD" OUT="$OUT/logs/ab" RECIPES="$RECIPES" ROUNDS="${ROUNDS:-3}" \
  bash tools/env_ab.sh recompute=FLAMIA_BWD_DQ=recompute "$MODE=FLAMIA_BWD_DQ=$MODE" ${EXTRA:-}
cp "$OUT/logs/ab/env_ab_runs.json" "$OUT/env_ab_runs.json" 2>/dev/null

echo "==== each kernel alone, fixed-16k, $MODE"
BUILD_DIR="$BUILD" OUT="$OUT/logs/kernels" WORKLOADS=fixed-16k RECIPES="$RECIPES" BENCH_ENV="FLAMIA_BWD_DQ=$MODE" \
  timeout 200 bash tools/step_kernels.sh 2>&1 | grep -E '^==|dkdv|dq_'

if [ "${PROFILE:-1}" = 1 ]; then
  for r in ${RECIPES//,/ }; do
    echo "==== ncu: $KERNELS with $MODE, and the default passes, fixed-16k $r"
    BUILD_DIR="$BUILD" OUT="$OUT/logs/prof_${MODE}_$r" RECIPE=$r KERNELS="$KERNELS" FLAMIA_BWD_DQ=$MODE \
      STALLS="${STALLS:-0}" timeout 200 bash tools/backward_profile.sh 2>&1 |
      grep -E '^==== ncu|Duration|Registers Per|Issued Warp Per Scheduler  |per score|Stall (Long|Wait|Barrier|Math|Short)|Memory Throughput|^  [A-Z0-9]+ +[0-9.]+ %'
    BUILD_DIR="$BUILD" OUT="$OUT/logs/prof_det_$r" RECIPE=$r KERNELS="dkdv_kernel dq_kernel" STALLS="${STALLS:-0}" FLAMIA_BWD_DQ=recompute \
      timeout 200 bash tools/backward_profile.sh 2>&1 |
      grep -E '^==== ncu|Duration|Issued Warp Per Scheduler  |per score|^  [A-Z0-9]+ +[0-9.]+ %'
  done
fi

if [ "${SUITE:-1}" = 1 ]; then
  echo "==== GPU suite"
  timeout 400 "$BUILD/flamia_gpu_tests" >"$OUT/logs/gpu_suite.log" 2>&1
  echo "exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/logs/gpu_suite.log" | head -1)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/logs/gpu_suite.log" | sort -u | head -20
fi
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
