set -o pipefail
export FLAMIA_LOG=0
L=/tmp/logs; mkdir -p $L
T=.ab/nat
(cmake -S $T -B $T/build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build $T/build-ab -j16 --target flamia flamia_gpu_tests flamia_bench flamia_fuzz) > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
echo built
timeout 300 $T/build-ab/flamia_gpu_tests > $L/suite.log 2>&1; echo "suite rc=$?"
grep -E '^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Z]' $L/suite.log | sort -u | head -30
grep -B2 -A12 -m3 "Failure" $L/suite.log | head -60
for tool in racecheck synccheck; do timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 $T/build-ab/flamia_fuzz --small --cases 2 --seed 1 > $L/$tool.log 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tail -1)"; done
cp $L/suite.log $OUT/ 
