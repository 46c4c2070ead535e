// Backward (ALGORITHM.md §3), deterministic and without atomics. Every matmul is a wgmma
// issued by one warpgroup; the specification sums each as wgmma does (ALGORITHM.md §6).
// S and Sᵀ come from the forward's instruction sequence (scores_wgmma.cuh), so that
// P = exp2(S c - lse2) is rebuilt from the very S the forward's LSE was taken over.
//
// 1. quantize dO (natural + transposed FP8, scales) and D = rowsum(dO * O) (quantize.cu);
// 2. dK/dV kernel: CTA = (128-key tile of one document, kv head), two warpgroups of 64 keys
//    (4 warps x 16 keys each) sharing each query-side stage. Loops over the query heads of
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
//    heads: stored_ds_plan). FLAMIA_BWD_DQ=fused (fp8_mixed, D = 128) forms dQ inside the
//    dK/dV pass by FP32 reductions instead (no dQ kernel; not deterministic).
// Operand tiles. A CTA's own rows (K, V for dK/dV; Q, dO for dQ: the A operands of the
// products reduced over D) are loaded once by cp.async into ScoreTiles (64 tokens x D, K-major
// core matrices), zero past the document end. The other side streams through a ring of
// kBwdStages stages, one step ahead: its FP8 tiles by TMA, started by one thread (each stage's
// `full` mbarrier counts their bytes) — 64 token rows of D codes in a D-byte swizzle (B of the products reduced over
// D) and D rows of 64 token positions of the quantizer's fragment-ordered transposed copies in
// a 64-byte swizzle (B of those reduced over tokens) — and its per-token values (scales, LSE,
// D) by cp.async, since a 64-value run of an [H][T] array need not start 16-byte aligned as a
// TMA box must. fp8_mixed's BF16 operand (Q for dK, K for dQ) is a stage tile like the FP8
// ones: D rows of 64 positions of the quantizer's transposed BF16 copy (128 bytes a row,
// 128-byte swizzle, non-finite values already zero).
// No CTA barrier orders the steps: every thread's per-token copies arrive on the stage's
// `full` mbarrier when they land, each thread arrives on its `empty` mbarrier when done with
// it, and a stage is refilled only after every thread left it; so the two warpgroups drift up to
// two steps apart and one's MMAs overlap the other's FP32 work.
// TMA tiles are not cleared past the document end: their rows or columns there hold the
// next document's codes, the transposed copies' padding, or TMA's zeros past the tensor, and
// every one is finite — the quantizer (quantize.cu, the same kernel for q/k/v and for dO)
// writes every position of [0, Tpad) of a transposed copy, padding as zero codes, converts
// with satfinite at a scale in [2^-126, 2^127], and gives a non-finite row zero codes (its
// NaN stays in the scale). Such a row or column meets only masked pairs, which are exact
// zeros by selection, so it adds 0 * code = 0 to every product.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/tiles.h"
#include "quantize/quantize.cuh"
#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/fragments.cuh"
#include "sm90/launch/tensor_map.h"
#include "sm90/masks.cuh"
#include "sm90/per_device.h"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/sm90.h"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {
namespace {

using fmt::kLog2e;

struct BwdArgs {
  // The streamed tiles (TMA): row tiles box D x 1 x 64 tokens, D-byte swizzle; column
  // tiles box 64 positions x D, 64-byte swizzle.
  CUtensorMap q8_rows;    // q8 [T][Hq][D]
  CUtensorMap do8_rows;   // do8 [T][Hq][D]
  CUtensorMap k8_rows;    // k8 [T][Hkv][D]
  CUtensorMap v8_rows;    // v8 [T][Hkv][D]
  CUtensorMap qt_cols;    // qt [Hq * D][Tpad]: FP8 (fp8) or BF16 (fp8_mixed, 128-byte boxes)
  CUtensorMap kt_cols;    // kt [Hkv * D][Tpad]
  CUtensorMap dot8_cols;  // dot8 [Hq * D][Tpad]
  // The tiles loaded once per CTA (cp.async).
  const uint8_t* q8;    // [T, Hq, D]
  const uint8_t* k8;    // [T, Hkv, D]
  const uint8_t* v8;    // [T, Hkv, D]
  const uint8_t* do8;   // [T, Hq, D]
  const float* sq;      // [Hq][T]
  const float* sk;      // [Hkv][T]
  const float* sv;      // [Hkv][T]
  const float* sdo;     // [Hq][T]
  const float* dvec;    // [Hq][T]  D = rowsum(dO * O)
  const float* lse2;    // [Hq][T]  the forward's LSE * log2(e), NaN for a non-finite dO row (workspace)
  const guard::DeviceError* status;  // the backward's status word (workspace)
  const int32_t* cu_seqlens;
  const int32_t* q_start;  // [B] or null (flamia.h)
  WorkList work;  // 128-token tiles: the dK/dV pass's key tiles, the dQ pass's query tiles
  uint16_t* dq;         // bf16 [T, Hq, D]
  float* dq_acc;        // fp32 [T, Hq, D], zeroed: the fused dQ's sums (workspace), else null
  uint16_t* dk;         // bf16 [T, Hkv, D]
  uint16_t* dv;         // bf16 [T, Hkv, D]
  int64_t total_tokens;
  int hq, hkv;
  bool causal;
  float c;              // softmax_scale * log2(e)
  float softmax_scale;
  // The stored dS (FLAMIA_BWD_DQ=hbm), else null / 0.
  uint8_t* ds;                 // the stored tiles (StoredDsRun addresses them)
  const int64_t* ds_doc_base;  // [B]: a document's first tile in a head's run (ds_doc_bases)
  int64_t ds_head_tiles;       // tiles a head's run holds (a bound over every document)
  int ds_hk0, ds_hkv;          // this launch's slab of kv heads: [ds_hk0, ds_hk0 + ds_hkv)
};
static_assert(sizeof(BwdArgs) <= 4096, "a kernel parameter block holds at most 4 KB");

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

// acc += scale[row] * (A · B): the tile product in a fresh accumulator (scale-d 0 on the
// first step, the steps chained in ascending token order), then scaled and added in FP32: by
// one fused multiply-add (kLast) or a multiply and an add, the same bits, as the scale is a
// power of two and the product exact. B at shared address bt: D rows of 64 token positions
// as TMA lands them (FP8 with a 64-byte swizzle, BF16 with a 128-byte one).
// In two halves, so that other MMAs can be issued between them: issue_token_product starts
// the product (one committed group), fold_token_product waits until at most kPending groups
// committed after it are pending, then folds.
constexpr int kBf16ColRowBytes = 2 * kTileTokens;  // a BF16 column tile's row: 64 positions
template <int D, bool kBf16>
__device__ __forceinline__ void issue_token_product(float (&fresh)[D / 8][4], TokenOperand<kBf16>& op, uint32_t bt) {
  wgmma::pin(op.a);  // the operand is final before the fence
  wgmma::fence();
  if constexpr (kBf16) {
    // k16 steps of 32 bytes into each 128-byte row, as the FP8 k32 steps of a 128-byte row.
    wgmma::mma_rs_bf16<false>(fresh, op.a[0], mma::desc<kBf16ColRowBytes>(bt, 0));
#pragma unroll
    for (int ks = 1; ks < 4; ++ks) wgmma::mma_rs_bf16<true>(fresh, op.a[ks], mma::desc<kBf16ColRowBytes>(bt, ks));
  } else {
    wgmma::mma_rs<false>(fresh, op.a[0], mma::desc<kTileTokens>(bt, 0));
    wgmma::mma_rs<true>(fresh, op.a[1], mma::desc<kTileTokens>(bt, 1));
  }
  wgmma::commit();
}
template <int D, bool kBf16, bool kLast, int kPending>
__device__ __forceinline__ void fold_token_product(float (&acc)[D / 8][4], float (&fresh)[D / 8][4],
                                                   TokenOperand<kBf16>& op) {
  wgmma::wait<kPending>();
  wgmma::pin(fresh);
  wgmma::pin(op.a);  // registers read by the MMA stay untouched until it is done
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = kBf16    ? __fadd_rn(acc[n][e], fresh[n][e])
                  : kLast ? fmaf(op.scale[e >> 1], fresh[n][e], acc[n][e])
                          : __fadd_rn(acc[n][e], __fmul_rn(op.scale[e >> 1], fresh[n][e]));
}
// fp8_mixed's BF16 products (dS·Q, dS·K; scale 1) need no fresh accumulator: a k16 step keeps
// 23 fraction bits (ALGORITHM.md §3, §6), so the product is chained onto the FP32 sum itself,
// with no fold. chained_product_done waits for it as fold_token_product would (ptxas
// serializes every wgmma of a kernel where a chained product stays in flight across a loop
// iteration: C7515), and keeps op.a's registers from reuse until then.
template <int D>
__device__ __forceinline__ void chain_token_product(float (&acc)[D / 8][4], TokenOperand<true>& op, uint32_t bt) {
  wgmma::pin(op.a);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma::mma_rs_bf16<true>(acc, op.a[ks], mma::desc<kBf16ColRowBytes>(bt, ks));
  wgmma::commit();
}
template <int D, int kPending>
__device__ __forceinline__ void chained_product_done(float (&acc)[D / 8][4], TokenOperand<true>& op) {
  wgmma::wait<kPending>();
  wgmma::pin(acc);
  wgmma::pin(op.a);
}
template <int D, bool kBf16, bool kLast>
__device__ __forceinline__ void accumulate_token_product(float (&acc)[D / 8][4], TokenOperand<kBf16>& op,
                                                         uint32_t bt) {
  float fresh[D / 8][4];
  issue_token_product<D, kBf16>(fresh, op, bt);
  fold_token_product<D, kBf16, kLast, 0>(acc, fresh, op);
}

// Stores rows [0, 16) of a warp's D-wide accumulator (scaled) as bf16 for rows < valid.
template <int D>
__device__ __forceinline__ void store_rows_bf16(uint16_t* out, int64_t row_stride, const float (&acc)[D / 8][4],
                                                float scale, int row_base, int len) {
  const int g = lane_id() >> 2, q = lane_id() & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + g + 8 * r;
    if (row >= len) continue;
    uint16_t* o = out + row * row_stride + 2 * q;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(o + 8 * n) =
          ptx::pack_bf16x2(__fmul_rn(scale, acc[n][2 * r]), __fmul_rn(scale, acc[n][2 * r + 1]));
  }
}

// Both passes run CTAs of two warpgroups, each owning 64 rows (keys for dK/dV, queries for
// dQ) of a 128-token tile and sharing every stage of the other side, so each byte loaded
// feeds the products of 128 rows (a 64-row CTA was waiting on memory: docs/PERFORMANCE.md
// v6b, v7). A warpgroup holds its rows' accumulators and a fresh product (up to ~224
// registers): one CTA of 256 threads per SM. Both walk the 128-token work list.
constexpr int kDkdvWarpgroups = 2;
constexpr int kDkdvThreads = kDkdvWarpgroups * kThreads;
constexpr int kDqWarpgroups = 2;
constexpr int kDqThreads = kDqWarpgroups * kThreads;
// At D = 64 the dQ CTA fits in 128 registers a thread: two CTAs (16 warps) per SM.
template <int D>
constexpr int kDqCtasPerSm = D == 64 ? 2 : 1;
// The streamed side's ring: three stages loaded one step ahead, so a warpgroup can run up to
// two steps ahead of the other before a refill waits for it. The fused dQ's dK/dV pass has
// two: its dS and Kᵀ tiles take the third's shared memory, and its warpgroups meet every
// step anyway.
constexpr int kBwdStages = 3;
static_assert(kDkdvWarpgroups * kTileTokens == tiles::kFwdBlockM &&
                  kDqWarpgroups * kTileTokens == tiles::kFwdBlockM,
              "the backward's CTAs walk the 128-token work list");

// =====================================================================================
// The streamed stages' TMA tiles
// =====================================================================================

// A row tile (64 tokens x D codes) and a column tile (D x 64 positions) are both 64 D bytes.
// Swizzled tiles start at multiples of the largest swizzle atom (8 rows x 128 bytes).
template <int D>
constexpr int kTmaTileBytes = kTileTokens * D;
// The column tile of the dS products' other operand: FP8, or BF16 with fp8_mixed.
template <int D, bool kMixed>
constexpr int kDsColTileBytes = kMixed ? D * kBf16ColRowBytes : kTmaTileBytes<D>;
constexpr int kSwizzleAlign = 1024;
constexpr int align_up(int x, int a) { return (x + a - 1) / a * a; }

// Dynamic shared memory is not guaranteed to start swizzle-aligned: the plans allocate
// kSwizzleAlign bytes more (kAlloc) and the kernels round their base up — as a shared address,
// converted back, so that ptxas still sees the alignment and pairs the per-token values'
// 4-byte loads (a generic pointer plus a runtime offset loses it).
__device__ __forceinline__ uint8_t* swizzle_aligned(uint8_t* raw) {
  const uint32_t at = (ptx::smem_addr(raw) + kSwizzleAlign - 1) & ~uint32_t(kSwizzleAlign - 1);
  return static_cast<uint8_t*>(__cvta_shared_to_generic(at));
}

// The ring's mbarriers. A `full` phase completes once the elected thread announced the
// step's TMA bytes, TMA delivered them, and every thread's per-token copies landed (each
// thread arrives when its cp.async copies have: `threads` + 1 arrivals). An `empty` phase
// completes once every thread has finished reading the stage (each thread arrives for its
// own reads: the release orders exactly them before the refill, with no warp-level step
// that the sanitizer's race model would have to take on trust). The CTA barrier after this
// publishes them before any thread arrives.
__device__ __forceinline__ bool elected_thread() { return threadIdx.x == 0; }
template <int kStages = kBwdStages>
__device__ __forceinline__ void init_stage_barriers(uint32_t full0, uint32_t empty0, int threads) {
  if (elected_thread()) {
    for (int s = 0; s < kStages; ++s) {
      mbar::init(full0 + 8 * s, threads + 1);
      mbar::init(empty0 + 8 * s, threads);
    }
    mbar::fence_init();
  }
  __syncthreads();
}

// A position in the ring: the stage and the parity of its current use. The loader waits on
// `empty` with the previous use's parity (phase ^ 1; a fresh barrier passes it at once), the
// consumer on `full` with the current one.
template <int kStages = kBwdStages>
struct StageCursor {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

// Every thread's side of a refill: wait until every thread has left the cursor's stage,
// issue this thread's loads into it (`load(stage)`), arrive on its `full` barrier when this
// thread's copies have landed, and move the cursor on.
template <class Cursor, class Load>
__device__ __forceinline__ void refill_stage(uint32_t full0, uint32_t empty0, Cursor& cursor, Load load) {
  mbar::wait(empty0 + 8 * cursor.index, cursor.phase ^ 1);
  load(cursor.index);
  mbar::arrive_when_copies_land(full0 + 8 * cursor.index);
  cursor.advance();
}

// This thread is done with a stage: its warpgroup's last wgmma reading it has completed
// (wait<0> in the products) and its own loads of the per-token values have returned.
__device__ __forceinline__ void release_stage(uint32_t empty) { mbar::arrive(empty); }

// After the prologue's cp.async copies of the CTA's own rows: they landed (each thread's),
// are visible to wgmma (async proxy) and to every thread (the barrier).
__device__ __forceinline__ void own_rows_ready() {
  ptx::cp_async_wait<0>();
  wgmma::fence_proxy_async();
  __syncthreads();
}

// =====================================================================================
// dK / dV
// =====================================================================================

template <int D, bool kMixed, bool kFused = false, bool kStoreDs = false>
struct DkdvSmem {
  static constexpr int kStages = kFused ? 2 : kBwdStages;
  // Warpgroup w's keys at keys(w): its K (A of Sᵀ) and V (A of dPᵀ) tiles and key scales.
  static constexpr int kK = 0;
  static constexpr int kV = kK + ScoreTile<D>::kBytes;
  static constexpr int kSk = kV + ScoreTile<D>::kBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kKeyBytes = kSv + kScalarTileBytes;
  static constexpr int keys(int w) { return w * kKeyBytes; }
  // The fused dQ only. The CTA's Kᵀ in BF16 (B of dQ = dS K): chunk w holds warpgroup w's 64
  // keys, D rows of 128 bytes as the quantizer's transposed copy lands by TMA. Two dS
  // buffers (A of dQ), alternating by step: chunk w of a buffer is warpgroup w's dS,
  // 64 query rows of its 64 keys (128 bytes, 128-byte swizzle).
  static constexpr int kKtChunk = D * kBf16ColRowBytes;
  static constexpr int kDsChunk = kTileTokens * kBf16ColRowBytes;
  static constexpr int kDsBuffer = kDkdvWarpgroups * kDsChunk;
  static constexpr int kKt = align_up(kDkdvWarpgroups * kKeyBytes, kSwizzleAlign);
  static constexpr int kDs = kKt + (kFused ? kDkdvWarpgroups * kKtChunk : 0);
  // The stored dS (kStoreDs): fp8_mixed uses the same two buffers, each warpgroup its own
  // chunk; fp8 two buffers of FP32 staging, 64 query rows of the warpgroup's 64 keys each.
  static constexpr int kStagingRowFloats = kTileTokens + 4;  // +4: conflict-free column writes
  static constexpr int kStagingChunk = kTileTokens * kStagingRowFloats * 4;
  static constexpr int kStoreBytes = !kStoreDs ? 0 : kMixed ? 2 * kDsBuffer : 2 * kDkdvWarpgroups * kStagingChunk;
  static constexpr int kStage0 = align_up(kDs + (kFused ? 2 * kDsBuffer : kStoreBytes), kSwizzleAlign);
  // One stage: a query tile of one head, read by both warpgroups. The TMA tiles first
  // (kTmaBytes, swizzle-aligned), then the per-query values sq, sdo, LSE, D (cp.async).
  static constexpr int kQ = 0;                                // B of Sᵀ: Q rows
  static constexpr int kDo = kQ + kTmaTileBytes<D>;           // B of dPᵀ: dO rows
  static constexpr int kDot = kDo + kTmaTileBytes<D>;         // B of dV: dOᵀ columns (FP8 or BF16)
  static constexpr int kQt = kDot + kDsColTileBytes<D, kMixed>;  // B of dK: Qᵀ columns (FP8 or BF16)
  static constexpr int kTmaBytes = kQt + kDsColTileBytes<D, kMixed>;
  static constexpr int kSqT = kTmaBytes;
  static constexpr int kSdoT = kSqT + kScalarTileBytes;
  static constexpr int kLseT = kSdoT + kScalarTileBytes;
  static constexpr int kDvecT = kLseT + kScalarTileBytes;
  static constexpr int kStageBytes = align_up(kDvecT + kScalarTileBytes, kSwizzleAlign);
  static constexpr int kFull = kStage0 + kStages * kStageBytes;  // the ring's mbarriers
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kKtFull = kEmpty + 8 * kStages;  // the fused dQ's Kᵀ landed
  static constexpr int kBytes = kKtFull + 8;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static_assert(kAlloc <= 227 * 1024, "the dK/dV pass's shared memory");
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

// The fused dQ (FLAMIA_BWD_DQ=fused; fp8_mixed at D = 128): the dK/dV pass also forms each
// step's dQ partial, dS[64 queries x the CTA's 128 keys] · K[128 keys x D], as BF16 wgmma from
// shared memory, and adds it in FP32 to a dQ accumulator in global memory (the L2 performs
// the adds). Warpgroup w stores its dSᵀ transposed into chunk w of the step's dS buffer; once
// both have (a named barrier), warpgroup w multiplies the whole tile by its D/2 columns of
// Kᵀ. Five matmuls a tile pair instead of seven, and no dQ pass; but the order in which the
// CTAs' partials reach a dQ row varies from run to run, so dQ is not deterministic (its bits
// can differ in the last place) and is not bitwise the specification's sum.
struct FusedDq {
  uint32_t ds_buffer;  // this step's dS buffer (chunk c at ds_buffer + c * kDsChunk)
  uint32_t kt;         // this warpgroup's D/2 rows of the CTA's Kᵀ chunk 0 (chunk c at + c * kKtChunk);
                       // a chunk past the document holds finite values (TMA's zeros, the next
                       // document's, padding), which meet zeros of dS
  float* rows;         // the accumulator at the query tile's first row, head and this warpgroup's columns
  int64_t row_stride;  // Hq * D
  int valid_rows;      // rows of the query tile inside the document
};
constexpr int kFusedDqBarrier = warpgroup::kFirstNamedBarrier;

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
// A stored tile: fp8_mixed's BF16 image (8 KB), or fp8's q8(dS sk / rho) codes as a 64-byte-
// swizzled K-major FP8 image (4 KB, keys in the transposed copies' fragment order, as dQ's
// register operand holds them) followed by the 64 rows' rho (256 bytes).
constexpr int kDsTileBytes = kTileTokens * kBf16ColRowBytes;
constexpr int kDsCodesBytes = kTileTokens * kTileTokens;
constexpr int kDsRhoBytes = kTileTokens * 4;
template <bool kMixed>
constexpr int kStoredTileBytes = kMixed ? kDsTileBytes : kDsCodesBytes + kDsRhoBytes;
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
    const int64_t base = min(max(__ldg(a.ds_doc_base + dt.doc), int64_t(0)), a.ds_head_tiles - 1);
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

// ds_doc_base: every document's first tile in a head's run, an exclusive scan of its tile
// pairs (one block; the documents' lengths clamped as doc_tile clamps them).
__global__ void __launch_bounds__(1024) ds_doc_bases(const int32_t* __restrict__ cu_seqlens, int num_docs,
                                                     int64_t total_tokens, bool causal, int64_t* __restrict__ base) {
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
    tma::store_bulk(sd.tile, sd.chunk, kDsTileBytes);
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


// After both warpgroups stored their dS (each fenced its stores for the async proxy): this
// warpgroup's dQ partial, dq = dS · K[:, its D/2 columns], issued as one committed group.
template <int D, class S>
__device__ __forceinline__ void issue_fused_dq(float (&dq)[D / 16][4], const FusedDq& fz) {
  warpgroup::bar_sync(kFusedDqBarrier, kDkdvThreads);
  wgmma::fence();
#pragma unroll
  for (int c = 0; c < kDkdvWarpgroups; ++c)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t a = mma::desc<kBf16ColRowBytes>(fz.ds_buffer + c * S::kDsChunk, ks);
      const uint64_t b = mma::desc<kBf16ColRowBytes>(fz.kt + c * S::kKtChunk, ks);
      if (c == 0 && ks == 0) wgmma::mma_ss_bf16<false>(dq, a, b);
      else wgmma::mma_ss_bf16<true>(dq, a, b);
    }
  wgmma::commit();
}

// The partial's rows inside the document, added to the accumulator (8 bytes a reduction).
template <int D>
__device__ __forceinline__ void reduce_fused_dq(const FusedDq& fz, const float (&dq)[D / 16][4]) {
  const int row0 = 16 * (warp_id() & 3) + (lane_id() >> 2), q = lane_id() & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= fz.valid_rows) continue;
    float* p = fz.rows + row * fz.row_stride + 2 * q;
#pragma unroll
    for (int n = 0; n < D / 16; ++n) ptx::red_add_v2(p + 8 * n, dq[n][2 * r], dq[n][2 * r + 1]);
  }
}

// A step in which this warpgroup's keys are not seen (warpgroup 1 only: causal, its first
// query tile, or the document ends before them): its dS chunk is zeros, and it still meets
// the other at the barrier and forms its columns of dQ. (Skipping the chunk in the product
// instead puts a branch between wgmmas, around which ptxas injects warpgroup fences.)
template <int D, class S>
__device__ __forceinline__ void fused_dq_only(const FusedDq& fz) {
  store_ds_transposed(fz.ds_buffer + warpgroup::index() * S::kDsChunk, {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u},
                                                                        {0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}});
  wgmma::fence_proxy_async();
  float dq[D / 16][4];
  issue_fused_dq<D, S>(dq, fz);
  wgmma::wait<0>();
  wgmma::pin(dq);
  reduce_fused_dq<D>(fz, dq);
}

// Calls f(n, e, col, r, visible) for element [n][e] of a warpgroup's Sᵀ / dPᵀ tile (rows =
// keys, columns = queries): the element's query column col, its key row r (0: j0, 1: j0 + 8)
// and whether that pair is visible.
template <bool kMask, class F>
__device__ __forceinline__ void for_each_pair(const DocMask& mask, int m0, int j0, F f) {
  const int q = lane_id() & 3;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      f(n, e, col, r, !kMask || mask.visible(m0 + col, j0 + 8 * r));
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
    for (int n = 0; n < 8; ++n) sdo_max = fmaxf(sdo_max, fmaxf(sdo[8 * n + 2 * q], sdo[8 * n + 2 * q + 1]));
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
    for_each_pair<kMask>(mask, m0, j0, [&](int n, int e, int col, int r, bool visible) {
      const float s_comb = __fmul_rn(skc_row[r], sq[col]);
      if constexpr (kDvFirst) {
        s[n][e] = visible ? pair_p(s[n][e], s_comb, lse2[col]) : 0.0f;
      } else {
        const PairGrad pg = pair_grad(s[n][e], dp[n][e], s_comb, __fmul_rn(sdo[col], sv_row[r]), lse2[col], dvec[col]);
        s[n][e] = visible ? pg.p : 0.0f;
        dp[n][e] = visible ? pg.ds : 0.0f;
      }
    });
    TokenOperand<true> pv = token_operand<true>(s);
    if constexpr (kDvFirst) {
      chain_token_product<D>(dv, pv, st + S::kDot);
      // dS = P (dP - D): pair_grad's second half, on the P just formed.
      for_each_pair<kMask>(mask, m0, j0, [&](int n, int e, int col, int r, bool visible) {
        const float ds = pair_ds(s[n][e], dp[n][e], __fmul_rn(sdo[col], sv_row[r]), dvec[col]);
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
    for_each_pair<kMask>(mask, m0, j0, [&](int n, int e, int col, int r, bool visible) {
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], __fmul_rn(skc_row[r], sq[col]),
                                    __fmul_rn(sdo[col], sv_row[r]), lse2[col], dvec[col]);
      s[n][e] = visible ? __fmul_rn(pg.p, __fmul_rn(sdo[col], inv_sigma)) : 0.0f;
      dp[n][e] = visible ? __fmul_rn(pg.ds, sq[col]) : 0.0f;
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
      issue_token_product<D, false>(fresh_k, ds, dk_b);
      issue_token_product<D, false>(fresh_v, pv, st + S::kDot);
      fold_token_product<D, false, false, 1>(dk, fresh_k, ds);
      fold_token_product<D, false, true, 0>(dv, fresh_v, pv);
    } else {
      accumulate_token_product<D, false, false>(dk, ds, dk_b);
      accumulate_token_product<D, false, true>(dv, pv, st + S::kDot);
    }
    if constexpr (kStoreDs) {
      // Every thread's x is in the chunk for the next computed step's row pass
      // (store_fp8_ds_rows); the chunks alternate, so the previous chunk's row pass, made
      // before this barrier, is also ordered before that chunk is written again.
      warpgroup::bar_sync_after(kStoredDsBarrier + warpgroup::index(), warpgroup::kThreads, staged);
    }
  }
}

template <int D, bool kMixed, bool kFused, bool kStoreDs = false>
__global__ void __launch_bounds__(kDkdvThreads, 1) dkdv_kernel(const __grid_constant__ BwdArgs a) {
  static_assert(!kFused || (kMixed && D == 128), "the fused dQ is fp8_mixed's, at D = 128");
  static_assert(!(kStoreDs && kFused), "the stored dS and the fused dQ are alternatives");
  using S = DkdvSmem<D, kMixed, kFused, kStoreDs>;
  extern __shared__ uint8_t smem_raw[];
  // One CTA per (work-list slot, kv head); the stored dS's launches cover a slab of kv heads.
  const int heads = kStoreDs ? a.ds_hkv : a.hkv;
  const int slot = blockIdx.x / heads, hk = (kStoreDs ? a.ds_hk0 : 0) + int(blockIdx.x % heads);
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  if (slot >= item_count(a.work) || a.status->fault != guard::kNone) return;
  const DocTile dt = doc_tile(a.cu_seqlens, a.work, slot);
  if (dt.len == 0) return;
  // Item t of a document is its 128-key tile nt - 1 - t when causal (cost order, schedule.cuh).
  const int n = a.causal ? dt.num_tiles - 1 - dt.tile : dt.tile;
  const int wg = warpgroup::index();
  // This warpgroup's 64 keys: the 64-token key tile nw, keys [kw0, kw0 + valid_k).
  const int nw = kDkdvWarpgroups * n + wg, kw0 = nw * kTileTokens;
  const int valid_k = min(kTileTokens, dt.len - kw0);  // <= 0: no keys (the document ends first)
  const int group = a.hq / a.hkv;
  const int num_query_tiles_doc = (dt.len + kTileTokens - 1) / kTileTokens;
  // Query tiles from the first that sees the CTA's first keys (causal) and is no tile of
  // keys-only rows (q_start, a multiple of the tile); a warpgroup skips the tiles that see
  // none of its own keys.
  const int m_first = max(a.causal ? kDkdvWarpgroups * n : 0, first_query(a.q_start, dt) / kTileTokens);
  const int num_query_tiles = num_query_tiles_doc - m_first;
  const int steps = group * num_query_tiles;  // (query head, query tile), head-major
  const DocMask mask{dt.len, a.causal};
  uint8_t* smem = swizzle_aligned(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  if (kFused && elected_thread()) mbar::init(base + S::kKtFull, 1);  // published by the barrier below
  init_stage_barriers<S::kStages>(base + S::full(0), base + S::empty(0), kDkdvThreads);
  const bool elected = elected_thread();  // starts the stages' TMA loads
  if (elected) {
    tma::prefetch_map(a.q8_rows);
    tma::prefetch_map(a.do8_rows);
    tma::prefetch_map(a.dot8_cols);
    tma::prefetch_map(a.qt_cols);
    if constexpr (kFused) {
      // The CTA's Kᵀ, both chunks (a chunk past the document is loaded and never read).
      mbar::arrive_expect_tx(base + S::kKtFull, kDkdvWarpgroups * S::kKtChunk);
      for (int c = 0; c < kDkdvWarpgroups; ++c)
        tma::load_2d(base + S::kKt + c * S::kKtChunk, a.kt_cols, base + S::kKtFull,
                     2 * (int(dt.pstart) + (kDkdvWarpgroups * n + c) * kTileTokens), hk * D);
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
    tma::load_2d(st + S::kDot, a.dot8_cols, full, kMixed ? 2 * pos : pos, t.h * D);  // BF16: byte coordinates
    tma::load_2d(st + S::kQt, a.qt_cols, full, kMixed ? 2 * pos : pos, t.h * D);  // BF16: byte coordinates
  };
  // Every thread: one of a step's 256 per-query values (thread t: value t % 64 of sq, sdo,
  // LSE, D for t / 64 = 0..3, as laid out from kSqT on), by cp.async.
  const int value_i = int(threadIdx.x) & (kTileTokens - 1), value_kind = int(threadIdx.x) / kTileTokens;
  const float* const values = value_kind == 0 ? a.sq : value_kind == 1 ? a.sdo : value_kind == 2 ? a.lse2 : a.dvec;
  auto load_query_values = [&](int s, QueryTile t) {
    const int m0 = t.m * kTileTokens;
    load_scalar(base + S::stage(s) + S::kSqT + value_kind * kScalarTileBytes,
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
  own_rows_ready();

  const int j0 = kw0 + 16 * (warp_id() & 3) + (lane_id() >> 2);  // this lane's keys: j0, j0 + 8
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[c][e] = dv[c][e] = 0.0f;

  // The fused dQ: the CTA's Kᵀ has landed before the first product reads it.
  [[maybe_unused]] const int64_t q_row = int64_t(a.hq) * D;
  if constexpr (kFused) mbar::wait(base + S::kKtFull, 0);

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
    FusedDq fz{};
    if constexpr (kFused) {
      fz.ds_buffer = base + S::kDs + (step & 1) * S::kDsBuffer;
      fz.kt = base + S::kKt + wg * (D / 2) * kBf16ColRowBytes;
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
                          : base + S::kDs + ((stored & 1) * kDkdvWarpgroups + wg) * S::kStagingChunk;
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
  // Every key row of the document is written, also those no query sees (zeros).
  const int64_t out_off = dt.tok0 * kv_row + hk * D;
  store_rows_bf16<D>(a.dk + out_off, kv_row, dk, a.softmax_scale, kw0 + 16 * (warp_id() & 3), dt.len);
  store_rows_bf16<D>(a.dv + out_off, kv_row, dv, 1.0f, kw0 + 16 * (warp_id() & 3), dt.len);
}

// =====================================================================================
// dQ
// =====================================================================================

template <int D, bool kMixed>
struct DqSmem {
  // Warpgroup w's queries at queries(w): its Q (A of S) and dO (A of dP) tiles and the
  // per-query values, read from shared memory where used (registers are the scarce resource).
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + ScoreTile<D>::kBytes;
  static constexpr int kSq = kDo + ScoreTile<D>::kBytes;
  static constexpr int kSdo = kSq + kScalarTileBytes;
  static constexpr int kLse = kSdo + kScalarTileBytes;
  static constexpr int kDvec = kLse + kScalarTileBytes;
  static constexpr int kQueryBytes = kDvec + kScalarTileBytes;
  static constexpr int queries(int w) { return w * kQueryBytes; }
  static constexpr int kStage0 = align_up(kDqWarpgroups * kQueryBytes, kSwizzleAlign);
  // One stage: a key tile, read by both warpgroups. The TMA tiles first (kTmaBytes,
  // swizzle-aligned), then the key scales sk, sv (cp.async).
  static constexpr int kK = 0;                             // B of S: K rows
  static constexpr int kV = kK + kTmaTileBytes<D>;         // B of dP: V rows
  static constexpr int kKt = kV + kTmaTileBytes<D>;        // B of dQ: Kᵀ columns (FP8 or BF16)
  static constexpr int kTmaBytes = kKt + kDsColTileBytes<D, kMixed>;
  static constexpr int kSk = kTmaBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStageBytes = align_up(kSv + kScalarTileBytes, kSwizzleAlign);
  static constexpr int kFull = kStage0 + kBwdStages * kStageBytes;  // the ring's mbarriers
  static constexpr int kEmpty = kFull + 8 * kBwdStages;
  static constexpr int kBytes = kEmpty + 8 * kBwdStages;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

// S and dP of the key tile in `stage` for the 64 queries at `queries` (a warpgroup's
// DqSmem::queries): issued, two committed groups.
template <int D, bool kMixed>
__device__ __forceinline__ void issue_dq_scores(TileAcc& s, TileAcc& dp, const uint8_t* smem, int queries, int stage) {
  using S = DqSmem<D, kMixed>;
  const uint32_t base = ptx::smem_addr(smem), st = base + S::stage(stage), qb = base + queries;
  wgmma::fence();
  issue_scores<D, true>(s, qb + S::kQ, st + S::kK);    // S = Q Kᵀ, as the forward
  issue_row_dots<D, true>(dp, qb + S::kDo, st + S::kV);  // dP = dO Vᵀ
}

// dQ's A operand of one key tile from its landed S and dP, this warp's 16 query rows i0,
// i0 + 8 (document positions): q8(dS sk / rho) (fp8) or bf16(dS) (fp8_mixed).
template <int D, bool kMixed, bool kMask>
__device__ __forceinline__ TokenOperand<kMixed> dq_operand_of_tile(const uint8_t* smem, int queries, int stage,
                                                                   const DocMask& mask, int i0, int n0, float c,
                                                                   TileAcc& s, const TileAcc& dp) {
  using S = DqSmem<D, kMixed>;
  const float* sk = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSk);
  const float* sv = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSv);
  const int q = lane_id() & 3, row0 = 16 * (warp_id() & 3);
  // This lane's query rows are row0 + g and row0 + g + 8 of the warpgroup's 64 queries.
  float sq[2], sdo[2], lse2[2], d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + (lane_id() >> 2) + 8 * r;
    sq[r] = reinterpret_cast<const float*>(smem + queries + S::kSq)[i];
    sdo[r] = reinterpret_cast<const float*>(smem + queries + S::kSdo)[i];
    lse2[r] = reinterpret_cast<const float*>(smem + queries + S::kLse)[i];
    d[r] = reinterpret_cast<const float*>(smem + queries + S::kDvec)[i];
  }

  // In place: s <- dS * sk (fp8) or dS (fp8_mixed).
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      const bool visible = !kMask || mask.visible(i0 + 8 * r, n0 + col);
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], __fmul_rn(__fmul_rn(sk[col], c), sq[r]),
                                    __fmul_rn(sdo[r], sv[col]), lse2[r], d[r]);
      s[n][e] = visible ? (kMixed ? pg.ds : __fmul_rn(pg.ds, sk[col])) : 0.0f;
    }
  return token_operand<kMixed>(s);
}

template <int D, bool kMixed>
__global__ void __launch_bounds__(kDqThreads, kDqCtasPerSm<D>) dq_kernel(const __grid_constant__ BwdArgs a) {
  using S = DqSmem<D, kMixed>;
  extern __shared__ uint8_t smem_raw[];
  const int slot = blockIdx.x / a.hq, h = blockIdx.x % a.hq;
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  if (slot >= item_count(a.work) || a.status->fault != guard::kNone) return;
  const DocTile dt = doc_tile(a.cu_seqlens, a.work, slot);  // a 128-query tile
  // Keys-only rows (before q_start, a multiple of the tile) get no dQ.
  if (dt.len == 0 || (kDqWarpgroups * dt.tile) * kTileTokens < first_query(a.q_start, dt)) return;
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
    tma::prefetch_map(a.kt_cols);
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
    tma::load_2d(st + S::kKt, a.kt_cols, full, kMixed ? 2 * pos : pos, hk * D);  // BF16: byte coordinates
  };
  // Warpgroup 0: a key tile's 128 key scales (thread t: value t % 64 of sk, sv for
  // t / 64 = 0, 1, as laid out from kSk on), by cp.async.
  const int value_i = int(threadIdx.x) & (kTileTokens - 1), value_kind = int(threadIdx.x) / kTileTokens;
  const float* const values = (value_kind == 0 ? a.sk : a.sv) + hk * a.total_tokens + dt.tok0;
  auto load_key_values = [&](int s, int n) {
    const int n0 = n * kTileTokens;
    if (value_kind < 2)
      load_scalar(base + S::stage(s) + S::kSk + value_kind * kScalarTileBytes, values + n0, dt.len - n0, value_i);
  };
  // Every thread: key tile n into the next stage of the ring, once every thread has left it.
  StageCursor<> load, use;
  auto load_step = [&](int n) {
    refill_stage(base + S::full(0), base + S::empty(0), load, [&](int s) {
      if (elected) load_key_tiles(s, n);
      load_key_values(s, n);
    });
  };
  load_step(0);
  ptx::cp_async_commit();
  own_rows_ready();

  const int i0 = m0 + 16 * (warp_id() & 3) + (lane_id() >> 2);  // this lane's queries: i0, i0 + 8
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
    if (n + 1 < num_key_tiles) load_step(n + 1);
    const int n0 = n * kTileTokens;
    mbar::wait(base + S::full(use.index), use.phase);  // as in dkdv_kernel
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
      else issue_token_product<D, false>(fresh, op, kt);
      // S and dP of n + 1 may be pending (two groups) when the product is done.
      if (kOverlap && n + 1 <= last) {
        StageCursor<> next = use;
        next.advance();
        mbar::wait(base + S::full(next.index), next.phase);
        issue_dq_scores<D, kMixed>(s, dp, smem, S::queries(wg), next.index);
        if constexpr (kMixed) chained_product_done<D, 2>(dq, op);
        else fold_token_product<D, false, true, 2>(dq, fresh, op);
      } else {
        if constexpr (kMixed) chained_product_done<D, 0>(dq, op);
        else fold_token_product<D, false, true, 0>(dq, fresh, op);
      }
    }
    release_stage(base + S::empty(use.index));
    use.advance();
  }
  // Every S/dP issued was waited for inside the loop, which ptxas cannot prove: without this
  // wait it injects one of its own (C7517) before the accumulator registers are reused.
  if constexpr (kOverlap) wgmma::wait<0>();

  store_rows_bf16<D>(a.dq + dt.tok0 * q_row + h * D, q_row, dq, a.softmax_scale, m0 + 16 * (warp_id() & 3), dt.len);
}

// The dQ GEMM of the stored dS (FLAMIA_BWD_DQ=hbm): the dQ pass's CTAs and order (128
// queries, two warpgroups sharing each key tile, tiles ascending), but each key tile's
// product takes its A operand from the tile the dK/dV pass stored instead of forming it:
// fp8_mixed chains the BF16 k16 steps of bf16(dS) · K onto dQ from zero; fp8 forms
// codes · Kᵀ in a fresh accumulator and folds it with the rows' rho (fmaf, as the dQ
// pass). The same operands and steps as the deterministic pass, so the same bits. A stage:
// the key tile's Kᵀ (TMA, as the dQ pass streams it) and the two warpgroups' stored tiles
// (bulk copies), all announced to one mbarrier by the elected thread; nothing per thread,
// so the stages are all bytes and the pass reads them at HBM speed.
template <int D, bool kMixed>
struct DqStoredSmem {
  static constexpr int kKt = 0;                                 // B: Kᵀ columns
  static constexpr int kKtBytes = kDsColTileBytes<D, kMixed>;  // BF16 or FP8
  // A: warpgroup w's image at kDs + w * kImageBytes (1024-aligned); fp8's rho after both.
  static constexpr int kImageBytes = kMixed ? kDsTileBytes : kDsCodesBytes;
  static constexpr int kDs = kKt + kKtBytes;
  static constexpr int kRho = kDs + kDqWarpgroups * kImageBytes;
  static constexpr int kStageBytes = align_up(kRho + (kMixed ? 0 : kDqWarpgroups * kDsRhoBytes), kSwizzleAlign);
  static constexpr int kTxBytes = kKtBytes + kDqWarpgroups * kStoredTileBytes<kMixed>;
  // Two CTAs a SM where the registers allow (all but fp8 at D = 128, whose fresh accumulator
  // and sum take 176): each with three stages (fp8_mixed at D = 128: 96 KB), or one CTA with
  // six, so that an SM keeps ~100 KB of tiles in flight either way (the pass is HBM-bound).
  static constexpr bool kTwoCtas = kMixed || D == 64;
  static constexpr int kStages = kTwoCtas ? 3 : 6;
  static constexpr int kFull = kStages * kStageBytes;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kBytes = kEmpty + 8 * kStages;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static_assert(kDs % kSwizzleAlign == 0 && kImageBytes % kSwizzleAlign == 0, "the images stay swizzle-aligned");
  static_assert(kAlloc <= 227 * 1024, "the stored dQ's shared memory");
  static constexpr int stage(int s) { return s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

template <int D, bool kMixed>
__global__ void __launch_bounds__(kDqThreads, DqStoredSmem<D, kMixed>::kTwoCtas ? 2 : 1) dq_stored_kernel(const __grid_constant__ BwdArgs a) {
  using S = DqStoredSmem<D, kMixed>;
  extern __shared__ uint8_t smem_raw[];
  // One CTA per (work-list slot, query head of the launch's slab).
  const int group = a.hq / a.hkv, heads = a.ds_hkv * group;
  const int slot = blockIdx.x / heads, h = a.ds_hk0 * group + int(blockIdx.x % heads);
  if (slot >= item_count(a.work) || a.status->fault != guard::kNone) return;
  const DocTile dt = doc_tile(a.cu_seqlens, a.work, slot);  // a 128-query tile
  // Keys-only rows (before q_start, a multiple of the tile) get no dQ, as in dq_kernel.
  if (dt.len == 0 || (kDqWarpgroups * dt.tile) * kTileTokens < first_query(a.q_start, dt)) return;
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
    tma::prefetch_map(a.kt_cols);
  }
  __syncthreads();

  // The elected thread: key tile n into stage s (both warpgroups' tiles, also where one is
  // never read: a warpgroup past its diagonal or past the document reads none).
  const StoredDsRun<kMixed> run(a, dt);
  auto load_key_tile = [&](int s, int n) {
    const uint32_t st = base + S::stage(s), full = base + S::full(s);
    const int pos = int(dt.pstart) + n * kTileTokens;
    mbar::arrive_expect_tx(full, S::kTxBytes);
    tma::load_2d(st + S::kKt, a.kt_cols, full, kMixed ? 2 * pos : pos, hk * D);  // BF16: byte coordinates
    for (int w = 0; w < kDqWarpgroups; ++w) {
      const uint8_t* tile = run.tile(h, kDqWarpgroups * dt.tile + w, n);
      tma::load_bulk(st + S::kDs + w * S::kImageBytes, tile, S::kImageBytes, full);
      if constexpr (!kMixed) tma::load_bulk(st + S::kRho + w * kDsRhoBytes, tile + kDsCodesBytes, kDsRhoBytes, full);
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
  for (int n = 0; n < num_key_tiles; ++n) {
    if (n + S::kStages - 1 < num_key_tiles) load_step(n + S::kStages - 1);
    mbar::wait(base + S::full(use.index), use.phase);
    if (n <= last) {
      const uint32_t st = base + S::stage(use.index), img = st + S::kDs + wg * S::kImageBytes;
      if constexpr (kMixed) {
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma::mma_ss_bf16<true>(dq, mma::desc<kBf16ColRowBytes>(img, ks), mma::desc<kBf16ColRowBytes>(st + S::kKt, ks));
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

  const int64_t q_row = int64_t(a.hq) * D;
  store_rows_bf16<D>(a.dq + dt.tok0 * q_row + h * D, q_row, dq, a.softmax_scale, m0 + 16 * (warp_id() & 3), dt.len);
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
  constexpr int kDkdvSmem = DkdvSmem<D, kMixed>::kAlloc, kDqSmem = DqSmem<D, kMixed>::kAlloc;
  cudaError_t attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, kMixed, false>), kDkdvSmem);
  if (attr == cudaSuccess) attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dq_kernel<D, kMixed>), kDqSmem);
  if (attr != cudaSuccess) return attr;
  // One CTA per (work-list slot, head), the head fastest (schedule.cuh).
  dkdv_kernel<D, kMixed, false><<<unsigned(int64_t(a.work.capacity) * a.hkv), kDkdvThreads, kDkdvSmem, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  dq_kernel<D, kMixed><<<unsigned(int64_t(a.work.capacity) * a.hq), kDqThreads, kDqSmem, stream>>>(a);
  return cudaGetLastError();
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

// The stored dS: the documents' bases, then per slab of `slab` kv heads the
// dK/dV pass (writes the slab's dS) and the dQ GEMM (reads it); the next slab's dK/dV waits
// for this slab's GEMM in stream order, so one buffer serves every slab.
template <int D, bool kMixed>
cudaError_t launch_backward_stored_dq(BwdArgs a, int num_docs, int slab, int64_t* doc_base, cudaStream_t stream) {
  constexpr int kDkdvSmem = DkdvSmem<D, kMixed, false, true>::kAlloc, kDqSmem = DqStoredSmem<D, kMixed>::kAlloc;
  cudaError_t err = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, kMixed, false, true>), kDkdvSmem);
  if (err == cudaSuccess) err = FLAMIA_ALLOW_DYNAMIC_SMEM((dq_stored_kernel<D, kMixed>), kDqSmem);
  if (err != cudaSuccess) return err;
  ds_doc_bases<<<1, 1024, 0, stream>>>(a.cu_seqlens, num_docs, a.total_tokens, a.causal, doc_base);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  a.ds_doc_base = doc_base;
  const int group = a.hq / a.hkv;
  for (int hk0 = 0; hk0 < a.hkv; hk0 += slab) {
    a.ds_hk0 = hk0;
    a.ds_hkv = std::min(slab, a.hkv - hk0);
    dkdv_kernel<D, kMixed, false, true>
        <<<unsigned(int64_t(a.work.capacity) * a.ds_hkv), kDkdvThreads, kDkdvSmem, stream>>>(a);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    dq_stored_kernel<D, kMixed>
        <<<unsigned(int64_t(a.work.capacity) * a.ds_hkv * group), kDqThreads, kDqSmem, stream>>>(a);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
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
// elem_bytes 2: a BF16 copy (fp8_mixed's qt, kt), mapped as bytes: 128-byte boxes, 128-byte
// swizzle, x coordinates in bytes.
cudaError_t encode_col_map(CUtensorMap* map, const uint8_t* codes, int64_t tpad, int heads, int head_dim,
                           int elem_bytes = 1) {
  const uint64_t row = uint64_t(tpad) * uint64_t(elem_bytes);
  const uint64_t dims[2] = {row, uint64_t(heads) * uint64_t(head_dim)}, strides[1] = {row};
  const uint32_t box[2] = {uint32_t(kTileTokens * elem_bytes), uint32_t(head_dim)};
  return encode_u8_map(map, codes, 2, dims, strides, box, kTileTokens * elem_bytes);
}

// The step of this thread's last backward that returned an error (backward_failed_step).
thread_local const char* t_failed_step = "";

cudaError_t failed(const char* step, cudaError_t err) {
  t_failed_step = step;
  return err;
}

}  // namespace

const char* backward_failed_step() { return t_failed_step; }

// FLAMIA_BWD_DQ, read at every call (a getenv is negligible next to a launch), so that the
// workspace size and the backward agree within a process that does not change it in between.
namespace {
bool dq_option_is(const char* name) {
  const char* v = std::getenv("FLAMIA_BWD_DQ");
  return std::strcmp(v != nullptr ? v : "", name) == 0;
}
}  // namespace

bool backward_dq_option_valid() {
  return dq_option_is("") || dq_option_is("auto") || dq_option_is("recompute") || dq_option_is("hbm") ||
         dq_option_is("fused");
}

bool backward_dq_fused(flamia_recipe recipe, int head_dim) {
  return recipe == FLAMIA_RECIPE_FP8_MIXED && head_dim == 128 && dq_option_is("fused");
}

// auto: fp8_mixed at D = 128 only, where storing measured faster than recomputing on every
// workload (docs/PERFORMANCE.md v44-v46); fp8 and D = 64 lose (v44).
bool backward_dq_stored(flamia_recipe recipe, int head_dim) {
  if (dq_option_is("hbm")) return true;
  return (dq_option_is("") || dq_option_is("auto")) && recipe == FLAMIA_RECIPE_FP8_MIXED && head_dim == 128;
}

bool backward_dq_stored_required() { return dq_option_is("hbm"); }

StoredDsPlan stored_ds_plan(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                            flamia_recipe recipe, int max_seqlen, bool causal) {
  StoredDsPlan plan;
  if (!backward_dq_stored(recipe, head_dim) || total_tokens <= 0 || hkv <= 0 || hq % hkv != 0 || (head_dim != 64 && head_dim != 128))
    return plan;
  // A head's run, bounded from T, B and max_seqlen: at most N = ceil(T / 64) + B query tiles
  // over all documents, each document at most M = ceil(max_seqlen / 64) tiles, so
  // sum nt (nt + 1) / 2 <= N (M + 1) / 2 (causal) and sum nt^2 <= N M.
  const int64_t tiles = (total_tokens + kTileTokens - 1) / kTileTokens;
  const int64_t n = tiles + num_docs;
  const int64_t m = std::min<int64_t>(std::max<int64_t>(1, (int64_t(max_seqlen) + kTileTokens - 1) / kTileTokens), tiles);
  plan.head_tiles = causal ? (n * (m + 1) + 1) / 2 : n * m;
  const int group = hq / hkv;
  const bool mixed = recipe == FLAMIA_RECIPE_FP8_MIXED;
  const size_t tile_bytes = mixed ? kStoredTileBytes<true> : kStoredTileBytes<false>;
  // Sizes no allocation could hold (T near 2^31 tokens) would overflow below: the default pass.
  if (size_t(plan.head_tiles) > (size_t(1) << 48) / (tile_bytes * size_t(hq))) return StoredDsPlan{};
  const size_t head_bytes = size_t(plan.head_tiles) * tile_bytes;
  // As many kv heads (with their query heads) as FLAMIA_BWD_DS_MIB allows, at least one;
  // then spread evenly over the slabs, so that the last is not a sliver. The default 1 GiB
  // measured faster than larger slabs on every workload but fixed-16k (+1 % there), and
  // 256 MiB starves the packs of CTAs (docs/PERFORMANCE.md v46).
  const char* mib_env = std::getenv("FLAMIA_BWD_DS_MIB");
  const long long mib = mib_env != nullptr ? std::atoll(mib_env) : 0;
  const size_t budget = size_t(mib > 0 ? mib : 1024) << 20;
  const int most = int(std::max<size_t>(1, std::min<size_t>(size_t(hkv), budget / (head_bytes * group))));
  const int slabs = (hkv + most - 1) / most;
  plan.slab = (hkv + slabs - 1) / slabs;
  plan.base_bytes = quant::round_up(num_docs * int64_t(sizeof(int64_t)), 256);
  plan.bytes = plan.base_bytes + size_t(plan.slab) * group * head_bytes;
  return plan;
}

size_t backward_workspace_bytes_for(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                                    flamia_recipe recipe, int max_seqlen, bool causal) {
  const StoredDsPlan plan = stored_ds_plan(total_tokens, num_docs, hq, hkv, head_dim, recipe, max_seqlen, causal);
  return quant::BwdWorkspaceLayout::make(total_tokens, num_docs, hq, hkv, head_dim, recipe,
                                         backward_dq_fused(recipe, head_dim), plan.bytes)
      .bytes;
}

cudaError_t backward(const Params& p, const void* dout, int64_t dout_stride_t, int64_t dout_stride_h,
                     const void* out, const float* lse, const void* qkv8, void* workspace,
                     size_t workspace_bytes, void* dq, void* dk, void* dv) {
  t_failed_step = "";
  if (p.total_tokens == 0) return cudaSuccess;
  if (p.head_dim != 64 && p.head_dim != 128) return failed("head_dim", cudaErrorInvalidValue);
  const bool mixed = p.recipe == FLAMIA_RECIPE_FP8_MIXED;
  if (!quant::rows_16b_aligned(dout, dout_stride_t, dout_stride_h) ||
      !quant::rows_16b_aligned(out, dout_stride_t, dout_stride_h))
    return failed("dout and out rows 16-byte aligned", cudaErrorInvalidValue);
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                              p.recipe, true);
  // The fused dQ: selected, and no q_start (its rows before q_start would be written).
  const bool fused_selected = backward_dq_fused(p.recipe, p.head_dim);
  const bool fused = fused_selected && p.q_start == nullptr;
  // The stored dS where it is on and the workspace holds it (the caller sized it with
  // backward_workspace_bytes_for); else the dQ pass, which needs no more than
  // backward_workspace_bytes.
  StoredDsPlan plan =
      stored_ds_plan(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, p.max_seqlen, p.causal);
  if (plan.slab > 0 && quant::BwdWorkspaceLayout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe,
                                                       fused_selected, plan.bytes)
                               .bytes > workspace_bytes)
    plan = StoredDsPlan{};
  const bool stored = plan.slab > 0;
  const auto ws_layout = quant::BwdWorkspaceLayout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                                         p.recipe, fused_selected, plan.bytes);
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
  const int qk_bytes = mixed ? 2 : 1;  // the transposed q, k, dO: BF16 (fp8_mixed) or FP8
  if ((err = encode_col_map(&a.dot8_cols, ws + ws_layout.dot8, layout.tpad, p.hq, p.head_dim, qk_bytes)) != cudaSuccess)
    return failed("tensor map dot8", err);
  // Qᵀ, Kᵀ: fp8_mixed's BF16 copies in qkv8 (the quantizer's), fp8's FP8 ones in the
  // workspace (transpose_qk_codes, below).
  const uint8_t* qt = mixed ? base + layout.qt : ws + ws_layout.qt;
  const uint8_t* kt = mixed ? base + layout.kt : ws + ws_layout.kt;
  if ((err = encode_col_map(&a.qt_cols, qt, layout.tpad, p.hq, p.head_dim, qk_bytes)) != cudaSuccess)
    return failed("tensor map qt", err);
  if ((err = encode_col_map(&a.kt_cols, kt, layout.tpad, p.hkv, p.head_dim, qk_bytes)) != cudaSuccess)
    return failed("tensor map kt", err);
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
  a.dq = static_cast<uint16_t*>(dq);
  a.dq_acc = fused ? reinterpret_cast<float*>(ws + ws_layout.dq_acc) : nullptr;
  int64_t* ds_doc_base = nullptr;
  int ds_slab = 0;
  if (stored) {
    ds_doc_base = reinterpret_cast<int64_t*>(ws + ws_layout.ds);
    a.ds = ws + ws_layout.ds + plan.base_bytes;
    a.ds_head_tiles = plan.head_tiles;
    ds_slab = plan.slab;
  }
  a.dk = static_cast<uint16_t*>(dk);
  a.dv = static_cast<uint16_t*>(dv);
  a.total_tokens = p.total_tokens;
  a.hq = p.hq;
  a.hkv = p.hkv;
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
              ? (mixed ? launch_backward_stored_dq<64, true>(a, p.num_docs, ds_slab, ds_doc_base, p.stream)
                       : launch_backward_stored_dq<64, false>(a, p.num_docs, ds_slab, ds_doc_base, p.stream))
              : (mixed ? launch_backward_stored_dq<128, true>(a, p.num_docs, ds_slab, ds_doc_base, p.stream)
                       : launch_backward_stored_dq<128, false>(a, p.num_docs, ds_slab, ds_doc_base, p.stream));
  else if (p.head_dim == 64)
    err = mixed ? launch_backward<64, true>(a, p.stream) : launch_backward<64, false>(a, p.stream);
  else
    err = mixed ? launch_backward<128, true>(a, p.stream) : launch_backward<128, false>(a, p.stream);
  return err == cudaSuccess ? err : failed("the dK/dV and dQ kernels (attributes, launches)", err);
}

}  // namespace sm90
}  // namespace flamia
