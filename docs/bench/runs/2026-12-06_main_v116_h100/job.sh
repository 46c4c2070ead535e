#!/usr/bin/env bash
# main after v110c and v116 (4d93e03's kernels): the harness twice, seven workloads, flamia and
# its baselines in one process each run. Run from the repository root; carried: .ab/main
# (prebuilt) and .whl (the cuDNN frontend wheel, for the ragged baselines).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
for r in 1 2; do
  echo "==== harness run $r (main)"
  timeout $(( 500 - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
    --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
    --out $OUT/h$r > $OUT/harness_run${r}_console.txt 2>&1
  echo "harness exit $? at $(( $(date +%s) - T0 )) s"
  rm -f $OUT/h$r/*.png
done
