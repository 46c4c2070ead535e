#!/usr/bin/env bash
# main's landing checks after v122b (P8 packed as formed at D = 128): the whole GPU suite,
# memcheck on the isolation, causal-safety, non-finite and determinism cases, the fuzzer;
# then main against the main before the merge (2b3eac2), fp8 forward and step, four workloads.
# Trees: tools/make_trees.sh before=2b3eac2 main=main, then tools/prebuild_trees.sh;
# carried: .ab/before, .ab/main.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/before/prebuilt/COMMIT .ab/main/prebuilt/COMMIT
T=.ab/main/prebuilt
timeout 150 $T/flamia_gpu_tests > $OUT/gpu_suite.txt 2>&1
echo "GPU suite exit $? after $SECONDS s: $(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' $OUT/gpu_suite.txt | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' $OUT/gpu_suite.txt | head -5
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $T/flamia_gpu_tests \
  --gtest_filter='*DocumentIsolation*fp8_D128*:*CausalSafety*:*NonFinite*D64*:DeterminismSmall*' > $OUT/memcheck.txt 2>&1
echo "memcheck exit $? after $SECONDS s: $(grep -E 'ERROR SUMMARY' $OUT/memcheck.txt | tail -1)"
grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.txt > $OUT/memcheck.short.txt; rm -f $OUT/memcheck.txt
timeout 90 $T/flamia_fuzz --cases 200 > $OUT/fuzz.txt 2>&1; echo "fuzz exit $? after $SECONDS s: $(tail -1 $OUT/fuzz.txt)"
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 PHASES=fwd ROUNDS=3 \
  timeout 150 bash tools/ab_bench.sh .ab/before .ab/main 2>&1 | tail -6
rm -f "$OUT"/ab/bench_* "$OUT"/ab/ab_rounds.tar.gz
