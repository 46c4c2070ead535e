#!/usr/bin/env bash
# The call that ran job.sh: v107's A/B, phase clocks and checks; then, only where the GPU is
# an H200, the training step's attention share on main's kernels (README's H200 share is from
# v69-v73's kernels), long context then 32k-token packs, recipes interleaved, seeds as time
# allows. Carried: .ab/main, .ab/v107, .ab/v107b and
# .ab/data (training/data's train split, xz-compressed, to fit the carry limit).
set -uo pipefail
bash docs/bench/runs/2026-12-06_v107/job.sh
echo "v107 job done after $SECONDS s"
[[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]] || exit 0
mkdir -p training && tar -C training -xJf .ab/data/data.tar.xz   # the corpus travels compressed
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python
for seed in 1 2 3; do
  for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
    name=${setting%%:*} args=${setting#*:}
    for r in bf16 fp8_mixed fp8; do
      (( SECONDS < 480 )) || break 3
      timeout 100 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
        > $OUT/log-$name-$r-$seed.txt 2>&1 || echo "share $name $r $seed failed: $(tail -3 $OUT/log-$name-$r-$seed.txt)"
    done
  done
done
cat $OUT/share-long.jsonl $OUT/share-short.jsonl 2>/dev/null
rm -f $OUT/log-*
echo "share done after $SECONDS s"
