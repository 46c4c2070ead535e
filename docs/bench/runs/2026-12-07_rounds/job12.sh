#!/usr/bin/env bash
# The harness with a workload's implementations timed in turn (python/flamia/bench.py at
# this commit; the library from .ab/$TREE, default head: main's kernels since a8d24e7),
# seven workloads (or WORKLOADS), flamia and its baselines in one process (--quick: five rounds), within
# DEADLINE seconds (default 480); ITERS: rounds instead of five. Carried: .ab/$TREE, .whl (the cuDNN frontend wheel).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
TREE=.ab/${TREE:-head}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $TREE/prebuilt/COMMIT | tee -a $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/$TREE/prebuilt/libflamia.so PYTHONPATH=$PWD/python:/tmp/site
mkdir -p $OUT/harness
timeout $(( ${DEADLINE:-480} - ($(date +%s) - T0) )) python3 -m flamia.bench --quick ${ITERS:+--iters $ITERS} \
  --workloads ${WORKLOADS:-fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack} \
  --out $OUT/harness > $OUT/harness/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/harness/*.png
grep -E "FAILED|Traceback|Error" $OUT/harness/harness_console.txt | head -5
python3 - $OUT/harness/bench.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    if r.get("error"):
        print(r["workload"], r["impl"], r["recipe"], "ERROR", r["error"][:100]); continue
    s = f"{r['workload']:13s} {r['impl']:16s} {str(r['recipe']):14s} q {r['quant_ms']} f {r['fwd_ms']} b {r['bwd_ms']} s {r['step_ms']}"
    if r["impl"] == "flamia":
        s += f" | fwd x{r.get('fwd_speedup_vs_best_baseline')} step x{r.get('step_speedup_vs_best_baseline')} bf16 f x{r.get('fwd_speedup_vs_best_bf16')} s x{r.get('step_speedup_vs_best_bf16')}"
    print(s)
PY
