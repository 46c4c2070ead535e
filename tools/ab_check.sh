#!/usr/bin/env bash
# Builds and checks several source trees in one GPU call, for comparing versions of the
# kernels side by side on the same machine: per tree the GPU suite, racecheck/synccheck of two
# small fuzz cases and flamia_bench on the given workloads. Trees are directories holding a
# copy of the repository (e.g. made with `git archive REV | tar -x -C DIR`).
#   bash tools/ab_check.sh DIR [DIR ...]
# Environment: OUT (logs, default ./out), WORKLOADS (default fixed-16k,pack-32k,llama1b-pack),
# SUITE_FILTER (gtest filter, default all), ITERS (default 10).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [DIR ...]"; exit 2; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
JOBS=$(nproc 2>/dev/null || echo 8)
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for dir in "$@"; do
  name=$(basename "$dir")
  echo "==== $name"
  build="$dir/build-ab"
  { cmake -S "$dir" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$build" -j"$JOBS" --target flamia flamia_gpu_tests flamia_bench flamia_fuzz; } \
    >"$OUT/$name.build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/$name.build.log"; status=1; continue; }
  timeout 300 "$build/flamia_gpu_tests" --gtest_filter="${SUITE_FILTER:-*}" >"$OUT/$name.gpu.log" 2>&1
  echo "suite: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$name.gpu.log" | head -1)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/$name.gpu.log" | sort -u | head -10
  if [ -x "$SANITIZER" ]; then
    for tool in racecheck synccheck; do
      timeout 120 "$SANITIZER" --tool $tool --error-exitcode 1 "$build/flamia_fuzz" --small --cases 2 --seed 1 \
        >"$OUT/$name.$tool.log" 2>&1 || status=1
      echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.$tool.log" | tail -1)"
    done
  fi
  timeout 200 "$build/flamia_bench" --workloads "${WORKLOADS:-fixed-16k,pack-32k,llama1b-pack}" --iters "${ITERS:-10}" \
    --json "$OUT/$name.bench.json" 2>&1 | sed -n '/^workload /,/^$/p'
done
exit $status
