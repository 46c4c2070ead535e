"""tools/ab_summary.py, and tools/ab_bench.sh's and ab_sustained.sh's argument checks
(tools/ab_trees.sh) and loop, on synthetic flamia_bench JSONs and a stand-in harness (no GPU,
no build)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import ab_summary  # noqa: E402


def bench_json(path: Path, fwd: float, bwd: float, workloads=("fixed-16k", "llama1b-pack")) -> Path:
    recs = [{"workload": w, "recipe": "fp8", "ms": {"quant": 0.2, "fwd": fwd + i, "bwd": bwd + i, "step": fwd + bwd + i}}
            for i, w in enumerate(workloads)]
    path.write_text(json.dumps({"tool": "flamia_bench", "records": recs}))
    return path


def test_medians_and_change_against_the_first_tree(tmp_path):
    files = [bench_json(tmp_path / "bench_m_round1.json", 4.0, 13.0),
             bench_json(tmp_path / "bench_v_round1.json", 4.0, 12.0),
             bench_json(tmp_path / "bench_m_round2.json", 4.2, 13.2),
             bench_json(tmp_path / "bench_v_round2.json", 3.8, 12.4),
             bench_json(tmp_path / "bench_m_round3.json", 4.1, 13.1),
             bench_json(tmp_path / "bench_v_round3.json", 3.9, 12.2)]
    order, runs = ab_summary.load(files)
    assert order == ["m", "v"]
    text = ab_summary.table(order, runs, ["fwd", "bwd"])
    # m fwd 4.0 / 4.2 / 4.1 -> median 4.1; v 4.0 / 3.8 / 3.9 -> 3.9: -4.9 %
    assert "| fixed-16k | fp8 | fwd | 4.000 / 4.200 / 4.100 (median 4.100) | 4.000 / 3.800 / 3.900 (median 3.900) | -4.9 % |" in text
    # bwd: m median 13.1, v median 12.2: -6.9 %, every v round below every m round (fwd's
    # rounds overlap at 4.0, so no mark there); llama1b-pack is the same plus 1 ms
    assert "| fixed-16k | fp8 | bwd | 13.000 / 13.200 / 13.100 (median 13.100) |" in text
    assert "-6.9 % (every round below) |" in text
    assert "| llama1b-pack | fp8 | bwd | 14.000 / 14.200 / 14.100 (median 14.100) | 13.000 / 13.400 / 13.200 (median 13.200) | -6.4 % (every round below) |" in text
    # and the other way round: the reference's rounds are all above
    assert ab_summary.apart([2.0, 2.1], [1.0, 1.5]) == " (every round above)"
    assert ab_summary.apart([1.0], [2.0]) == ""  # one round says nothing


def test_bundle_and_bad_names(tmp_path):
    a = bench_json(tmp_path / "bench_main_round1.json", 4.0, 13.0)
    b = bench_json(tmp_path / "bench_v25_round1.json", 4.0, 12.0)
    out = tmp_path / "runs.json"
    assert ab_summary.main([str(a), str(b), "--bundle", str(out), "--what", "main vs v25"]) == 0
    doc = json.loads(out.read_text())
    assert doc["what"] == "main vs v25" and sorted(doc["runs"]) == ["main_round1", "v25_round1"]
    assert doc["runs"]["v25_round1"]["records"][0]["ms"]["bwd"] == 12.0
    bad = bench_json(tmp_path / "m1.json", 4.0, 13.0)
    assert ab_summary.main([str(bad)]) == 2
    assert ab_summary.main([str(a), str(a)]) == 2  # the same round of a tree twice


def test_ab_bench_refuses_before_building(tmp_path):
    script = ROOT / "tools" / "ab_bench.sh"
    one = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True)
    assert one.returncode == 2 and "usage" in one.stdout
    (tmp_path / "x" / "t").mkdir(parents=True)
    (tmp_path / "y" / "t").mkdir(parents=True)
    same = subprocess.run(["bash", str(script), str(tmp_path / "x" / "t"), str(tmp_path / "y" / "t")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o")})
    assert same.returncode == 2 and "two trees named 't'" in same.stdout
    rounds = subprocess.run(["bash", str(script), str(tmp_path / "x" / "t"), str(tmp_path / "y")],
                            capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o"), "ROUNDS": "0"})
    assert rounds.returncode == 2 and rounds.stdout.startswith("ROUNDS: ")
    settle = subprocess.run(["bash", str(script), str(tmp_path / "x" / "t"), str(tmp_path / "y")],
                            capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o"), "SETTLE_MS": "-5"})
    assert settle.returncode == 2 and settle.stdout.startswith("SETTLE_MS: ")


def harness_json(path: Path, step: float, sustained) -> Path:
    """A Python harness bench.json (`python -m flamia.bench --sustained`): flamia's records and a
    baseline's, which the summary leaves out."""
    recs = [{"workload": "fixed-16k", "impl": "flamia", "recipe": "fp8_mixed", "fwd_ms": 3.5, "step_ms": step,
             "sustained": None if sustained is None else {"steps": 70, "step_ms": sustained,
                                                          "fwd": {"calls": 280, "ms": sustained / 4}}},
            {"workload": "fixed-16k", "impl": "cudnn_fp8", "recipe": "fp8_per_tensor", "step_ms": 11.0,
             "sustained": {"steps": 90, "step_ms": 11.4}}]
    path.write_text(json.dumps({"records": recs}))
    return path


def test_harness_runs_give_the_median_and_the_sustained_step(tmp_path):
    files = [harness_json(tmp_path / "bench_m_round1.json", 13.5, 13.8),
             harness_json(tmp_path / "bench_v_round1.json", 13.9, 13.5),
             harness_json(tmp_path / "bench_m_round2.json", 13.4, 13.9),
             harness_json(tmp_path / "bench_v_round2.json", 13.8, 13.6)]
    order, runs = ab_summary.load(files)
    text = ab_summary.table(order, runs, ["step", "sustained", "sustained_fwd"])
    # v is slower in the medians and faster sustained, every round apart both ways
    assert "| fixed-16k | fp8_mixed | step | 13.500 / 13.400 (median 13.450) | 13.900 / 13.800 (median 13.850) | +3.0 % (every round above) |" in text
    assert "| fixed-16k | fp8_mixed | sustained | 13.800 / 13.900 (median 13.850) | 13.500 / 13.600 (median 13.550) | -2.2 % (every round below) |" in text
    assert "| fixed-16k | fp8_mixed | sustained_fwd | 3.450 / 3.475 (median 3.463) | 3.375 / 3.400 (median 3.388) | -2.2 % (every round below) |" in text
    assert "cudnn_fp8" not in text and "fp8_per_tensor" not in text
    # a run without --sustained has no sustained row
    plain = [harness_json(tmp_path / "bench_a_round1.json", 13.5, None),
             harness_json(tmp_path / "bench_b_round1.json", 13.9, None)]
    order, runs = ab_summary.load(plain)
    assert "sustained" not in ab_summary.table(order, runs, ["sustained"])


def test_ab_sustained_refuses_before_running(tmp_path):
    script = ROOT / "tools" / "ab_sustained.sh"
    one = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True)
    assert one.returncode == 2 and "usage" in one.stdout
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    for var, value in (("ROUNDS", "0"), ("WINDOW_S", "0"), ("WINDOW_S", "1s"), ("RECIPES", "bf16")):
        run = subprocess.run(["bash", str(script), str(tmp_path / "x"), str(tmp_path / "y")], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o"), var: value})
        assert run.returncode == 2 and run.stdout.startswith(f"{var}: "), (var, value, run.stdout)


def stand_in_harness(tmp_path: Path, sustained_ms: str) -> dict:
    """A stand-in python3 for tools/ab_sustained.sh (the harness itself needs a GPU): it answers
    `-m flamia.bench` with a bench.json whose fp8_mixed sustained step is the shell expression
    sustained_ms, logs "$FLAMIA_LIBRARY $FLAMIA_BWD_DQ $*" a call to calls.txt, and runs
    everything else for real. Returns the environment that puts it first on PATH."""
    import os
    import shutil

    real = shutil.which("python3") or sys.executable
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m flamia.bench" ]; then
  out=$(echo "$@" | sed 's/.*--out \\([^ ]*\\).*/\\1/'); mkdir -p "$out"
  s={sustained_ms}
  echo "{{\\"records\\": [{{\\"workload\\": \\"fixed-16k\\", \\"impl\\": \\"flamia\\", \\"recipe\\": \\"fp8\\", \\"step_ms\\": 16.0, \\"sustained\\": {{\\"step_ms\\": 16.3}}}}, {{\\"workload\\": \\"fixed-16k\\", \\"impl\\": \\"flamia\\", \\"recipe\\": \\"fp8_mixed\\", \\"step_ms\\": 13.4, \\"sustained\\": {{\\"step_ms\\": $s}}}}]}}" > "$out/bench.json"
  echo "$FLAMIA_LIBRARY ${{FLAMIA_BWD_DQ:--}} $*" >> "{tmp_path}/calls.txt"
  exit 0
fi
exec {real} "$@"
""")
    (fake / "python3").chmod(0o755)
    return {"PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(tmp_path / "o"), "ROUNDS": "2",
            "RECIPES": "fp8_mixed", "WINDOW_S": "0.5"}


def prebuilt_trees(tmp_path: Path, *trees: str) -> None:
    for tree in trees:
        (tmp_path / tree / "prebuilt").mkdir(parents=True)
        (tmp_path / tree / "prebuilt" / "libflamia.so").write_text("")


def test_ab_sustained_alternates_the_trees_and_summarizes(tmp_path):
    env = stand_in_harness(tmp_path, '$(case "$FLAMIA_LIBRARY" in *ref*) echo 13.8;; *) echo 13.5;; esac)')
    prebuilt_trees(tmp_path, "ref", "v")
    run = subprocess.run(["bash", str(ROOT / "tools" / "ab_sustained.sh"), str(tmp_path / "ref"), str(tmp_path / "v")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    # alternated, each tree first in turn
    assert [c.split()[0].split("/")[-3] for c in calls] == ["ref", "v", "v", "ref"]
    assert all("--sustained 0.5" in c and "--impls flamia" in c for c in calls)
    summary = (tmp_path / "o" / "ab_sustained.md").read_text()
    assert "| fixed-16k | fp8_mixed | sustained | 13.800 / 13.800 (median 13.800) | 13.500 / 13.500 (median 13.500) | -2.2 % (every round below) |" in summary
    assert "| fp8 |" not in summary  # RECIPES kept fp8_mixed only
    bundle = json.loads((tmp_path / "o" / "ab_sustained_runs.json").read_text())
    assert sorted(bundle["runs"]) == ["ref_round1", "ref_round2", "v_round1", "v_round2"]


def test_ab_sustained_times_one_tree_under_two_settings(tmp_path):
    # NAME=DIR:VAR=value (tools/ab_trees.sh): one library, the runs told apart by a switch.
    env = stand_in_harness(tmp_path, '$([ "$FLAMIA_BWD_DQ" = recompute ] && echo 14.0 || echo 13.6)')
    prebuilt_trees(tmp_path, "main")
    run = subprocess.run(["bash", str(ROOT / "tools" / "ab_sustained.sh"), f"auto={tmp_path / 'main'}",
                          f"recompute={tmp_path / 'main'}:FLAMIA_BWD_DQ=recompute,FLAMIA_BWD_DS_MIB=512"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    calls = [c.split()[:2] for c in (tmp_path / "calls.txt").read_text().splitlines()]
    lib = str(tmp_path / "main" / "prebuilt" / "libflamia.so")
    assert calls == [[lib, "-"], [lib, "recompute"], [lib, "recompute"], [lib, "-"]]
    summary = (tmp_path / "o" / "ab_sustained.md").read_text()
    assert "| fixed-16k | fp8_mixed | sustained | 13.600 / 13.600 (median 13.600) | 14.000 / 14.000 (median 14.000) | +2.9 % (every round above) |" in summary
    bundle = json.loads((tmp_path / "o" / "ab_sustained_runs.json").read_text())
    assert sorted(bundle["runs"]) == ["auto_round1", "auto_round2", "recompute_round1", "recompute_round2"]
    assert "recompute (FLAMIA_BWD_DQ=recompute FLAMIA_BWD_DS_MIB=512)" in bundle["what"]


def test_ab_trees_refuses_bad_names_and_settings(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    for args, message in ((["a=" + str(tmp_path / "x"), "a=" + str(tmp_path / "y")], "two trees named 'a'"),
                          ([str(tmp_path / "x"), str(tmp_path / "x")], "two trees named 'x'"),
                          ([str(tmp_path / "x"), str(tmp_path / "y") + ":1BAD=v"], "y: setting '1BAD=v' is not VAR=value"),
                          ([str(tmp_path / "x"), "b=" + str(tmp_path / "y") + ":FLAMIA_BWD_DQ"],
                           "b: setting 'FLAMIA_BWD_DQ' is not VAR=value")):
        for script in ("ab_sustained.sh", "ab_bench.sh"):
            run = subprocess.run(["bash", str(ROOT / "tools" / script), *args], capture_output=True, text=True,
                                 env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o")})
            assert run.returncode == 2 and run.stdout.strip() == message, (script, args, run.stdout)


def test_ab_bench_rotates_prebuilt_trees_and_archives_the_rounds(tmp_path):
    # Prebuilt trees (no build, so no build logs): a stand-in flamia_bench in each prebuilt/
    # logs its tree and writes a JSON whose step is the tree's; every per-round file must end
    # up in ab_rounds.tar.gz, none left beside it (a device call returns few files).
    import tarfile

    for tree, step in (("ref", 13.0), ("v", 12.5)):
        (tmp_path / tree / "prebuilt").mkdir(parents=True)
        bench = tmp_path / tree / "prebuilt" / "flamia_bench"
        bench.write_text(f"""#!/bin/bash
[ "$1" = --list ] && exit 0
json=$(echo "$@" | sed 's/.*--json \\([^ ]*\\).*/\\1/')
echo '{{"records": [{{"workload": "fixed-16k", "recipe": "fp8", "ms": {{"fwd": 3.0, "bwd": 9.0, "step": {step}}}}}]}}' > "$json"
echo {tree} >> "{tmp_path}/calls.txt"
""")
        bench.chmod(0o755)
    out = tmp_path / "o"
    run = subprocess.run(["bash", str(ROOT / "tools" / "ab_bench.sh"), str(tmp_path / "ref"), str(tmp_path / "v")],
                         capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(out), "ROUNDS": "3", "WORKLOADS": "fixed-16k"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "calls.txt").read_text().split() == ["ref", "v", "v", "ref", "ref", "v"]
    assert "| fixed-16k | fp8 | step | 13.000 / 13.000 / 13.000 (median 13.000) | 12.500 / 12.500 / 12.500 (median 12.500) | -3.8 % (every round below) |" \
        in (out / "ab_bench.md").read_text()
    with tarfile.open(out / "ab_rounds.tar.gz") as tar:
        archived = sorted(tar.getnames())
    assert archived == sorted(f"bench_{t}_round{r}.{x}" for t in ("ref", "v") for r in (1, 2, 3) for x in ("json", "txt"))
    assert sorted(p.name for p in out.iterdir()) == ["ab_bench.md", "ab_bench_runs.json", "ab_rounds.tar.gz"]
