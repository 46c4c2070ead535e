"""The benchmark workloads of the project (packs of documents), without torch.

Long-tailed packs follow the project's recipe: draw L = clamp(round(exp(N(6.8, 1.1^2))),
64, 16384) with a fixed seed until the pack is full; the last document takes what is left.
bench/workloads.h reproduces random.Random(seed).gauss in C++ so that the C++ benchmark
builds the same packs: change the two together.
"""

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional

__all__ = ["Workload", "WORKLOADS", "long_tailed_lengths", "length_summary", "DEFAULT_SEED"]

DEFAULT_SEED = 20261130


def long_tailed_lengths(total_tokens: int, seed: int = DEFAULT_SEED, mu: float = 6.8, sigma: float = 1.1,
                        lo: int = 64, hi: int = 16384) -> List[int]:
    """Document lengths summing to total_tokens (Python's own RNG, so identical everywhere)."""
    rng = random.Random(seed)
    out: List[int] = []
    left = total_tokens
    while left > 0:
        n = min(max(int(round(math.exp(rng.gauss(mu, sigma)))), lo), hi)
        n = min(n, left)  # the last document takes what is left
        out.append(n)
        left -= n
    return out


def length_summary(lengths: List[int]) -> Dict[str, float]:
    s = sorted(lengths)
    return {
        "docs": len(s),
        "tokens": sum(s),
        "min": s[0],
        "median": statistics.median(s),
        "mean": round(sum(s) / len(s), 1),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "max": s[-1],
    }


@dataclass
class Workload:
    name: str
    total_tokens: int
    hq: int
    hkv: int
    head_dim: int
    doc_len: Optional[int] = None   # fixed-length packs; None = long-tailed
    seed: Optional[int] = None      # long-tailed packs
    causal: bool = True
    lengths: List[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.lengths:
            if self.doc_len is not None:
                assert self.total_tokens % self.doc_len == 0
                self.lengths = [self.doc_len] * (self.total_tokens // self.doc_len)
            else:
                self.seed = DEFAULT_SEED if self.seed is None else self.seed
                self.lengths = long_tailed_lengths(self.total_tokens, self.seed)

    @property
    def fixed(self) -> bool:
        return self.doc_len is not None

    @property
    def cu_seqlens(self) -> List[int]:
        cu = [0]
        for n in self.lengths:
            cu.append(cu[-1] + n)
        return cu

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    def fwd_flops(self) -> float:
        """Causal forward = 4*D*Hq*sum L(L+1)/2; non-causal 4*D*Hq*sum L^2 (DESIGN.md section 4)."""
        if self.causal:
            pairs = sum(n * (n + 1) // 2 for n in self.lengths)
        else:
            pairs = sum(n * n for n in self.lengths)
        return 4.0 * self.head_dim * self.hq * pairs

    def bwd_flops(self) -> float:
        return 2.5 * self.fwd_flops()

    def describe(self) -> str:
        if self.fixed:
            lens = f"{len(self.lengths)} x {self.doc_len}"
        else:
            s = length_summary(self.lengths)
            lens = (f"seed {self.seed}: {s['docs']} docs, min {s['min']}, median {s['median']}, "
                    f"mean {s['mean']}, p90 {s['p90']}, max {s['max']}")
        return f"{self.name}: T={self.total_tokens}, Hq/Hkv={self.hq}/{self.hkv}, D={self.head_dim}, {lens}"


def _table() -> Dict[str, Workload]:
    w = [
        Workload("fixed-4k", 32768, 16, 16, 128, doc_len=4096),
        Workload("fixed-8k", 32768, 16, 16, 128, doc_len=8192),
        Workload("fixed-16k", 32768, 16, 16, 128, doc_len=16384),
        Workload("fixed-32k", 32768, 16, 16, 128, doc_len=32768),
        Workload("pack-32k", 32768, 16, 16, 128),
        Workload("pack-128k", 131072, 16, 16, 128),
        Workload("llama8b-pack", 65536, 32, 8, 128),
        Workload("llama1b-pack", 65536, 32, 8, 64),
    ]
    return {x.name: x for x in w}


WORKLOADS: Dict[str, Workload] = _table()
