"""Helpers of the Python tests. require_gpu() first in GPU modules; the batch builders need
only torch (and transformers for collated_batch)."""

import os
from typing import List, Sequence, Tuple

import pytest


def require_gpu():
    """Skip the calling module unless torch, CUDA and a GPU-enabled libflamia.so are present.
    Returns the torch module."""
    strict = os.environ.get("FLAMIA_REQUIRE_GPU") == "1"

    def skip(reason: str):
        if strict:
            raise RuntimeError(f"FLAMIA_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason, allow_module_level=True)

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    import flamia
    from flamia import _lib

    try:
        lib = _lib.get()
    except flamia.FlamiaError as e:
        skip(f"libflamia.so unavailable: {e}")
    if not lib.gpu_available():
        skip(f"{lib.version()} has no usable GPU path on this device")
    return torch


def on_device(name: str) -> str:
    """name ("cpu" or "cuda") for a test parametrized over both; "cuda" first skips (or fails
    with FLAMIA_REQUIRE_GPU=1) without a usable GPU, as require_gpu()."""
    if name == "cuda":
        require_gpu()
    return name


def make_pack(lengths: Sequence[int], hq: int, hkv: int, d: int, seed: int = 0, scale_rows=None,
              device: str = "cuda"):
    """Random normal bf16 q/k/v/dout for a pack, and cu_seqlens (int32), on `device`."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    T = sum(lengths)

    def rn(h):
        return torch.randn((T, h, d), generator=g, device=device).to(torch.bfloat16)

    q, k, v, dout = rn(hq), rn(hkv), rn(hkv), rn(hq)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return q, k, v, dout, torch.tensor(cu, dtype=torch.int32, device=device)


def grads(q, k, v, cu, max_seqlen, dout, **kw) -> Tuple:
    """(out, lse, dq, dk, dv) through flamia.attention's autograd."""
    import torch
    import flamia

    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = flamia.attention(q, k, v, cu, max_seqlen, return_lse=True, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, lse, dq, dk, dv


def out_and_grads(q, k, v, dout, run) -> Tuple:
    """(out, dq, dk, dv) of out = run(q, k, v) on fresh leaves, backward from dout."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = run(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def assert_shards_equal(per_rank: Sequence[Tuple], plan, want: Tuple) -> None:
    """Every rank's (out, dq, dk, dv), unsharded with plan, equals want bit for bit."""
    import torch
    from flamia.distributed import unshard

    for i, name in enumerate(("out", "dq", "dk", "dv")):
        assert torch.equal(unshard([res[i] for res in per_rank], plan), want[i]), name


# The divided exchange's dK/dV bound (flamia.distributed.attention's docstring): max |dK - dK_1|
# <= DIVIDE_BOUND * max |dK_1| over each cut document (dK_1: the single-pack value).
DIVIDE_BOUND = 2.0 ** -6


def assert_divided_shards(per_rank: Sequence[Tuple], plan, want: Tuple) -> float:
    """exchange="divide": out and dq unshard to want's bit for bit; dk and dv of whole
    documents too, of cut documents within DIVIDE_BOUND. Returns the worst ratio
    max |diff| / max |want| over the cut documents."""
    import torch
    from flamia.distributed import unshard

    got = [unshard([res[i] for res in per_rank], plan) for i in range(4)]
    assert torch.equal(got[0], want[0]), "out"
    assert torch.equal(got[1], want[1]), "dq"
    cu, worst = plan.cu_seqlens, 0.0
    for i, name in ((2, "dk"), (3, "dv")):
        for d in range(len(cu) - 1):
            a, b = got[i][cu[d]:cu[d + 1]].float(), want[i][cu[d]:cu[d + 1]].float()
            if d not in plan.cut_docs:
                assert torch.equal(a, b), f"{name} of whole document {d}"
                continue
            diff, scale = float((a - b).abs().max()), float(b.abs().max())
            assert diff <= DIVIDE_BOUND * scale, f"{name} of cut document {d}: {diff} > 2^-6 * {scale}"
            worst = max(worst, diff / scale if scale else 0.0)
    return worst


def assert_same_or_within_spread(a, b, runs: List, name: str):
    """Bitwise equality when the reference runs are reproducible; otherwise (float atomics)
    |a - b| within 4x the run-to-run spread of the reference."""
    import torch

    if all(torch.equal(runs[0], r) for r in runs[1:]):
        assert torch.equal(a, b), f"{name}: not bitwise equal (reference runs are reproducible)"
        return
    spread = max(float((runs[0].float() - r.float()).abs().max()) for r in runs[1:])
    diff = float((a.float() - b.float()).abs().max())
    assert diff <= 4 * spread + 1e-6, f"{name}: max diff {diff} beyond 4x run-to-run spread {spread}"


def padded_batch(docs, S: int, side: str, device="cpu"):
    """Token rows padded to S on the right or the left, and their 0/1 attention mask."""
    import torch

    ids = torch.zeros((len(docs), S), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, d in enumerate(docs):
        cols = slice(0, len(d)) if side == "right" else slice(S - len(d), S)
        ids[b, cols], mask[b, cols] = d, 1
    return ids, mask


def collated_batch(transformers, docs, device="cpu"):
    """One packed row as DataCollatorWithFlattening(return_flash_attn_kwargs=True) makes it."""
    import torch

    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


# ---- parameter gradients of a transformers causal LM (packed vs per-document) ---------------
def packed_grads(model, ids, pos):
    """Gradients of the loss over one packed row (position_ids restart per document), labels
    as DataCollatorWithFlattening makes them: none at a document's first token, so that no
    document predicts the next one."""
    model.train()
    model.zero_grad(set_to_none=True)
    labels = ids.clone()
    labels[pos == 0] = -100
    model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss.backward()
    return {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}


def per_document_grads(model, docs):
    """The same loss terms as packed_grads, each document run on its own."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = 0.0
    for d in docs:
        loss = loss + model(input_ids=d[None], labels=d[None], use_cache=False).loss * (len(d) - 1)
    (loss / sum(len(d) - 1 for d in docs)).backward()
    return {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}


def grad_errors(got, want):
    """(relative L2 of all gradients together, {attention parameter: its relative L2})."""
    import torch
    from flamia.reference import rel_l2

    flat = rel_l2(torch.cat([got[n].flatten() for n in want]), torch.cat([want[n].flatten() for n in want]))
    attn = {n: rel_l2(got[n], want[n]) for n in want if "self_attn" in n}
    return flat, attn
