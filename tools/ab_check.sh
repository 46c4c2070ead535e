#!/usr/bin/env bash
# Builds and checks several source trees in one GPU call, for comparing versions of the
# kernels side by side on the same machine: per tree the GPU suite, racecheck/synccheck of two
# small fuzz cases and flamia_bench on the given workloads; optionally the fuzzer at scale,
# the Python suite on the GPU and the backward's ncu profile. Trees are directories holding a
# copy of the repository (tools/make_trees.sh makes them from revisions).
#   bash tools/ab_check.sh DIR [DIR ...]
# Environment: OUT (logs, default ./out), WORKLOADS (default fixed-16k,pack-32k,llama1b-pack),
# SUITE_FILTER (gtest filter, default all), ITERS (default 10), FUZZ_CASES (default 0: none),
# PYTEST=1 (python/tests with the tree's library; needs torch), PROFILE=1
# (tools/backward_profile.sh of the tree), BENCH_ENV (VAR=value pairs for the benchmark and
# the profile only, e.g. BENCH_ENV=FLAMIA_BWD_DQ=fused: the suite runs without them).
# A device call returns few files, so at the end every log goes into $OUT/ab_logs.tar.gz and
# $OUT keeps that, the benchmark JSONs and ab_summary.txt (what was printed).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [DIR ...]"; exit 2; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/ab_logs"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/ab_logs
exec > >(tee "$OUT/ab_summary.txt") 2>&1
JOBS=$(nproc 2>/dev/null || echo 8)
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for dir in "$@"; do
  dir=$(cd "$dir" && pwd) || { status=1; continue; }
  name=$(basename "$dir")
  echo "==== $name"
  build="$dir/build-ab"
  # Programs built elsewhere (tools/prebuild_trees.sh) are used where they run here.
  if "$dir/prebuilt/flamia_gpu_tests" --gtest_list_tests >/dev/null 2>&1 && [ -x "$dir/prebuilt/flamia_fuzz" ]; then
    build="$dir/prebuilt"
    echo "prebuilt ($(cat "$build/COMMIT" 2>/dev/null))"
  else
    { cmake -S "$dir" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
      cmake --build "$build" -j"$JOBS" --target flamia flamia_gpu_tests flamia_bench flamia_fuzz; } \
      >"$LOGS/$name.build.log" 2>&1 || { echo "build failed"; tail -20 "$LOGS/$name.build.log"; status=1; continue; }
  fi
  timeout 300 "$build/flamia_gpu_tests" --gtest_filter="${SUITE_FILTER:-*}" >"$LOGS/$name.gpu.log" 2>&1
  echo "suite: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOGS/$name.gpu.log" | head -1)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$LOGS/$name.gpu.log" | sort -u | head -10
  if [ -x "$SANITIZER" ]; then
    for tool in racecheck synccheck; do
      timeout 120 "$SANITIZER" --tool $tool --error-exitcode 1 "$build/flamia_fuzz" --small --cases 2 --seed 1 \
        >"$LOGS/$name.$tool.log" 2>&1 || status=1
      echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$name.$tool.log" | tail -1)"
    done
  fi
  timeout 200 env ${BENCH_ENV:-} "$build/flamia_bench" --workloads "${WORKLOADS:-fixed-16k,pack-32k,llama1b-pack}" --iters "${ITERS:-10}" \
    --json "$OUT/$name.bench.json" 2>&1 | sed -n '/^workload /,/^$/p'
  if [ "${FUZZ_CASES:-0}" -gt 0 ]; then
    BUILD_DIR="$build" OUT="$LOGS/$name-fuzz" SANITIZER_CASES=4 timeout 150 \
      bash "$dir/tools/fuzz_gpu.sh" "$FUZZ_CASES" 90 7 2>&1 | grep -E '^fuzz|ERROR SUMMARY|PASSED|FAILED' || status=1
  fi
  if [ "${PYTEST:-0}" = 1 ]; then
    (cd "$dir" && FLAMIA_REQUIRE_GPU=1 FLAMIA_LIBRARY="$build/libflamia.so" PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}" \
      timeout 480 python3 -m pytest -q -p no:cacheprovider python/tests) >"$LOGS/$name.pytest.log" 2>&1 || status=1
    echo "pytest: $(tail -1 "$LOGS/$name.pytest.log")"
    grep -E '^FAILED' "$LOGS/$name.pytest.log" | head -10
  fi
  if [ "${PROFILE:-0}" = 1 ]; then
    BUILD_DIR="$build" OUT="$LOGS/$name-prof" timeout 200 env ${BENCH_ENV:-} bash "$dir/tools/backward_profile.sh" 2>&1 |
      grep -E '^==== ncu|Duration|Issued Warp Per Scheduler  |per score|Stall (Long|Wait|Barrier)'
  fi
done
tar -czf "$OUT/ab_logs.tar.gz" -C "$OUT" ab_logs && rm -rf "$LOGS"
exit $status
