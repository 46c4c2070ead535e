#!/usr/bin/env bash
# v140's landing candidate (branch quant-beside-land, .ab/land): the quantizer beside the
# forward by default at head dim 128, the plain quantizer's lanes as main's. QuantBeside.* (a
# timeout ends the job); main (.ab/main) against land by default and with FLAMIA_QUANT_BESIDE=0
# (tools/ab_bench.sh: fwdq and step, fp8_mixed, within AB_S seconds, default 150); land's whole
# GPU suite (by default: beside at head dim 128); memcheck of QuantBeside.* (LIMIT, default 400).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
H=.ab/land/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt
for t in main land; do echo "$t $(cat .ab/$t/prebuilt/COMMIT)"; done | tee -a $OUT/gpu.txt
timeout 120 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' > $OUT/beside.txt 2>&1
rc=$?
echo "QuantBeside rc $rc at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/beside.txt | tr '\n' ' ')"
grep -E "Failure|Expected|Which is" $OUT/beside.txt | head -8
[ $rc -eq 124 ] && { echo "QuantBeside timed out: a wait that never ends"; exit 1; }
mkdir -p $OUT/ab
WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} RECIPES=fp8_mixed \
  ROUNDS=${ROUNDS:-3} ITERS=20 PHASES=fwdq,step OUT=$OUT/ab \
  WHAT="v140 landing: main ($(cat .ab/main/prebuilt/COMMIT)) against land ($(cat $H/COMMIT)) by default and with FLAMIA_QUANT_BESIDE=0" \
  timeout ${AB_S:-150} bash tools/ab_bench.sh main=.ab/main land=.ab/land off=.ab/land:FLAMIA_QUANT_BESIDE=0 \
    > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"; grep "^|" $OUT/ab/ab_bench.md 2>/dev/null; rm -f $OUT/ab/ab_rounds.tar.gz
left=$(( ${LIMIT:-400} - $(el) - 20 ))
timeout $left $H/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[ RUN' $OUT/suite.txt | tail -3 > $OUT/suite.short.txt; rm -f $OUT/suite.txt
left=$(( ${LIMIT:-400} - $(el) - 5 ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' \
  > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
echo "done at $(el) s"
