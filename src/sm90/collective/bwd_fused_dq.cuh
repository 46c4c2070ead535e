// The fused dQ (FLAMIA_BWD_DQ=fused): the dK/dV pass's dQ partials by BF16 wgmma from shared
// memory, added to an FP32 accumulator in global memory.
#pragma once

#include <cstdint>

#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/collective/bwd_stored_ds.cuh"
#include "sm90/fragments.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// The fused dQ (FLAMIA_BWD_DQ=fused; fp8_mixed at D = 128): the dK/dV pass also forms each
// step's dQ partial, dS[64 queries x the CTA's 128 keys] · K[128 keys x D], as BF16 wgmma from
// shared memory, and adds it in FP32 to a dQ accumulator in global memory (the L2 performs
// the adds). Warpgroup w stores its dSᵀ transposed into chunk w of the step's dS buffer; once
// both have (a named barrier), warpgroup w multiplies the whole tile by its D/2 columns of
// k. Five matmuls a tile pair instead of seven, and no dQ pass; but the order in which the
// CTAs' partials reach a dQ row varies from run to run, so dQ is not deterministic (its bits
// can differ in the last place) and is not bitwise the specification's sum.
struct FusedDq {
  uint32_t ds_buffer;  // this step's dS buffer (chunk c at ds_buffer + c * kDsChunk)
  uint32_t kt;         // this warpgroup's block of D/2 columns of the CTA's k rows, chunk 0 (chunk c
                       // at + c * kKtChunk); rows past the document meet zeros of dS
                       // (bwd_natural_rows.cuh)
  float* rows;         // the accumulator at the query tile's first row, head and this warpgroup's columns
  int64_t row_stride;  // Hq * D
  int valid_rows;      // rows of the query tile inside the document
};
constexpr int kFusedDqBarrier = warpgroup::kFirstNamedBarrier;

// After both warpgroups stored their dS (each fenced its stores for the async proxy): this
// warpgroup's dQ partial, dq = dS · K[:, its D/2 columns], issued as one committed group.
template <int D, class S>
__device__ __forceinline__ void issue_fused_dq(float (&dq)[D / 16][4], const FusedDq& fz) {
  warpgroup::bar_sync(kFusedDqBarrier, kDkdvThreads);
  wgmma::fence();
#pragma unroll
  for (int c = 0; c < kDkdvWarpgroups; ++c)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t a = mma::desc<kBf16ColRowBytes>(fz.ds_buffer + c * S::kDsChunk, ks);
      const uint64_t b = mma::desc_natural(fz.kt + c * S::kKtChunk, ks);
      if (c == 0 && ks == 0) wgmma::mma_ss_bf16_bn<false>(dq, a, b);
      else wgmma::mma_ss_bf16_bn<true>(dq, a, b);
    }
  wgmma::commit();
}

// The partial's rows inside the document, added to the accumulator (8 bytes a reduction).
template <int D>
__device__ __forceinline__ void reduce_fused_dq(const FusedDq& fz, const float (&dq)[D / 16][4]) {
  const int row0 = 16 * (warp_id() & 3) + (lane_id() >> 2), q = lane_id() & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= fz.valid_rows) continue;
    float* p = fz.rows + row * fz.row_stride + 2 * q;
#pragma unroll
    for (int n = 0; n < D / 16; ++n) ptx::red_add_v2(p + 8 * n, dq[n][2 * r], dq[n][2 * r + 1]);
  }
}

// A step in which this warpgroup's keys are not seen (warpgroup 1 only: causal, its first
// query tile, or the document ends before them): its dS chunk is zeros, and it still meets
// the other at the barrier and forms its columns of dQ. (Skipping the chunk in the product
// instead puts a branch between wgmmas, around which ptxas injects warpgroup fences.)
template <int D, class S>
__device__ __forceinline__ void fused_dq_only(const FusedDq& fz) {
  store_ds_transposed(fz.ds_buffer + warpgroup::index() * S::kDsChunk, {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u},
                                                                        {0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}});
  wgmma::fence_proxy_async();
  float dq[D / 16][4];
  issue_fused_dq<D, S>(dq, fz);
  wgmma::wait<0>();
  wgmma::pin(dq);
  reduce_fused_dq<D>(fz, dq);
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
