#!/usr/bin/env bash
# Times one build of flamia_bench under several environments in one GPU call, alternated
# ROUNDS times (so that clock and thermal drift reach every setting alike), and prints per
# workload, recipe and phase each setting's times, medians and change against the first
# (tools/ab_summary.py). For switches read at run time (FLAMIA_BWD_DQ=fused, ...); for
# source changes use tools/ab_bench.sh.
#   bash tools/env_ab.sh NAME=[VAR=value[,VAR=value...]] NAME=... ...
# e.g. bash tools/env_ab.sh det= fused=FLAMIA_BWD_DQ=fused
# Environment: BUILD_DIR (default build-gpu; built here if flamia_bench is missing), OUT
# (default ./out), WORKLOADS, RECIPES (default fp8_mixed), ROUNDS (3), ITERS (10), PHASES
# (fwd,bwd,step), WHAT (the bundle's description).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME=[VAR=value,...] NAME=[...] ..."; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
WORKLOADS=${WORKLOADS:-fixed-16k,pack-32k,llama8b-pack}
RECIPES=${RECIPES:-fp8_mixed}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-10}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: '$ROUNDS' is not a positive integer"; exit 2; }
if [ ! -x "$BUILD/flamia_bench" ]; then
  { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$BUILD" -j"$(nproc)" --target flamia_bench; } >"$OUT/env_ab.build.log" 2>&1 ||
    { echo "build failed"; tail -20 "$OUT/env_ab.build.log"; exit 1; }
fi
names=()
envs=()
for spec in "$@"; do
  name=${spec%%=*}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "setting name '$name': use letters, digits, '.', '_' or '-'"; exit 2; }
  names+=("$name")
  envs+=("${spec#*=}")
done
status=0
files=()
for ((r = 1; r <= ROUNDS; ++r)); do
  # Each round starts one later in the list, so that each runs first in turn and none always
  # inherits the board from the same one (in one process a fixed order moved the same
  # kernels by 4-5 %: docs/PERFORMANCE.md, the harness's in-turn entries).
  for ((k = 0; k < ${#names[@]}; ++k)); do
    i=$(( (k + r - 1) % ${#names[@]} ))
    base="$OUT/bench_${names[$i]}_round$r"
    # VAR=value pairs split at the commas that start a new VAR=: a value may hold commas
    # (FLAMIA_PDL=dq,slabs).
    IFS=, read -r -a parts <<<"${envs[$i]}"
    assign=()
    for part in "${parts[@]}"; do
      if [[ $part =~ ^[A-Za-z_][A-Za-z0-9_]*= || ${#assign[@]} -eq 0 ]]; then assign+=("$part")
      else assign[-1]+=",$part"; fi
    done
    env "${assign[@]}" "$BUILD/flamia_bench" --workloads "$WORKLOADS" --recipes "$RECIPES" --iters "$ITERS" \
      --json "$base.json" >"$base.txt" 2>&1 || { echo "${names[$i]} round $r: flamia_bench failed"; tail -5 "$base.txt"; status=1; continue; }
    files+=("$base.json")
  done
done
described=()
for i in "${!names[@]}"; do described+=("${names[$i]}: ${envs[$i]:-(none)}"); done
python3 "$ROOT/tools/ab_summary.py" --phases "${PHASES:-fwd,bwd,step}" --bundle "$OUT/env_ab_runs.json" \
  --what "${WHAT:-flamia_bench --recipes $RECIPES --iters $ITERS, settings alternated $ROUNDS times: ${described[*]}}" \
  "${files[@]}" | tee "$OUT/env_ab.md"
# The per-round outputs (every run is also in the bundle) in one archive: a device call
# returns few files.
(cd "$OUT" && tar -czf env_rounds.tar.gz bench_*_round*.* 2>/dev/null && rm -f bench_*_round*.*)
exit $status
