#!/usr/bin/env bash
# v104e's and v104f's A/B against main (04466f5's kernels, the same source as main's today) and
# v104e's GPU checks; on an H200 also the harness on main for the README table. Trees made as
# docs/bench/runs/2026-12-06_v104_fusedq/v104e_job.sh says, main's as .ab/main; carried:
# .ab/main, .ab/v104e, .ab/v104f, .whl, this file.
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v104e/prebuilt/COMMIT .ab/v104f/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd,fwdq,step \
  timeout 240 bash tools/ab_bench.sh .ab/main .ab/v104e .ab/v104f 2>&1 | tail -17
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*:*Determinism*:*FusedQkv*'
timeout 150 .ab/v104e/prebuilt/flamia_gpu_tests --gtest_filter="$FILTER" > $OUT/gpu_checks_v104e.txt 2>&1
echo "GPU checks exit $? $(grep -E '^\[  PASSED  \]' $OUT/gpu_checks_v104e.txt)"
case "$gpu" in *H200*)
  pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site timeout 150 \
    python3 -m flamia.bench --quick --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
    --out $OUT/h200_harness > $OUT/h200_harness_console.txt 2>&1
  echo "harness exit $?"; tail -40 $OUT/h200_harness_console.txt;;
esac
