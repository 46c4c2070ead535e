#!/usr/bin/env bash
# v133 (branch quant-carveout, e14599c, .ab/v133 prebuilt): the quantizers' shared-memory
# split. One build, four settings alternated three rounds (tools/env_ab.sh): FLAMIA_PDL=0 and
# unset, each with and without FLAMIA_QUANT_CARVEOUT=max; then its GPU suite once with the
# carveout asked for. Carried: .ab/v133.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/v133/prebuilt/COMMIT | tee -a $OUT/gpu.txt
mkdir -p $OUT/env
BUILD_DIR=.ab/v133/prebuilt WORKLOADS=fixed-4k,pack-32k,fixed-16k,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 ITERS=20 \
  PHASES=quant,fwdq,bwd,step WHAT="v133 (e14599c): FLAMIA_PDL x FLAMIA_QUANT_CARVEOUT, one build" \
  OUT=$OUT/env timeout 330 bash .ab/v133/tools/env_ab.sh off=FLAMIA_PDL=0 pdl= \
  offmax=FLAMIA_PDL=0,FLAMIA_QUANT_CARVEOUT=max pdlmax=FLAMIA_QUANT_CARVEOUT=max > $OUT/env_console.txt 2>&1
echo "env rc $? at $(el) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
left=$(( 560 - $(el) ))
if (( left > 90 )); then
  FLAMIA_QUANT_CARVEOUT=max timeout $left .ab/v133/prebuilt/flamia_gpu_tests > $OUT/suite.txt 2>&1
  echo "suite (carveout) rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
  grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED' $OUT/suite.txt > $OUT/suite.short.txt; rm -f $OUT/suite.txt
fi
