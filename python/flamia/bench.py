"""Benchmark flamia against the attention baselines present on this machine.

    python -m flamia.bench [--out docs/bench] [--workloads fixed-4k,pack-32k] [--quick] [--iters 20]

For every workload (flamia.workloads, as in the project's WORKLOADS.md) and every
implementation present, first checks accuracy against exact float64 attention on a sampled
subset (a result far off is reported as failed and not timed), then measures quant / forward /
backward / step (= forward + backward) time with CUDA events (warm-up, median of --iters
rounds in which the workload's implementations take turns, L2 flushed before each timed call)
and TFLOPS as DESIGN.md section 4 counts them; for flamia also the bitwise causal and
document-isolation properties. With --sustained SECONDS also steps and then forwards run back
to back, with the board's energy a call and SM clock: at the power cap, a training run's
state, which the median of single flushed calls reads before the cap bites.
Baselines: torch SDPA's cuDNN backend (fixed-length), FlashAttention-2 varlen inside torch,
FlexAttention, and through the cuDNN Python frontend (when `import cudnn` works) cuDNN's ragged
THD BF16 path on every workload and cuDNN FP8 with per-tensor scales (BSHD on fixed-length
packs; ragged THD on the others only with --cudnn-fp8-ragged).
Writes a terminal table, bench.json and PNG charts under --out. One failing baseline only
costs its own record (the error string is kept in the JSON); an unsupported one is skipped
with its reason logged and listed under "skipped".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .workloads import WORKLOADS, Workload, length_summary

QUICK_WORKLOADS = ["fixed-4k", "fixed-8k", "fixed-16k", "fixed-32k", "pack-32k", "llama8b-pack"]
FLAMIA_RECIPES = ["fp8", "fp8_mixed"]
L2_FLUSH_BYTES = 256 << 20
# A record whose relative L2 error (output or any gradient) exceeds this is reported as failed
# and not timed: far above FP8's ~0.07, far below the ~1 of a wrong layout or mask.
VALIDATION_MAX_REL_L2 = 0.25
_T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - _T0:7.1f}s] {msg}", flush=True)


def _err(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 600 else s[:600] + "..."


# ---- inputs ----------------------------------------------------------------------------------
@dataclass
class Inputs:
    w: Workload
    q: Any  # torch.Tensor [T, Hq, D] bf16
    k: Any
    v: Any
    dout: Any
    cu: Any  # int32 cuda [B+1]
    scale: float

    @property
    def group(self) -> int:
        return self.w.hq // self.w.hkv


def make_inputs(w: Workload, seed: int):
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    T, hq, hkv, d = w.total_tokens, w.hq, w.hkv, w.head_dim

    def rn(h: int):
        # Random normal, never zeros (an all-zero input would make every kernel look exact).
        return torch.randn((T, h, d), generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    q, k, v, dout = rn(hq), rn(hkv), rn(hkv), rn(hq)
    cu = torch.tensor(w.cu_seqlens, dtype=torch.int32, device="cuda")
    return Inputs(w, q, k, v, dout, cu, 1.0 / math.sqrt(d))


def expand_kv(x, group: int):
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def reduce_kv_grad(dx, group: int):
    """Gradient w.r.t. expanded k/v [T, Hq, D] -> [T, Hkv, D] (sum over each group)."""
    if group == 1:
        return dx
    T, hq, d = dx.shape
    return dx.float().view(T, hq // group, group, d).sum(2)


# ---- implementations -------------------------------------------------------------------------
class Impl:
    """One attention implementation prepared for one workload.

    fwd() -> state; bwd(state) -> anything; result(state, grads) -> (out, dq, dk, dv) in the
    packed layouts [T, Hq, D] / [T, Hkv, D] (any float dtype), for the accuracy columns."""

    name = "?"
    recipe = "bf16"
    precision = "bf16"   # "bf16" or "fp8": which "best baseline" class it belongs to

    def __init__(self, inp: Inputs):
        self.inp = inp
        self.notes: List[str] = []

    def quant(self) -> Any:  # only for implementations with a separate quantization step
        raise NotImplementedError

    has_quant = False

    def fwd(self) -> Any:
        raise NotImplementedError

    def bwd(self, state: Any) -> Any:
        raise NotImplementedError

    def result(self, state: Any, grads: Any):
        raise NotImplementedError

    def close(self) -> None:
        pass


class AutogradImpl(Impl):
    """Implementations whose forward is differentiable: bwd = autograd.grad(out, inputs)."""

    def leaves(self) -> Tuple[Any, ...]:
        raise NotImplementedError

    def bwd(self, state):
        import torch

        out, dout = state[0], state[1]
        return torch.autograd.grad(out, self.leaves(), dout)


class FlamiaImpl(AutogradImpl):
    name = "flamia"
    precision = "fp8"
    has_quant = True

    def __init__(self, inp: Inputs, recipe: str, low_memory: bool = False):
        super().__init__(inp)
        import torch
        import flamia
        from . import _lib, ops

        self.recipe = recipe
        self.low_memory = low_memory
        if low_memory:
            self.notes.append("low_memory=True")
        self.flamia = flamia
        self.q = inp.q.detach().requires_grad_()
        self.k = inp.k.detach().requires_grad_()
        self.v = inp.v.detach().requires_grad_()
        self._lib, self._libmod, self._ops = _lib.get(), _lib, ops
        self._qkv8 = None  # the quantization-only timing's buffer, made on first use (not a step's cost)
        self._torch = torch

    def leaves(self):
        return (self.q, self.k, self.v)

    def quant(self):
        # The quantization pass alone (it is also inside fwd): flamia_quantize_qkv.
        w = self.inp.w
        if self._qkv8 is None:
            n = self._lib.qkv8_bytes(w.total_tokens, len(w.lengths), w.hq, w.hkv, w.head_dim,
                                     self._libmod.recipe_id(self.recipe), True)
            self._qkv8 = self._torch.empty((n,), dtype=self._torch.uint8, device="cuda")
        args = self._ops._make_args(self.q, self.k, self.v, self.inp.cu, w.max_seqlen, w.causal, 0.0,
                                    self.recipe)
        self._lib.quantize_qkv(args, self._qkv8.data_ptr(), self._qkv8.numel(), True)

    def fwd(self):
        w = self.inp.w
        out = self.flamia.attention(self.q, self.k, self.v, self.inp.cu, w.max_seqlen, causal=w.causal,
                                    recipe=self.recipe, low_memory=self.low_memory)
        return out, self.inp.dout

    def result(self, state, grads):
        return state[0], grads[0], grads[1], grads[2]


class SdpaCudnnImpl(AutogradImpl):
    """torch SDPA, cuDNN backend, BF16; fixed-length packs viewed as [B, H, L, D] (no copy:
    the packed [T, H, D] memory is cuDNN's native BSHD layout)."""

    name = "sdpa_cudnn"

    def __init__(self, inp: Inputs):
        super().__init__(inp)
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        w = inp.w
        if not w.fixed:
            raise NotImplementedError("fixed-length workloads only")
        self.B, self.L = len(w.lengths), w.doc_len
        g = inp.group
        self.gqa = "native (enable_gqa)" if g > 1 else "n/a"
        self.q = self._bhld(inp.q).requires_grad_()
        self.k = self._bhld(inp.k).requires_grad_()
        self.v = self._bhld(inp.v).requires_grad_()
        self.dout = self._bhld(inp.dout)
        self._ctx = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        self._sdpa = torch.nn.functional.scaled_dot_product_attention
        if g > 1:
            self.notes.append("GQA through enable_gqa=True")

    def _bhld(self, x):
        T, h, d = x.shape
        return x.detach().view(self.B, self.L, h, d).transpose(1, 2)

    def _pack(self, x):
        B, h, L, d = x.shape
        return x.transpose(1, 2).reshape(B * L, h, d)

    def leaves(self):
        return (self.q, self.k, self.v)

    def fwd(self):
        kw = {"enable_gqa": True} if self.inp.group > 1 else {}
        with self._ctx():
            out = self._sdpa(self.q, self.k, self.v, is_causal=self.inp.w.causal, scale=self.inp.scale, **kw)
        return out, self.dout

    def bwd(self, state):
        with self._ctx():
            return super().bwd(state)

    def result(self, state, grads):
        return (self._pack(state[0]), self._pack(grads[0]), self._pack(grads[1]), self._pack(grads[2]))


def _call_by_schema(op, values: Dict[str, Any]):
    """Call an aten overload by argument names read from its schema at run time, so that
    renamed/added arguments across torch versions do not break the call."""
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    for a in op._schema.arguments:
        if a.name in values:
            val = values[a.name]
        elif a.has_default_value():
            if a.kwarg_only:
                continue
            val = a.default_value
        elif str(a.type).endswith("?"):
            val = None
        else:
            raise TypeError(f"do not know how to fill argument '{a.name}' of {op._schema}")
        if a.kwarg_only:
            kwargs[a.name] = val
        else:
            args.append(val)
    return op(*args, **kwargs)


class Fa2AtenImpl(Impl):
    """FlashAttention-2 varlen as shipped inside PyTorch (aten::_flash_attention_forward /
    _backward with cu_seqlens)."""

    name = "fa2_varlen_torch"

    def __init__(self, inp: Inputs):
        super().__init__(inp)
        import torch

        self.fop = torch.ops.aten._flash_attention_forward.default
        self.bop = torch.ops.aten._flash_attention_backward.default
        self.k, self.v = inp.k, inp.v
        self.expanded = False
        self.gqa = "n/a"
        if inp.group > 1:
            try:
                self._fwd_raw()
                torch.cuda.synchronize()
                self.gqa = "native"
            except Exception as e:  # older builds require equal heads
                self.k, self.v = expand_kv(inp.k, inp.group), expand_kv(inp.v, inp.group)
                self.expanded = True
                self.gqa = "k/v expanded (repeat_interleave, outside timing)"
                self.notes.append(f"native GQA failed ({_err(e)[:120]}); k/v expanded outside timing")

    def _common(self) -> Dict[str, Any]:
        w, cu = self.inp.w, self.inp.cu
        return {
            "cum_seq_q": cu, "cum_seq_k": cu, "max_q": w.max_seqlen, "max_k": w.max_seqlen,
            "dropout_p": 0.0, "is_causal": w.causal, "scale": self.inp.scale,
        }

    def _fwd_raw(self):
        vals = self._common()
        vals.update(query=self.inp.q, key=self.k, value=self.v, return_debug_mask=False)
        return _call_by_schema(self.fop, vals)

    def fwd(self):
        return self._fwd_raw()

    def bwd(self, state):
        out, lse, seed, offset = state[0], state[1], state[2], state[3]
        vals = self._common()
        vals.update(grad_out=self.inp.dout, query=self.inp.q, key=self.k, value=self.v, out=out,
                    logsumexp=lse, rng_state=seed, unused=offset, philox_seed=seed, philox_offset=offset)
        return _call_by_schema(self.bop, vals)

    def result(self, state, grads):
        dq, dk, dv = grads[0], grads[1], grads[2]
        if self.expanded:
            dk, dv = reduce_kv_grad(dk, self.inp.group), reduce_kv_grad(dv, self.inp.group)
        return state[0], dq, dk, dv


_FLEX_COMPILED: Dict[str, Any] = {}


class FlexImpl(AutogradImpl):
    """FlexAttention (compiled) with a document-causal BlockMask built once per workload."""

    name = "flex_attention"

    def __init__(self, inp: Inputs):
        super().__init__(inp)
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if "fn" not in _FLEX_COMPILED:
            # Each workload's mask_mod is a new closure, hence a recompile; allow one per workload.
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            _FLEX_COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
            # Compiled, the mask's construction never materialises a T x T mask on long packs.
            _FLEX_COMPILED["mask"] = torch.compile(create_block_mask)
        self.fn = _FLEX_COMPILED["fn"]
        w = inp.w
        T = w.total_tokens
        lens = torch.tensor(w.lengths, device="cuda")
        doc = torch.repeat_interleave(torch.arange(len(w.lengths), device="cuda"), lens)
        causal = w.causal

        def mask_mod(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return (same & (q_idx >= kv_idx)) if causal else same

        self.block_mask = _FLEX_COMPILED["mask"](mask_mod, None, None, T, T, device="cuda")
        # [1, H, T, D] contiguous copies, made outside timing.
        self.q = inp.q.detach().transpose(0, 1).unsqueeze(0).contiguous().requires_grad_()
        self.k = inp.k.detach().transpose(0, 1).unsqueeze(0).contiguous().requires_grad_()
        self.v = inp.v.detach().transpose(0, 1).unsqueeze(0).contiguous().requires_grad_()
        self.dout = inp.dout.transpose(0, 1).unsqueeze(0).contiguous()
        self.gqa = "native (enable_gqa)" if inp.group > 1 else "n/a"

    def leaves(self):
        return (self.q, self.k, self.v)

    def fwd(self):
        kw = {"enable_gqa": True} if self.inp.group > 1 else {}
        out = self.fn(self.q, self.k, self.v, block_mask=self.block_mask, scale=self.inp.scale, **kw)
        return out, self.dout

    def result(self, state, grads):
        unpack = lambda x: x[0].transpose(0, 1)  # noqa: E731
        return unpack(state[0]), unpack(grads[0]), unpack(grads[1]), unpack(grads[2])


class FlashAttnPkgImpl(AutogradImpl):
    """flash_attn (FA2 package) or flash_attn_interface (FA3) varlen, BF16."""

    def __init__(self, inp: Inputs, module: str):
        super().__init__(inp)
        import importlib

        mod = importlib.import_module(module)
        self.fn = mod.flash_attn_varlen_func
        self.name = {"flash_attn": "flash_attn2", "flash_attn_interface": "flash_attn3"}.get(module, module)
        self.q = inp.q.detach().requires_grad_()
        self.k = inp.k.detach().requires_grad_()
        self.v = inp.v.detach().requires_grad_()
        self.gqa = "native" if inp.group > 1 else "n/a"

    def leaves(self):
        return (self.q, self.k, self.v)

    def fwd(self):
        w, cu = self.inp.w, self.inp.cu
        out = self.fn(self.q, self.k, self.v, cu, cu, w.max_seqlen, w.max_seqlen, softmax_scale=self.inp.scale,
                      causal=w.causal)
        if isinstance(out, tuple):  # some FA3 versions return (out, lse)
            out = out[0]
        return out, self.inp.dout

    def result(self, state, grads):
        return state[0], grads[0], grads[1], grads[2]


class TransformerEngineImpl(AutogradImpl):
    """Transformer Engine DotProductAttention, THD (packed) format, BF16."""

    name = "transformer_engine"

    def __init__(self, inp: Inputs):
        super().__init__(inp)
        import transformer_engine.pytorch as te

        w = inp.w
        self.mod = te.DotProductAttention(w.hq, w.head_dim, num_gqa_groups=w.hkv, attention_dropout=0.0,
                                          qkv_format="thd",
                                          attn_mask_type="padding_causal" if w.causal else "padding",
                                          softmax_scale=inp.scale)
        self.q = inp.q.detach().requires_grad_()
        self.k = inp.k.detach().requires_grad_()
        self.v = inp.v.detach().requires_grad_()
        self.dout = inp.dout.reshape(w.total_tokens, w.hq * w.head_dim)
        self.gqa = "native" if inp.group > 1 else "n/a"

    def leaves(self):
        return (self.q, self.k, self.v)

    def fwd(self):
        w, cu = self.inp.w, self.inp.cu
        out = self.mod(self.q, self.k, self.v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=w.max_seqlen,
                       max_seqlen_kv=w.max_seqlen)
        return out, self.dout

    def result(self, state, grads):
        w = self.inp.w
        return state[0].reshape(w.total_tokens, w.hq, w.head_dim), grads[0], grads[1], grads[2]


class CudnnFrontendImpl(Impl):
    """Shared plumbing of the baselines that call the cuDNN Python frontend's graph API
    directly: a handle on the current stream, plan building, and the packed [T, H, D]
    layout seen by cuDNN either as BSHD (fixed-length packs, no copy) or as ragged THD
    (element offsets of each document's first token plus per-document sequence lengths
    and the padding mask, cuDNN's variable-length form). Unsupported graphs and a missing
    frontend raise NotImplementedError, which the driver turns into a logged skip."""

    def __init__(self, inp: Inputs, ragged: bool):
        super().__init__(inp)
        import torch

        try:
            import cudnn
        except ImportError as e:
            raise NotImplementedError(f"cuDNN python frontend not installed ({_err(e)})")
        self.cudnn = cudnn
        w = inp.w
        self.B, self.S, self.H, self.Hkv, self.D = len(w.lengths), w.max_seqlen, w.hq, w.hkv, w.head_dim
        self.ragged = ragged
        self.gqa = "native" if inp.group > 1 else "n/a"
        if ragged:
            offs = thd_ragged_offsets(w.cu_seqlens, {self.H, self.Hkv}, self.D)
            self.offsets = {h: torch.tensor(o, dtype=torch.int64, device="cuda").reshape(self.B + 1, 1, 1, 1)
                            for h, o in offs.items()}
            self.seq_len = torch.tensor(w.lengths, dtype=torch.int32, device="cuda").reshape(self.B, 1, 1, 1)
            self.notes.append("ragged THD layout (ragged offsets + seq_len, padding mask)")
        self.handle = cudnn.create_handle()
        try:
            cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        except Exception as e:  # the default stream is what the benchmark uses anyway
            self.notes.append(f"cudnn.set_stream failed ({_err(e)[:80]})")

    # -- layout: dims are always [B, H, S, D] with BSHD strides; ragged tensors get offsets --
    def _dims(self, h: int):
        return (self.B, h, self.S, self.D), (self.S * h * self.D, self.D, h * self.D, 1)

    def _stats_dims(self):
        # Softmax stats stay padded [B, H, S, 1] in both forms (float32, small).
        return (self.B, self.H, self.S, 1), (self.H * self.S, self.S, 1, 1)

    def _offset(self, g, h: int, pack: Dict[Any, Any]):
        o = g.tensor(dim=(self.B + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=self.cudnn.data_type.INT64)
        pack[o] = self.offsets[h]
        return o

    def _input(self, g, h: int, dtype, pack: Dict[Any, Any], buf):
        dim, st = self._dims(h)
        t = g.tensor(dim=dim, stride=st, data_type=dtype)
        if self.ragged:
            t.set_ragged_offset(self._offset(g, h, pack))
        pack[t] = buf
        return t

    def _output(self, g, t, h: int, dtype, pack: Dict[Any, Any], buf) -> None:
        dim, st = self._dims(h)
        t.set_output(True).set_dim(dim).set_stride(st).set_data_type(dtype)
        if self.ragged:
            t.set_ragged_offset(self._offset(g, h, pack))
        pack[t] = buf

    def _stats(self, g, pack: Dict[Any, Any], buf, t=None):
        """The stats tensor: marks the forward's output t, or makes the backward's input."""
        dim, st = self._stats_dims()
        f32 = self.cudnn.data_type.FLOAT
        if t is None:
            t = g.tensor(dim=dim, stride=st, data_type=f32)
        else:
            t.set_output(True).set_dim(dim).set_stride(st).set_data_type(f32)
        pack[t] = buf
        return t

    def _padding(self, g, pack: Dict[Any, Any]) -> Dict[str, Any]:
        """sdpa keyword arguments of the variable-length form (none for BSHD)."""
        if not self.ragged:
            return {}
        kw: Dict[str, Any] = {"use_padding_mask": True}
        for name in ("seq_len_q", "seq_len_kv"):
            t = g.tensor(dim=(self.B, 1, 1, 1), stride=(1, 1, 1, 1), data_type=self.cudnn.data_type.INT32)
            pack[t] = self.seq_len
            kw[name] = t
        return kw

    def _graph(self, io_type):
        c = self.cudnn
        return c.pygraph(io_data_type=io_type, intermediate_data_type=c.data_type.FLOAT,
                         compute_data_type=c.data_type.FLOAT, handle=self.handle)

    def _finish(self, g, what: str) -> None:
        c = self.cudnn
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except c.cudnnGraphNotSupportedError as e:
            form = "ragged THD" if self.ragged else "BSHD"
            raise NotImplementedError(f"cuDNN {c.backend_version_string()} does not support this {what} "
                                      f"graph ({form}, Hq/Hkv={self.H}/{self.Hkv}, D={self.D}): {_err(e)}")

    def _workspace(self, *graphs) -> None:
        import torch

        n = max([g.get_workspace_size() for g in graphs] + [1])
        self.ws = torch.empty((n,), dtype=torch.uint8, device="cuda")

    def close(self):
        try:
            self.cudnn.destroy_handle(self.handle)
        except Exception:
            pass

    # The subclasses build self.fg / self.bg (graphs) and self.fpack / self.bpack (variant packs).
    def fwd(self):
        self.fg.execute(self.fpack, self.ws, handle=self.handle)
        return True

    def bwd(self, state):
        self.bg.execute(self.bpack, self.ws, handle=self.handle)
        return True


def thd_ragged_offsets(cu_seqlens: Sequence[int], heads: Sequence[int], head_dim: int) -> Dict[int, List[int]]:
    """cuDNN ragged offsets of a packed [T, H, D] tensor, per head count H: the element index
    of each document's first token, then the total (B + 1 values)."""
    return {h: [c * h * head_dim for c in cu_seqlens] for h in heads}


class CudnnThdImpl(CudnnFrontendImpl):
    """cuDNN BF16 SDPA forward + backward on the packed tensors as ragged THD (ragged offsets
    on Q/K/V/O/dO/dQ/dK/dV, seq_len_q = seq_len_kv = the document lengths, padding mask,
    causal as a top-left diagonal band with right bound 0): cuDNN's variable-length path,
    the same kernels Transformer Engine's THD attention calls. Runs on every workload (a
    fixed-length pack is a pack)."""

    name = "cudnn_thd"

    def __init__(self, inp: Inputs):
        super().__init__(inp, ragged=True)
        import torch

        w = inp.w
        bf = dict(dtype=torch.bfloat16, device="cuda")
        self.o = torch.empty(inp.q.shape, **bf)
        self.dq = torch.empty(inp.q.shape, **bf)
        self.dk = torch.empty(inp.k.shape, **bf)
        self.dv = torch.empty(inp.v.shape, **bf)
        self.stats = torch.empty(self._stats_dims()[0], dtype=torch.float32, device="cuda")
        self._build_fwd()
        self._build_bwd()
        self._workspace(self.fg, self.bg)
        if w.causal:
            self.notes.append("causal: diagonal_alignment TOP_LEFT, right bound 0")

    def _mask(self) -> Dict[str, Any]:
        if not self.inp.w.causal:
            return {}
        return {"diagonal_alignment": self.cudnn.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0}

    def _build_fwd(self):
        bf16 = self.cudnn.data_type.BFLOAT16
        g, pack = self._graph(bf16), {}
        q = self._input(g, self.H, bf16, pack, self.inp.q)
        k = self._input(g, self.Hkv, bf16, pack, self.inp.k)
        v = self._input(g, self.Hkv, bf16, pack, self.inp.v)
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=True, attn_scale=self.inp.scale,
                          **self._padding(g, pack), **self._mask())
        self._output(g, o, self.H, bf16, pack, self.o)
        self._stats(g, pack, self.stats, stats)
        self._finish(g, "BF16 forward")
        self.fg, self.fpack = g, pack

    def _build_bwd(self):
        bf16 = self.cudnn.data_type.BFLOAT16
        g, pack = self._graph(bf16), {}
        q = self._input(g, self.H, bf16, pack, self.inp.q)
        k = self._input(g, self.Hkv, bf16, pack, self.inp.k)
        v = self._input(g, self.Hkv, bf16, pack, self.inp.v)
        o = self._input(g, self.H, bf16, pack, self.o)
        do = self._input(g, self.H, bf16, pack, self.inp.dout)
        stats = self._stats(g, pack, self.stats)
        # Workspace is sized from the packed token total (rounded up to a 64-token tile).
        t64 = (self.inp.w.total_tokens + 63) // 64 * 64
        dq, dk, dv = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=stats, attn_scale=self.inp.scale,
                                     max_total_seq_len_q=t64, max_total_seq_len_kv=t64,
                                     **self._padding(g, pack), **self._mask())
        self._output(g, dq, self.H, bf16, pack, self.dq)
        self._output(g, dk, self.Hkv, bf16, pack, self.dk)
        self._output(g, dv, self.Hkv, bf16, pack, self.dv)
        self._finish(g, "BF16 backward")
        self.bg, self.bpack = g, pack

    def result(self, state, grads):
        return self.o, self.dq, self.dk, self.dv


# Measured on an H200 with cuDNN 9.19.0 and frontend 1.16.0: the FP8 ragged backward has no
# execution plan for MHA (pack-32k), and for GQA 32/8 (llama8b-pack) it builds a plan whose run
# faults with an illegal address, which ends the whole process. Hence opt-in.
FP8_RAGGED_OFF = ("FP8 on ragged THD packs is off by default: with cuDNN 9.19 on sm_90 its backward had no "
                  "execution plan (MHA) or faulted with an illegal address (GQA 32/8); --cudnn-fp8-ragged "
                  "tries it (in a process of its own: a fault ends the run)")


class CudnnFp8Impl(CudnnFrontendImpl):
    """cuDNN FP8 SDPA forward + backward through the cuDNN Python frontend, per-tensor scales
    (power-of-two, from each tensor's amax, as current-scaling FP8 recipes do; O, S, dP and the
    gradients use scales calibrated by one untimed run). Fixed-length packs as BSHD; the
    long-tailed packs as ragged THD only with allow_ragged (--cudnn-fp8-ragged), see
    FP8_RAGGED_OFF. fwd/bwd/step time the cuDNN graphs; the quantization of q/k/v/dO
    (unfused torch ops here) is reported as quant_ms."""

    name = "cudnn_fp8"
    recipe = "fp8_per_tensor"
    precision = "fp8"
    has_quant = True

    def __init__(self, inp: Inputs, allow_ragged: bool = False):
        if not inp.w.fixed and not allow_ragged:
            raise NotImplementedError(FP8_RAGGED_OFF)
        super().__init__(inp, ragged=not inp.w.fixed)
        import torch

        dev = "cuda"
        f8 = torch.float8_e4m3fn
        self.q8 = torch.empty(inp.q.shape, dtype=f8, device=dev)
        self.k8 = torch.empty(inp.k.shape, dtype=f8, device=dev)
        self.v8 = torch.empty(inp.v.shape, dtype=f8, device=dev)
        self.do8 = torch.empty(inp.dout.shape, dtype=f8, device=dev)
        self.o8 = torch.empty(inp.q.shape, dtype=f8, device=dev)
        self.dq8 = torch.empty(inp.q.shape, dtype=f8, device=dev)
        self.dk8 = torch.empty(inp.k.shape, dtype=f8, device=dev)
        self.dv8 = torch.empty(inp.v.shape, dtype=f8, device=dev)
        self.stats = torch.empty(self._stats_dims()[0], dtype=torch.float32, device=dev)
        one = lambda: torch.ones((1, 1, 1, 1), dtype=torch.float32, device=dev)  # noqa: E731
        names = ["descale_q", "descale_k", "descale_v", "descale_do", "descale_s", "scale_s", "scale_o",
                 "descale_o", "descale_dp", "scale_dp", "scale_dq", "scale_dk", "scale_dv",
                 "amax_s", "amax_o", "amax_dq", "amax_dk", "amax_dv", "amax_dp"]
        self.s = {n: one() for n in names}
        self.scale_in = {n: one() for n in ("q", "k", "v", "do")}
        # P is in [0, 1]: 256 (a power of two under 448) keeps it in range.
        self.s["scale_s"].fill_(256.0)
        self.s["descale_s"].fill_(1.0 / 256.0)
        self._build_fwd()
        self._build_bwd()
        self._workspace(self.fg, self.bg)
        self._calibrate()

    def _scalar(self, g, pack: Dict[Any, Any], name: str):
        t = g.tensor(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=self.cudnn.data_type.FLOAT)
        pack[t] = self.s[name]
        return t

    def _amax_out(self, t, pack: Dict[Any, Any], name: str) -> None:
        t.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(self.cudnn.data_type.FLOAT)
        pack[t] = self.s[name]

    def _build_fwd(self):
        e4m3 = self.cudnn.data_type.FP8_E4M3
        g, pack = self._graph(e4m3), {}
        q = self._input(g, self.H, e4m3, pack, self.q8)
        k = self._input(g, self.Hkv, e4m3, pack, self.k8)
        v = self._input(g, self.Hkv, e4m3, pack, self.v8)
        sc = {n: self._scalar(g, pack, n)
              for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        kw = dict(q=q, k=k, v=v, attn_scale=self.inp.scale, use_causal_mask=self.inp.w.causal,
                  **sc, **self._padding(g, pack))
        try:
            o, stats, amax_s, amax_o = g.sdpa_fp8(generate_stats=True, **kw)
        except TypeError:  # older frontends spell it is_inference
            o, stats, amax_s, amax_o = g.sdpa_fp8(is_inference=False, **kw)
        self._output(g, o, self.H, e4m3, pack, self.o8)
        self._stats(g, pack, self.stats, stats)
        self._amax_out(amax_s, pack, "amax_s")
        self._amax_out(amax_o, pack, "amax_o")
        self._finish(g, "FP8 forward")
        self.fg, self.fpack = g, pack

    def _build_bwd(self):
        e4m3 = self.cudnn.data_type.FP8_E4M3
        g, pack = self._graph(e4m3), {}
        q = self._input(g, self.H, e4m3, pack, self.q8)
        k = self._input(g, self.Hkv, e4m3, pack, self.k8)
        v = self._input(g, self.Hkv, e4m3, pack, self.v8)
        o = self._input(g, self.H, e4m3, pack, self.o8)
        do = self._input(g, self.H, e4m3, pack, self.do8)
        stats = self._stats(g, pack, self.stats)
        sc = {n: self._scalar(g, pack, n)
              for n in ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s",
                        "descale_dp", "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp")}
        dq, dk, dv, adq, adk, adv, adp = g.sdpa_fp8_backward(
            q=q, k=k, v=v, o=o, dO=do, stats=stats,
            descale_q=sc["descale_q"], descale_k=sc["descale_k"], descale_v=sc["descale_v"],
            descale_o=sc["descale_o"], descale_dO=sc["descale_do"], descale_s=sc["descale_s"],
            descale_dP=sc["descale_dp"], scale_s=sc["scale_s"], scale_dQ=sc["scale_dq"], scale_dK=sc["scale_dk"],
            scale_dV=sc["scale_dv"], scale_dP=sc["scale_dp"], attn_scale=self.inp.scale,
            use_causal_mask=self.inp.w.causal, **self._padding(g, pack))
        self._output(g, dq, self.H, e4m3, pack, self.dq8)
        self._output(g, dk, self.Hkv, e4m3, pack, self.dk8)
        self._output(g, dv, self.Hkv, e4m3, pack, self.dv8)
        for t, n in ((adq, "amax_dq"), (adk, "amax_dk"), (adv, "amax_dv"), (adp, "amax_dp")):
            self._amax_out(t, pack, n)
        self._finish(g, "FP8 backward")
        self.bg, self.bpack = g, pack

    @staticmethod
    def _pow2_scale(amax):
        import torch

        # Largest power of two with amax * scale <= 448 (E4M3's max); 1 for an all-zero tensor.
        a = torch.clamp(amax.float(), min=1e-30)
        s = torch.exp2(torch.floor(torch.log2(448.0 / a)))
        return torch.where(amax > 0, s, torch.ones_like(s))

    def _q(self, x, x8, name: str):
        s = self._pow2_scale(x.abs().amax()).reshape(1, 1, 1, 1)
        self.scale_in[name].copy_(s)
        x8.copy_((x.float() * s.reshape(1, 1, 1)).to(x8.dtype))
        self.s["descale_" + name].copy_(1.0 / s)

    def quant(self):
        self._q(self.inp.q, self.q8, "q")
        self._q(self.inp.k, self.k8, "k")
        self._q(self.inp.v, self.v8, "v")

    def quant_do(self):
        self._q(self.inp.dout, self.do8, "do")

    def _calibrate(self):
        import torch

        self.quant()
        self.quant_do()
        self.fg.execute(self.fpack, self.ws, handle=self.handle)
        so = self._pow2_scale(self.s["amax_o"])
        self.s["scale_o"].copy_(so)
        self.s["descale_o"].copy_(1.0 / so)
        self.fg.execute(self.fpack, self.ws, handle=self.handle)
        self.bg.execute(self.bpack, self.ws, handle=self.handle)
        sdp = self._pow2_scale(self.s["amax_dp"])
        self.s["scale_dp"].copy_(sdp)
        self.s["descale_dp"].copy_(1.0 / sdp)
        for n in ("dq", "dk", "dv"):
            self.s["scale_" + n].copy_(self._pow2_scale(self.s["amax_" + n]))
        torch.cuda.synchronize()
        self.notes.append("fwd/bwd/step time the cuDNN graphs; quant_ms (q/k/v, unfused torch ops) "
                          "is not included in them; the backward also needs dO quantized (not timed)")

    def result(self, state, grads):
        def deq(x8, scale):
            return x8.float() / scale.reshape(1, 1, 1)

        return (deq(self.o8, self.s["scale_o"]), deq(self.dq8, self.s["scale_dq"]),
                deq(self.dk8, self.s["scale_dk"]), deq(self.dv8, self.s["scale_dv"]))


def baseline_factories(cudnn_fp8_ragged: bool = False) -> List[Tuple[str, Callable[[Inputs], Impl]]]:
    """Baselines in the order they run; availability is decided per workload (errors recorded)."""
    import importlib.util

    out: List[Tuple[str, Callable[[Inputs], Impl]]] = [
        ("sdpa_cudnn", SdpaCudnnImpl),
        ("fa2_varlen_torch", Fa2AtenImpl),
        ("flex_attention", FlexImpl),
        ("cudnn_thd", CudnnThdImpl),
        ("cudnn_fp8", lambda inp: CudnnFp8Impl(inp, allow_ragged=cudnn_fp8_ragged)),
    ]
    for mod in ("flash_attn", "flash_attn_interface"):
        if importlib.util.find_spec(mod) is not None:
            out.append((mod, lambda inp, m=mod: FlashAttnPkgImpl(inp, m)))
    if importlib.util.find_spec("transformer_engine") is not None:
        out.append(("transformer_engine", TransformerEngineImpl))
    return out


def missing_baselines() -> Dict[str, str]:
    import importlib.util

    miss = {}
    for mod, label in (("cudnn", "cudnn_thd, cudnn_fp8 (cuDNN python frontend, `import cudnn`)"),
                       ("flash_attn", "flash_attn2"), ("flash_attn_interface", "flash_attn3"),
                       ("transformer_engine", "transformer_engine")):
        if importlib.util.find_spec(mod) is None:
            miss[label] = "not available"
    return miss


# ---- timing ----------------------------------------------------------------------------------
class Nvml:
    """The board's energy counter, SM clock and power through NVML (the driver's library, by
    ctypes: no Python package needed). Every reading is None where the driver lacks one."""

    def __init__(self, cuda_device: int):
        import ctypes
        import torch

        self._c = ctypes
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self._lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        index = torch.cuda._get_nvml_device_index(cuda_device) if hasattr(torch.cuda, "_get_nvml_device_index") \
            else cuda_device
        self._h = ctypes.c_void_p()
        if self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self._h)) != 0:
            raise RuntimeError(f"no NVML device {index}")

    def _read(self, fn: str, ctype, *args) -> Optional[int]:
        v = ctype()
        rc = getattr(self._lib, fn)(self._h, *args, self._c.byref(v))
        return int(v.value) if rc == 0 else None

    def energy_mj(self) -> Optional[int]:
        return self._read("nvmlDeviceGetTotalEnergyConsumption", self._c.c_ulonglong)

    def sm_mhz(self) -> Optional[int]:
        return self._read("nvmlDeviceGetClockInfo", self._c.c_uint, self._c.c_int(1))  # NVML_CLOCK_SM

    def power_mw(self) -> Optional[int]:
        return self._read("nvmlDeviceGetPowerUsage", self._c.c_uint)


class Timer:
    def __init__(self, iters: int, warmup: int, sustained_s: float = 0.0):
        import torch

        self.iters, self.warmup = iters, warmup
        # Sustained steps: back to back for sustained_s seconds after as long a run untimed, so
        # that the board reaches the clock its power cap allows (a training run's state; the
        # median of flushed single calls reads the step before the cap bites).
        self.sustained_s = sustained_s
        self.nvml: Optional[Nvml] = None
        if sustained_s > 0:
            try:
                self.nvml = Nvml(torch.cuda.current_device())
            except Exception as e:  # no energy or clock figures, the times still count
                log(f"NVML unavailable ({_err(e)}): sustained steps without energy and clock")
        self.flush_buf = torch.empty((L2_FLUSH_BYTES // 4,), dtype=torch.int32, device="cuda")
        self.torch = torch

    def _pre(self) -> None:
        # Evict L2 (a 256 MB write, larger than H200's 50 MB L2), then let the GPU idle-spin
        # briefly so the host's launches of the measured call queue up behind it and host
        # overhead does not show as GPU time.
        self.flush_buf.zero_()
        if hasattr(self.torch.cuda, "_sleep"):
            self.torch.cuda._sleep(50_000)

    def run(self, impls: List[Impl]) -> List[Dict[str, Any]]:
        """Times a workload's implementations in turn: self.iters rounds, each calling every
        implementation's phases once (quantization where it has one, forward, backward, step),
        each round in its own order, and the median of each phase over the rounds. In turn
        rather than one after another, so that every implementation's calls follow the same
        mix of work: timed one after another, the later ones ran on a board the earlier ones
        had heated (on an H200 fixed-16k's fp8_mixed forward read 17 % slower than fp8's, the
        same kernels; back to back at the power cap the two read within 0.1 % on an H100).
        An implementation whose call raises gets {"error": ...} and leaves the rounds."""
        torch = self.torch
        res: List[Dict[str, Any]] = [{"quant_ms": None} for _ in impls]
        for impl in impls:
            for _ in range(self.warmup):
                impl.bwd(impl.fwd())
            if impl.has_quant:
                impl.quant()  # its buffer outside the timed calls
        torch.cuda.synchronize()

        def phases(impl: Impl):
            # (name, call, setup): setup's result is the call's argument, made untimed.
            out = [("quant", lambda _: impl.quant(), None)] if impl.has_quant else []
            return out + [("fwd", lambda _: impl.fwd(), None),
                          ("bwd", lambda st: impl.bwd(st), impl.fwd),
                          ("step", lambda _: impl.bwd(impl.fwd()), None)]

        events: List[Dict[str, list]] = [{} for _ in impls]
        keep: Dict[Tuple[int, str], Any] = {}  # each phase's last result: freed outside the timed calls
        for rnd in range(self.iters):
            # Each round in its own order (seeded: the same in every run), so that no
            # implementation always follows the same one: in one fixed order fp8's forward,
            # following cuDNN FP8's step, read 4-5 % slower than fp8_mixed's at fixed-16k (H100).
            order = list(range(len(impls)))
            random.Random(rnd).shuffle(order)
            for i in order:
                impl = impls[i]
                if "error" in res[i]:
                    continue
                try:
                    for name, call, setup in phases(impl):
                        arg = setup() if setup is not None else None
                        self._pre()
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        r = call(arg)
                        b.record()
                        events[i].setdefault(name, []).append((a, b))
                        keep[(i, name)] = r
                except Exception as e:
                    res[i] = {"error": _err(e)}
        torch.cuda.synchronize()
        keep.clear()
        for i, impl in enumerate(impls):
            if "error" in res[i]:
                continue
            # Each phase's times round by round beside their median: how far apart the rounds
            # are says which differences a run resolves.
            samples = {name: [a.elapsed_time(b) for a, b in pairs] for name, pairs in events[i].items()}
            for name, ms in samples.items():
                res[i][f"{name}_ms"] = statistics.median(ms)
            res[i]["rounds_ms"] = {name: [_r(x) for x in ms] for name, ms in samples.items()}
            if self.sustained_s > 0:
                res[i]["sustained"] = self.sustained(impl, res[i]["step_ms"], res[i]["fwd_ms"])
        return res

    def sustained(self, impl: Impl, step_ms: float, fwd_ms: float) -> Dict[str, Any]:
        """Steps, then forwards, run back to back: mean time, energy a call, power and SM clock."""
        step = self.back_to_back(lambda: impl.bwd(impl.fwd()), step_ms)
        fwd = self.back_to_back(impl.fwd, fwd_ms)
        return {"steps": step["calls"], "step_ms": step["ms"], "joules_per_step": step["joules"],
                "watts": step["watts"], "sm_mhz": step["sm_mhz"], "sm_mhz_min": step["sm_mhz_min"], "fwd": fwd}

    def back_to_back(self, fn: Callable[[], Any], ms_hint: float) -> Dict[str, Optional[float]]:
        import threading

        torch = self.torch
        n = max(3, int(self.sustained_s * 1e3 / ms_hint))
        for _ in range(n):  # as long again, untimed: the clock settles where the power cap puts it
            fn()
        torch.cuda.synchronize()
        samples: List[Tuple[Optional[int], Optional[int]]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                samples.append((self.nvml.sm_mhz(), self.nvml.power_mw()))

        sampler = threading.Thread(target=sample, daemon=True) if self.nvml else None
        e0 = self.nvml.energy_mj() if self.nvml else None
        if sampler:
            sampler.start()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        e1 = self.nvml.energy_mj() if self.nvml else None
        done.set()
        if sampler:
            sampler.join()
        mhz = [c for c, _ in samples if c is not None]
        mw = [p for _, p in samples if p is not None]
        # The counter advances in steps (about 0.1 s apart on an H200): a window it did not
        # cross reads no energy rather than zero.
        joules = (e1 - e0) * 1e-3 / n if e0 is not None and e1 is not None and e1 > e0 else None
        return {"calls": n, "ms": _r(a.elapsed_time(b) / n), "joules": _r(joules, 4),
                "watts": _r(statistics.mean(mw) * 1e-3, 1) if mw else None,
                "sm_mhz": _r(statistics.mean(mhz), 0) if mhz else None,
                "sm_mhz_min": min(mhz) if mhz else None}


# ---- accuracy and properties -----------------------------------------------------------------
def sample_docs(w: Workload) -> List[int]:
    """A few documents: the first, one of median length and the longest."""
    n = len(w.lengths)
    order = sorted(range(n), key=lambda i: w.lengths[i])
    picks = [0, order[n // 2], order[-1]]
    return sorted(set(picks))


def sample_kv_heads(w: Workload) -> List[int]:
    # MHA: the first two heads. GQA: the first KV head with all its query heads.
    return [0, 1][: w.hkv] if w.hq == w.hkv else [0]


def accuracy(ref, out, dq, dk, dv) -> Dict[str, Optional[float]]:
    from .reference import rel_l2

    r: Dict[str, Optional[float]] = {}
    r["o"] = rel_l2(ref.select_q(out), ref.out)
    r["dq"] = rel_l2(ref.select_q(dq), ref.dq) if dq is not None else None
    r["dk"] = rel_l2(ref.select_kv(dk), ref.dk) if dk is not None else None
    r["dv"] = rel_l2(ref.select_kv(dv), ref.dv) if dv is not None else None
    return {k: (round(v, 5) if v is not None else None) for k, v in r.items()}


def flamia_properties(inp: Inputs, recipe: str) -> Dict[str, Any]:
    """Bitwise causal safety and document isolation on this workload (DESIGN.md section 3)."""
    import torch
    import flamia

    w = inp.w
    cu = w.cu_seqlens
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    res: Dict[str, Any] = {}

    def run_fwd(q, k, v):
        with torch.no_grad():
            return flamia.attention(q, k, v, inp.cu, w.max_seqlen, causal=w.causal, recipe=recipe,
                                    return_lse=True)

    def big_noise(x):
        # Large values change every per-token scale of the perturbed rows.
        return (torch.randn(x.shape, generator=g, device="cuda") * 1000.0).to(x.dtype)

    o0, l0 = run_fwd(inp.q, inp.k, inp.v)
    # Causal: perturb q/k/v after position t of the longest document.
    if w.causal:
        d = max(range(len(w.lengths)), key=lambda i: w.lengths[i])
        s, n = cu[d], w.lengths[d]
        t = min(n - 2, n // 2 + 37) if n > 2 else 0
        if n > 1:
            q, k, v = inp.q.clone(), inp.k.clone(), inp.v.clone()
            for x in (q, k, v):
                x[s + t + 1:s + n] = big_noise(x[s + t + 1:s + n])
            o1, l1 = run_fwd(q, k, v)
            res["causal_doc"], res["causal_t"] = d, t
            res["causal_bitwise"] = bool(torch.equal(o0[s:s + t + 1], o1[s:s + t + 1]) and
                                         torch.equal(l0[:, s:s + t + 1], l1[:, s:s + t + 1]))
            del q, k, v, o1, l1
    # Document isolation: perturb a whole document (forward and backward).
    if len(w.lengths) > 1:
        d = len(w.lengths) // 2
        s, e = cu[d], cu[d + 1]
        q, k, v = inp.q.clone(), inp.k.clone(), inp.v.clone()
        for x in (q, k, v):
            x[s:e] = big_noise(x[s:e])
        o1, l1 = run_fwd(q, k, v)
        keep = torch.ones(w.total_tokens, dtype=torch.bool, device="cuda")
        keep[s:e] = False
        res["doc_perturbed"] = d
        res["doc_fwd_bitwise"] = bool(torch.equal(o0[keep], o1[keep]) and torch.equal(l0[:, keep], l1[:, keep]))

        def grads(qq, kk, vv):
            qq, kk, vv = (x.detach().requires_grad_() for x in (qq, kk, vv))
            out = flamia.attention(qq, kk, vv, inp.cu, w.max_seqlen, causal=w.causal, recipe=recipe)
            return torch.autograd.grad(out, (qq, kk, vv), inp.dout)

        g0 = grads(inp.q, inp.k, inp.v)
        g0b = grads(inp.q, inp.k, inp.v)
        g1 = grads(q, k, v)
        res["bwd_deterministic"] = all(bool(torch.equal(a, b)) for a, b in zip(g0, g0b))
        res["doc_bwd_dk_dv_bitwise"] = bool(torch.equal(g0[1][keep], g1[1][keep]) and
                                            torch.equal(g0[2][keep], g1[2][keep]))
        res["doc_bwd_dq_bitwise"] = bool(torch.equal(g0[0][keep], g1[0][keep]))
        del q, k, v, o1, l1, g0, g0b, g1
    return res


# ---- driver ----------------------------------------------------------------------------------
@dataclass
class Record:
    workload: str
    impl: str
    recipe: str
    quant_ms: Optional[float] = None
    fwd_ms: Optional[float] = None
    bwd_ms: Optional[float] = None
    step_ms: Optional[float] = None
    fwd_tflops: Optional[float] = None
    step_tflops: Optional[float] = None
    # Peak bytes allocated through PyTorch's allocator while the implementation is built and
    # runs one step (forward + backward), above what was allocated before (the shared inputs):
    # its own input copies or layout conversions, workspaces, saved state, outputs and the
    # three gradients (the last four tensors are the same size for every implementation).
    step_peak_mib: Optional[float] = None
    precision: str = "bf16"
    errors: Dict[str, Optional[float]] = field(default_factory=dict)
    gqa: str = "n/a"
    notes: List[str] = field(default_factory=list)
    error: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


def _r(x: Optional[float], nd: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def prepare_impl(make: Callable[[], Impl], label: Tuple[str, str], w: Workload, ref, precision_hint: str,
                 skipped: Optional[List[Dict[str, str]]] = None) -> Tuple[Optional[Record], Optional[Impl]]:
    """Build one implementation, take its step's peak memory and validate it (accuracy vs the
    float64 reference, when checks are on): (record, implementation to time), or (record with
    its error, None). A NotImplementedError (missing module, unsupported configuration) is a
    skip: logged, appended to `skipped`, (None, None)."""
    import torch

    rec = Record(w.name, label[0], label[1], precision=precision_hint)
    impl: Optional[Impl] = None
    try:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        impl = make()
        rec.impl, rec.recipe, rec.precision = impl.name, impl.recipe, impl.precision
        rec.gqa = getattr(impl, "gqa", "n/a")
        rec.notes = impl.notes
        st = impl.fwd()
        gr = impl.bwd(st)
        torch.cuda.synchronize()
        rec.step_peak_mib = _r((torch.cuda.max_memory_allocated() - before) / 2**20, 1)
        del st, gr
        if ref is not None:
            log(f"{w.name} {rec.impl}/{rec.recipe}: checking accuracy")
            st = impl.fwd()
            gr = impl.bwd(st)
            out, dq, dk, dv = impl.result(st, gr)
            rec.errors = accuracy(ref, out, dq, dk, dv)
            del st, gr, out, dq, dk, dv
            bad = {k: v for k, v in rec.errors.items() if v is None or not v <= VALIDATION_MAX_REL_L2}
            if bad:
                raise RuntimeError(f"validation failed: rel. L2 errors {bad} above {VALIDATION_MAX_REL_L2} "
                                   f"(all: {rec.errors}); not timed")
        return rec, impl
    except NotImplementedError as e:
        log(f"{w.name} {label[0]}: skipped ({e})")
        if skipped is not None:
            skipped.append({"workload": w.name, "impl": label[0], "reason": str(e)})
        rec = None
    except Exception as e:
        rec.error = _err(e)
        log(f"{w.name} {rec.impl}/{rec.recipe}: FAILED {rec.error}")
        if os.environ.get("FLAMIA_BENCH_TRACEBACK"):
            traceback.print_exc()
    if impl is not None:
        impl.close()
    del impl
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rec, None


def time_impls(prepared: List[Tuple[Record, Impl]], w: Workload, timer: Timer) -> None:
    """Time the prepared implementations of a workload in turn (Timer.run) into their records,
    then release them."""
    import torch

    log(f"{w.name}: timing {len(prepared)} implementations in turn ({timer.iters} rounds)")
    try:
        results = timer.run([impl for _, impl in prepared])
    except Exception as e:  # outside any one call (the warm-up): every record carries it
        results = [{"error": _err(e)} for _ in prepared]
        if os.environ.get("FLAMIA_BENCH_TRACEBACK"):
            traceback.print_exc()
    for (rec, impl), t in zip(prepared, results):
        if "error" in t:
            rec.error = t["error"]
            log(f"{w.name} {rec.impl}/{rec.recipe}: FAILED {rec.error}")
        else:
            rec.quant_ms, rec.fwd_ms, rec.bwd_ms, rec.step_ms = (_r(t["quant_ms"]), _r(t["fwd_ms"]),
                                                                 _r(t["bwd_ms"]), _r(t["step_ms"]))
            rec.extra["rounds_ms"] = t["rounds_ms"]
            if "sustained" in t:
                rec.extra["sustained"] = t["sustained"]
            rec.fwd_tflops = _r(w.fwd_flops() / (t["fwd_ms"] * 1e-3) / 1e12, 1)
            rec.step_tflops = _r((w.fwd_flops() + w.bwd_flops()) / (t["step_ms"] * 1e-3) / 1e12, 1)
            log(f"{w.name} {rec.impl}/{rec.recipe}: fwd {rec.fwd_ms} ms, bwd {rec.bwd_ms} ms, step {rec.step_ms} ms "
                f"({rec.fwd_tflops} / {rec.step_tflops} TFLOPS); errors {rec.errors}")
            if "sustained" in t:
                log(f"{w.name} {rec.impl}/{rec.recipe}: sustained {t['sustained']}")
        impl.close()
    prepared.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def add_speedups(recs: List[Record]) -> None:
    """Fill the speedup keys of flamia records against the fastest baselines of the workload:
    by the median times and, where they were measured, by the sustained ones."""
    base = [r for r in recs if r.impl != "flamia" and r.error is None]
    bf16 = [r for r in base if r.precision == "bf16"]

    def fastest(pool: List[Record], key: Callable[[Record], Optional[float]]) -> Optional[Record]:
        return min((r for r in pool if key(r) is not None), key=key, default=None)

    def ratio(b: Optional[Record], key: Callable[[Record], Optional[float]], r: Record) -> Optional[float]:
        return _r(key(b) / key(r), 3) if b and key(r) else None

    step = lambda r: r.step_ms  # noqa: E731
    fwd = lambda r: r.fwd_ms  # noqa: E731
    sus = lambda r: r.extra.get("sustained", {}).get("step_ms")  # noqa: E731
    sus_fwd = lambda r: (r.extra.get("sustained", {}).get("fwd") or {}).get("ms")  # noqa: E731
    b_step, b_fwd, f_step, f_fwd = fastest(base, step), fastest(base, fwd), fastest(bf16, step), fastest(bf16, fwd)
    b_sus, f_sus = fastest(base, sus), fastest(bf16, sus)
    b_sus_fwd, f_sus_fwd = fastest(base, sus_fwd), fastest(bf16, sus_fwd)
    for r in recs:
        if r.impl != "flamia" or r.error is not None:
            continue
        r.extra.update({
            "best_baseline": f"{b_step.impl}/{b_step.recipe}" if b_step else None,
            "best_fwd_baseline": f"{b_fwd.impl}/{b_fwd.recipe}" if b_fwd else None,
            "fwd_speedup_vs_best_baseline": ratio(b_fwd, fwd, r),
            "step_speedup_vs_best_baseline": ratio(b_step, step, r),
            "best_bf16": f"{f_step.impl}" if f_step else None,
            "fwd_speedup_vs_best_bf16": ratio(f_fwd, fwd, r),
            "step_speedup_vs_best_bf16": ratio(f_step, step, r),
        })
        if sus(r):
            r.extra["sustained"].update({
                "best_baseline": f"{b_sus.impl}/{b_sus.recipe}" if b_sus else None,
                "step_speedup_vs_best_baseline": ratio(b_sus, sus, r),
                "step_speedup_vs_best_bf16": ratio(f_sus, sus, r),
                "fwd_speedup_vs_best_baseline": ratio(b_sus_fwd, sus_fwd, r),
                "fwd_speedup_vs_best_bf16": ratio(f_sus_fwd, sus_fwd, r),
            })


def print_table(recs: List[Record]) -> None:
    cols = ["workload", "impl", "recipe", "quant", "fwd", "bwd", "step", "fwdTF", "stepTF",
            "errO", "errdQ", "errdK", "errdV", "xbest", "xbf16", "peakMiB"]
    rows = []
    for r in recs:
        def f(x: Any, nd: int = 3) -> str:
            return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, (int, float)) else str(x))

        e = r.errors
        rows.append([r.workload, r.impl, r.recipe, f(r.quant_ms), f(r.fwd_ms), f(r.bwd_ms), f(r.step_ms),
                     f(r.fwd_tflops, 1), f(r.step_tflops, 1),
                     f(e.get("o"), 4), f(e.get("dq"), 4), f(e.get("dk"), 4), f(e.get("dv"), 4),
                     f(r.extra.get("step_speedup_vs_best_baseline"), 2),
                     f(r.extra.get("step_speedup_vs_best_bf16"), 2), f(r.step_peak_mib, 0)])
        if r.error:
            rows[-1][3] = "ERROR: " + r.error[:70]
            rows[-1][4:] = [""] * (len(cols) - 4)
    widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
    widths[3] = max(len(cols[3]), max((len(x[3]) for x in rows if not x[3].startswith("ERROR")), default=5))
    print()
    print("times in ms (median); TF = TFLOPS (DESIGN.md §4); err = rel. L2 vs float64 on a sample; "
          "x = step speedup of flamia; peakMiB = peak allocation of building the implementation and one "
          "step, beyond the shared inputs")
    print_rows(cols, rows, widths)
    sustained_table(recs)


def print_rows(cols: List[str], rows: List[List[str]], widths: Optional[List[int]] = None) -> None:
    """A header and its rows in aligned columns, then a blank line."""
    if widths is None:
        widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(wd) for c, wd in zip(cols, widths)))
    for x in rows:
        print("  ".join(v.ljust(wd) for v, wd in zip(x, widths)).rstrip())
    print(flush=True)


def sustained_table(recs: List[Record]) -> None:
    """The sustained steps (--sustained), when measured."""
    recs = [r for r in recs if r.extra.get("sustained")]
    if not recs:
        return
    cols = ["workload", "impl", "recipe", "steps", "step", "J/step", "W", "MHz", "minMHz", "xbest", "xbf16",
            "fwd", "J/fwd", "fwdMHz", "xfwd", "xfwdbf16"]
    f = lambda v, nd=3: "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))  # noqa: E731
    rows = []
    for r in recs:
        x = r.extra["sustained"]
        fw = x.get("fwd") or {}
        rows.append([r.workload, r.impl, r.recipe, f(x["steps"]), f(x["step_ms"]), f(x["joules_per_step"]),
                     f(x["watts"], 1), f(x["sm_mhz"], 0), f(x["sm_mhz_min"]),
                     f(x.get("step_speedup_vs_best_baseline"), 2), f(x.get("step_speedup_vs_best_bf16"), 2),
                     f(fw.get("ms")), f(fw.get("joules"), 4), f(fw.get("sm_mhz"), 0),
                     f(x.get("fwd_speedup_vs_best_baseline"), 2), f(x.get("fwd_speedup_vs_best_bf16"), 2)])
    print("sustained, back to back after as long a run untimed (steps, then forwards): mean ms, joules a call "
          "(NVML energy counter), the steps' mean watts, mean and lowest SM clock; x = flamia's speedup")
    print_rows(cols, rows)


def draw_charts(recs: List[Record], out_dir: str) -> List[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"charts skipped: matplotlib not available ({_err(e)})")
        return []
    files = []
    # 1. Speedup of flamia over the fastest baseline, per workload.
    wls = []
    for r in recs:
        if r.workload not in wls:
            wls.append(r.workload)
    fl = {(r.workload, r.recipe): r for r in recs if r.impl == "flamia" and r.error is None}
    if fl:
        fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(wls)) * 2, 4.5))
        for ax, key, title in ((axes[0], "step_speedup_vs_best_baseline", "fwd+bwd (step)"),
                               (axes[1], "fwd_speedup_vs_best_baseline", "quant+fwd")):
            width = 0.8 / len(FLAMIA_RECIPES)
            top = 1.0
            for i, rcp in enumerate(FLAMIA_RECIPES):
                ys = [fl[(wl, rcp)].extra.get(key) if (wl, rcp) in fl else None for wl in wls]
                top = max([top] + [y for y in ys if y])
                xs = [j + i * width for j in range(len(wls))]
                bars = ax.bar(xs, [y or 0 for y in ys], width, label=f"flamia {rcp}")
                for bx, y in zip(bars, ys):
                    if y:
                        ax.text(bx.get_x() + bx.get_width() / 2, y, f"{y:.2f}", ha="center", va="bottom",
                                fontsize=7)
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(wls))])
            ax.set_xticklabels(wls, rotation=30, ha="right")
            ax.set_ylabel("speedup vs fastest baseline")
            ax.set_title(f"flamia {title} speedup over the fastest baseline")
            ax.set_ylim(0, 1.3 * top)  # room above the bars' labels for the legend
            ax.legend(fontsize=8, loc="upper left", ncol=len(FLAMIA_RECIPES))
        fig.tight_layout()
        p = os.path.join(out_dir, "speedup.png")
        fig.savefig(p, dpi=120)
        plt.close(fig)
        files.append(p)
    # 2. TFLOPS by document length on the fixed-length workloads.
    fixed = {"fixed-4k": 4096, "fixed-8k": 8192, "fixed-16k": 16384, "fixed-32k": 32768}
    series: Dict[str, List[Tuple[int, float]]] = {}
    for r in recs:
        if r.workload in fixed and r.error is None and r.step_tflops:
            series.setdefault(f"{r.impl}/{r.recipe}", []).append((fixed[r.workload], r.step_tflops))
    if series:
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, pts in sorted(series.items()):
            pts.sort()
            style = "-o" if name.startswith("flamia") else "--s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(fixed.values()))
        ax.set_xticklabels(["4k", "8k", "16k", "32k"])
        ax.set_xlabel("document length (32k tokens per pack)")
        ax.set_ylabel("fwd+bwd TFLOPS")
        ax.set_title("Causal attention fwd+bwd TFLOPS by document length (Hq=16, D=128)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(out_dir, "tflops_by_length.png")
        fig.savefig(p, dpi=120)
        plt.close(fig)
        files.append(p)
    return files


def environment() -> Dict[str, Any]:
    import torch

    env: Dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host_python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    try:
        import cudnn

        env["cudnn_frontend"] = getattr(cudnn, "__version__", "?")
        try:
            env["cudnn_frontend_backend"] = str(cudnn.backend_version())
        except Exception:
            pass
    except Exception:
        env["cudnn_frontend"] = "not available"
    try:
        import flamia

        env["flamia"] = flamia.library_version()
    except Exception as e:
        env["flamia"] = f"unavailable: {_err(e)}"
    return env


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flamia.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/bench", help="output folder for bench.json and PNGs")
    p.add_argument("--workloads", default=None,
                   help=f"comma-separated subset of: {','.join(WORKLOADS)} (default: all; --quick: a subset)")
    p.add_argument("--quick", action="store_true", help="fewer iterations and workloads (< 6 min on an H200)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed rounds, each implementation's phases once a round, in turn (default 20; quick 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed fwd+bwd calls first (default 3; quick 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--impls", default=None, help="comma-separated subset of implementations to run "
                                                 "(flamia, sdpa_cudnn, fa2_varlen_torch, flex_attention, cudnn_thd, "
                                                 "cudnn_fp8, flash_attn, flash_attn_interface, transformer_engine)")
    p.add_argument("--no-checks", action="store_true", help="skip accuracy and bitwise checks")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="also time steps, then forwards, back to back for SECONDS each (after as long untimed) "
                        "with the board's energy a call, power and SM clock (NVML): at the clock the power cap "
                        "allows")
    p.add_argument("--low-memory", action="store_true",
                   help="run flamia with low_memory=True (fp8_mixed then keeps a BF16 attention's memory and "
                        "quantizes again in its backward; fp8's records are unchanged): what that costs a step")
    p.add_argument("--cudnn-fp8-ragged", action="store_true",
                   help="also run cudnn_fp8 on the long-tailed packs as ragged THD (off by default: with cuDNN "
                        "9.19 on sm_90 it is unsupported or faults; use a process of its own)")
    p.add_argument("--charts-from", default=None, metavar="BENCH_JSON",
                   help="only draw the charts of an earlier run's bench.json into --out (no GPU needed)")
    p.add_argument("--table-from", default=None, metavar="BENCH_JSON",
                   help="only print the markdown table (forward, step, peak memory) of an earlier run's "
                        "bench.json (no GPU needed)")
    return p.parse_args(argv)


def records_from_json(path: str) -> List[Record]:
    """The records of a bench.json, as the run that wrote it held them."""
    with open(path) as f:
        doc = json.load(f)
    names = set(Record.__dataclass_fields__)
    recs = []
    for d in doc["records"]:
        rec = Record(**{k: v for k, v in d.items() if k in names and k != "extra"})
        rec.extra = {k: v for k, v in d.items() if k not in names}
        recs.append(rec)
    return recs


# The README's benchmark table: columns in this order where the run has them.
TABLE_COLUMNS = [("flamia", "fp8", "flamia fp8"), ("flamia", "fp8_mixed", "flamia fp8_mixed"),
                 ("sdpa_cudnn", "bf16", "cuDNN SDPA BF16"), ("cudnn_thd", "bf16", "cuDNN ragged BF16"),
                 ("fa2_varlen_torch", "bf16", "FA2 varlen BF16"), ("flash_attn", "bf16", "FlashAttention BF16"),
                 ("cudnn_fp8", "fp8_per_tensor", "cuDNN FP8 (per-tensor)")]


def markdown_table(recs: List[Record], workloads: Optional[Dict[str, Any]] = None) -> str:
    """Forward, step and peak-memory rows per workload, every implementation of the run side by side;
    a flamia step faster than every BF16 baseline's in bold. '—': not run, or failed."""
    by = {(r.workload, r.impl, r.recipe): r for r in recs if r.error is None}
    cols = [c for c in TABLE_COLUMNS if any((i, rc) == (c[0], c[1]) for (_, i, rc) in by)]
    wls: List[str] = []
    for r in recs:
        if r.workload not in wls:
            wls.append(r.workload)
    lines = ["| workload | | " + " | ".join(c[2] for c in cols) + " |", "| --- | --- |" + " --- |" * len(cols)]
    for wl in wls:
        meta = (workloads or {}).get(wl, {})
        docs = meta.get("lengths_summary", {}).get("docs")
        label = f"{wl} ({docs} docs)" if docs and not wl.startswith("fixed") else wl
        bf16_steps = [r.step_ms for (w, i, rc), r in by.items()
                      if w == wl and i != "flamia" and r.precision == "bf16" and r.step_ms]

        def cell(impl: str, rcp: str, what: str) -> str:
            r = by.get((wl, impl, rcp))
            if r is None:
                return "—"
            if what == "peak":
                return f"{r.step_peak_mib:.0f}" if r.step_peak_mib else "—"
            ms, tf = (r.fwd_ms, r.fwd_tflops) if what == "fwd" else (r.step_ms, r.step_tflops)
            if not ms:
                return "—"
            text = f"{ms:.2f} ({tf:.0f})" if tf else f"{ms:.2f}"
            if what == "step" and impl == "flamia" and bf16_steps and ms < min(bf16_steps):
                text = f"**{text}**"
            return text

        for what, name in (("fwd", "forward ms (TFLOPS)"), ("step", "step ms (TFLOPS)"), ("peak", "peak MiB")):
            lines.append(f"| {label} | {name} | " + " | ".join(cell(c[0], c[1], what) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.table_from:
        with open(a.table_from) as f:
            meta = json.load(f).get("workloads")
        print(markdown_table(records_from_json(a.table_from), meta))
        return 0
    if a.charts_from:
        os.makedirs(a.out, exist_ok=True)
        for path in draw_charts(records_from_json(a.charts_from), a.out):
            log(f"wrote {path}")
        return 0
    iters = a.iters if a.iters is not None else (5 if a.quick else 20)
    warmup = a.warmup if a.warmup is not None else (2 if a.quick else 3)
    if a.workloads:
        names = [x.strip() for x in a.workloads.split(",") if x.strip()]
        bad = [n for n in names if n not in WORKLOADS]
        if bad:
            print(f"unknown workloads {bad}; known: {list(WORKLOADS)}", file=sys.stderr)
            return 2
    else:
        names = QUICK_WORKLOADS if a.quick else list(WORKLOADS)
    impl_filter = set(x.strip() for x in a.impls.split(",")) if a.impls else None

    import torch

    if not torch.cuda.is_available():
        print("flamia.bench needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    from .reference import attention_reference

    os.makedirs(a.out, exist_ok=True)
    env = environment()
    log(f"GPU {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
        f"flamia {env['flamia']}")
    log(f"workloads {names}; iters {iters}, warm-up {warmup}; input seed {a.seed}")
    missing = missing_baselines()
    for k, v in missing.items():
        log(f"baseline {k}: {v}")
    timer = Timer(iters, warmup, a.sustained)
    records: List[Record] = []
    skipped: List[Dict[str, str]] = []
    workloads_meta: Dict[str, Any] = {}

    def write_json() -> str:
        doc = {**env, "iters": iters, "warmup": warmup, "input_seed": a.seed, "l2_flush_bytes": L2_FLUSH_BYTES,
               "timing": "CUDA events, median over rounds in which the implementations take turns; L2 flushed "
                         "before every timed call; flamia fwd includes quantization",
               "sustained_s": a.sustained, "flamia_low_memory": a.low_memory,
               "flops": "causal fwd = 4*D*Hq*sum L(L+1)/2; bwd = 2.5 x fwd; step = fwd + bwd",
               "accuracy": "relative L2 vs exact float64 attention on the sampled documents/heads",
               "speedups": "flamia records: baseline time / flamia time; best_baseline = the fastest step among "
                           "all baselines (BF16 and FP8), best_bf16 = the fastest BF16 one; fwd speedups use the "
                           "fastest forward",
               "validation": f"before timing; a record above {VALIDATION_MAX_REL_L2} rel. L2 is failed, not timed",
               "baselines_missing": missing, "skipped": skipped, "workloads": workloads_meta,
               "records": [r.to_json() for r in records]}
        jpath = os.path.join(a.out, "bench.json")
        with open(jpath, "w") as f:
            json.dump(doc, f, indent=1)
        return jpath

    flamia_ok = True
    try:
        import flamia  # noqa: F401
        from . import _lib

        _lib.get()
    except Exception as e:
        flamia_ok = False
        flamia_err = _err(e)
        log(f"flamia library unavailable: {flamia_err}")

    for wi, name in enumerate(names):
        w = WORKLOADS[name]
        log(f"=== [{wi + 1}/{len(names)}] {w.describe()}")
        meta: Dict[str, Any] = {"total_tokens": w.total_tokens, "hq": w.hq, "hkv": w.hkv, "head_dim": w.head_dim,
                                "causal": w.causal, "fwd_flops": w.fwd_flops(), "bwd_flops": w.bwd_flops(),
                                "lengths_summary": length_summary(w.lengths)}
        if not w.fixed:
            meta["length_seed"] = w.seed
            meta["lengths"] = w.lengths
        workloads_meta[name] = meta
        recs: List[Record] = []
        try:
            inp = make_inputs(w, a.seed)
            ref = None
            if not a.no_checks:
                docs, kvh = sample_docs(w), sample_kv_heads(w)
                t0 = time.time()
                ref = attention_reference(inp.q, inp.k, inp.v, w.cu_seqlens, w.causal, inp.scale, dout=inp.dout,
                                          docs=docs, kv_heads=kvh)
                meta["accuracy_sample"] = {"docs": docs, "doc_lengths": [w.lengths[i] for i in docs],
                                           "q_heads": ref.q_heads, "kv_heads": ref.kv_heads}
                log(f"{name}: float64 reference on docs {docs} (lengths {[w.lengths[i] for i in docs]}), "
                    f"q heads {ref.q_heads}: {time.time() - t0:.1f}s")
        except Exception as e:
            log(f"{name}: cannot prepare inputs: {_err(e)}")
            workloads_meta[name]["error"] = _err(e)
            continue

        prepared: List[Tuple[Record, Impl]] = []
        for rcp in FLAMIA_RECIPES:
            if impl_filter and "flamia" not in impl_filter:
                break
            if not flamia_ok:
                recs.append(Record(name, "flamia", rcp, precision="fp8", error=flamia_err))
                continue
            rec, impl = prepare_impl(lambda i=inp, r=rcp: FlamiaImpl(i, r, a.low_memory), ("flamia", rcp), w, ref,
                                     "fp8", skipped)
            if rec is not None:
                if rec.error is None and not a.no_checks:
                    try:
                        log(f"{name} flamia/{rcp}: bitwise causal / document checks")
                        rec.extra["checks"] = flamia_properties(inp, rcp)
                        log(f"{name} flamia/{rcp}: checks {rec.extra['checks']}")
                    except Exception as e:
                        rec.extra["checks"] = {"error": _err(e)}
                        log(f"{name} flamia/{rcp}: checks FAILED {_err(e)}")
                recs.append(rec)
                if impl is not None:
                    prepared.append((rec, impl))
        for key, factory in baseline_factories(a.cudnn_fp8_ragged):
            if impl_filter and key not in impl_filter:
                continue
            prec = "fp8" if key == "cudnn_fp8" else "bf16"
            rec, impl = prepare_impl(lambda i=inp, f=factory: f(i), (key, "fp8_per_tensor" if prec == "fp8" else "bf16"),
                                     w, ref, prec, skipped)
            if rec is not None:
                recs.append(rec)
                if impl is not None:
                    prepared.append((rec, impl))
        time_impls(prepared, w, timer)
        add_speedups(recs)
        records.extend(recs)
        del inp, ref
        torch.cuda.empty_cache()
        write_json()  # after every workload, so that a run cut short keeps what it measured

    print_table(records)
    log(f"wrote {write_json()}")
    for p in draw_charts(records, a.out):
        log(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
