#!/usr/bin/env bash
# job4.sh again, on whatever GPU comes: on an H200 the README's table (an H200 run) can be
# made from it; on an H100 it is a second run beside job4's. The harness on main's kernels
# after v132 (a8d24e7, .ab/pdl prebuilt), seven workloads, flamia and its baselines in one
# process (--quick: median of 5), within DEADLINE seconds (default 330). The package is the
# working tree's. Carried: .ab/pdl, .whl (the cuDNN frontend wheel, for the ragged and FP8
# baselines).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/pdl/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/pdl/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site
mkdir -p $OUT/harness
timeout $(( ${DEADLINE:-330} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out $OUT/harness > $OUT/harness/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/harness/*.png
tail -40 $OUT/harness/harness_console.txt
