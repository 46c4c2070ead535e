// A consumer warpgroup of the forward: 64 query rows of the CTA's query tile, over the key
// tiles the producer streams in (ALGORITHM.md §2). Per key tile:
//   S = Q Kᵀ          wgmma m64n128k32, D/32 k-steps chained in the accumulator, ascending k
//                     (the definition of S the backward shares);
//   softmax           fwd_softmax.cuh: online max/sum, p8 = e4m3(p * (sv / sigma)), sigma
//                     from the keys' V scales (the key-scale warp's, fwd_producer.cuh);
//   fresh = p8 Vᵀ     wgmma m64nDk32 with A = p8 from registers, 4 k-steps (128 keys) into a
//                     fresh accumulator;
//   acc = acc * alpha + sigma * fresh    (FP32; sigma * fresh is exact: one FFMA, acc * alpha
//                     taken in the softmax, and only where a row's reference moved).
// Software-pipelined across items: the P·V of tile n and the S of the next tile (the next
// item's first at an item's last) are issued together, and the fold of P·V(n) — at an item's
// end also O's store — runs while the tensor core computes that S (Plan::kScoresInFlight;
// else the S is issued after the fold). The consumer warpgroups issue as they come (the
// tensor core queues their MMAs): a ping-pong turn between two cost 2.6 % at D = 64 and,
// since v77, 0.6-1.1 % at D = 128 (docs/PERFORMANCE.md v23a, v78).
//
// A consumer computes the key tiles its own rows see (consumer_key_tiles, fwd_plan.cuh): on
// the causal diagonal of a 192-row item one fewer than the item's last consumer, and none in
// an item whose rows it has none of (a document's short first item, rows before q_start).
// It releases the stages of the tiles it does not compute as they land, holding no stage of
// its own then.
#pragma once

#include <cmath>

#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/collective/fwd_plan.cuh"
#include "sm90/collective/fwd_softmax.cuh"
#include "sm90/kit/phase_trace.cuh"
#include "sm90/kit/rows_out.cuh"

namespace flamia {
namespace sm90 {
namespace fwd {

// The epilogue's rows out (kit/rows_out.cuh) synchronize each consumer on a barrier of its own.
constexpr int kEpilogueBarrier = warpgroup::kFirstNamedBarrier;  // + the consumer's index

// phases: the phase clocks (kit/phase_trace.cuh; trace::Off in the production kernel).
template <int D, class Trace>
__device__ __forceinline__ void consumer(const Params& p, const uint8_t* smem, uint32_t base, int consumer_idx,
                                         Trace phases) {
  using P = Plan<D>;
  const uint32_t full0 = base + P::kFull0, empty0 = base + P::kEmpty0, ready0 = base + P::kReady0;
  const int tid = int(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, q = lane & 3;

  // The producer's items (fwd_producer.cuh) arrive in the Q buffers in turn, each announced
  // by its buffer's q_full with its slot: the decoded item (or that none is left) and its
  // rows' sq. Every lane reads the slot itself and releases its reads on q_empty once the
  // item's last S is done.
  int announced = 0;  // items announced so far, the last one's included
  auto newest_buffer = [&]() { return (announced - 1) % P::kQBuffers; };
  auto next_announced = [&]() {
    const int b = announced % P::kQBuffers;
    mbar::wait(base + P::kQFull0 + 8 * b, (announced / P::kQBuffers) & 1);
    ++announced;
    return reinterpret_cast<const volatile ItemSlot*>(smem + P::slot(b))->more != 0;
  };

  // The current item (in buffer qb), the key tiles of it this consumer computes, and what
  // its rows carry across them.
  Item item;
  int qb = 0;
  int mine = 0;
  int m0 = 0;  // this warpgroup's first row, document-local
  int i0 = 0;  // this lane's first row, document-local
  float sq[2], sqc[2];
  float acc[D / 8][4];
  constexpr bool kFirstFoldWrites = D == 128;
  RowState rows;
  auto q_tile = [&](int b) { return base + P::q_buffer(b) + consumer_idx * P::kQTile; };
  auto begin_item = [&]() {
    qb = newest_buffer();
    const uint8_t* slot = smem + P::slot(qb);
    item = reinterpret_cast<const ItemSlot*>(slot)->item;
    mine = consumer_key_tiles<D>(item, p.causal, consumer_idx);
    const int r0 = consumer_idx * P::kRowsPerConsumer + 16 * warp + g;  // in the item's tile
    m0 = item_rows<D>(item.dt).first + consumer_idx * P::kRowsPerConsumer;
    i0 = m0 + 16 * warp + g;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float rows_sq = reinterpret_cast<const float*>(slot + P::kSlotSq)[r0 + 8 * r];
      // Rows past the document (not stored) take sq = 0: their Q rows are the next tokens'
      // codes, whose raw products would jump their maxima past the lazy reference and make
      // the warp retake unmasked tiles; with sq = 0 their scores there are 0. In a masked
      // tile (an item's last: the diagonal, the document's end) such a row sees no key, so
      // its maximum becomes -inf * 0 = NaN and the warp votes a rescale there: alpha is 1 for
      // the real rows that kept their reference, so only the path changes, not their bits.
      sq[r] = i0 + 8 * r < item.dt.len ? rows_sq : 0.0f;
      sqc[r] = __fmul_rn(sq[r], p.c);
    }
    // At D = 128 acc is not zeroed: the item's first fold (n = 0) writes it. At D = 64 that
    // form measured 1.2 % slower (docs/PERFORMANCE.md v73), so there the zeroing stays.
    if constexpr (!kFirstFoldWrites) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
    }
    rows = RowState();
    phases.mark(trace::kItemStart);
  };

  int kv = 0;  // key tiles of earlier items: the ring position of the current item's first
  // Tile n's stage and phase in the ring (n may run past the item: its successor's tiles).
  auto stage_of = [&](int n) { return (kv + n) % P::kStages; };
  auto phase_of = [&](int n) { return ((kv + n) / P::kStages) & 1; };
  // Tile n's stage has landed, for a tile this consumer computes (the phase clocks mark the
  // wait's start and end apart).
  auto wait_landed = [&](int n) {
    phases.mark(trace::kStageWait);
    mbar::wait(full0 + 8 * stage_of(n), phase_of(n));
    phases.mark(trace::kStageLanded);
  };
  // A tile this consumer does not compute: its stage released once loaded (an arrival before
  // the fill would count toward the stage's previous use).
  auto release = [&](int n) {
    mbar::wait(full0 + 8 * stage_of(n), phase_of(n));
    mbar::arrive(empty0 + 8 * stage_of(n));
  };
  // The item announced last, and whether this consumer has rows in it.
  auto newest_item = [&]() -> const Item& {
    return reinterpret_cast<const ItemSlot*>(smem + P::slot(newest_buffer()))->item;
  };
  auto newest_is_mine = [&]() { return consumer_key_tiles<D>(newest_item(), p.causal, consumer_idx) > 0; };
  // From the item announced last (ring position kv) on, the items this consumer has no rows
  // of are released — the slot on q_empty, every tile's stage — until one it has; returns
  // false when none is left. Called holding no stage, so that each wait can complete.
  auto skip_to_mine = [&]() {
    while (!newest_is_mine()) {
      const int span = newest_item().num_key_tiles;
      mbar::arrive(base + P::kQEmpty0 + 8 * newest_buffer());
      for (int n = 0; n < span; ++n) release(n);
      kv += span;
      if (!next_announced()) return false;
    }
    return true;
  };
  auto issue_scores = [&](ScoreTile& sc, int n, uint32_t q) {
    const uint32_t stage = base + P::stage(stage_of(n));
    mma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks)
      mma::ss(sc, mma::desc<P::kQKRowBytes>(q, ks), mma::desc<P::kQKRowBytes>(stage + P::kK, ks), ks > 0);
    mma::commit();
  };
  TileP tp;
  static_assert((P::kSumsInFold && P::kPackAsFormed) || !P::kSpeculativeSoftmax,
                "the lazy pass leaves its row sums to the fold and its retake packs P8 as formed");
  auto softmax = [&](ScoreTile& sc, int n) {
    if (n + 1 == mine) mbar::arrive(base + P::kQEmpty0 + 8 * qb);  // Q and the slot no longer read
    mbar::wait(ready0 + 8 * stage_of(n), phase_of(n));  // the key-scale warp's values
    const uint8_t* st = smem + P::stage(stage_of(n));
    const KeyScales ks{reinterpret_cast<const float*>(st + P::kSk), reinterpret_cast<const float*>(st + P::kSv),
                       reinterpret_cast<const float*>(st + P::kSvn), reinterpret_cast<const float*>(st + P::kYpre),
                       *reinterpret_cast<const float*>(st + P::kSigma)};
    const int n0 = n * P::kBlockN;
    const DocMask mask{item.dt.len, p.causal};
    bool rescale = false;
    constexpr int kN = kMaxFirstChains<D>;
    if (mask_needed_for_rows(mask, m0, n0, P::kBlockN)) {
      // A warp whose rows see none of the tile's last 64 keys (the first consumer's on the
      // causal diagonal; rows that end the document early in the tile) skips those two key
      // steps. The test is warp-uniform (broadcast from lane 0).
      const int last_row = m0 + 16 * warp + 15;
      const int steps = masked_key_steps(mask, last_row, n0);
      if (__shfl_sync(0xffffffffu, steps, 0) <= kKeySteps / 2)
        rescale = softmax_tile<true, kN, P::kSumsInFold, P::kPackAsFormed, kKeySteps / 2>(
            sc, ks, sq, sqc, mask, i0, n0, p.c, rows, tp, phases);
      else
        rescale = softmax_tile<true, kN, P::kSumsInFold, P::kPackAsFormed>(sc, ks, sq, sqc, mask, i0, n0, p.c,
                                                                           rows, tp, phases);
    } else if (n == 0 || !P::kSpeculativeSoftmax) {
      rescale = softmax_tile<false, kN, P::kSumsInFold, P::kPackAsFormed>(sc, ks, sq, sqc, mask, i0, n0, p.c,
                                                                          rows, tp, phases);
    } else {
      rescale = softmax_tile_lazy(sc, ks, sq, sqc, mask, i0, n0, p.c, rows, tp, phases);
    }
    // acc holds the rows' tiles before n, folded (the fold of n - 1 is done): a moved reference
    // rescales it here, so that the fold is one FFMA an element. alpha is 1 for the rows that
    // kept theirs (acc * 1 == acc, the same bits). The item's first tile has no earlier
    // accumulation (its fold writes or adds onto zeros). At D = 64 every later tile rescales:
    // the vote's flag live across the softmax spilled O's registers in the loop there.
    if ((rescale || !P::kSpeculativeSoftmax) && n > 0) {
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[d][e] = __fmul_rn(acc[d][e], tp.alpha[e >> 1]);
    }
    phases.mark(trace::kSoftmaxDone);
  };
  auto issue_pv = [&](float (&fresh)[D / 8][4], int n) {
    const uint32_t stage = base + P::stage(stage_of(n));
    mma::pin(tp.p8);
    mma::fence();
#pragma unroll
    for (int kk = 0; kk < P::kBlockN / 32; ++kk)
      mma::rs(fresh, tp.p8[kk], mma::desc<P::kVtRowBytes>(stage + P::kVt, kk), kk > 0);
    mma::commit();
  };
  // acc = acc + sigma * fresh, once P·V(n) is done (the caller waited), and the tile's row sums
  // into l where Plan::kSumsInFold (add_row_sums, in S's shadow); acc was rescaled by
  // alpha in the softmax of n where a reference moved (ALGORITHM.md §2 step 6: sigma * fresh
  // is exact, so the FFMA rounds what acc * alpha + sigma * fresh does).
  auto fold = [&](float (&fresh)[D / 8][4], int n) {
    mma::pin(fresh);
    mma::pin(tp.p8);
    // This warp is done with the stage: every lane releases its own reads of the stage's
    // scales (softmax), so that no ordering rests on lanes other than the arriving one.
    mbar::arrive(empty0 + 8 * stage_of(n));
    if constexpr (P::kSumsInFold) add_row_sums(rows, tp);
    // The item's first tile (kFirstFoldWrites): acc * alpha is +0 (acc 0, alpha 0 before any
    // maximum), so acc = fmaf(sigma, fresh, +0) — the same bits, a signed zero included —
    // without zeroing acc at the hand-over.
    if (kFirstFoldWrites && n == 0) {
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[d][e] = __fmaf_rn(tp.sigma[e >> 1], fresh[d][e], 0.0f);
    } else {
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[d][e] = __fmaf_rn(tp.sigma[e >> 1], fresh[d][e], acc[d][e]);
    }
  };
  // O = acc * (1 / l) in bf16 (one division per row, not per element: an IEEE division is a
  // reciprocal, its refinement and a slow-path check), LSE = (mc + log2 l) * ln 2; rows past
  // the document are not stored. The warpgroup's 64 rows leave by one TMA store when all are
  // the document's (the branch is the warpgroup's: one item), else row by row.
  auto epilogue = [&]() {
    const float inv_l[2] = {__frcp_rn(rows.l[0]), __frcp_rn(rows.l[1])};
    store_rows<D>(p.rows_by_tma, base + P::out_tile(consumer_idx), p.o_rows, p.out + item.h * D, int64_t(p.hq) * D,
                  item.h, item.dt.tok0, m0, item.dt.len, acc, inv_l, kEpilogueBarrier + consumer_idx);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + 8 * r;
      if (q == 0 && i < item.dt.len)
        p.lse[int64_t(item.h) * p.total_tokens + item.dt.tok0 + i] =
            __fmul_rn(__fadd_rn(rows.mc[r], log2f(rows.l[r])), 0.693147180559945309f);
    }
  };

  // P·V(n) into a fresh accumulator and the S of tile `next` (of the item in Q tile q), the
  // fold of P·V(n) between them on this warpgroup's side: in S's shadow on the tensor core
  // when the registers hold both (Plan::kScoresInFlight), else before S is issued. `then`
  // runs after the fold, while S is computed. next's stage is waited for after the fold when
  // S follows it (D = 64: the wait's round trip then overlaps P·V on the tensor core instead
  // of holding back its issue, -1.2 to -2.2 %, v116), before P·V when S is issued with it
  // (the same move there measured +1.7 %, v114).
  auto pv_fold_scores = [&](ScoreTile& sc, int n, int next, uint32_t q, auto&& then) {
    float fresh[D / 8][4];
    if constexpr (P::kScoresInFlight) wait_landed(next);
    issue_pv(fresh, n);
    if constexpr (P::kScoresInFlight) {
      issue_scores(sc, next, q);
      mma::wait<1>();  // P·V(n) done; S(next) may still run
      phases.mark(trace::kPvDone);
      fold(fresh, n);
    } else {
      mma::wait<0>();
      phases.mark(trace::kPvDone);
      fold(fresh, n);
      wait_landed(next);
      issue_scores(sc, next, q);
    }
    phases.mark(trace::kFoldDone);
    then();
    mma::wait<0>();
    mma::pin(sc);
    phases.mark(trace::kScoresDone);
  };
  // The current item's first S, nothing in flight.
  auto first_scores = [&](ScoreTile& sc) {
    wait_landed(0);
    issue_scores(sc, 0, q_tile(qb));
    mma::wait<0>();
    mma::pin(sc);
    phases.mark(trace::kScoresDone);
    softmax(sc, 0);
  };
  // After the current item's last fold: the tiles this consumer did not compute released, O
  // out, the ring past the item.
  auto end_item = [&]() {
    for (int n = mine; n < item.num_key_tiles; ++n) release(n);
    epilogue();
    phases.mark(trace::kItemEnd);
    kv += item.num_key_tiles;
  };

  // One software pipeline over the key tiles of all the CTA's items: tile n's P·V and the
  // next tile's S are issued together, so that the tensor core computes S while this
  // warpgroup folds P·V(n) — and, at an item's last tile, the next item's first S while it
  // folds and stores the item's O. No data-dependent branch straddles an MMA and its wait
  // (ptxas would serialize the wgmmas), so each item's last tile is peeled off in two forms.
  ScoreTile sc;
  bool more = next_announced();  // an item is announced that this consumer has not taken
  while (more && skip_to_mine()) {
    begin_item();
    first_scores(sc);
    for (;;) {
      for (int n = 0; n + 1 < mine; ++n) {
        pv_fold_scores(sc, n, n + 1, q_tile(qb), [] {});
        softmax(sc, n + 1);
      }
      // The successor is in the next Q buffer (the same one when Plan::kQBuffers is 1: its Q
      // loads once every consumer's last S of this item is done); its first key tile is ring
      // position kv + the item's span. When this consumer has rows in it, its first S runs
      // in the shadow of this item's end; else this item ends first (below), so that no
      // stage is held while the items between are skipped.
      more = next_announced();
      if (!more || !newest_is_mine()) break;
      const int span = item.num_key_tiles;
      pv_fold_scores(sc, mine - 1, span, q_tile(newest_buffer()), [&] {
        end_item();
        begin_item();
      });
      softmax(sc, 0);
    }
    float fresh[D / 8][4];
    issue_pv(fresh, mine - 1);
    mma::wait<0>();
    phases.mark(trace::kPvDone);
    fold(fresh, mine - 1);
    phases.mark(trace::kFoldDone);
    end_item();
  }
  rows_out_drain();
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
