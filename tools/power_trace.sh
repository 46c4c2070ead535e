#!/usr/bin/env bash
# What the GPU's power management does during a benchmark: samples power draw, SM and memory
# clocks, temperature and the active clock-limit reasons (nvidia-smi, every 20 ms) while
# flamia_bench runs, then summarizes the samples taken while a kernel was busy (utilization
# above 50 %): median and range of power and SM clock, and how often each limit reason was on.
#   bash tools/power_trace.sh [flamia_bench arguments]   (BUILD_DIR: build-gpu; OUT: ./out)
# e.g. bash tools/power_trace.sh --workloads fixed-16k --recipes fp8_mixed --iters 40
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
[ -x "$BUILD/flamia_bench" ] || { echo "power_trace: $BUILD/flamia_bench not built"; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "power_trace: nvidia-smi not found"; exit 2; }
trace="$OUT/power_trace.csv"
# Newer drivers name the limit reasons clocks_event_reasons, older ones clocks_throttle_reasons.
fields=timestamp,utilization.gpu,power.draw,power.limit,clocks.sm,clocks.mem,temperature.gpu
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$fields,$reasons --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
nvidia-smi --query-gpu=$fields,$reasons --format=csv,noheader,nounits -lms 20 >"$trace" 2>"$OUT/power_trace.err" &
smi=$!
sleep 1
"$BUILD/flamia_bench" "$@" >"$OUT/power_trace_bench.txt" 2>&1
rc=$?
sleep 0.5
kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
python3 - "$trace" <<'PY'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(',')]
    if len(f) < 8:
        continue
    try:
        util, power, limit, sm, mem, temp = (float(x) for x in f[1:7])
        reasons = int(f[7], 16)
    except ValueError:
        continue
    rows.append((util, power, limit, sm, mem, temp, reasons))
busy = [r for r in rows if r[0] > 50]
print(f"samples: {len(rows)}, busy (utilization > 50 %): {len(busy)}")
if busy:
    for name, i in (("power W", 1), ("SM clock MHz", 3), ("memory clock MHz", 4), ("temperature C", 5)):
        v = sorted(r[i] for r in busy)
        print(f"{name:>17}: median {statistics.median(v):.0f}, min {v[0]:.0f}, max {v[-1]:.0f}")
    print(f"{'power limit W':>17}: {busy[0][2]:.0f}")
    # nvidia-smi's clock event reasons (bit: name).
    names = {0x1: "idle", 0x2: "applications clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
             0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake"}
    for bit, name in names.items():
        n = sum(1 for r in busy if r[6] & bit)
        if n:
            print(f"{name:>17}: on in {100.0 * n / len(busy):.0f} % of busy samples")
PY
exit $rc
