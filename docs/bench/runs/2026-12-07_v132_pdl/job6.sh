#!/usr/bin/env bash
# What low_memory costs an attention step: the harness's GPU tests (its new --low-memory test
# included), then `python -m flamia.bench --impls flamia --no-checks` with and without
# --low-memory, alternated twice, five workloads. Library: main's kernels (a8d24e7, .ab/pdl
# prebuilt); package the working tree's. Carried: .ab/pdl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/pdl/prebuilt/COMMIT
export FLAMIA_LIBRARY=$PWD/.ab/pdl/prebuilt/libflamia.so PYTHONPATH=$PWD/python
( cd python/tests && FLAMIA_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -rs test_bench_gpu.py ) > $OUT/pytest.txt 2>&1
echo "pytest rc $? at $(el) s"; tail -3 $OUT/pytest.txt
for round in 1 2; do
  for setting in default low; do
    left=$(( 540 - $(el) )); (( left > 30 )) || break 2
    flag=; [ $setting = low ] && flag=--low-memory
    mkdir -p $OUT/$setting$round
    timeout $left python3 -m flamia.bench --impls flamia --no-checks --iters 10 --warmup 2 $flag \
      --workloads fixed-4k,fixed-16k,pack-32k,llama8b-pack,llama1b-pack --out $OUT/$setting$round \
      > $OUT/$setting$round/console.txt 2>&1 || echo "$setting $round: exit $?"
    rm -f $OUT/$setting$round/*.png
    echo "$setting round $round at $(el) s"
  done
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os, statistics
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(f"{out}/*/bench.json")):
    setting = os.path.basename(os.path.dirname(f)).rstrip("12")
    for r in json.load(open(f))["records"]:
        runs.setdefault((r["workload"], r["recipe"], setting), []).append((r["step_ms"], r["step_peak_mib"]))
for (w, rc, st), v in sorted(runs.items()):
    print(w, rc, st, "step", [round(x[0], 3) for x in v], "peak", [round(x[1]) for x in v])
PY
