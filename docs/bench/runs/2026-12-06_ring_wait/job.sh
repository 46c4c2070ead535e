#!/usr/bin/env bash
# Where the phase clocks' "ring wait" goes: main with the stage-wait mark (the production
# kernels unchanged), its phase-trace test, then the phase clocks at fixed-16k, pack-32k
# (D = 128) and llama1b-pack (D = 64). Carried: .ab/main (tools/make_trees.sh main=main,
# tools/prebuild_trees.sh main=main).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT
timeout 60 .ab/main/prebuilt/flamia_gpu_tests --gtest_filter='PhaseTrace*' > $OUT/phase_trace_test.txt 2>&1
echo "phase-trace test exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/phase_trace_test.txt | tr '\n' ' ')"
for w in fixed-16k pack-32k llama1b-pack; do
  FLAMIA_FWD_TRACE=$OUT/fwd.trace timeout 30 .ab/main/prebuilt/flamia_bench --workloads $w --recipes fp8 --iters 1 \
    > /dev/null 2>&1
  echo "== phase clocks, $w"; python3 .ab/main/tools/fwd_trace_summary.py $OUT/fwd.trace | tail -16
  rm -f $OUT/fwd.trace
done
