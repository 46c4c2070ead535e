#!/usr/bin/env bash
# main after v135's host-side changes (.ab/main prebuilt): the whole GPU suite as shipped
# (one slab buffer), the stored-dS and graph-capture tests with FLAMIA_BWD_DS_OVERLAP=1 (two
# buffers, the GEMM on the side stream; the capture keeps the one-buffer order), memcheck of
# both orders' stored-dS tests; then, only on an H200, the harness in turn at 20 rounds
# (docs/bench/runs/2026-12-07_rounds/job12.sh with this tree). Carried: .ab/main, .whl.
# LIMIT: the seconds the call may take (default 570).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
H=.ab/main/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $H/COMMIT | tee -a $OUT/gpu.txt
suite() {  # name, filter, limit, env...
  local name=$1 filter=$2 limit=$3; shift 3
  env "$@" timeout $limit $H/flamia_gpu_tests --gtest_filter="$filter" > $OUT/$name.txt 2>&1
  echo "$name rc $? at $(el) s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/$name.txt | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/$name.txt | head -8
  grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]|^\[  FAILED|^\[       OK \] (StoredDq|GraphCapture)' $OUT/$name.txt > $OUT/$name.short.txt
  rm -f $OUT/$name.txt
}
suite suite '*' 240 FLAMIA_BWD_DS_OVERLAP=
suite overlap 'StoredDq*:GraphCapture.*' 90 FLAMIA_BWD_DS_OVERLAP=1
for sw in 0 1; do
  FLAMIA_BWD_DS_OVERLAP=$sw timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $H/flamia_gpu_tests \
    --gtest_filter='StoredDqSlabs.*:GraphCapture.ReplayedBackward*' > $OUT/memcheck$sw.txt 2>&1
  echo "memcheck (overlap $sw) rc $? at $(el) s: $(grep 'ERROR SUMMARY' $OUT/memcheck$sw.txt | tail -1)"
  { echo "overlap $sw:"; grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck$sw.txt; } >> $OUT/memcheck.short.txt; rm -f $OUT/memcheck$sw.txt
done
if grep -q H200 $OUT/gpu.txt; then
  TREE=main ITERS=20 DEADLINE=$(( ${LIMIT:-570} - $(el) )) bash docs/bench/runs/2026-12-07_rounds/job12.sh
else
  echo "not an H200: no harness run"
fi
echo "done at $(el) s"
