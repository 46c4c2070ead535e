#!/usr/bin/env bash
# The tree .ab/$TREE (default head: main at 45c145e, kernels as a8d24e7), prebuilt: the two
# Python refusals that ask the library which dQ path the backward takes
# (flamia_backward_dq_path) on a GPU, then the harness once, seven workloads, flamia and its
# baselines in one process (--quick: median of 5), within DEADLINE seconds (default 420).
# Carried: .ab/$TREE, .whl (the cuDNN frontend wheel).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
TREE=.ab/${TREE:-head}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $TREE/prebuilt/COMMIT | tee -a $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/$TREE/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site
(cd python/tests && FLAMIA_REQUIRE_GPU=1 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  test_errors.py test_low_memory.py) > $OUT/pytest.txt 2>&1
echo "pytest exit $? at $(( $(date +%s) - T0 )) s: $(tail -1 $OUT/pytest.txt)"
grep -E '^(FAILED|ERROR)' $OUT/pytest.txt | head
mkdir -p $OUT/harness
timeout $(( ${DEADLINE:-420} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out $OUT/harness > $OUT/harness/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/harness/*.png
tail -40 $OUT/harness/harness_console.txt
