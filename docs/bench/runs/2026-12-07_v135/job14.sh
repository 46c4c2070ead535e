#!/usr/bin/env bash
# v135 (branch bwd-slab-overlap, .ab/v135 prebuilt): FLAMIA_BWD_DS_OVERLAP=1 gives the stored dS
# two slab buffers and runs each slab's dQ GEMM on a second stream beside the next slab's
# dK/dV pass. Correctness with it on (the whole GPU suite: the stored-dS tests, slabs,
# overlapped launches, graph capture, isolation; memcheck of the stored-dS and graph cases),
# then one build, unset against FLAMIA_BWD_DS_OVERLAP=1 (also with FLAMIA_BWD_DS_MIB=1024: two
# buffers in about the one-buffer default's bytes), alternated rounds (tools/env_ab.sh),
# fp8_mixed (whose default at D = 128 is the stored dS), phases bwd, step.
# LIMIT: the seconds the call may take (default 560); AB_ROUNDS (default 4); SUITE_S, MEMCHECK_S: the
# suite's and memcheck's limits (default 200, 150); SUITE_FILTER: the suite's gtest filter (default all). Carried: .ab/v135.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
H=.ab/v135/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $H/COMMIT | tee -a $OUT/gpu.txt
FLAMIA_BWD_DS_OVERLAP=1 timeout ${SUITE_S:-200} $H/flamia_gpu_tests --gtest_filter="${SUITE_FILTER:-*}" > $OUT/suite.txt 2>&1
echo "suite (overlap on) rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[       OK \] (StoredDq|GraphCapture)' $OUT/suite.txt > $OUT/suite.short.txt
rm -f $OUT/suite.txt
FLAMIA_BWD_DS_OVERLAP=1 timeout ${MEMCHECK_S:-150} compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests \
  --gtest_filter='StoredDq*:GraphCapture.ReplayedBackward*:*DocumentIsolation*fp8_mixed_D128*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
mkdir -p $OUT/env
left=$(( ${LIMIT:-560} - $(el) ))
BUILD_DIR=$H WORKLOADS=${AB_WORKLOADS:-fixed-4k,fixed-16k,pack-32k,llama8b-pack} RECIPES=fp8_mixed ROUNDS=${AB_ROUNDS:-4} ITERS=20 \
  PHASES=bwd,step WHAT="v135 ($(cat $H/COMMIT)): unset against FLAMIA_BWD_DS_OVERLAP=1 (and with 1 GiB slabs), one build" \
  OUT=$OUT/env timeout $left bash .ab/v135/tools/env_ab.sh off= on=FLAMIA_BWD_DS_OVERLAP=1 \
  on1g=FLAMIA_BWD_DS_OVERLAP=1,FLAMIA_BWD_DS_MIB=1024 > $OUT/env_console.txt 2>&1
echo "env rc $? at $(el) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
python3 - $OUT/env/env_ab_runs.json <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
for name in ("off_round1", "on_round1", "on1g_round1"):
    print(name, [(r["workload"], round(r["bwd_workspace_bytes"] / 2**20)) for r in runs.get(name, {}).get("records", [])], "MiB of workspace")
PY
rm -f $OUT/env/env_rounds.tar.gz
echo "done at $(el) s"
