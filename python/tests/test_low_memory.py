"""low_memory: the backward of one call without the stored dS (flamia.ops' docstring).

The gradients are bitwise those of the default call; on the GPU, fp8_mixed at head dim 128
allocates the stored dS's slab by default and not with low_memory (the peak falls by the
slab), fp8 never stores dS (the two calls are the same); FLAMIA_BWD_DQ=hbm, which requires
the stored dS, refuses low_memory by name. On the CPU specification (no workspace) and the
same on a GPU when there is one (skipped otherwise). Skips without torch."""

import pytest

torch = pytest.importorskip("torch")

import flamia  # noqa: E402
from flamia import FlamiaError, _lib, ops  # noqa: E402
from flamia_testutil import make_pack, out_and_grads, on_device  # noqa: E402

LENGTHS = [2200, 300, 77]
MIB = 1 << 20


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_low_memory_gives_the_same_gradients(device, recipe):
    lengths = LENGTHS if device == "cuda" else [70, 33]
    q, k, v, dout, cu = make_pack(lengths, 4, 2, 128, seed=5, device=on_device(device))
    runs = {}
    for low in (False, True):
        runs[low] = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(
            q, k, v, cu, max(lengths), recipe=recipe, low_memory=low))
    for name, a, b in zip(("out", "dq", "dk", "dv"), runs[False], runs[True]):
        assert torch.equal(a, b), name


def _backward_peak(q, k, v, dout, cu, recipe, low_memory) -> int:
    """Bytes above what was allocated before the backward, at the backward's peak."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = flamia.attention(q, k, v, cu, max(LENGTHS), recipe=recipe, low_memory=low_memory)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out.backward(dout)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_low_memory_leaves_out_the_stored_ds(recipe):
    on_device("cuda")
    hq, hkv, d = 4, 2, 128
    q, k, v, dout, cu = make_pack(LENGTHS, hq, hkv, d, seed=6)
    lib = _lib.get()
    args = ops._make_args(q, k, v, cu, max(LENGTHS), True, 0.0, recipe)
    fastest = lib.backward_workspace_bytes_for(args)
    plain = lib.backward_workspace_bytes(sum(LENGTHS), len(LENGTHS), hq, hkv, d, _lib.recipe_id(recipe))
    assert plain > 0 and fastest >= plain
    slab = fastest - plain
    # fp8_mixed at head dim 128 stores dS by default; fp8 never does.
    assert (slab >= 4 * MIB) if recipe == "fp8_mixed" else (slab == 0), slab
    default_peak = _backward_peak(q, k, v, dout, cu, recipe, False)
    low_peak = _backward_peak(q, k, v, dout, cu, recipe, True)
    # Everything else the backward allocates is the same; the allocator rounds blocks up.
    assert abs((default_peak - low_peak) - slab) <= 2 * MIB, (default_peak, low_peak, slab)


def test_low_memory_refused_where_the_stored_ds_is_required(monkeypatch):
    on_device("cuda")
    q, k, v, dout, cu = make_pack(LENGTHS, 4, 2, 128, seed=7)
    out, lse, qkv8 = ops.forward(q, k, v, cu, max(LENGTHS), recipe="fp8_mixed")
    monkeypatch.setenv("FLAMIA_BWD_DQ", "hbm")
    with pytest.raises(FlamiaError, match=r"low_memory=True .*FLAMIA_BWD_DQ=hbm"):
        ops.backward(dout, q, k, v, out, lse, qkv8, cu, max(LENGTHS), recipe="fp8_mixed", low_memory=True)
    # The same call without low_memory runs (the stored dS, as hbm asks).
    ops.backward(dout, q, k, v, out, lse, qkv8, cu, max(LENGTHS), recipe="fp8_mixed")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_low_memory_through_torch_compile(device):
    # The custom ops' schemas take low_memory last (bool low_memory=False): fullgraph tracing
    # gives the eager bits (on the CPU aot_eager: fake implementations and autograd, no code
    # generation).
    torch._dynamo.reset()
    lengths = LENGTHS if device == "cuda" else [70, 33]
    q, k, v, dout, cu = make_pack(lengths, 4, 2, 128, seed=8, device=on_device(device))

    def f(q, k, v):
        return flamia.attention(q, k, v, cu, max(lengths), recipe="fp8_mixed", low_memory=True)

    want = out_and_grads(q, k, v, dout, f)
    backend = "inductor" if device == "cuda" else "aot_eager"
    got = out_and_grads(q, k, v, dout, torch.compile(f, backend=backend, fullgraph=True))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name
