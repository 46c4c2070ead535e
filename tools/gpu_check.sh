#!/usr/bin/env bash
# One command for a fresh GPU machine: build (Release, ninja when present), run the CPU and
# GPU test suites, compute-sanitizer memcheck and racecheck on the small GPU cases, then the
# quick benchmark. Every step runs even if an earlier one failed; logs go to ${OUT:-./out}/;
# a summary block at the end; exit status nonzero if any step failed.
#
#   bash tools/gpu_check.sh
#
# Environment:
#   BUILD_DIR   build folder (default build-gpu)
#   OUT         log folder (default ./out)
#   STEPS       comma-separated subset of build,cpu,gpu,memcheck,racecheck,synccheck,bench
#               (default: all), e.g. STEPS=build,gpu then STEPS=memcheck,racecheck,bench
#               to stay within a per-command time limit; steps after a skipped build use
#               the binaries already in BUILD_DIR.
#   SANITIZER_TIMEOUT  seconds per compute-sanitizer run (default 900)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=$(nproc 2>/dev/null || echo 4)

STEPS=${STEPS:-build,cpu,gpu,memcheck,racecheck,synccheck,bench}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-900}

declare -a NAMES=() RESULTS=() TIMES=()
failed=0

want() { [[ ",$STEPS," == *",$1,"* ]]; }

# step NAME LOGFILE CMD...: runs CMD with output to the terminal and to $OUT/LOGFILE.
step() {
  local name=$1 log=$2
  shift 2
  echo
  echo "==== $name  (log: $OUT/$log)"
  local t0=$SECONDS rc
  "$@" 2>&1 | tee "$OUT/$log"
  rc=${PIPESTATUS[0]}
  NAMES+=("$name")
  TIMES+=("$((SECONDS - t0))s")
  if [ "$rc" -eq 0 ]; then
    RESULTS+=("PASS")
  else
    RESULTS+=("FAIL (exit $rc)")
    failed=1
  fi
  return "$rc"
}

skip() {
  NAMES+=("$1")
  RESULTS+=("SKIPPED: $2")
  TIMES+=("-")
  echo
  echo "==== $1: skipped ($2)"
}

# ---- environment -------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
} 2>&1 | tee "$OUT/environment.txt"

# ---- build ---------------------------------------------------------------------------------
built=0
if want build; then
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then GEN=(); fi  # keep the existing generator
  step "configure" configure.log cmake -S . -B "$BUILD_DIR" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=Release &&
    step "build" build.log cmake --build "$BUILD_DIR" -j"$JOBS"
  built=$?
fi

GPU_TESTS=$BUILD_DIR/flamia_gpu_tests
BENCH=$BUILD_DIR/flamia_bench

# ---- tests ---------------------------------------------------------------------------------
if want cpu; then
  if [ $built -eq 0 ]; then
    step "ctest -L cpu" ctest_cpu.log ctest --test-dir "$BUILD_DIR" -L cpu --output-on-failure -j"$JOBS"
  else
    skip "ctest -L cpu" "build failed"
  fi
fi
if want gpu; then
  if [ $built -eq 0 ]; then
    step "ctest -L gpu" ctest_gpu.log ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure -V
    # The GPU suite exits 77 without a usable GPU, which ctest reports as skipped (exit 0):
    # on a GPU machine that is a failure of this check.
    if grep -q "GPU tests skipped" "$OUT/ctest_gpu.log"; then
      RESULTS[${#RESULTS[@]}-1]="FAIL (suite skipped: no usable sm_90 GPU)"
      failed=1
    fi
    # The per-case error summaries ("[spec]" / "[exact]" blocks), for recalibrating tolerances.
    sed -E 's/^[0-9]+: //' "$OUT/ctest_gpu.log" |
      awk '/^\[(spec|exact)\]/ {p = 1; print; next} p && /^        / {print; next} {p = 0}' >"$OUT/gpu_accuracy.txt"
  else
    skip "ctest -L gpu" "build failed"
  fi
fi

# ---- compute-sanitizer ---------------------------------------------------------------------
# FLAMIA_GPU_TESTS_SMALL=1 selects the *Small* cases: every kernel runs 10-100x slower under
# the sanitizer. racecheck, the slowest, gets the smallest subset.
SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
RACE_FILTER='Gpu/Shapes.MatchesSpec/Small*:DeterminismSmall.*:FusedQkvViewsSmall.*'
for tool in memcheck racecheck synccheck; do
  want $tool || continue
  if [ $built -ne 0 ]; then
    skip "$tool" "build failed"
  elif [ -z "$SANITIZER" ]; then
    skip "$tool" "compute-sanitizer not found"
  else
    extra=()
    # No --leak-check: the library may keep per-device allocations for the process lifetime
    # (and racecheck keeps its default analysis report).
    filter=()
    [ $tool = racecheck ] && filter=(--gtest_filter="$RACE_FILTER")
    # The error-path tests make failing CUDA calls on purpose (an invalid device, a pending
    # error) and assert what flamia reports; memcheck would count those API errors as its own.
    # Memory access errors are reported either way.
    [ $tool = memcheck ] && extra=(--report-api-errors no)
    step "$tool (small gpu tests)" $tool.log env FLAMIA_GPU_TESTS_SMALL=1 timeout "$SANITIZER_TIMEOUT" \
      "$SANITIZER" --tool $tool ${extra[@]+"${extra[@]}"} --error-exitcode 1 "$GPU_TESTS" ${filter[@]+"${filter[@]}"}
  fi
done

# ---- benchmark -----------------------------------------------------------------------------
if want bench; then
  if [ $built -eq 0 ]; then
    step "flamia_bench --quick" bench_quick.log "$BENCH" --quick --json "$OUT/bench_quick.json"
  else
    skip "flamia_bench --quick" "build failed"
  fi
fi

# ---- summary -------------------------------------------------------------------------------
{
  echo
  echo "================================ gpu_check summary ================================"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), logs in $OUT"
  for i in "${!NAMES[@]}"; do
    printf "  %-32s %-8s %s\n" "${NAMES[$i]}" "${TIMES[$i]}" "${RESULTS[$i]}"
  done
  if [ -f "$OUT/ctest_gpu.log" ]; then
    echo
    # ctest -V prefixes each line of the test's output with "N: ".
    echo "GPU suite: $(grep -E '^([0-9]+: )?\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/ctest_gpu.log" |
      sed -E 's/^[0-9]+: //' | tr '\n' ' ')"
    grep -E '^([0-9]+: )?\[  FAILED  \] [A-Za-z]' "$OUT/ctest_gpu.log" | sed -E 's/^[0-9]+: //' | sort -u | head -40
  fi
  if [ -f "$OUT/bench_quick.log" ]; then
    echo
    # The table: from its header line to the end of the log.
    sed -n '/^workload /,$p' "$OUT/bench_quick.log"
  fi
  echo "==================================================================================="
  if [ $failed -eq 0 ]; then echo "gpu_check: ALL STEPS PASSED"; else echo "gpu_check: SOME STEPS FAILED"; fi
} 2>&1 | tee "$OUT/summary.txt"
exit $failed
