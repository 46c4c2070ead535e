#!/usr/bin/env bash
# v138 (branch quant-beside, .ab/v138) against v137 (.ab/v137, 0c010fb: v137's kernel with the
# quantizer probe) and main (.ab/main): QuantBeside.* on v138 (a timeout ends the job); the
# quantizer alone (tools/quant_probe.cu) in both trees on three shapes; then main against v138
# unset and with FLAMIA_QUANT_BESIDE=1 (tools/ab_bench.sh: fwdq and step, fp8_mixed, within
# AB_S seconds, default 150); memcheck of QuantBeside.* in the time left (LIMIT, default 330).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt
for t in main v137 v138; do echo "$t $(cat .ab/$t/prebuilt/COMMIT)"; done | tee -a $OUT/gpu.txt
H=.ab/v138/prebuilt
timeout 120 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' > $OUT/beside.txt 2>&1
rc=$?
echo "QuantBeside rc $rc at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/beside.txt | tr '\n' ' ')"
[ $rc -eq 124 ] && { echo "QuantBeside timed out: a wait that never ends"; exit 1; }
for t in v137 v138; do
  for shape in "--docs 8 --len 4096 --hq 16 --hkv 16 --d 128" "--docs 32 --len 4096 --hq 16 --hkv 16 --d 128" \
               "--docs 16 --len 4096 --hq 32 --hkv 8 --d 64"; do
    echo "## $t: $shape"; timeout 60 .ab/$t/prebuilt/flamia_quant_probe $shape
  done
done > $OUT/quant_probe.txt 2>&1
echo "probe at $(el) s"; grep -E "^## |^\| (plain|beside) .* \| (44|132|66) \|" $OUT/quant_probe.txt
mkdir -p $OUT/ab
WORKLOADS=${WORKLOADS:-fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} RECIPES=fp8_mixed \
  ROUNDS=${ROUNDS:-3} ITERS=20 PHASES=fwdq,step OUT=$OUT/ab \
  WHAT="v138: main ($(cat .ab/main/prebuilt/COMMIT)) against the branch ($(cat $H/COMMIT)) unset and with FLAMIA_QUANT_BESIDE=1" \
  timeout ${AB_S:-150} bash tools/ab_bench.sh main=.ab/main v138=.ab/v138 on=.ab/v138:FLAMIA_QUANT_BESIDE=1 \
  > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"; grep "^|" $OUT/ab/ab_bench.md 2>/dev/null; rm -f $OUT/ab/ab_rounds.tar.gz
left=$(( ${LIMIT:-330} - $(el) - 5 ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests --gtest_filter='QuantBeside.*' \
  > $OUT/memcheck.txt 2>&1
echo "memcheck rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
