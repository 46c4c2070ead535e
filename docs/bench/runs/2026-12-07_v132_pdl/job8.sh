#!/usr/bin/env bash
# v133b (branch quant-carveout, e9d11d0, .ab/v133b prebuilt): the quantizers' shared-memory
# split. One build, FLAMIA_QUANT_CARVEOUT unset against l1 (and max, v133's, as the known
# loss), alternated three rounds (tools/env_ab.sh). Carried: .ab/v133b.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/v133b/prebuilt/COMMIT | tee -a $OUT/gpu.txt
mkdir -p $OUT/env
BUILD_DIR=.ab/v133b/prebuilt WORKLOADS=fixed-4k,pack-32k,pack-128k,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 \
  ITERS=20 PHASES=quant,fwdq,step WHAT="v133b (e9d11d0): FLAMIA_QUANT_CARVEOUT unset, l1, max; one build" \
  OUT=$OUT/env timeout 400 bash .ab/v133b/tools/env_ab.sh driver= l1=FLAMIA_QUANT_CARVEOUT=l1 \
  max=FLAMIA_QUANT_CARVEOUT=max > $OUT/env_console.txt 2>&1
echo "env rc $? at $(( $(date +%s) - T0 )) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
