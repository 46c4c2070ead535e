#!/usr/bin/env bash
# v136 (branch quant-beside, .ab/beside prebuilt): FLAMIA_QUANT_BESIDE=1 runs the quantizing
# forward's quantizer on a third of the SMs beside the fast forward, whose producer waits for
# the quantizer's per-block counts. Correctness: QuantBeside.* (the plain call's bits, qkv8
# poisoned; a timeout there ends the job), then one call times main's tree, the branch's tree
# unset and the branch's tree with the switch on (tools/ab_bench.sh, alternated rounds, within
# AB_S seconds, default 240), the quantizing forward and the step; then the whole GPU suite
# with the switch on and memcheck of the beside cases in the time left.
# LIMIT (default 570), ROUNDS (3), WORKLOADS. Carried: .ab/main, .ab/beside.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
H=.ab/beside/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $H/COMMIT | tee -a $OUT/gpu.txt
timeout 120 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' > $OUT/beside.txt 2>&1
rc=$?
echo "QuantBeside rc $rc at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/beside.txt | tr '\n' ' ')"
grep -E "Failure|Expected|Which is|FAILED" $OUT/beside.txt | head -12
[ $rc -eq 124 ] && { echo "QuantBeside timed out: a wait that never ends; nothing timed"; exit 1; }
mkdir -p $OUT/ab
WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} RECIPES=fp8_mixed \
  ROUNDS=${ROUNDS:-3} ITERS=20 PHASES=fwdq,step OUT=$OUT/ab \
  WHAT="v136: main ($(cat .ab/main/prebuilt/COMMIT)) against the branch ($(cat $H/COMMIT)) unset and with FLAMIA_QUANT_BESIDE=1" \
  timeout ${AB_S:-240} bash tools/ab_bench.sh main=.ab/main beside=.ab/beside on=.ab/beside:FLAMIA_QUANT_BESIDE=1 \
  > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
rm -f $OUT/ab/ab_rounds.tar.gz
left=$(( ${LIMIT:-570} - $(el) - 40 ))
FLAMIA_QUANT_BESIDE=1 timeout $left $H/flamia_gpu_tests --gtest_filter='-QuantBeside.*' > $OUT/suite.txt 2>&1
echo "suite (switch on) rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[ RUN' $OUT/suite.txt | tail -3 > $OUT/suite.short.txt; rm -f $OUT/suite.txt
left=$(( ${LIMIT:-570} - $(el) - 5 ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' \
  > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
echo "done at $(el) s"
