// Phase clocks of the fast forward's consumer warps: when each warp's tiles reach the points
// that bound its phases (its stage wait begun and its stage landed, S done, softmax done, P·V
// done, fold done) and two points inside the softmax, read from the SM's cycle counter by
// lane 0. What ncu's per-instruction stall samples cannot show: how long each phase lasts
// tile by tile, and whether the consumer warps of a scheduler (two at D = 128, three at
// D = 64) are in their softmax at the same time. The production kernel takes `Off` (no
// code); FLAMIA_FWD_TRACE=FILE launches the kernel instantiated with `Clocks` and writes the
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
  kSoftmaxDone = 3,  // P8 of the tile is in registers (next: the next tile's stage wait, then its P·V)
  kPvDone = 4,       // P·V of the tile is done: the fold starts
  kFoldDone = 5,     // the fold is done (at D = 64 S(n + 1) is issued after it, before this mark)
  kItemEnd = 6,      // O of the item stored
  // Inside the softmax (fwd_softmax.cuh), between kScoresDone and kSoftmaxDone:
  kMaximaDone = 7,  // the rows' new maxima and alpha formed (after the key-scale wait, K's scales)
  kExpsDone = 8,    // the exps, their partial sums and P's V scale applied
  // Just before the next tile's stage wait (between kSoftmaxDone, or an item's set-up, and
  // kStageLanded): what precedes the barrier's wait and the wait itself, told apart.
  kStageWait = 9,
};

struct Off {
  __device__ __forceinline__ void mark(Event) {}
};

// The consumer warps of the first kCtas CTAs record up to kCap marks each (warp w of CTA b
// from clocks + (b kWarps + w) kCap; clocks: the traced kernel's parameter, read from the
// constant bank at each mark, so that the traced kernel keeps the production kernel's register
// allocation as nearly as it can), each the event in the top 8 bits and the low 56 bits of
// clock64; kFirstWarp: the first consumer warp of a CTA.
template <int kCtas, int kWarps, int kFirstWarp, int kCap>
struct Clocks {
  uint64_t* clocks;
  int n = 0;  // this warp's marks so far
  __device__ __forceinline__ void mark(Event e) {
    const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0) - kFirstWarp;  // warp-uniform
    if (int(blockIdx.x) >= kCtas || warp < 0 || n >= kCap) return;
    if (lane_id() == 0)
      clocks[(size_t(blockIdx.x) * kWarps + size_t(warp)) * kCap + size_t(n)] =
          (uint64_t(e) << 56) | (uint64_t(clock64()) & ((uint64_t(1) << 56) - 1));
    ++n;
  }
};

}  // namespace trace
}  // namespace sm90
}  // namespace flamia
