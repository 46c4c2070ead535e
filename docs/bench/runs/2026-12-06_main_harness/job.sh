#!/usr/bin/env bash
# The harness once on main's kernels (through v128c; the README's H200 table is v102e's), on
# whichever GPU the call gets (its folder is named for it), seven workloads, flamia and its
# baselines in one process, within DEADLINE seconds (default 300). Carried: .ab/main
# (prebuilt), .whl (the cuDNN frontend wheel, for the ragged baselines).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
dir=$OUT/h100; [[ $gpu == *H200* ]] && dir=$OUT/h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
mkdir -p "$dir"
timeout $(( ${DEADLINE:-300} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out "$dir" > "$dir/harness_console.txt" 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f "$dir"/*.png
tail -30 "$dir/harness_console.txt"
