#!/usr/bin/env bash
# main's landing checks and the training step's attention share with today's kernels (asked for an
# H200; it ran on an H100 80GB HBM3, outputs beside this file and in docs/training/).
# Carried: .ab/head (tools/make_trees.sh head=main, then tools/prebuild_trees.sh head=main),
# training/data (training/prepare_data.py), this file.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT
T=.ab/head/prebuilt
timeout 150 $T/flamia_gpu_tests > $OUT/gpu_suite.txt 2>&1
echo "GPU suite exit $? $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/gpu_suite.txt | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $T/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck exit $? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
timeout 90 $T/flamia_fuzz --cases 200 > $OUT/fuzz.txt 2>&1; echo "fuzz exit $? $(tail -1 $OUT/fuzz.txt)"
export FLAMIA_LIBRARY=$PWD/$T/libflamia.so PYTHONPATH=$PWD/.ab/head/python
# One round each, bf16 first, as the earlier share measurements (docs/TRAINING.md).
for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
  name=${setting%%:*} args=${setting#*:}
  for r in bf16 fp8_mixed fp8; do
    timeout 100 python3 training/attention_share.py --recipe $r --seed 1 $args --out $OUT/share-$name.jsonl \
      > $OUT/share-$name-$r.txt 2>&1 || echo "share $name $r failed: $(tail -3 $OUT/share-$name-$r.txt)"
  done
  cat $OUT/share-$name.jsonl
done
python3 -c 'import pytest' 2>/dev/null && (cd .ab/head && timeout 150 python3 -m pytest -q -x python/tests > $OUT/python_suite.txt 2>&1;
  echo "python suite exit $? $(tail -1 $OUT/python_suite.txt)")
