"""Forward and gradients of flamia.attention against exact float64 attention."""

import pytest

from flamia_testutil import require_gpu, make_pack, grads

torch = require_gpu()

from flamia.reference import attention_reference, rel_l2  # noqa: E402

CASES = [
    # lengths, Hq, Hkv, D, causal
    ([17, 128, 300, 64, 511], 4, 4, 128, True),
    ([17, 128, 300, 64, 511], 8, 2, 64, True),
    ([1, 2, 63, 65, 700], 4, 1, 128, True),
    ([200, 333], 4, 2, 128, False),
]


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
@pytest.mark.parametrize("lengths,hq,hkv,d,causal", CASES)
def test_matches_float64(recipe, lengths, hq, hkv, d, causal):
    q, k, v, dout, cu = make_pack(lengths, hq, hkv, d, seed=len(lengths) + hq + d)
    out, lse, dq, dk, dv = grads(q, k, v, cu, max(lengths), dout, causal=causal, recipe=recipe)
    torch.cuda.synchronize()
    ref = attention_reference(q, k, v, cu, causal, dout=dout)
    errs = {
        "o": rel_l2(out, ref.out),
        "dq": rel_l2(dq, ref.dq),
        "dk": rel_l2(dk, ref.dk),
        "dv": rel_l2(dv, ref.dv),
    }
    assert errs["o"] < 0.07, errs
    assert max(errs["dq"], errs["dk"], errs["dv"]) < 0.12, errs
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    assert float((lse.double() - ref.lse).abs().max()) < 0.25
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_explicit_softmax_scale():
    q, k, v, dout, cu = make_pack([100, 250], 4, 4, 64, seed=3)
    out, _, dq, dk, dv = grads(q, k, v, cu, 250, dout, causal=True, softmax_scale=0.3)
    ref = attention_reference(q, k, v, cu, True, softmax_scale=0.3, dout=dout)
    assert rel_l2(out, ref.out) < 0.07
    assert max(rel_l2(dq, ref.dq), rel_l2(dk, ref.dk), rel_l2(dv, ref.dv)) < 0.12


def test_noncontiguous_dout_and_strided_qkv():
    # q/k/v as views of one fused [T, 3, H, D] projection; dout transposed-contiguous.
    lengths = [64, 200]
    T, h, d = sum(lengths), 4, 128
    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    qkv = torch.randn((T, 3, h, d), generator=g, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    dout = torch.randn((h, T, d), generator=g, device="cuda").to(torch.bfloat16).transpose(0, 1)
    assert not dout.is_contiguous()
    cu = torch.tensor([0, 64, T], dtype=torch.int32, device="cuda")
    out, _, dq, dk, dv = grads(q, k, v, cu, 200, dout, causal=True)
    ref = attention_reference(q, k, v, cu, True, dout=dout)
    assert rel_l2(out, ref.out) < 0.07
    assert max(rel_l2(dq, ref.dq), rel_l2(dk, ref.dk), rel_l2(dv, ref.dv)) < 0.12


def test_flash_attn_varlen_func_matches_attention():
    import flamia

    q, k, v, dout, cu = make_pack([50, 300, 77], 8, 2, 128, seed=9)
    a = flamia.attention(q, k, v, cu, 300, causal=True)
    b = flamia.flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True)
    assert torch.equal(a, b)
    out, lse, none = flamia.flash_attn_varlen_func(q, k, v, cu, cu.clone(), 300, 300, causal=True,
                                                   return_attn_probs=True)
    assert torch.equal(out, a) and none is None and lse.shape == (8, q.shape[0])


def _saved_by_attention(q, k, v, cu, max_seqlen, recipe):
    """The tensors autograd keeps for flamia.attention's backward, and its output."""
    import flamia

    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = flamia.attention(q, k, v, cu, max_seqlen, recipe=recipe)
    return saved, out


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_saved_state_and_gradients_without_bf16_qkv(recipe):
    # On the GPU autograd keeps qkv8 instead of the BF16 v (the backward reads it from qkv8),
    # and with fp8 instead of q and k too; fp8_mixed's dS products read the BF16 q and k
    # themselves, so it keeps those two (docs/PERFORMANCE.md "Memory").
    from flamia import ops

    lengths = [17, 300, 64]
    q, k, v, dout, cu = make_pack(lengths, 8, 2, 128, seed=11)
    qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
    saved, out = _saved_by_attention(qr, kr, vr, cu, max(lengths), recipe)
    ptrs = {t.data_ptr() for t in saved}
    kept = [name for name, x in (("q", qr), ("k", kr), ("v", vr)) if x.data_ptr() in ptrs]
    assert kept == ([] if recipe == "fp8" else ["q", "k"]), [tuple(t.shape) for t in saved]
    # O, LSE, qkv8, cu_seqlens (and fp8_mixed's q, k) and nothing else
    bf16 = ["torch.bfloat16"] * (1 + len(kept))
    assert sorted(str(t.dtype) for t in saved) == bf16 + ["torch.float32", "torch.int32",
                                                          "torch.uint8"], [(t.dtype, tuple(t.shape)) for t in saved]
    dq, dk, dv = torch.autograd.grad(out, (qr, kr, vr), dout)
    # The same gradients as the explicit call that is given q, k, v.
    o2, lse2, qkv8 = ops.forward(q, k, v, cu, max(lengths), recipe=recipe)
    assert torch.equal(o2, out)
    ref = ops.backward(dout, q, k, v, o2, lse2, qkv8, cu, max(lengths), recipe=recipe)
    for a, b in zip((dq, dk, dv), ref):
        assert torch.equal(a, b)
