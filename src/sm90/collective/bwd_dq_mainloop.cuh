// The dQ pass's step: S and dP of a key tile for a warpgroup's 64 queries, and dQ's A operand
// from them.
#pragma once

#include <cstdint>

#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/collective/bwd_products.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/ptx.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// S and dP of the key tile in `stage` for the 64 queries at `queries` (a warpgroup's
// DqSmem::queries): issued, two committed groups.
template <int D, bool kMixed>
__device__ __forceinline__ void issue_dq_scores(TileAcc& s, TileAcc& dp, const uint8_t* smem, int queries, int stage) {
  using S = DqSmem<D, kMixed>;
  const uint32_t base = ptx::smem_addr(smem), st = base + S::stage(stage), qb = base + queries;
  wgmma::fence();
  issue_scores<D, true>(s, qb + S::kQ, st + S::kK);    // S = Q Kᵀ, as the forward
  issue_row_dots<D, true>(dp, qb + S::kDo, st + S::kV);  // dP = dO Vᵀ
}

// dQ's A operand of one key tile from its landed S and dP, this warp's 16 query rows i0,
// i0 + 8 (document positions): q8(dS sk / rho) (fp8) or bf16(dS) (fp8_mixed).
template <int D, bool kMixed, bool kMask>
__device__ __forceinline__ TokenOperand<kMixed> dq_operand_of_tile(const uint8_t* smem, int queries, int stage,
                                                                   const DocMask& mask, int i0, int n0, float c,
                                                                   TileAcc& s, const TileAcc& dp) {
  using S = DqSmem<D, kMixed>;
  const float* sk = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSk);
  const float* sv = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSv);
  const int q = lane_id() & 3, row0 = 16 * (warp_id() & 3);
  // This lane's query rows are row0 + g and row0 + g + 8 of the warpgroup's 64 queries.
  float sq[2], sdo[2], lse2[2], d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + (lane_id() >> 2) + 8 * r;
    sq[r] = reinterpret_cast<const float*>(smem + queries + S::kSq)[i];
    sdo[r] = reinterpret_cast<const float*>(smem + queries + S::kSdo)[i];
    lse2[r] = reinterpret_cast<const float*>(smem + queries + S::kLse)[i];
    d[r] = reinterpret_cast<const float*>(smem + queries + S::kDvec)[i];
  }

  // A query row sees a prefix of the tile's keys (masks.cuh, visible_keys_of_lane).
  int seen[2] = {0, 0};
  if constexpr (kMask) mask.visible_keys_of_lane(i0, n0, q, seen);
  // In place: s <- dS * sk (fp8) or dS (fp8_mixed).
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      const int at = lane_column_index(col);  // the stage's key values are in the lanes' order
      const bool visible = !kMask || 8 * n + (e & 1) < seen[r];
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], __fmul_rn(__fmul_rn(sk[at], c), sq[r]),
                                    __fmul_rn(sdo[r], sv[at]), lse2[r], d[r]);
      s[n][e] = visible ? (kMixed ? pg.ds : __fmul_rn(pg.ds, sk[at])) : 0.0f;
    }
  return token_operand<kMixed>(s);
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
