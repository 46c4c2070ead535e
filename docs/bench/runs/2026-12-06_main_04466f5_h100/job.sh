#!/usr/bin/env bash
# main 04466f5: its GPU smoke subset (the D = 64 kernel of v102e included), then the harness twice (7 workloads).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
echo "==== GPU smoke subset (main)"
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*'
timeout 120 .ab/main/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_smoke_main.txt 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_smoke_main.txt | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_smoke_main.txt | head
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
for r in 1 2; do
  echo "==== harness run $r (main)"
  timeout $(( 570 - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
    --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
    --out $OUT/h$r > $OUT/harness_run${r}_console.txt 2>&1
  echo "harness exit $? at $(( $(date +%s) - T0 )) s"
  rm -f $OUT/h$r/*.png
done
ls -R $OUT
