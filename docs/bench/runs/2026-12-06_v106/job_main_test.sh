#!/usr/bin/env bash
# main's own kernels (d20b571) on the new GpuLazyReference test and the other retake case.
# Carried: .ab/tmain (tools/make_trees.sh tmain=main, tools/prebuild_trees.sh).
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader; cat .ab/tmain/prebuilt/COMMIT
timeout 60 .ab/tmain/prebuilt/flamia_gpu_tests --gtest_filter='*HugeLogits*:*LazyReference*' > $OUT/gpu_retake_main.txt 2>&1
echo "exit $? $(grep -E '^\[  (PASSED|FAILED)  \]|OK \]' $OUT/gpu_retake_main.txt | tr '\n' ' ')"
