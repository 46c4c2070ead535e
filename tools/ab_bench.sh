#!/usr/bin/env bash
# Times several source trees against each other in one GPU call: builds their libraries and
# flamia_bench side by side, then runs flamia_bench on each tree in turn, ROUNDS times
# (alternating, so that clock and thermal drift reach every tree alike), and prints per
# workload, recipe and phase every tree's times, their medians and the change against the
# first tree (tools/ab_summary.py). Trees are directories holding a copy of the repository
# (tools/make_trees.sh makes them from revisions); the first is the reference.
#   bash tools/ab_bench.sh DIR_REF DIR [DIR ...]
# A tree may be named and given settings for its runs: [NAME=]DIR[:VAR=value,...]
# (tools/ab_trees.sh); a folder named twice is built once.
# Environment: OUT (default ./out: ab_bench.md, ab_bench_runs.json = every run in one file,
# ab_rounds.tar.gz = each run's bench_<tree>_round<k>.json/.txt and the build logs), WORKLOADS (default
# fixed-16k,pack-32k,llama8b-pack,llama1b-pack), RECIPES (default fp8), ROUNDS (default 3),
# ITERS (default 10), PHASES (default fwd,bwd,step), WHAT (the bundle's description),
# SETTLE_MS (default 0: flamia_bench --settle-ms, idle before each timed region, so that a
# phase's time does not carry the power the phase before it drew; the step is unaffected).
# BENCH_ENV: VAR=value pairs for every tree's benchmark (e.g. BENCH_ENV=FLAMIA_BWD_DQ=hbm to
# compare two versions of an option).
# Correctness is tools/ab_check.sh's part (GPU suite, sanitizers, fuzzer); this one only times.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/tools/ab_trees.sh"  # usage, OUT, WORKLOADS, ROUNDS and the trees
RECIPES=${RECIPES:-fp8}
ITERS=${ITERS:-10}
SETTLE_MS=${SETTLE_MS:-0}
[[ $SETTLE_MS =~ ^[0-9]+$ ]] || { echo "SETTLE_MS: '$SETTLE_MS' is not a non-negative integer"; exit 2; }

# A tree whose prebuilt/ holds a flamia_bench that runs here (tools/prebuild_trees.sh: built on
# another machine with the same toolkit, libflamia.so beside it) is not built again.
bins=()
for i in "${!dirs[@]}"; do
  bins[$i]="${dirs[$i]}/build-ab"
  if "${dirs[$i]}/prebuilt/flamia_bench" --list >/dev/null 2>&1; then
    bins[$i]="${dirs[$i]}/prebuilt"
    echo "${names[$i]}: prebuilt ($(cat "${dirs[$i]}/prebuilt/COMMIT" 2>/dev/null))"
  fi
done
# Side by side: the machine's cores shared between the trees.
jobs=$(( $(nproc 2>/dev/null || echo 8) / ${#dirs[@]} ))
[ "$jobs" -ge 1 ] || jobs=1
for i in "${!dirs[@]}"; do
  [ "${bins[$i]}" = "${dirs[$i]}/build-ab" ] || continue
  for ((j = 0; j < i; ++j)); do [ "${dirs[$j]}" != "${dirs[$i]}" ] || continue 2; done
  ( cmake -S "${dirs[$i]}" -B "${dirs[$i]}/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "${dirs[$i]}/build-ab" -j"$jobs" --target flamia flamia_bench ) \
    >"$OUT/${names[$i]}.build.log" 2>&1 &
done
wait
status=0
for i in "${!dirs[@]}"; do
  [ -x "${bins[$i]}/flamia_bench" ] || { echo "${names[$i]}: build failed"; tail -5 "$OUT/${names[$i]}.build.log" 2>/dev/null; status=1; }
done
[ $status -eq 0 ] || exit 1

files=()
for ((r = 1; r <= ROUNDS; ++r)); do
  # Each round starts one later in the list, so that each runs first in turn and none always
  # inherits the board from the same one (in one process a fixed order moved the same
  # kernels by 4-5 %: docs/PERFORMANCE.md, the harness's in-turn entries).
  for ((k = 0; k < ${#dirs[@]}; ++k)); do
    i=$(( (k + r - 1) % ${#dirs[@]} ))
    base="$OUT/bench_${names[$i]}_round$r"
    read -ra tree_env <<<"${envs[$i]}"
    env ${BENCH_ENV:-} "${tree_env[@]}" "${bins[$i]}/flamia_bench" --workloads "$WORKLOADS" --recipes "$RECIPES" --iters "$ITERS" --settle-ms "$SETTLE_MS" \
      --json "$base.json" >"$base.txt" 2>&1 || { echo "${names[$i]} round $r: flamia_bench failed"; tail -5 "$base.txt"; status=1; continue; }
    files+=("$base.json")
  done
done
python3 "$ROOT/tools/ab_summary.py" --phases "${PHASES:-fwd,bwd,step}" --bundle "$OUT/ab_bench_runs.json" \
  --what "${WHAT:-${BENCH_ENV:+$BENCH_ENV }flamia_bench --recipes $RECIPES --iters $ITERS, trees alternated $ROUNDS times: ${described[*]}}" \
  "${files[@]}" | tee "$OUT/ab_bench.md"
# A device call returns few files: the per-round outputs and build logs (every run is also in
# the bundle) go into one archive.
# Prebuilt trees leave no build log: only the files that exist go in.
(cd "$OUT" && shopt -s nullglob && kept=(bench_*_round*.* *.build.log) &&
  tar -czf ab_rounds.tar.gz "${kept[@]}" && rm -f "${kept[@]}")
exit $status
