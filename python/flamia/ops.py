"""PyTorch ops over the flamia C ABI.

Two custom ops, "flamia::fwd" and "flamia::bwd", are registered with torch.library so
that torch.compile sees opaque nodes with known output shapes (fake implementations) and
an autograd formula, instead of breaking the graph at a ctypes call. The forward returns
the quantized-operand buffer ("qkv8") as a third output; autograd saves it, so q/k/v are
quantized once per training step and the backward reuses them. On the GPU the backward
reads v (and with recipe fp8 also q and k) only from qkv8, so autograd keeps qkv8 instead of
the BF16 tensors, except fp8_mixed's q and k, whose BF16 values its dS products read; the
CPU path quantizes q, k, v itself and keeps them.

Devices: CUDA tensors run the GPU kernels; CPU tensors run the CPU specification (the same
numbers up to FP32 ordering noise, docs/NUMERICS.md §5; exact and slow: for tests and for
diagnosing numerics inside a model on a machine without a GPU). All tensors of a call share
one device.

Validation policy: the C library checks shapes, dtypes, strides, cu_seqlens and q_start and
names the bad argument; Python only checks what the library cannot see (tensors on different
devices, a dtype the ABI has no code for, a rank needed for allocation).

q_start (optional, int32 [B] on cu_seqlens' device): document b's queries start at position
q_start[b] (a multiple of 128 in [0, L_b]); the rows before are keys only. The library
computes out, lse and dq only for the later rows (bitwise the rows of the call without
q_start) and sums dk, dv over them alone; the Python entry points zero-fill out, lse and dq,
so the earlier rows read 0. Context parallelism (flamia.distributed) uses it.

low_memory (recipe fp8_mixed on the GPU; per call, so a memory-bound layer can take it while
the others do not), bitwise the same outputs and gradients, a slower backward (README,
"Memory"):
- the backward runs in the workspace every call needs (flamia_backward_workspace_bytes)
  instead of the one that also holds the stored dS (flamia_backward_workspace_bytes_for), so
  at head dim 128 dS is recomputed for dQ rather than stored: no slab (up to
  FLAMIA_BWD_DS_MIB, default 2 GiB; 755 MiB in a model's step at 64k-token packs; two
  slabs with FLAMIA_BWD_DS_OVERLAP=1);
- autograd keeps the BF16 q, k, v instead of q, k and qkv8, and the backward quantizes them
  again (the same codes: each token's scale is its own row's): what is kept from the forward
  to the backward is then what a BF16 attention keeps, T·D·(Hq + Hkv) bytes less than by
  default, for one more quantization pass in the backward. The forward's qkv8 then holds only
  the forward's layouts and is freed with the call.
Recipe fp8 never stores dS and keeps qkv8 alone (0.60-0.68x the BF16 q, k, v): there and on
the CPU low_memory changes nothing.
"""

import contextlib
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _lib
from ._lib import FlamiaError

__all__ = ["attention", "flash_attn_varlen_func", "forward", "backward", "tensor_view"]

_DTYPES = {
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float32: _lib.DTYPE_FP32,
    torch.int32: _lib.DTYPE_INT32,
    torch.uint8: _lib.DTYPE_UINT8,
}
_EXPECTED = {"cu_seqlens": "torch.int32", "q_start": "torch.int32", "lse": "torch.float32", "qkv8": "torch.uint8"}


def tensor_view(t: Tensor, name: str) -> _lib.Tensor:
    """Describe a torch tensor to the C ABI (no copy)."""
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        # The ABI has no code for this dtype, so the library could not even name it.
        want = _EXPECTED.get(name, "torch.bfloat16")
        raise FlamiaError(f"flamia: {name} must be {want}, got {t.dtype}")
    if t.device.type == "cuda":
        dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    elif t.device.type == "cpu":
        dev = _lib.DEVICE_HOST
    else:
        raise FlamiaError(f"flamia: {name} is on device {t.device}; expected a CUDA or a CPU tensor")
    return _lib.Tensor.make(t.data_ptr(), dt, tuple(t.shape), tuple(t.stride()), dev)


def _require_one_device(named: Sequence[Tuple[str, Tensor]]) -> torch.device:
    """Every tensor on the first one's device, CUDA or CPU; returns that device."""
    for name, t in named:
        if not isinstance(t, Tensor):
            raise FlamiaError(f"flamia: {name} must be a torch.Tensor, got {type(t).__name__}")
    first, dev = named[0][0], named[0][1].device
    if dev.type not in ("cuda", "cpu"):
        raise FlamiaError(f"flamia: {first} is on device {dev}; expected a CUDA or a CPU tensor")
    kind = "CUDA" if dev.type == "cuda" else "CPU"
    for name, t in named[1:]:
        if t.device != dev:
            raise FlamiaError(f"flamia: {name} must be a {kind} tensor on {dev} like {first} (got device {t.device})")
    return dev


def _on(dev: torch.device):
    return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()


def _require_rank(t: Tensor, name: str, ndim: int, layout: str) -> None:
    # The rank is needed here to size the outputs before the library sees anything.
    if t.dim() != ndim:
        raise FlamiaError(f"flamia: {name} must have {ndim} dims {layout}, got shape {tuple(t.shape)}")


def _shape_view(shape: Sequence[int], like: Tensor) -> _lib.Tensor:
    """A dense BF16 tensor of `shape` on `like`'s device, described without data (the GPU
    backward's v, and fp8's q and k, which it reads from qkv8)."""
    view = tensor_view(like, "out")
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * int(shape[i + 1])
    return _lib.Tensor.make(0, _lib.DTYPE_BF16, tuple(int(x) for x in shape), tuple(strides), view.device)


def _make_args(q: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor], cu_seqlens: Tensor,
               max_seqlen: int, causal: bool, softmax_scale: float, recipe: str,
               shapes: Optional[Tuple[Sequence[int], Sequence[int], Tensor]] = None,
               q_start: Optional[Tensor] = None) -> _lib.AttentionArgs:
    """shapes = (q shape, k/v shape, a tensor on the device) describes q, k, v without data
    when they are None (the GPU backward: v always, q and k with recipe fp8)."""
    a = _lib.AttentionArgs()
    if q is None:
        q_shape, kv_shape, like = shapes
        a.q, a.k, a.v = _shape_view(q_shape, like), _shape_view(kv_shape, like), _shape_view(kv_shape, like)
    else:
        a.q = tensor_view(q, "q")
        a.k = tensor_view(k, "k")
        a.v = tensor_view(v, "v") if v is not None else _shape_view(tuple(k.shape), k)
    a.cu_seqlens = tensor_view(cu_seqlens, "cu_seqlens")
    a.max_seqlen = int(max_seqlen)
    a.causal = 1 if causal else 0
    a.softmax_scale = float(softmax_scale)  # 0 lets the library pick 1/sqrt(D)
    a.recipe = _lib.recipe_id(recipe)
    dev = q.device if q is not None else shapes[2].device
    a.stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None
    if q_start is not None:  # else left zeroed: data NULL, the field is absent
        a.q_start = tensor_view(q_start, "q_start")
    return a


def _num_docs(cu_seqlens: Tensor) -> int:
    return max(int(cu_seqlens.shape[0]) - 1, 0) if cu_seqlens.dim() == 1 else 0


# ---- eager entry points (also used by the custom ops) ---------------------------------------
def _with_q_start(named: Tuple[Tuple[str, Tensor], ...], q_start: Optional[Tensor]):
    return named + ((("q_start", q_start),) if q_start is not None else ())


def forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool = True,
            softmax_scale: float = 0.0, recipe: str = "fp8", for_backward: bool = True,
            q_start: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Quantize + forward. Returns (out [T,Hq,D] bf16, lse [Hq,T] fp32, qkv8 uint8).
    With q_start (int32 [B], module docstring) out and lse are zero-filled first: the rows
    before q_start[b] read 0 (the library computes only the later rows)."""
    dev = _require_one_device(_with_q_start((("q", q), ("k", k), ("v", v), ("cu_seqlens", cu_seqlens)), q_start))
    _require_rank(q, "q", 3, "[T, Hq, D]")
    _require_rank(k, "k", 3, "[T, Hkv, D]")
    lib = _lib.get()
    rid = _lib.recipe_id(recipe)
    T, hq, d = q.shape
    hkv = k.shape[1]
    alloc = torch.empty if q_start is None else torch.zeros
    out = alloc((T, hq, d), dtype=torch.bfloat16, device=dev)
    lse = alloc((hq, T), dtype=torch.float32, device=dev)
    nbytes = lib.qkv8_bytes(T, _num_docs(cu_seqlens), hq, hkv, d, rid, for_backward)
    # nbytes == 0 means the sizes are invalid; the forward call below then reports which.
    qkv8 = torch.empty((nbytes,), dtype=torch.uint8, device=dev)
    with _on(dev):
        args = _make_args(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, q_start=q_start)
        lib.forward(args, tensor_view(out, "out"), tensor_view(lse, "lse"),
                    qkv8.data_ptr() if nbytes else 0, nbytes, False)
    return out, lse, qkv8


def backward(dout: Tensor, q: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor], out: Tensor,
             lse: Tensor, qkv8: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool = True,
             softmax_scale: float = 0.0, recipe: str = "fp8",
             kv_heads: Optional[int] = None, q_start: Optional[Tensor] = None,
             low_memory: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Backward from the forward's saved (out, lse, qkv8). Returns (dq, dk, dv) in bf16.
    On the GPU v may be None (the kernels read it from qkv8), and with recipe "fp8" q and k too;
    kv_heads then gives Hkv (the shapes are out's, [T, Hq, D], and [T, kv_heads, D]). An empty
    qkv8 on the GPU means "quantize q, k, v again here" (low_memory's fp8_mixed; the same
    codes the forward's quantizer wrote), and then q, k, v must be given.
    q_start: the forward's (module docstring); dq is then zero-filled first (its rows before
    q_start[b] read 0), and dk, dv sum over the rows at or after q_start[b] only.
    low_memory: no stored dS (module docstring)."""
    if (q is None) != (k is None):
        raise FlamiaError("flamia: q and k must be given together or both be None")
    if q is None and v is not None:
        raise FlamiaError("flamia: v without q and k")
    if q is None:
        if kv_heads is None:
            raise FlamiaError("flamia: kv_heads is needed when q, k, v are None")
        named = (("dout", dout), ("out", out), ("lse", lse), ("qkv8", qkv8), ("cu_seqlens", cu_seqlens))
    else:
        named = (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()) + (
            ("dout", dout), ("out", out), ("lse", lse), ("qkv8", qkv8), ("cu_seqlens", cu_seqlens))
    dev = _require_one_device(_with_q_start(named, q_start))
    if q is not None:
        _require_rank(q, "q", 3, "[T, Hq, D]")
        _require_rank(k, "k", 3, "[T, Hkv, D]")
        T, hq, d = q.shape
        hkv = k.shape[1]
        shapes = None
    else:
        _require_rank(out, "out", 3, "[T, Hq, D]")
        T, hq, d = out.shape
        hkv = int(kv_heads)
        shapes = ((T, hq, d), (T, hkv, d), out)
    lib = _lib.get()
    # The kernels read dout with a contiguous head dim; a transposed/expanded grad is common.
    dout = dout.contiguous()
    dq = (torch.empty if q_start is None else torch.zeros)((T, hq, d), dtype=torch.bfloat16, device=dev)
    dk = torch.empty((T, hkv, d), dtype=torch.bfloat16, device=dev)
    dv = torch.empty((T, hkv, d), dtype=torch.bfloat16, device=dev)
    with _on(dev):
        args = _make_args(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, shapes, q_start)
        if low_memory and dev.type == "cuda":
            if lib.backward_dq_path(args.recipe, d) == _lib.DQ_STORED_REQUIRED:
                raise FlamiaError("flamia: low_memory=True asks for the backward without the stored dS, "
                                  "but FLAMIA_BWD_DQ=hbm requires it; unset FLAMIA_BWD_DQ or pass low_memory=False")
            wbytes = lib.backward_workspace_bytes(T, _num_docs(cu_seqlens), hq, hkv, d, args.recipe)
        else:
            wbytes = lib.backward_workspace_bytes_for(args)
        if dev.type == "cuda" and qkv8.numel() == 0:
            if v is None:
                raise FlamiaError("flamia: qkv8 is empty, so the backward quantizes q, k, v again, but v is None; "
                                  "pass the forward's qkv8 or the BF16 q, k, v")
            nbytes = lib.qkv8_bytes(T, _num_docs(cu_seqlens), hq, hkv, d, args.recipe, True)
            qkv8 = torch.empty((nbytes,), dtype=torch.uint8, device=dev)
            lib.quantize_qkv(args, qkv8.data_ptr() if nbytes else 0, nbytes, True)
        ws = torch.empty((wbytes,), dtype=torch.uint8, device=dev)
        lib.backward(args, tensor_view(dout, "dout"), tensor_view(out, "out"), tensor_view(lse, "lse"),
                     qkv8.data_ptr() if qkv8.numel() else 0, qkv8.numel(),
                     ws.data_ptr() if wbytes else 0, wbytes,
                     tensor_view(dq, "dq"), tensor_view(dk, "dk"), tensor_view(dv, "dv"))
    return dq, dk, dv


# ---- custom ops ------------------------------------------------------------------------------
@torch.library.custom_op("flamia::fwd", mutates_args=())
def _fwd_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool,
            softmax_scale: float, recipe: str, for_backward: bool,
            q_start: Optional[Tensor] = None, low_memory: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    # low_memory is the backward's (autograd's formula reads it from the forward's inputs).
    return forward(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe,
                   _qkv8_for_backward(q, recipe, for_backward, low_memory), q_start)


def _qkv8_fake_size(q: Tensor, k: Tensor, cu_seqlens: Tensor, recipe: str, for_backward: bool):
    """The qkv8 size during tracing: exact when shapes are concrete and the library loads
    (the size is a pure function of shapes), else an unbacked symbolic size."""
    dims = (q.shape[0], q.shape[1], k.shape[1] if k.dim() == 3 else 0, q.shape[2],
            cu_seqlens.shape[0] if cu_seqlens.dim() == 1 else 1)
    if all(isinstance(x, int) for x in dims) and _lib.available() and recipe in _lib.RECIPES:
        T, hq, hkv, d, n = dims
        return _lib.get().qkv8_bytes(T, max(n - 1, 0), hq, hkv, d, _lib.RECIPES[recipe], for_backward)
    return torch.library.get_ctx().new_dynamic_size()


@_fwd_op.register_fake
def _fwd_fake(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, for_backward, q_start=None,
              low_memory=False):
    T, hq, d = q.shape
    out = q.new_empty((T, hq, d), dtype=torch.bfloat16)
    lse = q.new_empty((hq, T), dtype=torch.float32)
    qkv8 = q.new_empty((_qkv8_fake_size(q, k, cu_seqlens, recipe,
                                        _qkv8_for_backward(q, recipe, for_backward, low_memory)),),
                       dtype=torch.uint8)
    return out, lse, qkv8


@torch.library.custom_op("flamia::bwd", mutates_args=())
def _bwd_op(dout: Tensor, q: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor], out: Tensor,
            lse: Tensor, qkv8: Tensor, cu_seqlens: Tensor, max_seqlen: int, causal: bool, softmax_scale: float,
            recipe: str, kv_heads: int, q_start: Optional[Tensor] = None,
            low_memory: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    return backward(dout, q, k, v, out, lse, qkv8, cu_seqlens, max_seqlen, causal, softmax_scale, recipe,
                    kv_heads, q_start, low_memory)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, qkv8, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, kv_heads,
              q_start=None, low_memory=False):
    T, hq, d = out.shape
    return (out.new_empty((T, hq, d), dtype=torch.bfloat16), out.new_empty((T, kv_heads, d), dtype=torch.bfloat16),
            out.new_empty((T, kv_heads, d), dtype=torch.bfloat16))


def _quantizes_again(q: Tensor, recipe: str, low_memory: bool) -> bool:
    """Whether autograd keeps the BF16 q, k, v instead of qkv8 and the backward quantizes them
    again (low_memory with fp8_mixed on the GPU; module docstring)."""
    return low_memory and recipe == "fp8_mixed" and q.device.type == "cuda"


def _qkv8_for_backward(q: Tensor, recipe: str, for_backward: bool, low_memory: bool) -> bool:
    """Whether the forward op's qkv8 also holds the backward's layouts (flamia_qkv8_bytes'
    for_backward): not where the backward quantizes again. The op and its fake size it alike."""
    return for_backward and not _quantizes_again(q, recipe, low_memory)


def _kept_inputs(q: Tensor, recipe: str, low_memory: bool) -> int:
    """How many of q, k, v the backward needs in BF16 (module docstring): all three on the
    CPU and where it quantizes them again, q and k with fp8_mixed on the GPU, none with fp8."""
    if q.device.type != "cuda" or _quantizes_again(q, recipe, low_memory):
        return 3
    return 2 if recipe == "fp8_mixed" else 0


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, for_backward, q_start, low_memory = inputs
    out, lse, qkv8 = output
    ctx.kept = _kept_inputs(q, recipe, low_memory)
    ctx.kv_heads = k.shape[1]
    # Not kept where the backward quantizes again: the forward's qkv8 is freed with the call.
    kept_qkv8 = None if _quantizes_again(q, recipe, low_memory) else qkv8
    ctx.save_for_backward(*(q, k, v)[:ctx.kept], out, lse, kept_qkv8, cu_seqlens, q_start)
    ctx.max_seqlen = max_seqlen
    ctx.causal = causal
    ctx.softmax_scale = softmax_scale
    ctx.recipe = recipe
    ctx.for_backward = for_backward
    ctx.low_memory = low_memory
    # lse/qkv8 carry no gradient of their own; flamia's backward, like FlashAttention's,
    # propagates through O only. Without materialize_grads off, autograd would hand the
    # backward a zero-filled tensor of qkv8's size (and lse's): a second qkv8 allocated and
    # cleared in every backward. (With it off, flamia's backward is the first CUDA work on
    # autograd's thread; the device call makes the context current there: src/api/device.cpp.)
    ctx.mark_non_differentiable(lse, qkv8)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse, dqkv8):
    saved = ctx.saved_tensors
    q, k, v = (tuple(saved[:ctx.kept]) + (None, None, None))[:3]
    out, lse, qkv8, cu_seqlens, q_start = saved[ctx.kept:]
    if not ctx.for_backward:
        raise FlamiaError("flamia: backward through a forward run without for_backward "
                          "(grad was disabled when the forward ran)")
    if dout is None:
        dout = torch.zeros_like(out)
    if qkv8 is None:  # the backward quantizes q, k, v again (_quantizes_again)
        qkv8 = out.new_empty((0,), dtype=torch.uint8)
    dq, dk, dv = torch.ops.flamia.bwd(dout.contiguous(), q, k, v, out, lse, qkv8, cu_seqlens,
                                      ctx.max_seqlen, ctx.causal, ctx.softmax_scale, ctx.recipe, ctx.kv_heads,
                                      q_start, ctx.low_memory)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd("flamia::fwd", _backward, setup_context=_setup_context)


# ---- public API ------------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
              causal: bool = True, softmax_scale: Optional[float] = None, recipe: str = "fp8",
              return_lse: bool = False, q_start: Optional[Tensor] = None,
              low_memory: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FP8 attention over a packed batch of documents.

    q [T, Hq, D], k/v [T, Hkv, D] bf16 tensors (Hq a multiple of Hkv, D in {64, 128},
    last dim contiguous); cu_seqlens int32 [B+1] on the same device; max_seqlen >= the
    longest document. CUDA tensors run on torch.cuda.current_stream(); CPU tensors run the
    CPU specification (slow; tests and diagnosis). Returns out [T, Hq, D] bf16 (and lse
    [Hq, T] fp32 when return_lse). Differentiable w.r.t. q, k, v.

    q_start (optional, int32 [B] on cu_seqlens' device): document b's queries start at
    position q_start[b], a multiple of 128 in [0, L_b]; the rows before are keys only. Those
    rows of out and lse are 0 (and their q gradient is 0); every later row, of out, lse and
    the q gradient, is bitwise the row of the call without q_start; the k, v gradients sum
    over the later query rows only (as if dout were 0 on the earlier ones). The library
    checks the values (FlamiaError naming q_start).

    low_memory: recipe fp8_mixed's call in less memory, the same outputs and gradients bit
    for bit, a slower backward: no stored dS (at head dim 128 dS is recomputed for dQ), and
    autograd keeps the BF16 q, k, v, as a BF16 attention does, instead of q, k and the
    quantized buffer, which the backward builds again (module docstring).
    """
    _require_one_device(_with_q_start((("q", q), ("k", k), ("v", v), ("cu_seqlens", cu_seqlens)), q_start))
    _lib.recipe_id(recipe)  # fail early, with the list of recipes
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    out, lse, _ = torch.ops.flamia.fwd(q, k, v, cu_seqlens, int(max_seqlen), bool(causal),
                                       float(softmax_scale) if softmax_scale is not None else 0.0,
                                       recipe, needs_grad, q_start, bool(low_memory))
    return (out, lse) if return_lse else out


@torch.compiler.assume_constant_result
def _dq_path(recipe: int, head_dim: int) -> int:
    """The library's dQ path for this recipe and head dim (FLAMIA_BWD_DQ, read by the library);
    a constant to torch.compile's tracing, as the switch is for a process."""
    return _lib.get().backward_dq_path(recipe, head_dim)


def _is_compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except AttributeError:  # older torch
        return False


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None,
                           *, recipe: str = "fp8", low_memory: bool = False):
    """Drop-in for flash_attn.flash_attn_varlen_func (same argument order), self-attention only.

    cu_seqlens_q must equal cu_seqlens_k; dropout, sliding windows, softcap, ALiBi and paged
    KV are not supported and raise. flamia's backward is deterministic unless
    FLAMIA_BWD_DQ=fused (fp8_mixed at head dim 128 on the GPU), which `deterministic=True`
    then refuses. With return_attn_probs, returns (out, lse, None) like flash_attn (lse
    [Hq, T]). recipe and low_memory: attention's.
    """
    if dropout_p != 0.0:
        raise FlamiaError(f"flamia: dropout_p must be 0 (got {dropout_p}); flamia has no attention dropout")
    if tuple(window_size) != (-1, -1):
        raise FlamiaError(f"flamia: window_size must be (-1, -1) (got {tuple(window_size)})")
    if softcap != 0.0:
        raise FlamiaError(f"flamia: softcap must be 0 (got {softcap})")
    if alibi_slopes is not None:
        raise FlamiaError("flamia: alibi_slopes is not supported")
    if block_table is not None:
        raise FlamiaError("flamia: block_table (paged KV) is not supported")
    if deterministic and q.device.type == "cuda" and _dq_path(_lib.recipe_id(recipe), q.shape[-1]) == _lib.DQ_FUSED:
        raise FlamiaError("flamia: deterministic=True, but FLAMIA_BWD_DQ=fused makes fp8_mixed's dQ at head dim "
                          "128 non-deterministic; unset FLAMIA_BWD_DQ or pass deterministic=False")
    if cu_seqlens_q is not cu_seqlens_k:
        if tuple(cu_seqlens_q.shape) != tuple(cu_seqlens_k.shape):
            raise FlamiaError("flamia: cu_seqlens_q must equal cu_seqlens_k (self-attention only); "
                              f"their shapes differ: {tuple(cu_seqlens_q.shape)} vs {tuple(cu_seqlens_k.shape)}")
        # A value check needs a host sync, which a compiled graph cannot take: do it in eager.
        if not _is_compiling() and not torch.equal(cu_seqlens_q, cu_seqlens_k):
            raise FlamiaError("flamia: cu_seqlens_q must equal cu_seqlens_k (self-attention only)")
    out, lse = attention(q, k, v, cu_seqlens_q, max(int(max_seqlen_q), int(max_seqlen_k)), causal=causal,
                         softmax_scale=softmax_scale, recipe=recipe, return_lse=True, low_memory=low_memory)
    if return_attn_probs:
        return out, lse, None
    return out
