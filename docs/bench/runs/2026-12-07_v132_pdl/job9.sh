#!/usr/bin/env bash
# Where v132's gain comes from (branch pdl-kinds, 2e3973d, .ab/pdlkinds prebuilt): one build,
# FLAMIA_PDL overlapping all launches (v132), those of v90 only (dq, slabs), and v90's plus
# each of v132's kinds in turn, alternated three rounds (tools/env_ab.sh); then
# flamia_boundary_probe if the tree has it. Carried: .ab/pdlkinds.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat .ab/pdlkinds/prebuilt/COMMIT | tee -a $OUT/gpu.txt
mkdir -p $OUT/env
BUILD_DIR=.ab/pdlkinds/prebuilt WORKLOADS=fixed-4k,pack-32k,fixed-16k,llama1b-pack RECIPES=fp8,fp8_mixed ROUNDS=3 \
  ITERS=20 PHASES=fwdq,bwd,step WHAT="pdl-kinds (2e3973d): v132's overlapped launches one kind at a time" \
  OUT=$OUT/env timeout 420 bash .ab/pdlkinds/tools/env_ab.sh all= v90=FLAMIA_PDL=dq,slabs \
  fwd=FLAMIA_PDL=dq,slabs,fwd poison=FLAMIA_PDL=dq,slabs,poison bases=FLAMIA_PDL=dq,slabs,bases \
  dkdv=FLAMIA_PDL=dq,slabs,dkdv > $OUT/env_console.txt 2>&1
echo "env rc $? at $(( $(date +%s) - T0 )) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
if [ -x .ab/pdlkinds/prebuilt/flamia_boundary_probe ]; then
  timeout 90 .ab/pdlkinds/prebuilt/flamia_boundary_probe > $OUT/boundary_probe.txt 2>&1
  echo "probe rc $?"; cat $OUT/boundary_probe.txt
fi
