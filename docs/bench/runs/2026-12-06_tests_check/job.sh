#!/usr/bin/env bash
# The GPU suite and the Python tests that changed (test_package.py, training/tests) on main's
# tree after the tests' fixes (the rejected calls' messages, the refused backwards' gradients).
# FILTER (a gtest filter, default every test) narrows the GPU suite. Carried: .ab/tests (main's
# tree, prebuilt).
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
( cd .ab/tests && timeout 300 ./prebuilt/flamia_gpu_tests --gtest_brief=1 --gtest_filter="${FILTER:-*}" ) > $OUT/gpu_tests.txt 2>&1
echo "gpu tests exit $?"; tail -5 $OUT/gpu_tests.txt
grep -E "^\[  FAILED|Failure" $OUT/gpu_tests.txt | head -20
export FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/tests/python
( cd .ab/tests && timeout 200 python3 -m pytest -q python/tests/test_package.py training/tests ) > $OUT/pytest.txt 2>&1
echo "pytest exit $?"; tail -5 $OUT/pytest.txt
