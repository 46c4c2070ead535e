"""torch.compile(fullgraph=True) through flamia's custom ops: no graph break, same bits."""

import pytest

from flamia_testutil import require_gpu, make_pack, assert_same_or_within_spread

torch = require_gpu()

import flamia  # noqa: E402


class PackedAttention(torch.nn.Module):
    """A module whose only arithmetic is flamia.attention (so eager and compiled must agree
    bitwise: no other kernel that inductor could fuse differently)."""

    def __init__(self, hq: int, hkv: int, d: int, recipe: str):
        super().__init__()
        self.hq, self.hkv, self.d, self.recipe = hq, hkv, d, recipe

    def forward(self, q_flat, k_flat, v_flat, cu, max_seqlen: int):
        T = q_flat.shape[0]
        q = q_flat.view(T, self.hq, self.d)
        k = k_flat.view(T, self.hkv, self.d)
        v = v_flat.view(T, self.hkv, self.d)
        out = flamia.attention(q, k, v, cu, max_seqlen, causal=True, recipe=self.recipe)
        return out.view(T, self.hq * self.d)


def _run(mod, q, k, v, cu, max_seqlen, dout):
    qf, kf, vf = (x.detach().reshape(x.shape[0], -1).clone().requires_grad_() for x in (q, k, v))
    out = mod(qf, kf, vf, cu, max_seqlen)
    dq, dk, dv = torch.autograd.grad(out, (qf, kf, vf), dout.reshape(out.shape))
    return out, dq, dk, dv


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_compile_fullgraph_matches_eager(recipe):
    torch._dynamo.reset()
    lengths, hq, hkv, d = [100, 300, 37], 8, 2, 128
    q, k, v, dout, cu = make_pack(lengths, hq, hkv, d, seed=21)
    mod = PackedAttention(hq, hkv, d, recipe)
    eager = [_run(mod, q, k, v, cu, 300, dout) for _ in range(2)]
    compiled = torch.compile(mod, fullgraph=True)
    got = _run(compiled, q, k, v, cu, 300, dout)
    torch.cuda.synchronize()
    assert torch.equal(got[0], eager[0][0]), "compiled forward differs from eager"
    for i, name in ((1, "dq"), (2, "dk"), (3, "dv")):
        assert_same_or_within_spread(got[i], eager[0][i], [e[i] for e in eager], name)


def test_compile_has_no_graph_break():
    torch._dynamo.reset()
    q, k, v, dout, cu = make_pack([64, 192], 4, 4, 64, seed=3)

    def f(q, k, v, cu):
        return flamia.attention(q, k, v, cu, 192, causal=True) * 2.0

    explanation = torch._dynamo.explain(f)(q, k, v, cu)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_inference_mode_forward_only():
    # Without grad the forward sizes a forward-only qkv8 buffer (smaller: no backward regions);
    # results are the same.
    from torch.utils._python_dispatch import TorchDispatchMode
    from flamia import _lib

    class QkvSizes(TorchDispatchMode):
        """The size of the qkv8 buffer each flamia::fwd call returns."""

        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.name().startswith("flamia::fwd"):
                self.sizes.append(out[2].numel())
            return out

    q, k, v, _, cu = make_pack([64, 192], 4, 4, 64, seed=8)
    sizes = {}
    for grad in (False, True):
        with torch.set_grad_enabled(grad), QkvSizes() as rec:
            out = flamia.attention(q.detach().requires_grad_(grad), k, v, cu, 192)
        assert len(rec.sizes) == 1
        sizes[grad] = (rec.sizes[0], out.detach())
    rid = _lib.recipe_id("fp8")
    assert sizes[False][0] == _lib.get().qkv8_bytes(256, 2, 4, 4, 64, rid, False)
    assert sizes[True][0] == _lib.get().qkv8_bytes(256, 2, 4, 4, 64, rid, True) > sizes[False][0]
    assert torch.equal(sizes[False][1], sizes[True][1])
