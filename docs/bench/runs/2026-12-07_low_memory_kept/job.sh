#!/usr/bin/env bash
# One call: (1) the Python suite's modules that go through the custom ops (low_memory's own
# tests — gradients, what autograd keeps, the step's peak —, torch.compile, accuracy, q_start,
# errors, the transformers integration) on the GPU with FLAMIA_REQUIRE_GPU=1; (2) the model's
# training step (training/attention_share.py: time and peak memory) at long context (head dim
# 128, 64k-token packs of documents to 16k) and at 32k-token packs (head dim 64), recipes
# bf16, fp8_mixed, fp8_mixed --low-memory, fp8, one seed, interleaved. The package and the
# training code are the working tree's, the library .ab/tests' (main's kernels).
# Carried: .ab/tests, .whl, training/data.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/python:/tmp/site FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so
( cd python/tests && FLAMIA_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -rs test_low_memory.py test_compile.py \
    test_accuracy.py test_q_start.py test_errors.py test_transformers_integration_gpu.py ) > $OUT/pytest.txt 2>&1
echo "pytest exit $? after $SECONDS s"; tail -12 $OUT/pytest.txt
for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
  name=${setting%%:*} args=${setting#*:}
  for r in bf16 fp8_mixed "fp8_mixed --low-memory" fp8; do
    (( SECONDS < 540 )) || break 2
    # shellcheck disable=SC2086  # the recipe's and the setting's options, split on purpose
    timeout 100 python3 training/attention_share.py --recipe $r $args --out $OUT/share-$name.jsonl \
      > $OUT/log.txt 2>&1 || echo "share $name $r failed: $(tail -3 $OUT/log.txt)"
  done
done
rm -f $OUT/log.txt
cat $OUT/share-*.jsonl
echo "done after $SECONDS s"
