#!/usr/bin/env bash
# On an H200: the harness once on main's kernels (the README's H200 table is from v102e's),
# seven workloads, flamia and its baselines in one process. On either card: where the
# fp8_mixed D = 128 dK/dV pass waits, main against v124 (ncu source counters with stall
# reasons, one fixed-16k launch each; tools/stall_summary.py), to test v124's reading.
# Carried: .ab/main, .ab/v124 (tools/prebuild_trees.sh trees), .whl (the cuDNN frontend wheel).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
date -u +%Y-%m-%dT%H:%M:%SZ; cat .ab/main/prebuilt/COMMIT .ab/v124/prebuilt/COMMIT
for t in main v124; do
  echo "==== ncu source counters: dkdv_kernel, fixed-16k fp8_mixed, $t"
  timeout 150 ncu --clock-control none -k "regex:dkdv_kernel" -c 1 --section WarpStateStats --section SourceCounters \
    --section InstructionStats -f -o $OUT/src_$t .ab/$t/prebuilt/flamia_bench --workloads fixed-16k \
    --recipes fp8_mixed --iters 1 --warmup 0 > $OUT/ncu_$t.log 2>&1 || { tail -5 $OUT/ncu_$t.log; continue; }
  ncu -i $OUT/src_$t.ncu-rep --page source --csv --print-source sass > /tmp/sass_$t.csv 2>/dev/null
  python3 tools/stall_summary.py /tmp/sass_$t.csv --regions > $OUT/stalls_$t.txt
  xz -9 -c /tmp/sass_$t.csv > $OUT/sass_$t.csv.xz
  rm -f $OUT/src_$t.ncu-rep $OUT/ncu_$t.log
  head -40 $OUT/stalls_$t.txt
  echo "ncu $t done at $(( $(date +%s) - T0 )) s"
done
[[ $gpu == *H200* ]] || exit 0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLAMIA_LIBRARY=$PWD/.ab/main/prebuilt/libflamia.so PYTHONPATH=$PWD/.ab/main/python:/tmp/site
echo "==== harness (main)"
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m flamia.bench --quick \
  --workloads fixed-4k,fixed-8k,fixed-16k,pack-32k,pack-128k,llama8b-pack,llama1b-pack \
  --out $OUT/h1 > $OUT/harness_console.txt 2>&1
echo "harness exit $? at $(( $(date +%s) - T0 )) s"
rm -f $OUT/h1/*.png
tail -40 $OUT/harness_console.txt
