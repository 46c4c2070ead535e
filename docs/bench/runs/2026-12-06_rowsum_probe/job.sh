#!/usr/bin/env bash
# The row-sum probes (branch probe-rowsum: pra = 70a1c2d, prb = a6796a4; their changes to src/ kept
# here as probe_a.diff, against main, and probe_b_on_a.diff) against main's
# kernels (.ab/main, 04466f5's tree: the same source), the filled forward only.
# Trees: tools/make_trees.sh pra=probe-rowsum~1 prb=probe-rowsum, each built for
# libflamia.so and flamia_bench only into .ab/NAME/prebuilt (with COMMIT).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/pra/prebuilt/COMMIT .ab/prb/prebuilt/COMMIT
mkdir -p $OUT/ab
OUT=$OUT/ab WORKLOADS=fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack RECIPES=fp8 ROUNDS=3 PHASES=fwd \
  timeout 300 bash tools/ab_bench.sh .ab/main .ab/pra .ab/prb 2>&1 | tail -8
rm -f $OUT/ab/bench_* $OUT/ab/ab_rounds.tar.gz
