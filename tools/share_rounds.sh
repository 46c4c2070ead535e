#!/usr/bin/env bash
# Rounds of the training step's attention share (training/attention_share.py) on one prebuilt
# tree's library: per seed, long context (head dim 128, 64k-token packs of documents to 16k)
# then 32k-token packs, recipes interleaved bf16, fp8_mixed, fp8 so that a drift in the GPU's
# clocks falls on all three alike. Starts no run once DEADLINE seconds (default 500) have
# passed since it began; appends to $OUT/share-long.jsonl and $OUT/share-short.jsonl.
#   OUT=... DEADLINE=500 SEEDS="1 2 3" bash tools/share_rounds.sh .ab/main
set -uo pipefail
tree=${1:?usage: $0 TREE (a tools/prebuild_trees.sh tree)}
: "${OUT:?OUT: the folder for the JSON lines}"
export FLAMIA_LIBRARY=$PWD/$tree/prebuilt/libflamia.so PYTHONPATH=$PWD/$tree/python
for seed in ${SEEDS:-1 2 3}; do
  for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
    name=${setting%%:*} args=${setting#*:}
    for r in bf16 fp8_mixed fp8; do
      (( SECONDS < ${DEADLINE:-500} )) || exit 0
      log=$OUT/log-$name-$r-$seed.txt
      # shellcheck disable=SC2086  # args are the setting's options, split on purpose
      timeout 90 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
        > "$log" 2>&1 || echo "share $name $r seed $seed failed: $(tail -3 "$log")"
      rm -f "$log"
    done
  done
done
