#!/usr/bin/env python3
"""What each rank of the divided exchange computes, timed on one GPU: for a pack and a world
size P, every rank's local pack as flamia.distributed.attention(exchange="divide") builds it
(its whole documents, and per chunk [cC, end) of a cut document the local document [0, end)
with q_start = cC) runs one attention step (forward + backward) here, next to the whole pack.
The slowest rank's time against the whole pack's is the speedup the group could reach if the
exchange (the k, v all-gather and the dK/dV reduce-scatter) cost nothing: the compute side of
context parallelism, measurable without P GPUs. "gather" shows the same for the exchange that
computes every cut document whole on each rank holding part of it.

    python3 tools/cp_divide_share.py [--packs one-128k-doc,pack-512k] [--world-sizes 2,4] [--out DIR]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flamia  # noqa: E402
from cp_balance import pack_lengths  # noqa: E402
from cp_bench import step_fn, timed_step  # noqa: E402
from flamia.distributed import plan_shards  # noqa: E402


def step_ms(lengths, q_start, args, device) -> float:
    """Median ms of flamia.attention forward + backward over a pack of these documents (the
    inputs and the timing of tools/cp_bench.py)."""
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)
    qs = None if q_start is None else torch.tensor(q_start, dtype=torch.int32, device=device)
    run = step_fn(sum(lengths), args, device,
                  lambda q, k, v: flamia.attention(q, k, v, cu, max(lengths), causal=True, recipe=args.recipe,
                                                   q_start=qs))
    ms = timed_step(run, args.iters, args.warmup, device)
    del run  # its inputs
    torch.cuda.empty_cache()
    return ms


def local_packs(plan, rank):
    """(lengths, q_start) of a rank's local pack under the divided and the gathered exchange."""
    cut = set(plan.cut_docs)
    div_len, div_qs, gat_len = [], [], []
    for seg in plan.ranks[rank].segments:
        if seg.doc in cut:
            div_len.append(seg.end)
            div_qs.append(seg.start)
        else:
            div_len.append(seg.length)
            div_qs.append(0)
            gat_len.append(seg.length)
    gat_len += [plan.doc_length(d) for d in sorted({s.doc for s in plan.ranks[rank].segments} & cut)]
    return (div_len, div_qs), gat_len


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", default="one-128k-doc,pack-512k")
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--recipe", default="fp8")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flamia.gpu_available():
        print("cp_divide_share: needs an sm_90 GPU")
        return 77
    device = torch.device("cuda", 0)
    results = []
    for name in args.packs.split(","):
        lengths = pack_lengths(name)
        one = step_ms(lengths, None, args, device)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
        for P in (int(x) for x in args.world_sizes.split(",")):
            plan = plan_shards(cu, P)
            divide, gather = [], []
            for r in range(P):
                (dl, dq), gl = local_packs(plan, r)
                divide.append(step_ms(dl, dq, args, device) if dl else 0.0)
                gather.append(step_ms(gl, None, args, device) if gl else 0.0)
            rec = {"pack": name, "tokens": sum(lengths), "docs": len(lengths), "world_size": P,
                   "cut_docs": len(plan.cut_docs), "one_device_ms": one, "divide_rank_ms": divide,
                   "gather_rank_ms": gather, "divide_bound": one / max(divide), "gather_bound": one / max(gather)}
            results.append(rec)
            print(f"{name:14s} P={P} cut={rec['cut_docs']:2d} one {one:9.3f} ms | divide ranks "
                  + " ".join(f"{t:8.3f}" for t in divide) + f" -> {rec['divide_bound']:.2f}x | gather ranks "
                  + " ".join(f"{t:8.3f}" for t in gather) + f" -> {rec['gather_bound']:.2f}x", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cp_divide_share.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                       "flamia": flamia.library_version(), "recipe": args.recipe,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
