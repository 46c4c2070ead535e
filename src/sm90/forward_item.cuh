// What the reference forward kernels (forward.cu on mma.sync, forward_wgmma.cu on wgmma)
// share: one work item — a 64-query tile of one document and query head, where its key side
// lives in qkv8, this lane's two rows and their Q scales, the epilogue that stores O and
// LSE — and a key tile's scores turned into V-scaled probabilities. Only their MMAs differ.
#pragma once

#include <cmath>
#include <cstdint>

#include "sm90/forward_args.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {

// One key tile's raw dot products s of this lane's rows i0, i0 + 8 (keys n0 .. n0 + 63,
// document positions) become p * sv[j], the values P's FP8 codes round: scores in FP32
// (score(): (sum * sq[i]) * sk[j]), masked entries -inf, the online-softmax step (alpha
// rescales what was accumulated before), then V's per-token scale folded into p (V is summed
// over keys) with masked entries exactly 0 whatever the masked token's scale is.
template <bool kMask>
__device__ __forceinline__ void reference_probabilities(TileAcc& s, const float* sk, const float* sv,
                                                        const float (&sq_row)[2], const DocMask& mask, int i0,
                                                        int n0, float c, OnlineSoftmax& softmax,
                                                        float (&alpha)[2]) {
  const int q = lane_id() & 3;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 skj = *reinterpret_cast<const float2*>(sk + 8 * n + 2 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = score(s[n][e], sq_row[e >> 1], (e & 1) ? skj.y : skj.x);
      if (kMask && !mask.visible(i0 + 8 * (e >> 1), n0 + 8 * n + 2 * q + (e & 1))) s[n][e] = -INFINITY;
    }
  }
  softmax.step(s, c, alpha);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 svj = *reinterpret_cast<const float2*>(sv + 8 * n + 2 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool hidden = kMask && !mask.visible(i0 + 8 * (e >> 1), n0 + 8 * n + 2 * q + (e & 1));
      s[n][e] = hidden ? 0.0f : __fmul_rn(s[n][e], (e & 1) ? svj.y : svj.x);
    }
  }
}

template <int D>
struct RefItem {
  DocTile dt;
  int h, hk;
  int m0;             // the tile's first query (document position)
  int num_key_tiles;  // the key tiles the tile visits
  DocMask mask;
  int64_t q_row, kv_row;  // strides of a token in q8 and k8
  const uint8_t* k_src;   // the document's K rows of kv head hk
  const uint8_t* vt_src;  // the document's Vᵀ columns of kv head hk
  const float* sk_src;
  const float* sv_src;

  // The item of this CTA; false if it has none (past the work list, an empty document, or
  // a tile before the document's first query, whose rows are keys only).
  __device__ __forceinline__ bool take(const FwdArgs& a) {
    const int slot = blockIdx.x / a.hq;
    h = blockIdx.x % a.hq;
    if (slot >= item_count(a.work)) return false;
    dt = doc_tile(a.cu_seqlens, a.work, slot);
    if (dt.len == 0) return false;
    hk = h / (a.hq / a.hkv);
    m0 = dt.tile * kTileTokens;
    if (m0 < first_query(a.q_start, dt)) return false;
    num_key_tiles = a.causal ? dt.tile + 1 : dt.num_tiles;
    mask = DocMask{dt.len, a.causal};
    q_row = int64_t(a.hq) * D;
    kv_row = int64_t(a.hkv) * D;
    k_src = a.k8 + dt.tok0 * kv_row + hk * D;
    vt_src = a.vt8 + int64_t(hk) * D * a.tpad + dt.pstart;
    sk_src = a.sk + hk * a.total_tokens + dt.tok0;
    sv_src = a.sv + hk * a.total_tokens + dt.tok0;
    return true;
  }

  // This item's Q rows in q8.
  __device__ __forceinline__ const uint8_t* q_src(const FwdArgs& a) const {
    return a.q8 + (dt.tok0 + m0) * q_row + h * D;
  }

  // This lane's first row (document position); its rows are i0 and i0 + 8.
  __device__ __forceinline__ int row0() const { return m0 + 16 * warp_id() + (lane_id() >> 2); }

  // The Q scales of rows i0 and i0 + 8 (0 past the document).
  __device__ __forceinline__ void load_sq_rows(const FwdArgs& a, int i0, float (&sq_row)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + 8 * r;
      sq_row[r] = i < dt.len ? a.sq[h * a.total_tokens + dt.tok0 + i] : 0.0f;
    }
  }

  // O and LSE of rows i0 and i0 + 8 inside the document.
  __device__ __forceinline__ void store(const FwdArgs& a, int i0, const float (&acc)[D / 8][4], const float (&l)[2],
                                        const float (&mc)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + 8 * r;
      if (i >= dt.len) continue;
      const int64_t tok = dt.tok0 + i;
      store_o_row<D>(a.out + (tok * a.hq + h) * D + 2 * (lane_id() & 3), a.lse + h * a.total_tokens + tok, acc, r,
                     l[r], mc[r]);
    }
  }
};

}  // namespace sm90
}  // namespace flamia
