// The forward's per-tile softmax and P quantization for one consumer warpgroup's 64 x 128
// score tile (ALGORITHM.md §2), in registers: lane (g, q) of warp w holds rows 16 w + g and
// 16 w + g + 8, columns 8 n + 2 q + {0, 1} of n8-tile n (n = 0..15).
//
// Instruction economy (the forward is issue-bound): the scores are left as t = sum * sk[j]
// and the row's scale enters once per row through sqc = sq[i] * c:
//   S * c = (sum * sq[i] * sk[j]) * c = t * sqc    (all factors but c are powers of two)
// so fmaf(t, sqc, -mc) rounds the same exact product that fmaf(S, c, -mc) does in the
// specification, and max_j S_j = sq[i] * max_j t_j. Masked entries are selected away before
// any maximum, so nothing masked (not even a NaN scale) reaches a result.
#pragma once

#include <cmath>

#include "flamia/formats.h"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/ptx.cuh"

namespace flamia {
namespace sm90 {
namespace fwd {

using ScoreTile = float[16][4];  // m64n128 accumulator fragment

struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // running max of S (NaN-propagating)
  float mc[2] = {0.0f, 0.0f};           // m * c of the last tile
  float l[2] = {0.0f, 0.0f};            // running sum of p
};

// What one key tile hands to its P·V product: the FP8 A operand, P's per-row scale sigma and
// the factor alpha that rescales the rows' earlier accumulation.
struct TileP {
  uint32_t p8[4][4];  // k32 step kk, register r
  float sigma[2], alpha[2];
};

// s: Q·Kᵀ of the tile (raw sums). i0: this lane's first row, n0: the tile's first key, both
// document-local. Masks per element only when kMask.
template <bool kMask>
__device__ __forceinline__ void softmax_tile(ScoreTile& s, const float* sk, const float* sv,
                                             const float (&sq)[2], const float (&sqc)[2], const DocMask& mask,
                                             int i0, int n0, float c, RowState& st, TileP& out) {
  const int q = lane_id() & 3;
  float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const float2 skj = *reinterpret_cast<const float2*>(sk + 8 * n + 2 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float t = __fmul_rn(s[n][e], (e & 1) ? skj.y : skj.x);
      if (kMask && !mask.visible(i0 + 8 * (e >> 1), n0 + 8 * n + 2 * q + (e & 1))) t = -INFINITY;
      s[n][e] = t;
      tmax[e >> 1] = ptx::max_nan(tmax[e >> 1], t);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = ptx::max_nan(st.m[r], __fmul_rn(quad_max_nan(tmax[r]), sq[r]));
    st.mc[r] = __fmul_rn(m_new, c);
    out.alpha[r] = st.m[r] == -INFINITY ? 0.0f : ptx::ex2(__fmaf_rn(st.m[r], c, -st.mc[r]));
    st.m[r] = m_new;
  }
  // p = exp2(S c - mc), row sums of the unquantized p, then x = p * sv[j] (V's scale folded
  // in: V is summed over j) and its row maximum for sigma. x >= 0 or NaN, so the float
  // maximum orders like |x|.
  float sum[2] = {0.0f, 0.0f}, xmax[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const float2 svj = *reinterpret_cast<const float2*>(sv + 8 * n + 2 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float p = ptx::ex2(__fmaf_rn(s[n][e], sqc[r], -st.mc[r]));
      sum[r] = __fadd_rn(sum[r], p);
      float x = __fmul_rn(p, (e & 1) ? svj.y : svj.x);
      if (kMask && !mask.visible(i0 + 8 * r, n0 + 8 * n + 2 * q + (e & 1))) x = 0.0f;
      s[n][e] = x;
      xmax[r] = ptx::max_nan(xmax[r], x);
    }
  }
  float inv_sigma[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st.l[r] = __fadd_rn(__fmul_rn(st.l[r], out.alpha[r]), quad_sum(sum[r]));
    out.sigma[r] = fmt::pow2_scale(quad_max_nan(xmax[r]));
    inv_sigma[r] = __frcp_rn(out.sigma[r]);
  }
  // A operand of k32 step kk: registers 2h + r hold row g + 8 r, keys of 16-key group
  // 2 kk + h in the quantizer's fragment order (layout.cuh): n8-tiles 4 kk + 2 h and + 1.
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = 4 * kk + 2 * h;
        const float is = inv_sigma[r];
        out.p8[kk][2 * h + r] =
            ptx::pack_e4m3x4(__fmul_rn(s[n][2 * r], is), __fmul_rn(s[n][2 * r + 1], is),
                             __fmul_rn(s[n + 1][2 * r], is), __fmul_rn(s[n + 1][2 * r + 1], is));
      }
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
