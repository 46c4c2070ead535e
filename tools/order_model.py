#!/usr/bin/env python3
"""A list-scheduling model of the backward launches' CTA orders (common/work_order.h).

CTAs start in index order on the first free SM (the hardware's greedy block scheduling), a
CTA costs its warpgroup steps plus a fixed 4 (dK/dV: the query tiles that see its 128 keys,
times the GQA group; dQ: the 64-key tiles its 128 queries see), and the work list is the
quantizer's (schedule.cuh: 128-token items, costliest first). For each order (kv heads a
block: 'all' = every head side by side) it prints the launches' summed makespan over an even
split of their work, and 'share': how many CTAs of one (document, head) stream run at a CTA's
midpoint, weighted by cost (1: every CTA reads its stream alone, from DRAM).

  python3 tools/order_model.py [--workloads fixed-4k,pack-32k] [--blocks all,1,2,4]
Stored-dS launches are modelled with --slabs 3,3,3,3,2,2 (heads a launch), else one launch of
every head. Causal only.
"""
import argparse
import heapq
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flamia.workloads import WORKLOADS  # noqa: E402


def work_list(lengths):
    """(document, tile) items sorted by decreasing tile index, documents by decreasing size."""
    nts = [(n + 127) // 128 for n in lengths]
    docs = sorted(range(len(lengths)), key=lambda b: -nts[b])
    return [(b, t) for t in range(max(nts) - 1, -1, -1) for b in docs if nts[b] > t]


def steps(kind, length, t, group):
    nt64, nt = (length + 63) // 64, (length + 127) // 128
    if kind == "dkdv":  # item t is key tile nt - 1 - t; query tiles from 2 (nt - 1 - t) on
        return group * (nt64 - 2 * (nt - 1 - t))
    return min(2 * (t + 1), nt64)  # dq: query tile t, key tiles up to its diagonal


def order(slots, heads, kv_heads, block):
    """(slot, head) of CTA x for x = 0.. (order::backward_cta)."""
    group = heads // kv_heads
    bh = block * group
    for b0 in range(0, heads, bh):
        for s in range(slots):
            for h in range(b0, b0 + bh):
                yield s, h


def simulate(kind, lengths, items, heads, kv_heads, block, group, sms):
    free = [(0.0, i) for i in range(sms)]
    heapq.heapify(free)
    spans = []
    for s, h in order(len(items), heads, kv_heads, block):
        b, t = items[s]
        cost = steps(kind, lengths[b], t, group) + 4
        t0, i = heapq.heappop(free)
        heapq.heappush(free, (t0 + cost, i))
        spans.append((t0, t0 + cost, (b, h // (heads // kv_heads) if kind == "dq" else h), cost))
    by_stream = defaultdict(list)
    for sp in spans:
        by_stream[sp[2]].append(sp)
    shared = sum(sp[3] * sum(1 for o in by_stream[sp[2]] if o[0] <= (sp[0] + sp[1]) / 2 < o[1]) for sp in spans)
    work = sum(sp[3] for sp in spans)
    return max(sp[1] for sp in spans), work / sms, shared / work


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="fixed-4k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack")
    ap.add_argument("--blocks", default="all,1,2,4")
    ap.add_argument("--slabs", default="", help="kv heads of each stored-dS dK/dV launch")
    args = ap.parse_args()
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        items = work_list(w.lengths)
        kinds = [("dkdv", [int(x) for x in args.slabs.split(",")])] if args.slabs else [("dkdv", [w.hkv]), ("dq", [w.hkv])]
        for kind, launches in kinds:
            group = w.hq // w.hkv
            sms = 132 * (2 if kind == "dq" and w.head_dim == 64 else 1)  # dQ at D = 64: two CTAs an SM
            cols = []
            for blk in args.blocks.split(","):
                end = lb = sh = 0.0
                for kv in launches:
                    heads = kv if kind == "dkdv" else kv * group
                    block = kv if blk == "all" else min(int(blk), kv)
                    e, l, s = simulate(kind, w.lengths, items, heads, kv, block, group if kind == "dkdv" else 1, sms)
                    end, lb, sh = end + e, lb + l, sh + s * l
                cols.append(f"{blk}: {end / lb:.3f} share {sh / lb:4.1f}")
            print(f"{name:13s} {kind:4s} launches {launches}: " + " | ".join(cols))


if __name__ == "__main__":
    main()
