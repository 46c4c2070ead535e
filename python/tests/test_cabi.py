"""flamia.attention (torch custom ops) against direct ctypes calls of the C ABI on the same
CUDA buffers: the Python layer must add nothing to the numbers."""

import ctypes

import pytest

from flamia_testutil import require_gpu, make_pack, grads, assert_same_or_within_spread

torch = require_gpu()

import flamia  # noqa: E402
from flamia import _lib  # noqa: E402

_DT = {torch.bfloat16: _lib.DTYPE_BF16, torch.float32: _lib.DTYPE_FP32, torch.int32: _lib.DTYPE_INT32}


def view(t):
    return _lib.Tensor.make(t.data_ptr(), _DT[t.dtype], t.shape, t.stride(), t.device.index or 0)


def c_args(q, k, v, cu, max_seqlen, causal, recipe):
    a = _lib.AttentionArgs()
    a.q, a.k, a.v, a.cu_seqlens = view(q), view(k), view(v), view(cu)
    a.max_seqlen, a.causal, a.softmax_scale = max_seqlen, int(causal), 0.0
    a.recipe = _lib.RECIPES[recipe]
    a.stream = torch.cuda.current_stream().cuda_stream
    return a


def c_forward(dll, q, k, v, cu, max_seqlen, causal, recipe):
    T, hq, d = q.shape
    n = dll.flamia_qkv8_bytes(T, cu.numel() - 1, hq, k.shape[1], d, _lib.RECIPES[recipe], 1)
    assert n > 0
    qkv8 = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty((hq, T), dtype=torch.float32, device="cuda")
    a = c_args(q, k, v, cu, max_seqlen, causal, recipe)
    st = dll.flamia_forward(ctypes.byref(a), view(out), view(lse), ctypes.c_void_p(qkv8.data_ptr()), n, 0)
    assert st == 0, dll.flamia_last_error()
    return out, lse, qkv8, a


@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
@pytest.mark.parametrize("causal", [True, False])
def test_forward_and_backward_equal_c_abi(recipe, causal):
    lengths, hq, hkv, d = [33, 256, 129, 400], 8, 2, 128
    q, k, v, dout, cu = make_pack(lengths, hq, hkv, d, seed=11)
    runs = [grads(q, k, v, cu, max(lengths), dout, causal=causal, recipe=recipe) for _ in range(2)]
    out, lse, dq, dk, dv = runs[0]

    dll = _lib.get().dll
    c_out, c_lse, qkv8, a = c_forward(dll, q, k, v, cu, max(lengths), causal, recipe)
    T = q.shape[0]
    wn = dll.flamia_backward_workspace_bytes(T, len(lengths), hq, hkv, d, _lib.RECIPES[recipe])
    ws = torch.empty(max(wn, 1), dtype=torch.uint8, device="cuda")
    c_dq, c_dk, c_dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    st = dll.flamia_backward(ctypes.byref(a), view(dout), view(c_out), view(c_lse),
                             ctypes.c_void_p(qkv8.data_ptr()), qkv8.numel(), ctypes.c_void_p(ws.data_ptr()), wn,
                             view(c_dq), view(c_dk), view(c_dv))
    assert st == 0, dll.flamia_last_error()
    torch.cuda.synchronize()

    assert torch.equal(out, c_out)
    assert torch.equal(lse, c_lse)
    for i, (name, c) in enumerate((("dq", c_dq), ("dk", c_dk), ("dv", c_dv))):
        assert_same_or_within_spread(c, runs[0][2 + i], [r[2 + i] for r in runs], name)


def test_quantize_once_then_forward():
    # flamia_quantize_qkv + forward(qkv8_filled=1) equals the fused quantize+forward.
    q, k, v, _, cu = make_pack([300, 212], 4, 4, 128, seed=2)
    dll = _lib.get().dll
    out, lse, qkv8, a = c_forward(dll, q, k, v, cu, 300, True, "fp8")
    qkv8b = torch.empty_like(qkv8)
    assert dll.flamia_quantize_qkv(ctypes.byref(a), ctypes.c_void_p(qkv8b.data_ptr()), qkv8b.numel(), 1) == 0, \
        dll.flamia_last_error()
    out2, lse2 = torch.empty_like(out), torch.empty_like(lse)
    st = dll.flamia_forward(ctypes.byref(a), view(out2), view(lse2), ctypes.c_void_p(qkv8b.data_ptr()),
                            qkv8b.numel(), 1)
    assert st == 0, dll.flamia_last_error()
    torch.cuda.synchronize()
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_runs_on_current_stream():
    q, k, v, _, cu = make_pack([128, 384], 4, 4, 64, seed=4)
    ref = flamia.attention(q, k, v, cu, 384)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flamia.attention(q, k, v, cu, 384)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out, ref)
    # Equal values alone would also come from work on another stream; a CUDA graph captured on
    # s fails if any of the call's work goes elsewhere (the legacy stream, say), and its replay
    # gives the same bits.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        captured = flamia.attention(q, k, v, cu, 384)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ref)
