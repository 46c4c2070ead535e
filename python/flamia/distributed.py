"""Context parallelism, first part: how a pack is sharded over the P ranks of a process group.

    plan = flamia.distributed.plan_shards(cu_seqlens, world_size)
    q_local = flamia.distributed.shard(q, plan, rank)      # rank's tokens, in its order
    q_again = flamia.distributed.unshard([...], plan)      # the global pack, bitwise
    report = flamia.distributed.balance(plan)              # per-rank work, tokens, imbalance

The rule (docs/CONTEXT_PARALLEL.md, "Sharding rule"): a document whose causal work exceeds
half a rank's mean is cut into 2P chunks of C = roundup(ceil(L / 2P), align) tokens from
its start and rank r takes chunks r and 2P - 1 - r (zig-zag); every other document stays
whole, longest first, on the rank where it raises the larger of the rank's relative causal
work and relative token count least. A rank stores its segments (chunks and whole
documents) in ascending position in the global pack.

    o_local = flamia.distributed.attention(q_local, k_local, v_local, plan, rank)

runs a rank's attention when every document of the plan is whole (no document split across
ranks, the common case for long-tailed packs: see the balance table in that document); the
kernels for split documents (streamed or ring) are not built yet.

This module needs torch but not torch.distributed; `import flamia` does not import it.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._lib import FlamiaError

__all__ = ["Segment", "RankShard", "ShardPlan", "Balance", "plan_shards", "shard", "unshard",
           "balance", "attention"]

# A document is split when its causal work exceeds this fraction of a rank's mean work: whole
# documents need no key/value exchange, and the fraction caps what one of them adds to a rank.
_SPLIT_FRACTION = 0.5


@dataclass(frozen=True)
class Segment:
    """One run of consecutive tokens of one document held by one rank: positions
    [start, end) counted from the document's first token. A query at position p sees the
    keys at positions 0..p of its document (causal), wherever they are stored."""

    doc: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RankShard:
    """What one rank holds. indices (int64, CPU): positions in the global pack, in the
    order the rank stores its tokens; cu_seqlens (int32, CPU): one entry per segment, so
    each chunk is a document of the local pack; max_seqlen: the longest segment."""

    rank: int
    segments: Tuple[Segment, ...]
    indices: Tensor
    cu_seqlens: Tensor
    max_seqlen: int

    @property
    def num_tokens(self) -> int:
        return int(self.indices.shape[0])


@dataclass(frozen=True)
class ShardPlan:
    """The sharding of one pack over world_size ranks. cu_seqlens: the global pack's
    document boundaries; split_docs: the documents cut into 2P chunks (the others are
    whole on one rank)."""

    world_size: int
    align: int
    cu_seqlens: Tuple[int, ...]
    split_docs: Tuple[int, ...]
    ranks: Tuple[RankShard, ...]

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def doc_length(self, doc: int) -> int:
        return self.cu_seqlens[doc + 1] - self.cu_seqlens[doc]


@dataclass(frozen=True)
class Balance:
    """Per rank: work = the (query, key) pairs its queries see, tokens = the tokens it holds
    (what the rest of the model's layers cost); each imbalance is max over mean (1.0 = even)."""

    work: Tuple[int, ...]
    work_imbalance: float
    tokens: Tuple[int, ...]
    token_imbalance: float


# ---- validation --------------------------------------------------------------------------------
def _check_int(value, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FlamiaError(f"flamia.distributed: {name} must be an int, got {type(value).__name__}")
    if value < lo:
        raise FlamiaError(f"flamia.distributed: {name} must be >= {lo}, got {value}")
    return value


def _check_cu_seqlens(cu_seqlens) -> List[int]:
    if not isinstance(cu_seqlens, Tensor):
        raise FlamiaError(f"flamia.distributed: cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise FlamiaError(f"flamia.distributed: cu_seqlens must be torch.int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise FlamiaError(f"flamia.distributed: cu_seqlens must be 1-D with at least one entry, "
                          f"got shape {tuple(cu_seqlens.shape)}")
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0:
        raise FlamiaError(f"flamia.distributed: cu_seqlens must start at 0, got cu_seqlens[0] = {cu[0]}")
    for b in range(len(cu) - 1):
        if cu[b + 1] < cu[b]:
            raise FlamiaError(f"flamia.distributed: cu_seqlens must be non-decreasing, got "
                              f"cu_seqlens[{b + 1}] = {cu[b + 1]} < cu_seqlens[{b}] = {cu[b]}")
    return cu


def _check_rank(rank, plan: ShardPlan) -> int:
    _check_int(rank, "rank", 0)
    if rank >= plan.world_size:
        raise FlamiaError(f"flamia.distributed: rank must be < world_size = {plan.world_size}, got {rank}")
    return rank


# ---- the rule ----------------------------------------------------------------------------------
def _pairs(start: int, end: int) -> int:
    """Causal (query, key) pairs of the queries at positions [start, end) of a document."""
    return (end * (end + 1) - start * (start + 1)) // 2


def _zigzag_chunks(length: int, world_size: int, align: int) -> List[Tuple[int, int, int]]:
    """(rank, start, end) of the non-empty chunks of a split document: 2P chunks of
    C = roundup(ceil(L / 2P), align) tokens; chunk j goes to rank min(j, 2P - 1 - j)."""
    n = 2 * world_size
    c = -(-(-(-length // n)) // align) * align
    out = []
    for j in range(n):
        start, end = min(j * c, length), min((j + 1) * c, length)
        if end > start:
            out.append((min(j, n - 1 - j), start, end))
    return out


def plan_shards(cu_seqlens: Tensor, world_size: int, align: int = 128,
                whole_documents: bool = True) -> ShardPlan:
    """Shard the pack described by cu_seqlens (int32, non-decreasing from 0; zero-length
    documents allowed) over world_size ranks by the rule in this module's docstring.

    align: chunk boundaries are multiples of it from the document start (128 keeps every
    forward and backward tile inside one chunk). whole_documents=False splits every
    document zig-zag (the rule without its short-document case). world_size 1 gives the
    identity: one rank holding every document whole, in pack order."""
    cu = _check_cu_seqlens(cu_seqlens)
    _check_int(world_size, "world_size", 1)
    _check_int(align, "align", 1)
    if not isinstance(whole_documents, bool):
        raise FlamiaError(f"flamia.distributed: whole_documents must be a bool, got {type(whole_documents).__name__}")
    lengths = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    mean = sum(_pairs(0, n) for n in lengths) / world_size

    per_rank: List[List[Segment]] = [[] for _ in range(world_size)]
    work, tokens = [0] * world_size, [0] * world_size
    split, whole = [], []
    for d, n in enumerate(lengths):
        small = _pairs(0, n) <= _SPLIT_FRACTION * mean
        (whole if world_size == 1 or (whole_documents and small) else split).append(d)
    for d in split:
        for r, start, end in _zigzag_chunks(lengths[d], world_size, align):
            per_rank[r].append(Segment(d, start, end))
            work[r] += _pairs(start, end)
            tokens[r] += end - start
    # Longest first; each onto the rank whose larger relative load (attention work, or tokens:
    # the linear layers' work and the activations' memory) it raises least (ties: lower rank).
    mean_tokens = max(sum(lengths) / world_size, 1.0)
    mean_work = max(mean, 1.0)
    for d in sorted(whole, key=lambda d: (-lengths[d], d)):
        n = lengths[d]
        r = min(range(world_size),
                key=lambda i: (max((work[i] + _pairs(0, n)) / mean_work, (tokens[i] + n) / mean_tokens), i))
        per_rank[r].append(Segment(d, 0, n))
        work[r] += _pairs(0, n)
        tokens[r] += n

    ranks = []
    for r, segs in enumerate(per_rank):
        segs.sort(key=lambda s: (cu[s.doc] + s.start, s.doc))  # pack order; empty documents too
        runs = [torch.arange(cu[s.doc] + s.start, cu[s.doc] + s.end, dtype=torch.int64) for s in segs]
        local_cu = [0]
        for s in segs:
            local_cu.append(local_cu[-1] + s.length)
        ranks.append(RankShard(rank=r, segments=tuple(segs),
                               indices=torch.cat(runs) if runs else torch.zeros(0, dtype=torch.int64),
                               cu_seqlens=torch.tensor(local_cu, dtype=torch.int32),
                               max_seqlen=max((s.length for s in segs), default=0)))
    return ShardPlan(world_size=world_size, align=align, cu_seqlens=tuple(cu), split_docs=tuple(split),
                     ranks=tuple(ranks))


# ---- data movement -----------------------------------------------------------------------------
def _check_plan(plan) -> ShardPlan:
    if not isinstance(plan, ShardPlan):
        raise FlamiaError(f"flamia.distributed: plan must be a ShardPlan from plan_shards, got {type(plan).__name__}")
    return plan


def shard(x: Tensor, plan: ShardPlan, rank: int) -> Tensor:
    """Rank's rows of x ([T, ...], rows = tokens of the global pack), in the rank's order."""
    _check_plan(plan)
    _check_rank(rank, plan)
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise FlamiaError("flamia.distributed: x must be a torch.Tensor with a token dimension first")
    if x.shape[0] != plan.num_tokens:
        raise FlamiaError(f"flamia.distributed: x must have {plan.num_tokens} rows (cu_seqlens[-1]), "
                          f"got shape {tuple(x.shape)}")
    return x.index_select(0, plan.ranks[rank].indices.to(x.device))


def unshard(shards: Sequence[Tensor], plan: ShardPlan) -> Tensor:
    """The global [T, ...] tensor from every rank's shard (the inverse of shard)."""
    _check_plan(plan)
    if len(shards) != plan.world_size:
        raise FlamiaError(f"flamia.distributed: shards must hold world_size = {plan.world_size} tensors, "
                          f"got {len(shards)}")
    first = shards[0]
    for r, (s, rs) in enumerate(zip(shards, plan.ranks)):
        if not isinstance(s, Tensor):
            raise FlamiaError(f"flamia.distributed: shards[{r}] must be a torch.Tensor, got {type(s).__name__}")
        if s.dim() < 1 or s.shape[0] != rs.num_tokens or s.shape[1:] != first.shape[1:]:
            raise FlamiaError(f"flamia.distributed: shards[{r}] must have shape "
                              f"{(rs.num_tokens,) + tuple(first.shape[1:])}, got {tuple(s.shape)}")
        if s.dtype != first.dtype or s.device != first.device:
            raise FlamiaError(f"flamia.distributed: shards[{r}] must be {first.dtype} on {first.device} "
                              f"like shards[0], got {s.dtype} on {s.device}")
    out = first.new_empty((plan.num_tokens,) + tuple(first.shape[1:]))
    for s, rs in zip(shards, plan.ranks):
        out.index_copy_(0, rs.indices.to(out.device), s)
    return out


# ---- balance -----------------------------------------------------------------------------------
def _imbalance(per_rank: Sequence[int]) -> float:
    total = sum(per_rank)
    return max(per_rank) * len(per_rank) / total if total else 1.0


def balance(plan: ShardPlan, causal: bool = True) -> Balance:
    """Per rank, the (query, key) pairs its queries see (causal: position p of a document
    sees p + 1 keys; non-causal: the whole document) and its tokens, with max / mean of each."""
    _check_plan(plan)
    work = []
    for rs in plan.ranks:
        if causal:
            work.append(sum(_pairs(s.start, s.end) for s in rs.segments))
        else:
            work.append(sum(s.length * plan.doc_length(s.doc) for s in rs.segments))
    tokens = [rs.num_tokens for rs in plan.ranks]
    return Balance(work=tuple(work), work_imbalance=_imbalance(work), tokens=tuple(tokens),
                   token_imbalance=_imbalance(tokens))


# ---- attention ---------------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, plan: ShardPlan, rank: int, causal: bool = True,
              softmax_scale: Optional[float] = None, recipe: str = "fp8") -> Tensor:
    """This rank's rows of flamia.attention over the sharded pack.

    q [T_r, Hq, D] and k, v [T_r, Hkv, D] are shard(x, plan, rank) of the global tensors;
    returns shard(O, plan, rank), the rows single-pack flamia.attention gives, bit for bit:
    every document is computed whole, and a document's result does not depend on the rest
    of the pack (per-token scales, per-document tiles). Differentiable like flamia.attention
    (the gradients are the shards of the single-pack gradients, bit for bit). No collective
    runs: a whole document's keys and values are on its rank.

    Needs a plan that keeps every document in one piece (no document in several chunks, the
    case for every document of a long-tailed pack at P = 2); a document in chunks needs the
    streamed or ring kernels of docs/CONTEXT_PARALLEL.md, not built yet, and raises
    FlamiaError."""
    import flamia

    _check_plan(plan)
    _check_rank(rank, plan)
    # A split document whose one non-empty chunk holds it all (shorter than a chunk) is whole.
    cut = sorted({seg.doc for rs_ in plan.ranks for seg in rs_.segments
                  if seg.length > 0 and seg.length < plan.doc_length(seg.doc)})
    if cut:
        docs = ", ".join(str(d) for d in cut[:8]) + (", ..." if len(cut) > 8 else "")
        raise FlamiaError(f"flamia.distributed.attention: the plan cuts document(s) {docs} into chunks; "
                          "attention over a document in several chunks needs the ring kernels, which are not "
                          "built yet (only plans that keep every document whole run: docs/CONTEXT_PARALLEL.md)")
    rs = plan.ranks[rank]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise FlamiaError(f"flamia.distributed.attention: {name} must be a [T_r, H, D] torch.Tensor "
                              f"(shard(x, plan, rank)), got {type(x).__name__ if not isinstance(x, Tensor) else tuple(x.shape)}")
        if x.shape[0] != rs.num_tokens:
            raise FlamiaError(f"flamia.distributed.attention: {name} must have rank {rank}'s {rs.num_tokens} rows "
                              f"(shard(x, plan, rank)), got shape {tuple(x.shape)}")
    if rs.num_tokens == 0:
        # A rank without tokens: an empty output that still belongs to the graph, so that the
        # same backward call runs on every rank (its gradients are empty too).
        return q * 0 + (k.sum() + v.sum()).to(q.dtype) * 0
    cu = rs.cu_seqlens.to(q.device)
    return flamia.attention(q, k, v, cu, rs.max_seqlen, causal=causal, softmax_scale=softmax_scale, recipe=recipe)
