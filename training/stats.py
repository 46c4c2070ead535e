"""Seed statistics for the training comparison (standard library only, so the report and
its tests run anywhere).

The comparison is paired: for every seed, each recipe starts from the same weights and
sees the same packs as bf16, so the per-seed gap to bf16 cancels most of the seed-to-seed
variation that the recipes share. The gap's 95 % interval is a Student t interval over
those per-seed gaps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

# Two-sided 95 % quantiles of Student's t, t_{0.975}(df). Between tabulated df the next
# smaller df is used, which widens the interval slightly (conservative).
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000,
    120: 1.980,
}
_Z975 = 1.960
TOLERANCE_PCT = 1.0  # the claim under test: "within 1 % of BF16"
MAX_SEEDS_ESTIMATE = 10_000


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df > max(_T975):
        return _Z975
    return _T975[max(k for k in _T975 if k <= df)]


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n-1); std is nan for fewer than 2 values."""
    if not xs:
        raise ValueError("mean_std of no values")
    n = len(xs)
    m = math.fsum(xs) / n
    if n < 2:
        return m, math.nan
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))


def standard_error(xs: Sequence[float]) -> float:
    """Standard error of the mean (nan for fewer than 2 values)."""
    _, s = mean_std(xs)
    return s / math.sqrt(len(xs))


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    std: float          # sample std of the values (nan if n < 2)
    half_width: float   # t_{0.975}(n-1) * std / sqrt(n) (nan if n < 2)

    @property
    def lo(self) -> float:
        return self.mean - self.half_width

    @property
    def hi(self) -> float:
        return self.mean + self.half_width


def t_interval(xs: Sequence[float]) -> Interval:
    """95 % confidence interval of the mean of xs (Student t)."""
    m, s = mean_std(xs)
    n = len(xs)
    hw = t975(n - 1) * s / math.sqrt(n) if n >= 2 else math.nan
    return Interval(n, m, s, hw)


def paired_gaps_pct(recipe: Mapping[int, float], base: Mapping[int, float]) -> dict[int, float]:
    """Per seed present in both: 100 * (recipe / base - 1), the relative held-out loss gap."""
    return {s: 100.0 * (recipe[s] / base[s] - 1.0) for s in sorted(set(recipe) & set(base))}


def paired_gap_se_pct(recipe_packs: Sequence[float], base_packs: Sequence[float]) -> float:
    """Evaluation noise of one seed's gap: the standard error of the mean per-pack loss
    difference over the held-out packs, relative to the base's mean loss, in %."""
    if len(recipe_packs) != len(base_packs):
        raise ValueError(f"pack counts differ: {len(recipe_packs)} vs {len(base_packs)}")
    d = [r - b for r, b in zip(recipe_packs, base_packs)]
    return 100.0 * standard_error(d) / (math.fsum(base_packs) / len(base_packs))


def seeds_needed(mean: float, std: float, tol: float = TOLERANCE_PCT) -> Optional[int]:
    """Smallest n whose 95 % half-width t(n-1)*std/sqrt(n) fits between the mean and the
    nearer edge of +-tol, assuming the mean and std stay as measured; None if the mean sits
    on the edge (or more than MAX_SEEDS_ESTIMATE would be needed)."""
    room = abs(tol - abs(mean))
    return seeds_for_half_width(std, room) if room > 0 else None


def seeds_for_half_width(std: float, half_width: float = TOLERANCE_PCT) -> Optional[int]:
    """Smallest n whose 95 % half-width t(n-1)*std/sqrt(n) is at most half_width: how many
    paired seeds a +-half_width interval needs at the measured spread (None if more than
    MAX_SEEDS_ESTIMATE)."""
    if half_width <= 0:
        raise ValueError(f"half_width must be > 0, got {half_width}")
    if not math.isfinite(std):
        return None
    for n in range(2, MAX_SEEDS_ESTIMATE + 1):
        if t975(n - 1) * std / math.sqrt(n) <= half_width:
            return n
    return None


def verdict(gaps_pct: Sequence[float], tol: float = TOLERANCE_PCT) -> str:
    """Plain reading of the paired gaps (recipe vs bf16, %) against +-tol."""
    n = len(gaps_pct)
    if n < 2:
        return f"cannot tell yet, needs at least 2 paired seeds (has {n})"
    iv = t_interval(gaps_pct)
    if -tol <= iv.lo and iv.hi <= tol:
        return f"within {tol:g} %"
    if iv.lo > tol:
        return f"worse than {tol:g} %"
    if iv.hi < -tol:
        return f"better than bf16 by more than {tol:g} %"
    need = seeds_needed(iv.mean, iv.std, tol)
    if need is None:
        return f"cannot tell yet, mean gap {iv.mean:+.2f} % sits on the {tol:g} % edge"
    return f"cannot tell yet, needs ~{need} seeds"


def upper_end_reading(gaps_pct: Sequence[float], tol: float = TOLERANCE_PCT) -> str:
    """One-sided reading of the paired gaps (recipe vs bf16, %): is the recipe worse than bf16
    by more than tol? Read off the upper end of the 95 % interval (a one-sided 97.5 % bound)."""
    n = len(gaps_pct)
    if n < 2:
        return f"no interval yet (has {n} paired seed{'s' if n != 1 else ''})"
    iv = t_interval(gaps_pct)
    if iv.hi <= tol:
        return f"not worse than bf16 by more than {tol:g} % (upper end {iv.hi:+.2f} %)"
    if iv.lo > tol:
        return f"worse than bf16 by more than {tol:g} %"
    return f"cannot rule out more than {tol:g} % worse (upper end {iv.hi:+.2f} %)"
