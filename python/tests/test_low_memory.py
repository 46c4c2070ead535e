"""low_memory: one call of recipe fp8_mixed in less memory (flamia.ops' docstring).

The outputs and gradients are bitwise those of the default call. On the GPU: fp8_mixed at
head dim 128 allocates the stored dS's slab by default and not with low_memory (the step's
peak falls by the slab); with fp8_mixed, what autograd keeps from the forward to the backward
falls by the whole quantized buffer (qkv8: the BF16 q, k, v are kept instead, which the
caller holds here anyway), at both head dims; fp8 never stores dS and keeps qkv8 either way
(the two calls are the same). FLAMIA_BWD_DQ=hbm, which requires the stored dS, refuses
low_memory by name; a backward told to quantize again (an empty qkv8) without v says so. On
the CPU specification (no workspace, no qkv8 kept) and the same on a GPU when there is one
(skipped otherwise). Skips without torch."""

import pytest

torch = pytest.importorskip("torch")

import flamia  # noqa: E402
from flamia import FlamiaError, _lib, ops  # noqa: E402
from flamia_testutil import make_pack, out_and_grads, on_device  # noqa: E402

LENGTHS = [2200, 300, 77]
# Long enough that qkv8 (13-28 MiB here) stands well above the allocator's rounding.
LONG = [8192, 2200, 300, 77]
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


def _step_memory(q, k, v, dout, cu, max_seqlen, recipe, low_memory):
    """(bytes kept from the forward to the backward, bytes at the step's peak), both above what
    was allocated before the forward (q, k, v and dout, which the caller holds)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flamia.attention(q, k, v, cu, max_seqlen, recipe=recipe, low_memory=low_memory)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    out.backward(dout)
    torch.cuda.synchronize()
    return kept, torch.cuda.max_memory_allocated() - before


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_low_memory_keeps_less_and_leaves_out_the_stored_ds(recipe, d):
    on_device("cuda")
    hq, hkv, T, B, L = 8, 4, sum(LONG), len(LONG), max(LONG)
    q, k, v, dout, cu = make_pack(LONG, hq, hkv, d, seed=6)
    lib = _lib.get()
    rid = _lib.recipe_id(recipe)
    args = ops._make_args(q, k, v, cu, L, True, 0.0, recipe)
    fastest = lib.backward_workspace_bytes_for(args)
    plain = lib.backward_workspace_bytes(T, B, hq, hkv, d, rid)
    assert plain > 0 and fastest >= plain
    slab = fastest - plain
    # fp8_mixed at head dim 128 stores dS by default; fp8 and head dim 64 never do.
    assert (slab >= 8 * MIB) if (recipe, d) == ("fp8_mixed", 128) else (slab == 0), slab
    qkv8 = lib.qkv8_bytes(T, B, hq, hkv, d, rid, True)
    assert qkv8 >= 8 * MIB, qkv8
    default_kept, default_peak = _step_memory(q, k, v, dout, cu, L, recipe, False)
    low_kept, low_peak = _step_memory(q, k, v, dout, cu, L, recipe, True)
    # The allocator rounds each block up (to 512 bytes; 2 MiB where a block is a segment).
    assert abs((default_kept - low_kept) - (qkv8 if recipe == "fp8_mixed" else 0)) <= 2 * MIB, \
        (default_kept, low_kept, qkv8)
    # At the backward's peak both hold one qkv8 (the forward's, or the one built again).
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


def test_quantizing_again_needs_v():
    on_device("cuda")
    q, k, v, dout, cu = make_pack(LENGTHS, 4, 2, 128, seed=9)
    out, lse, _ = ops.forward(q, k, v, cu, max(LENGTHS), recipe="fp8_mixed")
    empty = torch.empty((0,), dtype=torch.uint8, device=q.device)
    with pytest.raises(FlamiaError, match=r"qkv8 is empty, so the backward quantizes q, k, v again, but v is None"):
        ops.backward(dout, q, k, None, out, lse, empty, cu, max(LENGTHS), recipe="fp8_mixed")


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_what_autograd_keeps_on_the_gpu(recipe):
    # Fake CUDA tensors (shapes and dtypes only, no GPU needed): the tensors autograd saves
    # beyond the inputs are out, lse, cu_seqlens and, unless fp8_mixed's low_memory keeps the
    # BF16 v (with q and k) to quantize again, qkv8 sized for the backward.
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not _lib.available():
        pytest.skip("the library sizes qkv8")
    T, hq, hkv, d = 1000, 4, 2, 128
    with FakeTensorMode():
        q = torch.empty((T, hq, d), dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k, v = (torch.empty((T, hkv, d), dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in "kv")
        cu = torch.empty((3,), dtype=torch.int32, device="cuda")
        kept = {}
        for low in (False, True):
            saved = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                flamia.attention(q, k, v, cu, 600, recipe=recipe, low_memory=low)
            kept[low] = ([name for name, x in (("q", q), ("k", k), ("v", v)) if any(t is x for t in saved)],
                         sorted((str(t.dtype), tuple(t.shape)) for t in saved if not any(t is x for x in (q, k, v))))
    qkv8 = _lib.get().qkv8_bytes(T, 2, hq, hkv, d, _lib.recipe_id(recipe), True)
    rest = [("torch.bfloat16", (T, hq, d)), ("torch.float32", (hq, T)), ("torch.int32", (3,))]
    with_qkv8 = sorted(rest + [("torch.uint8", (qkv8,))])
    if recipe == "fp8":
        assert kept[False] == kept[True] == ([], with_qkv8)
    else:
        assert kept[False] == (["q", "k"], with_qkv8)
        assert kept[True] == (["q", "k", "v"], sorted(rest))
