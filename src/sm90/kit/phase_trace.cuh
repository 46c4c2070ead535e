// Phase clocks of the fast forward's consumer warps: when each warp's tiles reach the points
// that bound its phases (its stage landed, S done, softmax done, P·V done, fold done), read
// from the SM's cycle counter by lane 0. What ncu's per-instruction stall samples cannot
// show: how long each phase lasts tile by tile, and whether the two consumer warps of a
// scheduler are in their exp phases together. The production kernel takes `Off` (no code);
// FLAMIA_FWD_TRACE=FILE launches the kernel instantiated with `Clocks` and writes the
// records (kernels/forward_fast.cu; tools/fwd_trace_summary.py reads them).
#pragma once

#include <cstdint>

#include "sm90/fragments.cuh"

namespace flamia {
namespace sm90 {
namespace trace {

// The points a consumer warp marks, in the order a tile passes them (fwd_consumer.cuh).
enum Event : uint32_t {
  kItemStart = 0,    // the item's rows and scales read (begin_item)
  kStageLanded = 1,  // the next tile's K, Vᵀ stage has landed (its `full` wait returned)
  kScoresDone = 2,   // S of the tile is in registers: the softmax starts
  kSoftmaxDone = 3,  // P8 of the tile is in registers: its P·V is issued next
  kPvDone = 4,       // P·V of the tile is done: the fold starts
  kFoldDone = 5,     // the fold is done
  kItemEnd = 6,      // O of the item stored
};

struct Off {
  __device__ __forceinline__ void mark(Event) {}
};

// Where the traced kernel's records go (set by its launch, kernels/forward_fast.cu): kept in
// the constant bank, so that a mark reads it into uniform registers and the traced kernel
// keeps the production kernel's register allocation as nearly as it can.
__constant__ uint64_t* c_clocks;

// The consumer warps of the first kCtas CTAs record up to kCap marks each (warp w of CTA b
// from c_clocks + (b kWarps + w) kCap), each the event in the top 8 bits and the low 56 bits
// of clock64; kFirstWarp: the first consumer warp of a CTA.
template <int kCtas, int kWarps, int kFirstWarp, int kCap>
struct Clocks {
  int n = 0;  // this warp's marks so far
  __device__ __forceinline__ void mark(Event e) {
    const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0) - kFirstWarp;  // warp-uniform
    if (int(blockIdx.x) >= kCtas || warp < 0 || n >= kCap) return;
    if (lane_id() == 0)
      c_clocks[(size_t(blockIdx.x) * kWarps + size_t(warp)) * kCap + size_t(n)] =
          (uint64_t(e) << 56) | (uint64_t(clock64()) & ((uint64_t(1) << 56) - 1));
    ++n;
  }
};

}  // namespace trace
}  // namespace sm90
}  // namespace flamia
