"""Llama-style decoder for the training validation runs, with a selectable attention path.

Architecture: token embedding -> n_layers x [RMSNorm -> GQA attention with rotary
embeddings -> residual, RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> linear head.

Inputs are packed: one flat token axis of T tokens holding several documents, with
cu_seqlens (int32, [B+1]) marking document boundaries. Attention is causal inside a
document and never crosses a boundary; rotary positions restart at 0 in each document.

Attention kinds (`ModelConfig.attention` or `Model.set_attention`):
  bf16            exact attention in BF16 (PyTorch's FlashAttention-2 varlen op when it is
                  usable, otherwise one SDPA call per document)
  fp8, fp8_mixed  flamia.attention with that recipe (imported only when used)
  per_tensor_fp8  emulation: q/k/v rounded to E4M3 with ONE power-of-two scale per
                  (tensor, head) over the whole packed batch, then BF16 attention. This is
                  the scheme whose shared scale lets future tokens (and other documents)
                  change how a token is rounded; it exists for the leakage probe.
  per_token_fp8   emulation with one scale per (token, head), as flamia's numerics use;
                  the causally safe counterpart of per_tensor_fp8 that needs no GPU library.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_KINDS = ("bf16", "fp8", "fp8_mixed", "per_tensor_fp8", "per_token_fp8")
FLAMIA_KINDS = ("fp8", "fp8_mixed")
E4M3_MAX = 448.0


@dataclass
class ModelConfig:
    vocab_size: int = 264          # 256 bytes + BOS, padded to a multiple of 8
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int = 4
    head_dim: int = 64             # flamia supports 64 and 128
    ffn_hidden: int = 2304
    rope_theta: float = 10000.0
    max_seq_len: int = 4096        # longest document (rotary table size)
    norm_eps: float = 1e-5
    init_std: float = 0.02
    embed_init_std: float = 0.02
    attention: str = "bf16"
    causal: bool = True
    # Leakage probe only: the first `raw_attn_layers` layers feed the residual stream to
    # the projections named in `raw_attn_inputs` without RMSNorm, so an input token's
    # magnitude reaches the quantizer. The others read the normalized stream: with both q
    # and k raw, an amplified token's self-logit grows with the square of its magnitude.
    raw_attn_layers: int = 0
    raw_attn_inputs: str = "qkv"
    # Tokens per shared scale for per_tensor_fp8 (None: the whole packed batch).
    per_tensor_group: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# FP8 emulation (straight-through: the forward sees rounded values, the gradient is the
# identity, as FP8 training frameworks treat their quantizers).
# ---------------------------------------------------------------------------------------
def pow2_scale(amax: Tensor) -> Tensor:
    """2^ceil(log2(amax/448)) in fp32; 2^-126 (the smallest) where amax is 0 (same rule as
    flamia's scales, include/flamia/formats.h)."""
    amax = amax.float()
    s = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    return torch.where(amax > 0, s, torch.full_like(s, 2.0 ** -126))


def _round_e4m3(x: Tensor, scale: Tensor) -> Tensor:
    x32 = x.float()
    y = (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale
    return y.to(x.dtype)


def fake_quant_e4m3(x: Tensor, granularity: str, group: Optional[int] = None) -> Tensor:
    """Round x [T, H, D] to E4M3 and back with one scale per (token, head) or per
    (tensor, head); `group` splits the token axis into equal groups with one scale each."""
    with torch.no_grad():
        a = x.detach().abs()
        if granularity == "token":
            amax = a.amax(dim=2, keepdim=True)                       # [T, H, 1]
            y = _round_e4m3(x.detach(), pow2_scale(amax))
        elif granularity == "tensor":
            T, H, D = x.shape
            g = T if group is None else group
            if T % g != 0:
                raise ValueError(f"per-tensor group {g} does not divide T={T}")
            amax = a.view(T // g, g, H, D).amax(dim=(1, 3), keepdim=True)  # [T/g, 1, H, 1]
            y = _round_e4m3(x.detach().view(T // g, g, H, D), pow2_scale(amax)).view(T, H, D)
        else:
            raise ValueError(granularity)
    return x + (y - x).detach()


# ---------------------------------------------------------------------------------------
# BF16 varlen attention
# ---------------------------------------------------------------------------------------
def _sdpa_per_document(q: Tensor, k: Tensor, v: Tensor, cu: list[int], causal: bool,
                       scale: float) -> Tensor:
    """Reference path: one SDPA call per document (always correct, slower for many docs)."""
    rep = q.shape[1] // k.shape[1]
    outs = []
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        qd = q[s:e].transpose(0, 1).unsqueeze(0)
        kd = k[s:e].transpose(0, 1).unsqueeze(0)
        vd = v[s:e].transpose(0, 1).unsqueeze(0)
        if rep > 1:
            kd = kd.repeat_interleave(rep, dim=1)
            vd = vd.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _flash_varlen(q: Tensor, k: Tensor, v: Tensor, cu_t: Tensor, max_len: int, causal: bool,
                  scale: float) -> Tensor:
    """PyTorch's built-in FlashAttention-2 varlen kernel (differentiable aten op)."""
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_t, cu_t, max_len, max_len, 0.0, causal, False, scale=scale)[0]
    return out


_BF16_BACKEND: dict[str, str] = {}


def _select_bf16_backend(device: torch.device) -> str:
    """Pick the BF16 varlen path once per device type: FlashAttention-2 varlen if it runs
    (forward and backward, with GQA) and agrees with per-document SDPA, else SDPA."""
    key = device.type
    if key in _BF16_BACKEND:
        return _BF16_BACKEND[key]
    choice = "sdpa_per_document"
    if device.type == "cuda":
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            cu = [0, 100, 353, 384]
            mk = lambda h: torch.randn(384, h, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
            q, k, v = mk(4), mk(2), mk(2)
            cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
            o1 = _flash_varlen(q, k, v, cu_t, 253, True, 0.125)
            (g1,) = torch.autograd.grad(o1.float().square().sum(), (k,))
            o2 = _sdpa_per_document(q, k, v, cu, True, 0.125)
            (g2,) = torch.autograd.grad(o2.float().square().sum(), (k,))
            rel_o = ((o1.float() - o2.float()).norm() / o2.float().norm()).item()
            rel_g = ((g1.float() - g2.float()).norm() / g2.float().norm()).item()
            if rel_o < 2e-2 and rel_g < 5e-2:
                choice = "flash_varlen"
            else:
                print(f"[model] flash varlen disagrees with SDPA (O {rel_o:.3g}, dK {rel_g:.3g}); "
                      "using per-document SDPA", file=sys.stderr, flush=True)
        except Exception as e:  # kernel missing on this build/GPU: fall back
            print(f"[model] flash varlen unavailable ({type(e).__name__}: {e}); using per-document SDPA",
                  file=sys.stderr, flush=True)
    _BF16_BACKEND[key] = choice
    return choice


def bf16_backend_name(device: torch.device) -> str:
    return _select_bf16_backend(device)


def bf16_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                   causal: bool, scale: float, fixed_len: Optional[int] = None) -> Tensor:
    if fixed_len is not None:
        # Equal-length documents: one batched SDPA call (used by the leakage probe).
        T, H, D = q.shape
        B = T // fixed_len
        qb = q.view(B, fixed_len, H, D).transpose(1, 2)
        kb = k.view(B, fixed_len, k.shape[1], D).transpose(1, 2)
        vb = v.view(B, fixed_len, v.shape[1], D).transpose(1, 2)
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale,
                                           enable_gqa=kb.shape[1] != H)
        return o.transpose(1, 2).reshape(T, H, D)
    if _select_bf16_backend(q.device) == "flash_varlen":
        return _flash_varlen(q, k, v, cu_seqlens, max_seqlen, causal, scale)
    return _sdpa_per_document(q, k, v, cu_seqlens.tolist(), causal, scale)


_FLAMIA: Any = None


def load_flamia() -> Any:
    """Import flamia on first use; falls back to the repository's python/ folder."""
    global _FLAMIA
    if _FLAMIA is None:
        try:
            import flamia  # type: ignore
        except ImportError:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
            import flamia  # type: ignore
        _FLAMIA = flamia
    return _FLAMIA


def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, kind: str,
              causal: bool = True, scale: Optional[float] = None,
              per_tensor_group: Optional[int] = None, fixed_len: Optional[int] = None,
              low_memory: bool = False) -> Tensor:
    """Packed varlen attention: q [T,Hq,D], k/v [T,Hkv,D] -> [T,Hq,D] in q's dtype.
    low_memory: flamia's (flamia.attention), for the flamia kinds."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if kind == "bf16":
        return bf16_attention(q, k, v, cu_seqlens, max_seqlen, causal, scale, fixed_len)
    if kind in FLAMIA_KINDS:
        return load_flamia().attention(q, k, v, cu_seqlens, max_seqlen, causal=causal,
                                       softmax_scale=scale, recipe=kind, low_memory=low_memory)
    if kind == "per_tensor_fp8":
        q, k, v = (fake_quant_e4m3(t, "tensor", per_tensor_group) for t in (q, k, v))
        return bf16_attention(q, k, v, cu_seqlens, max_seqlen, causal, scale, fixed_len)
    if kind == "per_token_fp8":
        q, k, v = (fake_quant_e4m3(t, "token") for t in (q, k, v))
        return bf16_attention(q, k, v, cu_seqlens, max_seqlen, causal, scale, fixed_len)
    raise ValueError(f"unknown attention kind {kind!r}; choose from {ATTENTION_KINDS}")


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # statistics in fp32 whatever the autocast dtype
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rotary_tables(head_dim: int, max_len: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T,H,D]; cos/sin [T,1,D/2] (already gathered at each token's in-document position).
    Half-split convention: pairs (x[i], x[i+D/2])."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


def positions_in_document(cu_seqlens: Tensor, total: int) -> Tensor:
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    starts = torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    return torch.arange(total, device=cu.device) - starts


@dataclass
class PackedBatch:
    tokens: Tensor                      # [T] int64
    cu_seqlens: Tensor                  # [B+1] int32
    max_seqlen: int
    targets: Optional[Tensor] = None    # [T] int64
    loss_mask: Optional[Tensor] = None  # [T] bool; None = every position
    input_scale: Optional[Tensor] = None  # [T] float, multiplies the embedding (probe only)
    fixed_len: Optional[int] = None     # all documents this long (enables batched SDPA)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.hq, self.hkv, self.dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, self.hq * self.dh, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.hkv * self.dh, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.hkv * self.dh, bias=False)
        self.wo = nn.Linear(self.hq * self.dh, cfg.d_model, bias=False)
        self.kind = cfg.attention
        # When a list, forward() appends (q, k, v) after rotary (for logit/error probes).
        self.capture: Optional[list[tuple[Tensor, Tensor, Tensor]]] = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, batch: PackedBatch,
                xk: Optional[Tensor] = None, xv: Optional[Tensor] = None) -> Tensor:
        """x feeds q (and k/v unless xk/xv are given: raw-input probe layers)."""
        T = x.shape[0]
        q = self.wq(x).view(T, self.hq, self.dh)
        k = self.wk(x if xk is None else xk).view(T, self.hkv, self.dh)
        v = self.wv(x if xv is None else xv).view(T, self.hkv, self.dh)
        # The attention kernels take BF16 (autocast may be off, e.g. in CPU tests).
        q = apply_rotary(q, cos, sin).to(torch.bfloat16).contiguous()
        k = apply_rotary(k, cos, sin).to(torch.bfloat16).contiguous()
        v = v.to(torch.bfloat16).contiguous()
        if self.capture is not None:
            self.capture.append((q.detach(), k.detach(), v.detach()))
        o = attention(q, k, v, batch.cu_seqlens, batch.max_seqlen, self.kind, self.cfg.causal,
                      per_tensor_group=self.cfg.per_tensor_group, fixed_len=batch.fixed_len)
        o = o.reshape(T, self.hq * self.dh)
        if not torch.is_autocast_enabled(x.device.type):
            o = o.to(x.dtype)  # fp32 model without autocast (CPU tests)
        return self.wo(o)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.raw_inputs = cfg.raw_attn_inputs if layer < cfg.raw_attn_layers else ""
        if set(self.raw_inputs) - set("qkv"):
            raise ValueError(f"raw_attn_inputs {cfg.raw_attn_inputs!r}: use letters of 'qkv'")
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, batch: PackedBatch) -> Tensor:
        if self.raw_inputs:
            n = self.attn_norm(x) if self.raw_inputs != "qkv" else x
            h = {c: (x if c in self.raw_inputs else n) for c in "qkv"}
            x = x + self.attn(h["q"], cos, sin, batch, xk=h["k"], xv=h["v"])
        else:
            x = x + self.attn(self.attn_norm(x), cos, sin, batch)
        return x + self.mlp(self.mlp_norm(x))


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {cfg.attention!r}")
        if cfg.n_heads % cfg.n_kv_heads != 0:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        # Residual-branch outputs scaled down with depth so the stream's variance stays O(1).
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            if name.endswith("wo.weight") or name.endswith("w_down.weight"):
                nn.init.normal_(p, 0.0, out_std)
            elif name.startswith("embed"):
                nn.init.normal_(p, 0.0, self.cfg.embed_init_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_attention(self, kind: str) -> None:
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {kind!r}")
        self.cfg.attention = kind
        for b in self.blocks:
            b.attn.kind = kind

    def forward(self, batch: PackedBatch) -> Tensor:
        """Returns logits [T, V] (fp32) if batch.targets is None, else the mean
        cross-entropy over positions selected by loss_mask."""
        T = batch.tokens.shape[0]
        if batch.max_seqlen > self.cfg.max_seq_len:
            raise ValueError(f"document of {batch.max_seqlen} tokens > max_seq_len {self.cfg.max_seq_len}")
        pos = positions_in_document(batch.cu_seqlens, T)
        cos = self.rope_cos[pos].unsqueeze(1)
        sin = self.rope_sin[pos].unsqueeze(1)
        x = self.embed(batch.tokens)
        if batch.input_scale is not None:
            x = x * batch.input_scale.unsqueeze(-1).to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin, batch)
        logits = self.head(self.norm(x)).float()
        if batch.targets is None:
            return logits
        if batch.loss_mask is not None:
            logits, tgt = logits[batch.loss_mask], batch.targets[batch.loss_mask]
        else:
            tgt = batch.targets
        return F.cross_entropy(logits, tgt)

    # --- diagnostics -----------------------------------------------------------------
    @torch.no_grad()
    def capture_qkv(self, batch: PackedBatch) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Runs a forward pass and returns each layer's (q, k, v) as fed to attention."""
        store: list[tuple[Tensor, Tensor, Tensor]] = []
        for b in self.blocks:
            b.attn.capture = store
        try:
            self(PackedBatch(batch.tokens, batch.cu_seqlens, batch.max_seqlen,
                             input_scale=batch.input_scale, fixed_len=batch.fixed_len))
        finally:
            for b in self.blocks:
                b.attn.capture = None
        return store


@torch.no_grad()
def max_attention_logit(q: Tensor, k: Tensor, cu: list[int], scale: float, causal: bool = True,
                        max_elems: int = 1 << 26) -> float:
    """max |q.k| * scale over the pairs attention actually uses (same document, causal)."""
    hq, hkv = q.shape[1], k.shape[1]
    rep = hq // hkv
    best = 0.0
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        L = e - s
        qd = q[s:e].float()                                      # [L, Hq, D]
        kd = k[s:e].float().repeat_interleave(rep, dim=1)        # [L, Hq, D]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device)
        if causal:
            mask = torch.tril(mask)
        # Heads in chunks so an [H, L, L] block stays within max_elems.
        step = max(1, max_elems // max(1, L * L))
        for h0 in range(0, hq, step):
            sc = torch.einsum("ihd,jhd->hij", qd[:, h0:h0 + step], kd[:, h0:h0 + step]).abs()
            sc = sc.masked_fill(~mask, 0.0)
            best = max(best, sc.max().item() * scale)
    return best


def relative_error(a: Tensor, ref: Tensor) -> float:
    a32, r32 = a.float(), ref.float()
    return ((a32 - r32).norm() / r32.norm().clamp_min(1e-30)).item()


def autocast_ctx(device: torch.device) -> Callable[[], Any]:
    """bf16 autocast on CUDA; on CPU too (CPU autocast supports bf16), for smoke tests."""
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
