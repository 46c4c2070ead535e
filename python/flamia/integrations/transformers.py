"""Hugging Face transformers integration: flamia as an attention implementation.

    import flamia.integrations.transformers as flamia_hf
    flamia_hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flamia_fp8", dtype=torch.bfloat16)
    # or from_config(config, attn_implementation=...); a loaded model: model.set_attn_implementation(...)

(`dtype` is `torch_dtype` in older transformers releases.)

`register()` adds three implementations to transformers' `AttentionInterface`: "flamia_fp8"
(recipe "fp8"), "flamia_fp8_mixed" (recipe "fp8_mixed") and "flamia_fp8_mixed_low_memory"
(fp8_mixed with `low_memory=True`: the same outputs and gradients, what a BF16 attention keeps
between forward and backward, a slower backward; flamia.ops), and for each a mask function to
`AttentionMaskInterface` (without one, transformers hands a custom implementation no mask at
all, and a padded batch would attend to its padding). Requires transformers >= 4.53 (the first release with
`transformers.masking_utils.AttentionMaskInterface`) and a model whose attention layers call
`AttentionInterface` (Llama, Qwen2, Mistral and most current decoder models).

What the attention function accepts (query [B, H, S, D], key/value [B, Hkv, S, D]), in the
order it looks at it:

1. A 2D padding mask ([B, S], 1 = token): every row's tokens are gathered into one document and
   its padding into a second one (fixed shapes, no host sync), attended, and scattered back.
   Real tokens attend exactly as with SDPA's padding mask, holes included; the outputs at
   padded positions are finite and unspecified, and their padding-only document costs at most
   what SDPA spends on the row. With a mask, position_ids do not split documents (as with SDPA).
2. `cu_seq_lens_q` / `cu_seq_lens_k` keyword arguments (DataCollatorWithFlattening with
   `return_flash_attn_kwargs=True`, or passed to the model's forward): used as flamia's
   cu_seqlens over the B*S tokens. No host sync, no graph break.
3. `position_ids` (DataCollatorWithFlattening's default, or the model's own arange): a document
   starts at each row start and wherever a position is not the previous one + 1 (the rule of
   transformers' own packed-sequence masks). The number of documents sizes cu_seqlens,
   so this costs one host synchronisation per attention layer (torch.nonzero), and a graph
   break under torch.compile unless `torch._dynamo.config.capture_dynamic_output_shape_ops`
   is set. Pass the collator's cu_seq_lens kwargs to avoid both.
4. Neither: each of the B rows is one document.

flamia needs `max_seqlen` only as a validated upper bound on the document lengths (its kernels
schedule their work from cu_seqlens on the device), so B*S is passed and `max_length_q/k` are
never read back: no `.item()` anywhere.

GQA/MQA: Hkv is read from key's shape (Hq must be a multiple). `scaling` is the softmax scale.
Inputs that are not BF16 (an FP32 model, or autocast's FP32 rotary output) are cast to BF16 and
the output back to the query's dtype. Refused with a FlamiaError naming the argument: attention
dropout > 0 (set config.attention_dropout = 0), a sliding window shorter than the sequences,
softcap, attention sinks (s_aux), position bias, a 4D mask, query and key of different lengths
(decoding with a KV cache: generate with attn_implementation "sdpa"), and different head dims
of query and value. Like flash_attention_2, the mask function keeps only the 2D padding mask:
mask overlays that a model adds through `or_mask_function` / `and_mask_function` (e.g.
bidirectional image tokens) are not represented.
"""

import re
from typing import NamedTuple, Optional, Tuple

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("flamia.integrations.transformers needs PyTorch (pip install torch)") from e

from .. import ops
from .._lib import FlamiaError

__all__ = [
    "IMPLEMENTATIONS",
    "MIN_TRANSFORMERS_VERSION",
    "register",
    "attention_forward",
    "padding_mask",
    "cu_seqlens_from_position_ids",
    "PaddedLayout",
    "padded_layout",
]

class Implementation(NamedTuple):
    recipe: str
    low_memory: bool = False


# attn_implementation name -> what flamia runs. No name contains "flash": transformers treats
# those as FlashAttention variants and would try to load a FlashAttention kernel for them.
IMPLEMENTATIONS = {"flamia_fp8": Implementation("fp8"), "flamia_fp8_mixed": Implementation("fp8_mixed"),
                   "flamia_fp8_mixed_low_memory": Implementation("fp8_mixed", low_memory=True)}
MIN_TRANSFORMERS_VERSION = (4, 53)


# ---- registration ----------------------------------------------------------------------------
def _version_tuple(text: str) -> Tuple[int, ...]:
    parts = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)


def _transformers():
    """The transformers module, or ImportError saying what is missing."""
    want = ".".join(map(str, MIN_TRANSFORMERS_VERSION))
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"flamia.integrations.transformers: transformers is not installed; "
                          f"it needs transformers >= {want} (pip install 'transformers>={want}')") from e
    found = getattr(transformers, "__version__", "unknown")
    try:
        from transformers import AttentionInterface  # noqa: F401
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        too_old = _version_tuple(found) < MIN_TRANSFORMERS_VERSION
    except ImportError:
        too_old = True
    if too_old:
        raise ImportError(f"flamia.integrations.transformers: transformers {found} is too old; it needs "
                          f">= {want} (AttentionInterface and masking_utils.AttentionMaskInterface)")
    return transformers


def register() -> Tuple[str, ...]:
    """Add IMPLEMENTATIONS ("flamia_fp8", "flamia_fp8_mixed", "flamia_fp8_mixed_low_memory") to
    transformers' AttentionInterface (and their padding-mask function to AttentionMaskInterface).
    Safe to call more than once. Returns the names, for `attn_implementation=` or
    `model.set_attn_implementation(...)`."""
    _transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, impl in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, _attention_for(impl))
        AttentionMaskInterface.register(name, padding_mask)
    return tuple(IMPLEMENTATIONS)


def _attention_for(impl: Implementation):
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                 scaling=scaling, recipe=impl.recipe, low_memory=impl.low_memory, **kwargs)

    suffix = "_low_memory" if impl.low_memory else ""
    attention.__name__ = attention.__qualname__ = f"flamia_{impl.recipe}{suffix}_attention"
    attention.__doc__ = (f"transformers attention function running flamia's {impl.recipe!r} recipe"
                         f"{' with low_memory' if impl.low_memory else ''}.")
    return attention


def padding_mask(attention_mask: Optional[Tensor] = None, kv_length: Optional[int] = None, **kwargs):
    """Mask function for AttentionMaskInterface: the 2D padding mask, cut to the last
    `kv_length` columns, or None. Unlike flash_attention_2's, it does not test whether the mask
    has any padding (that test reads the mask on the host and breaks a compiled graph): a
    mask without padding takes the padded path, which costs four gathers (q, k, v and the
    output) and computes the same attention."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2 and kv_length is not None:
        attention_mask = attention_mask[:, -kv_length:]
    return attention_mask


# ---- layout helpers (pure torch, run on any device) -------------------------------------------
def cu_seqlens_from_position_ids(position_ids: Tensor, batch: int) -> Tensor:
    """cu_seqlens (int32, [num_docs + 1]) over the batch*S tokens of position_ids [B or 1, S]
    (or [S]). A document starts at every row start and wherever a position is not the previous
    position + 1. Reads the number of documents back to the host: one synchronisation."""
    pos = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
    if pos.dim() != 2:
        raise FlamiaError(f"flamia: position_ids must be [B, S] (or [S]), got shape {tuple(position_ids.shape)}; "
                          "pass cu_seq_lens_q/cu_seq_lens_k for other position encodings")
    if pos.shape[0] != batch:
        if pos.shape[0] != 1:
            raise FlamiaError(f"flamia: position_ids has {pos.shape[0]} rows for a batch of {batch}")
        pos = pos.expand(batch, -1)
    rows, seqlen = pos.shape
    continues = pos[:, 1:] == pos[:, :-1] + 1
    starts = torch.cat((torch.ones_like(continues[:, :1]), ~continues), dim=1)
    first = torch.nonzero(starts.reshape(-1)).squeeze(1)  # the host synchronisation
    return torch.cat((first, first.new_full((1,), rows * seqlen))).to(torch.int32)


class PaddedLayout(NamedTuple):
    """A padded batch [B, S] as a pack of 2B documents: row b's tokens in order, then its padding.

    packed_from_padded[i]: index into the flattened padded batch of packed token i (gather to pack);
    padded_from_packed[j]: packed index of flattened padded token j (gather to unpack);
    cu_seqlens: int32 [2B + 1] = [0, n_0, S, S + n_1, 2S, ..., (B-1)S + n_(B-1), BS].
    """

    packed_from_padded: Tensor
    padded_from_packed: Tensor
    cu_seqlens: Tensor


def padded_layout(attention_mask: Tensor) -> PaddedLayout:
    """The PaddedLayout of a [B, S] padding mask (nonzero / True = token). Fixed shapes and no
    host synchronisation: any mask is expressible, whatever its pattern of padding."""
    if attention_mask.dim() != 2:
        raise FlamiaError(f"flamia: attention_mask must be a 2D padding mask [B, S], got shape "
                          f"{tuple(attention_mask.shape)}; flamia cannot express arbitrary (4D) masks")
    keep = attention_mask.to(torch.bool)
    rows, seqlen = keep.shape
    dev = keep.device
    kept = keep.sum(dim=1)                                   # [B] tokens per row
    kept_before = keep.cumsum(dim=1) - keep.long()           # tokens strictly before each position
    pads_before = torch.arange(seqlen, device=dev) - kept_before
    slot = torch.where(keep, kept_before, kept[:, None] + pads_before)  # a permutation of each row
    row_start = torch.arange(rows, device=dev) * seqlen
    padded_from_packed = (slot + row_start[:, None]).reshape(-1)
    packed_from_padded = torch.empty_like(padded_from_packed).scatter_(
        0, padded_from_packed, torch.arange(rows * seqlen, device=dev))
    bounds = torch.stack((row_start, row_start + kept), dim=1).reshape(-1)
    cu = torch.cat((bounds, bounds.new_full((1,), rows * seqlen))).to(torch.int32)
    return PaddedLayout(packed_from_padded, padded_from_packed, cu)


# ---- the attention function -------------------------------------------------------------------
def _refuse_unsupported(query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float,
                        sliding_window: Optional[int], kwargs) -> None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise FlamiaError("flamia: query/key/value must be [B, H, S, D], got "
                          f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    # The longest document is at most S, or the collator's max_length when it is a Python int.
    longest = query.shape[2]
    if kwargs.get("cu_seq_lens_q") is not None and isinstance(kwargs.get("max_length_q"), int):
        longest = kwargs["max_length_q"]
    if dropout:
        raise FlamiaError(f"flamia: attention dropout must be 0 (got {dropout}); flamia has no attention "
                          "dropout: set config.attention_dropout = 0")
    if sliding_window is not None and longest > sliding_window:
        raise FlamiaError(f"flamia: sliding_window = {sliding_window} is shorter than the sequences "
                          f"({longest} tokens); flamia computes full causal attention only")
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise FlamiaError(f"flamia: {name} is not supported")
    if attention_mask is not None and not (isinstance(attention_mask, Tensor) and attention_mask.dim() == 2):
        shape = tuple(attention_mask.shape) if hasattr(attention_mask, "shape") else type(attention_mask).__name__
        raise FlamiaError(f"flamia: attention_mask must be a 2D padding mask [B, S], got {shape}; flamia "
                          "cannot express arbitrary masks (register() installs the mask function that "
                          "gives it the 2D mask)")
    if key.shape[2] != query.shape[2] or value.shape[2] != query.shape[2]:
        raise FlamiaError(f"flamia: query has {query.shape[2]} tokens but key/value {key.shape[2]}; flamia "
                          "computes self-attention over whole sequences (no KV cache): generate with "
                          "attn_implementation='sdpa'")
    if value.shape[3] != query.shape[3] or key.shape[3] != query.shape[3]:
        raise FlamiaError(f"flamia: query, key and value must share a head dim, got "
                          f"{query.shape[3]}, {key.shape[3]}, {value.shape[3]}")
    if query.shape[1] % key.shape[1] != 0:
        raise FlamiaError(f"flamia: query heads ({query.shape[1]}) must be a multiple of key/value heads "
                          f"({key.shape[1]})")
    if attention_mask is not None and tuple(attention_mask.shape) != (query.shape[0], query.shape[2]):
        raise FlamiaError(f"flamia: attention_mask has shape {tuple(attention_mask.shape)}, expected "
                          f"[B, S] = {(query.shape[0], query.shape[2])}")
    if attention_mask is not None and kwargs.get("cu_seq_lens_q") is not None:
        raise FlamiaError("flamia: got both attention_mask and cu_seq_lens_q; a packed batch carries no "
                          "padding mask (DataCollatorWithFlattening returns none)")


def _tokens_major(x: Tensor) -> Tensor:
    """[B, H, S, D] -> [B*S, H, D] BF16 with a contiguous head dim (a view when x is the usual
    transposed projection output)."""
    B, H, S, D = x.shape
    x = x.transpose(1, 2)
    if x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    x = x.reshape(B * S, H, D)
    return x if x.stride(-1) == 1 else x.contiguous()


def _cu_seqlens(kwargs, batch: int, seqlen: int, device) -> Tensor:
    """cu_seqlens of an unmasked batch: cu_seq_lens_q, else from position_ids, else one
    document per row."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        cu_k = kwargs.get("cu_seq_lens_k")
        if cu.dim() != 1 or (cu_k is not None and tuple(cu_k.shape) != tuple(cu.shape)):
            raise FlamiaError("flamia: cu_seq_lens_q must be 1D and cu_seq_lens_k its equal (self-attention), "
                              f"got shapes {tuple(cu.shape)} and "
                              f"{None if cu_k is None else tuple(cu_k.shape)}")
        return cu.to(device=device, dtype=torch.int32)
    position_ids = kwargs.get("position_ids")
    if position_ids is not None:
        return cu_seqlens_from_position_ids(position_ids.to(device), batch)
    return (torch.arange(batch + 1, device=device) * seqlen).to(torch.int32)


def attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, is_causal: Optional[bool] = None,
                      recipe: str = "fp8", low_memory: bool = False, **kwargs) -> Tuple[Tensor, None]:
    """transformers attention function: query [B, Hq, S, D], key/value [B, Hkv, S, D] ->
    (attn_output [B, S, Hq, D], None). See the module docstring for what it accepts; recipe
    and low_memory are flamia.attention's."""
    _refuse_unsupported(query, key, value, attention_mask, dropout, sliding_window, kwargs)
    batch, hq, seqlen, head_dim = query.shape
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q, k, v = (_tokens_major(x) for x in (query, key, value))
    total = batch * seqlen
    # max_seqlen only bounds the document lengths for validation; B*S is always a valid bound.
    max_seqlen = max(total, 1)
    if attention_mask is not None:
        layout = padded_layout(attention_mask.to(query.device))
        q, k, v = (x.index_select(0, layout.packed_from_padded) for x in (q, k, v))
        out = ops.attention(q, k, v, layout.cu_seqlens, max_seqlen, causal=bool(is_causal),
                            softmax_scale=scaling, recipe=recipe, low_memory=low_memory)
        out = out.index_select(0, layout.padded_from_packed)
    else:
        cu = _cu_seqlens(kwargs, batch, seqlen, query.device)
        out = ops.attention(q, k, v, cu, max_seqlen, causal=bool(is_causal), softmax_scale=scaling,
                            recipe=recipe, low_memory=low_memory)
    out = out.view(batch, seqlen, hq, head_dim)
    return (out if out.dtype == query.dtype else out.to(query.dtype)), None
