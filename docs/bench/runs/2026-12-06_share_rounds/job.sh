#!/usr/bin/env bash
# Two more rounds of the training step's attention share on today's kernels (seeds 2 and 3,
# recipes interleaved as before), then the Python suite on the GPU. Carried: .ab/head
# (main's tree, 273a1c1's source, prebuilt), training/data, this file.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT
export FLAMIA_LIBRARY=$PWD/.ab/head/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/head/python
for seed in 2 3; do
  for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
    name=${setting%%:*} args=${setting#*:}
    for r in bf16 fp8_mixed fp8; do
      timeout 100 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
        > $OUT/log-$name-$r-$seed.txt 2>&1 || echo "share $name $r $seed failed: $(tail -3 $OUT/log-$name-$r-$seed.txt)"
    done
  done
done
cat $OUT/share-long.jsonl $OUT/share-short.jsonl
rm -f $OUT/log-*
(cd .ab/head && timeout 230 python3 -m pytest -q python/tests > $OUT/python_suite.txt 2>&1; echo "python suite exit $? $(tail -1 $OUT/python_suite.txt)")
