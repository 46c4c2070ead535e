#!/usr/bin/env bash
# Fails when ptxas reports that it serialized wgmma (C7510, C7513, C7515, C7517, C7519, ...:
# accumulator or fragment registers touched while an MMA is in flight, or defined by other
# instructions inside a pipeline stage) or ignored setmaxnreg (C7508): any C75xx report.
# These are silent performance cliffs: the kernels stay correct, so no other test sees them.
#   tools/check_ptxas.sh [nvcc]
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${1:-nvcc}
status=0
for f in $(find src/sm90 src/quantize -name "*.cu" | sort); do
  log=$("$NVCC" -std=c++17 -cubin -o /dev/null -gencode=arch=compute_90a,code=sm_90a \
        --expt-relaxed-constexpr -Xptxas -v -I include -I src "$f" 2>&1) || { echo "$log"; exit 1; }
  if grep -E "C75[0-9][0-9]" <<<"$log"; then
    echo "ptxas: serialization or ignored setmaxnreg in $f"
    status=1
  fi
done
[ $status -eq 0 ] && echo "ptxas: no wgmma serialization or setmaxnreg warnings"
exit $status
