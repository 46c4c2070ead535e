#include "sm90/launch/tensor_map.h"

#include "sm90/arch/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  // The entry point is process-wide (not per device), so one lookup serves every GPU.
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

cudaError_t encode_u8_map(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                          const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes,
                          int l2_promotion_bytes) {
  const EncodeTiled encode = encode_fn();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    e[i] = 1;
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, cuuint32_t(rank), const_cast<void*>(base), d, s, b,
                            e, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            l2_promotion_bytes == 256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                                      : CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  // The driver's codes and the runtime's agree in number for what encoding can return
  // (1 invalid value, 201 invalid context, ...), so the reason reaches the message.
  return static_cast<cudaError_t>(r);
}

// Bytes {128-byte block of d, token, head, block}: the box is one whole 64-token tile.
cudaError_t encode_natural_map(CUtensorMap* map, const void* x, int64_t total_tokens, int heads, int head_dim,
                               int64_t stride_t, int64_t stride_h) {
  const uint64_t dims[4] = {uint64_t(mma::kNaturalRowBytes), uint64_t(total_tokens), uint64_t(heads),
                            uint64_t(head_dim / 64)};
  const uint64_t strides[3] = {2 * uint64_t(stride_t), 2 * uint64_t(stride_h), uint64_t(mma::kNaturalRowBytes)};
  const uint32_t box[4] = {uint32_t(mma::kNaturalRowBytes), uint32_t(mma::kNaturalRows), 1, uint32_t(head_dim / 64)};
  // 256-byte L2 fills: at D = 128 a token's head row is two blocks, whose halves a miss brings
  // in together.
  return encode_u8_map(map, x, 4, dims, strides, box, mma::kNaturalRowBytes, head_dim == 128 ? 256 : 128);
}

}  // namespace sm90
}  // namespace flamia
