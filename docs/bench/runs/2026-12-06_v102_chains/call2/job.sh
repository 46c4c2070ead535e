#!/usr/bin/env bash
# Optional landing checks of v102c's tree (LAND=1: the GPU suite past the smoke subset, the
# fuzzer, memcheck on the isolation and causal cases), then the training step's attention share
# on main's tree (long context, then 32k-token packs).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/head/prebuilt/COMMIT .ab/c2/prebuilt/COMMIT
if [ "${LAND:-0}" = 1 ]; then
  FILTER='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*'
  echo "==== GPU suite, the rest (c2)"
  timeout 150 .ab/c2/prebuilt/flamia_gpu_tests --gtest_filter="-$FILTER" > $OUT/gpu_rest_c2.log 2>&1
  echo "exit $? $(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' $OUT/gpu_rest_c2.log | tr '\n' ' ') at $(( $(date +%s) - T0 )) s"
  grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/gpu_rest_c2.log | head
  echo "==== fuzzer (c2)"
  timeout 60 .ab/c2/prebuilt/flamia_fuzz --cases 200 2>&1 | tail -3
  echo "==== memcheck (c2)"
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 120 $SAN --tool memcheck --error-exitcode 1 .ab/c2/prebuilt/flamia_gpu_tests \
    --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*' > $OUT/memcheck_c2.log 2>&1
  echo "exit $? at $(( $(date +%s) - T0 )) s"; grep -E 'PASSED|FAILED|ERROR SUMMARY' $OUT/memcheck_c2.log | head -5
fi
echo "==== training share (head)"
export FLAMIA_LIBRARY=$PWD/.ab/head/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/head/python
for setting in long short; do
  if [ $setting = long ]; then A="--head-dim 128 --pack-tokens 65536 --max-doc-len 16384"; else A=""; fi
  for r in bf16 fp8_mixed fp8; do
    [ $(( $(date +%s) - T0 )) -gt ${DEADLINE:-520} ] && { echo "skip $setting $r (time)"; continue; }
    timeout 80 python3 training/attention_share.py --recipe $r $A --seed 1 --data-dir training/data \
      --out $OUT/share-$setting.jsonl 2>&1 | tail -1
  done
done
echo "done at $(( $(date +%s) - T0 )) s"
