// The dK/dV pass's step: one query tile against a warpgroup's 64 keys — Sᵀ and dPᵀ, Pᵀ and
// dSᵀ, the dV and dK products, and the fused dQ's or the stored dS's part of the step.
#pragma once

#include <cstdint>

#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_fused_dq.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/collective/bwd_products.cuh"
#include "sm90/collective/bwd_stored_ds.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/ptx.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// Which of a lane's pairs its two key rows see: each row sees a run of the tile's query
// columns (masks.cuh, visible_queries), and element [n][e] is column 8 n + b (b = e & 1)
// counted from the lane's first column. Two forms of the same test: kBits keeps each row's
// run as bit n of seen[r][b], for a caller that reads every element's visibility in two
// passes (ptxas otherwise forms the predicates once and packs them into registers: four
// instructions an element); else two compares with a constant.
template <bool kBits>
struct LanePairs {
  int lo[2], hi[2];       // the runs, shifted to the lane's first column (compares)
  uint32_t seen[2][2];    // bit n: element [n][2 r + b] visible (kBits)
  __device__ __forceinline__ LanePairs(const DocMask& mask, int m0, int j0) {
    const int q = lane_id() & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const DocMask::Run run = mask.visible_queries(j0 + 8 * r, m0);
      lo[r] = run.lo - 2 * q;
      hi[r] = run.hi - 2 * q;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        // 8 n + b in [lo, hi)  <=>  n in [ceil((lo - b) / 8), ceil((hi - b) / 8)).
        const int n_lo = min(max((lo[r] - b + 7) >> 3, 0), 8), n_hi = min(max((hi[r] - b + 7) >> 3, 0), 8);
        seen[r][b] = ((1u << n_hi) - 1u) & ~((1u << n_lo) - 1u);
      }
    }
  }
  __device__ __forceinline__ bool visible(int n, int e) const {
    const int r = e >> 1, c = 8 * n + (e & 1);
    return kBits ? ((seen[r][e & 1] >> n) & 1u) != 0 : c >= lo[r] && c < hi[r];
  }
};

// Calls f(n, e, col, at, r, visible) for element [n][e] of a warpgroup's Sᵀ / dPᵀ tile (rows
// = keys, columns = queries): the element's query column col, the position of its per-query
// values in the stage (lane_column_index: a lane's values of two n8-tiles are one float4
// load), its key row r (0: j0, 1: j0 + 8) and whether that pair is visible.
template <bool kMask, bool kBits = false, class F>
__device__ __forceinline__ void for_each_pair(const DocMask& mask, int m0, int j0, F f) {
  const int q = lane_id() & 3;
  const LanePairs<kBits> pairs(mask, m0, j0);  // unused (and not computed) unless kMask
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      f(n, e, col, lane_column_index(col), r, !kMask || pairs.visible(n, e));
    }
}

// One query tile for the 64 keys at `keys` (a warpgroup's DkdvSmem::keys), this warp's 16
// key rows j0, j0 + 8 (document positions).
template <int D, bool kMixed, bool kFused, bool kStoreDs, bool kMask>
__device__ __forceinline__ void dkdv_query_tile(const uint8_t* smem, int keys, int stage, const DocMask& mask,
                                                int j0, int m0, float c, float (&dk)[D / 8][4],
                                                float (&dv)[D / 8][4], const FusedDq& fz, const StoredDs& sd) {
  using S = DkdvSmem<D, kMixed, kFused, kStoreDs>;
  const uint32_t base = ptx::smem_addr(smem), st = base + S::stage(stage), kb = base + keys;
  const uint8_t* st_ptr = smem + S::stage(stage);
  const float* sq = reinterpret_cast<const float*>(st_ptr + S::kSqT);
  const float* sdo = reinterpret_cast<const float*>(st_ptr + S::kSdoT);
  const float* lse2 = reinterpret_cast<const float*>(st_ptr + S::kLseT);
  const float* dvec = reinterpret_cast<const float*>(st_ptr + S::kDvecT);
  const int q = lane_id() & 3, row0 = 16 * (warp_id() & 3);
  // This lane's key rows are row0 + g and row0 + g + 8 of the warpgroup's 64 keys.
  float skc_row[2], sv_row[2];  // sk c, sv
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = row0 + (lane_id() >> 2) + 8 * r;
    skc_row[r] = __fmul_rn(reinterpret_cast<const float*>(smem + keys + S::kSk)[j], c);
    sv_row[r] = reinterpret_cast<const float*>(smem + keys + S::kSv)[j];
  }

  TileAcc s, dp;  // Sᵀ and dPᵀ: rows = keys, columns = queries
  wgmma::fence();
  issue_scores<D, true>(s, kb + S::kK, st + S::kQ);    // Sᵀ = K Qᵀ
  issue_row_dots<D, true>(dp, kb + S::kV, st + S::kDo);  // dPᵀ = V dOᵀ
  if constexpr (kStoreDs && !kMixed) {
    if (sd.pending_tile != nullptr)
      store_fp8_ds_rows(sd.pending_chunk, sd.pending_tile, DkdvSmem<D, kMixed, false, true>::kStagingRowFloats);
  }
  // fp8: dV's operand scale while the MMAs run: P <= 1, so the tile's largest sdo bounds
  // every P · sdo, and sigma = pow2_scale(that) serves every key (ALGORITHM.md §3). A quad's
  // lanes hold all 64 columns; columns past the document hold 0 (their sdo is zero-filled),
  // and fmaxf skips a NaN scale, whose query then poisons only the keys that see it (by its
  // NaN lse2), as the specification's does. fp8_mixed's dV operand is bf16(Pᵀ), unscaled.
  float sigma = 1.0f, inv_sigma = 1.0f;
  if constexpr (!kMixed) {
    float sdo_max = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
      sdo_max = fmaxf(sdo_max, fmaxf(sdo[lane_column_index(8 * n + 2 * q)], sdo[lane_column_index(8 * n + 2 * q + 1)]));
    sdo_max = fmaxf(sdo_max, __shfl_xor_sync(0xffffffffu, sdo_max, 1));
    sdo_max = fmaxf(sdo_max, __shfl_xor_sync(0xffffffffu, sdo_max, 2));
    sigma = fmt::pow2_scale_e4m3(sdo_max);
    inv_sigma = fmt::pow2_reciprocal(sigma);
  }
  wgmma::wait<0>();
  wgmma::pin(s);
  wgmma::pin(dp);
  if constexpr (kMixed) {
    // fp8_mixed at D = 128: dV's operand bf16(Pᵀ) needs only Sᵀ, so its product is issued
    // first and runs on the tensor core while dSᵀ is formed (pair_grad's operations in two
    // passes: the same bits). At D = 64 that order was 0.8 % slower (docs/PERFORMANCE.md
    // v34): one pass forms both, and both products follow.
    constexpr bool kDvFirst = D == 128;
    for_each_pair<kMask, kDvFirst>(mask, m0, j0, [&](int n, int e, int col, int at, int r, bool visible) {
      const float s_comb = __fmul_rn(skc_row[r], sq[at]);
      if constexpr (kDvFirst) {
        s[n][e] = visible ? pair_p(s[n][e], s_comb, lse2[at]) : 0.0f;
      } else {
        const PairGrad pg = pair_grad(s[n][e], dp[n][e], s_comb, __fmul_rn(sdo[at], sv_row[r]), lse2[at], dvec[at]);
        s[n][e] = visible ? pg.p : 0.0f;
        dp[n][e] = visible ? pg.ds : 0.0f;
      }
    });
    TokenOperand<true> pv = token_operand<true>(s);
    if constexpr (kDvFirst) {
      chain_token_product<D>(dv, pv, st + S::kDot);
      // dS = P (dP - D): pair_grad's second half, on the P just formed.
      for_each_pair<kMask, true>(mask, m0, j0, [&](int n, int e, int col, int at, int r, bool visible) {
        const float ds = pair_ds(s[n][e], dp[n][e], __fmul_rn(sdo[at], sv_row[r]), dvec[at]);
        dp[n][e] = visible ? ds : 0.0f;
      });
    }
    TokenOperand<true> ds = token_operand<true>(dp);
    const uint32_t dk_b = st + S::kQt;
    if constexpr (kFused) {
      store_ds_transposed(fz.ds_buffer + warpgroup::index() * S::kDsChunk, ds.a);
      wgmma::fence_proxy_async();  // the stores, visible to both warpgroups' wgmma
    }
    // Both BF16 products chained onto their sums (no fresh accumulator, no fold); one wait.
    chain_token_product<D>(dk, ds, dk_b);
    if constexpr (!kDvFirst) chain_token_product<D>(dv, pv, st + S::kDot);
    if constexpr (kFused) {
      float dq[D / 16][4];
      issue_fused_dq<D, S>(dq, fz);
      chained_product_done<D, 0>(dk, ds);
      wgmma::pin(dq);
      wgmma::pin(dv);
      wgmma::pin(pv.a);
      reduce_fused_dq<D>(fz, dq);
    } else {
      // The stored dS leaves while dK's product runs (its reads of ds.a change nothing).
      if constexpr (kStoreDs) store_ds_tile(sd, ds.a);
      chained_product_done<D, 0>(dk, ds);
      wgmma::pin(dv);
      wgmma::pin(pv.a);
    }
  } else {
    // fp8: in place, s <- Pᵀ * sdo / sigma (dV's operand) and dp <- dSᵀ * sq (dK's); with
    // the stored dS also x = dS sk (dQ's, before its row scale) into the staging chunk, as
    // query rows (row stride kStagingRowFloats: a warp's 32 writes hit 32 banks).
    [[maybe_unused]] float sk_row[2];
    [[maybe_unused]] uint32_t staged = 0;
    if constexpr (kStoreDs) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        sk_row[r] = reinterpret_cast<const float*>(smem + keys + S::kSk)[row0 + (lane_id() >> 2) + 8 * r];
    }
    for_each_pair<kMask>(mask, m0, j0, [&](int n, int e, int col, int at, int r, bool visible) {
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], __fmul_rn(skc_row[r], sq[at]),
                                    __fmul_rn(sdo[at], sv_row[r]), lse2[at], dvec[at]);
      s[n][e] = visible ? __fmul_rn(pg.p, __fmul_rn(sdo[at], inv_sigma)) : 0.0f;
      dp[n][e] = visible ? __fmul_rn(pg.ds, sq[at]) : 0.0f;
      if constexpr (kStoreDs) {
        const float x = visible ? __fmul_rn(pg.ds, sk_row[r]) : 0.0f;
        const int key = row0 + (lane_id() >> 2) + 8 * r;
        // Not volatile and no "memory" clobber, or the compiler reloads every per-query
        // value (sq, sdo, LSE, D) after each store; the token it yields is an input of the
        // barrier before the row pass, which keeps the store and orders it.
        uint32_t t;
        asm("st.shared.f32 [%1], %2;\n\tmov.b32 %0, 0;\n"
            : "=r"(t)
            : "r"(sd.chunk + uint32_t(4 * (col * S::kStagingRowFloats + key))), "f"(x));
        staged |= t;
      }
    });
    // Both operands are packed before either product so that Sᵀ and dPᵀ are dead by then.
    // dK's product goes first and dV's, the step's last, is summed by FMA: with dV first
    // (or both sums by FMA) ptxas spills the packed operand or an accumulator in the loop.
    TokenOperand<false> pv = token_operand_prescaled(s, sigma);
    // dK's per-row scales: select-only at D = 64; at D = 128 the branchy form, with which ptxas
    // fits the loop in 255 registers (select-only spills 8 accumulators there: dK/dV 7.81 →
    // 8.07 ms, docs/PERFORMANCE.md v18).
    TokenOperand<false> ds = token_operand<false, D == 64>(dp);
    const uint32_t dk_b = st + S::kQt;
    if constexpr (D == 64) {
      // Both products in flight at once (two fresh accumulators fit at D = 64): dV's runs on
      // the tensor core while dK's is folded, instead of each waited for in turn.
      float fresh_k[D / 8][4], fresh_v[D / 8][4];
      issue_token_product<D>(fresh_k, ds, dk_b);
      issue_token_product<D>(fresh_v, pv, st + S::kDot);
      fold_token_product<D, false, 1>(dk, fresh_k, ds);
      fold_token_product<D, true, 0>(dv, fresh_v, pv);
    } else {
      accumulate_token_product<D, false>(dk, ds, dk_b);
      accumulate_token_product<D, true>(dv, pv, st + S::kDot);
    }
    if constexpr (kStoreDs) {
      // Every thread's x is in the chunk for the next computed step's row pass
      // (store_fp8_ds_rows); the chunks alternate, so the previous chunk's row pass, made
      // before this barrier, is also ordered before that chunk is written again.
      warpgroup::bar_sync_after(kStoredDsBarrier + warpgroup::index(), warpgroup::kThreads, staged);
    }
  }
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
