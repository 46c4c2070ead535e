#!/usr/bin/env bash
# Times several source trees against each other as a training run meets them: at the board's
# power cap. Each tree's library runs under this checkout's Python harness with --sustained
# (steps back to back after as long a run untimed, the board's energy a step read), the trees
# in turn, ROUNDS times, and tools/ab_summary.py prints the medians and the change against the
# first tree for the harness's median step and forward and their sustained counterparts. Where
# every implementation draws the cap's power, a version's sustained step is its energy a step:
# a change that issues fewer instructions at a longer latency can win here and lose in
# tools/ab_bench.sh's medians.
#   bash tools/ab_sustained.sh DIR_REF DIR [DIR ...]
# A tree may be named and given settings for its runs: [NAME=]DIR[:VAR=value,...]
# (tools/ab_trees.sh), e.g. one library under two run-time switches:
#   bash tools/ab_sustained.sh auto=.ab/main recompute=.ab/main:FLAMIA_BWD_DQ=recompute
# Trees as for tools/ab_bench.sh (tools/make_trees.sh); each needs prebuilt/libflamia.so
# (tools/prebuild_trees.sh) or is built here. Environment: OUT (default ./out), WORKLOADS
# (default fixed-16k,pack-32k,llama8b-pack,llama1b-pack), RECIPES (fp8, fp8_mixed or both,
# default both), ROUNDS (default 3), WINDOW_S (default 1: the sustained window, seconds).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/tools/ab_trees.sh"  # usage, OUT, WORKLOADS, ROUNDS and the trees
RECIPES=${RECIPES:-fp8,fp8_mixed}
WINDOW_S=${WINDOW_S:-1}
[[ $WINDOW_S =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v w="$WINDOW_S" 'BEGIN { exit !(w > 0) }' ||
  { echo "WINDOW_S: '$WINDOW_S' is not a positive number"; exit 2; }
[[ $RECIPES =~ ^(fp8|fp8_mixed)(,(fp8|fp8_mixed))?$ ]] || { echo "RECIPES: '$RECIPES': fp8, fp8_mixed or both"; exit 2; }

libs=()
for i in "${!dirs[@]}"; do
  libs[$i]="${dirs[$i]}/prebuilt/libflamia.so"
  [ -f "${libs[$i]}" ] && continue
  libs[$i]="${dirs[$i]}/build-ab/libflamia.so"
  { cmake -S "${dirs[$i]}" -B "${dirs[$i]}/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "${dirs[$i]}/build-ab" --target flamia; } >"$OUT/${names[$i]}.build.log" 2>&1 ||
    { echo "${names[$i]}: build failed"; tail -5 "$OUT/${names[$i]}.build.log"; exit 1; }
done

status=0
files=()
for ((r = 1; r <= ROUNDS; ++r)); do
  # Each round starts one later in the list, so that each runs first in turn and none always
  # inherits the board from the same one (in one process a fixed order moved the same
  # kernels by 4-5 %: docs/PERFORMANCE.md, the harness's in-turn entries).
  for ((k = 0; k < ${#dirs[@]}; ++k)); do
    i=$(( (k + r - 1) % ${#dirs[@]} ))
    run="$OUT/${names[$i]}_round$r"
    read -ra tree_env <<<"${envs[$i]}"
    env "${tree_env[@]}" FLAMIA_LIBRARY="${libs[$i]}" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
      python3 -m flamia.bench --impls flamia --no-checks --iters 5 --warmup 2 --sustained "$WINDOW_S" \
      --workloads "$WORKLOADS" --out "$run" >"$run.txt" 2>&1 ||
      { echo "${names[$i]} round $r: the harness failed"; tail -5 "$run.txt"; status=1; continue; }
    rm -f "$run"/*.png
    # Only the recipes asked for: the harness runs both.
    python3 - "$run/bench.json" "$OUT/bench_${names[$i]}_round$r.json" "$RECIPES" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["records"] = [r for r in doc["records"] if r.get("recipe") in sys.argv[3].split(",")]
json.dump(doc, open(sys.argv[2], "w"), indent=1)
PY
    files+=("$OUT/bench_${names[$i]}_round$r.json")
  done
done
[ ${#files[@]} -gt 0 ] || exit 1
python3 "$ROOT/tools/ab_summary.py" --phases step,sustained,fwd,sustained_fwd --bundle "$OUT/ab_sustained_runs.json" \
  --what "python -m flamia.bench --impls flamia --sustained $WINDOW_S ($RECIPES), trees alternated $ROUNDS times: ${described[*]}" \
  "${files[@]}" | tee "$OUT/ab_sustained.md"
exit $status
