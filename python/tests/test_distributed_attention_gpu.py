"""flamia.distributed.attention on the GPU, the ranks run one after the other on one device:
over pack-128k, whose plan keeps every document whole at P = 2 and 3, the ranks'
outputs and gradients are the shards of single-pack flamia.attention, bit for bit (the
kernels tile each document from its own start, so its results do not depend on where it
sits in the pack or what else is there)."""

import pytest

from flamia_testutil import assert_shards_equal, make_pack, out_and_grads, require_gpu

torch = require_gpu()

import flamia  # noqa: E402
from flamia.distributed import attention, plan_shards, shard  # noqa: E402
from flamia.workloads import long_tailed_lengths  # noqa: E402



@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_compute_the_single_pack_result_bitwise(world_size, recipe):
    lengths = long_tailed_lengths(131072)  # pack-128k: 107 documents, none cut at P = 2 or 3
    q, k, v, dout, cu = make_pack(lengths, 8, 2, 128, seed=5)
    plan = plan_shards(cu.cpu(), world_size)
    assert plan.cut_docs == ()
    want = out_and_grads(q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, max(lengths), recipe=recipe))
    per_rank = []
    for r in range(world_size):
        loc = [shard(x, plan, r) for x in (q, k, v, dout)]
        per_rank.append(out_and_grads(*loc, lambda q, k, v, r=r: attention(q, k, v, plan, r, recipe=recipe)))
    assert_shards_equal(per_rank, plan, want)
