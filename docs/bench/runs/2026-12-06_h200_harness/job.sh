#!/usr/bin/env bash
# On an H200 only (elsewhere it stops at once): the harness once on main's kernels (the
# README's H200 table is from v102e's), seven workloads, flamia and its baselines in one
# process, within DEADLINE seconds (default 300). Carried: .ab/main (prebuilt), .whl (the
# cuDNN frontend wheel, for the ragged baselines).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ $gpu == *H200* ]] || { echo "$gpu: not an H200, no harness"; exit 0; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
mkdir -p $OUT/h200
timeout $(( ${DEADLINE:-300} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out $OUT/h200 > $OUT/h200/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/h200/*.png
tail -30 $OUT/h200/harness_console.txt
