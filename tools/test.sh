#!/usr/bin/env bash
# Build and run every test: the CPU suite always, the GPU suite when an sm_90 GPU is present
# (reported as skipped otherwise), and the Python tests (their GPU modules need PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FLAMIA_BUILD_DIR:-build}
bash tools/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" -L 'cpu|gpu'
# The Python suite skips its GPU modules by itself without PyTorch or a GPU, and the CPU
# modules that need PyTorch without it (-rs lists every skip with its reason); the package,
# ABI layout and workload tests and the training statistics tests run everywhere.
if python3 -c 'import pytest' >/dev/null 2>&1; then
  FLAMIA_LIBRARY="$PWD/$BUILD_DIR/libflamia.so" PYTHONPATH="$PWD/python" python3 -m pytest -q -rs python/tests training/tests
else
  echo "python tests: skipped (pytest not installed)"
fi
