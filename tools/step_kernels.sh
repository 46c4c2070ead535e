#!/usr/bin/env bash
# Where a step's time goes, kernel by kernel: Nsight Compute's duration of every kernel
# flamia_bench launches for one iteration of each WORKLOAD and RECIPE (its phases, then the
# step), in launch order. ncu serializes
# launches and runs each after the previous one has ended, so the durations are those of a
# kernel alone (the back-to-back power coupling of a real step is absent; docs/PERFORMANCE.md).
#   bash tools/step_kernels.sh        (BUILD_DIR: build-gpu; OUT: ./out)
# Environment: WORKLOADS (default fixed-16k,llama8b-pack), RECIPES (default fp8,fp8_mixed),
# BENCH_ENV (VAR=value pairs for flamia_bench).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
[ -x "$BUILD/flamia_bench" ] || { echo "step_kernels: $BUILD/flamia_bench not built"; exit 2; }
command -v ncu >/dev/null 2>&1 || { echo "step_kernels: ncu not found"; exit 2; }
IFS=, read -r -a workloads <<<"${WORKLOADS:-fixed-16k,llama8b-pack}"
IFS=, read -r -a recipes <<<"${RECIPES:-fp8,fp8_mixed}"
for w in "${workloads[@]}"; do
  for r in "${recipes[@]}"; do
    csv="$OUT/kernels_${w}_${r}.csv"
    timeout 300 env ${BENCH_ENV:-} ncu --clock-control none --csv --metrics gpu__time_duration.sum \
      "$BUILD/flamia_bench" --workloads "$w" --recipes "$r" --iters 1 --warmup 0 >"$csv" 2>"$OUT/kernels_${w}_${r}.err" ||
      { echo "ncu failed for $w $r"; tail -5 "$OUT/kernels_${w}_${r}.err"; continue; }
    python3 - "$csv" "$w" "$r" <<'PY'
import csv, sys
path, workload, recipe = sys.argv[1:4]
rows = [l for l in open(path) if l.startswith('"')]
kernels = []
for rec in csv.DictReader(rows):
    if rec.get("Metric Name") != "gpu__time_duration.sum":
        continue
    scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}.get(rec.get("Metric Unit", ""), None)
    if scale is None:
        continue
    name = rec["Kernel Name"].replace("<unnamed>", "").replace("void ", "")
    name = name.split("(")[0].split("<")[0].split("::")[-1]
    kernels.append((name, float(rec["Metric Value"].replace(",", "")) * scale))
# Every launch in order: flamia_bench's phases (quantize, forward, backward; the backward
# phase's inputs come from untimed calls) and then the step, whose kernels end the list.
total = sum(ms for _, ms in kernels)
print(f"== {workload} {recipe}: {len(kernels)} launches, {total:.3f} ms alone")
for i, (name, ms) in enumerate(kernels):
    print(f"  {i:3d} {name:32s} {ms:8.3f} ms")
PY
  done
done
