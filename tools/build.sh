#!/usr/bin/env bash
# Configure and build flamia into ${FLAMIA_BUILD_DIR:-build} (Release; ninja when present).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FLAMIA_BUILD_DIR:-build}
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
