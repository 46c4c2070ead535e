#!/usr/bin/env bash
# The quantizer alone (tools/quant_probe.cu, prebuilt in .ab/beside from branch quant-beside):
# the plain quantizer on every SM against the beside one (v137) on G SMs, in the forward's
# order and in the plain one, for fixed-4k's shape, pack-128k's token count and llama1b-pack's
# (head dim 64). Carried: .ab/beside.
set -uo pipefail
: "${OUT:?}"
H=.ab/beside/prebuilt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a $OUT/gpu.txt; cat $H/COMMIT | tee -a $OUT/gpu.txt
{
  timeout 60 $H/flamia_quant_probe --docs 8 --len 4096 --hq 16 --hkv 16 --d 128
  timeout 60 $H/flamia_quant_probe --docs 32 --len 4096 --hq 16 --hkv 16 --d 128
  timeout 60 $H/flamia_quant_probe --docs 16 --len 4096 --hq 32 --hkv 8 --d 64
} 2>&1 | tee $OUT/quant_probe.txt
