#!/usr/bin/env python3
"""Summarize an Nsight Compute source page (CSV, one row per SASS instruction).

    python3 tools/stall_summary.py sass_dkdv_kernel.csv [--top 40] [--by-count] [--regions]

Prints the columns found, the stall samples per opcode (all samples and not-issued samples,
with the executed warp instructions), and the instructions with the most samples with
their neighbours' opcodes, so that a stall can be traced to the dependency that causes it.
--by-count adds the samples by executions a warp and by place; --regions the code as runs of
consecutive instructions executed equally often (one such run is one path through the
source: a softmax variant, an epilogue), each with its executions a warp, its share of the
samples and its commonest opcodes.
Column names differ between Nsight Compute versions, so they are matched by substring.
"""
import argparse
import csv
import sys
from collections import defaultdict


def number(text):
    try:
        return float(text.replace(",", "")) if text not in ("", None) else 0.0
    except ValueError:
        return 0.0


def pick(header, *needles, avoid=()):
    for i, name in enumerate(header):
        low = name.lower()
        if all(n in low for n in needles) and not any(a in low for a in avoid):
            return i
    return None


def opcode(text):
    """The opcode of a SASS line, without its predicate and modifiers."""
    parts = text.split()
    if not parts:
        return "?"
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    return op.split(".")[0]


def regions(rows, tolerance=0.1):
    """Runs of consecutive rows whose execution counts are within `tolerance` (relative) of the
    run's first: [(first index, last index)]. Rows never executed form runs of their own."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or abs(rows[i] - rows[start]) > tolerance * max(rows[start], 1.0):
            runs.append((start, i - 1))
            start = i
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--by-count", action="store_true", help="samples by executions per warp")
    ap.add_argument("--regions", action="store_true", help="runs of instructions executed equally often")
    ap.add_argument("--min-share", type=float, default=0.5, help="--regions: least share of samples shown (%%)")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f)]
    start = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" == c for c in r)), None)
    if start is None:
        sys.exit("no header with 'Source' or 'Address' found; first lines: %r" % rows[:3])
    header, body = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    print("columns:", " | ".join(header))
    src = pick(header, "source")
    addr = pick(header, "address")
    samples = pick(header, "sampling", "all")
    not_issued = pick(header, "sampling", "not")
    executed = pick(header, "instructions executed", avoid=("predicated",))
    if src is None or samples is None:
        sys.exit("missing the source or the stall sampling column")
    reasons = [i for i, n in enumerate(header) if n.lower().startswith("stall") or "stall_" in n.lower()]
    total = sum(number(r[samples]) for r in body) or 1.0
    # Warps that ran the kernel: the first executed instruction's count (every warp runs it once).
    warps = 1.0
    if executed is not None:
        warps = next((number(r[executed]) for r in body if number(r[executed]) > 0), 0.0) or 1.0
    by_op = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in body:
        e = by_op[opcode(r[src].strip())]
        e[0] += number(r[samples])
        e[1] += number(r[not_issued]) if not_issued is not None else 0.0
        e[2] += number(r[executed]) if executed is not None else 0.0
        e[3] += 1
    print("\nsamples by opcode (share of all samples, not-issued samples, executed warp instructions, static count):")
    for op, (s, n, x, c) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"  {op:14s} {100 * s / total:6.2f} %  not-issued {n:10.0f}  executed {x:12.0f}  static {c}")
    if reasons:
        print("\nsamples by reason (all instructions):")
        sums = [(header[i], sum(number(r[i]) for r in body)) for i in reasons]
        for name, s in sorted(sums, key=lambda t: -t[1])[:14]:
            print(f"  {name:50s} {s:12.0f}")
    if args.by_count and executed is not None:
        buckets = [(0.0, 1.01, "once a warp or less"), (1.01, 4.0, "1-4 a warp"), (4.0, 16.0, "4-16"),
                   (16.0, 64.0, "16-64"), (64.0, float("inf"), "64 or more")]

        def runs_between(r, lo, hi):  # executions a warp in (lo, hi]; never-run rows count in the first
            rate = number(r[executed]) / warps
            return lo < rate <= hi or (lo == 0.0 and rate == 0.0)

        print(f"\nsamples by executions per warp ({warps:.0f} warps ran the first instruction):")
        for lo, hi, name in buckets:
            sel = [r for r in body if runs_between(r, lo, hi)]
            sm = sum(number(r[samples]) for r in sel)
            ex = sum(number(r[executed]) for r in sel)
            print(f"  {name:22s} {100 * sm / total:6.2f} % of samples  {ex / warps:10.1f} instructions a warp  static {len(sel)}")
        # Where those run: the loop spans the rows run at least a quarter as often as the
        # hottest; before it the prologue, inside it the rarer paths and (placed there by
        # ptxas) the epilogue.
        hot = max(number(r[executed]) for r in body)
        loop = [i for i, r in enumerate(body) if number(r[executed]) >= 0.25 * hot]
        lo, hi = min(loop), max(loop)
        hot_rate = 0.25 * hot / warps
        parts = [("before the loop", body[:lo], 0.0, float("inf")), ("after the loop", body[hi + 1:], 0.0, float("inf")),
                 ("loop span, once a warp", body[lo:hi + 1], 0.0, 1.01), ("loop span, 1-4 a warp", body[lo:hi + 1], 1.01, 4.0),
                 ("loop span, rarer", body[lo:hi + 1], 4.0, hot_rate), ("loop span, hot", body[lo:hi + 1], hot_rate, float("inf"))]
        print("samples by place (the top stall reasons of each, share of all samples):")
        for name, rs, a, b in parts:
            sel = [r for r in rs if runs_between(r, a, b)]
            sm = sum(number(r[samples]) for r in sel)
            why = defaultdict(float)
            for r in sel:
                for j in reasons:
                    if "not issued" not in header[j].lower():
                        why[header[j].replace("stall_", "")] += number(r[j])
            top = ", ".join(f"{k[:20]} {100 * v / total:.2f} %" for k, v in sorted(why.items(), key=lambda t: -t[1])[:4] if v > 0)
            print(f"  {name:24s} {100 * sm / total:6.2f} %  {top}")
    if args.regions and executed is not None:
        counts = [number(r[executed]) for r in body]
        print(f"\nregions: runs of instructions executed equally often, with >= {args.min_share} % of the samples")
        print("  (first address, instructions, executions a warp, share of samples, warp instructions a warp, commonest opcodes)")
        for a, b in regions(counts):
            rs = body[a:b + 1]
            share = 100 * sum(number(r[samples]) for r in rs) / total
            if share < args.min_share:
                continue
            ops = defaultdict(int)
            for r in rs:
                ops[opcode(r[src].strip())] += 1
            top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
            where = rs[0][addr] if addr is not None else str(a)
            print(f"  {where:>8s} {len(rs):5d}  {counts[a] / warps:9.1f}  {share:6.2f} %  "
                  f"{sum(counts[a:b + 1]) / warps:10.1f}  {top}")
    print(f"\ntop {args.top} instructions by samples (with the reasons above 10 % of the row):")
    order = sorted(range(len(body)), key=lambda i: -number(body[i][samples]))[: args.top]
    for i in sorted(order):
        r = body[i]
        why = ""
        if reasons:
            row_total = sum(number(r[j]) for j in reasons) or 1.0
            why = ", ".join(f"{header[j].replace('stall_', '')} {100 * number(r[j]) / row_total:.0f}%"
                            for j in sorted(reasons, key=lambda j: -number(r[j]))
                            if number(r[j]) > 0.1 * row_total)
        where = r[addr] if addr is not None else str(i)
        print(f"  {where:>8s} {100 * number(r[samples]) / total:5.2f} %  {r[src].strip()[:60]:60s} {why}")


if __name__ == "__main__":
    main()
