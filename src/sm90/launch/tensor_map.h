// Host-side encoding of TMA tensor maps (CUDA driver API cuTensorMapEncodeTiled, reached
// through the runtime's driver entry point so the library needs no link against libcuda).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

namespace flamia {
namespace sm90 {

// A tiled map over a uint8 tensor (FP8 codes). dims[0] is the innermost (contiguous)
// dimension; strides_bytes[i] is the byte stride of dims[i + 1]. The box lands in shared
// memory with the given swizzle width (0, 64 or 128 bytes); elements outside the tensor
// read as zero. l2_promotion_bytes (128 or 256): the L2 fills a miss by that many bytes.
cudaError_t encode_u8_map(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                          const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes,
                          int l2_promotion_bytes = 128);

// A natural BF16 [T, H, D] tensor (strides in elements; base and rows 16-byte aligned) as
// boxes of 64 tokens x 1 head x D in 128-byte-swizzled blocks of 64 elements (arch/wgmma.cuh,
// kNaturalBlockBytes): the backward's BF16 operands, and the rows kit/rows_out.cuh stores.
cudaError_t encode_natural_map(CUtensorMap* map, const void* x, int64_t total_tokens, int heads, int head_dim,
                               int64_t stride_t, int64_t stride_h);

}  // namespace sm90
}  // namespace flamia
