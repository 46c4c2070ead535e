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

runs a rank's attention: documents the plan keeps whole need no communication (every
document of a long-tailed pack at P = 2: see the balance table in that document). A document
cut into chunks needs an exchange over the process group, one of two:

- "divide" (the default for causal attention with chunks of a multiple of 128 tokens, as
  align=128 gives): k and v of the cut documents are all-gathered, and each chunk [cC, end)
  runs as a local document [0, end) with q_start = cC, so a rank computes only its own query
  rows and the ranks divide the document's work. O and dQ are bitwise single-pack flamia;
  dK/dV are FP32 sums of the chunks' BF16 partials (sent in BF16 by one all_to_all to the
  rank holding the keys), within the bound in attention's docstring.
- "gather": q, k, v (and dO in the backward) of a cut document are gathered whole onto every
  rank holding a chunk, which computes all of it: everything bitwise, the work not divided.

This module needs torch; torch.distributed only for plans that cut documents. `import
flamia` does not import it.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._lib import QUERY_TILE, FlamiaError

__all__ = ["Segment", "RankShard", "ShardPlan", "Balance", "plan_shards", "shard", "unshard",
           "balance", "attention", "default_exchange"]

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

    @property
    def cut_docs(self) -> Tuple[int, ...]:
        """The documents held in more than one chunk: a split document whose first chunk
        holds it all (shorter than a chunk) stays whole."""
        return tuple(sorted({seg.doc for rs in self.ranks for seg in rs.segments
                             if 0 < seg.length < self.doc_length(seg.doc)}))

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


def _chunk_size(length: int, world_size: int, align: int) -> int:
    """C = roundup(ceil(L / 2P), align): the chunk size of a split document."""
    return -(-(-(-length // (2 * world_size))) // align) * align


def _zigzag_chunks(length: int, world_size: int, align: int) -> List[Tuple[int, int, int]]:
    """(rank, start, end) of the non-empty chunks of a split document: 2P chunks of
    C = roundup(ceil(L / 2P), align) tokens; chunk j goes to rank min(j, 2P - 1 - j)."""
    n = 2 * world_size
    c = _chunk_size(length, world_size, align)
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
@dataclass(frozen=True)
class _GatherLayout:
    """How a rank assembles its local pack when the plan cuts documents: its whole documents
    (its own rows) followed by every cut document in full (rows gathered from all ranks).

    cut_rows: the rank's own rows of cut documents (storage positions), sent to the others;
    width: the longest such list over the ranks (all_gather needs equal sizes; shorter ones
    are padded); whole_rows: the rank's rows of whole documents; gather_idx: for every row of
    the cut documents, in document and position order, its row in the concatenated gathered
    buffers; own_idx: for every row the rank stores, its row in the local pack; cu_seqlens,
    max_seqlen: the local pack's."""

    cut_rows: Tensor
    width: int
    whole_rows: Tensor
    gather_idx: Tensor
    own_idx: Tensor
    cu_seqlens: Tensor
    max_seqlen: int


def _cut_rows(plan: ShardPlan, cut_set) -> Tuple[List[List[int]], dict, int]:
    """Per rank, its rows of cut documents in storage order (what it sends in an all_gather);
    where each (doc, position) sits: (rank, index among that rank's cut rows); and the width
    (the longest list: all_gather pads every rank's rows to it)."""
    where = {}
    cut_rows = []
    for rs in plan.ranks:
        rows, at = [], 0
        offsets = rs.cu_seqlens.tolist()
        for i, seg in enumerate(rs.segments):
            if seg.doc in cut_set:
                for j in range(seg.length):
                    where[(seg.doc, seg.start + j)] = (rs.rank, at + j)
                rows.extend(range(offsets[i], offsets[i] + seg.length))
                at += seg.length
        cut_rows.append(rows)
    return cut_rows, where, max(len(r) for r in cut_rows)


def _gather_layout(plan: ShardPlan, rank: int, cut: Sequence[int]) -> _GatherLayout:
    cut_set = set(cut)
    cut_rows, where, width = _cut_rows(plan, cut_set)
    rs = plan.ranks[rank]
    offsets = rs.cu_seqlens.tolist()
    whole_rows, local_cu = [], [0]
    whole_base = {}  # segment index -> first local row
    for i, seg in enumerate(rs.segments):
        if seg.doc not in cut_set:
            whole_base[i] = len(whole_rows)
            whole_rows.extend(range(offsets[i], offsets[i] + seg.length))
            local_cu.append(local_cu[-1] + seg.length)
    doc_base, gather_idx = {}, []
    for d in sorted({seg.doc for seg in rs.segments} & cut_set):  # the cut documents this rank holds part of
        doc_base[d] = local_cu[-1]
        for pos in range(plan.doc_length(d)):
            r, j = where[(d, pos)]
            gather_idx.append(r * width + j)
        local_cu.append(local_cu[-1] + plan.doc_length(d))
    own_idx = []
    for i, seg in enumerate(rs.segments):
        base = whole_base[i] if seg.doc not in cut_set else doc_base[seg.doc] + seg.start
        own_idx.extend(range(base, base + seg.length))
    lengths = [b - a for a, b in zip(local_cu, local_cu[1:])]
    as_index = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return _GatherLayout(cut_rows=as_index(cut_rows[rank]), width=width, whole_rows=as_index(whole_rows),
                         gather_idx=as_index(gather_idx), own_idx=as_index(own_idx),
                         cu_seqlens=torch.tensor(local_cu, dtype=torch.int32), max_seqlen=max(lengths, default=0))


def _all_cut_rows(x: Tensor, lay, group) -> Tensor:
    """Every rank's rows of cut documents of x, rank-major ([P * width, ...]; rank s's rows
    from s * width, padded), through one all_gather."""
    import torch.distributed as dist

    mine = x.new_zeros((lay.width,) + tuple(x.shape[1:]))
    mine[:lay.cut_rows.shape[0]] = x.index_select(0, lay.cut_rows.to(x.device))
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return torch.cat(parts)


def _gather_cut_rows(x: Tensor, lay: _GatherLayout, group) -> Tensor:
    """Every cut document's rows of x, in document and position order, from all ranks."""
    return _all_cut_rows(x, lay, group).index_select(0, lay.gather_idx.to(x.device))


def _local_pack(x: Tensor, lay: _GatherLayout, group) -> Tensor:
    return torch.cat([x.index_select(0, lay.whole_rows.to(x.device)), _gather_cut_rows(x, lay, group)])


class _GatheredAttention(torch.autograd.Function):
    """Attention of a rank's rows when the plan cuts documents: the cut documents' q, k, v are
    gathered whole onto every rank holding part of them, flamia.attention runs on the local
    pack, and the rank keeps its own rows; the backward gathers dO of the cut documents the
    same way, so each rank's gradients of its own rows sum over every query of the document."""

    @staticmethod
    def forward(ctx, q, k, v, lay, causal, softmax_scale, recipe, group, low_memory):
        import flamia

        with torch.enable_grad():
            leaves = tuple(_local_pack(x, lay, group).detach().requires_grad_(x.requires_grad) for x in (q, k, v))
            out = flamia.attention(*leaves, lay.cu_seqlens.to(q.device), lay.max_seqlen, causal=causal,
                                   softmax_scale=softmax_scale, recipe=recipe, low_memory=low_memory)
        ctx.lay, ctx.group, ctx.leaves, ctx.out = lay, group, leaves, out
        return out.detach().index_select(0, lay.own_idx.to(q.device))

    @staticmethod
    def backward(ctx, dout):
        lay, dev = ctx.lay, dout.device
        # dO of the local pack, assembled as the forward assembled q, k, v.
        full = _local_pack(dout.contiguous(), lay, ctx.group)
        want = [x for x in ctx.leaves if x.requires_grad]
        got = iter(torch.autograd.grad(ctx.out, want, full))
        grads = [next(got).index_select(0, lay.own_idx.to(dev)) if x.requires_grad else None for x in ctx.leaves]
        return (*grads, None, None, None, None, None, None)


@dataclass(frozen=True)
class _AddGroup:
    """One chunk's partial dK/dV rows that land on this rank: rows of the rank's own local pack
    (own=True) or of the all_to_all's receive buffer, added at dest (indices among the rank's
    cut rows). A chunk's positions are distinct, so one index_add per group is deterministic."""

    own: bool
    rows: Tensor
    dest: Tensor


@dataclass(frozen=True)
class _DivideLayout:
    """How a rank assembles its local pack for the divided exchange: per segment in storage
    order, a whole document as it is (q_start 0), or for a chunk [start, end) of a cut
    document the local document [0, end) of that document — k, v of every position (the
    earlier ones gathered from the ranks holding them), q zero before `start` and the
    rank's own rows after — with q_start = start.

    cut_rows, width: as _GatherLayout's (the all_gather of k and v); q_idx: for every local
    row its row in cat([q, one zero row]); kv_idx: its row in cat([k, the gathered rows]);
    own_idx: for every row the rank stores, its row in the local pack; cu_seqlens, q_start,
    max_seqlen: the local pack's.

    The backward's exchange of dK/dV partials (one all_to_all of BF16 rows): every chunk's
    partial covers positions [0, end) of its document; send_rows are the local pack's rows of
    those positions held by other ranks, grouped by destination rank (send_counts), each
    group in chunk order then position order; recv_counts what each rank sends here, in the
    same order; add_groups, in the order of the summation (source rank, then its chunks),
    where each chunk's rows are added in FP32."""

    cut_rows: Tensor
    width: int
    q_idx: Tensor
    kv_idx: Tensor
    own_idx: Tensor
    cu_seqlens: Tensor
    q_start: Tensor
    max_seqlen: int
    send_rows: Tensor
    send_counts: Tuple[int, ...]
    recv_counts: Tuple[int, ...]
    add_groups: Tuple[_AddGroup, ...]


def _cut_positions(plan: ShardPlan, cut_set) -> Tuple[dict, dict]:
    """Per cut document, each position's rank and its index among that rank's cut rows (in
    storage order, as _cut_rows numbers them), as int64 tensors."""
    owner = {d: torch.empty(plan.doc_length(d), dtype=torch.int64) for d in cut_set}
    index = {d: torch.empty(plan.doc_length(d), dtype=torch.int64) for d in cut_set}
    for rs in plan.ranks:
        at = 0
        for seg in rs.segments:
            if seg.doc in cut_set:
                owner[seg.doc][seg.start:seg.end] = rs.rank
                index[seg.doc][seg.start:seg.end] = torch.arange(at, at + seg.length)
                at += seg.length
    return owner, index


def _divide_layout(plan: ShardPlan, rank: int, cut: Sequence[int]) -> _DivideLayout:
    cut_set = set(cut)
    owner, index = _cut_positions(plan, cut_set)
    width = max(sum(seg.length for seg in rs.segments if seg.doc in cut_set) for rs in plan.ranks)
    rs = plan.ranks[rank]
    offsets = rs.cu_seqlens.tolist()
    t_r = rs.num_tokens
    arange = lambda a, b: torch.arange(a, b, dtype=torch.int64)  # noqa: E731
    cut_rows, q_idx, kv_idx, own_idx, local_cu, q_start = [], [], [], [], [0], []
    chunk_base = {}  # segment index -> its local document's first row
    for i, seg in enumerate(rs.segments):
        base = local_cu[-1]
        own = arange(offsets[i], offsets[i] + seg.length)
        if seg.doc in cut_set:
            cut_rows.append(own)
            q_idx += [torch.full((seg.start,), t_r, dtype=torch.int64), own]
            kv_idx.append(t_r + owner[seg.doc][:seg.end] * width + index[seg.doc][:seg.end])
            own_idx.append(arange(base + seg.start, base + seg.end))
            chunk_base[i] = base
            local_cu.append(base + seg.end)
            q_start.append(seg.start)
        else:
            q_idx.append(own)
            kv_idx.append(own)
            own_idx.append(arange(base, base + seg.length))
            local_cu.append(base + seg.length)
            q_start.append(0)
    send = [[] for _ in range(plan.world_size)]
    recv_counts = [0] * plan.world_size
    found = []  # in summation order: (rows of the local pack, dest) or (source rank, offset, count, dest)
    for src in plan.ranks:
        for i, seg in enumerate(src.segments):
            if seg.doc not in cut_set:
                continue
            held_by = owner[seg.doc][:seg.end]
            mine = (held_by == rank).nonzero().flatten()
            if src.rank == rank:
                base = chunk_base[i]
                found.append((mine + base, index[seg.doc][mine]))
                for dst in range(plan.world_size):
                    if dst != rank:
                        send[dst].append((held_by == dst).nonzero().flatten() + base)
            elif mine.numel():
                found.append((src.rank, recv_counts[src.rank], mine.numel(), index[seg.doc][mine]))
                recv_counts[src.rank] += mine.numel()
    # The receive buffer holds the sources' rows one source after another.
    first = [sum(recv_counts[:s]) for s in range(plan.world_size)]
    groups = [_AddGroup(own=True, rows=f[0], dest=f[1]) if len(f) == 2 else
              _AddGroup(own=False, rows=torch.arange(f[2]) + first[f[0]] + f[1], dest=f[3]) for f in found]
    send_counts = tuple(sum(int(x.numel()) for x in rows) for rows in send)
    flat = [x for rows in send for x in rows]
    lengths = [b - a for a, b in zip(local_cu, local_cu[1:])]
    cat = lambda x: torch.cat(x) if x else torch.zeros(0, dtype=torch.int64)  # noqa: E731
    return _DivideLayout(cut_rows=cat(cut_rows), width=width, q_idx=cat(q_idx), kv_idx=cat(kv_idx),
                         own_idx=cat(own_idx),
                         cu_seqlens=torch.tensor(local_cu, dtype=torch.int32),
                         q_start=torch.tensor(q_start, dtype=torch.int32), max_seqlen=max(lengths, default=0),
                         send_rows=cat(flat),
                         send_counts=send_counts, recv_counts=tuple(recv_counts), add_groups=tuple(groups))


def _exchange_partials(g: Tensor, lay: _DivideLayout, group) -> Tensor:
    """The sum over the group of every chunk's partial of this rank's cut rows ([n_cut, ...],
    FP32, in lay.cut_rows order): the partials travel as the BF16 rows they are (one
    all_to_all), and each rank adds them in FP32 in one order (source rank, then chunk)."""
    import torch.distributed as dist

    dev = g.device
    recv = g.new_empty((sum(lay.recv_counts),) + tuple(g.shape[1:]))
    dist.all_to_all_single(recv, g.index_select(0, lay.send_rows.to(dev)), list(lay.recv_counts),
                           list(lay.send_counts), group=group)
    acc = torch.zeros((lay.cut_rows.shape[0],) + tuple(g.shape[1:]), dtype=torch.float32, device=dev)
    for grp in lay.add_groups:
        acc.index_add_(0, grp.dest.to(dev), (g if grp.own else recv).index_select(0, grp.rows.to(dev)).float())
    return acc


class _DividedAttention(torch.autograd.Function):
    """Attention of a rank's rows with the work of cut documents divided (causal, chunks of
    multiples of 128): k and v of the cut documents are gathered, each chunk runs as a local
    document [0, end) with q_start at the chunk's start, and the rank keeps its own rows. The
    backward runs with dO on its own rows only; each chunk's dK/dV of the gathered keys (a
    BF16 partial) goes to the rank holding those keys, which adds the partials in FP32."""

    @staticmethod
    def forward(ctx, q, k, v, lay, softmax_scale, recipe, group, low_memory):
        import flamia

        dev = q.device
        pools = (torch.cat([q, q.new_zeros((1,) + tuple(q.shape[1:]))]),
                 torch.cat([k, _all_cut_rows(k, lay, group)]), torch.cat([v, _all_cut_rows(v, lay, group)]))
        with torch.enable_grad():
            leaves = tuple(pool.index_select(0, idx.to(dev)).detach().requires_grad_(x.requires_grad)
                           for pool, idx, x in zip(pools, (lay.q_idx, lay.kv_idx, lay.kv_idx), (q, k, v)))
            if leaves[0].shape[0]:
                out = flamia.attention(*leaves, lay.cu_seqlens.to(dev), lay.max_seqlen, causal=True,
                                       softmax_scale=softmax_scale, recipe=recipe, q_start=lay.q_start.to(dev),
                                       low_memory=low_memory)
            else:  # nothing on this rank: it still takes part in the collectives
                out = leaves[0] * 0 + (leaves[1].sum() + leaves[2].sum()).to(q.dtype) * 0
        ctx.lay, ctx.group, ctx.leaves, ctx.out = lay, group, leaves, out
        return out.detach().index_select(0, lay.own_idx.to(dev))

    @staticmethod
    def backward(ctx, dout):
        lay, dev = ctx.lay, dout.device
        own = lay.own_idx.to(dev)
        full = dout.new_zeros(ctx.out.shape).index_copy_(0, own, dout.contiguous())
        want = [x for x in ctx.leaves if x.requires_grad]
        got = iter(torch.autograd.grad(ctx.out, want, full))
        local = [next(got) if x.requires_grad else None for x in ctx.leaves]
        grads = [local[0].index_select(0, own) if local[0] is not None else None]
        # dK and dV of the keys of cut documents: every chunk's BF16 partial goes to the ranks
        # holding its keys (both gradients in one all_to_all), where they are added in FP32.
        kv = [g for g in local[1:] if g is not None]
        sums = iter(_exchange_partials(torch.stack(kv, dim=1), lay, ctx.group).unbind(1) if kv else ())
        cut_own = lay.cut_rows.to(dev)
        for g in local[1:]:
            if g is None:
                grads.append(None)
                continue
            dx = g.index_select(0, own)  # whole documents' rows, as computed
            grads.append(dx.index_copy_(0, cut_own, next(sums).to(dx.dtype)))
        return (*grads, None, None, None, None, None)


def _divide_refusal(plan: ShardPlan, cut: Sequence[int], causal: bool) -> Optional[str]:
    """Why the divided exchange cannot run this plan (None: it can)."""
    if not causal:
        return "it needs causal attention (a non-causal query sees the whole document)"
    for d in cut:
        c = _chunk_size(plan.doc_length(d), plan.world_size, plan.align)
        if c % QUERY_TILE:
            return (f"document {d} (length {plan.doc_length(d)}) is cut into chunks of {c} tokens, not a multiple "
                    f"of {QUERY_TILE} (plan_shards(..., align={plan.align}); align=128 makes every chunk one)")
    return None


def default_exchange(plan: ShardPlan, causal: bool = True) -> str:
    """The exchange attention uses for this plan when none is given: "divide" when causal and
    every cut document's chunk size is a multiple of 128 (plan_shards' default align=128),
    else "gather"."""
    _check_plan(plan)
    return "divide" if _divide_refusal(plan, plan.cut_docs, causal) is None else "gather"


def attention(q: Tensor, k: Tensor, v: Tensor, plan: ShardPlan, rank: int, causal: bool = True,
              softmax_scale: Optional[float] = None, recipe: str = "fp8", group=None,
              exchange: Optional[str] = None, low_memory: bool = False) -> Tensor:
    """This rank's rows of flamia.attention over the sharded pack.

    q [T_r, Hq, D] and k, v [T_r, Hkv, D] are shard(x, plan, rank) of the global tensors;
    returns shard(O, plan, rank), the rows single-pack flamia.attention gives, bit for bit:
    a document's result does not depend on the rest of the pack (per-token scales,
    per-document tiles). Differentiable like flamia.attention.

    Documents the plan keeps whole (every document of a long-tailed pack at P = 2) need no
    communication: their keys and values are on their rank, and their gradients are those
    of single-pack flamia.attention, bit for bit. A document the plan cuts into chunks needs
    an exchange over `group` (default the world; every rank of the group must then call
    this, and run the backward, together):

    exchange="divide" (the default when causal and every cut document's chunk size is a
    multiple of 128, as plan_shards' default align=128 makes it): k and v of the cut
    documents are gathered (torch.distributed.all_gather, BF16; q and dO stay on their
    rank), and each chunk [cC, end) the rank holds runs as a local document [0, end) of
    that document with q_start = cC (flamia.attention's q_start): only the chunk's query
    rows are computed, so the ranks divide the document's work. O and dQ are bitwise those
    of single-pack flamia.attention (each query row runs the one-GPU recurrence over the
    same key tiles). dK and dV of a cut document's keys are summed over the chunks: each
    chunk's partial (the BF16 dK/dV of its local document) travels as it is, in BF16, to the
    rank holding the key (torch.distributed.all_to_all_single, dK and dV together), which
    adds every chunk's partial in FP32 in one fixed order (source rank, then chunk), then
    rounds to BF16 — half the bytes of an FP32 reduce-scatter and deterministic. They equal
    single-pack flamia's up to that re-association and the BF16 rounding of the partials:
    per element |dK - dK_1| <= 2^-8 (sum_c |dK_c| + 2 |dK_1|), dK_c the partial of chunk c's
    queries, dK_1 the single-pack value, 2^-8 BF16's unit roundoff (the FP32 adds contribute
    far less). The tests check max |dK - dK_1| <= 2^-6 max |dK_1| over each cut document;
    measured on random inputs at P = 2, 3 and 4, both recipes: at most 2^-7.1 = 0.0071 (one or
    two BF16 ulps of the largest elements). Needs causal attention and chunks of a
    multiple of 128 tokens; "divide" otherwise raises FlamiaError saying why.

    exchange="gather" (the default otherwise): each cut document is gathered whole (q, k, v
    in BF16, and dO in the backward, through all_gather) onto every rank holding a chunk of
    it, which computes all of it and keeps its own rows: every output and gradient bitwise
    that of single-pack flamia.attention, but the cut document's work is not divided.

    low_memory: passed to every flamia.attention call this makes (its docstring): recipe
    fp8_mixed in a BF16 attention's memory, the same results bit for bit. The exchanges keep
    their gathered local packs for the backward either way."""
    _check_plan(plan)
    _check_rank(rank, plan)
    if exchange not in (None, "divide", "gather"):
        raise FlamiaError(f"flamia.distributed.attention: exchange must be 'divide', 'gather' or None (the default), "
                          f"got {exchange!r}")
    rs = plan.ranks[rank]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise FlamiaError(f"flamia.distributed.attention: {name} must be a [T_r, H, D] torch.Tensor "
                              f"(shard(x, plan, rank)), got {type(x).__name__ if not isinstance(x, Tensor) else tuple(x.shape)}")
        if x.shape[0] != rs.num_tokens:
            raise FlamiaError(f"flamia.distributed.attention: {name} must have rank {rank}'s {rs.num_tokens} rows "
                              f"(shard(x, plan, rank)), got shape {tuple(x.shape)}")
    cut = plan.cut_docs
    refusal = _divide_refusal(plan, cut, causal)
    if exchange == "divide" and refusal is not None:
        raise FlamiaError(f"flamia.distributed.attention: exchange='divide' is not possible here: {refusal}; "
                          f"use exchange='gather'")
    if exchange is None:
        exchange = "divide" if refusal is None else "gather"
    if cut:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise FlamiaError("flamia.distributed.attention: the plan cuts document(s) into chunks, which needs an "
                              "initialized torch.distributed process group (init_process_group)")
        if dist.get_world_size(group) != plan.world_size or dist.get_rank(group) != rank:
            raise FlamiaError(f"flamia.distributed.attention: the group has {dist.get_world_size(group)} ranks and "
                              f"this is rank {dist.get_rank(group)}; the plan is for world_size {plan.world_size} "
                              f"and the call says rank {rank}")
        if exchange == "divide":
            return _DividedAttention.apply(q, k, v, _divide_layout(plan, rank, cut), softmax_scale, recipe, group,
                                           bool(low_memory))
        return _GatheredAttention.apply(q, k, v, _gather_layout(plan, rank, cut), causal, softmax_scale, recipe,
                                        group, bool(low_memory))
    if rs.num_tokens == 0:
        # A rank without tokens: an empty output that still belongs to the graph, so that the
        # same backward call runs on every rank (its gradients are empty too).
        return q * 0 + (k.sum() + v.sum()).to(q.dtype) * 0
    import flamia

    return flamia.attention(q, k, v, rs.cu_seqlens.to(q.device), rs.max_seqlen, causal=causal,
                            softmax_scale=softmax_scale, recipe=recipe, low_memory=low_memory)
