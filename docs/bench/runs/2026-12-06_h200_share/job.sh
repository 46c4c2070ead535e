#!/usr/bin/env bash
# On an H200 only (elsewhere it stops at once): the training step's attention share on main's
# kernels (README's H200 share is from v69-v73's kernels), long context then 32k-token packs,
# recipes interleaved bf16, fp8_mixed, fp8 as in the earlier rounds, seeds 1-3 as time allows.
# Carried: .ab/main (main's tree, prebuilt) and .ab/data (training/data's train split,
# xz-compressed, to fit the carry limit).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
[[ $gpu == *H200* ]] || exit 0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
mkdir -p training && tar -C training -xJf .ab/data/data.tar.xz
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python
for seed in 1 2 3; do
  for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
    name=${setting%%:*} args=${setting#*:}
    for r in bf16 fp8_mixed fp8; do
      (( SECONDS < 500 )) || break 3
      timeout 90 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
        > $OUT/log-$name-$r-$seed.txt 2>&1 || echo "share $name $r $seed failed: $(tail -3 $OUT/log-$name-$r-$seed.txt)"
    done
  done
done
cat $OUT/share-long.jsonl $OUT/share-short.jsonl 2>/dev/null
rm -f $OUT/log-*
echo "share done after $SECONDS s"
