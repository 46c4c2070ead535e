#!/usr/bin/env python3
"""Opcode histogram of one kernel's SASS, for the per-score instruction budget.

    cuobjdump -sass build/libflamia.so > all.sass      (or: nvdisasm -c kernel.cubin > all.sass)
    python3 tools/sass_histogram.py all.sass forward_fast_kernelILi128 [--scores-per-thread 64] [--trace QGMMA,LDL,STL]

Counts the instructions of the first function whose mangled name contains the pattern,
grouped by opcode (modifiers dropped: FMNMX.NAN -> FMNMX). The counts are static (code
size, not executions): the score loop is unrolled, so the masked and unmasked softmax
variants each appear once; divide by the scores one thread handles per key tile for a
per-score estimate of one variant.
"""
import argparse
import collections
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("pattern")
    ap.add_argument("--scores-per-thread", type=int, default=0)
    ap.add_argument("--listing", action="store_true", help="also print the function's SASS")
    ap.add_argument("--trace", default="",
                    help="comma-separated opcodes (e.g. QGMMA,LDL,STL,BAR; QGMMA is FP8 wgmma, HGMMA BF16): print where each occurs, in "
                         "code order, runs of one opcode folded, to see whether spills sit inside a loop")
    args = ap.parse_args()
    text = open(args.sass, encoding="utf-8", errors="replace").read().splitlines()
    counts = collections.Counter()
    listing = []
    trace_ops = set(filter(None, args.trace.split(",")))
    trace = []
    inside = False
    name = None
    for line in text:
        m = re.match(r"\s*(?:Function : |//-+ \.text\.)(\S+)", line)
        if m:
            if inside:
                break
            inside = args.pattern in m.group(1)
            name = m.group(1) if inside else None
            continue
        if not inside:
            continue
        listing.append(line)
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
        if m:
            offset, op = m.group(1), m.group(3)
            counts[op] += 1
            if op in trace_ops:
                if trace and trace[-1][0] == op:
                    trace[-1][2] += 1
                else:
                    trace.append([op, offset, 1])
    if not counts:
        print(f"no function matching {args.pattern!r}", file=sys.stderr)
        return 1
    total = sum(counts.values())
    print(f"function: {name}")
    print(f"instructions: {total}")
    for op, n in counts.most_common():
        extra = f"  {n / args.scores_per_thread:6.2f}/score" if args.scores_per_thread else ""
        print(f"{op:12s} {n:6d}{extra}")
    if trace_ops:
        print("trace (opcode at offset x run length):")
        print("  ".join(f"{op}@{off}x{n}" for op, off, n in trace))
    if args.listing:
        print("\n".join(listing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
