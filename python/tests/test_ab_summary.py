"""tools/ab_summary.py and tools/ab_bench.sh's argument checks, on synthetic flamia_bench
JSONs (no GPU, no build)."""
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
