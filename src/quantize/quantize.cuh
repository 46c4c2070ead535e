// Internal entry points of the fused per-token quantizer (quantize.cu). sm90::quantize_qkv
// (declared in sm90/sm90.h) quantizes q, k, v; the backward quantizes dO here.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "quantize/layout.cuh"
#include "sm90/sm90.h"

namespace flamia {
namespace quant {

// dO -> natural FP8 codes and scales, its transposed copy (FP8 for fp8, BF16 for fp8_mixed),
// D = rowsum(float(dO) * float(O)) (FP32) and lse2 = lse * log2(e) (NaN for a non-finite dO
// row), into the backward workspace. out uses dout's token/head strides. Block 0 validates
// cu_seqlens and compares qkv8's fingerprint into the workspace's status word (guard.cuh).
cudaError_t quantize_dout(const sm90::Params& p, const void* dout, int64_t stride_t,
                          int64_t stride_h, const void* out, const float* lse, const uint8_t* qkv8,
                          const Qkv8Layout& qkv8_layout, uint8_t* workspace,
                          const BwdWorkspaceLayout& layout);

// Recipe fp8: Qᵀ and Kᵀ (FP8, [H][D][Tpad], fragment order) into the workspace, transposed
// from qkv8's q8 and k8 (layout.cuh). Clamps to cu_seqlens' extents whatever its values.
cudaError_t transpose_qk_codes(const sm90::Params& p, const uint8_t* qkv8, const Qkv8Layout& qkv8_layout,
                               uint8_t* workspace, const BwdWorkspaceLayout& layout);

// True when rows of a bf16 [T, H, D] view start 16-byte aligned (the quantizer and the
// fp8_mixed backward read them with 16-byte loads).
inline bool rows_16b_aligned(const void* base, int64_t stride_t, int64_t stride_h) {
  return (reinterpret_cast<uintptr_t>(base) % 16 == 0) && (stride_t * 2) % 16 == 0 &&
         (stride_h * 2) % 16 == 0;
}

}  // namespace quant
}  // namespace flamia
