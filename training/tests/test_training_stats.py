"""Interval math and verdicts of training/stats.py against hand-computed values."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stats  # noqa: E402


def test_t_quantiles_table_and_conservative_lookup():
    assert stats.t975(1) == 12.706
    assert stats.t975(4) == 2.776
    assert stats.t975(30) == 2.042
    assert stats.t975(35) == 2.042  # between table rows: the smaller df, the wider interval
    assert stats.t975(1000) == 1.960
    with pytest.raises(ValueError):
        stats.t975(0)


def test_mean_std_sample_std():
    m, s = stats.mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5
    assert s == pytest.approx(math.sqrt(5 / 3))  # squares 2.25+0.25+0.25+2.25 = 5, over n-1
    m, s = stats.mean_std([7.0])
    assert m == 7.0 and math.isnan(s)
    with pytest.raises(ValueError):
        stats.mean_std([])


def test_t_interval_hand_computed():
    # mean 2, std 1, se 1/sqrt(3) = 0.57735, t(2) = 4.303 -> half-width 2.484338
    iv = stats.t_interval([1.0, 2.0, 3.0])
    assert iv.n == 3 and iv.mean == 2.0 and iv.std == pytest.approx(1.0)
    assert iv.half_width == pytest.approx(4.303 / math.sqrt(3), abs=1e-12)
    assert iv.lo == pytest.approx(-0.484338, abs=1e-6)
    assert iv.hi == pytest.approx(4.484338, abs=1e-6)
    # std sqrt(0.025) = 0.158114, se 0.0707107, t(4) = 2.776 -> half-width 0.196293
    iv = stats.t_interval([0.1, -0.1, 0.2, 0.0, -0.2])
    assert iv.mean == pytest.approx(0.0, abs=1e-15)
    assert iv.half_width == pytest.approx(0.196293, abs=1e-6)
    assert math.isnan(stats.t_interval([0.5]).half_width)


def test_paired_gaps_use_common_seeds_only():
    base = {1: 1.50, 2: 1.40, 3: 1.60}
    rec = {1: 1.53, 2: 1.386, 4: 9.9}
    gaps = stats.paired_gaps_pct(rec, base)
    assert sorted(gaps) == [1, 2]
    assert gaps[1] == pytest.approx(2.0)
    assert gaps[2] == pytest.approx(-1.0)


def test_paired_gap_se_from_pack_losses():
    base = [1.0, 2.0, 3.0]
    rec = [1.1, 2.0, 3.2]  # differences 0.1, 0, 0.2: std 0.1, se 0.1/sqrt(3); base mean 2
    assert stats.paired_gap_se_pct(rec, base) == pytest.approx(100 * 0.1 / math.sqrt(3) / 2)
    with pytest.raises(ValueError):
        stats.paired_gap_se_pct([1.0], base)


def test_verdict_within():
    assert stats.verdict([0.1, -0.1, 0.2, 0.0, -0.2]) == "within 1 %"


def test_verdict_worse():
    # mean 2.0, half-width 0.196 -> [1.80, 2.20], entirely above +1 %
    assert stats.verdict([2.0, 2.2, 1.8, 2.1, 1.9]) == "worse than 1 %"


def test_verdict_better():
    assert stats.verdict([-2.0, -2.2, -1.8, -2.1, -1.9]) == "better than bf16 by more than 1 %"


def test_verdict_cannot_tell_estimates_seeds():
    # mean 2, std 1: the interval must shrink to 1 (the distance to the +1 % edge);
    # t(5)/sqrt(6) = 1.0496 > 1 and t(6)/sqrt(7) = 0.9249 <= 1 -> 7 seeds
    assert stats.verdict([1.0, 2.0, 3.0]) == "cannot tell yet, needs ~7 seeds"
    assert stats.seeds_needed(2.0, 1.0) == 7
    # the numbers: 4 seeds, mean +1.0 %, the interval straddles both edges
    v = stats.verdict([4.27, 0.08, -1.71, 1.42])
    assert v.startswith("cannot tell yet")


def test_verdict_edge_and_too_few_seeds():
    assert stats.verdict([0.5]) == "cannot tell yet, needs at least 2 paired seeds (has 1)"
    assert stats.seeds_needed(1.0, 0.5) is None
    assert "edge" in stats.verdict([0.0, 2.0])  # mean exactly 1 %: no number of seeds decides


def test_seeds_for_half_width():
    # std 2.53: t(26)*2.53/sqrt(27) = 1.0011 > 1, t(27)*2.53/sqrt(28) = 0.9811 <= 1 -> 28 seeds for +-1 %
    assert stats.seeds_for_half_width(2.53) == 28
    assert stats.seeds_for_half_width(1.0, 0.5) == stats.seeds_needed(0.5, 1.0)
    assert stats.seeds_for_half_width(0.0) == 2
    assert stats.seeds_for_half_width(float("nan")) is None
    with pytest.raises(ValueError):
        stats.seeds_for_half_width(1.0, 0.0)


def test_upper_end_reading_is_one_sided():
    # -2, -1, 0: mean -1, std 1, t(2) = 4.303: upper end -1 + 4.303/sqrt(3) = +1.48
    assert stats.upper_end_reading([-2.0, -1.0, 0.0]) == "cannot rule out more than 1 % worse (upper end +1.48 %)"
    # ten gaps -1 +- 0.5: upper end -1 + 2.262 * 0.527 / sqrt(10) < 0
    gaps = [-1.5, -0.5] * 5
    assert stats.upper_end_reading(gaps).startswith("not worse than bf16 by more than 1 % (upper end -0.6")
    assert stats.upper_end_reading([3.0, 3.2, 2.8]) == "worse than bf16 by more than 1 %"
    assert stats.upper_end_reading([0.5]) == "no interval yet (has 1 paired seed)"
