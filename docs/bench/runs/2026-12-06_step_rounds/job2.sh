#!/usr/bin/env bash
# fixed-4k and fixed-8k's step again, six processes alternating the harness's --quick counts
# (5 iterations after 2 warm-up steps) and its default (20 after 3), with the board's SM clock
# and power sampled every 100 ms, to see whether the count moves the ratios (the first job's
# 20-iteration rounds read flamia's fp8_mixed step 6-10 % above the --quick table's, the
# baselines 0-7 %). Carried: .ab/tests (prebuilt), .whl (the cuDNN frontend wheel).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/tests/python:/tmp/site
tag=h100; [[ $gpu == *H200* ]] && tag=h200
dir=/tmp/rounds/$tag; mkdir -p $dir
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
  > $OUT/${tag}_smi.csv 2>&1 & smi=$!
for i in 1 2 3 4 5 6; do
  if (( i % 2 )); then it="--iters 5 --warmup 2"; name=q$i; else it="--iters 20 --warmup 3"; name=d$i; fi
  left=$(( ${DEADLINE:-300} - ($(date +%s) - T0) )); [ $left -lt 30 ] && { echo "round $name: no time left"; break; }
  echo "=== round $name ($it) $(date -u +%H:%M:%S.%N)" >> $OUT/${tag}_console.txt
  timeout $left python3 -m flamia.bench --workloads fixed-4k,fixed-8k $it --no-checks \
    --impls flamia,sdpa_cudnn,cudnn_thd,cudnn_fp8 --out $dir/$name >> $OUT/${tag}_console.txt 2>&1
  echo "round $name exit $? at $(( $(date +%s) - T0 )) s"; rm -f $dir/$name/*.png
done
kill $smi
tar -C $dir -czf $OUT/${tag}_rounds.tgz .
