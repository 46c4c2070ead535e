#!/usr/bin/env bash
# The harness on main's kernels (10527b4's: v110c, v116, v122b since the README's H200 table)
# with this commit's Python (FlexAttention's block mask built by torch.compile(create_block_mask)).
# On an H200: seven workloads, flamia and its baselines in one process, within 480 s. On any
# other GPU: pack-32k only (the FlexAttention change, checked), then tools/backward_profile.sh
# on the prebuilt flamia_bench (BENCH), fp8_mixed's dK/dV pass, source counters.
# Run from the repository root; carried: .ab/main (prebuilt), .whl (the cuDNN frontend wheel).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site
if [[ $gpu == *H200* ]]; then
  workloads=fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack dir=h200
else
  workloads=pack-32k dir=other
fi
mkdir -p $OUT/$dir
timeout $(( 480 - ($(date +%s) - T0) )) python3 -m flamia.bench --quick --workloads $workloads \
  --out $OUT/$dir > $OUT/$dir/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/$dir/*.png
grep -c DeprecationWarning $OUT/$dir/harness_console.txt
tail -25 $OUT/$dir/harness_console.txt
if [[ $gpu != *H200* ]]; then
  OUT=/tmp/prof BENCH=$PWD/.ab/main/prebuilt/flamia_bench STALLS=1 KERNELS=dkdv_kernel RECIPE=fp8_mixed \
    timeout 200 bash tools/backward_profile.sh > $OUT/other/backward_profile.txt 2>&1
  echo "backward_profile exit $? at $(( $(date +%s) - T0 )) s"
  head -30 $OUT/other/backward_profile.txt
fi
