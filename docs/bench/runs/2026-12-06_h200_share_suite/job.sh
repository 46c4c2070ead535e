#!/usr/bin/env bash
# On an H200: the training step's attention share on today's kernels (README's H200 numbers
# are v69-v73's), three rounds at long context and two at 32k-token packs, recipes
# interleaved as before; then the transformers GPU tests alone with their durations. On any
# other GPU (the share rounds on an H100 are in docs/bench/runs/2026-12-06_share_rounds/):
# the whole Python suite with per-test durations and a stack dump of any test that runs past
# 150 s, to find where the suite's last minutes go. Carried: .ab/head (main's kernels,
# prebuilt), training/data, this file.
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT
export FLAMIA_LIBRARY=$PWD/.ab/head/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/head/python
suite() {  # suite SECONDS PYTEST-ARGS...
  local t=$1; shift
  (cd .ab/head && timeout "$t" python3 -m pytest -v -p no:cacheprovider --durations=25 \
     -o faulthandler_timeout=150 "$@" > $OUT/python_suite.txt 2>&1
   echo "python suite exit $? after $SECONDS s: $(tail -1 $OUT/python_suite.txt)")
}
if [[ $gpu == *H200* ]]; then
  for seed in 1 2 3; do
    for setting in "long:--head-dim 128 --pack-tokens 65536 --max-doc-len 16384" "short:"; do
      name=${setting%%:*} args=${setting#*:}
      [[ $name == short && $seed == 3 ]] && continue
      for r in bf16 fp8_mixed fp8; do
        timeout 100 python3 training/attention_share.py --recipe $r --seed $seed $args --out $OUT/share-$name.jsonl \
          > $OUT/log-$name-$r-$seed.txt 2>&1 || echo "share $name $r $seed failed: $(tail -3 $OUT/log-$name-$r-$seed.txt)"
      done
    done
  done
  cat $OUT/share-long.jsonl $OUT/share-short.jsonl
  rm -f $OUT/log-*
  echo "share done after $SECONDS s"
  suite $((560 - SECONDS)) python/tests/test_transformers_integration_gpu.py
else
  suite 540 python/tests
fi
