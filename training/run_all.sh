#!/usr/bin/env bash
# The whole training validation in one command:
#   corpus (if missing) -> every recipe x every seed (paired) -> leakage probe -> report.
#
#   training/run_all.sh                                   # 5 seeds, head dim 64, default corpus
#   SEEDS="1 2 3 4 5 6 7 8" HEAD_DIM="64 128" CORPUS="default alt" training/run_all.sh
#   RECIPES="bf16 fp8 per_token_fp8 per_tensor_fp8" training/run_all.sh   # with the controls
#   RESUME=1 training/run_all.sh                          # continue runs that were cut short
#   GPUS="0 1" training/run_all.sh                        # two runs at a time, one per GPU
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
#   LR             peak learning rate (default 6e-4; train.py's own default is 1e-3). At 1e-3
#                  the paired fp8 - bf16 gap varied by 2-6 % between seeds and the largest
#                  logits ran away; at 6e-4 by 1.5 % (docs/TRAINING.md, sweep 5). Runs at
#                  another rate belong in their own setting folder (TAG).
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
#   RERUN=1        train runs again that already finished (their log ends with a finished
#                  record); by default they are kept and skipped, so a repeated or extended
#                  sweep (more seeds, a recipe added, a cut sweep) trains only what is missing
#   GPUS           GPU indices to spread the training runs over (e.g. "0 1"). Unset: one run
#                  after the other on the default device, output on the terminal. Set: a queue
#                  keeps up to GPUS x JOBS_PER_GPU runs going, each with CUDA_VISIBLE_DEVICES set
#                  to its GPU and its output in training/runs/<setting>/<recipe>-seed<seed>/
#                  console.log; one status line per run when it ends. Runs start in the
#                  sequential order, so a cut sweep leaves complete pairs behind for all but
#                  the seeds in progress.
#   JOBS_PER_GPU   concurrent runs per GPU with GPUS (default 1)
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
LR=${LR:-6e-4}
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
GPUS=${GPUS:-}
JOBS_PER_GPU=${JOBS_PER_GPU:-1}
for gpu in $GPUS; do
    case $gpu in *[!0-9]*) echo "GPUS: '$gpu' is not a GPU index (separate indices by spaces: GPUS=\"0 1\")"; exit 2 ;; esac
done
[[ $JOBS_PER_GPU =~ ^[1-9][0-9]*$ ]] || { echo "JOBS_PER_GPU: '$JOBS_PER_GPU' is not a positive integer"; exit 2; }
[[ $LR =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] || { echo "LR: '$LR' is not a positive number (e.g. 6e-4)"; exit 2; }

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

# train_args <corpus> <head dim> <seed> <recipe> <run>: sets $args, train.py's arguments.
train_args() {
    args=(--recipe "$4" --seed "$3" --head-dim "$2" --data-dir "$(corpus_dir "$1")" --run-name "$5"
          --tokens "$TRAIN_TOKENS" --lr "$LR" --eval-packs "$EVAL_PACKS" --max-minutes "$MAX_MINUTES"
          "${resume[@]}" ${TRAIN_ARGS:-})
}

# finished <run>: the run's log ends with train.py's record of a run that reached its budget.
finished() {
    local log="training/runs/$1/log.jsonl"
    [ -f "$log" ] && tail -n 1 "$log" | grep -q '"type": "end"' && tail -n 1 "$log" | grep -q '"truncated": false'
}

# finish <run> <recipe> <exit code> <start time>: status line, recipe skip, checkpoint cleanup.
finish() {
    local run=$1 recipe=$2 rc=$3 took=$(( $(date +%s) - $4 ))
    if [ "$rc" -eq 3 ]; then
        echo "== $recipe skipped from here on (flamia not available)"; skipped="$skipped$recipe "
    elif [ "$rc" -ne 0 ]; then
        echo "== $run FAILED (exit $rc)"; status=1
    elif [ "${KEEP_CKPT:-0}" != "1" ] && finished "$run"; then
        rm -f "training/runs/$run/ckpt.pt"
    fi
    echo "== $run took $took s"
}

# The parallel queue: one slot per concurrent run, slot_gpu[i] its GPU; slot_pid/run/recipe/t0
# describe the run in it (pid empty = free).
slot_gpu=() slot_pid=() slot_run=() slot_recipe=() slot_t0=()
for gpu in $GPUS; do
    for ((k = 0; k < JOBS_PER_GPU; k++)); do slot_gpu+=("$gpu"); slot_pid+=(""); done
done
[ -n "$GPUS" ] && trap 'kill ${slot_pid[*]} 2>/dev/null; exit 130' INT TERM  # runs die with the sweep

# reap: finish every run whose process has ended and free its slot.
reap() {
    for i in "${!slot_gpu[@]}"; do
        local pid=${slot_pid[$i]}
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"; finish "${slot_run[$i]}" "${slot_recipe[$i]}" $? "${slot_t0[$i]}"
            slot_pid[$i]=""
        fi
    done
}

# free_slot: wait until a slot is free and set $slot to its index. It polls once a second:
# `wait -n` would miss a run that ends between the check and the call (bash waits for the
# next one then), leaving that run's GPU idle.
free_slot() {
    while :; do
        reap
        for slot in "${!slot_gpu[@]}"; do [ -z "${slot_pid[$slot]}" ] && return; done
        sleep 1
    done
}

# Seeds outermost: an interrupted sweep leaves complete pairs (every recipe of a seed) behind.
for corpus in $CORPUS; do
  for hd in $HEAD_DIM; do
    for seed in $SEEDS; do
      for recipe in $RECIPES; do
        run="$corpus-hd$hd${TAG:+-$TAG}/$recipe-seed$seed"
        if [ "${RERUN:-0}" != "1" ] && finished "$run"; then  # before waiting for a slot
            echo "== $run finished before, kept"
            continue
        fi
        [ -n "$GPUS" ] && free_slot  # first, so that a skip found by reap applies right away
        case $skipped in *" $recipe "*) continue ;; esac
        if [ -z "$GPUS" ]; then
            echo "== training $run (budget $TRAIN_TOKENS tokens, cap ${MAX_MINUTES} min)"
            t0=$(date +%s)
            train_args "$corpus" "$hd" "$seed" "$recipe" "$run"
            $PY training/train.py "${args[@]}"
            finish "$run" "$recipe" $? "$t0"
            continue
        fi
        echo "== training $run on GPU ${slot_gpu[$slot]} (budget $TRAIN_TOKENS tokens, cap ${MAX_MINUTES} min)"
        mkdir -p "training/runs/$run"
        console="training/runs/$run/console.log"
        [ ${#resume[@]} -eq 0 ] && : >"$console"  # a resumed run appends to its console log
        train_args "$corpus" "$hd" "$seed" "$recipe" "$run"
        # A simple command in the background: $! is train.py itself, so the trap can stop it.
        CUDA_VISIBLE_DEVICES=${slot_gpu[$slot]} $PY training/train.py "${args[@]}" >>"$console" 2>&1 &
        slot_pid[$slot]=$! slot_run[$slot]=$run slot_recipe[$slot]=$recipe slot_t0[$slot]=$(date +%s)
      done
    done
  done
done
while reap; [[ ${slot_pid[*]} =~ [0-9] ]]; do sleep 1; done  # the last runs

if [ "${SKIP_PROBE:-0}" != "1" ]; then
    echo "== leakage probe"
    $PY training/leakage_probe.py --max-seconds "$PROBE_SECONDS" ${PROBE_ARGS:-} || { echo "== leakage probe FAILED"; status=1; }
fi

echo "== report"
$PY training/report.py --avg-last "$AVG_LAST" || status=1
exit $status
