"""flamia.distributed.attention on two GPUs (an NCCL group of two processes, one GPU each): a
long-tailed pack plus one long document that the plan cuts into chunks; every rank's output
and gradients are the shards of single-GPU flamia.attention, bit for bit, with
exchange="gather"; with exchange="divide" (the default) output and dQ bit for bit, dK/dV within
the stated bound. Needs two GPUs (skipped otherwise; FLAMIA_REQUIRE_GPU=1 does not force it)."""

import pytest

from flamia_testutil import assert_divided_shards, assert_shards_equal, make_pack, out_and_grads, require_gpu

torch = require_gpu()
if torch.cuda.device_count() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)

import flamia  # noqa: E402
from flamia.distributed import attention, plan_shards, shard  # noqa: E402
from flamia.workloads import long_tailed_lengths  # noqa: E402

LENGTHS = long_tailed_lengths(32768, seed=3) + [24576]  # the last document is cut at P = 2



def _rank_main(rank, init_file, out_dir, recipe, exchange):
    import os

    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    q, k, v, dout, cu = make_pack(LENGTHS, 8, 2, 128, seed=4, device=f"cuda:{rank}")
    plan = plan_shards(cu.cpu(), 2)
    res = out_and_grads(*[shard(x, plan, rank) for x in (q, k, v, dout)],
                        lambda q, k, v: attention(q, k, v, plan, rank, recipe=recipe, exchange=exchange))
    torch.save(tuple(t.cpu() for t in res), f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("exchange", ["gather", "divide"])
@pytest.mark.parametrize("recipe", ["fp8", "fp8_mixed"])
def test_two_gpus_give_the_single_gpu_result_bitwise(tmp_path, recipe, exchange):
    import torch.multiprocessing as mp

    q, k, v, dout, cu = make_pack(LENGTHS, 8, 2, 128, seed=4, device="cuda:0")
    plan = plan_shards(cu.cpu(), 2)
    assert plan.cut_docs == (len(LENGTHS) - 1,)
    want = tuple(t.cpu() for t in out_and_grads(
        q, k, v, dout, lambda q, k, v: flamia.attention(q, k, v, cu, max(LENGTHS), recipe=recipe)))
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(tmp_path), recipe, exchange), nprocs=2, join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    if exchange == "gather":
        assert_shards_equal(per_rank, plan, want)
    else:
        worst = assert_divided_shards(per_rank, plan, want)
        print(f"divide {recipe}: worst dK/dV max|diff| / max|dK| over the cut document {worst:.3g}")
