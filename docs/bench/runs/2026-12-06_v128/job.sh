#!/usr/bin/env bash
# v128 (da80b61, branch bwd-two-ahead: the dK/dV pass requests a step's tiles two steps ahead,
# its ring's depth less one, instead of one) and v128b (76379f7, the same branch: the dQ pass's
# ring as well) against main. On an H200 without SKIP_HARNESS=1 only the
# harness on main's kernels (as docs/bench/runs/2026-12-06_refresh/job.sh, the README's table;
# the rest then runs in a second call). Otherwise the backward's GPU checks on the v128b tree
# (both dQ forms; its dK/dV pass is v128's), then the A/B (both recipes, backward and step,
# three rounds, alternating trees; v128b only: fp8_mixed at head dim 128 runs v128's change
# alone, its dQ being the stored dS's GEMM), then where v128's fp8_mixed dK/dV waits (source
# counters).
# Trees: tools/make_trees.sh v128=da80b61 v128b=76379f7, then tools/prebuild_trees.sh; .ab/main
# is main's prebuilt tree; carried: .ab/main, .ab/v128b, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v128b/prebuilt/COMMIT
if [[ $gpu == *H200* && ${SKIP_HARNESS:-0} != 1 ]]; then
  echo "==== the harness (H200)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  mkdir -p $OUT/h200
  FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site timeout 330 \
    python3 -m flamia.bench --quick --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
    --out $OUT/h200 > $OUT/h200/harness_console.txt 2>&1
  echo "harness exit $? at $(( $(date +%s) - T0 )) s"
  rm -f $OUT/h200/*.png
  tail -22 $OUT/h200/harness_console.txt
  exit 0
fi
OUT=$OUT bash tools/backward_checks.sh .ab/v128b
left=$(( 570 - ($(date +%s) - T0) ))
echo "==== A/B ($left s left)"
[ $left -gt 120 ] && OUT=$OUT/ab WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed,fp8 \
  ROUNDS=3 PHASES=bwd,step timeout $(( left - 60 )) bash tools/ab_bench.sh .ab/main .ab/v128b 2>&1 | tail -24
[ -s $OUT/ab/ab_bench.md ] && rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
left=$(( 580 - ($(date +%s) - T0) ))
if [ $left -gt 50 ]; then
  OUT=/tmp/prof BENCH=$PWD/.ab/v128b/prebuilt/flamia_bench STALLS=1 KERNELS=dkdv_kernel RECIPE=fp8_mixed \
    timeout $left bash tools/backward_profile.sh > $OUT/stalls_v128.txt 2>&1
  grep -E "BRA|WARPGROUP|SYNCS" $OUT/stalls_v128.txt | head -12
fi
echo "done at $(( $(date +%s) - T0 )) s"
