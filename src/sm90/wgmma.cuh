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
#define FLAMIA_WGMMA_ACC4(c, n) c(d[n][0]), c(d[n][1]), c(d[n][2]), c(d[n][3])
#define FLAMIA_WGMMA_ACC32(c)                                                               \
  FLAMIA_WGMMA_ACC4(c, 0), FLAMIA_WGMMA_ACC4(c, 1), FLAMIA_WGMMA_ACC4(c, 2), FLAMIA_WGMMA_ACC4(c, 3), \
      FLAMIA_WGMMA_ACC4(c, 4), FLAMIA_WGMMA_ACC4(c, 5), FLAMIA_WGMMA_ACC4(c, 6), FLAMIA_WGMMA_ACC4(c, 7)
#define FLAMIA_WGMMA_ACC64(c)                                                                  \
  FLAMIA_WGMMA_ACC32(c), FLAMIA_WGMMA_ACC4(c, 8), FLAMIA_WGMMA_ACC4(c, 9), FLAMIA_WGMMA_ACC4(c, 10), \
      FLAMIA_WGMMA_ACC4(c, 11), FLAMIA_WGMMA_ACC4(c, 12), FLAMIA_WGMMA_ACC4(c, 13),               \
      FLAMIA_WGMMA_ACC4(c, 14), FLAMIA_WGMMA_ACC4(c, 15)
#define FLAMIA_WGMMA_D32                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLAMIA_WGMMA_D64                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

// m64n64k32, A and B from shared memory (S = Q Kᵀ).
#define FLAMIA_WGMMA_SS_N64                                                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                              \
  "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D32 \
  ", %32, %33, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_N64 : FLAMIA_WGMMA_ACC32("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_N64 : FLAMIA_WGMMA_ACC32("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}

// m64n64k32 / m64n128k32, A from registers (the 8-bit k32 A fragment: byte j of a[r] is row
// 16 w + g + 8 (r % 2), k = 4 q + j + 16 (r / 2)), B from shared memory (O tile = P Vᵀ).
#define FLAMIA_WGMMA_RS_N64                                                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                              \
  "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D32 \
  ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_N64
                 : FLAMIA_WGMMA_ACC32("+f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)
                 : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_N64
                 : FLAMIA_WGMMA_ACC32("=f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0)
                 : "memory");
}

#define FLAMIA_WGMMA_RS_N128                                                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                               \
  "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D64 \
  ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_N128
                 : FLAMIA_WGMMA_ACC64("+f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)
                 : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_N128
                 : FLAMIA_WGMMA_ACC64("=f")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0)
                 : "memory");
}


// ---- further shapes (the arithmetic probe, tools/wgmma_probe.cu) ---------------------------
// FP8 m64n128k32 / m64n256k32 with A from shared memory, m64n256k32 with A from registers;
// BF16 m64nNk16 (N = 64, 128, 256), A from shared memory or registers (A fragment: a[r]
// holds rows 16 w + g + 8 (r % 2), k = 2 q + 8 (r / 2) + {0, 1}, as mma.sync m16n8k16).
// BF16 operands are K-major too (imm-trans-a = imm-trans-b = 0); one k16 step is 32 bytes
// of every row, the same as an FP8 k32 step, so desc() and KMajorTile serve both.
#define FLAMIA_WGMMA_ACC128(c)                                                                  \
  FLAMIA_WGMMA_ACC64(c), FLAMIA_WGMMA_ACC4(c, 16), FLAMIA_WGMMA_ACC4(c, 17), FLAMIA_WGMMA_ACC4(c, 18), \
      FLAMIA_WGMMA_ACC4(c, 19), FLAMIA_WGMMA_ACC4(c, 20), FLAMIA_WGMMA_ACC4(c, 21),               \
      FLAMIA_WGMMA_ACC4(c, 22), FLAMIA_WGMMA_ACC4(c, 23), FLAMIA_WGMMA_ACC4(c, 24),               \
      FLAMIA_WGMMA_ACC4(c, 25), FLAMIA_WGMMA_ACC4(c, 26), FLAMIA_WGMMA_ACC4(c, 27),               \
      FLAMIA_WGMMA_ACC4(c, 28), FLAMIA_WGMMA_ACC4(c, 29), FLAMIA_WGMMA_ACC4(c, 30), FLAMIA_WGMMA_ACC4(c, 31)

#define FLAMIA_WGMMA_D128 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"

#define FLAMIA_WGMMA_SS_E4M3_N128 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss(float (&d)[16][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_E4M3_N128 : FLAMIA_WGMMA_ACC64("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_E4M3_N128 : FLAMIA_WGMMA_ACC64("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_SS_E4M3_N128

#define FLAMIA_WGMMA_SS_E4M3_N256 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D128 ", %128, %129, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss(float (&d)[32][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_E4M3_N256 : FLAMIA_WGMMA_ACC128("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_E4M3_N256 : FLAMIA_WGMMA_ACC128("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_SS_E4M3_N256

#define FLAMIA_WGMMA_RS_E4M3_N256 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " FLAMIA_WGMMA_D128 ", {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_E4M3_N256 : FLAMIA_WGMMA_ACC128("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_E4M3_N256 : FLAMIA_WGMMA_ACC128("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_RS_E4M3_N256

#define FLAMIA_WGMMA_SS_BF16_N64 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FLAMIA_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss_bf16(float (&d)[8][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_BF16_N64 : FLAMIA_WGMMA_ACC32("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_BF16_N64 : FLAMIA_WGMMA_ACC32("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_SS_BF16_N64

#define FLAMIA_WGMMA_RS_BF16_N64 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FLAMIA_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs_bf16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_BF16_N64 : FLAMIA_WGMMA_ACC32("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_BF16_N64 : FLAMIA_WGMMA_ACC32("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_RS_BF16_N64

#define FLAMIA_WGMMA_SS_BF16_N128 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FLAMIA_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss_bf16(float (&d)[16][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_BF16_N128 : FLAMIA_WGMMA_ACC64("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_BF16_N128 : FLAMIA_WGMMA_ACC64("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_SS_BF16_N128

#define FLAMIA_WGMMA_RS_BF16_N128 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FLAMIA_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs_bf16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_BF16_N128 : FLAMIA_WGMMA_ACC64("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_BF16_N128 : FLAMIA_WGMMA_ACC64("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_RS_BF16_N128

#define FLAMIA_WGMMA_SS_BF16_N256 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FLAMIA_WGMMA_D128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_ss_bf16(float (&d)[32][4], uint64_t a, uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_SS_BF16_N256 : FLAMIA_WGMMA_ACC128("+f") : "l"(a), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_SS_BF16_N256 : FLAMIA_WGMMA_ACC128("=f") : "l"(a), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_SS_BF16_N256

#define FLAMIA_WGMMA_RS_BF16_N256 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FLAMIA_WGMMA_D128 ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
template <bool kAccumulate>
__device__ __forceinline__ void mma_rs_bf16(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kAccumulate)
    asm volatile(FLAMIA_WGMMA_RS_BF16_N256 : FLAMIA_WGMMA_ACC128("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1) : "memory");
  else
    asm volatile(FLAMIA_WGMMA_RS_BF16_N256 : FLAMIA_WGMMA_ACC128("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0) : "memory");
}
#undef FLAMIA_WGMMA_RS_BF16_N256

#undef FLAMIA_WGMMA_D128
#undef FLAMIA_WGMMA_ACC128

#undef FLAMIA_WGMMA_RS_N128
#undef FLAMIA_WGMMA_RS_N64
#undef FLAMIA_WGMMA_SS_N64
#undef FLAMIA_WGMMA_D64
#undef FLAMIA_WGMMA_D32
#undef FLAMIA_WGMMA_ACC64
#undef FLAMIA_WGMMA_ACC32
#undef FLAMIA_WGMMA_ACC4

}  // namespace wgmma
}  // namespace sm90
}  // namespace flamia
