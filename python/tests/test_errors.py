"""Bad inputs raise flamia.FlamiaError with a message that names the problem."""

import re

import pytest

from flamia_testutil import require_gpu, make_pack

torch = require_gpu()

import flamia  # noqa: E402
from flamia import FlamiaError  # noqa: E402
from flamia.reference import rel_l2  # noqa: E402


@pytest.fixture
def pack():
    return make_pack([64, 100], 4, 2, 128, seed=1)


def _raises(fn, pattern: str) -> str:
    with pytest.raises(FlamiaError) as ei:
        fn()
    msg = str(ei.value)
    assert re.search(pattern, msg), f"message {msg!r} does not match {pattern!r}"
    return msg


def test_cpu_tensors(pack):
    q, k, v, _, cu = pack
    # All on the CPU: the CPU specification, which the kernels equal up to FP32 ordering noise.
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    on_cpu = flamia.attention(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), max_seqlen)
    on_gpu = flamia.attention(q, k, v, cu, max_seqlen).cpu()
    assert rel_l2(on_gpu, on_cpu) < 2e-3
    # Mixed devices name the tensor and the device expected.
    _raises(lambda: flamia.attention(q, k, v.cpu(), cu, 100), r"flamia: v must be a CUDA tensor on cuda")
    _raises(lambda: flamia.attention(q, k, v, cu.cpu(), 100), r"flamia: cu_seqlens must be a CUDA tensor on cuda")
    _raises(lambda: flamia.attention(q.cpu(), k, v, cu, 100), r"flamia: k must be a CPU tensor on cpu like q")


def test_float32(pack):
    q, k, v, _, cu = pack
    # fp32 has an ABI code, so the library names it; fp16 has none, so the binding does.
    _raises(lambda: flamia.attention(q.float(), k, v, cu, 100), r"q: expected dtype bf16, got fp32")
    _raises(lambda: flamia.attention(q, k.half(), v, cu, 100), r"flamia: k must be torch\.bfloat16, got torch\.float16")


def test_noncontiguous_last_dim(pack):
    q, k, v, _, cu = pack
    wide = torch.empty((q.shape[0], q.shape[1], 2 * q.shape[2]), dtype=q.dtype, device="cuda")
    q_strided = wide[..., ::2]
    q_strided.copy_(q)
    assert q_strided.stride(-1) == 2
    _raises(lambda: flamia.attention(q_strided, k, v, cu, 100), r"q: last dim must be contiguous \(stride 1\)")


def test_cu_seqlens_int64(pack):
    q, k, v, _, cu = pack
    _raises(lambda: flamia.attention(q, k, v, cu.long(), 100), r"flamia: cu_seqlens must be torch\.int32, got torch\.int64")


def test_bad_cu_seqlens_shape(pack):
    # Shapes are checked at once; device-side values by the kernels (see the hostile tests below).
    q, k, v, _, cu = pack
    _raises(lambda: flamia.attention(q, k, v, cu[:1], 100),
            r"cu_seqlens: expected B \+ 1 >= 2 entries \(at least one document\), got 1")
    _raises(lambda: flamia.attention(q, k, v, cu.view(1, -1), 100), r"cu_seqlens: expected 1 dim \[B \+ 1\], got 2")


def test_heads_not_a_multiple(pack):
    q, _, _, _, cu = pack
    T = q.shape[0]
    k3 = torch.randn((T, 3, 128), device="cuda").to(torch.bfloat16)
    _raises(lambda: flamia.attention(q, k3, k3, cu, 100), r"k: Hq = 4 \(from q\) is not a multiple of Hkv = 3")


def test_mismatched_head_dims(pack):
    q, k, v, _, cu = pack
    T = q.shape[0]
    k64 = torch.randn((T, 2, 64), device="cuda").to(torch.bfloat16)
    _raises(lambda: flamia.attention(q, k64, k64, cu, 100),
            r"k: expected shape \[T, Hkv, D\] = \[164, 2, 128\], got \[164, 2, 64\]")


def test_wrong_rank(pack):
    q, k, v, _, cu = pack
    _raises(lambda: flamia.attention(q.unsqueeze(0), k, v, cu, 100), r"q must have 3 dims")


def test_unknown_recipe(pack):
    q, k, v, _, cu = pack
    _raises(lambda: flamia.attention(q, k, v, cu, 100, recipe="fp4"), r"recipe")


def test_varlen_restrictions(pack):
    q, k, v, _, cu = pack
    other = torch.tensor([0, 80, 164], dtype=torch.int32, device="cuda")
    _raises(lambda: flamia.flash_attn_varlen_func(q, k, v, cu, other, 100, 100), r"cu_seqlens_q must equal cu_seqlens_k")
    _raises(lambda: flamia.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, dropout_p=0.1), r"dropout_p")
    _raises(lambda: flamia.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, window_size=(8, 0)), r"window_size")


def test_deterministic_refuses_the_fused_dq(pack, monkeypatch):
    q, k, v, _, cu = pack
    monkeypatch.setenv("FLAMIA_BWD_DQ", "fused")
    _raises(lambda: flamia.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True, deterministic=True,
                                                  recipe="fp8_mixed"), r"deterministic=True, but FLAMIA_BWD_DQ=fused")
    # fp8 never fuses dQ; without deterministic the fused path runs.
    flamia.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True, deterministic=True, recipe="fp8")
    flamia.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True, recipe="fp8_mixed")


def test_backward_errors_carry_the_library_message(pack):
    # An error in the backward (here: a float32 dout is not bf16) surfaces as FlamiaError too.
    q, k, v, dout, cu = pack
    q = q.detach().requires_grad_()
    out = flamia.attention(q, k, v, cu, 100)
    from flamia import ops

    _, lse, qkv8 = torch.ops.flamia.fwd(q.detach(), k, v, cu, 100, True, 0.0, "fp8", True)
    _raises(lambda: ops.backward(dout.float(), q.detach(), k, v, out.detach(), lse, qkv8, cu, 100),
            r"dout: expected dtype bf16, got fp32")


# ---- hostile device cu_seqlens (values, not shapes) ------------------------------------------
HOSTILE = [
    ([0, 256, 1024], r"cu_seqlens: last entry cu_seqlens\[2\] = 1024 must equal T = 512"),
    ([0, 400, 100, 512], r"cu_seqlens: must be non-decreasing, got cu_seqlens\[2\] = 100 < cu_seqlens\[1\] = 400"),
    ([0, 100, 300], r"cu_seqlens: last entry cu_seqlens\[2\] = 300 must equal T = 512"),
]


def _hostile_inputs(cu_list):
    q, k, v, dout, _ = make_pack([512], 4, 4, 128, seed=3)
    return q, k, v, dout, torch.tensor(cu_list, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("cu_list,pattern", HOSTILE)
def test_hostile_cu_seqlens_default_mode(monkeypatch, cu_list, pattern):
    # Without checking mode: no error at the call, NaN in every output, the fault recorded
    # on the device and reported (once) by check_errors; the CUDA context stays usable.
    monkeypatch.delenv("FLAMIA_CHECK", raising=False)
    flamia.check_errors()  # start clean
    q, k, v, dout, cu = _hostile_inputs(cu_list)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = flamia.attention(q, k, v, cu, 512, causal=True, recipe="fp8")
    out.backward(dout)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isnan(g).all()
    _raises(flamia.check_errors, pattern)
    flamia.check_errors()  # cleared
    # The context is fine: a valid call right after gives finite numbers.
    q2, k2, v2, _, cu2 = make_pack([200, 312], 4, 4, 128, seed=4)
    out2 = flamia.attention(q2, k2, v2, cu2, 312, causal=True)
    assert torch.isfinite(out2).all()
    flamia.check_errors()


@pytest.mark.parametrize("cu_list,pattern", HOSTILE)
def test_hostile_cu_seqlens_checking_mode(monkeypatch, cu_list, pattern):
    monkeypatch.setenv("FLAMIA_CHECK", "1")
    q, k, v, _, cu = _hostile_inputs(cu_list)
    _raises(lambda: flamia.attention(q, k, v, cu, 512, causal=True, recipe="fp8"), pattern)
    flamia.check_errors()  # rejected before launch: nothing recorded


def test_max_seqlen_too_small_on_device(monkeypatch):
    monkeypatch.delenv("FLAMIA_CHECK", raising=False)
    q, k, v, _, cu = make_pack([64, 100], 4, 2, 128, seed=1)
    out = flamia.attention(q, k, v, cu, 99)
    assert torch.isnan(out).all()
    _raises(flamia.check_errors, r"max_seqlen: 99 is less than the length 100 of document 1")
