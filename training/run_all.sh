#!/usr/bin/env bash
# The whole training validation in one command:
#   corpus (if missing) -> every recipe x every seed (paired) -> leakage probe -> report.
#
#   training/run_all.sh                                   # 5 seeds, head dim 64, default corpus
#   SEEDS="1 2 3 4 5 6 7 8" HEAD_DIM="64 128" CORPUS="default alt" training/run_all.sh
#   RECIPES="bf16 fp8 per_token_fp8 per_tensor_fp8" training/run_all.sh   # with the controls
#   RESUME=1 training/run_all.sh                          # continue runs that were cut short
#
# Paired protocol: a seed fixes the initial weights and the order of the training packs, and
# every recipe runs with every seed, so the per-seed gap to bf16 compares like with like.
# Each run writes training/runs/<corpus>-hd<head dim>[-<TAG>]/<recipe>-seed<seed>/log.jsonl;
# the report compares the recipes within one such setting folder.
#
# Environment (all optional):
#   SEEDS          seeds (default "1 2 3 4 5")
#   RECIPES        training recipes (default "bf16 fp8 fp8_mixed"; the controls are
#                  per_token_fp8 and per_tensor_fp8). bf16 is the reference of every gap.
#   HEAD_DIM       64 (12 query / 4 key-value heads) and/or 128 (6/2 heads); default 64
#   CORPUS         corpus names (default "default"; "alt" is the second corpus, see
#                  prepare_data.py); a missing corpus is prepared first (needs apt and network)
#   TRAIN_TOKENS   token budget per training run (default 20e6, just under one epoch)
#   TAG            label appended to the setting folder, for runs that must not mix with
#                  the default sweep (e.g. TAG=100M with TRAIN_TOKENS=100e6)
#   MAX_MINUTES    wall-clock cap per training run (default 0 = none). A capped run is saved
#                  and marked unfinished; the report leaves unfinished runs out of the
#                  statistics, RESUME=1 continues them.
#   EVAL_PACKS     held-out packs per evaluation (default 0 = the whole held-out split)
#   AVG_LAST       the report averages each run's last AVG_LAST evaluations (default 1)
#   KEEP_CKPT=1    keep the checkpoint of finished runs (about 1 GB each for the base model;
#                  by default it is deleted once the run has finished, unfinished runs keep it)
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
SEEDS=${SEEDS:-"1 2 3 4 5"}
RECIPES=${RECIPES:-"bf16 fp8 fp8_mixed"}
HEAD_DIM=${HEAD_DIM:-64}
CORPUS=${CORPUS:-default}
MAX_MINUTES=${MAX_MINUTES:-0}
TRAIN_TOKENS=${TRAIN_TOKENS:-20e6}
EVAL_PACKS=${EVAL_PACKS:-0}
AVG_LAST=${AVG_LAST:-1}
PROBE_SECONDS=${PROBE_SECONDS:-40}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

for hd in $HEAD_DIM; do
    case $hd in 64|128) ;; *) echo "HEAD_DIM: $hd is not 64 or 128"; exit 2 ;; esac
done
case ${TAG:-} in *[!A-Za-z0-9_.-]*) echo "TAG: use letters, digits, '.', '_' or '-'"; exit 2 ;; esac
for seed in $SEEDS; do
    case $seed in ''|*[!0-9]*) echo "SEEDS: $seed is not a non-negative integer"; exit 2 ;; esac
done

corpus_dir() { if [ "$1" = default ]; then echo training/data; else echo "training/data-$1"; fi; }

status=0
for corpus in $CORPUS; do
    if [ ! -f "$(corpus_dir "$corpus")/meta.json" ]; then
        echo "== preparing corpus $corpus"
        $PY training/prepare_data.py --corpus "$corpus" || { echo "corpus $corpus: preparation failed"; exit 1; }
    fi
done

resume=()
[ "${RESUME:-0}" = "1" ] && resume=(--resume)
skipped=" "
# Seeds outermost: an interrupted sweep leaves complete pairs (every recipe of a seed) behind.
for corpus in $CORPUS; do
  for hd in $HEAD_DIM; do
    for seed in $SEEDS; do
      for recipe in $RECIPES; do
        case $skipped in *" $recipe "*) continue ;; esac
        run="$corpus-hd$hd${TAG:+-$TAG}/$recipe-seed$seed"
        echo "== training $run (budget $TRAIN_TOKENS tokens, cap ${MAX_MINUTES} min)"
        t0=$(date +%s)
        $PY training/train.py --recipe "$recipe" --seed "$seed" --head-dim "$hd" \
            --data-dir "$(corpus_dir "$corpus")" --run-name "$run" --tokens "$TRAIN_TOKENS" \
            --eval-packs "$EVAL_PACKS" --max-minutes "$MAX_MINUTES" "${resume[@]}" ${TRAIN_ARGS:-}
        rc=$?
        if [ $rc -eq 3 ]; then
            echo "== $recipe skipped from here on (flamia not available)"; skipped="$skipped$recipe "
        elif [ $rc -ne 0 ]; then
            echo "== $run FAILED (exit $rc)"; status=1
        elif [ "${KEEP_CKPT:-0}" != "1" ] && grep -q '"truncated": false' "training/runs/$run/log.jsonl"; then
            rm -f "training/runs/$run/ckpt.pt"
        fi
        echo "== $run took $(( $(date +%s) - t0 )) s"
      done
    done
  done
done

if [ "${SKIP_PROBE:-0}" != "1" ]; then
    echo "== leakage probe"
    $PY training/leakage_probe.py --max-seconds "$PROBE_SECONDS" ${PROBE_ARGS:-} || { echo "== leakage probe FAILED"; status=1; }
fi

echo "== report"
$PY training/report.py --avg-last "$AVG_LAST" || status=1
exit $status
