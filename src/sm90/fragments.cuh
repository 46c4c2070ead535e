// Warp-level matmul pieces on mma.sync fragments (one warp = 16 rows of a 64-row tile).
//
// Lane l has g = l / 4 and q = l % 4. A warp's 16 x 64 FP32 tile ("TileAcc") is 8 n8-tiles;
// element [n][e] sits at row g + 8 (e >> 1), column 8 n + 2 q + (e & 1).
//
// Why no shuffles are needed to turn such a tile (P, Pᵀ, dS, dSᵀ) into an FP8 A operand:
// the m16n8k32 A fragment gives lane (g, q) the reduction indices 4q..4q+3 of each 16-wide
// half of the k32 step, and the transposed B operands store each 16-token group in
// fragment order (position 4qd + bb = token 8 (bb >> 1) + 2 qd + (bb & 1), layout.cuh). The
// tokens at positions 4q..4q+3 are 2q, 2q+1, 8+2q, 9+2q: exactly the columns this lane holds
// in n8-tiles 2t and 2t+1 of the accumulator.
#pragma once

#include <cstdint>

#include "flamia/formats.h"
#include "sm90/ptx.cuh"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {

using TileAcc = float[8][4];

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// ---- per-column values in the lanes' order ---------------------------------------------
// Position of column j's value in a per-column array (a tile's per-token scales, LSE, D)
// that the lanes read as accumulator columns: lane q uses columns 8 n + 2 q + {0, 1}, and
// stored as [n / 2][q][4] its four values of n8-tiles 2 m and 2 m + 1 are one float4 (one
// shared-memory load where the natural order takes two 8-byte ones), the four lanes of a
// quad 16 bytes apart (distinct banks).
__device__ __forceinline__ int lane_column_index(int j) {
  const int n = j >> 3, q = (j >> 1) & 3, b = j & 1;
  return 4 * (4 * (n >> 1) + q) + 2 * (n & 1) + b;
}
// load_scalar (tile_io.cuh) into that order: thread i (0..63) copies token i's value.
__device__ __forceinline__ void load_scalar_lane_ordered(uint32_t dst, const float* src, int valid, int i) {
  const bool ok = i < valid;
  ptx::cp_async_4(dst + 4 * lane_column_index(i), ok ? src + i : src, ok);
}

// ---- reductions over the 4 lanes that share a row --------------------------------------
__device__ __forceinline__ float quad_max_nan(float x) {
  x = ptx::max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return ptx::max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// scale[r] = pow2_scale(max |x| over row r of the tile) — the per-row scale of an operand
// computed in registers (sigma, tau, rho in ALGORITHM.md): one FMNMX per element (|x| is an
// operand modifier). A NaN element does not enter the maximum, but it quantizes to the NaN
// code, which makes its row's tile product NaN — the same row result as the specification's
// NaN scale (and an infinite element gives the NaN scale here too).
// kSelects: the select-only pow2_scale_e4m3 (no branch in the loop); the dK/dV pass at
// D = 128 keeps the branchy pow2_scale, with which ptxas fits it in 255 registers without
// spilling (collective/bwd_dkdv_mainloop.cuh).
template <bool kSelects = true>
__device__ __forceinline__ void row_pow2_scales(const TileAcc& x, float (&scale)[2]) {
  float m[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) m[e >> 1] = fmaxf(m[e >> 1], fabsf(x[n][e]));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float q = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
    q = fmaxf(q, __shfl_xor_sync(0xffffffffu, q, 2));
    scale[r] = kSelects ? fmt::pow2_scale_e4m3(q) : fmt::pow2_scale(q);
  }
}

// ---- forward epilogue ----------------------------------------------------------------
// Row r (0: g, 1: g + 8) of a D-wide forward accumulator as O = bf16(acc * (1 / l)) at o
// (this lane's first column), and, on the quad's first lane, LSE = (mc + log2 l) * ln 2
// (ALGORITHM.md §2): one division per row, not one per element.
template <int D>
__device__ __forceinline__ void store_o_row(uint16_t* o, float* lse, const float (&acc)[D / 8][4], int r, float l,
                                            float mc) {
  const float inv_l = __frcp_rn(l);
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    *reinterpret_cast<uint32_t*>(o + 8 * n) =
        ptx::pack_bf16x2(__fmul_rn(acc[n][2 * r], inv_l), __fmul_rn(acc[n][2 * r + 1], inv_l));
  if ((lane_id() & 3) == 0) *lse = __fmul_rn(__fadd_rn(mc, log2f(l)), 0.693147180559945309f);
}

// ---- fragment loads (ldmatrix) ---------------------------------------------------------
// A operand, 16 rows from row0 of a K-major FP8 tile, k32 step ks.
template <int kStride>
__device__ __forceinline__ void load_a_fp8(uint32_t tile, int row0, int ks, uint32_t (&a)[4]) {
  const int l = lane_id();
  const int row = row0 + (l & 7) + 8 * ((l >> 3) & 1);
  ptx::ldmatrix_x4(tile + row * kStride + 32 * ks + 16 * (l >> 4), a);
}

// B operand of n8-tiles 2p and 2p+1 (tile rows 16p..16p+15), k32 step ks:
// b[0], b[1] for n8-tile 2p; b[2], b[3] for 2p+1.
template <int kStride>
__device__ __forceinline__ void load_b_fp8_pair(uint32_t tile, int p, int ks, uint32_t (&b)[4]) {
  const int l = lane_id();
  const int row = 16 * p + (l & 7) + 8 * (l >> 4);
  ptx::ldmatrix_x4(tile + row * kStride + 32 * ks + 16 * ((l >> 3) & 1), b);
}

// B operand of n8-tile n of a transposed tile (rows 8n..8n+7), both k32 steps of its 64
// positions: b[0], b[1] for positions 0..31; b[2], b[3] for 32..63.
template <int kStride>
__device__ __forceinline__ void load_b_fp8_k64(uint32_t tile, int n, uint32_t (&b)[4]) {
  const int l = lane_id();
  ptx::ldmatrix_x4(tile + (8 * n + (l & 7)) * kStride + 16 * (l >> 3), b);
}

// ---- accumulator -> A operand ----------------------------------------------------------
// The FP8 A-fragment registers of n8-tiles 2 n2 and 2 n2 + 1 (their values lo and hi, each
// taken through v(value, r) for row g + 8 r): k32 step n2 / 2, registers 2 (n2 % 2) + r, the
// fragment order derived above. The one place that order is written: the forward's P8 and
// the backward's operands use it.
template <int kSteps, class V>
__device__ __forceinline__ void pack_e4m3_a_pair(const float (&lo)[4], const float (&hi)[4], int n2,
                                                 uint32_t (&a)[kSteps][4], V v) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
    a[n2 / 2][2 * (n2 % 2) + r] =
        ptx::pack_e4m3x4(v(lo[2 * r], r), v(lo[2 * r + 1], r), v(hi[2 * r], r), v(hi[2 * r + 1], r));
}
template <int kSteps>
__device__ __forceinline__ void pack_e4m3_a_pair(const float (&lo)[4], const float (&hi)[4], int n2,
                                                 uint32_t (&a)[kSteps][4]) {
  pack_e4m3_a_pair(lo, hi, n2, a, [](float x, int) { return x; });
}

// FP8 A fragments of the two k32 steps of a 16 x 64 tile: q8(x, scale[row]) with
// inv_scale = 1 / scale (exact for powers of two); kScaled = false: x is divided already.
template <bool kScaled>
__device__ __forceinline__ void pack_fp8_a_fragments(const TileAcc& x, const float (&inv_scale)[2],
                                                     uint32_t (&a)[2][4]) {
#pragma unroll
  for (int n2 = 0; n2 < 4; ++n2)
    pack_e4m3_a_pair(x[2 * n2], x[2 * n2 + 1], n2, a,
                     [&](float e, int r) { return kScaled ? __fmul_rn(e, inv_scale[r]) : e; });
}
__device__ __forceinline__ void pack_fp8_a(const TileAcc& x, const float (&inv_scale)[2], uint32_t (&a)[2][4]) {
  pack_fp8_a_fragments<true>(x, inv_scale, a);
}
// The same fragments from a tile already divided by its scale (codes e4m3(x)).
__device__ __forceinline__ void pack_fp8_a_prescaled(const TileAcc& x, uint32_t (&a)[2][4]) {
  const float unused[2] = {1.0f, 1.0f};
  pack_fp8_a_fragments<false>(x, unused, a);
}

// The FP8 A operand of a tile with per-row scales: scale = row_pow2_scales(x), fragments
// q8(x, scale[row]) through the exact reciprocals.
template <bool kSelects = true>
__device__ __forceinline__ void pack_fp8_a_row_scaled(const TileAcc& x, float (&scale)[2], uint32_t (&a)[2][4]) {
  row_pow2_scales<kSelects>(x, scale);
  const float inv[2] = {fmt::pow2_reciprocal(scale[0]), fmt::pow2_reciprocal(scale[1])};
  pack_fp8_a(x, inv, a);
}

// BF16 A fragments of the four k16 steps of a 16 x 64 tile (accumulator order = k order).
__device__ __forceinline__ void pack_bf16_a(const TileAcc& x, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        a[s][2 * h + r] = ptx::pack_bf16x2(x[2 * s + h][2 * r], x[2 * s + h][2 * r + 1]);
}

// ---- matmuls -----------------------------------------------------------------------------
// s = A · Bᵀ reduced over D: A = 16 rows (row0..row0+15) and B = 64 rows of natural FP8
// tiles in shared memory — the score-like products S = Q Kᵀ, dP = dO Vᵀ (and Sᵀ, dPᵀ).
// A is read one k32 step at a time: fragments kept in registers across a loop cost twice
// their size once the sm_90 emulation unpacks them to f16.
template <int D>
__device__ __forceinline__ void mma_rows(TileAcc& s, uint32_t a_tile, int row0, uint32_t b_tile) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks) {
    uint32_t a[4];
    load_a_fp8<Fp8RowTile<D>::kStride>(a_tile, row0, ks, a);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t b[4];
      load_b_fp8_pair<Fp8RowTile<D>::kStride>(b_tile, p, ks, b);
      ptx::mma_e4m3_16x8x32(s[2 * p], a, b[0], b[1]);
      ptx::mma_e4m3_16x8x32(s[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// acc = acc * alpha[row] + scale[row] * (A · B) for every n8-tile of D, where A holds FP8
// fragments over 64 tokens and B is a transposed FP8 tile. Each tile product is formed in a
// fresh FP32 accumulator first (ALGORITHM.md: long reductions do not rely on the tensor
// core's internal accumulation); scale is a power of two, so scale * product is exact.
template <int D>
__device__ __forceinline__ void accumulate_fp8_k64(float (&acc)[D / 8][4], const uint32_t (&a)[2][4],
                                                   uint32_t bt_tile, const float (&scale)[2],
                                                   const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    uint32_t b[4];
    load_b_fp8_k64<Fp8ColTile<D>::kStride>(bt_tile, n, b);
    float fresh[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ptx::mma_e4m3_16x8x32(fresh, a[0], b[0], b[1]);
    ptx::mma_e4m3_16x8x32(fresh, a[1], b[2], b[3]);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = __fadd_rn(__fmul_rn(acc[n][e], alpha[e >> 1]), __fmul_rn(scale[e >> 1], fresh[e]));
  }
}

}  // namespace sm90
}  // namespace flamia
