"""tools/sass_histogram.py on a synthetic SASS listing (no GPU, no build): per-opcode counts of
the matched function only, per-score division, and --trace's code-order runs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LISTING = """\
        Function : _Z5otherv
        /*0000*/                   FFMA R2, R3, R4, R5 ;
        Function : _ZN6flamia4sm9019forward_fast_kernelILi128EEEvNS1_6ParamsE
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;
        /*0040*/              @!P0 FMUL.FTZ R3, R3, R4 ;
        /*0050*/                   LDL R2, [R1] ;
        /*0060*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR12], R24 ;
        Function : _Z5laterv
        /*0000*/                   LDL R2, [R1] ;
"""


def run(tmp_path, *args):
    sass = tmp_path / "all.sass"
    sass.write_text(LISTING)
    return subprocess.run([sys.executable, str(ROOT / "tools" / "sass_histogram.py"), str(sass), *args],
                          capture_output=True, text=True)


def test_counts_only_the_matched_function(tmp_path):
    r = run(tmp_path, "forward_fast_kernelILi128E", "--scores-per-thread", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "function: _ZN6flamia4sm9019forward_fast_kernelILi128EEEvNS1_6ParamsE"
    assert lines[1] == "instructions: 7"
    counts = {l.split()[0]: (int(l.split()[1]), l.split()[2]) for l in lines[2:]}
    # predicated FMUL counted as FMUL (modifiers and guards dropped); FFMA and the later LDL
    # belong to other functions
    assert counts == {"QGMMA": (3, "1.50/score"), "MOV": (1, "0.50/score"), "STL": (1, "0.50/score"),
                      "FMUL": (1, "0.50/score"), "LDL": (1, "0.50/score")}


def test_trace_folds_runs_in_code_order(tmp_path):
    r = run(tmp_path, "forward_fast_kernelILi128E", "--trace", "QGMMA,LDL,STL")
    assert r.returncode == 0, r.stderr
    trace = r.stdout.splitlines()[-1]
    assert trace == "STL@0010x1  QGMMA@0020x2  LDL@0050x1  QGMMA@0060x1"


def test_no_match_fails(tmp_path):
    r = run(tmp_path, "dq_kernel")
    assert r.returncode == 1 and "no function matching" in r.stderr
