#!/usr/bin/env python3
"""What share of a training step attention takes, for one recipe: train.py's model and packs
timed as they train (forward, backward, optimizer step), once with the recipe's attention
and once with attention replaced by a stand-in that does no work (it returns q, so the shapes
and everything around attention stay); share = 1 - t_without / t_with, from the medians of
the timed steps after a warm-up. Both runs start from the same weights and see the same packs.
On a GPU each run's peak allocation (model, optimizer state, activations, attention's saved
state and workspace) is reported too, and their difference is what attention adds to a
training step's memory.

    python training/attention_share.py --recipe fp8
    python training/attention_share.py --recipe bf16 --head-dim 128 --pack-tokens 65536 --max-doc-len 16384
    python training/attention_share.py --recipe fp8_mixed --low-memory   # flamia.attention(low_memory=True)

Prints one JSON object (and appends it as a line to --out when given).
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as M  # noqa: E402
import train as TR  # noqa: E402
from packing import PackedCorpus  # noqa: E402


def no_attention(q, k, v, cu_seqlens, max_seqlen, kind, causal=True, scale=None, per_tensor_group=None,
                 fixed_len=None):
    return q


def time_steps(args: argparse.Namespace, device: torch.device, corpus: PackedCorpus,
               with_attention: bool) -> tuple:
    """The timed steps' seconds, and the run's peak allocation in MiB above what was allocated
    when it began, so that nothing an earlier run left (a cached workspace) counts; None on
    the CPU."""
    torch.manual_seed(args.seed)
    start = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    model = M.Model(TR.model_config(args.model_size, args.recipe, args.max_doc_len, args.head_dim)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    ac = M.autocast_ctx(device)
    real = M.attention
    M.attention = functools.partial(real, low_memory=args.low_memory) if with_attention else no_attention
    times = []
    try:
        for i in range(args.warmup + args.steps):
            batch = TR.to_device(corpus.pack(i), device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with ac():
                loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    finally:
        M.attention = real
    peak = (torch.cuda.max_memory_allocated(device) - start) / 2**20 if device.type == "cuda" else None
    return times, peak


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True, choices=M.ATTENTION_KINDS)
    ap.add_argument("--data-dir", type=Path, default=TR.HERE / "data")
    ap.add_argument("--model-size", choices=sorted(TR.MODEL_SIZES), default="base")
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--pack-tokens", type=int, default=32768)
    ap.add_argument("--max-doc-len", type=int, default=4096)
    ap.add_argument("--low-memory", action="store_true",
                    help="flamia's low_memory for every attention call (the flamia recipes)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="append the result as a JSON line")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    TR.check_recipe(args.recipe, device)
    if args.low_memory and args.recipe not in M.FLAMIA_KINDS:
        ap.error(f"--low-memory is flamia's: --recipe {args.recipe} has no such option")
    corpus = PackedCorpus(args.data_dir, "train", args.pack_tokens, args.max_doc_len, args.seed, shuffle=True)
    with_t, with_peak = time_steps(args, device, corpus, True)
    without_t, without_peak = time_steps(args, device, corpus, False)
    with_s, without_s = statistics.median(with_t), statistics.median(without_t)
    res = {"recipe": args.recipe, "low_memory": args.low_memory,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "model_size": args.model_size, "head_dim": args.head_dim, "pack_tokens": args.pack_tokens,
           "max_doc_len": args.max_doc_len, "steps": args.steps,
           "step_ms_with_attention": round(1e3 * with_s, 3), "step_ms_without_attention": round(1e3 * without_s, 3),
           "attention_ms": round(1e3 * (with_s - without_s), 3),
           "attention_share": round(1.0 - without_s / with_s, 4),
           "tokens_per_s": round(args.pack_tokens / with_s, 1)}
    if with_peak is not None:
        res.update(peak_mib_with_attention=round(with_peak, 1), peak_mib_without_attention=round(without_peak, 1),
                   attention_peak_mib=round(with_peak - without_peak, 1))
    print(json.dumps(res))
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
