#!/usr/bin/env bash
# GPU fuzzer (tests/fuzz/fuzz_gpu.cpp) at scale, then a small subset under
# compute-sanitizer memcheck. Needs a build with flamia_fuzz (cmake --build B --target flamia_fuzz).
#
#   bash tools/fuzz_gpu.sh [CASES [SECONDS [SEED]]]      defaults: 2000 cases, 600 s, seed 1
#
# Environment: BUILD_DIR (default build-gpu), OUT (log folder, default ./out),
# SANITIZER_CASES (default 40; 0 skips memcheck), SANITIZER_TIMEOUT (default 300 s),
# RACE_CASES (default 0: racecheck and synccheck of that many small cases; both tools are
# ~100x slower than memcheck, so a few cases cover every kernel's barriers).
# Every failure prints its case seed; replay one with
#   BUILD_DIR/flamia_fuzz --replay 0x... [--small]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-./out}
CASES=${1:-2000}
SECONDS_BUDGET=${2:-600}
SEED=${3:-1}
SANITIZER_CASES=${SANITIZER_CASES:-40}
mkdir -p "$OUT"
FUZZ=$BUILD_DIR/flamia_fuzz
[ -x "$FUZZ" ] || { echo "fuzz_gpu: $FUZZ not built (cmake --build $BUILD_DIR --target flamia_fuzz)"; exit 2; }

failed=0
"$FUZZ" --cases "$CASES" --seconds "$SECONDS_BUDGET" --seed "$SEED" 2>&1 | tee "$OUT/fuzz.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || failed=1

if [ "$SANITIZER_CASES" -gt 0 ]; then
  SANITIZER=$(command -v compute-sanitizer 2>/dev/null || true)
  [ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer
  if [ -z "$SANITIZER" ]; then
    echo "fuzz_gpu: compute-sanitizer not found, memcheck subset skipped"
  else
    timeout "${SANITIZER_TIMEOUT:-300}" "$SANITIZER" --tool memcheck --error-exitcode 1 \
      "$FUZZ" --small --cases "$SANITIZER_CASES" --seed "$SEED" 2>&1 | tee "$OUT/fuzz_memcheck.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    grep -E "ERROR SUMMARY" "$OUT/fuzz_memcheck.log" || true
    for tool in racecheck synccheck; do
      [ "${RACE_CASES:-0}" -gt 0 ] || break
      timeout "${SANITIZER_TIMEOUT:-300}" "$SANITIZER" --tool $tool --error-exitcode 1 \
        "$FUZZ" --small --cases "$RACE_CASES" --seed "$SEED" >"$OUT/fuzz_$tool.log" 2>&1
      [ $? -eq 0 ] || failed=1
      echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/fuzz_$tool.log" | tail -1)"
    done
  fi
fi
[ $failed -eq 0 ] && echo "fuzz_gpu: PASSED" || echo "fuzz_gpu: FAILED"
exit $failed
