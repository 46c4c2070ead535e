#!/usr/bin/env python3
"""Where the seed-to-seed spread of a sweep comes from, and which reading of the logs
narrows the paired gap's interval (standard library only; reads what run_all.sh wrote).

For every setting folder and every recipe against bf16, over the seeds both finished
with matching initial weights and packs, it prints (markdown):

  per evaluation step   each recipe's held-out std over seeds, the paired gap's mean, std
                        and 95 % half-width, the correlation of the two recipes' losses over
                        seeds, and the half-width an unpaired comparison would give (does
                        pairing help, and when do the runs of one seed drift apart?)
  last K evaluations    the same for the mean of each run's last K evaluations
  last N train steps    the same for the mean training loss of the last N steps (the packs of
                        a step depend only on the seed, so the pair sees the same data)

    python training/variance.py [--runs-dir training/runs] [--setting default-hd64-8M]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import report  # noqa: E402
import stats  # noqa: E402

TRAIN_TAILS = (1, 10, 20, 50, 100)


def correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation (nan when either side does not vary)."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    sab = math.fsum((x - ma) * (y - mb) for x, y in zip(a, b))
    saa, sbb = math.fsum((x - ma) ** 2 for x in a), math.fsum((y - mb) ** 2 for y in b)
    return sab / math.sqrt(saa * sbb) if saa > 0 and sbb > 0 else math.nan


def unpaired_half_width_pct(base: Sequence[float], other: Sequence[float]) -> float:
    """95 % half-width of the relative difference of the two means if the runs were not
    paired (Welch's standard error; t with the smaller n - 1 degrees of freedom, conservative)."""
    se = math.sqrt(statistics.variance(base) / len(base) + statistics.variance(other) / len(other))
    return 100.0 * stats.t975(min(len(base), len(other)) - 1) * se / statistics.fmean(base)


def row(label: str, base: list[float], other: list[float]) -> str:
    gaps = [100.0 * (o / b - 1.0) for b, o in zip(base, other)]
    iv = stats.t_interval(gaps)
    bm, bs = stats.mean_std(base)
    om, os_ = stats.mean_std(other)
    need = stats.seeds_for_half_width(iv.std)
    return (f"| {label} | {100 * bs / bm:.2f} % | {100 * os_ / om:.2f} % | {iv.mean:+.2f} % | {iv.std:.2f} % | "
            f"±{iv.half_width:.2f} % | {need if need is not None else '–'} | {correlation(base, other):+.2f} | "
            f"±{unpaired_half_width_pct(base, other):.2f} % |")


HEADER = ("| {what} | bf16 std over seeds | {recipe} std over seeds | paired gap, mean | paired std | "
          "paired 95 % half-width | seeds for ±1 % | correlation bf16–{recipe} | unpaired 95 % half-width |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def paired_logs(runs: dict, recipe: str) -> list[tuple[dict, dict]]:
    """(bf16 log, recipe log) per seed that both finished with the same weights and packs."""
    out = []
    for seed, log in sorted(runs.get(recipe, {}).items()):
        b = runs.get("bf16", {}).get(seed)
        if b is None or not (report.finished(b) and report.finished(log)):
            continue
        bc, rc = b["config"][0], log["config"][0]
        if all(bc.get(k) == rc.get(k) for k in ("init_fingerprint", "data_fingerprint")):
            out.append((b, log))
    return out


def analyse(setting: str, runs: dict) -> str:
    parts = []
    for recipe in sorted(r for r in runs if r != "bf16"):
        pairs = paired_logs(runs, recipe)
        if len(pairs) < 2:
            parts.append(f"`{setting}` {recipe}: fewer than 2 paired seeds, nothing to analyse.\n")
            continue
        parts.append(f"### `{setting}`: {recipe} against bf16, {len(pairs)} paired seeds\n")
        steps = [e["step"] for e in pairs[0][0]["eval"]]
        if any([e["step"] for e in log["eval"]] != steps for pair in pairs for log in pair):
            parts.append("Evaluation steps differ between runs; left out.\n")
            continue
        parts += [HEADER.format(what="held-out loss at step", recipe=recipe)]
        for i, step in enumerate(steps):
            parts.append(row(str(step), [b["eval"][i]["val_loss"] for b, _ in pairs],
                             [r["eval"][i]["val_loss"] for _, r in pairs]))
        parts += ["", HEADER.format(what="mean of the last K evaluations", recipe=recipe)]
        for k in range(1, len(steps) + 1):
            parts.append(row(f"K = {k} (steps {steps[-k]}–{steps[-1]})",
                             [report.final_loss(b, k)[0] for b, _ in pairs],
                             [report.final_loss(r, k)[0] for _, r in pairs]))
        parts += ["", HEADER.format(what="mean train loss of the last N steps", recipe=recipe)]
        for n in TRAIN_TAILS:
            parts.append(row(f"N = {n}", [statistics.fmean(t["loss"] for t in b["train"][-n:]) for b, _ in pairs],
                             [statistics.fmean(t["loss"] for t in r["train"][-n:]) for _, r in pairs]))
        parts.append("")
    return "\n".join(parts)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    ap.add_argument("--setting", default=None, help="one setting folder (default: all)")
    args = ap.parse_args(argv)
    sweeps = report.discover_seed_runs(args.runs_dir) if args.runs_dir.is_dir() else {}
    if args.setting is not None:
        if args.setting not in sweeps:
            ap.error(f"--setting: no seed runs under {args.runs_dir / args.setting}")
        sweeps = {args.setting: sweeps[args.setting]}
    if not sweeps:
        print(f"no seed runs under {args.runs_dir}")
        return 1
    for setting, runs in sorted(sweeps.items()):
        print(analyse(setting, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
