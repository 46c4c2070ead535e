// Warpgroup MMA (wgmma, sm_90a) on FP8 E4M3 operands in swizzled shared-memory tiles, as
// TMA writes them. PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
// "Shared Memory Matrix Layout" and "Matrix Descriptor Format".
//
// All 128 threads of a warpgroup execute every call with identical descriptors.
// Accumulator float[N/8][4]: element [n][e] is register 4n + e of the m64nN f32 fragment,
// row 16 w + g + 8 (e >> 1), column 8 n + 2 q + (e & 1) (warp w, lane 4 g + q).
#pragma once

#include <cstdint>

namespace flamia {
namespace sm90 {
namespace mma {

// ---- operand tiles ---------------------------------------------------------------------
// FP8 operands must be K-major. A tile is `rows` rows of kRowBytes bytes (one row = one
// token's D codes, or one d's key codes), rows contiguous, in TMA's swizzle of the same
// width: inside each group of 8 rows (one swizzle atom of 8 x kRowBytes bytes) the 16-byte
// chunk c of row r sits at chunk c ^ (r % 8) (128-byte rows) or c ^ ((r % 8) / 2) (64-byte).
// Tiles start 1024-byte aligned, so the descriptor's base offset is 0.
template <int kRowBytes>
struct SwizzledRows {
  static_assert(kRowBytes == 64 || kRowBytes == 128, "64B or 128B swizzle");
  static constexpr int kAtomBytes = 8 * kRowBytes;          // stride between 8-row groups
  static constexpr uint64_t kMode = kRowBytes == 128 ? 1 : 2;  // descriptor swizzle field
};

// Descriptor of k32 step ks of a swizzled K-major tile at shared address `tile`: start
// address (bits 0-13, 16-byte units), leading byte offset 1 (unused for swizzled K-major),
// stride byte offset = one atom (bits 32-45), swizzle mode (bits 62-63). A k32 step is 32
// bytes into every row; the hardware applies the swizzle to the advanced address.
// Built as two 32-bit words with the step added to the low one: shared-window addresses are
// below 2^18, so the start field never carries, and a tile's steps cost one add each.
template <int kRowBytes>
__device__ __forceinline__ uint64_t desc(uint32_t tile, int ks) {
  using T = SwizzledRows<kRowBytes>;
  const uint32_t lo = (((tile & 0x3FFFFu) >> 4) | (1u << 16)) + 2u * uint32_t(ks);
  constexpr uint32_t hi = uint32_t(T::kAtomBytes >> 4) | uint32_t(T::kMode << 30);
  return (uint64_t(hi) << 32) | lo;
}

// BF16 B operands may also be MN-major (wgmma's imm-trans-b): natural rows [token][d] as TMA
// lands 64-element (128-byte) boxes of 64 token rows, 128-byte swizzle, the d-block b of a
// tile at tile + b * kNaturalBlockBytes. Descriptor of k16 step ks (16 token rows): start
// tile + ks * 2048, leading byte offset = the block stride (from one 64-element group of N to
// the next), stride byte offset = 1024 (from one 8-row group of K to the next), as CUTLASS's
// canonical MN-major SW128 layout ((8,n),(8,k)):((1,LBO),(8,SBO)) in 16-byte units.
constexpr int kNaturalRows = 64;
constexpr int kNaturalRowBytes = 128;
constexpr int kNaturalBlockBytes = kNaturalRows * kNaturalRowBytes;
__device__ __forceinline__ uint64_t desc_natural(uint32_t tile, int ks) {
  const uint32_t lo = (((tile & 0x3FFFFu) >> 4) | (uint32_t(kNaturalBlockBytes >> 4) << 16)) +
                      uint32_t(ks) * uint32_t((16 * kNaturalRowBytes) >> 4);
  constexpr uint32_t hi = uint32_t((8 * kNaturalRowBytes) >> 4) | (1u << 30);
  return (uint64_t(hi) << 32) | lo;
}

// ---- ordering ----------------------------------------------------------------------------
// Before the first wgmma that reads registers (accumulator or A) written by other instructions.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warp are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The compiler sees a wgmma's outputs as defined at issue; pinning them after wait() keeps
// every read below the wait, and keeps A registers alive until the MMA that reads them is done.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
template <int K, int N>
__device__ __forceinline__ void pin(uint32_t (&a)[K][N]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
}

// ---- MMAs --------------------------------------------------------------------------------
// The instruction text of every wrapper here and in sm90/wgmma.cuh, from one pattern: the
// accumulator's R = 4 x (n8 tiles) registers are operands %0 .. %R-1, then A (SS: a
// descriptor %R; RS: four registers %R .. %R+3), B's descriptor, and scale-d as a predicate
// from the last operand (0: D = A B, a fresh accumulator; 1: D += A B).
#define FLAMIA_MMA_ACC4(c, n) c(d[n][0]), c(d[n][1]), c(d[n][2]), c(d[n][3])
#define FLAMIA_MMA_ACC32(c)                                                                \
  FLAMIA_MMA_ACC4(c, 0), FLAMIA_MMA_ACC4(c, 1), FLAMIA_MMA_ACC4(c, 2), FLAMIA_MMA_ACC4(c, 3), \
      FLAMIA_MMA_ACC4(c, 4), FLAMIA_MMA_ACC4(c, 5), FLAMIA_MMA_ACC4(c, 6), FLAMIA_MMA_ACC4(c, 7)
#define FLAMIA_MMA_ACC64(c)                                                                   \
  FLAMIA_MMA_ACC32(c), FLAMIA_MMA_ACC4(c, 8), FLAMIA_MMA_ACC4(c, 9), FLAMIA_MMA_ACC4(c, 10),    \
      FLAMIA_MMA_ACC4(c, 11), FLAMIA_MMA_ACC4(c, 12), FLAMIA_MMA_ACC4(c, 13), FLAMIA_MMA_ACC4(c, 14), \
      FLAMIA_MMA_ACC4(c, 15)
#define FLAMIA_MMA_ACC128(c)                                                                  \
  FLAMIA_MMA_ACC64(c), FLAMIA_MMA_ACC4(c, 16), FLAMIA_MMA_ACC4(c, 17), FLAMIA_MMA_ACC4(c, 18),  \
      FLAMIA_MMA_ACC4(c, 19), FLAMIA_MMA_ACC4(c, 20), FLAMIA_MMA_ACC4(c, 21), FLAMIA_MMA_ACC4(c, 22), \
      FLAMIA_MMA_ACC4(c, 23), FLAMIA_MMA_ACC4(c, 24), FLAMIA_MMA_ACC4(c, 25), FLAMIA_MMA_ACC4(c, 26), \
      FLAMIA_MMA_ACC4(c, 27), FLAMIA_MMA_ACC4(c, 28), FLAMIA_MMA_ACC4(c, 29), FLAMIA_MMA_ACC4(c, 30), \
      FLAMIA_MMA_ACC4(c, 31)
#define FLAMIA_MMA_D32                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLAMIA_MMA_D64                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLAMIA_MMA_D128                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
// shape: e.g. m64n128k32.f32.e4m3.e4m3; D: the accumulator list; a, b, p: operand numbers;
// tail: the BF16 forms' transpose immediates (", 0, 0" SS, ", 0" RS), empty for FP8.
#define FLAMIA_MMA_PTX_SS(shape, D, a, b, p, tail)                                        \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #p ", 0;\n"                                       \
  "wgmma.mma_async.sync.aligned." shape " " D ", %" #a ", %" #b ", p, 1, 1" tail ";\n}\n"
#define FLAMIA_MMA_PTX_RS(shape, D, a0, a1, a2, a3, b, p, tail)                                      \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #p ", 0;\n"                                                  \
  "wgmma.mma_async.sync.aligned." shape " " D ", {%" #a0 ", %" #a1 ", %" #a2 ", %" #a3 "}, %" #b \
  ", p, 1, 1" tail ";\n}\n"
#define FLAMIA_MMA_SS_INPUTS "l"(a)
#define FLAMIA_MMA_RS_INPUTS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

// A wrapper with scale-d at run time: fn(d, a, b, accumulate).
#define FLAMIA_MMA_WRAPPER(fn, tiles, ACC, PTX, A_PARAM, INPUTS)                                    \
  __device__ __forceinline__ void fn(float (&d)[tiles][4], A_PARAM, uint64_t b, bool accumulate) { \
    asm volatile(PTX : ACC("+f") : INPUTS, "l"(b), "r"(int(accumulate)) : "memory");               \
  }

// d (+)= A B, A and B from shared memory. N = 8 * (number of n8 tiles of d).
FLAMIA_MMA_WRAPPER(ss, 8, FLAMIA_MMA_ACC32, FLAMIA_MMA_PTX_SS("m64n64k32.f32.e4m3.e4m3", FLAMIA_MMA_D32, 32, 33, 34, ""),
                   uint64_t a, FLAMIA_MMA_SS_INPUTS)
FLAMIA_MMA_WRAPPER(ss, 16, FLAMIA_MMA_ACC64, FLAMIA_MMA_PTX_SS("m64n128k32.f32.e4m3.e4m3", FLAMIA_MMA_D64, 64, 65, 66, ""),
                   uint64_t a, FLAMIA_MMA_SS_INPUTS)

// d (+)= A B, A from registers (the 8-bit k32 A fragment: byte j of a[r] is row
// 16 w + g + 8 (r % 2), k = 4 q + j + 16 (r / 2)), B from shared memory.
FLAMIA_MMA_WRAPPER(rs, 8, FLAMIA_MMA_ACC32,
                   FLAMIA_MMA_PTX_RS("m64n64k32.f32.e4m3.e4m3", FLAMIA_MMA_D32, 32, 33, 34, 35, 36, 37, ""),
                   const uint32_t (&a)[4], FLAMIA_MMA_RS_INPUTS)
FLAMIA_MMA_WRAPPER(rs, 16, FLAMIA_MMA_ACC64,
                   FLAMIA_MMA_PTX_RS("m64n128k32.f32.e4m3.e4m3", FLAMIA_MMA_D64, 64, 65, 66, 67, 68, 69, ""),
                   const uint32_t (&a)[4], FLAMIA_MMA_RS_INPUTS)
#undef FLAMIA_MMA_WRAPPER

}  // namespace mma
}  // namespace sm90
}  // namespace flamia
