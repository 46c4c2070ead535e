#!/usr/bin/env bash
# Where a step's time goes, kernel by kernel: Nsight Compute's duration of every kernel
# flamia_bench launches for one iteration of each WORKLOAD and RECIPE (its phases, then the
# step), in launch order. ncu serializes
# launches and runs each after the previous one has ended, so the durations are those of a
# kernel alone (the back-to-back power coupling of a real step is absent; docs/PERFORMANCE.md).
#   bash tools/step_kernels.sh        (BUILD_DIR: build-gpu; OUT: ./out)
# Environment: WORKLOADS (default fixed-16k,llama8b-pack), RECIPES (default fp8,fp8_mixed),
# BENCH_ENV (VAR=value pairs for flamia_bench), MEMORY=1 (also each launch's DRAM reads and
# writes and its L2 hit rate: ncu then replays every launch, slower).
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
    metrics=gpu__time_duration.sum
    [ "${MEMORY:-0}" = 1 ] && metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
    timeout 300 env ${BENCH_ENV:-} ncu --clock-control none --csv --metrics "$metrics" \
      "$BUILD/flamia_bench" --workloads "$w" --recipes "$r" --iters 1 --warmup 0 >"$csv" 2>"$OUT/kernels_${w}_${r}.err" ||
      { echo "ncu failed for $w $r"; tail -5 "$OUT/kernels_${w}_${r}.err"; continue; }
    python3 - "$csv" "$w" "$r" <<'PY'
import csv, sys
path, workload, recipe = sys.argv[1:4]
rows = [l for l in open(path) if l.startswith('"')]
# One entry a launch, in launch order: its name and {metric: value in ms, MB or %}.
launches = {}
to_unit = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
           "second": 1e3, "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "Tbyte": 1e6, "%": 1.0}
for rec in csv.DictReader(rows):
    scale = to_unit.get(rec.get("Metric Unit", ""), None)
    if scale is None:
        continue
    name = rec["Kernel Name"].replace("<unnamed>", "").replace("void ", "")
    name = name.split("(")[0].split("<")[0].split("::")[-1]
    entry = launches.setdefault(int(rec["ID"]), (name, {}))
    entry[1][rec["Metric Name"]] = float(rec["Metric Value"].replace(",", "")) * scale
kernels = [launches[i] for i in sorted(launches) if "gpu__time_duration.sum" in launches[i][1]]
# Every launch in order: flamia_bench's phases (quantize, forward, backward; the backward
# phase's inputs come from untimed calls) and then the step, whose kernels end the list.
total = sum(m["gpu__time_duration.sum"] for _, m in kernels)
print(f"== {workload} {recipe}: {len(kernels)} launches, {total:.3f} ms alone")
for i, (name, m) in enumerate(kernels):
    extra = ""
    if "dram__bytes_read.sum" in m:
        extra = (f"  DRAM read {m['dram__bytes_read.sum']:9.1f} MB, write {m.get('dram__bytes_write.sum', 0):9.1f} MB,"
                 f" L2 hit {m.get('lts__t_sector_hit_rate.pct', 0):5.1f} %")
    print(f"  {i:3d} {name:32s} {m['gpu__time_duration.sum']:8.3f} ms{extra}")
PY
  done
done
