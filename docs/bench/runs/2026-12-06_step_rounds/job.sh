#!/usr/bin/env bash
# One call, two parts, on main's tree (97eb327, kernels as c98d83e's), prebuilt in .ab/tests:
# (1) the GPU suite, the changed Python tests, and memcheck over the error tests (the tests'
#     fixes of 2026-12-06 were compiled, not run, on a GPU);
# (2) fixed-4k and fixed-8k's step in ROUNDS processes (default 5), each the harness with
#     flamia and the three fastest baselines at 20 iterations, so that fixed-4k's ratio (1.05x
#     in one run of 5 iterations, 0.98x the run before) has a spread.
# Carried: .ab/tests (prebuilt), .whl (the cuDNN frontend wheel, for cudnn_thd and cudnn_fp8).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
T=.ab/tests/prebuilt
( cd .ab/tests && timeout 200 ./prebuilt/flamia_gpu_tests --gtest_brief=1 ) > $OUT/gpu_tests.txt 2>&1
echo "gpu tests exit $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.txt
grep -E "^\[  FAILED|Failure" $OUT/gpu_tests.txt | head -20
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $T/flamia_gpu_tests \
  --gtest_filter='ErrorsSmall.*:BackwardInputs.*' > $OUT/memcheck_errors.txt 2>&1
echo "memcheck exit $? at $(( $(date +%s) - T0 )) s"; tail -2 $OUT/memcheck_errors.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/$T/libflamia.so PYTHONPATH=$PWD/.ab/tests/python:/tmp/site
( cd .ab/tests && timeout 150 python3 -m pytest -q python/tests/test_package.py training/tests ) > $OUT/pytest.txt 2>&1
echo "pytest exit $? at $(( $(date +%s) - T0 )) s"; tail -2 $OUT/pytest.txt
dir=$OUT/h100; [[ $gpu == *H200* ]] && dir=$OUT/h200
for i in $(seq 1 "${ROUNDS:-5}"); do
  left=$(( ${DEADLINE:-540} - ($(date +%s) - T0) )); [ $left -lt 60 ] && { echo "round $i: no time left"; break; }
  mkdir -p $dir/round$i
  timeout $left python3 -m flamia.bench --workloads fixed-4k,fixed-8k --iters 20 --warmup 3 --no-checks \
    --impls flamia,sdpa_cudnn,cudnn_thd,cudnn_fp8 --out $dir/round$i > $dir/round$i/console.txt 2>&1
  echo "round $i exit $? at $(( $(date +%s) - T0 )) s"; rm -f $dir/round$i/*.png
done
