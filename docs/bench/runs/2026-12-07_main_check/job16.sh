#!/usr/bin/env bash
# On an H200: the harness in turn at 20 rounds on main's tree (.ab/main;
# docs/bench/runs/2026-12-07_rounds/job12.sh). On an H100, where that run exists already:
# v135 where it was not measured — FLAMIA_BWD_DS_OVERLAP unset against =1 on pack-128k (16
# one-head slabs) beside pack-32k and llama8b-pack, fp8_mixed, three alternated rounds of 20
# iterations (tools/env_ab.sh), backward and step. Carried: .ab/main, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
H=.ab/main/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $H/COMMIT | tee -a $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  TREE=main ITERS=20 DEADLINE=${LIMIT:-570} bash docs/bench/runs/2026-12-07_rounds/job12.sh
else
  mkdir -p $OUT/env
  BUILD_DIR=$H WORKLOADS=pack-128k,pack-32k,llama8b-pack RECIPES=fp8_mixed ROUNDS=3 ITERS=20 PHASES=bwd,step \
    WHAT="v135 on main ($(cat $H/COMMIT)): unset against FLAMIA_BWD_DS_OVERLAP=1, pack-128k" OUT=$OUT/env \
    timeout $(( ${LIMIT:-570} - ($(date +%s) - T0) )) bash .ab/main/tools/env_ab.sh off= on=FLAMIA_BWD_DS_OVERLAP=1 \
    > $OUT/env_console.txt 2>&1
  echo "env rc $?"
  grep "^|" $OUT/env/env_ab.md 2>/dev/null
  rm -f $OUT/env/env_rounds.tar.gz
fi
echo "done at $(( $(date +%s) - T0 )) s"
