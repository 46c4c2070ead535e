#!/usr/bin/env bash
# The harness in turn at 20 rounds on main's tree (.ab/main; docs/bench/runs/2026-12-07_rounds/job12.sh),
# only on an H200 (the H100's in-turn runs exist: docs/bench/runs/2026-12-07_rounds). Carried: .ab/main, .whl.
set -uo pipefail
: "${OUT:?}"
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; exit 0; }
TREE=main ITERS=20 DEADLINE=${LIMIT:-570} bash docs/bench/runs/2026-12-07_rounds/job12.sh
