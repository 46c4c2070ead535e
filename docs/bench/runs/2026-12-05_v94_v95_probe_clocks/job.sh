#!/usr/bin/env bash
# (kept with its outputs; run from the repository root with OUT set, the trees prebuilt by tools/prebuild_trees.sh: head = main f9a292c, v94 = fwd-stages4, v95 = fwd-polyexp 161ba62, ts = fwd-trace-softmax 3016dd6)
# (.ab/prebuilt_lib.sh, a local helper not kept in the repository, only adds the CUDA libraries to LD_LIBRARY_PATH.)
# All binaries prebuilt. (1) v95 (exps on the FMA pipe) and v94 (four stages) smoke; (2) A/B of the
# fp8 forward: head (main's kernels) vs v94 vs v95, four workloads, 3 rounds; (3) the issue probe
# (register split fixed); (4) the phase clocks with the softmax split (ts): test + three traces.
set -uo pipefail
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .ab/prebuilt_lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
trees=".ab/head"
for t in v94 v95; do
  f='*Shapes.MatchesSpec/*:*QStart*'
  [ $t = v95 ] && f='*Shapes.MatchesSpec/*:*QStart*:*Matrix*:*NonFinite*:*LargeLogits*:*HugeLogits*:*CausalSafety*:*DocumentIsolation*'
  timeout 150 .ab/$t/prebuilt/flamia_gpu_tests --gtest_filter="$f" > $OUT/${t}_smoke.txt 2>&1 && trees="$trees .ab/$t"
  echo "$t smoke at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/${t}_smoke.txt | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/${t}_smoke.txt | head -5
done
mkdir -p $OUT/ab
WORKLOADS=fixed-16k,pack-32k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  WHAT="main's kernels (head) against v94 (four stages at D = 128) and v95 (a share of the exps on the FMA pipe)" \
  OUT=$OUT/ab timeout 240 bash tools/ab_bench.sh $trees > $OUT/ab_console.txt 2>&1
echo "ab rc $? at $(el) s"
grep "^|" $OUT/ab/ab_bench.md 2>/dev/null
timeout 100 .ab/head/prebuilt/flamia_issue_probe --tiles 4000 > $OUT/issue_probe.txt 2>&1
echo "probe rc $? at $(el) s"; cat $OUT/issue_probe.txt
H=.ab/ts/prebuilt
timeout 40 $H/flamia_gpu_tests --gtest_filter='PhaseTrace*' > $OUT/ts_phase_trace_test.txt 2>&1
echo "PhaseTrace rc $? at $(el) s: $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/ts_phase_trace_test.txt | head -2 | tr '\n' ' ')"
for w in fixed-16k llama8b-pack llama1b-pack; do
  [ $(el) -gt 560 ] && break
  FLAMIA_FWD_TRACE=$OUT/fwd_$w.trace timeout 30 $H/flamia_bench --workloads $w --recipes fp8 --iters 1 > $OUT/trace_bench_$w.txt 2>&1
  python3 .ab/ts/tools/fwd_trace_summary.py $OUT/fwd_$w.trace > $OUT/trace_$w.txt 2>&1
  echo "== $w"; cat $OUT/trace_$w.txt
  rm -f $OUT/fwd_$w.trace
done
echo "done at $(el) s"
