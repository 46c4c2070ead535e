#!/usr/bin/env bash
# One call: the harness's GPU test of --sustained (its forward record, added after the last GPU
# run), then fp8_mixed's dQ paths at the power cap. FLAMIA_BWD_DQ=auto (the stored dS, the
# default at D = 128), recompute and fused, each under the harness with --sustained 1 (steps,
# then forwards, back to back), the settings alternated ROUNDS times (tools/ab_sustained.sh,
# one library under three settings), the board sampled every 100 ms. The harness is the
# working tree's (python/), the library .ab/tests' (main's kernels). Then, with the time left,
# what a training step's peak memory is at long context (head dim 128, 64k-token packs) for
# fp8_mixed under recompute and auto and for BF16 (training/attention_share.py, seed 1).
# Carried: .ab/tests, .ab/data (training/data's train split, xz-compressed), .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/tests/prebuilt/COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/python:/tmp/site FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so
tag=h100; [[ $gpu == *H200* ]] && tag=h200
# Packed after each stage: a call cut short by its time limit still returns what ran.
pack() { tar -C $dir -czf $OUT/${tag}_dq.tgz . 2>/dev/null; }
dir=/tmp/dq/$tag; mkdir -p $dir
( cd python/tests && timeout 150 python3 -m pytest -q test_bench_gpu.py -k sustained ) > $dir/pytest_sustained.txt 2>&1
echo "sustained test exit $? at $(( $(date +%s) - T0 )) s"; tail -2 $dir/pytest_sustained.txt
pack
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
  > $dir/smi.csv 2>&1 & smi=$!
left=$(( ${DEADLINE:-560} - ($(date +%s) - T0) - 100 ))
OUT=$dir/ab WORKLOADS=${WORKLOADS:-fixed-16k,pack-32k,llama8b-pack} RECIPES=fp8_mixed timeout $left \
  bash tools/ab_sustained.sh auto=.ab/tests recompute=.ab/tests:FLAMIA_BWD_DQ=recompute \
  fused=.ab/tests:FLAMIA_BWD_DQ=fused > $dir/ab_console.txt 2>&1
echo "ab exit $? at $(( $(date +%s) - T0 )) s"; tail -20 $dir/ab/ab_sustained.md
pack
kill $smi
mkdir -p training && tar -C training -xJf .ab/data/data.tar.xz
for setting in mixed_recompute:fp8_mixed:recompute mixed_auto:fp8_mixed:auto bf16:bf16:auto; do
  IFS=: read name recipe mode <<<"$setting"
  left=$(( ${DEADLINE:-560} - ($(date +%s) - T0) )); [ $left -lt 75 ] && { echo "share $name: no time left"; break; }
  FLAMIA_BWD_DQ=$mode timeout $(( left < 100 ? left : 100 )) python3 training/attention_share.py --recipe $recipe --seed 1 \
    --head-dim 128 --pack-tokens 65536 --max-doc-len 16384 --out $dir/share_long.jsonl > $dir/share_$name.txt 2>&1 ||
    echo "share $name failed: $(tail -2 $dir/share_$name.txt)"
  echo "share $name done at $(( $(date +%s) - T0 )) s"
  pack
done
cat $dir/share_long.jsonl
pack
