#!/usr/bin/env python3
"""From an A/A bundle of tools/ab_bench.sh (two trees, rotated rounds: tree k runs first in
round r when (r - 1) % 2 == k), per workload, recipe and phase: each round's second run
against its first, and their median (the position effect between processes)."""
import json
import re
import statistics
import sys

runs = json.load(open(sys.argv[1]))["runs"]
trees = sorted({re.match(r"(.+)_round\d+$", k).group(1) for k in runs})
rounds = sorted({int(k.rsplit("round", 1)[1]) for k in runs})
assert len(trees) == 2, trees
first_of = lambda r: trees[(r - 1) % 2]
second_of = lambda r: trees[r % 2]
keys = [(w["workload"], w["recipe"]) for w in runs[f"{trees[0]}_round1"]["records"]]
print("| workload | recipe | phase | second vs first, by round | median |")
print("|---|---|---|---|---|")
for wl, rc in keys:
    for ph in ("fwd", "bwd", "step"):
        d = []
        for r in rounds:
            a, b = runs.get(f"{first_of(r)}_round{r}"), runs.get(f"{second_of(r)}_round{r}")
            if a is None or b is None:
                continue
            pick = lambda run: next(x for x in run["records"] if (x["workload"], x["recipe"]) == (wl, rc))["ms"][ph]
            d.append(100.0 * (pick(b) / pick(a) - 1.0))
        if d:
            print(f"| {wl} | {rc} | {ph} | {' / '.join(f'{x:+.1f}' for x in d)} % | {statistics.median(d):+.2f} % |")
