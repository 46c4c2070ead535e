#!/usr/bin/env python3
"""How much of the fast forward's consumer capacity idles on each workload, by item shape.

A CTA's consumer warpgroups (C of them, 64 query rows each) share one ring of key tiles, so an
item lasts as long as its busiest consumer; a consumer with fewer key tiles (one fewer on a
causal item's diagonal) or no rows in the item idles for the difference. This counts, per
workload of python/flamia/workloads.py, the idle share of the consumers' key-tile slots for
C = 2 (128-row items) and C = 3 (192-row items) with the odd 64-row blocks of a document in
its last item or in its first (docs/PERFORMANCE.md v85). Causal only; a model, not a timing.

    python3 tools/item_balance.py [--workloads fixed-4k,llama1b-pack]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flamia.workloads import WORKLOADS  # noqa: E402

ROWS, KEYS = 64, 128  # a consumer's rows; keys of a key tile


def items(length, consumers, odd_first):
    """Per item, each consumer's causal key tiles (0: no rows in the item)."""
    blocks = (length + ROWS - 1) // ROWS
    key_tiles = (length + KEYS - 1) // KEYS
    lead = blocks % consumers if odd_first else 0
    starts = ([0] if lead else []) + list(range(lead, blocks, consumers))
    out = []
    for i, b0 in enumerate(starts):
        nb = lead if (lead and i == 0) else min(consumers, blocks - b0)
        out.append([min((ROWS * (b0 + c) + ROWS - 1) // KEYS + 1, key_tiles) if c < nb else 0
                    for c in range(consumers)])
    return out


def idle_share(lengths, consumers, odd_first):
    busy = slots = 0
    for length in lengths:
        for tiles in items(length, consumers, odd_first):
            busy += sum(tiles)
            slots += consumers * max(tiles)
    return 1.0 - busy / slots


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    shapes = [(2, False), (3, False), (3, True)]
    print("| workload | docs | " + " | ".join(f"C = {c}, odd blocks {'first' if f else 'last'}" for c, f in shapes) + " |")
    print("|---|---|" + "---|" * len(shapes))
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        cells = [f"{100 * idle_share(w.lengths, c, f):.1f} %" for c, f in shapes]
        print(f"| {name} | {len(w.lengths)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
