#!/usr/bin/env bash
# The second call, on the same warm machine right after job.sh: two more seeds of the model's
# step (training/attention_share.py) at both settings, recipes bf16, fp8_mixed,
# fp8_mixed --low-memory interleaved. Carried: .ab/tests, training/data.
set -uo pipefail
: "${OUT:?}"
export PYTHONPATH=$PWD/python FLAMIA_LIBRARY=$PWD/.ab/tests/prebuilt/libflamia.so
for seed in 2 3; do
  for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
    name=${setting%%:*} args=${setting#*:}
    for r in bf16 fp8_mixed "fp8_mixed --low-memory"; do
      (( SECONDS < 500 )) || break 3
      # shellcheck disable=SC2086  # the recipe's and the setting's options, split on purpose
      timeout 100 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
        > $OUT/log.txt 2>&1 || echo "fail $name $r $seed: $(tail -3 $OUT/log.txt)"
    done
  done
done
rm -f $OUT/log.txt
nvidia-smi --query-gpu=name --format=csv,noheader
echo "done after $SECONDS s"
