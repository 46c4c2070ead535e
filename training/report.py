#!/usr/bin/env python3
"""Summarize the training runs and the leakage probe.

Reads training/runs/<run>/log.jsonl (from train.py) and training/runs/leakage_probe.json
(from leakage_probe.py); writes docs/training/loss_curves.png and regenerates the results
section of docs/TRAINING.md (between the BEGIN/END GENERATED markers; the rest of the
file is left as written).

    python training/report.py [--runs bf16 fp8 fp8_mixed]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEGIN = "<!-- BEGIN GENERATED RESULTS (training/report.py) -->"
END = "<!-- END GENERATED RESULTS -->"
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


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    ap.add_argument("--runs", nargs="+", default=None, help="run names (default: the recipes present)")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "training" / "loss_curves.png")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "TRAINING.md")
    args = ap.parse_args(argv)

    names = args.runs or [n for n in PREFERRED if (args.runs_dir / n / "log.jsonl").exists()]
    logs = {n: read_log(args.runs_dir / n / "log.jsonl") for n in names
            if (args.runs_dir / n / "log.jsonl").exists()}
    rows = [summarize(n, l) for n, l in logs.items() if l["train"]]
    probe_path = args.runs_dir / "leakage_probe.json"
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else None

    parts = [BEGIN, ""]
    if rows:
        plot(logs, args.png)
        dev = rows[0]["device"]
        parts += [
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
            f"![loss curves]({args.png.relative_to(args.md.parent).as_posix()})",
            "",
        ]
        base = next((r for r in rows if r["recipe"] == "bf16"), None)
        if base and base["bf16_err_mean"] is None:
            fp = [r for r in rows if r["bf16_err_mean"] is not None]
            if fp:
                parts += [f"For scale: BF16 attention itself is {fp[0]['bf16_err_mean']:.4f} (mean over layers) "
                          "from fp32 attention on the same inputs.", ""]
    else:
        parts += ["No training logs found yet (run `training/run_all.sh`).", ""]
    if probe:
        parts += ["### Leakage probe", "", f"Device: {probe.get('device')}. Task: K = {probe['task']['K']} "
                  f"secrets, sequences of {probe['task']['S']} tokens; per-tensor scales are per "
                  f"({probe['args'].get('scale_scope', 'sequence')}, head). Future influence: fraction of "
                  "held-out sequences whose logits at the MARK position change at all when only the future "
                  "copy changes (must be 0 for a causally safe scheme).", "", probe_table(probe), ""]
    parts.append(END)
    block = "\n".join(parts)

    md = args.md.read_text() if args.md.exists() else "# Training validation\n\n"
    if BEGIN in md and END in md:
        md = md[:md.index(BEGIN)] + block + md[md.index(END) + len(END):]
    else:
        md = md.rstrip() + "\n\n## Results\n\n" + block + "\n"
    args.md.write_text(md)
    print(f"wrote {args.md}" + (f" and {args.png}" if rows else ""), flush=True)
    for r in rows:
        print(f"  {r['run']:<15} held-out {r['val_loss']:.4f}  {r['tok_per_s'] / 1e3:.0f}k tok/s  "
              f"max logit {r['max_logit_final']:.1f}  O err {fmt(r['o_err_max'], '.4f')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
