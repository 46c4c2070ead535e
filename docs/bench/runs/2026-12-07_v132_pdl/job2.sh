#!/usr/bin/env bash
# The A/B of job.sh again, longer: five rounds of 20 iterations, six workloads, fp8 first in
# each process this time (fp8_mixed's forward, the same kernel as fp8's, measured first in
# job.sh's processes, scattered by 1-3 % a round).
# Carried: .ab/pdl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/pdl/prebuilt/COMMIT | tee -a $OUT/gpu.txt
mkdir -p $OUT/env
BUILD_DIR=.ab/pdl/prebuilt WORKLOADS=fixed-4k,fixed-8k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8,fp8_mixed \
  ROUNDS=5 ITERS=20 PHASES=fwdq,bwd,step WHAT="v132 (a8d24e7): FLAMIA_PDL=0 against unset, one build, 5 rounds" \
  OUT=$OUT/env timeout 540 bash .ab/pdl/tools/env_ab.sh off=FLAMIA_PDL=0 pdl= > $OUT/env_console.txt 2>&1
echo "env rc $? at $(( $(date +%s) - T0 )) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
