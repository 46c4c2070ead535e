"""flamia.integrations.transformers without a GPU.

The layout helpers and the attention function's glue (which path a batch takes, what reaches
flamia.attention, shapes back to transformers) run on the CPU with flamia.attention replaced by
per-document SDPA, so that whole transformers models can be compared against their own "sdpa"
implementation here. The FP8 kernels themselves are tested with these models in
test_transformers_integration_gpu.py. Skips without torch; the model tests also without
transformers (>= 4.53).
"""

import sys
import types

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import flamia  # noqa: E402
from flamia import ops  # noqa: E402
from flamia.integrations import transformers as flamia_hf  # noqa: E402
from flamia_testutil import collated_batch, padded_batch  # noqa: E402


# ---- a CPU stand-in for flamia.attention ----------------------------------------------------
class PerDocumentSDPA:
    """Same contract as flamia.attention (packed [T, H, D], cu_seqlens, GQA), computed with
    SDPA one document at a time; records the arguments of every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, causal=True, softmax_scale=None, recipe="fp8",
                 return_lse=False, low_memory=False):
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        assert cu_seqlens.dtype == torch.int32 and cu_seqlens.dim() == 1
        self.calls.append(dict(cu_seqlens=cu_seqlens.clone(), max_seqlen=max_seqlen, causal=causal,
                               softmax_scale=softmax_scale, recipe=recipe, low_memory=low_memory,
                               T=q.shape[0]))
        bounds = cu_seqlens.tolist()
        assert bounds[0] == 0 and bounds[-1] == q.shape[0] and max_seqlen >= max(
            b - a for a, b in zip(bounds, bounds[1:]))
        groups = q.shape[1] // k.shape[1]
        outs = []
        for a, b in zip(bounds, bounds[1:]):
            if b == a:
                continue
            qd, kd, vd = (x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            kd, vd = (x.repeat_interleave(groups, dim=1) for x in (kd, vd))
            o = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=softmax_scale)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs) if outs else q.new_empty(q.shape)


@pytest.fixture
def reference(monkeypatch):
    ref = PerDocumentSDPA()
    monkeypatch.setattr(ops, "attention", ref)
    return ref


def rel_l2(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


# ---- cu_seqlens from position_ids -------------------------------------------------------------
def test_position_ids_packed_row():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert flamia_hf.cu_seqlens_from_position_ids(pos, 1).tolist() == [0, 3, 5, 9]


def test_position_ids_rows_are_documents():
    pos = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]])
    cu = flamia_hf.cu_seqlens_from_position_ids(pos, 2)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 4, 6, 8]
    # The model's own position_ids are [1, S], shared by every row.
    assert flamia_hf.cu_seqlens_from_position_ids(torch.arange(5)[None], 3).tolist() == [0, 5, 10, 15]
    assert flamia_hf.cu_seqlens_from_position_ids(torch.arange(5), 1).tolist() == [0, 5]


def test_position_ids_not_starting_at_zero():
    # DataCollatorWithFlattening(position_ids_start=2) for RoBERTa-like models; single-token documents.
    pos = torch.tensor([[2, 3, 4, 2, 2, 3]])
    assert flamia_hf.cu_seqlens_from_position_ids(pos, 1).tolist() == [0, 3, 4, 6]


def test_position_ids_bad_shapes():
    with pytest.raises(flamia.FlamiaError, match="position_ids"):
        flamia_hf.cu_seqlens_from_position_ids(torch.zeros((3, 1, 4), dtype=torch.long), 1)
    with pytest.raises(flamia.FlamiaError, match="2 rows for a batch of 3"):
        flamia_hf.cu_seqlens_from_position_ids(torch.zeros((2, 4), dtype=torch.long), 3)


# ---- padded layout ----------------------------------------------------------------------------
MASKS = {
    "right": [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
    "left": [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]],
    "holes": [[1, 0, 1, 0, 1], [0, 1, 1, 0, 0]],
    "empty_row": [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]],
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_padded_layout(name):
    mask = torch.tensor(MASKS[name], dtype=torch.bool)
    B, S = mask.shape
    lay = flamia_hf.padded_layout(mask)
    to_packed, to_padded, cu = lay.packed_from_padded, lay.padded_from_packed, lay.cu_seqlens
    assert sorted(to_packed.tolist()) == list(range(B * S))
    assert torch.equal(to_packed[to_padded], torch.arange(B * S)), "the two gathers are not inverse"
    n = mask.sum(1).tolist()
    assert cu.dtype == torch.int32
    assert cu.tolist() == [x for b in range(B) for x in (b * S, b * S + n[b])] + [B * S]
    flat = mask.reshape(-1)
    for b in range(B):
        real = to_packed[b * S:b * S + n[b]]
        pads = to_packed[b * S + n[b]:(b + 1) * S]
        # Row b's tokens, in order, then its padding, in order.
        assert real.tolist() == [b * S + s for s in range(S) if mask[b, s]]
        assert pads.tolist() == [b * S + s for s in range(S) if not mask[b, s]]
        assert bool(flat[real].all()) and not bool(flat[pads].any())


def test_padded_layout_accepts_int_masks():
    a = flamia_hf.padded_layout(torch.tensor(MASKS["left"]))
    b = flamia_hf.padded_layout(torch.tensor(MASKS["left"], dtype=torch.bool))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---- the attention function ------------------------------------------------------------------
class Attn(torch.nn.Module):
    is_causal = True


def qkv(B, S, hq=4, hkv=2, d=64, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)

    def rn(h):  # [B, S, H, D] memory seen as [B, H, S, D], like transformers' projections
        return torch.randn((B, S, h, d), generator=g).to(dtype).transpose(1, 2)

    return rn(hq), rn(hkv), rn(hkv)


def sdpa_padded(q, k, v, mask, causal=True, scale=None):
    """SDPA over the padded batch with a key padding mask (what transformers' sdpa does)."""
    B, hq, S, _ = q.shape
    allowed = mask[:, None, None, :].bool()
    if causal:
        allowed = allowed & torch.ones((S, S), dtype=torch.bool).tril()
    allowed = allowed | torch.eye(S, dtype=torch.bool)  # padded rows: keep SDPA finite
    k, v = (x.repeat_interleave(hq // x.shape[1], dim=1) for x in (k, v))
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed,
                                          scale=scale).transpose(1, 2)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_padded_batch_matches_sdpa_at_tokens(reference, name):
    mask = torch.tensor(MASKS[name], dtype=torch.bool).repeat_interleave(20, dim=1)  # S = 100
    q, k, v = qkv(*mask.shape)
    out, weights = flamia_hf.attention_forward(Attn(), q, k, v, mask, scaling=0.3,
                                               position_ids=torch.arange(100)[None])
    assert weights is None and out.shape == (2, 100, 4, 64) and out.dtype == torch.bfloat16
    ref = sdpa_padded(q, k, v, mask, scale=0.3)
    keep = mask.bool()
    assert rel_l2(out[keep], ref[keep]) < 1e-2
    assert torch.isfinite(out).all()
    (call,) = reference.calls
    assert call["softmax_scale"] == 0.3 and call["T"] == 200 and call["max_seqlen"] == 200


def test_packed_row_from_position_ids_and_from_cu_seq_lens(reference):
    lengths = [30, 50, 20]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    q, k, v = qkv(1, 100, hq=8, hkv=2)
    a, _ = flamia_hf.attention_forward(Attn(), q, k, v, None, position_ids=pos)
    cu = torch.tensor([0, 30, 80, 100], dtype=torch.int32)
    b, _ = flamia_hf.attention_forward(Attn(), q, k, v, None, position_ids=pos, cu_seq_lens_q=cu,
                                       cu_seq_lens_k=cu.clone(), max_length_q=50, max_length_k=50)
    assert torch.equal(a, b)
    assert [c["cu_seqlens"].tolist() for c in reference.calls] == [[0, 30, 80, 100]] * 2
    # Each document on its own: the packed call is the per-document attention.
    for (s, e) in ((0, 30), (30, 80), (80, 100)):
        alone, _ = flamia_hf.attention_forward(Attn(), q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], None)
        assert torch.equal(alone, a[:, s:e])


def test_rows_without_mask_or_positions_are_documents(reference):
    q, k, v = qkv(3, 40)
    flamia_hf.attention_forward(Attn(), q, k, v, None)
    assert reference.calls[0]["cu_seqlens"].tolist() == [0, 40, 80, 120]


def test_recipe_names_and_dtype_round_trip(reference):
    q, k, v = qkv(1, 16, dtype=torch.float32)
    for name, impl in flamia_hf.IMPLEMENTATIONS.items():
        out, _ = flamia_hf._attention_for(impl)(Attn(), q, k, v, None, dropout=0.0, scaling=None)
        assert out.dtype == torch.float32  # computed in BF16, returned in the caller's dtype
        assert (reference.calls[-1]["recipe"], reference.calls[-1]["low_memory"]) == impl, name
    assert {name: tuple(impl) for name, impl in flamia_hf.IMPLEMENTATIONS.items()} == {
        "flamia_fp8": ("fp8", False), "flamia_fp8_mixed": ("fp8_mixed", False),
        "flamia_fp8_mixed_low_memory": ("fp8_mixed", True)}


def test_is_causal_false(reference):
    q, k, v = qkv(1, 16)
    flamia_hf.attention_forward(Attn(), q, k, v, None, is_causal=False)
    assert reference.calls[0]["causal"] is False


@pytest.mark.parametrize("kwargs,match", [
    (dict(dropout=0.1), "dropout"),
    (dict(sliding_window=32), "sliding_window"),
    (dict(softcap=30.0), "softcap"),
    (dict(s_aux=torch.zeros(4)), "s_aux"),
    (dict(position_bias=torch.zeros(1)), "position_bias"),
    (dict(attention_mask=torch.ones((1, 1, 64, 64), dtype=torch.bool)), "2D padding mask"),
    (dict(attention_mask=torch.ones((1, 64), dtype=torch.bool),
          cu_seq_lens_q=torch.tensor([0, 64], dtype=torch.int32)), "both attention_mask and cu_seq_lens_q"),
    (dict(cu_seq_lens_q=torch.tensor([0, 64], dtype=torch.int32),
          cu_seq_lens_k=torch.tensor([0, 32, 64], dtype=torch.int32)), "cu_seq_lens_k"),
    (dict(attention_mask=torch.ones((1, 63), dtype=torch.bool)), "expected"),
])
def test_refused(reference, kwargs, match):
    q, k, v = qkv(1, 64)
    mask = kwargs.pop("attention_mask", None)
    with pytest.raises(flamia.FlamiaError, match=match):
        flamia_hf.attention_forward(Attn(), q, k, v, mask, **kwargs)
    assert not reference.calls


def test_sliding_window_longer_than_the_documents_is_accepted(reference):
    q, k, v = qkv(1, 64)
    flamia_hf.attention_forward(Attn(), q, k, v, None, sliding_window=64)
    cu = torch.tensor([0, 30, 64], dtype=torch.int32)
    flamia_hf.attention_forward(Attn(), q, k, v, None, sliding_window=40, cu_seq_lens_q=cu, max_length_q=34)
    assert len(reference.calls) == 2


def test_refused_shapes(reference):
    q, k, v = qkv(1, 64)
    with pytest.raises(flamia.FlamiaError, match="KV cache"):
        flamia_hf.attention_forward(Attn(), q[:, :, -1:], k, v, None)
    with pytest.raises(flamia.FlamiaError, match="head dim"):
        flamia_hf.attention_forward(Attn(), q, k, v[..., :32], None)
    q3, k3, v3 = qkv(1, 64, hq=3, hkv=2)
    with pytest.raises(flamia.FlamiaError, match="multiple"):
        flamia_hf.attention_forward(Attn(), q3, k3, v3, None)


def test_padding_mask_function():
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    assert flamia_hf.padding_mask(attention_mask=None, kv_length=4) is None
    assert torch.equal(flamia_hf.padding_mask(attention_mask=mask, kv_length=3, batch_size=1), mask[:, 1:])
    full = torch.ones((1, 4), dtype=torch.bool)
    # No test for "any padding?": that would read the mask on the host.
    assert torch.equal(flamia_hf.padding_mask(attention_mask=full, kv_length=4), full)


# ---- torch.compile: the glue traces without a graph break -------------------------------------
def test_glue_has_no_graph_break(monkeypatch):
    # flamia.attention is a custom op traced without breaks (test_compile.py, GPU); here a
    # shape-only stand-in lets dynamo trace everything the integration adds around it.
    monkeypatch.setattr(ops, "attention", lambda q, k, v, cu, max_seqlen, **kw: q * 2 + cu.sum())
    q, k, v = qkv(2, 32)
    mask = torch.tensor([[1] * 32, [1] * 20 + [0] * 12], dtype=torch.bool)
    cu = torch.tensor([0, 10, 64], dtype=torch.int32)

    def padded(q, k, v, mask):
        return flamia_hf.attention_forward(Attn(), q, k, v, mask, scaling=0.125)[0]

    def packed(q, k, v, cu):
        return flamia_hf.attention_forward(Attn(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                           max_length_q=54, max_length_k=54)[0]

    for fn, args in ((padded, (q, k, v, mask)), (packed, (q, k, v, cu))):
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(fn)(*args)
        assert explanation.graph_break_count == 0, explanation.break_reasons


# ---- registration -----------------------------------------------------------------------------
def test_missing_transformers_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="transformers is not installed.*>= 4.53"):
        flamia_hf.register()


def test_old_transformers_is_a_clear_error(monkeypatch):
    old = types.ModuleType("transformers")
    old.__version__ = "4.46.3"
    monkeypatch.setitem(sys.modules, "transformers", old)
    monkeypatch.delitem(sys.modules, "transformers.masking_utils", raising=False)
    with pytest.raises(ImportError, match="transformers 4.46.3 is too old"):
        flamia_hf.register()


def test_import_flamia_does_not_import_transformers():
    import os
    import subprocess

    code = ("import sys, flamia; assert 'transformers' not in sys.modules; "
            "assert 'flamia.integrations' not in sys.modules")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(flamia.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    subprocess.check_call([sys.executable, "-c", code], env=env)


# ---- whole models, CPU, flamia.attention replaced by per-document SDPA -------------------------
@pytest.fixture
def hf():
    transformers = pytest.importorskip("transformers")
    try:
        flamia_hf.register()
    except ImportError as e:
        pytest.skip(str(e))
    return transformers


def tiny_model(hf, family: str, attn: str, seed: int = 0):
    cfg = dict(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config = hf.LlamaConfig(**cfg) if family == "llama" else hf.Qwen2Config(**cfg)
    torch.manual_seed(seed)
    model = hf.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.to(torch.bfloat16).eval()


def model_pair(hf, family):
    ref = tiny_model(hf, family, "sdpa")
    ours = tiny_model(hf, family, "flamia_fp8")
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def documents(lengths, seed=0, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g) for n in lengths]


FAMILIES = ["llama", "qwen2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_model_packed_matches_sdpa_per_document(hf, reference, family):
    ref, ours = model_pair(hf, family)
    docs = documents([37, 80, 11])
    ids = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        got = ours(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        start = 0
        for d in docs:
            want = ref(input_ids=d[None], use_cache=False).logits[0]
            assert rel_l2(got[start:start + len(d)], want) < 1e-2
            start += len(d)
    # One call per layer, each with the pack's three documents.
    assert [c["cu_seqlens"].tolist() for c in reference.calls] == [[0, 37, 117, 128]] * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_model_collator_kwargs_equal_position_ids(hf, reference, family):
    _, ours = model_pair(hf, family)
    docs = documents([20, 45, 9], seed=1)
    batch = collated_batch(hf, docs)
    assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids"} <= set(batch)
    with torch.no_grad():
        a = ours(**batch, use_cache=False).logits
        b = ours(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    assert torch.equal(a, b)
    assert len(reference.calls) == 4
    assert all(c["cu_seqlens"].tolist() == [0, 20, 65, 74] for c in reference.calls)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family", FAMILIES)
def test_model_padded_matches_sdpa(hf, reference, family, side):
    ref, ours = model_pair(hf, family)
    docs = documents([50, 23, 64], seed=2)
    S = 64
    ids, mask = padded_batch(docs, S, side)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask, use_cache=False).logits
        want = ref(input_ids=ids, attention_mask=mask, use_cache=False).logits
    keep = mask.bool()
    assert rel_l2(got[keep], want[keep]) < 1e-2
    assert len(reference.calls) == 2 and all(c["T"] == 3 * S for c in reference.calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_model_document_isolation_and_finite_gradients(hf, reference, family):
    _, ours = model_pair(hf, family)
    ours.train()
    docs = documents([40, 30, 25], seed=3)
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    ids = torch.cat(docs)[None]
    changed = torch.cat([docs[0], documents([30], seed=99)[0], docs[2]])[None]
    out = ours(input_ids=ids, position_ids=pos, labels=ids, use_cache=False)
    out.loss.backward()
    grads = [p.grad for p in ours.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        a = ours(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        b = ours(input_ids=changed, position_ids=pos, use_cache=False).logits[0]
    assert torch.equal(a[:40], b[:40]) and torch.equal(a[70:], b[70:])
    assert not torch.equal(a[40:70], b[40:70])


def test_registered_names_reach_the_model(hf):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    names = flamia_hf.register()
    assert names == ("flamia_fp8", "flamia_fp8_mixed", "flamia_fp8_mixed_low_memory")
    for name in names:
        assert name in AttentionInterface._global_mapping
        assert AttentionMaskInterface._global_mapping[name] is flamia_hf.padding_mask
    model = tiny_model(hf, "llama", "flamia_fp8_mixed")
    assert model.config._attn_implementation == "flamia_fp8_mixed"


def test_switch_a_loaded_model(hf, reference):
    model = tiny_model(hf, "qwen2", "sdpa")
    if not hasattr(model, "set_attn_implementation"):
        pytest.skip(f"transformers {hf.__version__} has no set_attn_implementation")
    model.set_attn_implementation("flamia_fp8")
    assert model.config._attn_implementation == "flamia_fp8"
    with torch.no_grad():
        model(input_ids=torch.randint(1, 128, (2, 24)), use_cache=False)
    assert len(reference.calls) == 2 and reference.calls[0]["cu_seqlens"].tolist() == [0, 24, 48]
