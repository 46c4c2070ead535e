#!/usr/bin/env bash
# All binaries prebuilt. v90b (bwd-pdl2, ecbb0a7): which of the backward's overlapped launches
# gains and which loses. (1) the stored-dS and graph tests with every setting; (2) fp8_mixed
# backward, five FLAMIA_PDL settings alternated, 3 rounds, four workloads.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
H=.ab/pdl2/prebuilt
for s in 1 gemm dkdv late; do
  FLAMIA_PDL=$s timeout 60 $H/flamia_gpu_tests --gtest_filter='StoredDq*:GraphCapture*:*/StoredDq.*' > $OUT/tests_$s.txt 2>&1
  echo "tests FLAMIA_PDL=$s rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/tests_$s.txt | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/tests_$s.txt | head -5
  grep -v "^\[ RUN\|^\[       OK" $OUT/tests_$s.txt > $OUT/tests_$s.short.txt; rm $OUT/tests_$s.txt
done
mkdir -p $OUT/env
BUILD_DIR=$H WORKLOADS=fixed-4k,pack-32k,llama8b-pack,fixed-16k RECIPES=fp8_mixed ROUNDS=3 PHASES=bwd \
  WHAT="v90b: the backward's overlapped launches by kind (off, every one, after dK/dV only, dK/dV only, dK/dV waiting first)" \
  OUT=$OUT/env timeout 420 bash .ab/pdl2/tools/env_ab.sh off=FLAMIA_PDL=0 on= gemm=FLAMIA_PDL=gemm dkdv=FLAMIA_PDL=dkdv late=FLAMIA_PDL=late > $OUT/env_console.txt 2>&1
echo "env rc $? at $(el) s"
grep "^|" $OUT/env/env_ab.md 2>/dev/null
rm -f $OUT/env/env_rounds.tar.gz
echo "done at $(el) s"
