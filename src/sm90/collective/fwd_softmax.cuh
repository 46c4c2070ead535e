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
// Row reductions run over kChains independent partial results (merged at the end): a single
// chain of 32 dependent FMNMX/FADD per row would leave the warp waiting on each result.
// Max is order-free; the specification leaves the addition order inside a tile free.
// (Measured on H200: 1, 2 and 4 chains time the same within 2 %; docs/PERFORMANCE.md v5.)
constexpr int kChains = 4;

// s: Q·Kᵀ of the tile (raw sums). sk, sv: the tile's key scales in the producer's per-lane
// order (scales_index). i0: this lane's first row, n0: the tile's first key, both
// document-local. Masks per element only when kMask.
template <bool kMask>
__device__ __forceinline__ void softmax_tile(ScoreTile& s, const float* sk, const float* sv,
                                             const float (&sq)[2], const float (&sqc)[2], const DocMask& mask,
                                             int i0, int n0, float c, RowState& st, TileP& out) {
  const int q = lane_id() & 3;
  const float4* sk4 = reinterpret_cast<const float4*>(sk) + q;  // step m at sk4[4 m]
  const float4* sv4 = reinterpret_cast<const float4*>(sv) + q;
  float tmax[2][kChains];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kChains; ++k) tmax[r][k] = -INFINITY;
#pragma unroll
  for (int n2 = 0; n2 < 8; ++n2) {
    const float4 k4 = sk4[4 * n2];  // columns of n8-tiles 2 n2 and 2 n2 + 1
    const float skv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = 2 * n2 + h;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float t = __fmul_rn(s[n][e], skv[2 * h + (e & 1)]);
        if (kMask && !mask.visible(i0 + 8 * (e >> 1), n0 + 8 * n + 2 * q + (e & 1))) t = -INFINITY;
        s[n][e] = t;
        float& m = tmax[e >> 1][(2 * n + (e & 1)) % kChains];
        m = ptx::max_nan(m, t);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = tmax[r][0];
#pragma unroll
    for (int k = 1; k < kChains; ++k) tile_max = ptx::max_nan(tile_max, tmax[r][k]);
    const float m_new = ptx::max_nan(st.m[r], __fmul_rn(quad_max_nan(tile_max), sq[r]));
    st.mc[r] = __fmul_rn(m_new, c);
    out.alpha[r] = st.m[r] == -INFINITY ? 0.0f : ptx::ex2(__fmaf_rn(st.m[r], c, -st.mc[r]));
    st.m[r] = m_new;
  }
  // p = exp2(S c - mc), row sums of the unquantized p, then x = p * sv[j] (V's scale folded
  // in: V is summed over j) and its row maximum for sigma. x >= 0 or NaN, so the float
  // maximum orders like |x|.
  float sum[2][kChains], xmax[2][kChains];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kChains; ++k) sum[r][k] = xmax[r][k] = 0.0f;
#pragma unroll
  for (int n2 = 0; n2 < 8; ++n2) {
    const float4 v4 = sv4[4 * n2];
    const float svv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = 2 * n2 + h;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, k = (2 * n + (e & 1)) % kChains;
        const float p = ptx::ex2(__fmaf_rn(s[n][e], sqc[r], -st.mc[r]));
        sum[r][k] = __fadd_rn(sum[r][k], p);
        float x = __fmul_rn(p, svv[2 * h + (e & 1)]);
        if (kMask && !mask.visible(i0 + 8 * r, n0 + 8 * n + 2 * q + (e & 1))) x = 0.0f;
        s[n][e] = x;
        xmax[r][k] = ptx::max_nan(xmax[r][k], x);
      }
    }
  }
  float inv_sigma[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float row_sum = sum[r][0], row_xmax = xmax[r][0];
#pragma unroll
    for (int k = 1; k < kChains; ++k) {
      row_sum = __fadd_rn(row_sum, sum[r][k]);
      row_xmax = ptx::max_nan(row_xmax, xmax[r][k]);
    }
    st.l[r] = __fadd_rn(__fmul_rn(st.l[r], out.alpha[r]), quad_sum(row_sum));
    out.sigma[r] = fmt::pow2_scale(quad_max_nan(row_xmax));
    inv_sigma[r] = fmt::pow2_reciprocal(out.sigma[r]);
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

// Position of key j's scale in the tile's scale array. Lane q uses the columns
// 8 n + 2 q + {0, 1} (n = 0..15); stored as [n / 2][q][4], its four floats for n8-tiles
// 2 m and 2 m + 1 are one float4, and the four lanes' float4 of one step are 16 bytes apart
// (distinct banks, no conflict).
__device__ __forceinline__ int scales_index(int j) {
  const int n = j >> 3, q = (j >> 1) & 3, b = j & 1;
  return 4 * (4 * (n >> 1) + q) + 2 * (n & 1) + b;
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
