#!/usr/bin/env bash
# v123 (the D = 64 forward on D = 128's plan: two consumers) and v124 (fp8_mixed's D = 128
# dK/dV step forms Pᵀ while dPᵀ runs) against main: each candidate's GPU checks, then its A/B
# (tools/ab_forward.sh). On an H200, then the harness once on main for the README's table.
# Trees: tools/make_trees.sh main=main v123=fwd-two64 v124=bwd-scores-first, then
# tools/prebuild_trees.sh; carried: .ab/main, .ab/v123, .ab/v124, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader); echo "$gpu"
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v123/prebuilt/COMMIT .ab/v124/prebuilt/COMMIT
mkdir -p $OUT/v123 $OUT/v124
echo "==== v123 (forward)"
OUT=$OUT/v123 WORKLOADS=fixed-16k,llama1b-pack PHASES=fwd AB_SECONDS=150 bash tools/ab_forward.sh .ab/main .ab/v123
echo "==== v124 (fp8_mixed backward) at $(( $(date +%s) - T0 )) s"
OUT=$OUT/v124 FILTER='*Shapes.MatchesSpec/*:*Matrix*:*StoredDq*:*LargeLogits*:*NonFinite*:*CausalSafety*:*DocumentIsolation*:*Determinism*' \
  WORKLOADS=fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8_mixed PHASES=bwd,step AB_SECONDS=240 \
  bash tools/ab_forward.sh .ab/main .ab/v124
echo "done at $(( $(date +%s) - T0 )) s"
[ $(( $(date +%s) - T0 )) -lt 480 ] && case "$gpu" in *H200*)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
  echo "==== harness (main, H200)"
  timeout $(( 590 - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
    --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
    --out $OUT/h200 > $OUT/harness_h200_console.txt 2>&1
  echo "harness exit $? at $(( $(date +%s) - T0 )) s"
  rm -f $OUT/h200/*.png ;;
esac
