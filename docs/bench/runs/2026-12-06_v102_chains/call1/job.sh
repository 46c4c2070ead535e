#!/usr/bin/env bash
# v102c (two reduction chains, started at their first element): its tree's GPU smoke subset and the fp8 forward A/B against main
# d721081; then the harness on main d721081 (7 workloads).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/c2/prebuilt/COMMIT .ab/c2c/prebuilt/COMMIT
echo "==== GPU smoke subset (c2c)"
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*'
timeout 90 .ab/c2c/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_smoke_c2c.log 2>&1
echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_smoke_c2c.log | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_smoke_c2c.log | head
echo "==== A/B fwd head vs c2 vs c2c"
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd timeout 170 bash tools/ab_bench.sh .ab/head .ab/c2 .ab/c2c 2>&1 | tail -8
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
echo "at $(( $(date +%s) - T0 )) s"
echo "==== harness (head)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/head/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/head/python:/tmp/site
timeout $(( ${DEADLINE:-560} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out $OUT/harness > $OUT/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/harness/*.png
