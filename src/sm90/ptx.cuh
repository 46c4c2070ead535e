// Small, named inline-PTX wrappers used by the sm_90a kernels. Each wrapper is one
// instruction (or a fixed pair) so that the kernels read as the algorithm and the PTX
// stays visible. Fragment layouts: ../shared/HOPPER-FP8-NOTES.md §8 and the PTX ISA
// "Matrix Fragments for mma.m16n8k32 / m16n8k16".
#pragma once

#include <cstdint>

#include "common/convert.cuh"

namespace flamia {
namespace sm90 {
namespace ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- counts another grid raises as it goes (the quantizer beside the forward) ------------
// An acquire load at GPU scope: the other grid's writes released before the count are visible
// to this thread's later loads (it also drops this SM's stale L1 lines).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Orders this thread's generic-proxy accesses (the acquires above) before its later
// async-proxy ones (TMA loads) on global memory.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// The raising side: a fence at GPU scope (this thread's writes, and those ordered before them
// by a barrier or a CTA-scope acquire, before its later ones), then relaxed adds.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void red_add_gpu(int* p, int v) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// A count inside the CTA (shared memory), written by one thread and polled by another.
__device__ __forceinline__ void st_release_cta_shared(uint32_t addr, int v) {
  asm volatile("st.release.cta.shared::cta.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire_cta_shared(uint32_t addr) {
  int v;
  asm volatile("ld.acquire.cta.shared::cta.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// ---- asynchronous global -> shared copies (cp.async, sm_80+) ---------------------------
// A source size of 0 writes zeros and reads nothing: this is how rows outside the current
// document are zero-filled. src must still be a valid address, so callers pass an
// in-bounds pointer for skipped chunks.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix --------------------------------------------------------------------------
// Four 8x8 b16 matrices (8 rows of 16 bytes each); lane l supplies the row address of
// matrix l/8, row l%8, and receives in r[i] bytes 4(l%4)..4(l%4)+3 of row l/4 of matrix i.
// For 8-bit data stored K-major this is exactly an mma.m16n8k32 A or B fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ---- stmatrix ----------------------------------------------------------------------------
// The transposing store of four 8x8 b16 matrices: r[i] holds, as an mma accumulator fragment
// does, row l/4 and columns 2(l%4), 2(l%4)+1 of matrix i; lane l supplies the address of
// stored row l%8 of matrix l/8, which receives column l%8 of the fragment (16 bytes).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- reductions to global memory ----------------------------------------------------------
// p[0] += a, p[1] += b in FP32 (8-byte aligned), no value returned: the L2 performs the adds.
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// ---- tensor-core MMA (warp-wide) -------------------------------------------------------
// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + D, FP32 accumulate. On sm_90 this
// instruction is emulated (no native Ada-style FP8 mma.sync); see src/sm90/README.md.
__device__ __forceinline__ void mma_e4m3_16x8x32(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- conversions -----------------------------------------------------------------------
// E4M3 and BF16 packs (common/convert.cuh, shared with the quantizer).
using cvt::pack_bf16x2;
using cvt::pack_e4m3x4;

// max that propagates NaN (fmaxf drops it, which would launder a NaN score into a finite
// softmax maximum); the specification uses the same rule.
__device__ __forceinline__ float max_nan(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// 2^x on the special-function unit (the accuracy ALGORITHM.md permits for exp2).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ptx
}  // namespace sm90
}  // namespace flamia
