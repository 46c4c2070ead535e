#!/usr/bin/env python3
"""Where the fast forward's consumer warps spend their time, from the phase clocks that
FLAMIA_FWD_TRACE=FILE records (src/sm90/kit/phase_trace.cuh; the forward call writes FILE):

    FLAMIA_FWD_TRACE=fwd.trace build/flamia_bench --workloads fixed-16k --recipes fp8 --iters 1
    python3 tools/fwd_trace_summary.py fwd.trace

Each warp's marks split its time into the phase that ends at each mark: what comes before
the ring wait (from the softmax's end, or an item's set-up, to the next tile's stage wait; at
an item's end it also holds the wait for the next item's announcement), the ring wait (the
stage barrier's wait itself; traces before that mark existed count both as the ring wait),
P·V (issued, S(n + 1) issued behind it, P·V waited for), the fold (at D = 64 also S(n + 1)'s
issue; at D = 128 also the tile's row sums into l, since v110c), the wait for S, the softmax
in three parts (the maxima, with the wait for the key-scale warp's values; the exps; the
rest), the epilogue (with the release of the stages of tiles the warp does not compute) and
the next item's set-up (with the items a warp has no rows of). Printed: each phase's share
of the warps' traced time, the cycles a warp-tile, and how much of a warp's softmax time
another consumer warp of its scheduler (consumer warp w runs on scheduler w mod 4) spends in
its softmax too. The traced kernel is not the production kernel (the marks add ~60
instructions a warp-tile, and registers shift), and each mark adds ~170 cycles to the phase
it ends (one more mark lengthened the traced warp-tile by 167 cycles, H100): a phase of a few
hundred cycles is mostly its mark, so compare phases across versions, not against zero.
flamia_bench's time with the variable set also holds the trace's copies: set the cycles a
warp-tile printed here against the plain kernel's (its time x the SM clock / the tiles a
consumer warp computes).
"""
import argparse
import struct
import sys

EVENTS = ["item_start", "stage_landed", "scores_done", "softmax_done", "pv_done", "fold_done", "item_end",
          "maxima_done", "exps_done", "stage_wait"]
# The phase that ends at each mark. Inside the softmax, the marks split it into the maxima
# (with the key-scale wait and K's scales), the exps (with their partial sums and P's V
# scale) and what follows ("softmax": the row sums' merge and P8's packing; at D = 128 the
# sums' quad reduction is the fold's since v110c).
PHASE_OF = {"stage_wait": "before ring wait", "stage_landed": "ring wait", "pv_done": "P·V issue and wait",
            "fold_done": "fold", "scores_done": "S wait", "softmax_done": "softmax", "item_end": "epilogue",
            "item_start": "item set-up", "maxima_done": "softmax-maxima", "exps_done": "softmax-exps"}
EMPTY = (1 << 64) - 1


def read_trace(path):
    """Header dict and, per (cta, warp), the list of (event name, clock)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) != 64 or head[:8] != b"FLMTRACE":
            raise SystemExit(f"{path}: not a forward phase trace (no FLMTRACE header)")
        version, d, ctas, warps, cap, khz, _ = struct.unpack("<7q", head[8:])
        if version != 1:
            raise SystemExit(f"{path}: trace version {version}, this tool reads 1")
        body = f.read()
    if len(body) % 8:
        raise SystemExit(f"{path}: {len(body)} bytes of marks, not whole 64-bit words")
    words = struct.unpack(f"<{len(body) // 8}Q", body)
    if len(words) != ctas * warps * cap:
        raise SystemExit(f"{path}: {len(words)} marks, the header says {ctas * warps * cap}")
    marks = {}
    for c in range(ctas):
        for w in range(warps):
            row = words[(c * warps + w) * cap:(c * warps + w + 1) * cap]
            seq = []
            for x in row:
                if x == EMPTY:
                    break
                e = x >> 56
                if e >= len(EVENTS):
                    raise SystemExit(f"{path}: unknown event {e} (CTA {c}, warp {w})")
                seq.append((EVENTS[e], x & ((1 << 56) - 1)))
            marks[(c, w)] = seq
    return {"d": d, "ctas": ctas, "warps": warps, "cap": cap, "khz": khz}, marks


def phases(seq):
    """Per phase, the cycles spent in it (the interval from the previous mark), and the
    softmax intervals."""
    spent = {}
    softmax = []
    start = None  # the current softmax's start: its S done
    for (e0, t0), (e1, t1) in zip(seq, seq[1:]):
        if t1 < t0:
            raise SystemExit(f"clock went back: {t0} then {t1} at {e1}")
        spent[PHASE_OF[e1]] = spent.get(PHASE_OF[e1], 0) + (t1 - t0)
        if e0 == "scores_done":
            start = t0
        if e1 == "softmax_done" and start is not None:
            softmax.append((start, t1))
            start = None
    return spent, softmax


def union(intervals):
    """Sorted disjoint intervals covering the given ones."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(mine, others):
    """Cycles of the sorted disjoint intervals `mine` during which one of the sorted
    disjoint intervals `others` runs (a merge of the two lists)."""
    total, i, j = 0, 0, 0
    while i < len(mine) and j < len(others):
        lo, hi = max(mine[i][0], others[j][0]), min(mine[i][1], others[j][1])
        if hi > lo:
            total += hi - lo
        if mine[i][1] < others[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(head, marks):
    out = []
    per_phase, total_time, tiles = {}, 0, 0
    shared, softmax_time = 0, 0
    full = sum(1 for seq in marks.values() if len(seq) == head["cap"])
    for c in range(head["ctas"]):
        intervals = {}
        for w in range(head["warps"]):
            seq = marks[(c, w)]
            if len(seq) < 2:
                continue
            spent, sm = phases(seq)
            for k, v in spent.items():
                per_phase[k] = per_phase.get(k, 0) + v
            total_time += seq[-1][1] - seq[0][1]
            tiles += len(sm)
            intervals[w] = sm
        for w, sm in intervals.items():
            others = union([x for v, s in intervals.items() if v != w and v % 4 == w % 4 for x in s])
            softmax_time += sum(b - a for a, b in sm)
            shared += overlap(sm, others)
    if total_time == 0 or tiles == 0:
        raise SystemExit("no warp recorded a whole tile")
    out.append(f"D = {head['d']}: {head['ctas']} CTAs x {head['warps']} consumer warps traced, {tiles} warp-tiles, "
               f"{total_time / tiles:.0f} cycles a warp-tile")
    for k, v in sorted(per_phase.items(), key=lambda kv: -kv[1]):
        out.append(f"  {k:20s} {100.0 * v / total_time:5.1f} %   {v / tiles:7.0f} cycles a tile")
    inner = [k for k in per_phase if k.startswith("softmax-")]
    if inner:
        v = sum(per_phase[k] for k in inner) + per_phase.get("softmax", 0)
        out.append(f"  {'softmax in all':20s} {100.0 * v / total_time:5.1f} %   {v / tiles:7.0f} cycles a tile")
    if full:
        out.append(f"  note: {full} warps stopped at the cap of {head['cap']} marks; their later tiles are not "
                   f"counted, and the overlap after the first stop is undercounted")
    if softmax_time:
        out.append(f"  softmax time during which another consumer warp of the scheduler is in its softmax: "
                   f"{100.0 * shared / softmax_time:.1f} %")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    args = ap.parse_args()
    head, marks = read_trace(args.trace)
    print(summarize(head, marks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
