#!/usr/bin/env bash
# v140b on main (.ab/cur) and v141 (branch fwd-beside-known, .ab/v141) against main before the
# landing (.ab/main, a093688's kernels): cur's whole GPU suite (v140b's plain kernel at head
# dim 64, the beside one at 128); QuantBeside.* on v141 (a timeout ends the job); base against
# cur and v141 (tools/ab_bench.sh: fwdq and step, fp8_mixed, within AB_S seconds, default
# 150); memcheck of QuantBeside.* on v141 in the time left (LIMIT, default 420).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt
for t in main cur v141; do echo "$t $(cat .ab/$t/prebuilt/COMMIT)"; done | tee -a $OUT/gpu.txt
timeout 120 .ab/v141/prebuilt/flamia_gpu_tests --gtest_filter='QuantBeside.*' > $OUT/beside_v141.txt 2>&1
rc=$?
echo "v141 QuantBeside rc $rc at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/beside_v141.txt | tr '\n' ' ')"
[ $rc -eq 124 ] && { echo "v141: QuantBeside timed out: a wait that never ends"; exit 1; }
mkdir -p $OUT/ab
WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} RECIPES=fp8_mixed \
  ROUNDS=${ROUNDS:-3} ITERS=20 PHASES=fwdq,step OUT=$OUT/ab \
  WHAT="v140b, v141: main before the landing ($(cat .ab/main/prebuilt/COMMIT)) against main ($(cat .ab/cur/prebuilt/COMMIT)) and v141 ($(cat .ab/v141/prebuilt/COMMIT))" \
  timeout ${AB_S:-150} bash tools/ab_bench.sh base=.ab/main cur=.ab/cur v141=.ab/v141 > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"; grep "^|" $OUT/ab/ab_bench.md 2>/dev/null; rm -f $OUT/ab/ab_rounds.tar.gz
left=$(( ${LIMIT:-420} - $(el) - 20 ))
timeout $left .ab/cur/prebuilt/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "cur suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[ RUN' $OUT/suite.txt | tail -3 > $OUT/suite.short.txt; rm -f $OUT/suite.txt
left=$(( ${LIMIT:-420} - $(el) - 5 ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 .ab/v141/prebuilt/flamia_gpu_tests \
  --gtest_filter='QuantBeside.*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
echo "done at $(el) s"
