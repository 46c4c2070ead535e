"""q_start through the Python package: a document's rows before q_start[b] are keys only.

The rows at or after q_start of out, lse and the q gradient are bitwise those of the call
without q_start; the earlier rows read 0 (the Python entry points zero-fill them); the k, v
gradients are bitwise those of the call without q_start whose dout is 0 on the earlier rows;
bad values raise FlamiaError naming q_start. On the CPU specification, and the same on a GPU
when there is one (skipped otherwise). Skips without torch."""

import re

import pytest

torch = pytest.importorskip("torch")

import flamia  # noqa: E402
from flamia import FlamiaError, ops  # noqa: E402
from flamia_testutil import make_pack, out_and_grads, on_device  # noqa: E402

LENGTHS = [300, 200]
DEVICES = ["cpu", "cuda"]


def _later_rows(q_start, device) -> torch.Tensor:
    """Bool [T]: the rows at or after their document's q_start."""
    rows = []
    for n, s in zip(LENGTHS, q_start):
        rows += [False] * s + [True] * (n - s)
    return torch.tensor(rows, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
@pytest.mark.parametrize("starts,causal", [((128, 0), True), ((256, 128), True), ((128, 128), False)])
def test_later_rows_are_bitwise_and_earlier_rows_zero(device, recipe, starts, causal):
    device = on_device(device)
    q, k, v, dout, cu = make_pack(LENGTHS, 2, 2, 64, seed=11, device=device)
    qs = torch.tensor(starts, dtype=torch.int32, device=device)
    later = _later_rows(starts, device)

    lses = {}

    def run(q_start):
        def f(q, k, v):
            out, lse = flamia.attention(q, k, v, cu, max(LENGTHS), causal=causal, recipe=recipe,
                                        return_lse=True, q_start=q_start)
            lses[q_start is None] = lse.detach()
            return out
        return f

    plain = run(None)
    want_out, want_dq, _, _ = out_and_grads(q, k, v, dout, plain)
    out, dq, dk, dv = out_and_grads(q, k, v, dout, run(qs))
    want_lse, lse = lses[True], lses[False]

    assert torch.equal(out[later], want_out[later])
    assert torch.equal(lse[:, later], want_lse[:, later])
    assert torch.equal(dq[later], want_dq[later])
    assert not out[~later].any() and not lse[:, ~later].any() and not dq[~later].any()
    # dK/dV sum over the later query rows only: the call without q_start whose dout is 0 on
    # the earlier rows.
    masked = dout * later[:, None, None].to(dout.dtype)
    _, _, mdk, mdv = out_and_grads(q, k, v, masked, plain)
    assert torch.equal(dk, mdk) and torch.equal(dv, mdv)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_entry_points_zero_fill(device):
    device = on_device(device)
    q, k, v, dout, cu = make_pack(LENGTHS, 2, 2, 64, seed=5, device=device)
    qs = torch.tensor([256, 128], dtype=torch.int32, device=device)
    later = _later_rows((256, 128), device)
    out, lse, qkv8 = ops.forward(q, k, v, cu, max(LENGTHS), q_start=qs)
    dq, dk, dv = ops.backward(dout, q, k, v, out, lse, qkv8, cu, max(LENGTHS), q_start=qs)
    assert not out[~later].any() and not lse[:, ~later].any() and not dq[~later].any()
    want_out, want_lse, want_qkv8 = ops.forward(q, k, v, cu, max(LENGTHS))
    assert torch.equal(out[later], want_out[later]) and torch.equal(lse[:, later], want_lse[:, later])


def _raises(fn, pattern: str) -> None:
    with pytest.raises(FlamiaError) as ei:
        fn()
    assert re.search(pattern, str(ei.value)), f"message {str(ei.value)!r} does not match {pattern!r}"


@pytest.mark.parametrize("device", DEVICES)
def test_bad_q_start_is_refused(device, monkeypatch):
    device = on_device(device)
    if device == "cuda":
        # Device values are checked on the host in checking mode (on the device otherwise,
        # without a host synchronisation: include/flamia/flamia.h).
        monkeypatch.setenv("FLAMIA_CHECK", "1")
    q, k, v, dout, cu = make_pack(LENGTHS, 2, 2, 64, seed=3, device=device)

    def call(q_start):
        return lambda: flamia.attention(q, k, v, cu, max(LENGTHS), q_start=q_start)

    i32 = dict(dtype=torch.int32, device=device)
    _raises(call(torch.tensor([100, 0], **i32)), r"q_start")                      # not a multiple of 128
    _raises(call(torch.tensor([384, 0], **i32)), r"q_start")                      # past the document's end
    _raises(call(torch.tensor([0, -128], **i32)), r"q_start")                     # negative
    _raises(call(torch.tensor([128], **i32)), r"q_start")                         # one entry per document
    _raises(call(torch.tensor([128, 0], dtype=torch.int64, device=device)), r"q_start must be torch.int32")
    _raises(call(torch.tensor([128, 0], dtype=torch.float32, device=device)), r"q_start")
    _raises(call([128, 0]), r"q_start must be a torch.Tensor")
    if device == "cuda":
        _raises(call(torch.tensor([128, 0], dtype=torch.int32)), r"q_start must be a CUDA tensor")
    # The backward's own check: a q_start that does not fit the forward's documents.
    out, lse, qkv8 = ops.forward(q, k, v, cu, max(LENGTHS))
    _raises(lambda: ops.backward(dout, q, k, v, out, lse, qkv8, cu, max(LENGTHS),
                                 q_start=torch.tensor([0, 256], **i32)), r"q_start")


def test_a_document_may_be_keys_only():
    # q_start = L (a multiple of 128): no query row of that document is computed.
    q, k, v, dout, cu = make_pack([256, 128], 2, 2, 64, seed=4, device="cpu")
    qs = torch.tensor([256, 0], dtype=torch.int32)
    out, dq, dk, dv = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, 256, q_start=qs))
    assert not out[:256].any() and not dq[:256].any() and not dk[:256].any() and not dv[:256].any()
    want = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, 256))
    for got, ref in zip((out, dq, dk, dv), want):
        assert torch.equal(got[256:], ref[256:])


def test_q_start_through_torch_compile():
    # The custom ops' schemas take q_start last (Tensor? q_start=None): fullgraph tracing
    # (fake implementations, autograd) gives the eager bits. aot_eager: no code generation.
    torch._dynamo.reset()
    q, k, v, dout, cu = make_pack(LENGTHS, 2, 2, 64, seed=6, device="cpu")
    qs = torch.tensor([128, 0], dtype=torch.int32)

    def f(q, k, v):
        return flamia.attention(q, k, v, cu, max(LENGTHS), q_start=qs)

    eager = out_and_grads(q, k, v, dout, f)
    compiled = out_and_grads(q, k, v, dout, torch.compile(f, backend="aot_eager", fullgraph=True))
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
