// The backward's streamed stages: a ring of mbarrier-guarded stages that every thread
// refills and releases itself (no CTA barrier between steps), and the swizzle-aligned base
// of the dynamic shared memory.
#pragma once

#include <cstdint>

#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// Dynamic shared memory is not guaranteed to start swizzle-aligned: the plans allocate
// kSwizzleAlign bytes more (kAlloc) and the kernels round their base up — as a shared address,
// converted back, so that ptxas still sees the alignment and pairs the per-token values'
// 4-byte loads (a generic pointer plus a runtime offset loses it).
__device__ __forceinline__ uint8_t* swizzle_aligned(uint8_t* raw) {
  const uint32_t at = (ptx::smem_addr(raw) + kSwizzleAlign - 1) & ~uint32_t(kSwizzleAlign - 1);
  return static_cast<uint8_t*>(__cvta_shared_to_generic(at));
}

// The ring's mbarriers. A `full` phase completes once the elected thread announced the
// step's TMA bytes, TMA delivered them, and every thread's per-token copies landed (each
// thread arrives when its cp.async copies have: `threads` + 1 arrivals). An `empty` phase
// completes once every thread has finished reading the stage (each thread arrives for its
// own reads: the release orders exactly them before the refill, with no warp-level step
// that the sanitizer's race model would have to take on trust). The CTA barrier after this
// publishes them before any thread arrives.
__device__ __forceinline__ bool elected_thread() { return threadIdx.x == 0; }
template <int kStages = kBwdStages>
__device__ __forceinline__ void init_stage_barriers(uint32_t full0, uint32_t empty0, int threads) {
  if (elected_thread()) {
    for (int s = 0; s < kStages; ++s) {
      mbar::init(full0 + 8 * s, threads + 1);
      mbar::init(empty0 + 8 * s, threads);
    }
    mbar::fence_init();
  }
  __syncthreads();
}

// A position in the ring: the stage and the parity of its current use. The loader waits on
// `empty` with the previous use's parity (phase ^ 1; a fresh barrier passes it at once), the
// consumer on `full` with the current one.
template <int kStages = kBwdStages>
struct StageCursor {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

// Every thread's side of a refill: wait until every thread has left the cursor's stage,
// issue this thread's loads into it (`load(stage)`), arrive on its `full` barrier when this
// thread's copies have landed, and move the cursor on.
template <class Cursor, class Load>
__device__ __forceinline__ void refill_stage(uint32_t full0, uint32_t empty0, Cursor& cursor, Load load) {
  mbar::wait(empty0 + 8 * cursor.index, cursor.phase ^ 1);
  load(cursor.index);
  mbar::arrive_when_copies_land(full0 + 8 * cursor.index);
  cursor.advance();
}

// This thread is done with a stage: its warpgroup's last wgmma reading it has completed
// (wait<0> in the products) and its own loads of the per-token values have returned.
__device__ __forceinline__ void release_stage(uint32_t empty) { mbar::arrive(empty); }

// After the prologue's cp.async copies of the CTA's own rows: they landed (each thread's),
// are visible to wgmma (async proxy) and to every thread (the barrier).
__device__ __forceinline__ void own_rows_ready() {
  ptx::cp_async_wait<0>();
  wgmma::fence_proxy_async();
  __syncthreads();
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
