#!/usr/bin/env bash
# One call: the Python suite's modules that go through the custom ops' schema (low_memory
# added to flamia::fwd and flamia::bwd), on the GPU with FLAMIA_REQUIRE_GPU=1: low_memory's
# own tests, torch.compile, accuracy, q_start, errors, the transformers integration. The
# package is the working tree's (python/), the library .ab/tests' (main's kernels).
# Carried: .ab/tests, .whl.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/python:/tmp/site FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so FLAMIA_REQUIRE_GPU=1
( cd python/tests && timeout 400 python3 -m pytest -q -rs test_low_memory.py test_compile.py test_accuracy.py \
    test_q_start.py test_errors.py test_transformers_integration_gpu.py ) > $OUT/pytest.txt 2>&1
echo "pytest exit $?"; tail -15 $OUT/pytest.txt
