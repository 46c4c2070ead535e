#!/usr/bin/env python3
"""Can a model learn to read the future through the attention's FP8 quantization scales?

Task. Each sequence (length S) is random filler tokens with one secret: a MARK token at
position t-1, a secret symbol x (uniform over K) at t, and a copy of x later, at t+g.
The loss is taken only at the MARK position, whose target is x. Under causal attention
nothing at positions <= t-1 carries information about x, so the best achievable held-out
loss is ln K, unless information from the future copy leaks backwards. Any held-out
loss clearly below ln K is therefore leakage.

Why a leak is possible with shared scales, and why it is hard to learn. With one scale
per (tensor, head), s = 2^ceil(log2(amax/448)) is set by the largest element anywhere in
the tensor, including tokens after t. Because s is a power of two, changing it does not
change how ordinary values round (E4M3 has the same relative precision throughout its
normal range); it only moves the subnormal/flush-to-zero threshold (|x| < s * 2^-10
becomes 0; |x| < s * 2^-6 loses precision). So a future token leaks only if (a) it is
about 2^15 or more times larger than the past values it affects, so that it sets the
scale, and (b) its magnitude depends on the secret. Gradient descent does not build (a)
or (b): the scale is a step function of amax (zero gradient) and the quantizer's
straight-through gradient ignores rounding, so no gradient points towards "make the
future token big in a secret-dependent way". Only the reading side (decoding whatever
x-dependent rounding already reaches position t-1) gets a gradient.

Two variants, therefore:
  amplified  the data supplies (a) and (b): the copy's input embedding is multiplied by
             2^(a0 + x) and the first layer's v projection reads the residual stream
             without RMSNorm, so the copy's magnitude reaches the quantizer. With
             per-tensor scales the secret then sets each head's V scale and flushes a
             secret-dependent set of small past values (the MARK token's own value
             included): a leak the model can learn to read. This is the positive test for
             the quantizer. q and k stay normalized so attention logits keep their usual
             size: with q and k both raw the copy's self-logit grows as 4^(a0 + x) (about
             2e9 at init), beyond what an online softmax can take (exp2(s*c - m*c) with
             m*c rounded to fp32 is off by up to ulp(m*c)/2 = 2^7 in the exponent there),
             so fused kernels overflow to Inf, the copy's row turns NaN, and 0 * NaN in
             the backward poisons every weight. Raw k alone keeps logits linear in the
             magnitude but they still reach ~1e6 after training (--raw-inputs kv).
  natural    a standard pre-norm model, all input magnitudes 1. A leak would need the
             model to discover (a) and (b) without gradient; expected: no leak.

Schemes: bf16_noncausal (BF16 without the causal mask: a control showing the task is
learnable when the future is visible), bf16, per_tensor_fp8 (emulation, one scale per
(sequence, head)), per_token_fp8 (emulation of flamia's per-token scales), fp8 and
fp8_mixed (flamia's kernels; skipped when flamia is not available).

Besides the learned loss, a direct check per scheme: the fraction of held-out sequences
whose logits at the MARK position change at all (bitwise) when only the future copy is
changed. For a causally safe scheme this must be exactly 0.

    python training/leakage_probe.py                       # all variants and schemes
    python training/leakage_probe.py --variants amplified --schemes bf16 per_tensor_fp8
Results: training/runs/leakage_probe.json (read by report.py).

A step whose loss or gradient norm is not finite is skipped (no optimizer update), the
first one is reported with the attention input magnitudes of that batch, and the count
is in the results ("nonfinite_steps", "first_nonfinite_step").
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as M  # noqa: E402

HERE = Path(__file__).resolve().parent
SCHEMES = ("bf16_noncausal", "bf16", "per_tensor_fp8", "per_token_fp8", "fp8", "fp8_mixed")
VARIANTS = ("amplified", "natural")
USE_AUTOCAST = True  # --no-autocast: fp32 model (attention inputs are still BF16), for CPU checks


def autocast(device: torch.device) -> Any:
    return M.autocast_ctx(device)() if USE_AUTOCAST else contextlib.nullcontext()


@dataclass
class Task:
    K: int = 8          # secret symbols: ids 0..K-1, chance loss ln K
    F: int = 16         # filler symbols: ids K..K+F-1
    S: int = 64         # sequence length
    t_lo: int = 4       # secret position t in [t_lo, t_hi)
    t_hi: int = 32
    g_lo: int = 2       # copy at t+g, g in [g_lo, g_hi]
    g_hi: int = 24
    a0: float = 11.0    # amplified copy magnitude 2^(a0 + x): V amax up to ~2^17, well
                        # inside bf16; the per-tensor power-of-two scale (<= 2^9) brings it
                        # under the E4M3 max of 448

    @property
    def mark(self) -> int:
        return self.K + self.F

    @property
    def bos(self) -> int:
        return self.K + self.F + 1

    @property
    def vocab(self) -> int:
        return self.K + self.F + 2


def make_batch(task: Task, rng: np.random.Generator, B: int, amplified: bool,
               force_x: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    S = task.S
    tok = rng.integers(task.K, task.K + task.F, size=(B, S))
    tok[:, 0] = task.bos
    rows = np.arange(B)
    t = rng.integers(task.t_lo, task.t_hi, size=B)
    g = rng.integers(task.g_lo, task.g_hi + 1, size=B)
    x = rng.integers(0, task.K, size=B)
    tok[rows, t - 1] = task.mark
    tok[rows, t] = x
    copy_x = x if force_x is None else force_x
    tok[rows, t + g] = copy_x
    scale = np.ones((B, S), dtype=np.float32)
    if amplified:
        scale[rows, t + g] = 2.0 ** (task.a0 + copy_x)
    mask = np.zeros((B, S), dtype=bool)
    mask[rows, t - 1] = True
    tgt = np.zeros((B, S), dtype=np.int64)
    tgt[rows, t - 1] = x
    return {"tokens": tok, "targets": tgt, "mask": mask, "scale": scale, "t": t, "g": g, "x": x}


def to_batch(d: dict[str, np.ndarray], S: int, device: torch.device) -> M.PackedBatch:
    B = d["tokens"].shape[0]
    return M.PackedBatch(
        tokens=torch.from_numpy(d["tokens"].reshape(-1)).to(device),
        cu_seqlens=(torch.arange(B + 1, dtype=torch.int32) * S).to(device),
        max_seqlen=S,
        targets=torch.from_numpy(d["targets"].reshape(-1)).to(device),
        loss_mask=torch.from_numpy(d["mask"].reshape(-1)).to(device),
        input_scale=torch.from_numpy(d["scale"].reshape(-1)).to(device),
        fixed_len=S,
    )


def build_model(task: Task, scheme: str, variant: str, scope: str, seed: int,
                device: torch.device, raw_inputs: str = "v") -> M.Model:
    kind = "bf16" if scheme == "bf16_noncausal" else scheme
    cfg = M.ModelConfig(vocab_size=task.vocab, d_model=128, n_layers=2, n_heads=2, n_kv_heads=1,
                        head_dim=64, ffn_hidden=384, max_seq_len=task.S, attention=kind,
                        causal=scheme != "bf16_noncausal", embed_init_std=1.0,
                        raw_attn_layers=1 if variant == "amplified" else 0, raw_attn_inputs=raw_inputs,
                        per_tensor_group=task.S if scope == "sequence" else None)
    torch.manual_seed(seed)
    return M.Model(cfg).to(device)


@torch.no_grad()
def evaluate(model: M.Model, task: Task, data: list[dict[str, np.ndarray]], device: torch.device) -> tuple[float, float]:
    ac = lambda: autocast(device)
    tot_loss, tot_acc, n = 0.0, 0.0, 0
    for d in data:
        b = to_batch(d, task.S, device)
        with ac():
            logits = model(M.PackedBatch(b.tokens, b.cu_seqlens, b.max_seqlen,
                                         input_scale=b.input_scale, fixed_len=b.fixed_len))
        lg, tg = logits[b.loss_mask], b.targets[b.loss_mask]
        tot_loss += torch.nn.functional.cross_entropy(lg, tg, reduction="sum").item()
        tot_acc += (lg.argmax(-1) == tg).sum().item()
        n += tg.numel()
    return tot_loss / n, tot_acc / n


@torch.no_grad()
def future_influence(model: M.Model, task: Task, amplified: bool, B: int, seed: int,
                     device: torch.device) -> float:
    """Fraction of sequences whose MARK-position logits change (bitwise) when only the
    future copy's symbol (and, if amplified, its magnitude) changes."""
    ac = lambda: autocast(device)
    rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
    a = make_batch(task, rng_a, B, amplified)
    other = (a["x"] + 1 + np.random.default_rng(seed + 1).integers(0, task.K - 1, size=B)) % task.K
    b = make_batch(task, rng_b, B, amplified, force_x=other)
    outs = []
    for d in (a, b):
        pb = to_batch(d, task.S, device)
        with ac():
            lg = model(M.PackedBatch(pb.tokens, pb.cu_seqlens, pb.max_seqlen,
                                     input_scale=pb.input_scale, fixed_len=pb.fixed_len))
        outs.append(lg[pb.loss_mask])
    changed = (outs[0] != outs[1]).any(dim=-1)
    return changed.float().mean().item()


@torch.no_grad()
def attn_magnitudes(model: M.Model, task: Task, b: M.PackedBatch) -> list[dict[str, float]]:
    """Per layer: max |q|, |k|, |v| as fed to attention and the max |scaled logit| over all
    same-sequence pairs (causal or not, so it bounds what any kernel sees)."""
    with autocast(b.tokens.device):
        qkv = model.capture_qkv(b)
    cu = b.cu_seqlens.tolist()
    out = []
    for q, k, v in qkv:
        finite = bool(torch.isfinite(q).all() and torch.isfinite(k).all() and torch.isfinite(v).all())
        out.append({"q": q.abs().max().item(), "k": k.abs().max().item(), "v": v.abs().max().item(),
                    "logit": M.max_attention_logit(q, k, cu, 1.0 / math.sqrt(q.shape[-1]), causal=False),
                    "finite": finite})
    return out


def fmt_magnitudes(mags: list[dict[str, float]]) -> str:
    return "; ".join(f"L{i} max|q| {m['q']:.3g} |k| {m['k']:.3g} |v| {m['v']:.3g} logit {m['logit']:.3g}"
                     + ("" if m["finite"] else " NON-FINITE") for i, m in enumerate(mags))


# Above this the fp32 rounding of an online softmax's running max (ulp(m)/2 in the exponent)
# starts to distort probabilities; far above it (~2^30) exp overflows.
LOGIT_WARN = 2.0 ** 16


def run_one(task: Task, scheme: str, variant: str, args: argparse.Namespace,
            device: torch.device) -> dict[str, Any]:
    amplified = variant == "amplified"
    tag = f"[{variant}/{scheme}]"
    model = build_model(task, scheme, variant, args.scale_scope, args.seed, device, args.raw_inputs)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    ac = lambda: autocast(device)
    # Same training and held-out sequences for every scheme.
    rng = np.random.default_rng(args.seed)
    eval_rng = np.random.default_rng(args.seed + 10_000)
    eval_data = [make_batch(task, eval_rng, args.batch, amplified) for _ in range(args.eval_batches)]
    influence_init = future_influence(model, task, amplified, 1024, args.seed + 20_000, device)
    probe_batch = to_batch(eval_data[0], task.S, device)
    mags_init = attn_magnitudes(model, task, probe_batch)
    print(f"  {tag} init: {fmt_magnitudes(mags_init)}", flush=True)
    t0 = time.perf_counter()
    curve: list[tuple[int, float]] = []
    run_loss, run_n, step, nonfinite = 0.0, 0, 0, 0
    first_nonfinite: Optional[dict[str, Any]] = None
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / 100)  # short warmup, then constant
        for gr in opt.param_groups:
            gr["lr"] = lr
        b = to_batch(make_batch(task, rng, args.batch, amplified), task.S, device)
        with ac():
            loss = model(b)
        loss.backward()
        # A finite loss can still come with NaN/Inf gradients (0 * Inf from rows the loss
        # ignores); clipping would then spread NaN into every weight, so check both.
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        lv = loss.item()
        if math.isfinite(lv) and math.isfinite(gnorm):
            opt.step()
            run_loss += lv
            run_n += 1
        else:
            nonfinite += 1
            if first_nonfinite is None:
                mags = attn_magnitudes(model, task, b)
                first_nonfinite = {"step": step, "loss": lv, "grad_norm": gnorm, "magnitudes": mags}
                print(f"  {tag} FIRST NON-FINITE STEP {step}: loss {lv}, grad norm {gnorm}; update "
                      f"skipped. Batch: {fmt_magnitudes(mags)}", flush=True)
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            mean = run_loss / run_n if run_n else float("nan")
            curve.append((step, mean))
            bad = f", {nonfinite} non-finite steps skipped so far" if nonfinite else ""
            print(f"  {tag} step {step}/{args.steps} train loss {mean:.4f} "
                  f"(chance {math.log(task.K):.4f}){bad} {time.perf_counter() - t0:.0f} s", flush=True)
            run_loss, run_n = 0.0, 0
        if args.max_seconds > 0 and time.perf_counter() - t0 > args.max_seconds:
            break
    seconds = time.perf_counter() - t0
    loss, acc = evaluate(model, task, eval_data, device)
    influence = future_influence(model, task, amplified, 1024, args.seed + 20_000, device)
    mags_final = attn_magnitudes(model, task, probe_batch)
    print(f"  {tag} final: {fmt_magnitudes(mags_final)}", flush=True)
    max_logit = max(m["logit"] for m in mags_init + mags_final)
    if max_logit > LOGIT_WARN:
        print(f"  {tag} WARNING: attention logit {max_logit:.3g} > {LOGIT_WARN:.3g}; fused softmax "
              "kernels may lose accuracy or overflow", flush=True)
    if not math.isfinite(loss):
        print(f"  {tag} WARNING: held-out loss is not finite", flush=True)
    chance = math.log(task.K)
    n_eval = args.batch * args.eval_batches
    leak = loss < chance - args.margin
    return {"variant": variant, "scheme": scheme, "steps": step, "seconds": seconds,
            "heldout_loss": loss, "heldout_acc": acc, "chance_loss": chance, "chance_acc": 1.0 / task.K,
            "acc_stderr_at_chance": math.sqrt((1 / task.K) * (1 - 1 / task.K) / n_eval),
            "n_eval": n_eval, "margin": args.margin, "leak_learned": leak,
            "future_influence_init": influence_init, "future_influence_final": influence,
            "nonfinite_steps": nonfinite, "first_nonfinite_step": first_nonfinite,
            "attn_magnitudes_init": mags_init, "attn_magnitudes_final": mags_final,
            "train_curve": curve, "scale_scope": args.scale_scope, "raw_inputs": args.raw_inputs}


def flamia_usable(device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, "needs a CUDA device"
    try:
        fl = M.load_flamia()
        q = torch.randn(128, 2, 64, device=device, dtype=torch.bfloat16)
        k = torch.randn(128, 1, 64, device=device, dtype=torch.bfloat16)
        cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=device)
        fl.attention(q, k, k, cu, 64, causal=True, recipe="fp8")
        torch.cuda.synchronize()
        return True, ""
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--schemes", nargs="+", choices=SCHEMES,
                    default=["bf16_noncausal", "bf16", "per_tensor_fp8", "per_token_fp8", "fp8"])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--max-seconds", type=float, default=40.0, help="cap per (variant, scheme); 0 = none")
    ap.add_argument("--batch", type=int, default=128, help="sequences per step")
    ap.add_argument("--eval-batches", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--margin", type=float, default=0.05, help="nats below ln K that count as a learned leak")
    ap.add_argument("--scale-scope", choices=("sequence", "pack"), default="sequence",
                    help="per_tensor_fp8: one scale per (sequence, head) or per (whole pack, head)")
    ap.add_argument("--raw-inputs", default="v", choices=("v", "kv", "qkv"),
                    help="amplified variant: first-layer projections that read the un-normalized "
                         "stream (qkv makes the copy's self-logit ~2e9: NaN in fused kernels)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--log-every", type=int, default=250)
    ap.add_argument("--out", type=Path, default=HERE / "runs" / "leakage_probe.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-autocast", action="store_true", help="run without bf16 autocast (CPU checks)")
    args = ap.parse_args(argv)
    global USE_AUTOCAST
    USE_AUTOCAST = not args.no_autocast
    device = torch.device(args.device)
    task = Task()

    fl_ok, fl_why = (True, "")
    if any(s in M.FLAMIA_KINDS for s in args.schemes):
        fl_ok, fl_why = flamia_usable(device)
        if not fl_ok:
            print(f"flamia unavailable ({fl_why}); skipping fp8/fp8_mixed", flush=True)
    results: list[dict[str, Any]] = []
    for variant in args.variants:
        for scheme in args.schemes:
            if scheme in M.FLAMIA_KINDS and not fl_ok:
                results.append({"variant": variant, "scheme": scheme, "skipped": fl_why})
                continue
            print(f"[probe] variant {variant}, scheme {scheme}", flush=True)
            r = run_one(task, scheme, variant, args, device)
            print(f"[probe] {variant}/{scheme}: held-out loss {r['heldout_loss']:.4f} (chance {r['chance_loss']:.4f}), "
                  f"acc {r['heldout_acc']:.3f} (chance {r['chance_acc']:.3f}), future influence "
                  f"{r['future_influence_final']:.3f} -> leak learned: {r['leak_learned']}", flush=True)
            results.append(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"task": task.__dict__, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                   else "cpu", "args": {k: str(v) for k, v in vars(args).items()}, "results": results}, f, indent=1)
    print(f"wrote {args.out}", flush=True)
    print(f"{'variant':<10} {'scheme':<15} {'loss':>7} {'acc':>6} {'influence':>9}  leak")
    for r in results:
        if "skipped" in r:
            print(f"{r['variant']:<10} {r['scheme']:<15} skipped: {r['skipped']}")
        else:
            print(f"{r['variant']:<10} {r['scheme']:<15} {r['heldout_loss']:7.4f} {r['heldout_acc']:6.3f} "
                  f"{r['future_influence_final']:9.3f}  {'YES' if r['leak_learned'] else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
