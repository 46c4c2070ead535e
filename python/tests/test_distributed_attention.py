"""flamia.distributed.attention on the CPU specification: every rank's output and gradients
are the shards of single-pack flamia.attention, bit for bit — for plans that keep documents
whole (world sizes 1-4, no collective) and for plans that cut a document into chunks with
exchange="gather" (a gloo group of 2 or 3 processes gathering it); with exchange="divide"
(the default for causal attention) O and dQ bitwise, dK/dV within the stated bound;
mis-sharded inputs and impossible exchanges are refused; tools/cp_bench.py runs end to end.
Skips without torch."""

import pytest

torch = pytest.importorskip("torch")

import flamia  # noqa: E402
from flamia import FlamiaError  # noqa: E402
from flamia.distributed import attention, plan_shards, shard  # noqa: E402
from flamia_testutil import assert_divided_shards, assert_shards_equal, make_pack, out_and_grads  # noqa: E402

# Twelve short documents: none has more than half a rank's mean causal work at P <= 3, so
# the plan keeps every document whole (asserted below, the premise of the test).
LENGTHS = [64, 80, 33, 71, 50, 77, 45, 60, 70, 39, 58, 66]



@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_compute_the_single_pack_result_bitwise(world_size, recipe):
    q, k, v, dout, cu = make_pack(LENGTHS, 4, 2, 64, seed=7, device="cpu")
    plan = plan_shards(cu, world_size)
    assert plan.split_docs == () and all(rs.num_tokens > 0 for rs in plan.ranks)
    want = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, max(LENGTHS), recipe=recipe))
    per_rank = []
    for r in range(world_size):
        loc = [shard(x, plan, r) for x in (q, k, v, dout)]
        per_rank.append(out_and_grads(*loc, lambda q, k, v: attention(q, k, v, plan, r, recipe=recipe)))
    assert_shards_equal(per_rank, plan, want)


def test_inputs_must_be_the_ranks_shards():
    q, k, v, _, cu = make_pack(LENGTHS, 2, 2, 64, seed=2, device="cpu")
    plan = plan_shards(cu, 2)
    with pytest.raises(FlamiaError, match="q must have rank 0's"):
        attention(q, shard(k, plan, 0), shard(v, plan, 0), plan, 0)
    with pytest.raises(FlamiaError, match="rank must be < world_size"):
        attention(shard(q, plan, 0), shard(k, plan, 0), shard(v, plan, 0), plan, 2)
    with pytest.raises(FlamiaError, match="plan must be a ShardPlan"):
        attention(q, k, v, "plan", 0)


def test_documents_shorter_than_a_chunk_run_whole_and_empty_ranks_too():
    # At P = 4 both documents count as split, but each fits in its first 128-token chunk: rank
    # 0 holds both whole, ranks 1-3 hold nothing and return empty outputs and gradients.
    q, k, v, dout, cu = make_pack([40, 30], 2, 2, 64, seed=1, device="cpu")
    plan = plan_shards(cu, 4)
    assert plan.split_docs == (0, 1) and [rs.num_tokens for rs in plan.ranks] == [70, 0, 0, 0]
    want = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, 40))
    per_rank = [out_and_grads(*[shard(x, plan, r) for x in (q, k, v, dout)],
                              lambda q, k, v, r=r: attention(q, k, v, plan, r)) for r in range(4)]
    assert_shards_equal(per_rank, plan, want)


@pytest.mark.parametrize("lengths,exchange", [("40,70,30,55", "auto"), ("600,40,30", "divide")])
def test_cp_bench_runs_on_a_cpu_group(tmp_path, lengths, exchange):
    # tools/cp_bench.py end to end over a two-process gloo group on the CPU specification
    # (the timings are meaningless there; the records are what is checked).
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "python"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", "29533", os.path.join(root, "tools", "cp_bench.py"), "--device", "cpu",
                          "--lengths", lengths, "--hq", "2", "--hkv", "2", "--head-dim", "64", "--exchange", exchange,
                          "--iters", "1", "--warmup", "0", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (rec,) = json.loads((tmp_path / "cp_bench.json").read_text())["results"]
    assert rec["world_size"] == 2 and len(rec["rank_ms"]) == 2 and rec["speedup"] > 0
    if exchange == "auto":
        assert rec["tokens"] == 195 and rec["exchange"] == "divide"
        assert rec["cut_docs"] == 0 and rec["bytes_received_per_rank"] == 0
    else:
        # The 600-token document is cut into chunks of 256: rank 0 holds [0, 256), rank 1
        # [256, 512) and [512, 600), so 344 rows wide (k, v in BF16, 2 heads, D = 64); rank 1's
        # two chunks each send the BF16 dK/dV partial of positions [0, 256) to rank 0.
        assert rec["tokens"] == 670 and rec["exchange"] == "divide" and rec["cut_docs"] == 1
        assert rec["bytes_received_per_rank"] == (344 + 2 * 256) * 2 * 2 * 64 * 2



def _recording(seen):
    """flamia.attention, appending to `seen` the low_memory each call is given."""
    single = flamia.attention

    def recording(*args, **kwargs):
        seen.append(kwargs.get("low_memory"))
        return single(*args, **kwargs)

    return recording


def _rank_main(rank, world, init_file, out_dir, lengths, recipe, causal, exchange="gather", seed=9,
               low_memory=False):
    # One rank of a gloo group on the CPU specification: its output and gradients to a file,
    # and the low_memory every flamia.attention call it made was given to another.
    import torch.distributed as dist

    seen = []
    flamia.attention = _recording(seen)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    q, k, v, dout, cu = make_pack(lengths, 4, 2, 64, seed=seed, device="cpu")
    plan = plan_shards(cu, world)
    res = out_and_grads(*[shard(x, plan, rank) for x in (q, k, v, dout)],
                        lambda q, k, v: attention(q, k, v, plan, rank, causal=causal, recipe=recipe,
                                                  exchange=exchange, low_memory=low_memory))
    torch.save(res, f"{out_dir}/rank{rank}.pt")
    torch.save(seen, f"{out_dir}/seen{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("world_size,lengths,recipe,causal", [(2, [600, 40, 30], "fp8", True),
                                                               (3, [40, 900, 70, 25], "fp8", True),
                                                               (2, [600, 40, 30], "fp8_mixed", False)])
def test_cut_documents_are_gathered_and_stay_bitwise(tmp_path, world_size, lengths, recipe, causal):
    # The plan cuts the long document into chunks on several ranks; each rank gathers it whole
    # (q, k, v, and dO in the backward) over a gloo group and keeps its own rows.
    import torch.multiprocessing as mp

    q, k, v, dout, cu = make_pack(lengths, 4, 2, 64, seed=9, device="cpu")
    plan = plan_shards(cu, world_size)
    assert plan.cut_docs == plan.split_docs != ()  # the long document is held in chunks
    want = out_and_grads(q, k, v, dout,
                         lambda q, k, v: flamia.attention(q, k, v, cu, max(lengths), causal=causal, recipe=recipe))
    mp.spawn(_rank_main, args=(world_size, str(tmp_path / "init"), str(tmp_path), lengths, recipe, causal, "gather"),
             nprocs=world_size, join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    assert_shards_equal(per_rank, plan, want)


def test_cut_documents_need_a_process_group():
    q, k, v, _, cu = make_pack([600, 40, 30], 2, 2, 64, seed=1, device="cpu")
    plan = plan_shards(cu, 2)
    with pytest.raises(FlamiaError, match="initialized torch.distributed"):
        attention(shard(q, plan, 0), shard(k, plan, 0), shard(v, plan, 0), plan, 0)


@pytest.mark.parametrize("world_size,lengths", [(2, [600, 40, 30]), (3, [40, 1400, 70, 25])])
@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_divided_exchange_is_bitwise_for_o_and_dq(tmp_path, world_size, lengths, recipe):
    # Each rank computes only its chunks' query rows (q_start), with k, v of the earlier
    # positions gathered: O and dQ bitwise; dK/dV summed over the ranks in FP32, within the
    # bound (assert_divided_shards).
    import torch.multiprocessing as mp

    q, k, v, dout, cu = make_pack(lengths, 4, 2, 64, seed=9, device="cpu")
    plan = plan_shards(cu, world_size)  # align = 128: every chunk a multiple of the query tile
    assert plan.cut_docs == plan.split_docs != ()
    want = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, max(lengths), recipe=recipe))
    mp.spawn(_rank_main, args=(world_size, str(tmp_path / "init"), str(tmp_path), lengths, recipe, True, "divide"),
             nprocs=world_size, join=True)
    assert_divided_shards([torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)], plan, want)


@pytest.mark.parametrize("world_size,lengths", [(2, [600, 40, 30]), (3, [40, 1400, 70, 25])])
def test_divided_exchange_gives_the_fp32_sum_of_each_chunks_bf16_partial(tmp_path, world_size, lengths):
    # The exact dK/dV of a cut document: every chunk's partial is flamia.attention of its
    # local document [0, end) alone (q and dO zero before the chunk, q_start at it; document
    # isolation makes it the bits the rank's pack gives), a BF16 tensor; the rank holding a key
    # adds the partials in FP32 in (source rank, chunk) order and rounds once to BF16. (A few
    # BF16 values add exactly in FP32 unless their exponents lie far apart, so this pins the
    # values and the single rounding more than the order.)
    import torch.multiprocessing as mp

    from flamia.distributed import unshard

    q, k, v, dout, cu = make_pack(lengths, 4, 2, 64, seed=9, device="cpu")
    plan = plan_shards(cu, world_size)
    mp.spawn(_rank_main, args=(world_size, str(tmp_path / "init"), str(tmp_path), lengths, "fp8", True, "divide"),
             nprocs=world_size, join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    got = [unshard([res[i] for res in per_rank], plan) for i in (2, 3)]
    for d in plan.cut_docs:
        b, n = cu[d].item(), cu[d + 1].item() - cu[d].item()
        sums = [torch.zeros((n,) + tuple(k.shape[1:]), dtype=torch.float32) for _ in range(2)]
        for rs in plan.ranks:
            for seg in rs.segments:
                if seg.doc != d:
                    continue
                end, start = seg.end, seg.start
                keep = torch.zeros(end, 1, 1, dtype=q.dtype)
                keep[start:] = 1
                local = (q[b:b + end] * keep, k[b:b + end], v[b:b + end], dout[b:b + end] * keep)
                _, _, dk_c, dv_c = out_and_grads(*local, lambda q_, k_, v_: flamia.attention(
                    q_, k_, v_, torch.tensor([0, end], dtype=torch.int32), end, recipe="fp8",
                    q_start=torch.tensor([start], dtype=torch.int32)))
                sums[0][:end] += dk_c.float()
                sums[1][:end] += dv_c.float()
        for g, want, name in zip(got, sums, ("dk", "dv")):
            assert torch.equal(g[b:b + n], want.to(g.dtype)), f"{name} of cut document {d}"


def test_divided_exchange_is_the_default_when_possible_and_refused_otherwise(tmp_path):
    # The default (exchange=None) is the divided exchange here: O, dQ and dK/dV equal the
    # explicit exchange="divide" run, bit for bit.
    import torch.multiprocessing as mp

    lengths = [600, 40, 30]
    runs = {}
    for exchange in (None, "divide"):
        out_dir = tmp_path / str(exchange)
        out_dir.mkdir()
        mp.spawn(_rank_main, args=(2, str(out_dir / "init"), str(out_dir), lengths, "fp8", True, exchange, 4),
                 nprocs=2, join=True)
        runs[exchange] = [torch.load(out_dir / f"rank{r}.pt") for r in range(2)]
    for a, b in zip(runs[None], runs["divide"]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # Non-causal attention, or chunks that are not multiples of 128, cannot be divided (the
    # reason is checked before any collective, so no process group is needed here).
    q, k, v, _, cu = make_pack(lengths, 2, 2, 64, seed=1, device="cpu")
    plan = plan_shards(cu, 2)
    loc = [shard(x, plan, 0) for x in (q, k, v)]
    with pytest.raises(FlamiaError, match="exchange='divide' is not possible here: it needs causal attention"):
        attention(*loc, plan, 0, causal=False, exchange="divide")
    odd = plan_shards(cu, 2, align=64)  # C = roundup(150, 64) = 192
    loc = [shard(x, odd, 0) for x in (q, k, v)]
    with pytest.raises(FlamiaError, match="chunks of 192 tokens, not a multiple of 128"):
        attention(*loc, odd, 0, exchange="divide")
    with pytest.raises(FlamiaError, match="exchange must be"):
        attention(*loc, odd, 0, exchange="ring")



@pytest.mark.parametrize("exchange", ["gather", "divide"])
def test_low_memory_reaches_every_call_and_changes_no_bit(tmp_path, exchange):
    # The cut document's exchange passes low_memory to the flamia.attention it runs; the
    # results are those of the same exchange without it, bit for bit.
    import torch.multiprocessing as mp

    lengths = [600, 40, 30]
    runs, seen = {}, {}
    for low in (False, True):
        out_dir = tmp_path / str(low)
        out_dir.mkdir()
        mp.spawn(_rank_main, nprocs=2, join=True,
                 args=(2, str(out_dir / "init"), str(out_dir), lengths, "fp8_mixed", True, exchange, 9, low))
        runs[low] = [torch.load(out_dir / f"rank{r}.pt") for r in range(2)]
        seen[low] = [torch.load(out_dir / f"seen{r}.pt") for r in range(2)]
    for calls in seen[True]:
        assert calls and all(s is True for s in calls), calls
    for low, plain in zip(runs[True], runs[False]):
        assert all(torch.equal(x, y) for x, y in zip(low, plain))


def test_low_memory_reaches_a_whole_documents_call(monkeypatch):
    q, k, v, _, cu = make_pack(LENGTHS, 2, 2, 64, seed=3, device="cpu")
    plan = plan_shards(cu, 2)
    seen = []
    monkeypatch.setattr(flamia, "attention", _recording(seen))
    loc = [shard(x, plan, 1) for x in (q, k, v)]
    plain = attention(*loc, plan, 1, recipe="fp8_mixed")
    low = attention(*loc, plan, 1, recipe="fp8_mixed", low_memory=True)
    assert seen == [False, True] and torch.equal(plain, low)
