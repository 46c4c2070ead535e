#!/usr/bin/env python3
"""Pretrain the Llama-style byte model with one attention recipe and log everything the
comparison needs.

    python training/train.py --recipe bf16
    python training/train.py --recipe fp8 --tokens 20e6
    python training/train.py --recipe fp8 --resume        # continue from the last checkpoint

Every recipe started with the same --seed starts from the same initial weights and sees the
same packs in the same order; only the attention path differs (the config record carries
fingerprints of both, so the report can check the pairing). Output: training/runs/<run-name>/
  log.jsonl   one JSON object per line: "config", "train" (every step), "eval" (held-out
              loss: mean over packs, its standard error, the per-pack losses), "diag" (per-layer max attention logit, O error vs BF16), "end"
  ckpt.pt     latest checkpoint (model, optimizer, step), written every --save-every steps
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as M  # noqa: E402
from packing import Pack, PackedCorpus, load_meta  # noqa: E402

HERE = Path(__file__).resolve().parent

MODEL_SIZES: dict[str, M.ModelConfig] = {
    # ~83M parameters: 12 x (GQA 12q/4kv heads of 64, SwiGLU 2304).
    "base": M.ModelConfig(),
    # For CPU smoke tests of the loop.
    "tiny": M.ModelConfig(d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64,
                          ffn_hidden=384),
}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True, choices=M.ATTENTION_KINDS)
    ap.add_argument("--run-name", default=None, help="default: the recipe name")
    ap.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    ap.add_argument("--data-dir", type=Path, default=HERE / "data")
    ap.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="base")
    ap.add_argument("--head-dim", type=int, default=None, help="override (64 or 128)")
    ap.add_argument("--tokens", type=float, default=20e6, help="training token budget (sets the schedule)")
    ap.add_argument("--pack-tokens", type=int, default=32768, help="tokens per packed batch (one step)")
    ap.add_argument("--max-doc-len", type=int, default=4096, help="longer documents are cut into pieces")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor as a fraction of --lr")
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-packs", type=int, default=0,
                    help="held-out packs per evaluation (0 = every pack of the held-out split)")
    ap.add_argument("--diag-every", type=int, default=150, help="steps between logit/O-error diagnostics")
    ap.add_argument("--diag-tokens", type=int, default=8192, help="tokens of the held-out sample for diagnostics")
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="stop (with a checkpoint; --resume continues) after this much wall time; 0 = no limit")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (costs compile time)")
    return ap.parse_args(argv)


def model_config(size: str, recipe: str, max_doc_len: int, head_dim: Optional[int]) -> M.ModelConfig:
    """The model of a size with a recipe's attention; head_dim overrides keep d_model."""
    cfg = replace(MODEL_SIZES[size], attention=recipe, max_seq_len=max_doc_len)
    if head_dim is not None:  # keep d_model = heads x head_dim
        cfg = replace(cfg, head_dim=head_dim, n_heads=cfg.d_model // head_dim,
                      n_kv_heads=max(1, cfg.d_model // head_dim // (cfg.n_heads // cfg.n_kv_heads)))
    return cfg


def to_device(p: Pack, device: torch.device) -> M.PackedBatch:
    nb = device.type == "cuda"
    return M.PackedBatch(
        tokens=torch.from_numpy(p.inputs).to(device, non_blocking=nb),
        targets=torch.from_numpy(p.targets).to(device, non_blocking=nb),
        cu_seqlens=torch.from_numpy(p.cu_seqlens).to(device, non_blocking=nb),
        max_seqlen=p.max_seqlen,
    )


def lr_at(step: int, total: int, args: argparse.Namespace) -> float:
    warm = max(1, int(args.warmup_frac * total))
    if step < warm:
        return args.lr * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    floor = args.lr * args.min_lr_frac
    return floor + 0.5 * (args.lr - floor) * (1 + math.cos(math.pi * t))


class JsonlLog:
    """Append-only JSONL; on resume, records after the checkpoint's step are dropped so
    the log equals that of an uninterrupted run."""

    def __init__(self, path: Path, resume_step: Optional[int]) -> None:
        self.path = path
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = []
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if rec.get("type") == "config" or rec.get("step", 0) <= resume_step:
                    if rec.get("type") != "end":
                        keep.append(line)
            path.write_text("".join(k + "\n" for k in keep))
        self.f = open(path, "a")

    def write(self, rec: dict[str, Any]) -> None:
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
                    train_s: float, args: argparse.Namespace) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                "train_seconds": train_s, "recipe": args.recipe, "seed": args.seed}, tmp)
    os.replace(tmp, path)  # atomic: a kill never leaves a half-written checkpoint


@torch.no_grad()
def evaluate(model: M.Model, val: PackedCorpus, n: int, device: torch.device) -> tuple[float, float, list[float]]:
    """Held-out loss on the first n packs (all if n is 0): the mean, its standard error
    over packs (the evaluation noise of the mean; nan for one pack), and the per-pack
    losses (every pack has the same number of tokens, so the mean is the token mean)."""
    ac = M.autocast_ctx(device)
    losses = []
    for i in range(val.packs_per_epoch if n <= 0 else min(n, val.packs_per_epoch)):
        with ac():
            losses.append(model(to_device(val.pack(i), device)).item())
    sem = float(np.std(losses, ddof=1) / math.sqrt(len(losses))) if len(losses) > 1 else float("nan")
    return float(np.mean(losses)), sem, losses


def init_fingerprint(model: torch.nn.Module) -> str:
    """Digest of the initial weights: equal across recipes run with the same seed."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def data_fingerprint(train: PackedCorpus, steps: int) -> str:
    """Digest of the first packs' tokens: equal across recipes run with the same seed."""
    h = hashlib.sha256()
    for i in range(min(steps, 4)):
        h.update(train.pack(i).inputs.tobytes())
    return h.hexdigest()[:16]


def diag_sample(val: PackedCorpus, n_tokens: int, device: torch.device) -> M.PackedBatch:
    p = val.pack(0)
    n = min(n_tokens, p.inputs.size)
    cu = p.cu_seqlens[p.cu_seqlens < n]
    cu = np.concatenate((cu, [n])).astype(np.int32)
    return to_device(Pack(p.inputs[:n], p.targets[:n], cu, int(np.diff(cu).max())), device)


@torch.no_grad()
def diagnostics(model: M.Model, sample: M.PackedBatch, recipe: str, device: torch.device) -> dict[str, Any]:
    """Per layer: the largest logit |q.k|*scale the attention sees, and (for non-BF16
    recipes) the relative L2 error of the recipe's O against BF16 attention and of both
    against fp32 attention, all on the same q/k/v."""
    ac = M.autocast_ctx(device)
    with ac():
        qkv = model.capture_qkv(sample)
    cu = sample.cu_seqlens.tolist()
    scale = 1.0 / math.sqrt(model.cfg.head_dim)
    out: dict[str, Any] = {"max_logit": [], "o_err_vs_bf16": [], "o_err_vs_fp32": [], "bf16_err_vs_fp32": []}
    for q, k, v in qkv:
        out["max_logit"].append(M.max_attention_logit(q, k, cu, scale))
        if recipe == "bf16":
            continue
        o_ref = M.attention(q, k, v, sample.cu_seqlens, sample.max_seqlen, "bf16")
        o_rec = M.attention(q, k, v, sample.cu_seqlens, sample.max_seqlen, recipe)
        o_32 = M._sdpa_per_document(q.float(), k.float(), v.float(), cu, True, scale)
        out["o_err_vs_bf16"].append(M.relative_error(o_rec, o_ref))
        out["o_err_vs_fp32"].append(M.relative_error(o_rec, o_32))
        out["bf16_err_vs_fp32"].append(M.relative_error(o_ref, o_32))
    return out


def check_recipe(recipe: str, device: torch.device) -> None:
    """Fail fast (exit 3) if a flamia recipe cannot run, before any time is spent."""
    if recipe not in M.FLAMIA_KINDS:
        return
    try:
        fl = M.load_flamia()
        g = torch.Generator(device="cpu").manual_seed(0)
        q = torch.randn(256, 4, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
        k = torch.randn(256, 2, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
        v = torch.randn(256, 2, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
        cu = torch.tensor([0, 100, 256], dtype=torch.int32, device=device)
        o = fl.attention(q, k, v, cu, 156, causal=True, recipe=recipe)
        o.float().sum().backward()
        torch.cuda.synchronize()
    except Exception as e:
        print(f"error: recipe {recipe} needs the flamia package with GPU kernels: {type(e).__name__}: {e}\n"
              "(build it with tools/build.sh and put python/ on PYTHONPATH)", file=sys.stderr, flush=True)
        sys.exit(3)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = args.run_name or args.recipe
    run_dir: Path = args.runs_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / "ckpt.pt"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    check_recipe(args.recipe, device)

    if not (args.data_dir / "meta.json").exists():
        print(f"error: no corpus in {args.data_dir}; run training/prepare_data.py first", file=sys.stderr)
        return 2
    meta = load_meta(args.data_dir)
    train = PackedCorpus(args.data_dir, "train", args.pack_tokens, args.max_doc_len, args.seed, shuffle=True)
    val = PackedCorpus(args.data_dir, "val", args.pack_tokens, args.max_doc_len, args.seed, shuffle=False)
    total_steps = max(1, math.ceil(args.tokens / args.pack_tokens))

    cfg = model_config(args.model_size, args.recipe, args.max_doc_len, args.head_dim)
    torch.manual_seed(args.seed)  # identical initial weights for every recipe
    model = M.Model(cfg).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, args.beta2), eps=1e-8,
                            fused=device.type == "cuda")
    step, train_s = 0, 0.0
    fingerprint = init_fingerprint(model)
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ck.get("recipe") != args.recipe:
            print(f"error: {ckpt_path} is a {ck.get('recipe')} run, not {args.recipe}", file=sys.stderr)
            return 2
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        step, train_s = int(ck["step"]), float(ck["train_seconds"])
        print(f"resumed {ckpt_path} at step {step}", flush=True)
    elif args.resume:
        print(f"no checkpoint in {run_dir}; starting from scratch", flush=True)
    log = JsonlLog(run_dir / "log.jsonl", step if (args.resume and step > 0) else None)
    fwd = torch.compile(model) if args.compile else model

    backend = M.bf16_backend_name(device)
    if step == 0:
        log.write({"type": "config", "recipe": args.recipe, "run": name, "params": model.num_params(),
                   "model": cfg.to_dict(), "args": {k: str(v) for k, v in vars(args).items()},
                   "total_steps": total_steps, "tokens_per_step": args.pack_tokens,
                   "bf16_backend": backend, "device": torch.cuda.get_device_name(device)
                   if device.type == "cuda" else "cpu", "torch": torch.__version__,
                   "seed": args.seed, "init_fingerprint": fingerprint,
                   "data_fingerprint": data_fingerprint(train, total_steps),
                   "corpus": {"name": meta.get("name", args.data_dir.name), "packages": meta.get("packages"),
                              "sources": meta["sources"], "train_tokens": train.n_tokens,
                              "val_tokens": val.n_tokens, "val_packs": val.packs_per_epoch}})
    print(f"[{name}] {model.num_params() / 1e6:.1f}M params, recipe {args.recipe}, bf16 path {backend}, "
          f"{total_steps} steps x {args.pack_tokens} tokens = {total_steps * args.pack_tokens / 1e6:.1f}M tokens "
          f"({total_steps * args.pack_tokens / train.n_tokens:.2f} epochs of {train.n_tokens / 1e6:.1f}M)",
          flush=True)

    sample = diag_sample(val, args.diag_tokens, device)
    ac = M.autocast_ctx(device)

    def eval_and_diag(s: int, force_diag: bool = False) -> Optional[float]:
        vl = None
        if s % args.eval_every == 0 or s == total_steps:
            vl, sem, per_pack = evaluate(model, val, args.eval_packs, device)
            log.write({"type": "eval", "step": s, "tokens": s * args.pack_tokens, "val_loss": vl,
                       "val_loss_sem": sem, "val_packs": len(per_pack), "val_pack_losses": per_pack})
            print(f"  eval step {s}: held-out {vl:.4f} ± {sem:.4f} (standard error over {len(per_pack)} packs)",
                  flush=True)
        if s % args.diag_every == 0 or s == total_steps or force_diag:
            d = diagnostics(model, sample, args.recipe, device)
            log.write({"type": "diag", "step": s, **d})
            msg = f"  diag step {s}: max logit per layer {[round(x, 1) for x in d['max_logit']]}"
            if d["o_err_vs_bf16"]:
                msg += f", O rel err vs bf16 max {max(d['o_err_vs_bf16']):.4f}"
            print(msg, flush=True)
        return vl

    t_start = time.perf_counter()
    if step == 0:
        eval_and_diag(0)
    last_val: Optional[float] = None
    win_tokens, win_time = 0, 0.0
    truncated = False
    while step < total_steps:
        if args.max_minutes > 0 and time.perf_counter() - t_start > args.max_minutes * 60:
            truncated = True
            break
        lr = lr_at(step, total_steps, args)
        for gr in opt.param_groups:
            gr["lr"] = lr
        batch = to_device(train.pack(step), device)
        t0 = time.perf_counter()
        with ac():
            loss = fwd(batch)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        loss_v, gnorm_v = loss.item(), gnorm.item()  # one sync per step
        finite = math.isfinite(loss_v) and math.isfinite(gnorm_v)
        if finite:
            opt.step()  # a non-finite step is skipped and counted, not applied
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        train_s += dt
        step += 1
        win_tokens += args.pack_tokens
        win_time += dt
        rec = {"type": "train", "step": step, "tokens": step * args.pack_tokens, "loss": loss_v,
               "grad_norm": gnorm_v, "lr": lr, "tok_per_s": args.pack_tokens / dt,
               "train_seconds": train_s, "n_docs": int(batch.cu_seqlens.numel() - 1)}
        if not finite:
            rec["skipped"] = True
        log.write(rec)
        v = eval_and_diag(step)
        if v is not None:
            last_val = v
        if step % args.log_every == 0 or step == total_steps or step == 1:
            tps = win_tokens / max(win_time, 1e-9)
            eta = (total_steps - step) * args.pack_tokens / max(tps, 1e-9)
            vs = f" val {last_val:.4f}" if last_val is not None else ""
            print(f"[{name}] step {step}/{total_steps} loss {loss_v:.4f}{vs} gnorm {gnorm_v:.3f} "
                  f"lr {lr:.2e} {tps / 1e3:.1f}k tok/s eta {eta / 60:.1f} min", flush=True)
            win_tokens, win_time = 0, 0.0
        if step % args.save_every == 0 and step < total_steps:
            save_checkpoint(ckpt_path, model, opt, step, train_s, args)

    save_checkpoint(ckpt_path, model, opt, step, train_s, args)
    end: dict[str, Any] = {"type": "end", "step": step, "tokens": step * args.pack_tokens,
                           "train_seconds": train_s, "wall_seconds": time.perf_counter() - t_start,
                           "truncated": truncated}
    if device.type == "cuda":
        end["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    if truncated:
        print(f"[{name}] stopped at step {step}/{total_steps} (--max-minutes); rerun with --resume to continue",
              flush=True)
    log.write(end)
    print(f"[{name}] done: {step} steps, {train_s:.0f} s of training, "
          f"{step * args.pack_tokens / max(train_s, 1e-9) / 1e3:.1f}k tok/s mean", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
