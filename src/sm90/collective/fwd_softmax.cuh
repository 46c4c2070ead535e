// The forward's per-tile softmax and P quantization for one consumer warpgroup's 64 x 128
// score tile (ALGORITHM.md §2), in registers: lane (g, q) of warp w holds rows 16 w + g and
// 16 w + g + 8, columns 8 n + 2 q + {0, 1} of n8-tile n (n = 0..15).
//
// Instruction economy (the forward is issue-bound): the scores are left as t = sum * sk[j]
// and the row's scale enters once per row through sqc = sq[i] * c:
//   S * c = (sum * sq[i] * sk[j]) * c = t * sqc    (all factors but c are powers of two)
// so fmaf(t, sqc, -mc) rounds the same exact product that fmaf(S, c, -mc) does in the
// specification, and max_j S_j = sq[i] * max_j t_j. P's scale follows from the keys' V scales
// (the key rule), so no maximum over the scores' p is taken. Masked entries are selected away
// before any maximum, so nothing masked (not even a NaN scale) reaches a result.
//
// P is taken against a lazy reference mc (ALGORITHM.md §2 steps 2-3): it moves to the row's
// maximum only on the row's first tile or when the maximum passes it by more than
// kRescaleLog2. So an unmasked tile's p do not wait for its maximum: softmax_tile_lazy forms
// them against the reference it has, with the tile's maximum alongside, and only if a row of
// the warp had to move (rare after a row's first tile) takes the tile again from its t.
#pragma once

#include <cmath>

#include "common/tiles.h"
#include "flamia/formats.h"
#include "sm90/fragments.cuh"
#include "sm90/kit/phase_trace.cuh"
#include "sm90/masks.cuh"
#include "sm90/ptx.cuh"

namespace flamia {
namespace sm90 {
namespace fwd {

using ScoreTile = float[16][4];  // m64n128 accumulator fragment
constexpr int kKeySteps = tiles::kFwdBlockN / 32;  // k32 steps of P·V over a key tile

struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // running max of S (NaN-propagating)
  float mc[2] = {0.0f, 0.0f};           // the reference p is taken against: m * c when it last moved
  float l[2] = {0.0f, 0.0f};            // running sum of p (add_row_sums)
};

// The lazy reference's threshold (common/tiles.h): p <= 2^kRescaleLog2 = kRescaleP, and P's
// scale of a tile's rows is pow2_scale(kRescaleP * Y) while their maxima stay within it.
constexpr float kRescaleLog2 = float(tiles::kFwdRescaleLog2);
constexpr float kRescaleP = float(1 << tiles::kFwdRescaleLog2);

// What one key tile hands to its P·V product: the FP8 A operand, P's per-row scale sigma, the
// factor alpha that rescales the rows' earlier accumulation, and this lane's part of the rows'
// sums of p. Where kSumsInFold (Plan::kSumsInFold) the consumer adds them into l in the fold
// (add_row_sums), after P·V and the next S are issued: their quad shuffles before the issue
// held it back, the issue being in order; else the softmax does.
struct TileP {
  uint32_t p8[kKeySteps][4];  // k32 step kk, register r
  float sigma[2], alpha[2];
  float lane_sum[2];
};

// l = l * alpha + the tile's row sum (alpha = 1 where a row kept its reference: l * 1 is l).
__device__ __forceinline__ void add_row_sums(RowState& st, const TileP& tp) {
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = __fadd_rn(__fmul_rn(st.l[r], tp.alpha[r]), quad_sum(tp.lane_sum[r]));
}

// s: Q·Kᵀ of the tile (raw sums). i0: this lane's first row, n0: the tile's first key, both
// document-local. Masks per element only when kMask.
// Row reductions run over chains of partial results a row, merged at the end. The lazy pass
// (D = 128's steady tile) and D = 128's max-first form take one: the exps between a row's
// FMNMX/FADD steps hide their latency, and each further chain costs merges, moves and
// registers (two were 2 % slower on an H100, four 6 %). At D = 64, whose every tile takes the
// max-first form and waits on its maxima, two: one was 1.9 % slower there (docs/PERFORMANCE.md
// v102). Max is order-free; the specification leaves the addition order inside a tile free.
template <int D>
constexpr int kMaxFirstChains = D == 64 ? 2 : 1;
constexpr int kLazyChains = 1;

// The chain of element [n][e] of a lane's score tile (its column 2 n + (e & 1) of the row's
// 32), and whether it is the chain's first element.
template <int kN>
__device__ __forceinline__ int chain_of(int n, int e) { return (2 * n + (e & 1)) % kN; }
template <int kN>
__device__ __forceinline__ bool starts_chain(int n, int e) { return 2 * n + (e & 1) < kN; }

// A row's new running maximum from its chains of the tile's t (merged, then across the quad,
// then in S's units: t * sq).
template <int kN>
__device__ __forceinline__ float row_max_after(float m, const float (&chains)[kN], float sq) {
  float tile_max = chains[0];
#pragma unroll
  for (int k = 1; k < kN; ++k) tile_max = ptx::max_nan(tile_max, chains[k]);
  return ptx::max_nan(m, __fmul_rn(quad_max_nan(tile_max), sq));
}

// This lane's part of a row's sum of the tile's p, from its chains (merged; add_row_sums adds
// the quad's parts).
template <int kN>
__device__ __forceinline__ float lane_sum_of(const float (&chains)[kN]) {
  float row_sum = chains[0];
#pragma unroll
  for (int k = 1; k < kN; ++k) row_sum = __fadd_rn(row_sum, chains[k]);
  return row_sum;
}

// What the stage holds about the tile's keys (fwd_plan.cuh): sk, sv and svn in the consumers'
// per-lane order (lane_column_index), the prefix maxima of sv in key order, and sigma of the rows
// that see the whole tile (the key-scale warp's, fwd_producer.cuh).
struct KeyScales {
  const float* sk;
  const float* sv;
  const float* svn;   // sv * (1 / sigma)
  const float* ypre;  // ypre[j] = max of sv over the document's keys n0 .. n0 + j
  float sigma;
};

// P's scale of a row: sigma = pow2_scale(pm * Y), pm = kRescaleP wherever e = fmaf(m, c, -mc)
// <= kRescaleLog2 (every row but one whose maximum is huge, |m c| >= 2^24 or so, or NaN: there
// pm = exp2(e)), Y the largest V scale of its visible keys. Rows that see the whole tile and
// keep pm = kRescaleP share the tile's sigma (the key-scale warp's, fwd_producer.cuh).
__device__ __forceinline__ bool keeps_tile_sigma(float e) { return e <= kRescaleLog2; }

// A masked tile's columns from 32 kSteps on are hidden from every row of the warp (its rows
// end before them: the causal diagonal, or the document does); they are not visited, and
// their P8 is 0 — what the masked form gives them, so the results are the same bits (their
// p is 0 in the sums, -inf in the maxima).
//
// Calls f(n, e, a) for every element [n][e] of the lane's score tile in the first 32 kSteps
// columns, a the value of the per-key array `keys` (in lane_column_index order) for the
// element's column: one float4 load serves n8-tiles 2 n2 and 2 n2 + 1, the four lanes of a
// quad reading distinct banks. then(n2) runs once n8-tiles 2 n2 and 2 n2 + 1 are visited.
template <int kSteps = kKeySteps, class F, class Then>
__device__ __forceinline__ void for_each_score(const float* keys, F f, Then then) {
  const float4* key4 = reinterpret_cast<const float4*>(keys) + (lane_id() & 3);
#pragma unroll
  for (int n2 = 0; n2 < 2 * kSteps; ++n2) {
    const float4 v4 = key4[4 * n2];
    const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(2 * n2 + h, e, vv[2 * h + (e & 1)]);
    then(n2);
  }
}
template <int kSteps = kKeySteps, class F>
__device__ __forceinline__ void for_each_score(const float* keys, F f) {
  for_each_score<kSteps>(keys, f, [](int) {});
}

// p = exp2(S c - mc), its row sums (the unquantized p) into sum, and in place x = p * (sv /
// sigma), the value P8 rounds: from svn when every row's sigma is the tile's (kWhole), else
// from sv and the row's 1 / sigma. sv / sigma is exact (powers of two), so both are the
// specification's p * (sv / sigma).
// A masked element arrives as t = -inf (softmax_tile) and leaves as x = 0, whatever its key's
// scales (a NaN scale of a hidden key must not reach P8). Selected on t itself rather than
// on the column test again: keeping that test's 64 predicates across the maxima cost ptxas
// two LOP3 an element to park them in a register and more to take them back. An unmasked t
// of -inf (an overflowed product) gives p = 0 and x = 0 * v = 0 in the specification too,
// except where p or v is not finite: sqc NaN or 0 (a NaN query scale; rows past the document,
// not stored), mc NaN or ±inf, or a visible key's NaN V scale (Y, hence sigma, NaN). In each
// of those the row's l or every column of its O is NaN either way; LSE never reads x.
template <bool kMask, bool kWhole, bool kPackAsFormed, int kSteps, int kN>
__device__ __forceinline__ void probabilities(ScoreTile& s, const KeyScales& ks, const float (&sqc)[2],
                                              const float (&inv)[2], const RowState& st, float (&sum)[2][kN],
                                              TileP& out) {
  for_each_score<kSteps>(
      kWhole ? ks.svn : ks.sv,
      [&](int n, int e, float v) {
        const int r = e >> 1, k = chain_of<kN>(n, e);
        const float p = ptx::ex2(__fmaf_rn(s[n][e], sqc[r], -st.mc[r]));
        sum[r][k] = __fadd_rn(sum[r][k], p);
        float x = __fmul_rn(p, kWhole ? v : __fmul_rn(v, inv[r]));
        if (kMask && s[n][e] == -INFINITY) x = 0.0f;
        s[n][e] = x;
      },
      [&](int n2) {
        if constexpr (kPackAsFormed) pack_e4m3_a_pair(s[2 * n2], s[2 * n2 + 1], n2, out.p8);
      });
}

// s: Q·Kᵀ of the tile (raw sums). ks: the tile's key values (KeyScales). i0: this lane's
// first row, n0: the tile's first key, both document-local. Masks per element only when kMask;
// kSteps < kKeySteps only for a masked tile whose later columns no row of the warp sees.
// phases: the phase clocks' two marks inside (kit/phase_trace.cuh; trace::Off: none).
//
// The tile from its t = s * sk (in s) and the chains of their row maxima: the rows' new maxima,
// the lazy reference (§2 steps 2-3), alpha, P's scale, p and their sums, P8.
template <bool kMask, bool kSumsInFold, bool kPackAsFormed, int kSteps, int kN, class Trace>
__device__ __forceinline__ bool softmax_from_maxima(ScoreTile& s, const KeyScales& ks, const float (&sq)[2],
                                                    const float (&sqc)[2], const DocMask& mask, int i0, int n0,
                                                    float c, RowState& st, TileP& out, const float (&tmax)[2][kN],
                                                    Trace& phases) {
  float pm_log2[2];  // log2 of the tile's largest p against the reference
  bool moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = row_max_after(st.m[r], tmax[r], sq[r]);
    const bool first = st.m[r] == -INFINITY;
    // The reference moves on the row's first tile or when m_new passes it by more than the
    // threshold (NaN moves it); else alpha = 1 and nothing earlier is rescaled.
    const bool moves = first || !(__fmaf_rn(m_new, c, -st.mc[r]) <= kRescaleLog2);
    const float mc_new = moves ? __fmul_rn(m_new, c) : st.mc[r];
    moved = moved || moves;
    out.alpha[r] = first ? 0.0f : moves ? ptx::ex2(__fsub_rn(st.mc[r], mc_new)) : 1.0f;
    pm_log2[r] = __fmaf_rn(m_new, c, -mc_new);
    st.m[r] = m_new;
    st.mc[r] = mc_new;
  }
  phases.mark(trace::kMaximaDone);
  // P's scale (ALGORITHM.md §2 step 5): sigma = pow2_scale(pm * Y), Y the maximum of sv over
  // the row's visible keys of the tile; for rows that see the whole tile, the tile's.
  float sum[2][kN];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kN; ++k) sum[r][k] = 0.0f;
  float inv[2];
  if (!kMask && __all_sync(0xffffffffu, keeps_tile_sigma(pm_log2[0]) && keeps_tile_sigma(pm_log2[1]))) {
    out.sigma[0] = out.sigma[1] = ks.sigma;
    inv[0] = inv[1] = 1.0f;
    probabilities<kMask, true, kPackAsFormed, kSteps>(s, ks, sqc, inv, st, sum, out);
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + 8 * r;
      const int last = (mask.causal ? min(i, mask.len - 1) : mask.len - 1) - n0;  // >= 0: the tile is visited
      const float y = ks.ypre[min(max(last, 0), tiles::kFwdBlockN - 1)];
      const float pm = keeps_tile_sigma(pm_log2[r]) ? kRescaleP : ptx::ex2(pm_log2[r]);
      out.sigma[r] = fmt::pow2_scale_e4m3(__fmul_rn(pm, y));
      inv[r] = fmt::pow2_reciprocal(out.sigma[r]);
    }
    probabilities<kMask, false, kPackAsFormed, kSteps>(s, ks, sqc, inv, st, sum, out);
  }
  phases.mark(trace::kExpsDone);
#pragma unroll
  for (int r = 0; r < 2; ++r) out.lane_sum[r] = lane_sum_of(sum[r]);
  if constexpr (!kSumsInFold) add_row_sums(st, out);
  // P8 of the columns not packed as formed (kPackAsFormed: only those a masked tile skips,
  // from their zeros).
#pragma unroll
  for (int n2 = kPackAsFormed ? 2 * kSteps : 0; n2 < 2 * kKeySteps; ++n2)
    pack_e4m3_a_pair(s[2 * n2], s[2 * n2 + 1], n2, out.p8);
  return __any_sync(0xffffffffu, moved);
}

// A tile with its maximum first: a masked tile, or a row's first (its reference is not set).
// Returns whether a row of the warp moved its reference (warp-uniform): else alpha is 1 for
// every row and the earlier accumulation stays as it is.
template <bool kMask, int kN, bool kSumsInFold, bool kPackAsFormed, int kSteps = kKeySteps, class Trace>
__device__ __forceinline__ bool softmax_tile(ScoreTile& s, const KeyScales& ks, const float (&sq)[2],
                                             const float (&sqc)[2], const DocMask& mask, int i0, int n0, float c,
                                             RowState& st, TileP& out, Trace& phases) {
  int seen[2] = {0, 0};
  if constexpr (kMask) mask.visible_keys_of_lane(i0, n0, lane_id() & 3, seen);
  float tmax[2][kN];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kN; ++k) tmax[r][k] = -INFINITY;
  static_assert(kMask || kSteps == kKeySteps, "only a masked tile skips columns");
  // The skipped columns hold x = 0 as the masked form leaves them (writing them keeps the
  // accumulator's registers in use as in the other forms: left alone, ptxas reassigns them
  // and serializes the wgmma pipeline, C7511).
#pragma unroll
  for (int n = 4 * kSteps; n < 4 * kKeySteps; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
  for_each_score<kSteps>(ks.sk, [&](int n, int e, float sk) {
    float t = __fmul_rn(s[n][e], sk);
    if (kMask && 8 * n + (e & 1) >= seen[e >> 1]) t = -INFINITY;
    s[n][e] = t;
    float& m = tmax[e >> 1][chain_of<kN>(n, e)];
    m = ptx::max_nan(m, t);
  });
  return softmax_from_maxima<kMask, kSumsInFold, kPackAsFormed, kSteps>(s, ks, sq, sqc, mask, i0, n0, c, st, out,
                                                                        tmax, phases);
}

// An unmasked tile after a row's first: one pass forms t, the maxima's chains and, against
// the reference the rows have, p, their sums and P8 with the tile's sigma — none of it waits
// for the maximum. Then, if every row of the warp keeps its reference (alpha = 1: the same
// bits as the specification's step), that is the tile; else the tile is taken again from its
// t (left in s) with the maxima first. Returns whether the rows' earlier accumulation is to
// be rescaled by out.alpha (warp-uniform; only where a reference moved). The rows' sums are
// left to the fold (kSumsInFold: only D = 128 takes this pass).
template <class Trace>
__device__ __forceinline__ bool softmax_tile_lazy(ScoreTile& s, const KeyScales& ks, const float (&sq)[2],
                                                  const float (&sqc)[2], const DocMask& mask, int i0, int n0,
                                                  float c, RowState& st, TileP& out, Trace& phases) {
  // Each chain starts at its first element: max_nan(-inf, t) is t and 0 + p is p (p >= +0 or
  // NaN), so the same bits without the first FMNMX and FADD of every chain.
  float tmax[2][kLazyChains], sum[2][kLazyChains];
  // As for_each_score: one float4 of sk and one of svn serve n8-tiles 2 n2 and 2 n2 + 1.
  const float4* sk4 = reinterpret_cast<const float4*>(ks.sk) + (lane_id() & 3);
  const float4* svn4 = reinterpret_cast<const float4*>(ks.svn) + (lane_id() & 3);
#pragma unroll
  for (int n2 = 0; n2 < 2 * kKeySteps; ++n2) {
    const float4 a4 = sk4[4 * n2], b4 = svn4[4 * n2];
    const float skv[4] = {a4.x, a4.y, a4.z, a4.w}, svv[4] = {b4.x, b4.y, b4.z, b4.w};
    float x[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 2 * n2 + h, r = e >> 1, k = chain_of<kLazyChains>(n, e);
        const bool first = starts_chain<kLazyChains>(n, e);
        const float t = __fmul_rn(s[n][e], skv[2 * h + (e & 1)]);
        s[n][e] = t;
        tmax[r][k] = first ? t : ptx::max_nan(tmax[r][k], t);
        const float p = ptx::ex2(__fmaf_rn(t, sqc[r], -st.mc[r]));
        sum[r][k] = first ? p : __fadd_rn(sum[r][k], p);
        x[h][e] = __fmul_rn(p, svv[2 * h + (e & 1)]);
      }
    pack_e4m3_a_pair(x[0], x[1], n2, out.p8);
  }
  bool keeps = true;
  float m_new[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m_new[r] = row_max_after(st.m[r], tmax[r], sq[r]);
    keeps = keeps && st.m[r] != -INFINITY && __fmaf_rn(m_new[r], c, -st.mc[r]) <= kRescaleLog2;
  }
  if (__all_sync(0xffffffffu, keeps)) {
    // The phase clocks: the one pass counts as the maxima, the exps' phase as empty.
    phases.mark(trace::kMaximaDone);
    // pm <= kRescaleP for every row: P's scale is the tile's (keeps_tile_sigma).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st.m[r] = m_new[r];
      out.lane_sum[r] = lane_sum_of(sum[r]);
      out.sigma[r] = ks.sigma;
      out.alpha[r] = 1.0f;
    }
    phases.mark(trace::kExpsDone);
    return false;
  }
  // The retake, as D = 128's plan has it (the only head dim with this pass): sums to the
  // fold, P8 packed as formed.
  return softmax_from_maxima<false, true, true, kKeySteps>(s, ks, sq, sqc, mask, i0, n0, c, st, out, tmax, phases);
}

// The key steps a masked tile needs for a warp: up to the last column any of its 16 rows
// sees (the rows end at i_last, document-local; at least one step).
__device__ __forceinline__ int masked_key_steps(const DocMask& mask, int i_last, int n0) {
  const int cols = mask.visible_keys(min(i_last, mask.len - 1), n0);
  return min(max((cols + 31) / 32, 1), kKeySteps);
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
