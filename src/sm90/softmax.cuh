// Forward online softmax per query row, exactly as ALGORITHM.md §2 orders the rounding:
// running max m (NaN-propagating), mc = m * c, p = exp2(fmaf(S, c, -mc)),
// alpha = exp2(mc_old - mc) (0 on the first tile), l = l * alpha + rowsum(p).
// Each lane holds two rows (g and g + 8); the 4 lanes of a quad share them.
#pragma once

#include "sm90/fragments.cuh"
#include "sm90/ptx.cuh"

namespace flamia {
namespace sm90 {

struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY};
  float mc[2] = {0.0f, 0.0f};
  float l[2] = {0.0f, 0.0f};

  // s: scores of one key tile, masked entries -inf. Turns s into p (masked -> exp2(-inf) = 0)
  // and returns the factor alpha that rescales what was accumulated before this tile.
  __device__ __forceinline__ void step(TileAcc& s, float c, float (&alpha)[2]) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e >> 1] = ptx::max_nan(tile_max[e >> 1], s[n][e]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = ptx::max_nan(m[r], quad_max_nan(tile_max[r]));
      const float mc_new = __fmul_rn(m_new, c);
      alpha[r] = m[r] == -INFINITY ? 0.0f : ptx::ex2(__fsub_rn(mc[r], mc_new));
      mc[r] = mc_new;
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = ptx::ex2(fmaf(s[n][e], c, -mc[e >> 1]));
        sum[e >> 1] = __fadd_rn(sum[e >> 1], s[n][e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = __fadd_rn(__fmul_rn(l[r], alpha[r]), quad_sum(sum[r]));
  }
};

}  // namespace sm90
}  // namespace flamia
