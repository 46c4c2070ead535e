#!/usr/bin/env bash
# One call for both records: the harness (job.sh here, at most 220 s), then the attention
# share with its memory (../2026-12-06_share_memory/job.sh) in what is left of 560 s, each
# share run up to 90 s. Carried: .ab/main, .ab/data, .whl.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
DEADLINE=220 bash docs/bench/runs/2026-12-06_main_harness/job.sh
left=$(( 560 - 90 - ($(date +%s) - T0) ))
echo "share budget ${left} s"
(( left > 60 )) && DEADLINE=$left bash docs/bench/runs/2026-12-06_share_memory/job.sh
echo "both done after $(( $(date +%s) - T0 )) s"
