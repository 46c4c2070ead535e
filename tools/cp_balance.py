#!/usr/bin/env python3
"""Balance of the context-parallel sharding plan (flamia.distributed.plan_shards) on the
benchmark packs: causal-work and token imbalance (max / mean over ranks) per world size,
for the plan's rule and for zig-zag on every document. CPU only; needs torch.

    PYTHONPATH=python python3 tools/cp_balance.py [--world-sizes 2,4,8]
"""

import argparse

import torch

from flamia.distributed import balance, plan_shards
from flamia.workloads import WORKLOADS, long_tailed_lengths


PACKS = ("pack-32k", "pack-128k", "pack-512k", "one-128k-doc")


def pack_lengths(name: str):
    """Document lengths of a benchmark pack, or of the two context-parallel ones: pack-512k
    (the long-tailed recipe of WORKLOADS.md at 524288 tokens, default seed) and one-128k-doc."""
    if name == "pack-512k":
        return long_tailed_lengths(524288)
    if name == "one-128k-doc":
        return [131072]
    return list(WORKLOADS[name].lengths)


def packs():
    for name in PACKS:
        yield name, pack_lengths(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", default="2,4,8")
    world_sizes = [int(x) for x in ap.parse_args().world_sizes.split(",")]
    print("| pack | docs | P | split docs | work imbalance | token imbalance | every doc zig-zag: work / tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, lengths in packs():
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        cu = torch.tensor(cu, dtype=torch.int32)
        for p in world_sizes:
            plan = plan_shards(cu, p)
            b = balance(plan)
            z = balance(plan_shards(cu, p, whole_documents=False))
            print(f"| {name} | {len(lengths)} | {p} | {len(plan.split_docs)} | {b.work_imbalance:.4f} | "
                  f"{b.token_imbalance:.4f} | {z.work_imbalance:.4f} / {z.token_imbalance:.4f} |")


if __name__ == "__main__":
    main()
