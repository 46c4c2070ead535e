#!/usr/bin/env bash
# The main job: build, then benchmark on an sm_90 GPU; without one, say so and run the
# CPU numerics study (errors of every scaling scheme against float64, leak checks).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FLAMIA_BUILD_DIR:-build}
bash tools/build.sh
exec "$BUILD_DIR/flamia_bench" "$@"
