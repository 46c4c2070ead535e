#!/usr/bin/env python3
"""Context-parallel step time: one attention training step (forward + backward) of a pack on
one GPU against the same pack sharded over the ranks of a torch.distributed group
(flamia.distributed.plan_shards + flamia.distributed.attention). Prints per pack the one-GPU
time, every rank's time, the group's step time (the slowest rank), the speedup, the plan's
balance, the documents it cuts into chunks and the bytes each rank receives for them (whole
documents move nothing), and writes them as JSON. --exchange picks how cut documents are
exchanged (flamia.distributed.attention): "divide" (k, v in BF16 all-gathered, the chunks'
BF16 dK/dV partials sent to the ranks holding the keys; each rank computes only its own
query rows), "gather"
(q, k, v and dO in BF16 all-gathered; each rank computes the whole document), or "auto"
(the default: divide where possible).

    torchrun --nproc-per-node 2 tools/cp_bench.py [--packs pack-128k,pack-512k,one-128k-doc] [--exchange auto|divide|gather] [--out DIR]
    torchrun --nproc-per-node 2 tools/cp_bench.py --device cpu --lengths 40,70,30 --iters 1  # smoke test

Inputs: random BF16 q, k, v, dO; each rank generates only its own shard (the timing does not
depend on the values; python/tests/test_distributed_attention.py checks the results). The
one-GPU reference runs the whole pack on rank 0's device while the other ranks wait.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import flamia
from cp_balance import pack_lengths  # tools/: the benchmark packs and the two context-parallel ones
from flamia.distributed import _divide_layout, attention, balance, default_exchange, plan_shards


def timed_step(run, iters: int, warmup: int, device: torch.device) -> float:
    """Median milliseconds of run() (one forward + backward)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def step_fn(tokens: int, args, device, op):
    g = torch.Generator(device=device)
    g.manual_seed(1234 + tokens)

    def rn(h):
        return torch.randn((tokens, h, args.head_dim), generator=g, device=device).to(torch.bfloat16)

    q, k, v, dout = rn(args.hq).requires_grad_(), rn(args.hkv).requires_grad_(), rn(args.hkv).requires_grad_(), rn(args.hq)

    def run():
        out = op(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", default="pack-128k,pack-512k,one-128k-doc")
    ap.add_argument("--lengths", default="", help="comma-separated document lengths (a custom pack instead of --packs)")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--recipe", default="fp8")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--exchange", default="auto", choices=["auto", "divide", "gather"],
                    help="how cut documents are exchanged (flamia.distributed.attention's exchange)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    packs = [("custom", [int(x) for x in args.lengths.split(",")])] if args.lengths else \
        [(p, pack_lengths(p)) for p in args.packs.split(",")]

    results = []
    for name, lengths in packs:
        cu_list = [0]
        for n in lengths:
            cu_list.append(cu_list[-1] + n)
        cu = torch.tensor(cu_list, dtype=torch.int32)
        plan = plan_shards(cu, world)
        cut = set(plan.cut_docs)
        exchange = default_exchange(plan) if args.exchange == "auto" else args.exchange
        # Rows of cut documents each rank sends (all_gather pads to the largest). gather: q, k,
        # v in the forward and dO in the backward travel in BF16. divide: k, v in BF16 in the
        # forward; in the backward every chunk's BF16 dK/dV partial rows go to the ranks
        # holding those keys (one all_to_all; the most any rank receives).
        width = max(sum(s.length for s in rs.segments if s.doc in cut) for rs in plan.ranks)
        if exchange == "gather":
            bytes_in = (world - 1) * width * (2 * args.hq + 2 * args.hkv) * args.head_dim * 2
        else:
            partial_rows = max((sum(_divide_layout(plan, r, plan.cut_docs).recv_counts) for r in range(world)),
                               default=0) if cut else 0
            bytes_in = ((world - 1) * width + partial_rows) * 2 * args.hkv * args.head_dim * 2
        rec = {"pack": name, "docs": len(lengths), "tokens": cu_list[-1], "world_size": world,
               "hq": args.hq, "hkv": args.hkv, "head_dim": args.head_dim, "recipe": args.recipe,
               "exchange": exchange, "cut_docs": len(cut), "bytes_received_per_rank": bytes_in}
        # One device, the whole pack (rank 0; the others wait).
        one = None
        if rank == 0:
            run = step_fn(cu_list[-1], args, device,
                          lambda q, k, v: flamia.attention(q, k, v, cu.to(device), max(lengths),
                                                           recipe=args.recipe))
            one = timed_step(run, args.iters, args.warmup, device)
            del run
            if cuda:
                torch.cuda.empty_cache()
        dist.barrier()
        # Every rank its shard, at the same time.
        rs = plan.ranks[rank]
        run = step_fn(rs.num_tokens, args, device,
                      lambda q, k, v: attention(q, k, v, plan, rank, recipe=args.recipe, exchange=exchange))
        dist.barrier()
        mine = timed_step(run, args.iters, args.warmup, device)
        del run
        per_rank = [None] * world
        dist.all_gather_object(per_rank, mine)
        b = balance(plan)
        rec.update({"one_device_ms": one, "rank_ms": per_rank, "group_ms": max(per_rank),
                    "work_imbalance": b.work_imbalance, "token_imbalance": b.token_imbalance})
        if one is not None:
            rec["speedup"] = one / max(per_rank)
        results.append(rec)

    if rank == 0:
        print(f"{'pack':14s} {'docs':>5s} {'tokens':>8s} {'P':>2s} {'cut':>4s} {'exchange':>8s} {'MB in':>7s} {'1 GPU ms':>9s} "
              f"{'group ms':>9s} {'speedup':>8s} {'work imb.':>9s}  per-rank ms")
        for r in results:
            print(f"{r['pack']:14s} {r['docs']:5d} {r['tokens']:8d} {r['world_size']:2d} {r['cut_docs']:4d} {r['exchange']:>8s} "
                  f"{r['bytes_received_per_rank'] / 1e6:7.1f} {r['one_device_ms']:9.3f} {r['group_ms']:9.3f} "
                  f"{r['speedup']:8.2f} {r['work_imbalance']:9.4f}  " + " ".join(f"{t:.3f}" for t in r["rank_ms"]))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "cp_bench.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(device) if cuda else "cpu",
                           "torch": torch.__version__, "results": results}, f, indent=1)
    # Every rank past its last collective before any tears the group down: a rank that
    # destroys a gloo group while a peer still uses it can abort at exit.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main()
    # Leave without the interpreter's teardown: with a gloo group, a process sometimes aborts
    # there ("terminate called without an active exception", a thread of the collective
    # library destroyed while joinable) after every result was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
