"""run_all.sh's run queue, with a stand-in interpreter instead of train.py: which runs start,
on which GPU, how many at once, in what order, where their output goes, and what happens on
exit code 3 (flamia unavailable) and on a failure. No torch, no GPU; a few seconds."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "run_all.sh"

# Stands in for `python3 <script> args`: train.py records its run (GPU, start, end) and exits 3
# for fp8 (as without flamia), 1 for per_token_fp8 seed 2, else 0 with a finished log and a
# checkpoint; every other script just succeeds.
FAKE = r'''
import json, os, sys, time
script, args = sys.argv[1], sys.argv[2:]
if not script.endswith("train.py"):
    print("ran", os.path.basename(script))
    sys.exit(0)
opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
recipe, seed, run = opt["--recipe"], opt["--seed"], opt["--run-name"]
start = time.time()
if recipe == "fp8":
    print("error: no flamia", file=sys.stderr)
    sys.exit(3)
time.sleep(float(os.environ["FAKE_SLEEP"]))
rec = {"run": run, "recipe": recipe, "seed": int(seed), "start": start, "end": time.time(),
       "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "lr": opt.get("--lr")}
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(rec) + "\n")
if recipe == "per_token_fp8" and seed == "2":
    sys.exit(1)
d = os.path.join("training", "runs", run)
os.makedirs(d, exist_ok=True)
open(os.path.join(d, "ckpt.pt"), "w").close()
with open(os.path.join(d, "log.jsonl"), "w") as f:
    f.write(json.dumps({"type": "end", "truncated": False}) + "\n")
print("trained", run)
'''

RECIPES = "bf16 fp8 per_token_fp8"


def sweep(tmp_path: Path, sleep: float, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Runs a copy of run_all.sh in tmp_path (it works relative to its own folder)."""
    (tmp_path / "training").mkdir(exist_ok=True)
    shutil.copy(SCRIPT, tmp_path / "training" / "run_all.sh")
    fake = tmp_path / "fake_python.py"
    fake.write_text(FAKE)
    record = tmp_path / "record.jsonl"
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("GPUS", "JOBS_PER_GPU", "CUDA_VISIBLE_DEVICES", "TAG", "RESUME", "KEEP_CKPT", "RERUN", "LR",
                              "TRAIN_ARGS")}
    full_env.update(PYTHON=f"{sys.executable} {fake}", FAKE_SLEEP=str(sleep), FAKE_RECORD=str(record),
                    SEEDS="1 2", RECIPES=RECIPES, SKIP_PROBE="1", **env)
    proc = subprocess.run(["bash", str(tmp_path / "training" / "run_all.sh")], env=full_env,
                          capture_output=True, text=True, timeout=120)
    runs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return proc, sorted(runs, key=lambda r: r["start"])


def max_overlap(runs: list[dict]) -> int:
    events = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


def check_common(proc: subprocess.CompletedProcess, runs: list[dict], tmp_path: Path) -> None:
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # per_token_fp8 seed 2 failed
    assert "== default-hd64/per_token_fp8-seed2 FAILED (exit 1)" in out
    assert out.count("== fp8 skipped from here on") == 1  # reported once, never started again
    assert "== training default-hd64/fp8-seed2" not in out
    assert "ran report.py" in out
    # Seeds outermost: every run of seed 1 starts before any run of seed 2.
    assert [r["seed"] for r in runs] == sorted(r["seed"] for r in runs)
    assert sorted(r["run"] for r in runs) == sorted(f"default-hd64/{rc}-seed{s}" for s in (1, 2)
                                                    for rc in ("bf16", "per_token_fp8"))
    runs_dir = tmp_path / "training" / "runs" / "default-hd64"
    assert not list(runs_dir.glob("*/ckpt.pt"))  # finished runs drop their checkpoint


def test_sequential_without_gpus(tmp_path):
    proc, runs = sweep(tmp_path, 0.1)
    check_common(proc, runs, tmp_path)
    assert max_overlap(runs) == 1
    assert all(r["gpu"] is None for r in runs)
    assert "trained default-hd64/bf16-seed1" in proc.stdout  # output on the terminal
    assert not list(tmp_path.glob("training/runs/*/*/console.log"))


def test_one_run_per_gpu(tmp_path):
    proc, runs = sweep(tmp_path, 2.5, GPUS="0 1")
    check_common(proc, runs, tmp_path)
    assert max_overlap(runs) == 2
    assert {r["gpu"] for r in runs} == {"0", "1"}
    for gpu in ("0", "1"):
        assert max_overlap([r for r in runs if r["gpu"] == gpu]) == 1
    assert "trained" not in proc.stdout  # each run's output is in its console.log
    for r in runs:
        console = tmp_path / "training" / "runs" / r["run"] / "console.log"
        if r["recipe"] != "per_token_fp8" or r["seed"] != 2:
            assert console.read_text() == f"trained {r['run']}\n"
    assert "error: no flamia" in (tmp_path / "training/runs/default-hd64/fp8-seed1/console.log").read_text()
    for r in runs:
        assert f"== {r['run']} took" in proc.stdout


def test_two_runs_on_one_gpu(tmp_path):
    proc, runs = sweep(tmp_path, 2.5, GPUS="3", JOBS_PER_GPU="2")
    check_common(proc, runs, tmp_path)
    assert max_overlap(runs) == 2
    assert {r["gpu"] for r in runs} == {"3"}


@pytest.mark.parametrize("env, name", [({"GPUS": "0,1"}, "GPUS"), ({"GPUS": "cuda:0"}, "GPUS"),
                                       ({"GPUS": "0", "JOBS_PER_GPU": "0"}, "JOBS_PER_GPU"),
                                       ({"GPUS": "0", "JOBS_PER_GPU": "two"}, "JOBS_PER_GPU"),
                                       ({"LR": "fast"}, "LR"), ({"LR": "-1e-3"}, "LR")])
def test_bad_values_are_rejected_before_anything_runs(tmp_path, env, name):
    proc, runs = sweep(tmp_path, 0.0, **env)
    assert proc.returncode == 2
    assert proc.stdout.startswith(f"{name}: ")
    assert runs == [] and "ran" not in proc.stdout


@pytest.mark.parametrize("env", [{}, {"GPUS": "0", "JOBS_PER_GPU": "2"}])
def test_a_repeated_sweep_trains_only_what_did_not_finish(tmp_path, env):
    _, first = sweep(tmp_path, 0.0, **env)
    proc, both = sweep(tmp_path, 0.0, **env)  # the record file keeps the first sweep's runs
    again = both[len(first):]
    # bf16 (both seeds) and per_token_fp8 seed 1 finished: kept; per_token_fp8 seed 2 failed:
    # trained again; fp8 (flamia unavailable) is tried again and skipped again.
    assert [r["run"] for r in again] == ["default-hd64/per_token_fp8-seed2"]
    for run in ("bf16-seed1", "bf16-seed2", "per_token_fp8-seed1"):
        assert f"== default-hd64/{run} finished before, kept" in proc.stdout
    assert "fp8 skipped from here on" in proc.stdout  # (the queue may have started both seeds)
    proc, all_three = sweep(tmp_path, 0.0, RERUN="1", **env)
    assert sorted(r["run"] for r in all_three[len(both):]) == sorted(
        f"default-hd64/{rc}-seed{s}" for s in (1, 2) for rc in ("bf16", "per_token_fp8"))
    assert "finished before" not in proc.stdout


def test_peak_learning_rate(tmp_path):
    # 6e-4 unless LR says otherwise; TRAIN_ARGS come last, so an --lr there wins (argparse).
    _, runs = sweep(tmp_path, 0.0)
    assert runs and {r["lr"] for r in runs} == {"6e-4"}
    _, runs = sweep(tmp_path, 0.0, LR="1e-3", RERUN="1")
    assert {r["lr"] for r in runs[-3:]} == {"1e-3"}
    _, runs = sweep(tmp_path, 0.0, TRAIN_ARGS="--lr 2e-4", RERUN="1")
    assert {r["lr"] for r in runs[-3:]} == {"2e-4"}
