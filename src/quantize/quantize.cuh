// Host entry points of the fused per-token quantizer and of the hostile-input guard
// (quantize.cu): q, k, v into qkv8 for the forward and the backward, dO for the backward, the
// checks of a filled qkv8 and the poisoning of a faulted call's outputs. Independent of the
// attention kernels: it takes the call as common/device_call.h gives it.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/device_call.h"
#include "quantize/guard.h"
#include "quantize/layout.cuh"

namespace flamia {
namespace quant {

// The quantizer beside the fast forward: its CTAs (one an SM) and the kv heads a block of its
// order (the forward's, order::forward_kv_block, where the forward follows it; hkv gives the
// plain quantizer's order, heads fastest over all of them, for tools/quant_probe.cu).
struct BesideLaunch {
  unsigned ctas;
  int kv_block;
  static BesideLaunch for_forward(const DeviceCall& p);  // a third of the SMs, the forward's order
};

// Fused quantizer: q, k, v -> every FP8 layout the kernels read, plus per-token scales.
// beside: for the fast forward launched next (sm90.h, DeviceCall::quantize_beside), raising
// qkv8's counts (layout.cuh, BesideReady) as it goes.
cudaError_t quantize_qkv(const DeviceCall& p, void* qkv8, bool for_backward, const BesideLaunch* beside = nullptr);

// ---- hostile-input guard (quantize/guard.h) ------------------------------------------
// Block 0 of quantize_qkv (and of the backward's dO quantizer) validates cu_seqlens on the
// device; on a fault it records it in the call's status word and the device's sticky record
// and zeroes the work-list count, so the attention kernels do nothing.

// Forward on a filled qkv8: the same validation plus a comparison of the fingerprint stored
// by quantize_qkv; a mismatch rejects the buffer until it is quantized again.
cudaError_t check_qkv8(const DeviceCall& p, void* qkv8);
// Last kernel of a forward / backward: NaN into every output when the call's status records
// a fault (a no-op otherwise).
cudaError_t poison_forward(const DeviceCall& p, const void* qkv8, void* out, float* lse);
cudaError_t poison_backward(const DeviceCall& p, const void* workspace, void* dq, void* dk, void* dv);
// The current device's sticky record, then cleared (synchronises the device).
cudaError_t take_sticky_error(guard::DeviceError* out);
// The fingerprint stored in qkv8 (synchronises p.stream; checking mode only).
cudaError_t read_qkv8_fingerprint(const DeviceCall& p, const void* qkv8, uint64_t* fingerprint);


// dO -> natural FP8 codes and scales, its transposed FP8 copy (fp8; fp8_mixed: the flag of
// non-finite rows instead, layout.cuh), D = rowsum(dO8 * O) from the codes times dO's scale
// (FP32, ALGORITHM.md §3) and lse2 = lse * log2(e) (NaN for a non-finite dO row), into the
// backward workspace. out uses dout's token/head strides. Block 0 validates cu_seqlens and
// compares qkv8's fingerprint into the workspace's status word (guard.cuh).
cudaError_t quantize_dout(const DeviceCall& p, const void* dout, int64_t stride_t,
                          int64_t stride_h, const void* out, const float* lse, const uint8_t* qkv8,
                          const Qkv8Layout& qkv8_layout, uint8_t* workspace,
                          const BwdWorkspaceLayout& layout);

// Recipe fp8: Qᵀ and Kᵀ (FP8, [H][D][Tpad], fragment order) into the workspace, transposed
// from qkv8's q8 and k8 (layout.cuh). Clamps to cu_seqlens' extents whatever its values.
cudaError_t transpose_qk_codes(const DeviceCall& p, const uint8_t* qkv8, const Qkv8Layout& qkv8_layout,
                               uint8_t* workspace, const BwdWorkspaceLayout& layout);

// True when rows of a bf16 [T, H, D] view start 16-byte aligned (the quantizer reads them
// with 16-byte loads, the fp8_mixed backward by TMA).
inline bool rows_16b_aligned(const void* base, int64_t stride_t, int64_t stride_h) {
  return (reinterpret_cast<uintptr_t>(base) % 16 == 0) && (stride_t * 2) % 16 == 0 &&
         (stride_h * 2) % 16 == 0;
}

}  // namespace quant
}  // namespace flamia
