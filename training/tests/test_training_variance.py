"""training/variance.py on synthetic logs: pairing removes a spread the recipes share."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import variance  # noqa: E402
from test_training_report import write_run  # noqa: E402


def test_shared_spread_cancels_in_the_paired_gap(tmp_path, capsys):
    runs = tmp_path / "runs"
    # the seeds differ by 0.5 nats, fp8 is 1 % above bf16 for every seed
    for seed, b in {1: 1.5, 2: 2.0, 3: 2.5}.items():
        write_run(runs, "bf16", seed, b)
        write_run(runs, "fp8", seed, 1.01 * b)
    write_run(runs, "fp8", 4, 2.0)  # no bf16 partner: left out
    assert variance.main(["--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "fp8 against bf16, 3 paired seeds" in out
    # final evaluation: std 25 % of the mean for both, paired std 0, correlation +1
    assert "| 2 | 25.00 % | 25.00 % | +1.00 % | 0.00 % | ±0.00 % | 2 | +1.00 |" in out
    assert "| K = 2 (steps 1–2) |" in out


def test_correlation_and_unpaired_width():
    assert variance.correlation([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert variance.correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # two values each, variance 0.5: se = sqrt(0.25 + 0.25), t(1) = 12.706, mean 1.5
    assert variance.unpaired_half_width_pct([1, 2], [1, 2]) == pytest.approx(100 * 12.706 * 0.5 ** 0.5 / 1.5)


def test_unknown_setting_is_an_error(tmp_path):
    write_run(tmp_path / "runs", "bf16", 1, 2.0)
    with pytest.raises(SystemExit):
        variance.main(["--runs-dir", str(tmp_path / "runs"), "--setting", "nope"])
