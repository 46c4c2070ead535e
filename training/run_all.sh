#!/usr/bin/env bash
# The whole training validation in one command:
#   corpus (if missing) -> bf16, fp8, fp8_mixed training runs -> leakage probe -> report.
#
#   training/run_all.sh
#   MAX_MINUTES=3 training/run_all.sh         # cap each training run at 3 minutes
#   RESUME=1 training/run_all.sh              # continue runs that were cut short
#
# Environment (all optional):
#   MAX_MINUTES    wall-clock cap per training run (default 4; a capped run is saved and
#                  marked unfinished, RESUME=1 continues it). 0 = no cap.
#   TRAIN_TOKENS   token budget per training run (default 20e6, just under one epoch)
#   RECIPES        training recipes (default "bf16 fp8 fp8_mixed")
#   PROBE_SECONDS  cap per (variant, scheme) of the leakage probe (default 40); SKIP_PROBE=1 skips it
#   RESUME=1       pass --resume to train.py
#   PYTHON         interpreter (default python3)
#   TRAIN_ARGS, PROBE_ARGS  extra arguments for train.py / leakage_probe.py (e.g. smoke tests:
#                  TRAIN_ARGS="--model-size tiny --pack-tokens 4096" PROBE_ARGS="--steps 50")
# flamia must be importable for fp8/fp8_mixed (python/ is put on PYTHONPATH here; the
# library must be built). Recipes that cannot run are reported and skipped.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
MAX_MINUTES=${MAX_MINUTES:-4}
TRAIN_TOKENS=${TRAIN_TOKENS:-20e6}
RECIPES=${RECIPES:-"bf16 fp8 fp8_mixed"}
PROBE_SECONDS=${PROBE_SECONDS:-40}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

status=0
if [ ! -f training/data/meta.json ]; then
    echo "== preparing corpus"
    $PY training/prepare_data.py || { echo "corpus preparation failed"; exit 1; }
fi

resume=()
[ "${RESUME:-0}" = "1" ] && resume=(--resume)
for recipe in $RECIPES; do
    echo "== training $recipe (budget $TRAIN_TOKENS tokens, cap ${MAX_MINUTES} min)"
    t0=$(date +%s)
    $PY training/train.py --recipe "$recipe" --tokens "$TRAIN_TOKENS" --max-minutes "$MAX_MINUTES" "${resume[@]}" ${TRAIN_ARGS:-}
    rc=$?
    if [ $rc -eq 3 ]; then
        echo "== $recipe skipped (flamia not available)"
    elif [ $rc -ne 0 ]; then
        echo "== $recipe FAILED (exit $rc)"; status=1
    fi
    echo "== $recipe took $(( $(date +%s) - t0 )) s"
done

if [ "${SKIP_PROBE:-0}" != "1" ]; then
    echo "== leakage probe"
    $PY training/leakage_probe.py --max-seconds "$PROBE_SECONDS" ${PROBE_ARGS:-} || { echo "== leakage probe FAILED"; status=1; }
fi

echo "== report"
$PY training/report.py || status=1
exit $status
