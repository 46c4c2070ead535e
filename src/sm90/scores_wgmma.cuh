// The one definition of S that the forward, the dK/dV pass (Sᵀ) and the dQ pass share.
//
// FP8 wgmma does not add in FP32 (docs/NUMERICS.md §5): the bits of S depend on the
// instruction and on how the k-steps are grouped. The backward rebuilds
// P = exp2(S c - lse2) from the forward's LSE, so unless both compute S with the same
// instruction sequence, P can exceed 1 by a factor exp2(c ΔS), which at logits ~1e6 is
// Inf. The contract, for a 64-row tile A and an N-row tile B of one (query, key) tile pair:
//
//   S tile = wgmma.mma_async m64nNk32.f32.e4m3.e4m3, A = 64 rows x D and B = N rows x D,
//            both FP8 E4M3 codes in shared memory, K-major (in any layout wgmma reads:
//            core matrices or TMA's swizzle); D/32 k32 steps chained in one accumulator in
//            ascending k (scale-d = 0 on the first, 1 after); then S = (acc * sq[i]) * sk[j]
//            in FP32, left to right (docs/ALGORITHM.md §3).
//
// The forward uses A = Q, B = K; the dQ pass the same; the dK/dV pass A = K, B = Q and
// reads Sᵀ, which relies on the tensor core's sum being the same for (Q Kᵀ)ᵀ and K Qᵀ (the
// same 32 products per k32 step) and on the bits not depending on N. Only N = 64 is
// issued here (wgmma::mma_ss); an N = 128 caller needs the m64n128 instruction with the
// same k order.
#pragma once

#include <cstdint>

#include "sm90/fragments.cuh"
#include "sm90/tile_io.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {

// Both operands of S: 64 tokens x D FP8 codes in K-major core matrices (load_kmajor_rows).
template <int D>
using ScoreTile = wgmma::KMajorTile<kTileTokens, D>;

// Where B lives: a ScoreTile, or (kSwizzledB) the same 64 rows of D codes as TMA lands them
// in a D-byte swizzle (mma::SwizzledRows<D>; the backward's streamed stages). The layout only
// changes where wgmma reads the bytes, not the products or their order, so S keeps the
// contract above; A is always a ScoreTile (each operand has its own descriptor).
template <int D, bool kSwizzledB>
__device__ __forceinline__ uint64_t score_b_desc(uint32_t b_tile, int ks) {
  if constexpr (kSwizzledB) return mma::desc<D>(b_tile, ks);
  else return wgmma::desc<ScoreTile<D>>(b_tile, ks);
}

// Issues the D/32 chained k-steps of A Bᵀ reduced over D (A rows x B rows) into acc and
// commits them as one wgmma group. S is this product of the Q and K tiles; the backward's dP
// (dO, V) and dPᵀ (V, dO) are the same instruction sequence, which the specification's dP
// follows (ALGORITHM.md §6). The caller fences before (wgmma::fence) and waits and pins acc
// after; the result is the raw dot product of codes.
template <int D, bool kSwizzledB = false>
__device__ __forceinline__ void issue_row_dots(TileAcc& acc, uint32_t a_tile, uint32_t b_tile) {
  wgmma::mma_ss<false>(acc, wgmma::desc<ScoreTile<D>>(a_tile, 0), score_b_desc<D, kSwizzledB>(b_tile, 0));
#pragma unroll
  for (int ks = 1; ks < D / 32; ++ks)
    wgmma::mma_ss<true>(acc, wgmma::desc<ScoreTile<D>>(a_tile, ks), score_b_desc<D, kSwizzledB>(b_tile, ks));
  wgmma::commit();
}

// S (or Sᵀ): the raw dot products, to be scaled by score() (the backward folds the same
// powers of two into one scale product per pair, collective/bwd_products.cuh).
template <int D, bool kSwizzledB = false>
__device__ __forceinline__ void issue_scores(TileAcc& s, uint32_t a_tile, uint32_t b_tile) {
  issue_row_dots<D, kSwizzledB>(s, a_tile, b_tile);
}

// S of one pair from the tensor core's dot product: (dot * sq) * sk, whichever operand
// was A (sq, sk are powers of two, so the order only matters at FP32 under/overflow).
__device__ __forceinline__ float score(float dot, float sq, float sk) {
  return __fmul_rn(__fmul_rn(dot, sq), sk);
}

}  // namespace sm90
}  // namespace flamia
