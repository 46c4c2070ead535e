"""tools/fwd_trace_summary.py on a synthetic phase trace (no GPU): phases are the intervals
that end at each mark, and the softmax overlap counts only warps of the same scheduler."""
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EV = {"item_start": 0, "stage_landed": 1, "scores_done": 2, "softmax_done": 3, "pv_done": 4, "fold_done": 5,
      "item_end": 6, "maxima_done": 7, "exps_done": 8, "stage_wait": 9}
EMPTY = (1 << 64) - 1


def write_trace(path, warps, cap=16, d=128, ctas=1, version=1):
    """warps: per consumer warp of CTA 0, a list of (event, clock)."""
    head = b"FLMTRACE" + struct.pack("<7q", version, d, ctas, len(warps), cap, 1_800_000, 0)
    words = []
    for seq in warps:
        row = [(EV[e] << 56) | t for e, t in seq]
        words += row + [EMPTY] * (cap - len(row))
    path.write_bytes(head + struct.pack(f"<{len(words)}Q", *words))


def run(path):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "fwd_trace_summary.py"), str(path)],
                          capture_output=True, text=True)


def phase_lines(stdout):
    """The summary's lines after its header, by their name column (names may hold spaces)."""
    return {line[:22].strip(): line for line in stdout.splitlines()[1:]}


# One tile each after the item start: stage 10, S 20, softmax 40 (warp 0: 130..170).
def tile(t0):
    return [("item_start", t0), ("stage_landed", t0 + 10), ("scores_done", t0 + 30), ("softmax_done", t0 + 70),
            ("pv_done", t0 + 90), ("fold_done", t0 + 100), ("item_end", t0 + 110)]


def test_phases_and_same_scheduler_overlap(tmp_path):
    # Warps 0 and 4 share scheduler 0; warp 1 is on scheduler 1 with the same timing as 0.
    # Warp 4's softmax (120..160) overlaps warp 0's (100..140) by 20 of its 40 cycles.
    warps = [tile(70), tile(70), [], [], tile(90)]
    path = tmp_path / "t.trace"
    write_trace(path, warps)
    r = run(path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "3 warp-tiles" in out and "110 cycles a warp-tile" in out
    # softmax 40 of each warp's 110 cycles
    assert "36.4 %" in phase_lines(out)["softmax"], out
    # Warp 0: 20 of 40 shared with warp 4, warp 4 the same; warp 1 shares nothing: 40 / 120.
    assert "33.3 %" in out.splitlines()[-1], out


def test_softmax_parts_and_overlap_from_its_start(tmp_path):
    # The softmax (30..70) in three parts: maxima 10, exps 25, the rest 5; the overlap counts
    # the whole softmax, not its last part: warp 4 (50..90) shares 20 of warp 0's 40 cycles.
    def fine(t0):
        return [("item_start", t0), ("stage_landed", t0 + 10), ("scores_done", t0 + 30), ("maxima_done", t0 + 40),
                ("exps_done", t0 + 65), ("softmax_done", t0 + 70), ("pv_done", t0 + 90), ("fold_done", t0 + 100),
                ("item_end", t0 + 110)]
    path = tmp_path / "t.trace"
    write_trace(path, [fine(0), [], [], [], fine(20)])
    r = run(path)
    assert r.returncode == 0, r.stderr
    lines = phase_lines(r.stdout)
    assert "9.1 %" in lines["softmax-maxima"] and "22.7 %" in lines["softmax-exps"], r.stdout
    assert "4.5 %" in lines["softmax"], r.stdout
    assert "36.4 %" in lines["softmax in all"], r.stdout
    assert r.stdout.splitlines()[-1].endswith("50.0 %"), r.stdout


def test_stage_wait_splits_the_ring_wait(tmp_path):
    # The stage wait's mark splits what preceded the stage's landing: 6 cycles before the
    # barrier's wait (after the item set-up here), 4 in it; the rest as in tile().
    seq = tile(0)
    seq.insert(1, ("stage_wait", 6))
    path = tmp_path / "t.trace"
    write_trace(path, [seq])
    r = run(path)
    assert r.returncode == 0, r.stderr
    lines = phase_lines(r.stdout)
    assert "5.5 %" in lines["before ring wait"] and "3.6 %" in lines["ring wait"], r.stdout


def test_rejects_other_files(tmp_path):
    bad = tmp_path / "x.trace"
    bad.write_bytes(b"NOTATRACE" + bytes(100))
    r = run(bad)
    assert r.returncode != 0 and "FLMTRACE" in r.stderr
    path = tmp_path / "t.trace"
    write_trace(path, [[("stage_landed", 50), ("scores_done", 40)]])
    r = run(path)
    assert r.returncode != 0 and "clock went back" in r.stderr


def test_notes_warps_stopped_at_the_cap(tmp_path):
    path = tmp_path / "t.trace"
    write_trace(path, [tile(0)], cap=7)
    r = run(path)
    assert r.returncode == 0, r.stderr
    assert "1 warps stopped at the cap of 7 marks" in r.stdout
    write_trace(path, [tile(0)], cap=8)
    assert "stopped at the cap" not in run(path).stdout


@pytest.mark.parametrize("version", [2])
def test_rejects_other_versions(tmp_path, version):
    path = tmp_path / "t.trace"
    write_trace(path, [tile(0)], version=version)
    r = run(path)
    assert r.returncode != 0 and "version" in r.stderr
