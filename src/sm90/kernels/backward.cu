// Backward (ALGORITHM.md §3), deterministic and without atomics. Every matmul is a wgmma
// issued by one warpgroup; the specification sums each as wgmma does (ALGORITHM.md §6).
// S and Sᵀ come from the forward's instruction sequence (scores_wgmma.cuh), so that
// P = exp2(S c - lse2) is rebuilt from the very S the forward's LSE was taken over.
//
// 1. quantize dO (natural + transposed FP8, scales) and D = rowsum(dO8 * O) (quantize.cu);
// 2. dK/dV kernel: CTA = (128-key tile of one document, kv head), two warpgroups of 64 keys
//    (4 warps x 16 keys each; fp8_mixed at D = 64 without the stored dS: 192 keys, three)
//    sharing each query-side stage. Loops over the query heads of
//    the GQA group, then over the 64-query tiles that see the keys, in the order the
//    specification sums them. Per query tile and warpgroup:
//      Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (A and B in shared memory, both in flight at once),
//      Pᵀ = exp2(fmaf(Sᵀ, c, -lse2)), dSᵀ = Pᵀ (dPᵀ - D),
//      dV += sigma * (q8(Pᵀ sdo / sigma) · dOᵀ tile),
//      dK += tau * (q8(dSᵀ sq / tau) · Qᵀ tile)   (fp8)  or  bf16(dSᵀ) · Q   (fp8_mixed);
//    keys are rows, so Pᵀ and dSᵀ are A operands straight from the accumulators (registers);
//    each tile product is formed in a fresh accumulator, then scaled and added in FP32;
// 3. dQ kernel: CTA = (128-query tile, query head), two warpgroups of 64 queries sharing
//    each key-side stage; loops over 64-key tiles, recomputes S (as the forward) and dP, and
//    accumulates
//      dQ += rho * (q8(dS sk / rho) · Kᵀ tile)   (fp8)  or  bf16(dS) · K   (fp8_mixed).
//    Recomputing S and dP here costs two matmuls of the four per tile pair, but gives every
//    dQ row one owner: deterministic, no FP32 atomics, no dQ accumulator in global memory.
//    The stored dS (fp8_mixed at D = 128 by default, when the workspace holds it; every call
//    with FLAMIA_BWD_DQ=hbm) has the dK/dV pass store dQ's operand of every tile pair
//    (fp8_mixed's bf16(dS), fp8's codes and rho) and replaces this kernel by a GEMM over it
//    (dq_stored_kernel; the same bits, 2 or 1.06 bytes a score of workspace, in slabs of
//    heads: stored_ds_plan; with FLAMIA_BWD_DS_OVERLAP=1 two slab buffers, a slab's GEMM on a
//    second stream beside the next slab's pass). FLAMIA_BWD_DQ=fused (fp8_mixed, D = 128) forms dQ inside the
//    dK/dV pass by FP32 reductions instead (no dQ kernel; not deterministic).
// Operand tiles. A CTA's own rows (K, V for dK/dV; Q, dO for dQ: the A operands of the products
// reduced over D) are loaded once by cp.async into ScoreTiles (64 tokens x D, K-major core
// matrices), zero past the document end. The other side streams through a ring of kBwdStages stages
// (the dK/dV pass one step ahead, the dQ pass two): its FP8 tiles by TMA, started by one thread
// (each stage's `full` mbarrier counts their bytes) — 64 token rows of D codes in a D-byte swizzle
// (B of the products reduced over D) and D rows of 64 token positions of the quantizer's
// fragment-ordered transposed copies in a 64-byte swizzle (B of those reduced over tokens) — and
// its per-token values (scales, LSE, D) by cp.async, since a 64-value run of an [H][T] array need
// not start 16-byte aligned as a TMA box must. fp8_mixed's BF16 operands (q for dK, dO for dV, k
// for dQ) are stage tiles too, the caller's tensors themselves: 64 token rows, read MN-major
// (bwd_natural_rows.cuh, which also says how their non-finite rows are zeroed).
// No CTA barrier orders the steps: every thread's per-token copies arrive on the stage's
// `full` mbarrier when they land, each thread arrives on its `empty` mbarrier when done with
// it, and a stage is refilled only after every thread left it; so the dK/dV pass's two
// warpgroups drift up to two steps apart (the dQ pass's one) and one's MMAs overlap the
// other's FP32 work.
// TMA tiles are not cleared past the document end: their rows or columns there hold the
// next document's codes or values, the transposed copies' padding, or TMA's zeros past the
// tensor, and every one is finite — the quantizer (quantize.cu, the same kernel for q/k/v and
// for dO) writes every position of [0, Tpad) of a transposed copy, padding as zero codes,
// converts with satfinite at a scale in [2^-126, 2^127], and gives a non-finite row zero codes
// (its NaN stays in the scale); fp8_mixed's BF16 rows are zeroed where not finite. Such a row
// or column meets only masked pairs, which are exact zeros by selection, so it adds 0 to
// every product.
//
// Pieces: collective/bwd_plan.cuh (parameters, CTA shapes, shared-memory plans),
// kit/bwd_ring.cuh (the streamed ring), collective/bwd_products.cuh (pair arithmetic and
// the gradient products), collective/bwd_dkdv_mainloop.cuh and collective/bwd_dq_mainloop.cuh
// (one step of each pass), collective/bwd_stored_ds.cuh and collective/bwd_fused_dq.cuh (the
// two dQ options' parts of the dK/dV step); the options and the workspace plan:
// launch/backward_options.cu.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/grid_dependency.cuh"
#include "common/overlap.h"
#include "common/tiles.h"
#include "common/work_order.h"
#include "quantize/quantize.cuh"
#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/collective/bwd_dkdv_mainloop.cuh"
#include "sm90/collective/bwd_dq_mainloop.cuh"
#include "sm90/collective/bwd_fused_dq.cuh"
#include "sm90/collective/bwd_natural_rows.cuh"
#include "sm90/collective/bwd_plan.cuh"
#include "sm90/collective/bwd_products.cuh"
#include "sm90/collective/bwd_stored_ds.cuh"
#include "sm90/kit/bwd_ring.cuh"
#include "sm90/launch/tensor_map.h"
#include "sm90/masks.cuh"
#include "sm90/per_device.h"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {
namespace bwd {
namespace {

using fmt::kLog2e;

// =====================================================================================
// dK / dV
// =====================================================================================

// ds_doc_base: every document's first tile in a head's run, an exclusive scan of its tile
// pairs (one block; the documents' lengths clamped as doc_tile clamps them).
__global__ void __launch_bounds__(1024) ds_doc_bases(const int32_t* __restrict__ cu_seqlens, int num_docs,
                                                     int64_t total_tokens, bool causal, int64_t* __restrict__ base) {
  // It may start in the dO quantizer's last wave and waits for it at once: the first slab's
  // dK/dV pass, which may set up beside this one-block kernel, reads the dO tiles before its
  // wait (the bases only after it), so it must not start before the quantizer completed.
  grid::wait_for_prior_grids();
  grid::allow_dependents();
  __shared__ int64_t warp_sums[32];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int b0 = 0; b0 < num_docs; b0 += blockDim.x) {
    const int b = b0 + int(threadIdx.x);
    int64_t pairs = 0;
    if (b < num_docs) {
      const int64_t t0 = min(max(int64_t(cu_seqlens[b]), int64_t(0)), total_tokens);
      const int64_t t1 = min(max(int64_t(cu_seqlens[b + 1]), t0), total_tokens);
      const int64_t nt = (t1 - t0 + kTileTokens - 1) / kTileTokens;
      pairs = causal ? nt * (nt + 1) / 2 : nt * nt;
    }
    // Inclusive scan within the warp, then over the warps' sums.
    int64_t x = pairs;
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, d);
      if (lane >= d) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t w = lane < int(blockDim.x) / 32 ? warp_sums[lane] : 0;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += y;
      }
      warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int64_t inclusive = x + (warp > 0 ? warp_sums[warp - 1] : 0) + carry;
    if (b < num_docs) base[b] = inclusive - pairs;
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry = inclusive;
    __syncthreads();
  }
}

static_assert(guard::kNone == 0, "enter_cta reads a fault word of 0 as none");

template <int D, bool kMixed, bool kFused, bool kStoreDs = false>
__global__ void __launch_bounds__((DkdvSmem<D, kMixed, kFused, kStoreDs>::kCtaThreads), 1)
    dkdv_kernel(const __grid_constant__ BwdArgs a) {
  static_assert(!kFused || (kMixed && D == 128), "the fused dQ is fp8_mixed's, at D = 128");
  static_assert(!(kStoreDs && kFused), "the stored dS and the fused dQ are alternatives");
  using S = DkdvSmem<D, kMixed, kFused, kStoreDs>;
  constexpr int kW = S::kWarpgroups;  // 64 keys each
  // Without the stored dS the pass may start beside the dO quantizer (or fp8's code
  // transposes), which write the status word, the tiles and the values it reads: it waits
  // before its first global read. The stored dS's launches wait later (below).
  if constexpr (!kStoreDs) grid::wait_for_prior_grids();
  const WorkList& list = dkdv_list(a, kW);  // key tiles of 128 or 192 tokens
  extern __shared__ uint8_t smem_raw[];
  // One CTA per (work-list slot, kv head), in blocks of kv heads (order::backward_cta); the
  // stored dS's launches cover a slab of kv heads, side by side (a slab's one block: the
  // slabs are small already, and blocks inside them started the costliest CTAs late, v66).
  const int heads = kStoreDs ? a.ds_hkv : a.hkv;
  const order::SlotHead cta =
      order::backward_cta(int(blockIdx.x), list.capacity, heads, heads, kStoreDs ? heads : a.kv_block);
  const int slot = cta.slot, hk = (kStoreDs ? a.ds_hk0 : 0) + cta.h;
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  const CtaItem entry = enter_cta(list, slot, &a.status->fault, a.cu_seqlens, a.q_start);
  if (!entry.ok) return grid::wait_for_prior_grids();
  const DocTile dt = entry.dt;
  // Item t of a document is its key tile nt - 1 - t when causal (cost order, schedule.cuh).
  const int n = a.causal ? dt.num_tiles - 1 - dt.tile : dt.tile;
  const int wg = warpgroup::index();
  // This warpgroup's 64 keys: the 64-token key tile nw, keys [kw0, kw0 + valid_k).
  const int nw = kW * n + wg, kw0 = nw * kTileTokens;
  const int valid_k = min(kTileTokens, dt.len - kw0);  // <= 0: no keys (the document ends first)
  const int group = a.hq / a.hkv;
  const int num_query_tiles_doc = (dt.len + kTileTokens - 1) / kTileTokens;
  // Query tiles from the first that sees the CTA's first keys (causal) and is no tile of
  // keys-only rows (q_start, a multiple of the tile); a warpgroup skips the tiles that see
  // none of its own keys.
  const int m_first = max(a.causal ? kW * n : 0, entry.first_query / kTileTokens);
  const int num_query_tiles = num_query_tiles_doc - m_first;
  const int steps = group * num_query_tiles;  // (query head, query tile), head-major
  const DocMask mask{dt.len, a.causal};
  uint8_t* smem = swizzle_aligned(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  if (kFused && elected_thread()) mbar::init(base + S::kKtFull, 1);  // published by the barrier below
  init_stage_barriers<S::kStages>(base + S::full(0), base + S::empty(0), S::kCtaThreads);
  const bool elected = elected_thread();  // starts the stages' TMA loads
  if (elected) {
    tma::prefetch_map(a.q8_rows);
    tma::prefetch_map(a.do8_rows);
    tma::prefetch_map(a.do_b);
    tma::prefetch_map(a.q_b);
    if constexpr (kFused) {
      // The CTA's k rows, both chunks (a chunk past the document is loaded and never read).
      mbar::arrive_expect_tx(base + S::kKtFull, kW * S::kKtChunk);
      for (int c = 0; c < kW; ++c)
        load_natural_rows<D>(base + S::kKt + c * S::kKtChunk, a.k_b, base + S::kKtFull, hk,
                             int(dt.tok0) + (kW * n + c) * kTileTokens);
    }
  }

  const int64_t kv_row = int64_t(a.hkv) * D;
  if (valid_k > 0) {
    const int64_t kv_off = (dt.tok0 + kw0) * kv_row + hk * D;
    const uint32_t kb = base + S::keys(wg);
    load_kmajor_rows<D>(kb + S::kK, a.k8 + kv_off, kv_row, valid_k);
    load_kmajor_rows<D>(kb + S::kV, a.v8 + kv_off, kv_row, valid_k);
    const int64_t tok_off = hk * a.total_tokens + dt.tok0 + kw0;
    const int i = tile_tid();
    if (i < kTileTokens) load_scalar(kb + S::kSk, a.sk + tok_off, valid_k, i);
    else load_scalar(kb + S::kSv, a.sv + tok_off, valid_k, i - kTileTokens);
  }
  ptx::cp_async_commit();

  // The steps walk (query head, query tile) head-major; a cursor steps through them without
  // the integer division a step index would need.
  struct QueryTile {
    int h, m;
  };
  auto next_tile = [&](QueryTile t) {
    return ++t.m == num_query_tiles_doc ? QueryTile{t.h + 1, m_first} : t;
  };
  // The elected thread: a step's FP8 tiles into stage s, by TMA.
  auto load_query_tiles = [&](int s, QueryTile t) {
    const uint32_t st = base + S::stage(s), full = base + S::full(s);
    const int tok = int(dt.tok0) + t.m * kTileTokens, pos = int(dt.pstart) + t.m * kTileTokens;
    mbar::arrive_expect_tx(full, S::kTmaBytes);
    tma::load_3d(st + S::kQ, a.q8_rows, full, 0, t.h, tok);
    tma::load_3d(st + S::kDo, a.do8_rows, full, 0, t.h, tok);
    load_token_b_tile<D, kMixed>(st + S::kDot, a.do_b, full, t.h, tok, pos);
    load_token_b_tile<D, kMixed>(st + S::kQt, a.q_b, full, t.h, tok, pos);
  };
  // The first 256 threads: one each of a step's 256 per-query values (thread t: value t % 64
  // of sq, sdo, LSE, D for t / 64 = 0..3, as laid out from kSqT on, each in the lanes' column
  // order), by cp.async; a third warpgroup's threads copy none.
  const int value_i = int(threadIdx.x) & (kTileTokens - 1), value_kind = int(threadIdx.x) / kTileTokens;
  const float* const values = value_kind == 0 ? a.sq : value_kind == 1 ? a.sdo : value_kind == 2 ? a.lse2 : a.dvec;
  auto load_query_values = [&](int s, QueryTile t) {
    const int m0 = t.m * kTileTokens;
    if (kW == 2 || value_kind < 4)
      load_scalar_lane_ordered(base + S::stage(s) + S::kSqT + value_kind * kScalarTileBytes,
                               values + (t.h * a.total_tokens + dt.tok0 + m0), dt.len - m0, value_i);
  };
  // Every thread: a step into the next stage of the ring, once every thread has left it.
  StageCursor<S::kStages> load, use;
  auto load_step = [&](QueryTile t) {
    refill_stage(base + S::full(0), base + S::empty(0), load, [&](int s) {
      if (elected) load_query_tiles(s, t);
      load_query_values(s, t);
    });
  };
  QueryTile cur{hk * group, m_first};
  if (steps > 0) load_step(cur);  // none: every query of the document is before q_start
  ptx::cp_async_commit();
  // Up to here the CTA has read only what the kernel launched before it (the previous slab's
  // dQ GEMM, ds_doc_bases) does not write: its rows, the first step's tiles. The stored dS it
  // writes from here on, that GEMM may still be reading (common/grid_dependency.cuh).
  grid::wait_for_prior_grids();
  grid::allow_dependents();
  own_rows_ready();

  const int j0 = kw0 + 16 * (warp_id() & 3) + (lane_id() >> 2);  // this lane's keys: j0, j0 + 8
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[c][e] = dv[c][e] = 0.0f;

  // fp8_mixed: whether its BF16 rows need their non-finite rows zeroed (bwd_natural_rows.cuh);
  // the same for every thread, so the zeroing's barriers are the whole CTA's.
  [[maybe_unused]] const bool zero_q = kMixed && rows_flagged(a.nonfinite_qk);
  [[maybe_unused]] const bool zero_do = kMixed && rows_flagged(a.nonfinite_do);
  // The fused dQ: the CTA's k rows have landed before the first product reads them.
  [[maybe_unused]] const int64_t q_row = int64_t(a.hq) * D;
  if constexpr (kFused) {
    mbar::wait(base + S::kKtFull, 0);
    if (zero_q) {
      for (int c = 0; c < kW; ++c)
        zero_nonfinite_rows<D>(smem + S::kKt + c * S::kKtChunk, a.sk + hk * a.total_tokens,
                               dt.tok0 + (kW * n + c) * kTileTokens, a.total_tokens,
                               int(threadIdx.x), S::kCtaThreads);
      natural_rows_ready(S::kCtaThreads);
    }
  }

  int stored = 0;  // steps this warpgroup has computed: the stored dS's buffer parity
  [[maybe_unused]] StoredDsRun<kMixed> run;
  if constexpr (kStoreDs) run = StoredDsRun<kMixed>(a, dt);
  [[maybe_unused]] uint32_t pending_chunk = 0;  // fp8: the last computed step's dS, not yet written out
  [[maybe_unused]] uint8_t* pending_tile = nullptr;
  for (int step = 0; step < steps; ++step) {
    const QueryTile next = next_tile(cur);
    if (step + 1 < steps) load_step(next);
    const int m = cur.m, m0 = m * kTileTokens;
    // The step's tiles and values landed. Every thread waits, also in steps its warpgroup
    // skips: a parity wait only tells consecutive phases apart.
    mbar::wait(base + S::full(use.index), use.phase);
    if constexpr (kMixed) {
      if (zero_q || zero_do) {
        uint8_t* st = smem + S::stage(use.index);
        const int64_t tok = dt.tok0 + m0, off = int64_t(cur.h) * a.total_tokens;
        if (zero_q) zero_nonfinite_rows<D>(st + S::kQt, a.sq + off, tok, a.total_tokens, int(threadIdx.x), S::kCtaThreads);
        if (zero_do) zero_nonfinite_rows<D>(st + S::kDot, a.sdo + off, tok, a.total_tokens, int(threadIdx.x), S::kCtaThreads);
        natural_rows_ready(S::kCtaThreads);
      }
    }
    FusedDq fz{};
    if constexpr (kFused) {
      fz.ds_buffer = base + S::kDs + (step & 1) * S::kDsBuffer;
      fz.kt = base + S::kKt + wg * mma::kNaturalBlockBytes;
      fz.rows = a.dq_acc + (dt.tok0 + m0) * q_row + cur.h * D + wg * (D / 2);
      fz.row_stride = q_row;
      fz.valid_rows = dt.len - m0;
    }
    // Causal: query tile m sees this warpgroup's keys only from m = nw on (warpgroup 0's
    // always, from m_first on).
    if (valid_k > 0 && (!a.causal || m >= nw)) {
      StoredDs sd{};
      if constexpr (kStoreDs) {
        sd.chunk = kMixed ? base + S::kDs + (stored & 1) * S::kDsBuffer + wg * S::kDsChunk
                          : base + S::kDs + ((stored & 1) * kW + wg) * S::kStagingChunk;
        sd.tile = run.tile(cur.h, m, nw);
        if constexpr (!kMixed) {
          sd.pending_chunk = pending_chunk;
          sd.pending_tile = pending_tile;
          pending_chunk = sd.chunk;
          pending_tile = sd.tile;
        }
        ++stored;
      }
      // The fused dQ and the stored dS also carry dS's key rows past the document (dK, dV
      // never store them): there they must be zeros, not P (dP - D) of the zero-filled keys,
      // or the next document's Kᵀ columns would enter dQ. Causal tiles past the end are
      // diagonal anyway.
      if (mask_needed_for_key_rows(mask, m, nw, kTileTokens) || ((kFused || kStoreDs) && valid_k < kTileTokens))
        dkdv_query_tile<D, kMixed, kFused, kStoreDs, true>(smem, S::keys(wg), use.index, mask, j0, m0, a.c, dk, dv,
                                                           fz, sd);
      else
        dkdv_query_tile<D, kMixed, kFused, kStoreDs, false>(smem, S::keys(wg), use.index, mask, j0, m0, a.c, dk,
                                                            dv, fz, sd);
    } else if constexpr (kFused) {
      fused_dq_only<D, S>(fz);
    }
    release_stage(base + S::empty(use.index));
    use.advance();
    cur = next;
  }

  if constexpr (kStoreDs && kMixed) finish_ds_copies();
  if constexpr (kStoreDs && !kMixed) {
    if (pending_tile != nullptr) store_fp8_ds_rows(pending_chunk, pending_tile, S::kStagingRowFloats);
  }
  // Every key row of the document is written, also those no query sees (zeros): a tile
  // inside the document by TMA, through the warpgroup's dead keys; the document's last,
  // partial one row by row (a box would write the next document's rows).
  const float dk_scale[2] = {a.softmax_scale, a.softmax_scale}, dv_scale[2] = {1.0f, 1.0f};
  const uint32_t tile = base + S::rows_out(wg);
  store_rows<D>(a.rows_by_tma, tile, a.dk_rows, a.dk + hk * D, kv_row, hk, dt.tok0, kw0, dt.len, dk, dk_scale,
                kEpilogueBarrier + wg);
  store_rows<D>(a.rows_by_tma, tile, a.dv_rows, a.dv + hk * D, kv_row, hk, dt.tok0, kw0, dt.len, dv, dv_scale,
                kEpilogueBarrier + wg);
  rows_out_drain();
}

// =====================================================================================
// dQ
// =====================================================================================

template <int D, bool kMixed>
__global__ void __launch_bounds__(kDqThreads, kDqCtasPerSm<D>) dq_kernel(const __grid_constant__ BwdArgs a) {
  using S = DqSmem<D, kMixed>;
  extern __shared__ uint8_t smem_raw[];
  const order::SlotHead cta = order::backward_cta(int(blockIdx.x), a.work.capacity, a.hq, a.hkv, a.kv_block);
  const int slot = cta.slot, h = cta.h;
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  const CtaItem entry = enter_cta(a.work, slot, &a.status->fault, a.cu_seqlens, a.q_start);
  if (!entry.ok) return grid::wait_for_prior_grids();
  const DocTile dt = entry.dt;  // a 128-query tile
  // Keys-only rows (before q_start, a multiple of the tile) get no dQ.
  if ((kDqWarpgroups * dt.tile) * kTileTokens < entry.first_query) return grid::wait_for_prior_grids();
  const int wg = warpgroup::index();
  const int hk = h / (a.hq / a.hkv);
  // This warpgroup's 64 queries: the 64-token query tile mw, queries [m0, m0 + valid_q).
  const int mw = kDqWarpgroups * dt.tile + wg, m0 = mw * kTileTokens;
  const int valid_q = min(kTileTokens, dt.len - m0);  // <= 0: no queries (the document ends first)
  const int num_tiles_doc = (dt.len + kTileTokens - 1) / kTileTokens;
  // Key tiles up to the CTA's last diagonal (causal); a warpgroup skips those past its own.
  const int num_key_tiles = a.causal ? min(kDqWarpgroups * (dt.tile + 1), num_tiles_doc) : num_tiles_doc;
  const DocMask mask{dt.len, a.causal};
  uint8_t* smem = swizzle_aligned(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  init_stage_barriers(base + S::full(0), base + S::empty(0), kDqThreads);
  const bool elected = elected_thread();  // starts the stages' TMA loads
  if (elected) {
    tma::prefetch_map(a.k8_rows);
    tma::prefetch_map(a.v8_rows);
    tma::prefetch_map(a.k_b);
  }

  const int64_t q_row = int64_t(a.hq) * D;
  if (valid_q > 0) {
    const int64_t q_off = (dt.tok0 + m0) * q_row + h * D;
    const uint32_t qb = base + S::queries(wg);
    load_kmajor_rows<D>(qb + S::kQ, a.q8 + q_off, q_row, valid_q);
    load_kmajor_rows<D>(qb + S::kDo, a.do8 + q_off, q_row, valid_q);
    const int64_t tok_off = h * a.total_tokens + dt.tok0 + m0;
    const int i = tile_tid() & 63;
    if (tile_tid() < kTileTokens) {
      load_scalar(qb + S::kSq, a.sq + tok_off, valid_q, i);
      load_scalar(qb + S::kLse, a.lse2 + tok_off, valid_q, i);
    } else {
      load_scalar(qb + S::kSdo, a.sdo + tok_off, valid_q, i);
      load_scalar(qb + S::kDvec, a.dvec + tok_off, valid_q, i);
    }
  }
  ptx::cp_async_commit();

  // The elected thread: key tile n's FP8 tiles into stage s, by TMA.
  auto load_key_tiles = [&](int s, int n) {
    const uint32_t st = base + S::stage(s), full = base + S::full(s);
    const int tok = int(dt.tok0) + n * kTileTokens, pos = int(dt.pstart) + n * kTileTokens;
    mbar::arrive_expect_tx(full, S::kTmaBytes);
    tma::load_3d(st + S::kK, a.k8_rows, full, 0, hk, tok);
    tma::load_3d(st + S::kV, a.v8_rows, full, 0, hk, tok);
    load_token_b_tile<D, kMixed>(st + S::kKt, a.k_b, full, hk, tok, pos);
  };
  // Warpgroup 0: a key tile's 128 key scales (thread t: value t % 64 of sk, sv for
  // t / 64 = 0, 1, as laid out from kSk on, each in the lanes' column order), by cp.async.
  const int value_i = int(threadIdx.x) & (kTileTokens - 1), value_kind = int(threadIdx.x) / kTileTokens;
  const float* const values = (value_kind == 0 ? a.sk : a.sv) + hk * a.total_tokens + dt.tok0;
  auto load_key_values = [&](int s, int n) {
    const int n0 = n * kTileTokens;
    if (value_kind < 2)
      load_scalar_lane_ordered(base + S::stage(s) + S::kSk + value_kind * kScalarTileBytes, values + n0, dt.len - n0,
                               value_i);
  };
  // Every thread: key tile n into the next stage of the ring, once every thread has left it.
  StageCursor<> load, use;
  auto load_step = [&](int n) {
    refill_stage(base + S::full(0), base + S::empty(0), load, [&](int s) {
      if (elected) load_key_tiles(s, n);
      load_key_values(s, n);
    });
  };
  // The ring runs kBwdStages - 1 key tiles ahead: at D = 128 a step issues the next tile's S
  // and dP in its middle, so tiles requested one step ahead had half a step to arrive.
  constexpr int kAhead = kBwdStages - 1;
  for (int n = 0; n < kAhead && n < num_key_tiles; ++n) load_step(n);
  ptx::cp_async_commit();
  own_rows_ready();

  const int i0 = m0 + 16 * (warp_id() & 3) + (lane_id() >> 2);  // this lane's queries: i0, i0 + 8
  [[maybe_unused]] const bool zero_k = kMixed && rows_flagged(a.nonfinite_qk);  // as in dkdv_kernel
  float dq[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[c][e] = 0.0f;

  // This warpgroup's key tiles are 0..last (causal: up to its own diagonal mw). With
  // kOverlap the next tile's S and dP are issued before this tile's dQ product is folded, so
  // the tensor core works on them while the FP32 pipe folds (D = 128: the registers of a
  // second S/dP fit; at D = 64 two CTAs share the SM at 128 registers and do not).
  constexpr bool kOverlap = D == 128;
  const int last = valid_q <= 0 ? -1 : a.causal ? min(mw, num_key_tiles - 1) : num_key_tiles - 1;
  TileAcc s, dp;  // S and dP of the tile in flight: rows = queries, columns = keys
  if (kOverlap && last >= 0) {
    mbar::wait(base + S::full(use.index), use.phase);
    issue_dq_scores<D, kMixed>(s, dp, smem, S::queries(wg), use.index);
  }
  for (int n = 0; n < num_key_tiles; ++n) {
    if (n + kAhead < num_key_tiles) load_step(n + kAhead);
    const int n0 = n * kTileTokens;
    mbar::wait(base + S::full(use.index), use.phase);  // as in dkdv_kernel
    if constexpr (kMixed) {
      if (zero_k) {
        zero_nonfinite_rows<D>(smem + S::stage(use.index) + S::kKt, a.sk + int64_t(hk) * a.total_tokens, dt.tok0 + n0,
                               a.total_tokens, int(threadIdx.x), kDqThreads);
        natural_rows_ready(kDqThreads);
      }
    }
    if (n <= last) {
      if (!kOverlap) issue_dq_scores<D, kMixed>(s, dp, smem, S::queries(wg), use.index);
      wgmma::wait<0>();
      wgmma::pin(s);
      wgmma::pin(dp);
      TokenOperand<kMixed> op =
          mask_needed_for_query_rows(mask, mw, n, kTileTokens)
              ? dq_operand_of_tile<D, kMixed, true>(smem, S::queries(wg), use.index, mask, i0, n0, a.c, s, dp)
              : dq_operand_of_tile<D, kMixed, false>(smem, S::queries(wg), use.index, mask, i0, n0, a.c, s, dp);
      const uint32_t kt = base + S::stage(use.index) + S::kKt;
      float fresh[D / 8][4];  // fp8 only
      if constexpr (kMixed) chain_token_product<D>(dq, op, kt);
      else issue_token_product<D>(fresh, op, kt);
      // S and dP of n + 1 may be pending (two groups) when the product is done.
      if (kOverlap && n + 1 <= last) {
        StageCursor<> next = use;
        next.advance();
        mbar::wait(base + S::full(next.index), next.phase);
        issue_dq_scores<D, kMixed>(s, dp, smem, S::queries(wg), next.index);
        if constexpr (kMixed) chained_product_done<D, 2>(dq, op);
        else fold_token_product<D, true, 2>(dq, fresh, op);
      } else {
        if constexpr (kMixed) chained_product_done<D, 0>(dq, op);
        else fold_token_product<D, true, 0>(dq, fresh, op);
      }
    }
    release_stage(base + S::empty(use.index));
    use.advance();
  }
  // Every S/dP issued was waited for inside the loop, which ptxas cannot prove: without this
  // wait it injects one of its own (C7517) before the accumulator registers are reused.
  if constexpr (kOverlap) wgmma::wait<0>();

  // As the dK/dV pass's rows: a tile inside the document by TMA, through the warpgroup's own
  // Q and dO (dead after its last step, and exactly a bf16 tile of 64 rows), else row by row.
  const float dq_scale[2] = {a.softmax_scale, a.softmax_scale};
  store_rows<D>(a.rows_by_tma, base + S::queries(wg), a.dq_rows, a.dq + h * D, q_row, h, dt.tok0, m0, dt.len, dq,
                dq_scale, kEpilogueBarrier + wg);
  rows_out_drain();
  // It read nothing the dK/dV pass before it writes, so its whole run may overlap that pass's
  // last wave; it completes only after that pass (common/grid_dependency.cuh).
  grid::wait_for_prior_grids();
}

// The dQ GEMM of the stored dS (DqStoredSmem, collective/bwd_plan.cuh, says how it works).
template <int D, bool kMixed>
__global__ void __launch_bounds__(kDqThreads, DqStoredSmem<D, kMixed>::kTwoCtas ? 2 : 1) dq_stored_kernel(const __grid_constant__ BwdArgs a) {
  using S = DqStoredSmem<D, kMixed>;
  extern __shared__ uint8_t smem_raw[];
  // One CTA per (work-list slot, query head of the launch's slab).
  const int group = a.hq / a.hkv, heads = a.ds_hkv * group;
  const order::SlotHead cta = order::backward_cta(int(blockIdx.x), a.work.capacity, heads, a.ds_hkv, a.ds_hkv);
  const int slot = cta.slot, h = a.ds_hk0 * group + cta.h;
  const CtaItem entry = enter_cta(a.work, slot, &a.status->fault, a.cu_seqlens, a.q_start);
  if (!entry.ok) return grid::wait_for_prior_grids();
  const DocTile dt = entry.dt;  // a 128-query tile
  // Keys-only rows (before q_start, a multiple of the tile) get no dQ, as in dq_kernel.
  if ((kDqWarpgroups * dt.tile) * kTileTokens < entry.first_query) return grid::wait_for_prior_grids();
  const int wg = warpgroup::index();
  const int hk = h / group;
  const int mw = kDqWarpgroups * dt.tile + wg, m0 = mw * kTileTokens;
  const int valid_q = min(kTileTokens, dt.len - m0);
  const int num_tiles_doc = (dt.len + kTileTokens - 1) / kTileTokens;
  const int num_key_tiles = a.causal ? min(kDqWarpgroups * (dt.tile + 1), num_tiles_doc) : num_tiles_doc;
  uint8_t* smem = swizzle_aligned(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  const bool elected = elected_thread();
  if (elected) {
    // full: the elected thread's announcement and the bytes; empty: every thread's release.
    for (int s = 0; s < S::kStages; ++s) {
      mbar::init(base + S::full(s), 1);
      mbar::init(base + S::empty(s), kDqThreads);
    }
    mbar::fence_init();
    tma::prefetch_map(a.k_b);
  }
  __syncthreads();
  // The stored tiles the loads below read are the previous launch's (the slab's dK/dV pass).
  grid::wait_for_prior_grids();
  grid::allow_dependents();

  // The elected thread: key tile n into stage s (both warpgroups' tiles, also where one is
  // never read: a warpgroup past its diagonal or past the document reads none).
  const StoredDsRun<kMixed> run(a, dt);
  // The stored tiles are read once: evict first, keeping the L2 for the Kᵀ tiles that every
  // query tile of the head reads again.
  const uint64_t once = elected ? tma::evict_first_policy() : 0;
  auto load_key_tile = [&](int s, int n) {
    const uint32_t st = base + S::stage(s), full = base + S::full(s);
    mbar::arrive_expect_tx(full, S::kTxBytes);
    load_token_b_tile<D, kMixed>(st + S::kKt, a.k_b, full, hk, int(dt.tok0) + n * kTileTokens,
                                 int(dt.pstart) + n * kTileTokens);
    for (int w = 0; w < kDqWarpgroups; ++w) {
      const uint8_t* tile = run.tile(h, kDqWarpgroups * dt.tile + w, n);
      tma::load_bulk(st + S::kDs + w * S::kImageBytes, tile, S::kImageBytes, full, once);
      if constexpr (!kMixed)
        tma::load_bulk(st + S::kRho + w * kDsRhoBytes, tile + kDsCodesBytes, kDsRhoBytes, full, once);
    }
  };
  StageCursor<S::kStages> load, use;
  auto load_step = [&](int n) {
    if (elected) {
      mbar::wait(base + S::empty(load.index), load.phase ^ 1);
      load_key_tile(load.index, n);
    }
    load.advance();
  };
  // Up to kStages - 1 tiles ahead.
  for (int n = 0; n < min(num_key_tiles, S::kStages - 1); ++n) load_step(n);

  float dq[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[c][e] = 0.0f;
  const int last = valid_q <= 0 ? -1 : a.causal ? min(mw, num_key_tiles - 1) : num_key_tiles - 1;
  const int row = 16 * (warp_id() & 3) + (lane_id() >> 2);  // this lane's rows: row, row + 8
  [[maybe_unused]] const bool zero_k = kMixed && rows_flagged(a.nonfinite_qk);  // as in dkdv_kernel
  for (int n = 0; n < num_key_tiles; ++n) {
    if (n + S::kStages - 1 < num_key_tiles) load_step(n + S::kStages - 1);
    mbar::wait(base + S::full(use.index), use.phase);
    if constexpr (kMixed) {
      if (zero_k) {
        zero_nonfinite_rows<D>(smem + S::stage(use.index) + S::kKt, a.sk + int64_t(hk) * a.total_tokens,
                               dt.tok0 + n * kTileTokens, a.total_tokens, int(threadIdx.x), kDqThreads);
        natural_rows_ready(kDqThreads);
      }
    }
    if (n <= last) {
      const uint32_t st = base + S::stage(use.index), img = st + S::kDs + wg * S::kImageBytes;
      if constexpr (kMixed) {
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma::mma_ss_bf16_bn<true>(dq, mma::desc<kBf16ColRowBytes>(img, ks), mma::desc_natural(st + S::kKt, ks));
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(dq);
      } else {
        float fresh[D / 8][4];
        wgmma::fence();
        wgmma::mma_ss<false>(fresh, mma::desc<kTileTokens>(img, 0), mma::desc<kTileTokens>(st + S::kKt, 0));
        wgmma::mma_ss<true>(fresh, mma::desc<kTileTokens>(img, 1), mma::desc<kTileTokens>(st + S::kKt, 1));
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(fresh);
        const float* rho = reinterpret_cast<const float*>(smem + S::stage(use.index) + S::kRho + wg * kDsRhoBytes);
        const float r0 = rho[row], r1 = rho[row + 8];
#pragma unroll
        for (int c = 0; c < D / 8; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[c][e] = fmaf(e < 2 ? r0 : r1, fresh[c][e], dq[c][e]);
      }
    }
    release_stage(base + S::empty(use.index));
    use.advance();
  }

  // As dq_kernel's rows: a tile inside the document by TMA, else row by row. The staging tile
  // is the start of stage wg (a stage holds at least a warpgroup's 64 bf16 rows): both
  // warpgroups read every stage's Kᵀ, so they meet first; every load has landed by then (each
  // waited for every tile's full).
  static_assert(S::kStages >= kDqWarpgroups && S::kStageBytes >= kTileTokens * D * 2, "a warpgroup's rows in a stage");
  const int64_t q_row = int64_t(a.hq) * D;
  const float dq_scale[2] = {a.softmax_scale, a.softmax_scale};
  if (a.rows_by_tma) __syncthreads();
  store_rows<D>(a.rows_by_tma, base + S::stage(wg), a.dq_rows, a.dq + h * D, q_row, h, dt.tok0, m0, dt.len, dq,
                dq_scale, kEpilogueBarrier + wg);
  rows_out_drain();
}

// =====================================================================================
// launch
// =====================================================================================

// The fused dQ's last step: dq = bf16(softmax_scale * dq_acc), 8 values a thread (the
// deterministic pass rounds its sums the same way). Nothing on a guard fault (the poisoning
// that follows the backward writes NaN).
__global__ void __launch_bounds__(256) dq_from_accumulator(const float* __restrict__ acc, uint16_t* __restrict__ dq,
                                                           int64_t groups, float scale,
                                                           const guard::DeviceError* status) {
  if (status->fault != guard::kNone) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 lo = reinterpret_cast<const float4*>(acc)[2 * i], hi = reinterpret_cast<const float4*>(acc)[2 * i + 1];
    uint4 out;
    out.x = ptx::pack_bf16x2(__fmul_rn(scale, lo.x), __fmul_rn(scale, lo.y));
    out.y = ptx::pack_bf16x2(__fmul_rn(scale, lo.z), __fmul_rn(scale, lo.w));
    out.z = ptx::pack_bf16x2(__fmul_rn(scale, hi.x), __fmul_rn(scale, hi.y));
    out.w = ptx::pack_bf16x2(__fmul_rn(scale, hi.z), __fmul_rn(scale, hi.w));
    reinterpret_cast<uint4*>(dq)[i] = out;
  }
}

template <int D, bool kMixed>
cudaError_t launch_backward(const BwdArgs& a, cudaStream_t stream) {
  using SK = DkdvSmem<D, kMixed>;
  constexpr int kDkdvSmem = SK::kAlloc, kDqSmem = DqSmem<D, kMixed>::kAlloc;
  cudaError_t attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, kMixed, false>), kDkdvSmem);
  if (attr == cudaSuccess) attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dq_kernel<D, kMixed>), kDqSmem);
  if (attr != cudaSuccess) return attr;
  // One CTA per (work-list slot, head), in blocks of kv heads (order::backward_cta); the
  // dK/dV pass's slots are those of its key tiles' list (DkdvSmem::kWarpgroups). It may start
  // in the dO quantizer's last wave (it waits before reading anything).
  const cudaError_t err = launch_kernel(dkdv_kernel<D, kMixed, false>,
                                        unsigned(int64_t(dkdv_list(a, SK::kWarpgroups).capacity) * a.hkv),
                                        SK::kCtaThreads, kDkdvSmem, stream, true, a);
  if (err != cudaSuccess) return err;
  // The dQ pass writes nothing the dK/dV pass reads or writes, nor reads what it writes: it
  // may fill that pass's last wave.
  return launch_kernel(dq_kernel<D, kMixed>, unsigned(int64_t(a.work.capacity) * a.hq), kDqThreads, kDqSmem, stream,
                       true, a);
}

// fp8_mixed at D = 128 with the fused dQ: the accumulator zeroed, one dK/dV(+dQ) pass, dQ
// rounded from the accumulator.
cudaError_t launch_backward_fused_dq(const BwdArgs& a, cudaStream_t stream) {
  constexpr int D = 128, kSmem = DkdvSmem<D, true, true>::kAlloc;
  const size_t acc_bytes = size_t(a.total_tokens) * size_t(a.hq) * D * sizeof(float);
  cudaError_t err = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, true, true>), kSmem);
  if (err == cudaSuccess) err = cudaMemsetAsync(a.dq_acc, 0, acc_bytes, stream);
  if (err != cudaSuccess) return err;
  dkdv_kernel<D, true, true><<<unsigned(int64_t(a.work.capacity) * a.hkv), kDkdvThreads, kSmem, stream>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const int64_t groups = int64_t(acc_bytes / (8 * sizeof(float)));
  const unsigned blocks = unsigned(std::min<int64_t>((groups + 255) / 256, 8 * 1024));
  dq_from_accumulator<<<blocks, 256, 0, stream>>>(a.dq_acc, a.dq, groups, a.softmax_scale, a.status);
  return cudaGetLastError();
}

// One slab's dK/dV pass (writes the slab's dS into a.ds) and its dQ GEMM (reads it), in
// `stream`, started beside the kernel before them where `overlap` (launch_kernel).
template <int D, bool kMixed>
cudaError_t launch_slab_pass(const BwdArgs& a, cudaStream_t stream, bool overlap) {
  return launch_kernel(dkdv_kernel<D, kMixed, false, true>, unsigned(int64_t(a.work.capacity) * a.ds_hkv),
                       kDkdvThreads, DkdvSmem<D, kMixed, false, true>::kAlloc, stream, overlap, a);
}
template <int D, bool kMixed>
cudaError_t launch_slab_gemm(const BwdArgs& a, cudaStream_t stream, bool overlap) {
  return launch_kernel(dq_stored_kernel<D, kMixed>, unsigned(int64_t(a.work.capacity) * a.ds_hkv * (a.hq / a.hkv)),
                       kDqThreads, DqStoredSmem<D, kMixed>::kAlloc, stream, overlap, a);
}

// The second stream of launch_slabs_beside: one per device, made on first use and kept (a
// call's own stream would cost its creation every call), of the highest priority, so that
// the GEMM's CTAs take the SMs the pass's CTAs leave as they finish. Calls from several host
// threads may share it: each call's order comes from its own events.
cudaError_t side_stream(cudaStream_t* out) {
  constexpr int kMaxDevices = 64;
  static std::atomic<cudaStream_t> streams[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  if ((*out = streams[device].load(std::memory_order_acquire)) != nullptr) return cudaSuccess;
  int least = 0, greatest = 0;
  cudaStream_t made = nullptr;
  if ((err = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess ||
      (err = cudaStreamCreateWithPriority(&made, cudaStreamNonBlocking, greatest)) != cudaSuccess)
    return err;
  cudaStream_t expected = nullptr;
  if (!streams[device].compare_exchange_strong(expected, made, std::memory_order_acq_rel)) {
    (void)cudaStreamDestroy(made);  // another thread's came first
    made = expected;
  }
  *out = made;
  return cudaSuccess;
}

// Two slab buffers from a.ds on: slab i's dS in buffer i % 2, its dK/dV pass in the caller's
// stream, its GEMM in the side stream after the pass (an event). Slab i + 2's pass waits for
// slab i's GEMM (its buffer); the caller's stream waits for the last GEMM enqueued, also when a later
// step failed (so that nothing of the call runs on after it returns). Launches after a wait on
// the other stream are plain (no programmatic overlap across an event). The events are the
// call's own, destroyed once enqueued (their resources go when their work completes).
template <int D, bool kMixed>
cudaError_t launch_slabs_beside(BwdArgs a, const StoredDsPlan& plan, cudaStream_t stream) {
  uint8_t* const ds = a.ds;
  const order::Slabs slabs = order::stored_ds_slabs(a.hkv, plan.slab);
  cudaStream_t side = nullptr;
  cudaEvent_t pass_done[2] = {}, gemm_done[2] = {};
  cudaError_t err = side_stream(&side);
  for (int b = 0; b < 2 && err == cudaSuccess; ++b) {
    err = cudaEventCreateWithFlags(&pass_done[b], cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&gemm_done[b], cudaEventDisableTiming);
  }
  int last_gemm = -1;  // buffer of the last GEMM whose completion is recorded
  for (int i = 0, hk0 = 0; i < slabs.count && err == cudaSuccess; ++i, hk0 += a.ds_hkv) {
    const int b = i & 1;
    a.ds_hk0 = hk0;
    a.ds_hkv = slabs.heads(i);
    a.ds = ds + size_t(b) * plan.slab_bytes;
    if (i >= 2 && (err = cudaStreamWaitEvent(stream, gemm_done[b], 0)) != cudaSuccess) break;
    if ((err = launch_slab_pass<D, kMixed>(a, stream, i < 2)) != cudaSuccess) break;
    if ((err = cudaEventRecord(pass_done[b], stream)) != cudaSuccess) break;
    if ((err = cudaStreamWaitEvent(side, pass_done[b], 0)) != cudaSuccess) break;
    if ((err = launch_slab_gemm<D, kMixed>(a, side, false)) != cudaSuccess) break;
    if ((err = cudaEventRecord(gemm_done[b], side)) != cudaSuccess) break;
    last_gemm = b;
  }
  if (last_gemm >= 0) {
    const cudaError_t joined = cudaStreamWaitEvent(stream, gemm_done[last_gemm], 0);
    if (err == cudaSuccess) err = joined;
  }
  for (int b = 0; b < 2; ++b) {
    if (pass_done[b] != nullptr) (void)cudaEventDestroy(pass_done[b]);
    if (gemm_done[b] != nullptr) (void)cudaEventDestroy(gemm_done[b]);
  }
  return err;
}

// The stored dS: the documents' bases, then per slab of at most plan.slab kv heads the
// dK/dV pass (writes the slab's dS) and the dQ GEMM (reads it). The heads are dealt out
// evenly (order::stored_ds_slabs). With one buffer (plan.buffers == 1) the next slab's dK/dV
// waits for this slab's GEMM before it writes dS, all in the caller's stream, and each launch
// may start beside the one before it (launch_kernel; in its last wave, or beside the one-block
// ds_doc_bases): its CTAs set up and load what does not depend on that launch, then wait for
// it. With two, launch_slabs_beside, except in a stream being captured into a graph, which
// keeps the one-buffer order.
template <int D, bool kMixed>
cudaError_t launch_backward_stored_dq(BwdArgs a, int num_docs, const StoredDsPlan& plan, uint8_t* ds,
                                      int64_t* doc_base, cudaStream_t stream) {
  constexpr int kDkdvSmem = DkdvSmem<D, kMixed, false, true>::kAlloc, kDqSmem = DqStoredSmem<D, kMixed>::kAlloc;
  cudaError_t err = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, kMixed, false, true>), kDkdvSmem);
  if (err == cudaSuccess) err = FLAMIA_ALLOW_DYNAMIC_SMEM((dq_stored_kernel<D, kMixed>), kDqSmem);
  if (err != cudaSuccess) return err;
  if ((err = launch_kernel(ds_doc_bases, 1, 1024, 0, stream, true, a.cu_seqlens, num_docs, a.total_tokens, a.causal,
                           doc_base)) != cudaSuccess)
    return err;
  a.ds_doc_base = doc_base;
  a.ds = ds;
  if (plan.buffers == 2) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if ((err = cudaStreamIsCapturing(stream, &capture)) != cudaSuccess) return err;
    if (capture == cudaStreamCaptureStatusNone) return launch_slabs_beside<D, kMixed>(a, plan, stream);
  }
  const order::Slabs slabs = order::stored_ds_slabs(a.hkv, plan.slab);
  for (int i = 0, hk0 = 0; i < slabs.count; ++i, hk0 += a.ds_hkv) {
    a.ds_hk0 = hk0;
    a.ds_hkv = slabs.heads(i);
    if ((err = launch_slab_pass<D, kMixed>(a, stream, true)) != cudaSuccess ||
        (err = launch_slab_gemm<D, kMixed>(a, stream, true)) != cudaSuccess)
      return err;
  }
  return cudaSuccess;
}

// The maps of the streamed tiles. Row tiles: 64 tokens of one head of a natural [T][H][D]
// copy, box {D, 1, 64}, D-byte swizzle (the fast forward's q8 map). Column tiles: D rows of
// 64 token positions of one head of a transposed [H * D][Tpad] copy, box {64, D}, 64-byte
// swizzle (the fast forward's vt8 map with 64-position boxes).
cudaError_t encode_row_map(CUtensorMap* map, const uint8_t* codes, int64_t total_tokens, int heads, int head_dim) {
  const uint64_t D = uint64_t(head_dim);
  const uint64_t dims[3] = {D, uint64_t(heads), uint64_t(total_tokens)}, strides[2] = {D, uint64_t(heads) * D};
  const uint32_t box[3] = {uint32_t(D), 1, uint32_t(kTileTokens)};
  return encode_u8_map(map, codes, 3, dims, strides, box, head_dim);
}
cudaError_t encode_col_map(CUtensorMap* map, const uint8_t* codes, int64_t tpad, int heads, int head_dim) {
  const uint64_t dims[2] = {uint64_t(tpad), uint64_t(heads) * uint64_t(head_dim)}, strides[1] = {uint64_t(tpad)};
  const uint32_t box[2] = {uint32_t(kTileTokens), uint32_t(head_dim)};
  return encode_u8_map(map, codes, 2, dims, strides, box, kTileTokens);
}
// The step of this thread's last backward that returned an error (backward_failed_step).
thread_local const char* t_failed_step = "";

cudaError_t failed(const char* step, cudaError_t err) {
  t_failed_step = step;
  return err;
}


}  // namespace
}  // namespace bwd

const char* backward_failed_step() { return bwd::t_failed_step; }

cudaError_t backward(const Params& p, const void* dout, int64_t dout_stride_t, int64_t dout_stride_h,
                     const void* out, const float* lse, const void* qkv8, void* workspace,
                     size_t workspace_bytes, void* dq, void* dk, void* dv) {
  using namespace bwd;
  t_failed_step = "";
  if (p.total_tokens == 0) return cudaSuccess;
  if (p.head_dim != 64 && p.head_dim != 128) return failed("head_dim", cudaErrorInvalidValue);
  const bool mixed = p.recipe == FLAMIA_RECIPE_FP8_MIXED;
  if (!quant::rows_16b_aligned(dout, dout_stride_t, dout_stride_h) ||
      !quant::rows_16b_aligned(out, dout_stride_t, dout_stride_h))
    return failed("dout and out rows 16-byte aligned", cudaErrorInvalidValue);
  if (mixed && (p.q == nullptr || p.k == nullptr || !quant::rows_16b_aligned(p.q, p.q_stride_t, p.q_stride_h) ||
                !quant::rows_16b_aligned(p.k, p.k_stride_t, p.k_stride_h)))
    return failed("q and k (fp8_mixed reads them) present, rows 16-byte aligned", cudaErrorInvalidValue);
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                              p.recipe, true);
  // The fused dQ: selected, and no q_start (its rows before q_start would be written).
  const bool fused_selected = backward_dq_fused(p.recipe, p.head_dim);
  const bool fused = fused_selected && p.q_start == nullptr;
  const StoredDsPlan plan =
      stored_ds_plan(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, p.max_seqlen, p.causal);
  const auto ws_layout = quant::BwdWorkspaceLayout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                                         p.recipe, fused_selected, plan.bytes);
  // The stored dS where it is on and the workspace holds it (the caller sized it with
  // backward_workspace_bytes_for); else the dQ pass, which needs no more than
  // backward_workspace_bytes: the stored tiles come last, so every other offset is the same.
  const bool stored = plan.slab > 0 && ws_layout.bytes <= workspace_bytes;
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const uint8_t* base = static_cast<const uint8_t*>(qkv8);

  // The maps first: a failing encode returns before anything is launched.
  BwdArgs a{};
  a.q8 = base + layout.q8;
  a.k8 = base + layout.k8;
  a.v8 = base + layout.v8;
  a.do8 = ws + ws_layout.do8;
  const int64_t T = p.total_tokens;
  cudaError_t err;
  if ((err = encode_row_map(&a.q8_rows, a.q8, T, p.hq, p.head_dim)) != cudaSuccess) return failed("tensor map q8", err);
  if ((err = encode_row_map(&a.do8_rows, a.do8, T, p.hq, p.head_dim)) != cudaSuccess) return failed("tensor map do8", err);
  if ((err = encode_row_map(&a.k8_rows, a.k8, T, p.hkv, p.head_dim)) != cudaSuccess) return failed("tensor map k8", err);
  if ((err = encode_row_map(&a.v8_rows, a.v8, T, p.hkv, p.head_dim)) != cudaSuccess) return failed("tensor map v8", err);
  if (mixed) {
    // fp8_mixed's BF16 operands: the caller's q, k and dO rows.
    if ((err = encode_natural_map(&a.do_b, dout, T, p.hq, p.head_dim, dout_stride_t, dout_stride_h)) != cudaSuccess)
      return failed("tensor map dout", err);
    if ((err = encode_natural_map(&a.q_b, p.q, T, p.hq, p.head_dim, p.q_stride_t, p.q_stride_h)) != cudaSuccess)
      return failed("tensor map q", err);
    if ((err = encode_natural_map(&a.k_b, p.k, T, p.hkv, p.head_dim, p.k_stride_t, p.k_stride_h)) != cudaSuccess)
      return failed("tensor map k", err);
    a.nonfinite_qk = reinterpret_cast<const uint32_t*>(base + layout.nonfinite);
    a.nonfinite_do = reinterpret_cast<const uint32_t*>(ws + ws_layout.nonfinite);
  } else {
    // fp8's: dOᵀ from the dO quantizer, Qᵀ and Kᵀ from transpose_qk_codes (below).
    if ((err = encode_col_map(&a.do_b, ws + ws_layout.dot8, layout.tpad, p.hq, p.head_dim)) != cudaSuccess)
      return failed("tensor map dot8", err);
    if ((err = encode_col_map(&a.q_b, ws + ws_layout.qt, layout.tpad, p.hq, p.head_dim)) != cudaSuccess)
      return failed("tensor map qt", err);
    if ((err = encode_col_map(&a.k_b, ws + ws_layout.kt, layout.tpad, p.hkv, p.head_dim)) != cudaSuccess)
      return failed("tensor map kt", err);
  }
  a.sq = reinterpret_cast<const float*>(base + layout.sq);
  a.sk = reinterpret_cast<const float*>(base + layout.sk);
  a.sv = reinterpret_cast<const float*>(base + layout.sv);
  a.sdo = reinterpret_cast<const float*>(ws + ws_layout.sdo);
  a.dvec = reinterpret_cast<const float*>(ws + ws_layout.dvec);
  a.lse2 = reinterpret_cast<const float*>(ws + ws_layout.lse2);
  a.status = reinterpret_cast<const guard::DeviceError*>(ws + ws_layout.status);
  a.cu_seqlens = p.cu_seqlens;
  a.q_start = p.q_start;
  a.work = work_list(base, layout, layout.fwd_work);
  a.items = work_list(base, layout, layout.fwd_work64);  // capacity 0 at D = 128, where no pass walks it
  a.dq = static_cast<uint16_t*>(dq);
  a.dq_acc = fused ? reinterpret_cast<float*>(ws + ws_layout.dq_acc) : nullptr;
  int64_t* ds_doc_base = nullptr;
  uint8_t* ds = nullptr;
  if (stored) {
    ds_doc_base = reinterpret_cast<int64_t*>(ws + ws_layout.ds);
    ds = ws + ws_layout.ds + plan.base_bytes;
    a.ds_head_tiles = plan.head_tiles;
  }
  a.dk = static_cast<uint16_t*>(dk);
  a.dv = static_cast<uint16_t*>(dv);
  const int64_t kv_row = int64_t(p.hkv) * p.head_dim;
  const int64_t q_row = int64_t(p.hq) * p.head_dim;
  a.rows_by_tma = quant::rows_16b_aligned(dk, kv_row, p.head_dim) && quant::rows_16b_aligned(dv, kv_row, p.head_dim) &&
                  quant::rows_16b_aligned(dq, q_row, p.head_dim);
  if (a.rows_by_tma) {
    if ((err = encode_natural_map(&a.dq_rows, dq, T, p.hq, p.head_dim, q_row, p.head_dim)) != cudaSuccess)
      return failed("tensor map dq", err);
    if ((err = encode_natural_map(&a.dk_rows, dk, T, p.hkv, p.head_dim, kv_row, p.head_dim)) != cudaSuccess)
      return failed("tensor map dk", err);
    if ((err = encode_natural_map(&a.dv_rows, dv, T, p.hkv, p.head_dim, kv_row, p.head_dim)) != cudaSuccess)
      return failed("tensor map dv", err);
  }
  a.total_tokens = p.total_tokens;
  a.hq = p.hq;
  a.hkv = p.hkv;
  a.kv_block = order::backward_kv_block(p.hkv);
  a.causal = p.causal;
  a.c = p.softmax_scale * kLog2e;
  a.softmax_scale = p.softmax_scale;

  if ((err = quant::quantize_dout(p, dout, dout_stride_t, dout_stride_h, out, lse, base, layout, ws, ws_layout)) !=
      cudaSuccess)
    return failed("quantize_dout", err);
  if (!mixed && (err = quant::transpose_qk_codes(p, base, layout, ws, ws_layout)) != cudaSuccess)
    return failed("transpose_qk_codes", err);
  if (fused)
    err = launch_backward_fused_dq(a, p.stream);
  else if (stored)
    err = p.head_dim == 64
              ? (mixed ? launch_backward_stored_dq<64, true>(a, p.num_docs, plan, ds, ds_doc_base, p.stream)
                       : launch_backward_stored_dq<64, false>(a, p.num_docs, plan, ds, ds_doc_base, p.stream))
              : (mixed ? launch_backward_stored_dq<128, true>(a, p.num_docs, plan, ds, ds_doc_base, p.stream)
                       : launch_backward_stored_dq<128, false>(a, p.num_docs, plan, ds, ds_doc_base, p.stream));
  else if (p.head_dim == 64)
    err = mixed ? launch_backward<64, true>(a, p.stream) : launch_backward<64, false>(a, p.stream);
  else
    err = mixed ? launch_backward<128, true>(a, p.stream) : launch_backward<128, false>(a, p.stream);
  return err == cudaSuccess ? err : failed("the dK/dV and dQ kernels (attributes, launches)", err);
}

}  // namespace sm90
}  // namespace flamia
