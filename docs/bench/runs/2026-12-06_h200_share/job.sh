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
DEADLINE=500 bash tools/share_rounds.sh .ab/main
cat $OUT/share-long.jsonl $OUT/share-short.jsonl 2>/dev/null
echo "share done after $SECONDS s"
