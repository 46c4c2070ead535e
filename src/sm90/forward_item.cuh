// One work item of the reference forward kernels (forward.cu on mma.sync, forward_wgmma.cu
// on wgmma): a 64-query tile of one document and query head, where its key side lives in
// qkv8, this lane's two rows and their Q scales, and the epilogue that stores O and LSE.
// Both kernels take the item the same way; only their mainloops differ.
#pragma once

#include <cstdint>

#include "sm90/forward_args.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/schedule.cuh"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {

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

  // The item of this CTA; false if it has none (past the work list, or an empty document).
  __device__ __forceinline__ bool take(const FwdArgs& a) {
    const int slot = blockIdx.x / a.hq;
    h = blockIdx.x % a.hq;
    if (slot >= item_count(a.work)) return false;
    dt = doc_tile(a.cu_seqlens, a.work, slot);
    if (dt.len == 0) return false;
    hk = h / (a.hq / a.hkv);
    m0 = dt.tile * kTileTokens;
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
