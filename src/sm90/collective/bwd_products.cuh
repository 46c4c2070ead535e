// The backward's per-pair arithmetic and its gradient products: P and dS of a pair, the A
// operand of a product reduced over a tile's 64 tokens (FP8 codes with per-row scales, or
// BF16), the products themselves (fresh accumulator then FP32 fold, or BF16 chained onto the
// sum) and the BF16 epilogue of a warp's rows.
#pragma once

#include <cstdint>

#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/fragments.cuh"
#include "sm90/kit/rows_out.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// P and dS of one visible (query, key) pair (ALGORITHM.md §3), from the two dot products
// and the pair's scale products s_comb = (sk c) sq and dp_comb = sdo sv. The scales are
// powers of two, so these products are exact and P = exp2(S c - lse2) and dP - D each keep
// the single rounding the specification gives them, at one multiply per pair instead of two
// (dP - D is one fused multiply-add). Callers zero masked pairs by selection, so nothing of
// a masked pair (a NaN scale, say) can reach a result. pair_p and pair_ds are the two
// halves, for a caller that forms P in one pass and dS in a later one (fp8_mixed's dK/dV).
__device__ __forceinline__ float pair_p(float s_dot, float s_comb, float lse2) {
  return ptx::ex2(fmaf(s_dot, s_comb, -lse2));
}
__device__ __forceinline__ float pair_ds(float p, float dp_dot, float dp_comb, float d) {
  return __fmul_rn(p, fmaf(dp_dot, dp_comb, -d));
}
struct PairGrad {
  float p, ds;
};
__device__ __forceinline__ PairGrad pair_grad(float s_dot, float dp_dot, float s_comb, float dp_comb, float lse2,
                                              float d) {
  const float p = pair_p(s_dot, s_comb, lse2);
  return {p, pair_ds(p, dp_dot, dp_comb, d)};
}

// The A operand of a product reduced over the tile's 64 tokens, from an accumulator-layout
// tile x: FP8 codes q8(x, scale[row]) with scale = pow2_scale(max |x| of the row) (fp8), or
// bf16(x) with scale 1 (fp8_mixed's dS).
template <bool kBf16>
struct TokenOperand {
  uint32_t a[kBf16 ? 4 : 2][4];  // k16 (BF16) or k32 (FP8) steps
  float scale[2];
};
template <bool kBf16, bool kSelects = true>
__device__ __forceinline__ TokenOperand<kBf16> token_operand(const TileAcc& x) {
  TokenOperand<kBf16> op;
  if constexpr (kBf16) {
    pack_bf16_a(x, op.a);
    op.scale[0] = op.scale[1] = 1.0f;
  } else {
    pack_fp8_a_row_scaled<kSelects>(x, op.scale, op.a);
  }
  return op;
}

// dV's A operand: x is P · sdo / sigma already, with one sigma for the whole tile (codes
// e4m3(x), no per-row maximum: ALGORITHM.md §3).
__device__ __forceinline__ TokenOperand<false> token_operand_prescaled(const TileAcc& x, float sigma) {
  TokenOperand<false> op;
  pack_fp8_a_prescaled(x, op.a);
  op.scale[0] = op.scale[1] = sigma;
  return op;
}

// acc += scale[row] * (A · B) for an FP8 operand: the tile product in a fresh accumulator
// (scale-d 0 on the first step, the steps chained in ascending token order), then scaled and
// added in FP32: by one fused multiply-add (kLast) or a multiply and an add, the same bits,
// as the scale is a power of two and the product exact. B at shared address bt: D rows of
// 64 token positions as TMA lands them (a 64-byte swizzle).
// In two halves, so that other MMAs can be issued between them: issue_token_product starts
// the product (one committed group), fold_token_product waits until at most kPending groups
// committed after it are pending, then folds.
template <int D>
__device__ __forceinline__ void issue_token_product(float (&fresh)[D / 8][4], TokenOperand<false>& op, uint32_t bt) {
  wgmma::pin(op.a);  // the operand is final before the fence
  wgmma::fence();
  wgmma::mma_rs<false>(fresh, op.a[0], mma::desc<kTileTokens>(bt, 0));
  wgmma::mma_rs<true>(fresh, op.a[1], mma::desc<kTileTokens>(bt, 1));
  wgmma::commit();
}
template <int D, bool kLast, int kPending>
__device__ __forceinline__ void fold_token_product(float (&acc)[D / 8][4], float (&fresh)[D / 8][4],
                                                   TokenOperand<false>& op) {
  wgmma::wait<kPending>();
  wgmma::pin(fresh);
  wgmma::pin(op.a);  // registers read by the MMA stay untouched until it is done
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = kLast ? fmaf(op.scale[e >> 1], fresh[n][e], acc[n][e])
                        : __fadd_rn(acc[n][e], __fmul_rn(op.scale[e >> 1], fresh[n][e]));
}
template <int D, bool kLast>
__device__ __forceinline__ void accumulate_token_product(float (&acc)[D / 8][4], TokenOperand<false>& op, uint32_t bt) {
  float fresh[D / 8][4];
  issue_token_product<D>(fresh, op, bt);
  fold_token_product<D, kLast, 0>(acc, fresh, op);
}
// fp8_mixed's BF16 products (dS·Q, dS·K, Pᵀ·dO; scale 1) need no fresh accumulator: a k16
// step keeps 23 fraction bits (ALGORITHM.md §3, §6), so the product is chained onto the FP32
// sum itself, with no fold. B is the caller's BF16 rows at bt, MN-major (mma::desc_natural:
// 64 token rows of each 64-element block of d). chained_product_done waits for it as
// fold_token_product would (ptxas serializes every wgmma of a kernel where a chained product
// stays in flight across a loop iteration: C7515), and keeps op.a's registers from reuse
// until then.
template <int D>
__device__ __forceinline__ void chain_token_product(float (&acc)[D / 8][4], TokenOperand<true>& op, uint32_t bt) {
  wgmma::pin(op.a);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma::mma_rs_bf16_bn<true>(acc, op.a[ks], mma::desc_natural(bt, ks));
  wgmma::commit();
}
template <int D, int kPending>
__device__ __forceinline__ void chained_product_done(float (&acc)[D / 8][4], TokenOperand<true>& op) {
  wgmma::wait<kPending>();
  wgmma::pin(acc);
  wgmma::pin(op.a);
}

// The passes' rows out by TMA (kit/rows_out.cuh) synchronize each warpgroup on its own barrier.
constexpr int kEpilogueBarrier = warpgroup::kFirstNamedBarrier + 3;  // + the warpgroup's index

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
