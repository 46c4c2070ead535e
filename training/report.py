#!/usr/bin/env python3
"""Summarize the training runs and the leakage probe.

Reads three kinds of results and regenerates one block of docs/TRAINING.md for each
(between its BEGIN/END GENERATED markers; the rest of the file is left as written). A
block whose results are absent is left as it is, so a partial rerun never erases a record.

  seed sweeps      training/runs/<corpus>-hd<D>[-<tag>]/<recipe>-seed<S>/log.jsonl (run_all.sh):
                   per setting folder each recipe's held-out loss mean +- std over seeds,
                   the paired per-seed gap to bf16 with its 95 % t interval and a verdict
                   (training/stats.py); curves with a min-max (or +-std) band over seeds in
                   docs/training/seeds_<setting>.png
  single runs      training/runs/<run>/log.jsonl (train.py with its default run name): one
                   row per run, curves in docs/training/loss_curves.png
  leakage probe    training/runs/leakage_probe.json (leakage_probe.py)

    python training/report.py [--avg-last 3] [--band std] [--runs bf16 fp8 fp8_mixed]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import stats  # noqa: E402

BEGIN = "<!-- BEGIN GENERATED RESULTS (training/report.py) -->"
END = "<!-- END GENERATED RESULTS -->"
SEEDS_BEGIN = "<!-- BEGIN GENERATED SEED STATISTICS (training/report.py) -->"
SEEDS_END = "<!-- END GENERATED SEED STATISTICS -->"
PROBE_BEGIN = "<!-- BEGIN GENERATED LEAKAGE PROBE (training/report.py) -->"
PROBE_END = "<!-- END GENERATED LEAKAGE PROBE -->"
NO_SEED_RUNS = ("No multi-seed runs yet: this table is written by `training/report.py` from the "
                "logs of `training/run_all.sh`.")
PREFERRED = ["bf16", "fp8", "fp8_mixed", "per_token_fp8", "per_tensor_fp8"]
SPIKE_FACTOR = 1.25   # a step's loss this far above the median of the previous SPIKE_WINDOW
SPIKE_WINDOW = 25


def read_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"config": [], "train": [], "eval": [], "diag": [], "end": []}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.setdefault(rec.get("type", "?"), []).append(rec)
    return out


def spikes(losses: list[float]) -> int:
    n = 0
    for i in range(max(SPIKE_WINDOW, 50), len(losses)):
        med = statistics.median(losses[i - SPIKE_WINDOW:i])
        if math.isfinite(losses[i]) and losses[i] > SPIKE_FACTOR * med:
            n += 1
    return n


def summarize(name: str, log: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    tr, ev, dg = log["train"], log["eval"], log["diag"]
    cfg = log["config"][0] if log["config"] else {}
    losses = [r["loss"] for r in tr]
    tps = [r["tok_per_s"] for r in tr[10:]] or [r["tok_per_s"] for r in tr]
    last_diag = dg[-1] if dg else {}
    errs = last_diag.get("o_err_vs_bf16") or []
    all_logits = [max(d["max_logit"]) for d in dg if d.get("max_logit")]
    end = log["end"][-1] if log["end"] else {}
    return {
        "run": name,
        "recipe": cfg.get("recipe", name),
        "steps": tr[-1]["step"] if tr else 0,
        "total_steps": cfg.get("total_steps"),
        "tokens": tr[-1]["tokens"] if tr else 0,
        "val_loss": ev[-1]["val_loss"] if ev else float("nan"),
        "val_step": ev[-1]["step"] if ev else 0,
        "train_loss_tail": statistics.mean(losses[-20:]) if losses else float("nan"),
        "tok_per_s": statistics.median(tps) if tps else float("nan"),
        "max_logit_final": max(last_diag["max_logit"]) if last_diag.get("max_logit") else float("nan"),
        "max_logit_peak": max(all_logits) if all_logits else float("nan"),
        "o_err_max": max(errs) if errs else None,
        "o_err_mean": statistics.mean(errs) if errs else None,
        "bf16_err_mean": statistics.mean(last_diag["bf16_err_vs_fp32"]) if last_diag.get("bf16_err_vs_fp32") else None,
        "skipped": sum(1 for r in tr if r.get("skipped")),
        "spikes": spikes(losses),
        "finished": bool(end) and not end.get("truncated", False),
        "params": cfg.get("params"),
        "bf16_backend": cfg.get("bf16_backend"),
        "device": cfg.get("device"),
    }


def ema(xs: list[float], alpha: float = 0.05) -> list[float]:
    out, m = [], None
    for x in xs:
        m = x if m is None else (1 - alpha) * m + alpha * x
        out.append(m)
    return out


def plot(logs: dict[str, dict[str, list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (a_tr, a_ev), (a_gap, a_lg) = axes
    colors = {"bf16": "black", "fp8": "tab:red", "fp8_mixed": "tab:blue",
              "per_token_fp8": "tab:green", "per_tensor_fp8": "tab:purple"}
    base_name = next((n for n, l in logs.items() if l["config"] and l["config"][0].get("recipe") == "bf16"), None)
    base = logs.get(base_name) if base_name else None
    base_ev = {r["step"]: r["val_loss"] for r in base["eval"]} if base else {}
    for name, log in logs.items():
        c = colors.get(log["config"][0].get("recipe", name) if log["config"] else name)
        tr = log["train"]
        if tr:
            a_tr.plot([r["tokens"] / 1e6 for r in tr], ema([r["loss"] for r in tr]), label=name, color=c, lw=1.2)
        ev = log["eval"]
        if ev:
            a_ev.plot([r["tokens"] / 1e6 for r in ev], [r["val_loss"] for r in ev], "o-", ms=3, label=name, color=c)
        if base and name != base_name:
            pts = [(r["tokens"] / 1e6, 100 * (r["val_loss"] / base_ev[r["step"]] - 1))
                   for r in ev if r["step"] in base_ev and r["step"] > 0]
            if pts:
                a_gap.plot(*zip(*pts), "o-", ms=3, label=name, color=c)
        dg = log["diag"]
        if dg:
            a_lg.plot([r["step"] for r in dg], [max(r["max_logit"]) for r in dg], "o-", ms=3, label=name, color=c)
    a_tr.set(title="train loss (EMA 0.05)", xlabel="tokens (M)", ylabel="nats / byte")
    a_ev.set(title="held-out loss", xlabel="tokens (M)", ylabel="nats / byte")
    a_gap.set(title="held-out loss relative to bf16 at the same step", xlabel="tokens (M)", ylabel="%")
    a_gap.axhline(0, color="black", lw=0.8)
    a_lg.set(title="largest attention logit |q.k|*scale (max over layers)", xlabel="step")
    for a in axes.flat:
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    # Zoom the loss panels past the first steps so the recipes' differences are visible.
    for a in (a_tr, a_ev):
        ys = [l.get_ydata() for l in a.get_lines()]
        vals = [float(y) for yy in ys for y in yy[len(yy) // 10:]]
        if vals:
            lo, hi = min(vals), max(vals)
            a.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(x: Optional[float], spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def training_table(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    lines = [
        "| run | steps | tokens | held-out loss | gap vs bf16 | train loss (last 20) | tokens/s | speed vs bf16 "
        "| max logit (final / peak) | O rel. err vs bf16 (mean / max over layers) | instabilities |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        gap = spd = None
        if base and r is not base and base["val_step"] == r["val_step"]:
            gap = 100 * (r["val_loss"] / base["val_loss"] - 1)
        if base and r is not base:
            spd = r["tok_per_s"] / base["tok_per_s"]
        steps = f"{r['steps']}/{r['total_steps']}" + ("" if r["finished"] else " (unfinished)")
        inst = f"{r['skipped']} non-finite, {r['spikes']} spikes"
        lines.append(
            f"| {r['run']} | {steps} | {r['tokens'] / 1e6:.1f}M | {fmt(r['val_loss'], '.4f')} | "
            f"{fmt(gap, '+.2f') + ' %' if gap is not None else '–'} | {fmt(r['train_loss_tail'], '.4f')} | "
            f"{fmt(r['tok_per_s'] / 1e3, '.0f')}k | {fmt(spd, '.2f') + '×' if spd is not None else '–'} | "
            f"{fmt(r['max_logit_final'], '.1f')} / {fmt(r['max_logit_peak'], '.1f')} | "
            f"{fmt(r['o_err_mean'], '.4f')} / {fmt(r['o_err_max'], '.4f')} | {inst} |")
    return "\n".join(lines)


def probe_table(probe: dict[str, Any]) -> str:
    lines = [
        "| variant | scheme | steps | held-out loss | chance (ln K) | accuracy | chance acc. "
        "| future influence (init → final) | leak learned |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in probe["results"]:
        if "skipped" in r:
            lines.append(f"| {r['variant']} | {r['scheme']} | skipped: {r['skipped']} | | | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['scheme']} | {r['steps']} | {r['heldout_loss']:.4f} | {r['chance_loss']:.4f} | "
            f"{r['heldout_acc']:.3f} | {r['chance_acc']:.3f} ± {r['acc_stderr_at_chance']:.3f} | "
            f"{r['future_influence_init']:.3f} → {r['future_influence_final']:.3f} | "
            f"{'**yes**' if r['leak_learned'] else 'no'} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Seed sweeps (run_all.sh): paired statistics over seeds
# ---------------------------------------------------------------------------------------
def discover_seed_runs(runs_dir: Path) -> dict[str, dict[str, dict[int, dict[str, list[dict[str, Any]]]]]]:
    """{setting folder (<corpus>-hd<D>[-<tag>]): {recipe: {seed: log}}} for every log
    written with a seed record."""
    out: dict[str, dict[str, dict[int, dict[str, list[dict[str, Any]]]]]] = {}
    for path in sorted(runs_dir.glob("*/*/log.jsonl")):
        log = read_log(path)
        cfg = log["config"][0] if log["config"] else {}
        if "seed" not in cfg or not log["train"]:
            continue
        out.setdefault(path.parent.parent.name, {}).setdefault(cfg["recipe"], {})[int(cfg["seed"])] = log
    return out


def finished(log: dict[str, list[dict[str, Any]]]) -> bool:
    return bool(log["end"]) and not log["end"][-1].get("truncated", False)


def counted(log: dict[str, list[dict[str, Any]]]) -> bool:
    """A run the statistics and curves use: finished, with held-out evaluations."""
    return finished(log) and bool(log["eval"])


def final_loss(log: dict[str, list[dict[str, Any]]], avg_last: int) -> tuple[float, tuple[int, ...]]:
    """Mean held-out loss of the last avg_last evaluations, and the steps they were taken at."""
    ev = log["eval"][-avg_last:]
    return statistics.fmean(r["val_loss"] for r in ev), tuple(r["step"] for r in ev)


def seed_rows(runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]], avg_last: int
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per recipe of a (corpus, head dim) setting, and notes on runs left out.

    A seed counts for a recipe's gap only if both it and bf16 finished, their initial
    weights and training packs match (config fingerprints) and the averaged evaluations
    were taken at the same steps."""
    notes: list[str] = []
    base = runs.get("bf16", {})
    order = [r for r in PREFERRED if r in runs] + sorted(r for r in runs if r not in PREFERRED)
    rows = []
    for recipe in order:
        by_seed = runs[recipe]
        done = {s: l for s, l in sorted(by_seed.items()) if counted(l)}
        for s in sorted(set(by_seed) - set(done)):
            notes.append(f"{recipe} seed {s}: unfinished, left out")
        losses = {s: final_loss(l, avg_last) for s, l in done.items()}
        row: dict[str, Any] = {"recipe": recipe, "seeds": sorted(done),
                               "loss": stats.mean_std([v for v, _ in losses.values()]) if losses else None}
        gaps: dict[int, float] = {}
        gap_se: list[float] = []
        if recipe != "bf16":
            for s, (v, steps) in losses.items():
                b = base.get(s)
                if b is None or not counted(b):
                    notes.append(f"{recipe} seed {s}: no finished bf16 run with this seed, not paired")
                    continue
                bc, rc = b["config"][0], done[s]["config"][0]
                if any(bc.get(k) != rc.get(k) for k in ("init_fingerprint", "data_fingerprint")):
                    notes.append(f"{recipe} seed {s}: initial weights or packs differ from bf16's, not paired")
                    continue
                bv, bsteps = final_loss(b, avg_last)
                if bsteps != steps:
                    notes.append(f"{recipe} seed {s}: evaluated at steps {steps}, bf16 at {bsteps}, not paired")
                    continue
                gaps[s] = 100.0 * (v / bv - 1.0)
                rp, bp = done[s]["eval"][-1].get("val_pack_losses"), b["eval"][-1].get("val_pack_losses")
                if rp and bp and len(rp) == len(bp) and len(rp) > 1:
                    gap_se.append(stats.paired_gap_se_pct(rp, bp))
        sems = [l["eval"][-1]["val_loss_sem"] for l in done.values()
                if isinstance(l["eval"][-1].get("val_loss_sem"), float) and math.isfinite(l["eval"][-1]["val_loss_sem"])]
        summaries = [summarize(f"{recipe}-seed{s}", l) for s, l in done.items()]
        row.update({
            "gaps": gaps,
            "interval": stats.t_interval(list(gaps.values())) if gaps else None,
            "verdict": stats.verdict(list(gaps.values())) if recipe != "bf16" else "reference",
            "gap_se_max": max(gap_se) if gap_se else None,
            "loss_sem_mean": statistics.fmean(sems) if sems else None,
            "tokens": summaries[0]["tokens"] if summaries else 0,
            "tok_per_s": statistics.fmean(r["tok_per_s"] for r in summaries) if summaries else math.nan,
            "max_logit_peak": max((r["max_logit_peak"] for r in summaries), default=math.nan),
            "o_err_mean": statistics.fmean(r["o_err_mean"] for r in summaries)
            if summaries and all(r["o_err_mean"] is not None for r in summaries) else None,
            "skipped": sum(r["skipped"] for r in summaries),
            "spikes": sum(r["spikes"] for r in summaries),
            "config": next(iter(done.values()))["config"][0] if done else {},
        })
        rows.append(row)
    return rows, notes


def seeds_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| recipe | seeds | held-out loss (mean ± std) | gap vs bf16 (mean, 95 % interval) | verdict "
        f"| per-seed gaps | paired std of the gap (seeds for ±{stats.TOLERANCE_PCT:g} %) "
        "| eval. noise: SE of held-out mean / of a seed's gap | tokens/s (vs bf16) | max logit (peak) "
        "| O rel. err vs bf16 | instabilities |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    for r in rows:
        loss = "–" if r["loss"] is None else f"{r['loss'][0]:.4f} ± {fmt(r['loss'][1], '.4f')}"
        iv = r["interval"]
        if iv is None:
            gap = "–"
        elif iv.n < 2:
            gap = f"{iv.mean:+.2f} % (one seed, no interval)"
        else:
            gap = f"{iv.mean:+.2f} % [{iv.lo:+.2f}, {iv.hi:+.2f}]"
        per_seed = ", ".join(f"{g:+.2f}" for g in r["gaps"].values()) or "–"
        noise = f"{fmt(r['loss_sem_mean'], '.4f')} / " + (f"{r['gap_se_max']:.3f} %" if r["gap_se_max"] is not None else "–")
        spread = "–"
        if iv is not None and iv.n >= 2:
            need = stats.seeds_for_half_width(iv.std)
            spread = f"{iv.std:.2f} % ({need if need is not None else '> ' + str(stats.MAX_SEEDS_ESTIMATE)})"
        speed = f"{fmt(r['tok_per_s'] / 1e3, '.0f')}k"
        if base is not None and r is not base:
            speed += f" ({fmt(r['tok_per_s'] / base['tok_per_s'], '.2f')}×)"
        lines.append(
            f"| {r['recipe']} | {len(r['seeds'])} | {loss} | {gap} | {r['verdict']} | {per_seed} | {spread} | {noise} | "
            f"{speed} | "
            f"{fmt(r['max_logit_peak'], '.1f')} | {fmt(r['o_err_mean'], '.4f')} | "
            f"{r['skipped']} non-finite, {r['spikes']} spikes |")
    return "\n".join(lines)


def band(series: list[list[float]], kind: str) -> tuple[list[float], list[float], list[float]]:
    """Per position over seeds: mean and the band (min-max, or mean +- std)."""
    mean, lo, hi = [], [], []
    for col in zip(*series):
        m = statistics.fmean(col)
        if kind == "std" and len(col) > 1:
            sd = statistics.stdev(col)
            lo.append(m - sd)
            hi.append(m + sd)
        else:
            lo.append(min(col))
            hi.append(max(col))
        mean.append(m)
    return mean, lo, hi


def finished_runs(runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]]
                  ) -> dict[str, dict[int, dict[str, list[dict[str, Any]]]]]:
    """The finished runs of each recipe (the curves show what the tables count)."""
    out = {}
    for recipe, by_seed in runs.items():
        done = {s: l for s, l in by_seed.items() if counted(l)}
        if done:
            out[recipe] = done
    return out


def plot_seeds(runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]], title: str, kind: str,
               path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bf16": "black", "fp8": "tab:red", "fp8_mixed": "tab:blue",
              "per_token_fp8": "tab:green", "per_tensor_fp8": "tab:purple"}
    fig, (a_ev, a_gap, a_lg) = plt.subplots(1, 3, figsize=(18, 5))
    runs = finished_runs(runs)
    base = {s: {r["step"]: r["val_loss"] for r in l["eval"]} for s, l in runs.get("bf16", {}).items()}
    for recipe, by_seed in runs.items():
        c = colors.get(recipe)
        logs = list(by_seed.values())
        n = min(len(l["eval"]) for l in logs)  # common prefix of evaluations
        if n:
            x = [r["tokens"] / 1e6 for r in logs[0]["eval"][:n]]
            m, lo, hi = band([[r["val_loss"] for r in l["eval"][:n]] for l in logs], kind)
            a_ev.plot(x, m, color=c, label=f"{recipe} ({len(logs)} seeds)")
            a_ev.fill_between(x, lo, hi, color=c, alpha=0.2)
        if recipe != "bf16":
            series = []
            for s, l in by_seed.items():
                b = base.get(s, {})
                series.append([(r["tokens"] / 1e6, 100 * (r["val_loss"] / b[r["step"]] - 1))
                               for r in l["eval"] if r["step"] in b and r["step"] > 0])
            k = min((len(p) for p in series), default=0)
            if k:
                m, lo, hi = band([[g for _, g in p[:k]] for p in series], kind)
                x = [t for t, _ in series[0][:k]]
                a_gap.plot(x, m, "o-", ms=3, color=c, label=recipe)
                a_gap.fill_between(x, lo, hi, color=c, alpha=0.2)
        k = min(len(l["diag"]) for l in logs)
        if k:
            m, lo, hi = band([[max(r["max_logit"]) for r in l["diag"][:k]] for l in logs], kind)
            x = [r["step"] for r in logs[0]["diag"][:k]]
            a_lg.plot(x, m, "o-", ms=3, color=c, label=recipe)
            a_lg.fill_between(x, lo, hi, color=c, alpha=0.2)
    what = "mean ± std" if kind == "std" else "mean, min–max"
    a_ev.set(title=f"held-out loss ({what} over seeds)", xlabel="tokens (M)", ylabel="nats / byte")
    a_gap.set(title=f"paired gap to bf16 ({what} over seeds)", xlabel="tokens (M)", ylabel="%")
    a_gap.axhline(0, color="black", lw=0.8)
    for y in (-stats.TOLERANCE_PCT, stats.TOLERANCE_PCT):
        a_gap.axhline(y, color="gray", lw=0.8, ls="--")
    a_lg.set(title="largest attention logit (max over layers)", xlabel="step")
    # Past the first evaluations, so the recipes' differences are visible.
    vals = [float(y) for ln in a_ev.get_lines() for y in ln.get_ydata()[len(ln.get_ydata()) // 5:]]
    if vals:
        lo_, hi_ = min(vals), max(vals)
        a_ev.set_ylim(lo_ - 0.1 * (hi_ - lo_) - 1e-3, hi_ + 0.1 * (hi_ - lo_) + 1e-3)
    for a in (a_ev, a_gap, a_lg):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seeds_block(sweeps: dict[str, dict[str, dict[int, dict[str, list[dict[str, Any]]]]]],
                avg_last: int, band_kind: str, png_dir: Optional[Path], md_dir: Path) -> str:
    parts = [
        f"Held-out loss per run: the mean of its last {avg_last} evaluation(s) (the steps are named under "
        "each table), each over the evaluation packs named below. Gap: per seed, 100·(recipe/bf16 − 1) with the same seed (same initial weights, "
        "same training packs); its mean with a 95 % Student t interval over the paired seeds. Verdict: "
        f"\"within {stats.TOLERANCE_PCT:g} %\" only if the whole interval lies inside "
        f"±{stats.TOLERANCE_PCT:g} %, \"worse than {stats.TOLERANCE_PCT:g} %\" if it lies above, "
        "otherwise how many paired seeds would decide it if the mean and spread stayed as measured (very many when "
        "the mean lies close to ±1 %). Evaluation noise: the standard error "
        "of a run's held-out mean over its packs (nats, mean over seeds) and of one seed's gap from the "
        "per-pack differences (%, largest seed), both at the last evaluation. Paired std: the sample standard "
        f"deviation of the per-seed gaps, and how many paired seeds a 95 % interval of ±{stats.TOLERANCE_PCT:g} % "
        "would need at that spread. Tokens/s: median over a run's training steps after the first 10, mean over "
        "seeds.",
        "",
    ]
    verdicts = []
    pooled: dict[str, dict[str, list[tuple[str, list[float]]]]] = {}  # family -> recipe -> [(setting, gaps)]
    for setting, runs in sorted(sweeps.items()):
        rows, notes = seed_rows(runs, avg_last)
        cfg = next((r["config"] for r in rows if r["config"]), {})
        corp, model = cfg.get("corpus", {}), cfg.get("model", {})
        corpus, hd = corp.get("name", "?"), model.get("head_dim", "?")
        ev_packs = next((l["eval"][-1].get("val_packs") for by in runs.values() for l in by.values() if l["eval"]), None)
        pk = ", ".join(corp.get("packages") or corp.get("sources") or [])
        parts += [
            f"#### `{setting}`: corpus `{corpus}`, head dim {hd}",
            "",
            f"Corpus packages: {pk or '–'} ({fmt(corp.get('train_tokens', math.nan) / 1e6, '.1f')} M training "
            f"tokens). Model: {fmt((cfg.get('params') or math.nan) / 1e6, '.1f')} M parameters, "
            f"{model.get('n_heads', '?')} query / {model.get('n_kv_heads', '?')} key-value heads of {hd}. "
            f"{rows[0]['tokens'] / 1e6:.1f} M tokens per run; evaluation over {ev_packs} held-out packs of "
            f"{cfg.get('tokens_per_step', '?')} tokens. Device: {cfg.get('device', '?')}.",
            "",
            seeds_table(rows),
            "",
        ]
        if png_dir is not None:
            png = png_dir / f"seeds_{setting}.png"
            plot_seeds(runs, f"{setting}: corpus {corpus}, head dim {hd}", band_kind, png)
            parts += [f"![curves over seeds, {setting}]({Path(os.path.relpath(png, md_dir)).as_posix()})", ""]
        averaged = sorted({final_loss(l, avg_last)[1] for by in runs.values() for l in by.values() if l["eval"]})
        parts += ["Evaluations averaged, steps: " + "; ".join(", ".join(map(str, st)) for st in averaged) + ".", ""]
        if notes:
            parts += ["Left out: " + "; ".join(notes) + ".", ""]
        for r in rows:
            if r["recipe"] != "bf16":
                iv = r["interval"]
                where = f"{iv.mean:+.2f} % [{iv.lo:+.2f}, {iv.hi:+.2f}] over {iv.n} paired seeds" \
                    if iv is not None and iv.n >= 2 else "no interval yet"
                verdicts.append(f"- `{r['recipe']}`, `{setting}` (corpus `{corpus}`, head dim {hd}, "
                                f"{r['tokens'] / 1e6:.1f} M tokens): {where} — **{r['verdict']}**.")
                if r["gaps"]:
                    pooled.setdefault(setting_family(setting), {}).setdefault(r["recipe"], []).append(
                        (setting, list(r["gaps"].values())))
    parts += ["Verdicts against \"within 1 % of BF16\":", ""] + verdicts + [""]
    parts += pooled_block(pooled)
    return "\n".join(parts)


def setting_family(setting: str) -> str:
    """The part of a setting folder's name after corpus and head dim (run_all.sh's TAG, e.g.
    '8M-lr6e-4'): settings of one family share the budget and the learning rate."""
    m = re.match(r"^.+?-hd\d+(?:-(.+))?$", setting)
    return (m.group(1) or "") if m else setting


def pooled_block(pooled: dict[str, dict[str, list[tuple[str, list[float]]]]]) -> list[str]:
    """Per family of settings and recipe, the paired gaps of all its settings taken together:
    one reading across corpora and head dims, assuming one gap common to them (the per-setting
    tables above say whether the settings disagree)."""
    lines = []
    for family in sorted(pooled):
        for recipe, per_setting in sorted(pooled[family].items()):
            if len(per_setting) < 2:
                continue
            gaps = [g for _, gs in per_setting for g in gs]
            iv = stats.t_interval(gaps)
            names = ", ".join(f"`{s}`" for s, _ in per_setting)
            lines.append(f"- `{recipe}` over {names}: {iv.mean:+.2f} % [{iv.lo:+.2f}, {iv.hi:+.2f}] over {iv.n} "
                         f"paired seeds — two-sided: **{stats.verdict(gaps)}**; one-sided: "
                         f"**{stats.upper_end_reading(gaps)}**.")
    if not lines:
        return []
    return [f"Pooled over the settings of one budget and learning rate (every paired seed of every corpus and "
            f"head dim as one sample of the gap; the one-sided reading asks only whether the recipe is worse "
            f"than bf16 by more than {stats.TOLERANCE_PCT:g} %, from the upper end of the 95 % interval):", ""] + \
        lines + [""]


def write_block(md: str, begin: str, end: str, body: Optional[str], heading: str) -> str:
    """Replace the text between the markers with body. body None: keep what is there (the
    markers with a placeholder are added if missing)."""
    if begin in md and end in md:
        if body is None:
            return md
        return md[:md.index(begin)] + begin + "\n\n" + body.strip("\n") + "\n\n" + end + md[md.index(end) + len(end):]
    text = body if body is not None else "No results yet."
    return md.rstrip() + f"\n\n## {heading}\n\n{begin}\n\n{text.strip()}\n\n{end}\n"


def single_runs_block(logs: dict[str, dict[str, list[dict[str, Any]]]], rows: list[dict[str, Any]],
                      png: Optional[Path], md_dir: Path) -> str:
    if png is not None:
        plot(logs, png)
    dev = rows[0]["device"]
    parts = [
        f"Runs on {dev}; {rows[0]['params'] / 1e6:.1f}M parameters; BF16 attention path: "
        f"`{rows[0]['bf16_backend']}`. Held-out loss is in nats per byte at the last evaluation; "
        "the gap is relative to bf16 at the same step. Tokens/s is the median over training steps "
        "(evaluation excluded). Max logit = largest |q·k|·softmax_scale on a held-out sample. "
        "O error: relative L2 of the recipe's attention output against BF16 attention on the same "
        f"q/k/v, at the last diagnostic. Spikes: steps whose loss exceeds {SPIKE_FACTOR}× the median "
        f"of the previous {SPIKE_WINDOW}.",
        "",
        training_table(rows),
        "",
    ]
    if png is not None:
        parts += [f"![loss curves]({Path(os.path.relpath(png, md_dir)).as_posix()})", ""]
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    if base and base["bf16_err_mean"] is None:
        fp = [r for r in rows if r["bf16_err_mean"] is not None]
        if fp:
            parts += [f"For scale: BF16 attention itself is {fp[0]['bf16_err_mean']:.4f} (mean over layers) "
                      "from fp32 attention on the same inputs.", ""]
    return "\n".join(parts)


def probe_block(probe: dict[str, Any]) -> str:
    return "\n".join([
        "### Leakage probe", "", f"Device: {probe.get('device')}. Task: K = {probe['task']['K']} "
        f"secrets, sequences of {probe['task']['S']} tokens; per-tensor scales are per "
        f"({probe['args'].get('scale_scope', 'sequence')}, head). Future influence: fraction of "
        "held-out sequences whose logits at the MARK position change at all when only the future "
        "copy changes (must be 0 for a causally safe scheme).", "", probe_table(probe), ""])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    ap.add_argument("--runs", nargs="+", default=None, help="single-run names (default: the recipes present)")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "training" / "loss_curves.png",
                    help="single-run curves; the seed sweeps' curves go beside it")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "TRAINING.md")
    ap.add_argument("--avg-last", type=int, default=1,
                    help="seed sweeps: average each run's last K evaluations (default 1: the final one)")
    ap.add_argument("--band", choices=("minmax", "std"), default="minmax", help="seed sweeps: band over seeds")
    ap.add_argument("--no-plots", action="store_true", help="write the tables only")
    args = ap.parse_args(argv)
    if args.avg_last < 1:
        ap.error(f"--avg-last must be >= 1, got {args.avg_last}")

    md_dir = args.md.parent
    md = args.md.read_text() if args.md.exists() else "# Training validation\n"
    written: list[str] = []

    sweeps = discover_seed_runs(args.runs_dir) if args.runs_dir.is_dir() else {}
    seeds_body = None
    if sweeps:
        seeds_body = seeds_block(sweeps, args.avg_last, args.band, None if args.no_plots else args.png.parent, md_dir)
        written.append(f"seed statistics for {len(sweeps)} setting(s)")
    elif SEEDS_BEGIN not in md:
        seeds_body = NO_SEED_RUNS
    md = write_block(md, SEEDS_BEGIN, SEEDS_END, seeds_body, "Results over seeds")

    names = args.runs or [n for n in PREFERRED if (args.runs_dir / n / "log.jsonl").exists()]
    logs = {n: read_log(args.runs_dir / n / "log.jsonl") for n in names
            if (args.runs_dir / n / "log.jsonl").exists()}
    rows = [summarize(n, l) for n, l in logs.items() if l["train"]]
    if rows:
        md = write_block(md, BEGIN, END, single_runs_block(logs, rows, None if args.no_plots else args.png, md_dir),
                         "Results")
        written.append(f"{len(rows)} single run(s)")

    probe_path = args.runs_dir / "leakage_probe.json"
    if probe_path.exists():
        md = write_block(md, PROBE_BEGIN, PROBE_END, probe_block(json.loads(probe_path.read_text())), "Leakage probe results")
        written.append("leakage probe")

    args.md.write_text(md)
    print(f"wrote {args.md}: " + (", ".join(written) if written else "no results found, blocks left as they were"),
          flush=True)
    for r in rows:
        print(f"  {r['run']:<15} held-out {r['val_loss']:.4f}  {r['tok_per_s'] / 1e3:.0f}k tok/s  "
              f"max logit {r['max_logit_final']:.1f}  O err {fmt(r['o_err_max'], '.4f')}", flush=True)
    for setting, runs in sorted(sweeps.items()):
        for r in seed_rows(runs, args.avg_last)[0]:
            iv = r["interval"]
            gap = f"gap {iv.mean:+.2f} % [{iv.lo:+.2f}, {iv.hi:+.2f}]" if iv is not None and iv.n >= 2 else ""
            print(f"  {setting} {r['recipe']:<15} {len(r['seeds'])} seeds  "
                  f"held-out {fmt(r['loss'][0] if r['loss'] else None, '.4f')}  {gap}  {r['verdict']}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
