#!/usr/bin/env bash
# The Python suite (pytest, GPU required) on main's library (pdlm tree: v97b's lazy reference
# and v90's overlapped launches, prebuilt).
set -uo pipefail
T0=$(date +%s)
d=$PWD/.ab/pdlm
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/flamia-site .whl/*.whl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
(cd $d && FLAMIA_REQUIRE_GPU=1 FLAMIA_LIBRARY=$d/prebuilt/libflamia.so PYTHONPATH=$d/python:/tmp/flamia-site \
  timeout $(( 450 - ($(date +%s) - T0) )) python3 -m pytest -q -rs -p no:cacheprovider python/tests) > $OUT/pytest.txt 2>&1
echo "pytest rc $? at $(( $(date +%s) - T0 )) s: $(tail -1 $OUT/pytest.txt)"
grep -E '^(FAILED|ERROR)' $OUT/pytest.txt | head
