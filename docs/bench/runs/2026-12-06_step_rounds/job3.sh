#!/usr/bin/env bash
# The whole harness (seven workloads, flamia and its baselines, no accuracy checks) at the
# --quick counts (5 iterations after 2 warm-up steps), at the default counts (20 after 3), and
# at the --quick counts again, with the board's SM clock and power sampled every 100 ms: how
# much of the README's table is the count. The 20-iteration run also times sustained steps
# (--sustained 1: back to back, with NVML's energy a step). The harness is the working tree's
# (python/), the library .ab/tests' (97eb327's kernels, main's). Carried: .ab/tests, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site
( cd python/tests && timeout 120 python3 -m pytest -q test_bench_gpu.py -k sustained ) > $OUT/pytest_sustained.txt 2>&1
echo "sustained test exit $?"; tail -2 $OUT/pytest_sustained.txt
tag=h100; [[ $gpu == *H200* ]] && tag=h200
dir=/tmp/harness/$tag; mkdir -p $dir
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
  > $OUT/${tag}_smi.csv 2>&1 & smi=$!
for name in q1 d2 q3; do
  case $name in q*) it="--iters 5 --warmup 2";; d*) it="--iters 20 --warmup 3 --sustained 1";; esac
  left=$(( ${DEADLINE:-540} - ($(date +%s) - T0) )); [ $left -lt 60 ] && { echo "run $name: no time left"; break; }
  echo "=== run $name ($it) $(date -u +%H:%M:%S.%N)" >> $OUT/${tag}_console.txt
  timeout $left python3 -m flamia.bench --no-checks $it --out $dir/$name \
    --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack >> $OUT/${tag}_console.txt 2>&1
  echo "run $name exit $? at $(( $(date +%s) - T0 )) s"; rm -f $dir/$name/*.png
done
kill $smi
tar -C $dir -czf $OUT/${tag}_runs.tgz .
