#!/usr/bin/env bash
# The training step's attention share and what attention adds to its peak allocation, on
# main's kernels (through v128c), on whichever GPU the call gets: long context (head dim 128,
# 64k-token packs of documents to 16k) then 32k-token packs, recipes interleaved bf16,
# fp8_mixed, fp8, seeds 1-3 as time allows (tools/share_rounds.sh). Carried: .ab/main (main's
# tree, prebuilt) and .ab/data (training/data's train split, xz-compressed).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
mkdir -p training && tar -C training -xJf .ab/data/data.tar.xz
DEADLINE=${DEADLINE:-480} bash tools/share_rounds.sh .ab/main
cat $OUT/share-long.jsonl $OUT/share-short.jsonl 2>/dev/null
echo "share done after $SECONDS s"
