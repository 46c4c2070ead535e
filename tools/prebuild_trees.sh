#!/usr/bin/env bash
# Builds the GPU programs of trees made by tools/make_trees.sh on a machine without a GPU (the
# same CUDA toolkit as the GPU machine's, sm_90a), so that a GPU job need not build them:
# .ab/NAME/prebuilt/ gets libflamia.so and the test, benchmark, fuzz and probe programs, each
# finding the library beside it (RUNPATH $ORIGIN), and COMMIT. tools/ab_bench.sh uses them
# where they run.
#   bash tools/prebuild_trees.sh v92=fwd-stagger main=main
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
for spec in "$@"; do
  name=${spec%%=*} rev=${spec#*=}
  [ -d ".ab/$name" ] || { echo "$name: no tree .ab/$name (tools/make_trees.sh)"; continue; }
  build=${TMPDIR:-/tmp}/flamia-prebuild/$name
  mkdir -p "$build"
  programs="flamia_gpu_tests flamia_bench flamia_fuzz"
  grep -q flamia_issue_probe ".ab/$name/CMakeLists.txt" && programs="$programs flamia_issue_probe"
  grep -q flamia_boundary_probe ".ab/$name/CMakeLists.txt" && programs="$programs flamia_boundary_probe"
  grep -q flamia_quant_probe ".ab/$name/CMakeLists.txt" && programs="$programs flamia_quant_probe"
  { cmake -S ".ab/$name" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON &&
    ninja -C "$build" -j"$jobs" flamia $programs; } >"$build.log" 2>&1 ||
    { echo "$name: build failed ($build.log)"; continue; }
  # Afresh: nothing left from an earlier build of another revision.
  rm -rf ".ab/$name/prebuilt" && mkdir -p ".ab/$name/prebuilt"
  cp "$build/libflamia.so" ".ab/$name/prebuilt/"
  for t in $programs; do cp "$build/$t" ".ab/$name/prebuilt/"; done
  git rev-parse --short "$rev" >".ab/$name/prebuilt/COMMIT"
  echo "$name: prebuilt ($(cat ".ab/$name/prebuilt/COMMIT"))"
done
