#!/usr/bin/env python3
"""Compares flamia_bench runs of several source trees timed in alternation (tools/ab_bench.sh,
tools/ab_sustained.sh).

    python3 tools/ab_summary.py OUT/bench_m_round1.json OUT/bench_v_round1.json ... \
        [--phases fwd,bwd,step] [--bundle runs.json --what "m = main, v = branch ..."]

Each file is named bench_<tree>_round<k>.json. Per workload, recipe and phase it prints every
tree's times over the rounds, their median, and the median's change against the first tree
named on the command line (the reference), marked where every round of the tree lies below
(or above) every round of the reference. The files are flamia_bench's JSON or the Python
harness's bench.json (`python -m flamia.bench`, its flamia records), whose --sustained steps
are the phases "sustained" and "sustained_fwd" (the mean step and forward run back to back,
at the power cap's clock). --bundle writes all runs into one JSON
({"what": ..., "runs": {"<tree>_round<k>": <flamia_bench JSON>}}), the form kept under
docs/bench/runs/. Standard library only.
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Tuple

NAME = re.compile(r"^bench_(?P<tree>[A-Za-z0-9_.-]+?)_round(?P<round>\d+)\.json$")
Runs = Dict[str, Dict[int, dict]]  # tree -> round -> flamia_bench JSON


def load(paths: List[Path]) -> Tuple[List[str], Runs]:
    """The trees in the order first named, and every run by tree and round."""
    order: List[str] = []
    runs: Runs = {}
    for p in paths:
        m = NAME.match(p.name)
        if m is None:
            raise ValueError(f"{p}: expected a name bench_<tree>_round<k>.json")
        tree, rnd = m.group("tree"), int(m.group("round"))
        if tree not in runs:
            order.append(tree)
            runs[tree] = {}
        if rnd in runs[tree]:
            raise ValueError(f"{p}: round {rnd} of tree {tree} given twice")
        runs[tree][rnd] = json.loads(p.read_text())
    return order, runs


def phase_ms(rec: dict, phase: str):
    """A record's time for the phase: flamia_bench keeps them under "ms"; the Python harness
    as <phase>_ms, its sustained step under "sustained", and records of other implementations."""
    if "impl" not in rec:
        return rec.get("ms", {}).get(phase)
    if rec["impl"] != "flamia":
        return None
    if phase == "sustained":
        return (rec.get("sustained") or {}).get("step_ms")
    if phase == "sustained_fwd":
        return ((rec.get("sustained") or {}).get("fwd") or {}).get("ms")
    return rec.get(f"{phase}_ms")


def times(runs: Runs, tree: str, phase: str) -> Dict[Tuple[str, str], List[float]]:
    """(workload, recipe) -> the phase's ms over the tree's rounds, in round order."""
    out: Dict[Tuple[str, str], List[float]] = {}
    for rnd in sorted(runs[tree]):
        for rec in runs[tree][rnd].get("records", []):
            ms = phase_ms(rec, phase)
            if isinstance(ms, (int, float)):
                out.setdefault((rec["workload"], rec["recipe"]), []).append(float(ms))
    return out


def apart(xs: List[float], ref: List[float]) -> str:
    """Whether every round of a tree lies below (or above) every round of the reference: with
    rounds alternated in one job, the plainest sign that a change of a percent or two is not
    the spread between rounds."""
    if len(xs) > 1 and len(ref) > 1:
        if max(xs) < min(ref):
            return " (every round below)"
        if min(xs) > max(ref):
            return " (every round above)"
    return ""


def table(order: List[str], runs: Runs, phases: List[str]) -> str:
    ref = order[0]
    head = ["workload", "recipe", "phase"] + [f"{t} ms" for t in order] + [f"{t} vs {ref}" for t in order[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for phase in phases:
        per_tree = {t: times(runs, t, phase) for t in order}
        keys = [k for k in per_tree[ref] if all(k in per_tree[t] for t in order)]
        for key in keys:
            med = {t: statistics.median(per_tree[t][key]) for t in order}
            cells = [key[0], key[1], phase]
            cells += [" / ".join(f"{x:.3f}" for x in per_tree[t][key]) + f" (median {med[t]:.3f})" for t in order]
            cells += [f"{100.0 * (med[t] / med[ref] - 1.0):+.1f} %" + apart(per_tree[t][key], per_tree[ref][key])
                      for t in order[1:]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bundle(order: List[str], runs: Runs, what: str) -> dict:
    return {"what": what, "runs": {f"{t}_round{r}": runs[t][r] for t in order for r in sorted(runs[t])}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--phases", default="fwd,bwd,step", help="comma-separated: quant, fwd, fwdq (the quantizing forward; flamia_bench "
                                                        "only), bwd, step, sustained, sustained_fwd (the "
                                                        "Python harness's --sustained steps and forwards)")
    ap.add_argument("--bundle", type=Path, help="write every run into this one JSON")
    ap.add_argument("--what", default="", help="the bundle's description of the trees")
    args = ap.parse_args(argv)
    try:
        order, runs = load(args.files)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"ab_summary: {e}", file=sys.stderr)
        return 2
    print(table(order, runs, [p for p in args.phases.split(",") if p]))
    if args.bundle:
        args.bundle.write_text(json.dumps(bundle(order, runs, args.what), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
