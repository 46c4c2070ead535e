#!/usr/bin/env bash
# v140 (branch quant-lean, .ab/v140): the quantizer's lean lanes (the plain quantizer's qkv
# path and the beside one) against v139 (.ab/v139, quant-beside-tma) and main (.ab/main);
# .ab/leanplain (branch quant-lean-plain): main with the plain quantizer's lean lanes alone.
# QuantBeside.* on v140 (a timeout ends the job); the quantizer alone (tools/quant_probe.cu)
# in v139 and v140 on three shapes; main against leanplain and v140 with
# FLAMIA_QUANT_BESIDE=1 (tools/ab_bench.sh: fwdq and step, fp8_mixed, within AB_S seconds,
# default 190; v139 beside the forward is v139's entry's job); then leanplain's whole GPU suite (its plain quantizer is every call's) and
# memcheck of QuantBeside.* on v140 in the time left (LIMIT, default 560).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt
for t in main leanplain v139 v140; do echo "$t $(cat .ab/$t/prebuilt/COMMIT)"; done | tee -a $OUT/gpu.txt
timeout 120 .ab/v140/prebuilt/flamia_gpu_tests --gtest_filter='QuantBeside.*' > $OUT/beside_v140.txt 2>&1
rc=$?
echo "v140 QuantBeside rc $rc at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/beside_v140.txt | tr '\n' ' ')"
grep -E "Failure|Expected|Which is" $OUT/beside_v140.txt | head -8
[ $rc -eq 124 ] && { echo "v140: QuantBeside timed out: a wait that never ends"; exit 1; }
for t in v139 v140; do
  for shape in "--docs 8 --len 4096 --hq 16 --hkv 16 --d 128" "--docs 32 --len 4096 --hq 16 --hkv 16 --d 128" \
               "--docs 16 --len 4096 --hq 32 --hkv 8 --d 64"; do
    echo "## $t: $shape"; timeout 60 .ab/$t/prebuilt/flamia_quant_probe $shape
  done
done > $OUT/quant_probe.txt 2>&1
echo "probe at $(el) s"; grep -E "^## |^\| (plain|beside) .* \| (22|33|44|66|132) \|" $OUT/quant_probe.txt
mkdir -p $OUT/ab
WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} RECIPES=fp8_mixed \
  ROUNDS=${ROUNDS:-3} ITERS=20 PHASES=fwdq,step OUT=$OUT/ab \
  WHAT="v140: main ($(cat .ab/main/prebuilt/COMMIT)) against leanplain ($(cat .ab/leanplain/prebuilt/COMMIT)) and v140 ($(cat .ab/v140/prebuilt/COMMIT)) with FLAMIA_QUANT_BESIDE=1" \
  timeout ${AB_S:-190} bash tools/ab_bench.sh main=.ab/main leanplain=.ab/leanplain on140=.ab/v140:FLAMIA_QUANT_BESIDE=1 \
    > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"; grep "^|" $OUT/ab/ab_bench.md 2>/dev/null; rm -f $OUT/ab/ab_rounds.tar.gz
left=$(( ${LIMIT:-560} - $(el) - 45 ))
timeout $left .ab/leanplain/prebuilt/flamia_gpu_tests > $OUT/suite.txt 2>&1
echo "leanplain suite rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/suite.txt | head -8
grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[ RUN' $OUT/suite.txt | tail -3 > $OUT/suite.short.txt; rm -f $OUT/suite.txt
left=$(( ${LIMIT:-560} - $(el) - 5 ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 .ab/v140/prebuilt/flamia_gpu_tests \
  --gtest_filter='QuantBeside.*' > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
echo "done at $(el) s"
