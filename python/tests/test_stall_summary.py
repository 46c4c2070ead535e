"""tools/stall_summary.py on a synthetic Nsight Compute source page (no GPU): --regions splits
the code into runs executed equally often and reports each run's share of the samples."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_wait"]
# 10 warps: a prologue run once a warp, a loop of 3 instructions run 40 times, an epilogue
# run 4 times (one at 4.2: within 10 % of its run), a never-run branch.
ROWS = [("0x00", "MOV R1, c[0x0][0x28] ;", 2, 1, 10),
        ("0x10", "@!P0 BRA 0x80 ;", 1, 1, 10),
        ("0x20", "FMUL R2, R3, R4 ;", 30, 10, 400),
        ("0x30", "MUFU.EX2 R2, R2 ;", 40, 20, 400),
        ("0x40", "FADD R5, R5, R2 ;", 20, 5, 400),
        ("0x50", "STG.E [R6.64], R5 ;", 5, 4, 40),
        ("0x60", "@P1 STG.E [R6.64+0x4], R5 ;", 2, 1, 42),
        ("0x70", "EXIT ;", 0, 0, 0)]


def run(tmp_path, *args):
    page = tmp_path / "sass.csv"
    with page.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["==PROF== a preamble line"])
        w.writerow(HEADER)
        for a, src, s, n, x in ROWS:
            w.writerow([a, src, s, n, x, s])
    return subprocess.run([sys.executable, str(ROOT / "tools" / "stall_summary.py"), str(page), *args],
                          capture_output=True, text=True)


def region_lines(out):
    block = out.split("\nregions:")[1].split("\ntop ")[0]
    return [line.split() for line in block.splitlines()[2:] if line.strip()]


def test_regions_are_runs_of_equal_execution_counts(tmp_path):
    res = run(tmp_path, "--regions", "--min-share", "0")
    assert res.returncode == 0, res.stderr
    lines = region_lines(res.stdout)
    # address, instructions, executions a warp, share %, "%", warp instructions a warp, opcodes...
    assert [(l[0], l[1], l[2]) for l in lines] == [("0x00", "2", "1.0"), ("0x20", "3", "40.0"),
                                                    ("0x50", "2", "4.0"), ("0x70", "1", "0.0")]
    total = sum(r[2] for r in ROWS)
    assert float(lines[1][3]) == round(100 * 90 / total, 2)
    assert float(lines[1][5]) == 120.0  # 3 instructions x 40 a warp
    assert lines[1][6:] == ["FMUL", "1,", "MUFU", "1,", "FADD", "1"]  # predicates and modifiers dropped
    assert lines[2][6:] == ["STG", "2"]


def test_regions_hide_runs_below_the_share(tmp_path):
    res = run(tmp_path, "--regions")  # default: 0.5 % of the samples
    assert res.returncode == 0, res.stderr
    assert [l[0] for l in region_lines(res.stdout)] == ["0x00", "0x20", "0x50"]
