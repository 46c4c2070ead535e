// Warpgroup-level control (sm_90a): register reallocation between producer and consumer
// warpgroups, and named barriers that order warpgroups without stopping the whole CTA.
#pragma once

#include <cstdint>

namespace flamia {
namespace sm90 {
namespace warpgroup {

constexpr int kThreads = 128;

// This thread's warpgroup, broadcast from lane 0 so that ptxas knows it is warp-uniform: what
// derives from it (addresses, wgmma descriptors, named-barrier ids) then lives in uniform
// registers instead of taking per-thread registers (docs/PERFORMANCE.md v19).
__device__ __forceinline__ int index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / kThreads, 0); }

// The registers a CTA of `threads` threads, alone on its SM, holds from its launch (64 K, in
// multiples of 8 a thread): all that setmaxnreg can move between its warpgroups — a claim
// beyond them waits forever.
constexpr int launch_registers(int threads) { return threads * (65536 / threads / 8 * 8); }

// The producer gives registers back to the pool; consumers take them. Every warp of the
// warpgroup executes the same call. N must be a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barriers: `threads` counts every thread that syncs on `id` (a multiple of
// 32). Ids below kFirstNamedBarrier are left to __syncthreads and libraries.
constexpr int kFirstNamedBarrier = 8;
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// bar_sync that also consumes `token`, the output of non-volatile asm stores, so that they
// are kept and issued before the barrier.
__device__ __forceinline__ void bar_sync_after(int id, int threads, uint32_t token) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads), "r"(token) : "memory");
}

}  // namespace warpgroup
}  // namespace sm90
}  // namespace flamia
