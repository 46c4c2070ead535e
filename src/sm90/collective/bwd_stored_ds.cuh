// The stored dS: where the dK/dV pass writes dQ's operand of every tile pair (StoredDsRun)
// and how (fp8_mixed's BF16 image by one bulk copy a warpgroup, fp8's codes and row scales);
// the dQ GEMM (kernels/backward.cu) reads it back.
#pragma once

#include <cstdint>

#include "flamia/formats.h"

#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/fragments.cuh"
#include "sm90/ptx.cuh"
#include "sm90/schedule.cuh"
#include "sm90/tile_io.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

// The stored dS (FLAMIA_BWD_DQ=hbm): the dK/dV pass writes dQ's operand of each warpgroup's
// step — its 64 keys by the step's 64 queries — to global memory as a shared-memory operand
// image (swizzled by the row index, so any 1024-byte-aligned copy of it is the same
// operand): fp8_mixed's bf16(dS) as the fused dQ's (store_ds_transposed), fp8's codes and
// rho (store_fp8_ds_rows). The dQ GEMM (dq_stored_kernel) bulk-copies it back instead of
// recomputing S, dP and dS: six matmuls a tile pair instead of seven, and dQ the same
// operands through the same steps as the deterministic pass. Only the tile pairs that
// exist are stored (kStoredTileBytes each): a head's run holds every document's, document
// b from ds_doc_base[b] on, query tile m's key tiles from m (m + 1) / 2 (causal: keys
// 0..m) or m nt (nt tiles a document, all keys) on. The buffer holds the runs of a slab of
// heads at once (launch_backward_stored_dq walks the slabs), so its size is bounded.
// Clamped: a corrupt document (the guard's error) cannot address outside its head's run.
// A CTA's document in the stored tiles, set up once (the base's load, the clamp, the head
// division), so that a step's tile address is a few integer instructions: the loop's
// integer work is the dK/dV pass's chain too (forming the address from scratch every step,
// with a division and 64-bit clamps, cost it 27 % more instructions).
template <bool kMixed>
struct StoredDsRun {
  uint8_t* doc;         // the document's first tile in the slab's first query head
  int64_t head_stride;  // bytes from one query head's run to the next
  uint64_t last;        // the largest in-document index that stays inside the run
  int h0;               // the slab's first query head
  int nt;               // the document's 64-token tiles
  bool causal;

  StoredDsRun() = default;
  __device__ __forceinline__ StoredDsRun(const BwdArgs& a, const DocTile& dt) {
    // Not through the read-only path: ds_doc_bases, which writes it, may still have run beside
    // this kernel's start (read here after the wait, kernels/backward.cu).
    const int64_t base = min(max(__ldcg(a.ds_doc_base + dt.doc), int64_t(0)), a.ds_head_tiles - 1);
    doc = a.ds + base * kStoredTileBytes<kMixed>;
    head_stride = a.ds_head_tiles * kStoredTileBytes<kMixed>;
    last = uint64_t(a.ds_head_tiles - 1 - base);
    h0 = a.ds_hk0 * (a.hq / a.hkv);
    nt = (dt.len + kTileTokens - 1) / kTileTokens;
    causal = a.causal;
  }
  // Query head h's tile of query tile m and key tile n (m, n >= 0).
  __device__ __forceinline__ uint8_t* tile(int h, int m, int n) const {
    const uint64_t in_doc = causal ? (uint64_t(uint32_t(m)) * uint32_t(m + 1) >> 1) + uint32_t(n)
                                   : uint64_t(uint32_t(m)) * uint32_t(nt) + uint32_t(n);
    return doc + int64_t(h - h0) * head_stride + int64_t(min(in_doc, last)) * kStoredTileBytes<kMixed>;
  }
};

struct StoredDs {
  uint32_t chunk;  // this warpgroup's chunk of the dS buffer (shared address)
  uint8_t* tile;   // its tile in global memory
  // fp8: the previous computed step's chunk and tile, whose row pass is still to come (tile
  // null: none), which the step makes while its Sᵀ and dPᵀ products run.
  uint32_t pending_chunk;
  uint8_t* pending_tile;
};
constexpr int kStoredDsBarrier = warpgroup::kFirstNamedBarrier;  // + the warpgroup's index

// Warpgroup w's dS operand (registers: rows = its 64 keys, columns = the 64 queries, as
// pack_bf16_a lays them out) into its chunk of the dS buffer, transposed: query rows of 64
// keys. Matrix i of k16 step s is keys 16 (warp) + 8 (i & 1) + 0..7 by queries
// 8 (2 s + i / 2) + 0..7; its stored row j is query 8 (2 s + i / 2) + j, 16 bytes at key chunk
// 2 (warp) + (i & 1) of the row, swizzled as TMA's 128-byte mode places it.
__device__ __forceinline__ void store_ds_transposed(uint32_t chunk, const uint32_t (&a)[4][4]) {
  const int i = lane_id() >> 3, j = lane_id() & 7;
  const uint32_t key_chunk = uint32_t(2 * (warp_id() & 3) + (i & 1));
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int query = 8 * (2 * s + (i >> 1)) + j;
    ptx::stmatrix_x4_trans(chunk + query * kBf16ColRowBytes + ((key_chunk ^ uint32_t(j)) << 4), a[s][0], a[s][1],
                           a[s][2], a[s][3]);
  }
}

// fp8_mixed's stored dS: this warpgroup's operand into its chunk, made visible to the async
// proxy, the warpgroup's barrier, then one bulk copy of the 8 KB chunk to global memory by the
// warpgroup's first thread (no per-thread loads or stores). The chunks alternate with every
// computed step; before the barrier that thread waits until its previous copy (the other
// chunk's, a step old) has read shared memory, so that no thread writes that chunk again
// (next step) while it is read. finish_ds_copies, after the last step, lets the copies end.
__device__ __forceinline__ void store_ds_tile(const StoredDs& sd, const uint32_t (&a)[4][4]) {
  store_ds_transposed(sd.chunk, a);
  wgmma::fence_proxy_async();
  const bool first = tile_tid() == 0;
  if (first) tma::wait_bulk_read<0>();
  warpgroup::bar_sync(kStoredDsBarrier + warpgroup::index(), warpgroup::kThreads);
  if (first) {
    // Read once, by the dQ GEMM after this launch: evict first, so that the GBs of tiles do
    // not push out of the L2 the query tiles the slab's other CTAs are reading.
    tma::store_bulk(sd.tile, sd.chunk, kDsTileBytes, tma::evict_first_policy());
    tma::commit_bulk();
  }
}
__device__ __forceinline__ void finish_ds_copies() {
  if (tile_tid() == 0) tma::wait_bulk<0>();
}

// fp8's stored dS, once the warpgroup's x = dS sk (FP32, masked pairs 0) of the step is in
// its staging chunk (query rows; written in dkdv_query_tile, then a named barrier): thread
// t takes query row t / 2 and keys 32 (t % 2) .. + 31, and writes what dQ's register operand
// would hold — rho = pow2_scale(max |x| over the row's 64 keys) (the pair of threads
// combines its halves; NaN skipped, as row_pow2_scales does) and codes e4m3(x / rho) — as
// the K-major image: 16-byte chunk c (16-key group c, positions in fragment order: position
// 4 qd + bb = key 2 qd + (bb & 1) + 8 (bb >> 1)) of row i at c ^ ((i % 8) / 2), TMA's
// 64-byte swizzle, then the row's rho after the 64 rows.
__device__ __forceinline__ void store_fp8_ds_rows(uint32_t staging, uint8_t* tile, int row_floats) {
  const int t = tile_tid(), i = t >> 1, half = t & 1;
  float x[32];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(staging + uint32_t(4 * (i * row_floats + 32 * half + 4 * k))));
    x[4 * k] = v.x;
    x[4 * k + 1] = v.y;
    x[4 * k + 2] = v.z;
    x[4 * k + 3] = v.w;
  }
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 32; ++k) m = fmaxf(m, fabsf(x[k]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  const float rho = fmt::pow2_scale_e4m3(m), inv = fmt::pow2_reciprocal(rho);
#pragma unroll
  for (int g = 0; g < 2; ++g) {  // the thread's 16-key groups 2 half + g
    const float* v = x + 16 * g;
    uint4 w;
    uint32_t* wv = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
    for (int qd = 0; qd < 4; ++qd)
      wv[qd] = ptx::pack_e4m3x4(__fmul_rn(v[2 * qd], inv), __fmul_rn(v[2 * qd + 1], inv),
                                __fmul_rn(v[8 + 2 * qd], inv), __fmul_rn(v[9 + 2 * qd], inv));
    const int c = 2 * half + g;
    __stcs(reinterpret_cast<uint4*>(tile + i * kTileTokens + ((c ^ ((i & 7) >> 1)) << 4)), w);
  }
  if (half == 0) __stcs(reinterpret_cast<float*>(tile + kDsCodesBytes) + i, rho);
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
