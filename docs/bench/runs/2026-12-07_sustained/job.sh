#!/usr/bin/env bash
# One call: (1) the harness's GPU test of --sustained (its forward record, added after the last
# GPU run); (2) tools/ab_sustained.sh: main's kernels (.ab/tests) against v130 (D = 64's P8
# packed as formed, branch fwd-pack-inline64) on fixed-16k and llama1b-pack, the trees
# alternated (each tree's library under this checkout's harness with --sustained 1);
# (3) with the time left, the harness at 20 iterations with --sustained 1 (steps, then forwards,
# back to back at the power cap) over the seven workloads, flamia and the cuDNN baselines
# (the fastest of every workload in the last runs), the board sampled every 100 ms. The
# harness is the working tree's (python/); main's library .ab/tests' (4988150's kernels).
# Carried: .ab/tests, .ab/v130, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT .ab/v130/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/python:/tmp/site
tag=h100; [[ $gpu == *H200* ]] && tag=h200
# Packed after each stage: a call cut short by its time limit still returns what ran.
pack() { tar -C $dir -czf $OUT/${tag}_sustained.tgz . 2>/dev/null; }
dir=/tmp/sustained/$tag; mkdir -p $dir
( cd python/tests && FLAMIA_LIBRARY=$PWD/../../.ab/tests/prebuilt/libflamia.so timeout 150 \
    python3 -m pytest -q test_bench_gpu.py -k sustained ) > $dir/pytest_sustained.txt 2>&1
echo "sustained test exit $? at $(( $(date +%s) - T0 )) s"; tail -2 $dir/pytest_sustained.txt
pack
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
  > $dir/smi.csv 2>&1 & smi=$!
left=$(( ${AB_DEADLINE:-380} - ($(date +%s) - T0) ))
OUT=$dir/ab WORKLOADS=fixed-16k,llama1b-pack RECIPES=fp8 ROUNDS=${ROUNDS:-3} timeout $left \
  bash tools/ab_sustained.sh .ab/tests .ab/v130 > $dir/ab_console.txt 2>&1
echo "ab exit $? at $(( $(date +%s) - T0 )) s"
pack
left=$(( ${DEADLINE:-570} - ($(date +%s) - T0) ))
if [ $left -gt 60 ]; then
  FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so timeout $left python3 -m flamia.bench --no-checks \
    --iters 20 --warmup 3 --sustained 1 --impls flamia,sdpa_cudnn,cudnn_thd,cudnn_fp8 --out $dir/d20 \
    --workloads fixed-16k,llama1b-pack,fixed-4k,fixed-8k,pack-32k,pack-128k,llama8b-pack > $dir/console.txt 2>&1
  echo "harness exit $? at $(( $(date +%s) - T0 )) s"; rm -f $dir/d20/*.png
  pack
else echo "harness: no time left ($left s)"; fi
kill $smi
pack
