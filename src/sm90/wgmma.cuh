// Warpgroup MMA (wgmma, sm_90a) for FP8 E4M3 operands: shared-memory tile layout, matrix
// descriptors, and one wrapper per instruction shape. Facts and sources:
// ../shared/HOPPER-FP8-NOTES.md §1, §2, §4; PTX ISA "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate" (Shared Memory Matrix Layout, Matrix Descriptor Format).
//
// All 128 threads of the warpgroup execute every call here with identical descriptors.
// Accumulators are float[N/8][4]: element [n][e] is register 4n + e of the m64nN f32
// fragment, i.e. row 16 w + g + 8 (e >> 1), column 8 n + 2 q + (e & 1) (warp w, lane 4 g + q)
// — the same per-warp layout as the mma.sync TileAcc of fragments.cuh.
#pragma once

#include <cstdint>

#include "sm90/arch/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace wgmma {

// ---- shared-memory layout --------------------------------------------------------------
// FP8 operands must be K-major (no transpose for 8-bit types). Without swizzling, wgmma
// reads "core matrices" of 8 rows x 16 bytes stored as 128 contiguous bytes (row r of the
// core matrix at +16 r). The descriptor gives the distance between core matrices that are
// neighbours along K (leading byte offset) and along M/N (stride byte offset).
// This tile stores, for each 16-byte column chunk c, all row groups one after another:
//   chunk c of row r  ->  c * kLbo + (r / 8) * kSbo + (r % 8) * 16
// so one k32 step (chunks 2 ks, 2 ks + 1) is 2 * rows * 16 contiguous bytes, and the 16-byte
// writes of 8 consecutive rows' chunk c are 128 contiguous bytes (no bank conflicts).
template <int kRows, int kRowBytes>
struct KMajorTile {
  static_assert(kRows % 8 == 0 && kRowBytes % 32 == 0, "whole core matrices and k32 steps");
  static constexpr int kBytes = kRows * kRowBytes;
  static constexpr int kLbo = kRows * 16;  // next core matrix along K
  static constexpr int kSbo = 128;         // next 8 rows
  __host__ __device__ static constexpr int chunk_offset(int r, int c) {
    return c * kLbo + (r >> 3) * kSbo + (r & 7) * 16;
  }
  // Byte offset of k32 step ks (FP8: bytes 32 ks .. 32 ks + 31 of every row).
  __host__ __device__ static constexpr int kstep_offset(int ks) { return 2 * ks * kLbo; }
};

// Descriptor of the operand that starts at k32 step ks of a KMajorTile at shared address
// `tile` (a shared-window address, 16-byte aligned). Fields: start address bits 0-13,
// leading byte offset 16-29, stride byte offset 32-45, each in 16-byte units; base offset
// (49-51) and swizzle mode (62-63) are 0 = no swizzle.
// Shared-window addresses are below 2^18 (228 KiB), so stepping the start field by
// kstep_offset >> 4 never carries out of it.
// Built as two 32-bit words with the step added to the low one (one add per step).
template <class Tile>
__device__ __forceinline__ uint64_t desc(uint32_t tile, int ks) {
  const uint32_t lo = (((tile & 0x3FFFFu) >> 4) | uint32_t(Tile::kLbo >> 4) << 16) + uint32_t(Tile::kstep_offset(ks) >> 4);
  return (uint64_t(Tile::kSbo >> 4) << 32) | lo;
}

// ---- ordering ----------------------------------------------------------------------------
// fence / commit / wait / pin: the warpgroup ordering of arch/wgmma.cuh, shared by both
// generations of kernels.
using mma::commit;
using mma::fence;
using mma::pin;
using mma::wait;

// Generic-proxy writes to shared memory (cp.async, st.shared) become visible to wgmma's
// async-proxy reads: each writing thread fences, then the CTA barrier follows.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- MMAs --------------------------------------------------------------------------------
// kAccumulate = false: d = A B (scale-d = 0; d is write-only, a fresh accumulator);
// true: d += A B. A: 64 x 32, B: N x 32 (K-major), FP8 E4M3, "f32" accumulate — but the
// FP8 accumulation keeps fewer bits than FP32 (HOPPER-FP8-NOTES.md §7), so chained d += A B
// rounds differently from FP32 adds of fresh products (measured in forward_wgmma.cu; the
// exact rule, measured on H200: docs/NUMERICS.md §6, modelled in reference/tensor_core.h).
// The instruction text comes from arch/wgmma.cuh's pattern (FLAMIA_MMA_PTX_SS / _RS).
#define FLAMIA_WGMMA_WRAPPER(fn, tiles, ACC, PTX, A_PARAM, INPUTS)                          \
  template <bool kAccumulate>                                                              \
  __device__ __forceinline__ void fn(float (&d)[tiles][4], A_PARAM, uint64_t b) {          \
    if constexpr (kAccumulate)                                                             \
      asm volatile(PTX : ACC("+f") : INPUTS, "l"(b), "r"(1) : "memory");                   \
    else                                                                                   \
      asm volatile(PTX : ACC("=f") : INPUTS, "l"(b), "r"(0) : "memory");                   \
  }
#define FLAMIA_WGMMA_SS(fn, tiles, ACC, shape, D, ai, bi, pi, tail) \
  FLAMIA_WGMMA_WRAPPER(fn, tiles, ACC, FLAMIA_MMA_PTX_SS(shape, D, ai, bi, pi, tail), uint64_t a, FLAMIA_MMA_SS_INPUTS)
#define FLAMIA_WGMMA_RS(fn, tiles, ACC, shape, D, a0, a1, a2, a3, bi, pi, tail)                   \
  FLAMIA_WGMMA_WRAPPER(fn, tiles, ACC, FLAMIA_MMA_PTX_RS(shape, D, a0, a1, a2, a3, bi, pi, tail), \
                       const uint32_t (&a)[4], FLAMIA_MMA_RS_INPUTS)

// m64n64k32, A and B from shared memory (S = Q Kᵀ).
FLAMIA_WGMMA_SS(mma_ss, 8, FLAMIA_MMA_ACC32, "m64n64k32.f32.e4m3.e4m3", FLAMIA_MMA_D32, 32, 33, 34, "")

// m64n64k32 / m64n128k32, A from registers (the 8-bit k32 A fragment: byte j of a[r] is row
// 16 w + g + 8 (r % 2), k = 4 q + j + 16 (r / 2)), B from shared memory (O tile = P Vᵀ).
FLAMIA_WGMMA_RS(mma_rs, 8, FLAMIA_MMA_ACC32, "m64n64k32.f32.e4m3.e4m3", FLAMIA_MMA_D32, 32, 33, 34, 35, 36, 37, "")
FLAMIA_WGMMA_RS(mma_rs, 16, FLAMIA_MMA_ACC64, "m64n128k32.f32.e4m3.e4m3", FLAMIA_MMA_D64, 64, 65, 66, 67, 68, 69, "")

// ---- further shapes (the arithmetic probe, tools/wgmma_probe.cu) ---------------------------
// FP8 m64n128k32 / m64n256k32 with A from shared memory, m64n256k32 with A from registers;
// BF16 m64nNk16 (N = 64, 128, 256), A from shared memory or registers (A fragment: a[r]
// holds rows 16 w + g + 8 (r % 2), k = 2 q + 8 (r / 2) + {0, 1}, as mma.sync m16n8k16).
// BF16 operands are K-major too (imm-trans-a = imm-trans-b = 0); one k16 step is 32 bytes
// of every row, the same as an FP8 k32 step, so desc() and KMajorTile serve both.
FLAMIA_WGMMA_SS(mma_ss, 16, FLAMIA_MMA_ACC64, "m64n128k32.f32.e4m3.e4m3", FLAMIA_MMA_D64, 64, 65, 66, "")
FLAMIA_WGMMA_SS(mma_ss, 32, FLAMIA_MMA_ACC128, "m64n256k32.f32.e4m3.e4m3", FLAMIA_MMA_D128, 128, 129, 130, "")
FLAMIA_WGMMA_RS(mma_rs, 32, FLAMIA_MMA_ACC128, "m64n256k32.f32.e4m3.e4m3", FLAMIA_MMA_D128, 128, 129, 130, 131, 132,
                133, "")
FLAMIA_WGMMA_SS(mma_ss_bf16, 8, FLAMIA_MMA_ACC32, "m64n64k16.f32.bf16.bf16", FLAMIA_MMA_D32, 32, 33, 34, ", 0, 0")
FLAMIA_WGMMA_RS(mma_rs_bf16, 8, FLAMIA_MMA_ACC32, "m64n64k16.f32.bf16.bf16", FLAMIA_MMA_D32, 32, 33, 34, 35, 36, 37,
                ", 0")
FLAMIA_WGMMA_SS(mma_ss_bf16, 16, FLAMIA_MMA_ACC64, "m64n128k16.f32.bf16.bf16", FLAMIA_MMA_D64, 64, 65, 66, ", 0, 0")
FLAMIA_WGMMA_RS(mma_rs_bf16, 16, FLAMIA_MMA_ACC64, "m64n128k16.f32.bf16.bf16", FLAMIA_MMA_D64, 64, 65, 66, 67, 68,
                69, ", 0")
FLAMIA_WGMMA_SS(mma_ss_bf16, 32, FLAMIA_MMA_ACC128, "m64n256k16.f32.bf16.bf16", FLAMIA_MMA_D128, 128, 129, 130,
                ", 0, 0")
FLAMIA_WGMMA_RS(mma_rs_bf16, 32, FLAMIA_MMA_ACC128, "m64n256k16.f32.bf16.bf16", FLAMIA_MMA_D128, 128, 129, 130, 131,
                132, 133, ", 0")
// BF16 with B MN-major (imm-trans-b = 1, mma::desc_natural): fp8_mixed's backward products
// over tokens, B = the caller's q, k or dO rows.
FLAMIA_WGMMA_RS(mma_rs_bf16_bn, 8, FLAMIA_MMA_ACC32, "m64n64k16.f32.bf16.bf16", FLAMIA_MMA_D32, 32, 33, 34, 35, 36,
                37, ", 1")
FLAMIA_WGMMA_RS(mma_rs_bf16_bn, 16, FLAMIA_MMA_ACC64, "m64n128k16.f32.bf16.bf16", FLAMIA_MMA_D64, 64, 65, 66, 67,
                68, 69, ", 1")
FLAMIA_WGMMA_SS(mma_ss_bf16_bn, 8, FLAMIA_MMA_ACC32, "m64n64k16.f32.bf16.bf16", FLAMIA_MMA_D32, 32, 33, 34, ", 0, 1")
FLAMIA_WGMMA_SS(mma_ss_bf16_bn, 16, FLAMIA_MMA_ACC64, "m64n128k16.f32.bf16.bf16", FLAMIA_MMA_D64, 64, 65, 66,
                ", 0, 1")
#undef FLAMIA_WGMMA_RS
#undef FLAMIA_WGMMA_SS
#undef FLAMIA_WGMMA_WRAPPER

}  // namespace wgmma
}  // namespace sm90
}  // namespace flamia
