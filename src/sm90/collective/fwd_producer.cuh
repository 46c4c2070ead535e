// The forward's producer warp: takes the CTA's work items and keeps the pipeline full. The
// first item of CTA b is item b, each later one the grid size plus the counter's next value
// (fetched while the item's loads go out), so a CTA that finishes early takes more items.
// Per item with key tiles, once a Q buffer is free (Plan::kQBuffers), it writes the decoded
// item into the buffer's slot (or that none is left), loads the consumers' 64-row Q tiles and copies
// the rows' sq by cp.async, all announced by the buffer's q_full; per key tile it waits for a
// free stage, writes the tile's key count into it, starts the TMA loads of K and Vᵀ, and
// copies the tile's 128 key scales sk, sv with plain loads (one contiguous run of an [H][T]
// array, whose start need not be 16-byte aligned, which a TMA box start would have to be) by
// cp.async, in the order the consumers read them (lane_column_index). After the last item
// one more stage with no keys ends the key-scale warp's walk.
//
// Rows past the document end are loaded as they are (the next document's codes, or TMA's
// zeros past the tensor): the consumers mask them by selection, and the quantizer's codes are
// always finite, so 0 * code in P·V contributes exactly 0.
#pragma once

#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/tma.cuh"
#include "sm90/collective/fwd_plan.cuh"
#include "sm90/collective/fwd_softmax.cuh"
#include "sm90/ptx.cuh"

namespace flamia {
namespace sm90 {
namespace fwd {

template <int D, bool kMayBeside>
__device__ __forceinline__ void producer(const Params& p, uint8_t* smem, uint32_t base, int lane) {
  using P = Plan<D>;
  const uint32_t full0 = base + P::kFull0, empty0 = base + P::kEmpty0;
  if (lane == 0) {
    tma::prefetch_map(p.q8);
    tma::prefetch_map(p.k8);
    tma::prefetch_map(p.vt8);
  }
  // Beside the quantizer (p.ready, quant::BesideReady): before loading an item's rows of kv
  // block kb at padded positions [first, last], lane 0 waits for the quantizer's counts of the
  // position blocks they lie in — a kv block found complete is not asked again —, then the
  // warp goes on: its copies after the acquires, the TMA loads after the proxy fence.
  int done_kb = -1;
  auto wait_quantized = [&](int kb, int64_t first, int64_t last) {
    if (!beside_quantizer<kMayBeside>(p) || kb == done_kb) return;
    int complete = 0;
    if (lane == 0) {
      using quant::BesideReady;
      complete = ptx::ld_acquire_gpu(p.ready + BesideReady::kv_done(p.tpad, p.hkv, kb)) >= p.ready_kv_block;
      const int64_t c_last = min(last, p.tpad - 1) / BesideReady::kBlockPositions;
      for (int64_t c = max(first, int64_t(0)) / BesideReady::kBlockPositions; !complete && c <= c_last; ++c)
        while (ptx::ld_acquire_gpu(p.ready + BesideReady::block(p.tpad, kb, c)) < p.ready_block) __nanosleep(128);
      ptx::fence_proxy_async_global();
    }
    if (__shfl_sync(0xffffffffu, complete, 0)) done_kb = kb;
    __syncwarp();
  };
  // The last padded position the rows [off, off + n) of an item's document reach: rows past
  // the document are the next documents' tokens (the consumers select them away, but they
  // must be finite), whose positions lie at most 15 + 16 (B - 1) past their token index.
  auto last_position = [&](const DocTile& dt, int off, int n) {
    return off + n <= dt.len ? dt.pstart + off + n - 1 : dt.tok0 + off + n - 1 + 15 + 16 * int64_t(p.work.num_docs - 1);
  };
  if (beside_quantizer<kMayBeside>(p)) {
    if (lane == 0) {
      while (ptx::ld_acquire_gpu(p.ready + quant::BesideReady::lists(p.tpad, p.hkv)) < 1) __nanosleep(128);
      ptx::fence_proxy_async_global();
    }
    __syncwarp();
  }
  const int items = item_count(p.work) * p.hq;
  int kv = 0;  // key tiles issued so far (stage = kv % kStages, phase = kv / kStages)
  // Beside the quantizer every item comes from the count, the first too: the CTAs that find
  // their SM taken by the quantizer start at its end and must not hold the first items back.
  const int first_claimed = beside_quantizer<kMayBeside>(p) ? 0 : int(gridDim.x);
  auto claim_next = [&]() { return first_claimed + atomicAdd(p.next_item, 1); };  // lane 0's
  auto take_next = [&]() { return __shfl_sync(0xffffffffu, lane == 0 ? claim_next() : 0, 0); };
  // A token's scale of an [H][T] scale array by cp.async; past the tensor zero-filled.
  auto copy_scale = [&](uint32_t dst, const float* head_scales, int64_t tok) {
    const bool in = tok < p.total_tokens;
    ptx::cp_async_4(dst, head_scales + (in ? tok : 0), in);
  };
  for (int w = beside_quantizer<kMayBeside>(p) ? take_next() : int(blockIdx.x), it = 0;; ++it) {
    // An item without key tiles (keys-only rows before q_start, an empty document) has
    // nothing to compute and stores nothing (its rows' O and LSE are not this call's to
    // write): it is not announced, so that some consumer computes every announced item.
    Item item;
    while (w < items && (item = item_at<D>(p, w)).num_key_tiles == 0) w = take_next();
    // Buffer b and its slot are free once the consumers are done with the item kQBuffers
    // before this one (every consumer thread releases its own reads of the slot).
    const int b = it % P::kQBuffers;
    const uint32_t q_full = base + P::kQFull0 + 8 * b;
    ItemSlot* const slot = reinterpret_cast<ItemSlot*>(smem + P::slot(b));
    mbar::wait(base + P::kQEmpty0 + 8 * b, ((it / P::kQBuffers) & 1) ^ 1);
    if (w >= items) {
      // None left: lane 0 announces it, every lane arrives as for an item (lane 0 twice).
      if (lane == 0) {
        slot->more = 0;
        mbar::arrive(q_full);
      }
      mbar::arrive(q_full);
      break;
    }
    const int64_t tok0 = item.dt.tok0;
    const int m0 = item_rows<D>(item.dt).first;
    // Its Q rows and every key tile it loads (from the document's first), at once: the
    // quantizer goes through a kv block's positions in order, so the wait is for the last.
    wait_quantized(item.hk / p.kv_block, item.dt.pstart,
                   last_position(item.dt, 0, max(m0 + P::kBlockM, item.num_key_tiles * P::kBlockN)));
    int next = 0;
    if (lane == 0) {
      slot->item = item;
      slot->more = 1;
      mbar::arrive_expect_tx(q_full, P::kConsumers * P::kQTile);
#pragma unroll
      for (int c = 0; c < P::kConsumers; ++c)
        tma::load_3d(base + P::q_buffer(b) + c * P::kQTile, p.q8, q_full, 0, item.h,
                     int(tok0 + m0 + c * P::kRowsPerConsumer));
      next = claim_next();
    }
    {
      // The rows' sq (one contiguous run of the [Hq][T] array; past the tensor zero-filled,
      // past the document selected away by the consumers).
      const uint32_t sq_dst = base + P::slot(b) + P::kSlotSq;
      const float* const sq_head = p.sq + int64_t(item.h) * p.total_tokens;
#pragma unroll
      for (int k = 0; k < P::kBlockM / 32; ++k) {
        const int i = lane + 32 * k;
        copy_scale(sq_dst + 4 * i, sq_head, tok0 + m0 + i);
      }
      mbar::arrive_when_copies_land(q_full);
    }
    for (int n = 0; n < item.num_key_tiles; ++n, ++kv) {
      const int s = kv % P::kStages;
      const uint32_t full = full0 + 8 * s, stage = base + P::stage(s);
      mbar::wait(empty0 + 8 * s, ((kv / P::kStages) & 1) ^ 1);
      const int n0 = n * P::kBlockN;
      if (lane == 0) {
        *reinterpret_cast<volatile int*>(smem + P::stage(s) + P::kValid) = item.dt.len - n0;
        mbar::arrive_expect_tx(full, P::kTmaBytesPerStage);
        tma::load_3d(stage + P::kK, p.k8, full, 0, item.hk, int(tok0 + n0));
        tma::load_2d(stage + P::kVt, p.vt8, full, int(item.dt.pstart + n0), item.hk * D);
      }
      // cp.async: the copies need no registers and the lane's arrival on `full` fires when
      // they have landed, so the warp moves on to the next stage at once.
      const uint32_t sk_dst = stage + P::kSk, sv_dst = stage + P::kSv;
      const int64_t head_off = int64_t(item.hk) * p.total_tokens;
#pragma unroll
      for (int k = 0; k < P::kBlockN / 32; ++k) {
        const int j = lane + 32 * k;  // keys past the tensor are masked anyway
        copy_scale(sk_dst + 4 * lane_column_index(j), p.sk + head_off, tok0 + n0 + j);
        copy_scale(sv_dst + 4 * lane_column_index(j), p.sv + head_off, tok0 + n0 + j);
      }
      mbar::arrive_when_copies_land(full);
    }
    w = __shfl_sync(0xffffffffu, next, 0);
  }
  // The key-scale warp's last stage: no keys (its `full` without bytes: every lane arrives,
  // lane 0 twice, as for a loaded stage).
  const int s = kv % P::kStages;
  mbar::wait(empty0 + 8 * s, ((kv / P::kStages) & 1) ^ 1);
  if (lane == 0) {
    *reinterpret_cast<volatile int*>(smem + P::stage(s) + P::kValid) = 0;
    mbar::arrive(full0 + 8 * s);
  }
  mbar::arrive(full0 + 8 * s);
}

// The producer warpgroup's second warp: P's key-rule scale of every key tile (ALGORITHM.md
// §2 step 5: sigma = pow2_scale(pm * Y), Y the maximum of sv over a row's visible keys of the
// tile, pm = kRescaleP for the rows whose maxima stay within the lazy reference's threshold),
// from the stage's sv once it has landed. It writes the prefix maxima of sv over the
// tile's keys inside the document (a row's Y is the entry of its last visible key), sigma of
// the whole tile and svn = sv * (1 / sigma) in the consumers' order, then arrives on the
// stage's `ready` barrier. Keys past the document enter no maximum (they are no row's
// visible keys); NaN propagates (max.NaN), as the specification's maximum does.
// Lane l scans keys 4 l .. 4 l + 3: a scan within the lane, then across lanes.
template <int D>
__device__ __forceinline__ void key_scales(uint8_t* smem, uint32_t base, int lane) {
  using P = Plan<D>;
  const uint32_t full0 = base + P::kFull0, empty0 = base + P::kEmpty0, ready0 = base + P::kReady0;
  // Stage by stage in the producer's order, to the stage without keys it ends with.
  for (int kv = 0;; ++kv) {
    const int s = kv % P::kStages;
    // The consumers left the stage's previous use (as the producer waits before refilling it;
    // implied by `full` below, but waited for directly so that every read of the old values
    // is ordered before these writes by the barrier itself), and this use has landed.
    mbar::wait(empty0 + 8 * s, ((kv / P::kStages) & 1) ^ 1);
    mbar::wait(full0 + 8 * s, (kv / P::kStages) & 1);
    uint8_t* st = smem + P::stage(s);
    const float* sv = reinterpret_cast<const float*>(st + P::kSv);
    // Keys of the tile inside the document (>= 1; 0: no tile is left).
    const int valid = *reinterpret_cast<volatile const int*>(st + P::kValid);
    if (valid <= 0) break;
    float y[4];
    float run = 0.0f;  // sv > 0: 0 is the maximum of no key
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 4 * lane + k;
      if (j < valid) run = ptx::max_nan(run, sv[lane_column_index(j)]);
      y[k] = run;
    }
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, run, d);
      if (lane >= d) run = ptx::max_nan(run, up);
    }
    float before = __shfl_up_sync(0xffffffffu, run, 1);
    if (lane == 0) before = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) y[k] = ptx::max_nan(before, y[k]);
    *reinterpret_cast<float4*>(st + P::kYpre + 16 * lane) = make_float4(y[0], y[1], y[2], y[3]);
    const int last = min(valid, P::kBlockN) - 1;
    const float mine = (last & 3) == 0 ? y[0] : (last & 3) == 1 ? y[1] : (last & 3) == 2 ? y[2] : y[3];
    const float yt = __shfl_sync(0xffffffffu, mine, last >> 2);  // Y of a row that sees the whole tile
    // pm = kRescaleP (the rows' maxima within the lazy reference's threshold): exact, a power of two.
    const float sigma = fmt::pow2_scale_e4m3(__fmul_rn(kRescaleP, yt)), inv = fmt::pow2_reciprocal(sigma);
    float* svn = reinterpret_cast<float*>(st + P::kSvn);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int at = lane_column_index(4 * lane + k);
      svn[at] = __fmul_rn(sv[at], inv);
    }
    if (lane == 0) *reinterpret_cast<float*>(st + P::kSigma) = sigma;
    mbar::arrive(ready0 + 8 * s);  // every lane, releasing its own writes
  }
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
