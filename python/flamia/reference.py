"""Exact attention in float64 with torch, for tests and the benchmark's accuracy columns.

Forward and backward are written out (no autograd) and processed in chunks of query rows,
so a long document needs O(chunk x L) memory rather than O(L^2): the benchmark checks
32k-token documents this way on the GPU. Any subset of documents and KV heads can be
computed (with all query heads that share those KV heads, so dK/dV are complete).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["Reference", "attention_reference", "rel_l2"]


@dataclass
class Reference:
    """Exact results on a subset: rows are the selected documents' tokens in order, heads the
    selected heads. Compare with x[ref.tokens][:, ref.q_heads] (see select_q / select_kv)."""

    tokens: Tensor          # int64 [Ts] token positions in the pack
    q_heads: List[int]
    kv_heads: List[int]
    out: Tensor             # [Ts, Hqs, D] float64
    lse: Tensor             # [Hqs, Ts] float64 (natural log)
    dq: Optional[Tensor]    # [Ts, Hqs, D]
    dk: Optional[Tensor]    # [Ts, Hkvs, D]
    dv: Optional[Tensor]

    def select_q(self, x: Tensor) -> Tensor:
        """x [T, Hq, D] -> the reference's rows/heads, float64."""
        idx = self.tokens.to(x.device)
        return x.index_select(0, idx)[:, self.q_heads].double()

    def select_kv(self, x: Tensor) -> Tensor:
        idx = self.tokens.to(x.device)
        return x.index_select(0, idx)[:, self.kv_heads].double()

    def select_lse(self, lse: Tensor) -> Tensor:
        idx = self.tokens.to(lse.device)
        return lse[self.q_heads].index_select(1, idx).double()


def rel_l2(a: Tensor, b: Tensor) -> float:
    """||a - b|| / ||b|| in float64 (b is the reference)."""
    a = a.detach().double()
    b = b.detach().double().to(a.device)
    den = torch.linalg.vector_norm(b)
    num = torch.linalg.vector_norm(a - b)
    return float(num / den) if float(den) > 0 else float(num)


def attention_reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Sequence[int] | Tensor,
                        causal: bool = True, softmax_scale: Optional[float] = None,
                        dout: Optional[Tensor] = None, docs: Optional[Sequence[int]] = None,
                        kv_heads: Optional[Sequence[int]] = None, chunk: int = 2048,
                        device: Optional[torch.device] = None) -> Reference:
    """Exact float64 attention (and its gradients when dout is given) on packed q/k/v.

    q [T, Hq, D], k/v [T, Hkv, D] (any float dtype), cu_seqlens [B+1]; docs: indices of the
    documents to compute (default all); kv_heads: KV heads to compute (default all), with
    every query head of their groups. Computes on `device` (default: q's device).
    """
    dev = torch.device(device) if device is not None else q.device
    cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    T, hq, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    group = hq // hkv
    scale = float(softmax_scale) if softmax_scale else 1.0 / math.sqrt(d)
    doc_ids = list(range(len(cu) - 1)) if docs is None else list(docs)
    kvh = list(range(hkv)) if kv_heads is None else list(kv_heads)
    qh = [j * group + g for j in kvh for g in range(group)]

    spans = [(cu[i], cu[i + 1]) for i in doc_ids]
    tokens = torch.cat([torch.arange(s, e, dtype=torch.int64) for s, e in spans]) if spans else \
        torch.zeros(0, dtype=torch.int64)
    ts = tokens.numel()
    f64 = dict(dtype=torch.float64, device=dev)
    out = torch.zeros((ts, len(qh), d), **f64)
    lse = torch.zeros((len(qh), ts), **f64)
    want_grad = dout is not None
    dq = torch.zeros((ts, len(qh), d), **f64) if want_grad else None
    dk = torch.zeros((ts, len(kvh), d), **f64) if want_grad else None
    dv = torch.zeros((ts, len(kvh), d), **f64) if want_grad else None

    row0 = 0
    for s, e in spans:
        n = e - s
        if n == 0:
            continue
        for jj, j in enumerate(kvh):
            kj = k[s:e, j].to(**f64)
            vj = v[s:e, j].to(**f64)
            for g in range(group):
                hh = jj * group + g      # index among the selected q heads
                h = j * group + g        # index in the pack
                qh_ = q[s:e, h].to(**f64)
                do_ = dout[s:e, h].to(**f64) if want_grad else None
                for i0 in range(0, n, chunk):
                    i1 = min(n, i0 + chunk)
                    # Causal rows i0..i1 see keys < i1 only; cut the columns to save work.
                    c1 = i1 if causal else n
                    sc = (qh_[i0:i1] @ kj[:c1].T) * scale
                    if causal:
                        rows = torch.arange(i0, i1, device=dev)[:, None]
                        cols = torch.arange(0, c1, device=dev)[None, :]
                        sc = sc.masked_fill(cols > rows, float("-inf"))
                    m = sc.amax(dim=1, keepdim=True)
                    p = torch.exp(sc - m)
                    l = p.sum(dim=1, keepdim=True)
                    p = p / l
                    o = p @ vj[:c1]
                    out[row0 + i0:row0 + i1, hh] = o
                    lse[hh, row0 + i0:row0 + i1] = (m + torch.log(l)).squeeze(1)
                    if want_grad:
                        doc = do_[i0:i1]
                        dp = doc @ vj[:c1].T
                        drow = (doc * o).sum(dim=1, keepdim=True)
                        ds = p * (dp - drow)
                        dq[row0 + i0:row0 + i1, hh] = (ds @ kj[:c1]) * scale
                        dk[row0:row0 + c1, jj] += (ds.T @ qh_[i0:i1]) * scale
                        dv[row0:row0 + c1, jj] += p.T @ doc
        row0 += n
    return Reference(tokens=tokens, q_heads=qh, kv_heads=kvh, out=out, lse=lse, dq=dq, dk=dk, dv=dv)
