// Backward (ALGORITHM.md §3), deterministic and without atomics. S and Sᵀ come from wgmma
// with the forward's instruction sequence (scores_wgmma.cuh), so that P = exp2(S c - lse2)
// is rebuilt from the very S the forward's LSE was taken over; the other products (dP, dV,
// dK, dQ) are mma.sync on FP32-exact tile products, as before.
//
// 1. quantize dO (natural + transposed FP8, scales) and D = rowsum(dO * O) (quantize.cu);
// 2. dK/dV kernel: CTA = (64-key tile of one document, kv head), 4 warps x 16 keys. Loops
//    over the query heads of the GQA group, then over the query tiles that see the key tile,
//    in the order the specification sums them. Per query tile:
//      Sᵀ = K Qᵀ, Pᵀ = exp2(fmaf(Sᵀ, c, -lse2)), dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ - D),
//      dV += sigma * (q8(Pᵀ sdo / sigma) · dOᵀ tile),
//      dK += tau * (q8(dSᵀ sq / tau) · Qᵀ tile)   (fp8)  or  bf16(dSᵀ) · Q   (fp8_mixed);
//    keys are rows, so Pᵀ and dSᵀ are A operands straight from the accumulators; Sᵀ is
//    the wgmma K Qᵀ (A = the resident K tile), issued before dPᵀ and overlapping it;
// 3. dQ kernel: CTA = (64-query tile, query head), 4 warps x 16 queries; loops over key
//    tiles, recomputes S (wgmma Q Kᵀ, as the forward), P, dP, dS and accumulates
//      dQ += rho * (q8(dS sk / rho) · Kᵀ tile)   (fp8)  or  bf16(dS) · K   (fp8_mixed).
//    Recomputing S and dP here costs two matmuls of the four per tile pair, but gives every
//    dQ row one owner: deterministic, no FP32 atomics, no dQ accumulator in global memory.
//    A later version replaces this with dS staged through shared memory.
// All operand tiles go through double-buffered cp.async stages. The Q and K tiles of S are
// in wgmma's K-major core-matrix layout (ScoreTile) and are read by nothing else; after
// cp.async lands, each thread fences the async proxy before the CTA barrier.
// Both kernels are one warpgroup (4 warps x 16 rows), and the m64n64 wgmma accumulator has
// the per-warp layout of the mma.sync TileAcc (wgmma.cuh), so the code after S is unchanged.
#include "quantize/quantize.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/per_device.h"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/sm90.h"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct BwdArgs {
  const uint8_t* q8;    // [T, Hq, D]
  const uint8_t* k8;    // [T, Hkv, D]
  const uint8_t* v8;    // [T, Hkv, D]
  const uint8_t* qt8;   // [Hq][D][Tpad]   (fp8)
  const uint8_t* kt8;   // [Hkv][D][Tpad]  (fp8)
  const uint8_t* do8;   // [T, Hq, D]
  const uint8_t* dot8;  // [Hq][D][Tpad]
  const float* sq;      // [Hq][T]
  const float* sk;      // [Hkv][T]
  const float* sv;      // [Hkv][T]
  const float* sdo;     // [Hq][T]
  const float* dvec;    // [Hq][T]  D = rowsum(dO * O)
  const float* lse;     // [Hq][T]  natural log, from the forward
  const guard::DeviceError* status;  // the backward's status word (workspace)
  const uint16_t* q;    // bf16 inputs (fp8_mixed), head_dim contiguous
  const uint16_t* k;
  int64_t q_stride_t, q_stride_h, k_stride_t, k_stride_h;
  const int32_t* cu_seqlens;
  WorkList work;
  uint16_t* dq;         // bf16 [T, Hq, D]
  uint16_t* dk;         // bf16 [T, Hkv, D]
  uint16_t* dv;         // bf16 [T, Hkv, D]
  int64_t total_tokens, tpad;
  int hq, hkv;
  bool causal;
  float c;              // softmax_scale * log2(e)
  float softmax_scale;
};

// The operand of the dS matmul that is reduced over tokens: a transposed FP8 tile (fp8) or
// a natural BF16 tile (fp8_mixed).
template <int D, bool kMixed>
constexpr int ds_operand_bytes() {
  return kMixed ? Bf16RowTile<D>::kBytes : Fp8ColTile<D>::kBytes;
}

// P and dS of one visible (query, key) pair (ALGORITHM.md §3); callers zero masked pairs
// by selection, so nothing of a masked pair (a NaN scale, say) can reach a result.
struct PairGrad {
  float p, ds;
};
__device__ __forceinline__ PairGrad pair_grad(float s_dot, float dp_dot, float sq, float sk, float sdo,
                                              float sv, float lse2, float d, float c) {
  const float s = score(s_dot, sq, sk);
  const float p = ptx::ex2(fmaf(s, c, -lse2));
  const float dp = __fmul_rn(__fmul_rn(dp_dot, sdo), sv);
  return {p, __fmul_rn(p, __fsub_rn(dp, d))};
}

// Per-row scale of a folded operand, FP8 fragments of it, and acc += scale * (A · B tile).
template <int D>
__device__ __forceinline__ void accumulate_scaled_fp8(float (&acc)[D / 8][4], const TileAcc& x, uint32_t bt_tile) {
  float scale[2], inv[2];
  row_pow2_scales(x, scale);
  inv[0] = __frcp_rn(scale[0]);
  inv[1] = __frcp_rn(scale[1]);
  uint32_t a[2][4];
  pack_fp8_a(x, inv, a);
  const float one[2] = {1.0f, 1.0f};
  accumulate_fp8_k64<D>(acc, a, bt_tile, scale, one);
}

// acc += (recipe's dS operand) · (its partner tile): FP8 with a per-row scale, or BF16.
template <int D, bool kMixed>
__device__ __forceinline__ void accumulate_ds(float (&acc)[D / 8][4], const TileAcc& x, uint32_t tile) {
  if constexpr (kMixed) {
    uint32_t a[4][4];
    pack_bf16_a(x, a);
    accumulate_bf16_k64<D>(acc, a, tile);
  } else {
    accumulate_scaled_fp8<D>(acc, x, tile);
  }
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

// =====================================================================================
// dK / dV
// =====================================================================================

template <int D, bool kMixed>
struct DkdvSmem {
  static constexpr int kK = 0;                               // A of Sᵀ
  static constexpr int kV = kK + ScoreTile<D>::kBytes;
  static constexpr int kSk = kV + Fp8RowTile<D>::kBytes;  // per-key scales
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStage0 = kSv + kScalarTileBytes;
  // One stage: a query tile of one head.
  static constexpr int kQ = 0;                                    // q8 rows (B of Sᵀ)
  static constexpr int kDo = kQ + ScoreTile<D>::kBytes;            // dO8 rows
  static constexpr int kDot = kDo + Fp8RowTile<D>::kBytes;         // dOᵀ cols
  static constexpr int kQop = kDot + Fp8ColTile<D>::kBytes;        // Qᵀ cols | Q bf16 rows
  static constexpr int kSqT = kQop + ds_operand_bytes<D, kMixed>();  // per-query values
  static constexpr int kSdoT = kSqT + kScalarTileBytes;
  static constexpr int kLseT = kSdoT + kScalarTileBytes;
  static constexpr int kDvecT = kLseT + kScalarTileBytes;
  static constexpr int kStageBytes = kDvecT + kScalarTileBytes;
  static constexpr int kBytes = kStage0 + 2 * kStageBytes;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
};

// One query tile for a warp's 16 key rows j0, j0 + 8 (document positions).
template <int D, bool kMixed, bool kMask>
__device__ __forceinline__ void dkdv_query_tile(const uint8_t* smem, int stage, const DocMask& mask, int j0,
                                                int m0, float c, float (&dk)[D / 8][4], float (&dv)[D / 8][4]) {
  using S = DkdvSmem<D, kMixed>;
  const uint32_t base = ptx::smem_addr(smem), st = base + S::stage(stage);
  const uint8_t* st_ptr = smem + S::stage(stage);
  const float* sq = reinterpret_cast<const float*>(st_ptr + S::kSqT);
  const float* sdo = reinterpret_cast<const float*>(st_ptr + S::kSdoT);
  const float* lse = reinterpret_cast<const float*>(st_ptr + S::kLseT);
  const float* dvec = reinterpret_cast<const float*>(st_ptr + S::kDvecT);
  const int q = lane_id() & 3, row0 = 16 * warp_id();
  // This lane's key rows are row0 + g and row0 + g + 8 of the tile.
  float sk_row[2], sv_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = row0 + (lane_id() >> 2) + 8 * r;
    sk_row[r] = reinterpret_cast<const float*>(smem + S::kSk)[j];
    sv_row[r] = reinterpret_cast<const float*>(smem + S::kSv)[j];
  }

  TileAcc s, dp;  // Sᵀ and dPᵀ: rows = keys, columns = queries
  wgmma::fence();
  issue_scores<D>(s, base + S::kK, st + S::kQ);  // Sᵀ = K Qᵀ, whole warpgroup
  mma_rows<D>(dp, base + S::kV, row0, st + S::kDo);
  wgmma::wait<0>();
  wgmma::pin(s);
  // In place: s <- Pᵀ * sdo (dV operand), dp <- dSᵀ * sq (fp8) or dSᵀ (fp8_mixed).
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      const bool visible = !kMask || mask.visible(m0 + col, j0 + 8 * r);
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], sq[col], sk_row[r], sdo[col], sv_row[r],
                                    __fmul_rn(lse[col], kLog2e), dvec[col], c);
      s[n][e] = visible ? __fmul_rn(pg.p, sdo[col]) : 0.0f;
      dp[n][e] = visible ? (kMixed ? pg.ds : __fmul_rn(pg.ds, sq[col])) : 0.0f;
    }
  accumulate_scaled_fp8<D>(dv, s, st + S::kDot);
  accumulate_ds<D, kMixed>(dk, dp, st + S::kQop);
}

template <int D, bool kMixed>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const __grid_constant__ BwdArgs a) {
  using S = DkdvSmem<D, kMixed>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int slot = blockIdx.x / a.hkv, hk = blockIdx.x % a.hkv;
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  if (slot >= item_count(a.work) || a.status->fault != guard::kNone) return;
  const DocTile dt = doc_tile(a.cu_seqlens, a.work, slot);
  if (dt.len == 0) return;
  // Item t of a document is its key tile nt - 1 - t when causal (cost order, schedule.cuh).
  const int n = a.causal ? dt.num_tiles - 1 - dt.tile : dt.tile;
  const int n0 = n * kTileTokens;
  const int group = a.hq / a.hkv;
  const int m_first = a.causal ? n : 0, num_query_tiles = dt.num_tiles - m_first;
  const int steps = group * num_query_tiles;  // (query head, query tile), head-major
  const DocMask mask{dt.len, a.causal};
  const uint32_t base = ptx::smem_addr(smem);

  const int64_t q_row = int64_t(a.hq) * D, kv_row = int64_t(a.hkv) * D;
  const int64_t kv_off = (dt.tok0 + n0) * kv_row + hk * D;
  const int valid_k = min(kTileTokens, dt.len - n0);
  load_kmajor_rows<D>(base + S::kK, a.k8 + kv_off, kv_row, valid_k);
  load_fp8_rows<D>(base + S::kV, a.v8 + kv_off, kv_row, valid_k);
  {
    const int64_t tok_off = hk * a.total_tokens + dt.tok0 + n0;
    if (threadIdx.x < kTileTokens) load_scalar(base + S::kSk, a.sk + tok_off, valid_k, threadIdx.x);
    else load_scalar(base + S::kSv, a.sv + tok_off, valid_k, threadIdx.x - kTileTokens);
  }
  ptx::cp_async_commit();

  auto load_query_tile = [&](int step) {
    const int h = hk * group + step / num_query_tiles;
    const int m0 = (m_first + step % num_query_tiles) * kTileTokens;
    const int valid = min(kTileTokens, dt.len - m0);
    const uint32_t st = base + S::stage(step & 1);
    const int64_t row_off = (dt.tok0 + m0) * q_row + h * D;
    const int64_t col_off = int64_t(h) * D * a.tpad + dt.pstart + m0;
    load_kmajor_rows<D>(st + S::kQ, a.q8 + row_off, q_row, valid);
    load_fp8_rows<D>(st + S::kDo, a.do8 + row_off, q_row, valid);
    load_fp8_cols<D>(st + S::kDot, a.dot8 + col_off, a.tpad, valid);
    if constexpr (kMixed)
      load_bf16_rows<D>(st + S::kQop, a.q + (dt.tok0 + m0) * a.q_stride_t + h * a.q_stride_h, a.q_stride_t, valid);
    else
      load_fp8_cols<D>(st + S::kQop, a.qt8 + col_off, a.tpad, valid);
    const int64_t tok_off = h * a.total_tokens + dt.tok0 + m0;
    const int i = threadIdx.x & 63;
    if (threadIdx.x < kTileTokens) {
      load_scalar(st + S::kSqT, a.sq + tok_off, valid, i);
      load_scalar(st + S::kLseT, a.lse + tok_off, valid, i);
    } else {
      load_scalar(st + S::kSdoT, a.sdo + tok_off, valid, i);
      load_scalar(st + S::kDvecT, a.dvec + tok_off, valid, i);
    }
  };
  load_query_tile(0);
  ptx::cp_async_commit();

  const int j0 = n0 + 16 * warp_id() + (lane_id() >> 2);  // this lane's keys: j0, j0 + 8
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[c][e] = dv[c][e] = 0.0f;

  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) load_query_tile(step + 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // K, V and this step's query tile landed (this thread's copies)
    const int m = m_first + step % num_query_tiles, m0 = m * kTileTokens;
    uint8_t* st_ptr = smem + S::stage(step & 1);
    clear_cols_tail<D>(st_ptr + S::kDot, dt.len - m0);
    if constexpr (kMixed) clear_bf16_nonfinite<D>(st_ptr + S::kQop);
    else clear_cols_tail<D>(st_ptr + S::kQop, dt.len - m0);
    wgmma::fence_proxy_async();  // the cp.async writes become visible to wgmma (Sᵀ)
    __syncthreads();
    if (mask_needed_for_key_rows(mask, m, n, kTileTokens))
      dkdv_query_tile<D, kMixed, true>(smem, step & 1, mask, j0, m0, a.c, dk, dv);
    else
      dkdv_query_tile<D, kMixed, false>(smem, step & 1, mask, j0, m0, a.c, dk, dv);
    __syncthreads();  // the stage is refilled by the next step's prefetch
  }

  // Every key row of the document is written, also those no query sees (zeros).
  const int64_t out_off = dt.tok0 * kv_row + hk * D;
  store_rows_bf16<D>(a.dk + out_off, kv_row, dk, a.softmax_scale, n0 + 16 * warp_id(), dt.len);
  store_rows_bf16<D>(a.dv + out_off, kv_row, dv, 1.0f, n0 + 16 * warp_id(), dt.len);
}

// =====================================================================================
// dQ
// =====================================================================================

template <int D, bool kMixed>
struct DqSmem {
  static constexpr int kQ = 0;  // A of S
  static constexpr int kDo = kQ + ScoreTile<D>::kBytes;
  // Per-query values, read from shared memory where used (registers are the scarce resource).
  static constexpr int kSq = kDo + Fp8RowTile<D>::kBytes;
  static constexpr int kSdo = kSq + kScalarTileBytes;
  static constexpr int kLse = kSdo + kScalarTileBytes;
  static constexpr int kDvec = kLse + kScalarTileBytes;
  static constexpr int kStage0 = kDvec + kScalarTileBytes;
  // One stage: a key tile.
  static constexpr int kK = 0;                                     // k8 rows (B of S)
  static constexpr int kV = kK + ScoreTile<D>::kBytes;              // v8 rows
  static constexpr int kKop = kV + Fp8RowTile<D>::kBytes;           // Kᵀ cols | K bf16 rows
  static constexpr int kSk = kKop + ds_operand_bytes<D, kMixed>();
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStageBytes = kSv + kScalarTileBytes;
  static constexpr int kBytes = kStage0 + 2 * kStageBytes;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
};

template <int D, bool kMixed, bool kMask>
__device__ __forceinline__ void dq_key_tile(const uint8_t* smem, int stage, const DocMask& mask, int i0,
                                            int n0, float c, float (&dq)[D / 8][4]) {
  using S = DqSmem<D, kMixed>;
  const uint32_t base = ptx::smem_addr(smem), st = base + S::stage(stage);
  const float* sk = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSk);
  const float* sv = reinterpret_cast<const float*>(smem + S::stage(stage) + S::kSv);
  const int q = lane_id() & 3, row0 = 16 * warp_id();
  // This lane's query rows are row0 + g and row0 + g + 8 of the tile.
  float sq[2], sdo[2], lse2[2], d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + (lane_id() >> 2) + 8 * r;
    sq[r] = reinterpret_cast<const float*>(smem + S::kSq)[i];
    sdo[r] = reinterpret_cast<const float*>(smem + S::kSdo)[i];
    lse2[r] = __fmul_rn(reinterpret_cast<const float*>(smem + S::kLse)[i], kLog2e);
    d[r] = reinterpret_cast<const float*>(smem + S::kDvec)[i];
  }

  TileAcc s, dp;  // S and dP: rows = queries, columns = keys
  wgmma::fence();
  issue_scores<D>(s, base + S::kQ, st + S::kK);  // S = Q Kᵀ, whole warpgroup, as the forward
  mma_rows<D>(dp, base + S::kDo, row0, st + S::kV);
  wgmma::wait<0>();
  wgmma::pin(s);
  // In place: s <- dS * sk (fp8) or dS (fp8_mixed).
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * n + 2 * q + (e & 1), r = e >> 1;
      const bool visible = !kMask || mask.visible(i0 + 8 * r, n0 + col);
      const PairGrad pg = pair_grad(s[n][e], dp[n][e], sq[r], sk[col], sdo[r], sv[col], lse2[r], d[r], c);
      s[n][e] = visible ? (kMixed ? pg.ds : __fmul_rn(pg.ds, sk[col])) : 0.0f;
    }
  accumulate_ds<D, kMixed>(dq, s, st + S::kKop);
}

template <int D, bool kMixed>
__global__ void __launch_bounds__(kThreads) dq_kernel(const __grid_constant__ BwdArgs a) {
  using S = DqSmem<D, kMixed>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int slot = blockIdx.x / a.hq, h = blockIdx.x % a.hq;
  // The backward cannot zero qkv8's count: its own guard fault is in the workspace.
  if (slot >= item_count(a.work) || a.status->fault != guard::kNone) return;
  const DocTile dt = doc_tile(a.cu_seqlens, a.work, slot);
  if (dt.len == 0) return;
  const int hk = h / (a.hq / a.hkv);
  const int m0 = dt.tile * kTileTokens;
  const int num_key_tiles = a.causal ? dt.tile + 1 : dt.num_tiles;
  const DocMask mask{dt.len, a.causal};
  const uint32_t base = ptx::smem_addr(smem);

  const int64_t q_row = int64_t(a.hq) * D, kv_row = int64_t(a.hkv) * D;
  const int64_t q_off = (dt.tok0 + m0) * q_row + h * D;
  const int valid_q = min(kTileTokens, dt.len - m0);
  load_kmajor_rows<D>(base + S::kQ, a.q8 + q_off, q_row, valid_q);
  load_fp8_rows<D>(base + S::kDo, a.do8 + q_off, q_row, valid_q);
  {
    const int64_t tok_off = h * a.total_tokens + dt.tok0 + m0;
    const int i = threadIdx.x & 63;
    if (threadIdx.x < kTileTokens) {
      load_scalar(base + S::kSq, a.sq + tok_off, valid_q, i);
      load_scalar(base + S::kLse, a.lse + tok_off, valid_q, i);
    } else {
      load_scalar(base + S::kSdo, a.sdo + tok_off, valid_q, i);
      load_scalar(base + S::kDvec, a.dvec + tok_off, valid_q, i);
    }
  }
  ptx::cp_async_commit();

  auto load_key_tile = [&](int n) {
    const int n0 = n * kTileTokens, valid = min(kTileTokens, dt.len - n0);
    const uint32_t st = base + S::stage(n & 1);
    const int64_t row_off = (dt.tok0 + n0) * kv_row + hk * D;
    load_kmajor_rows<D>(st + S::kK, a.k8 + row_off, kv_row, valid);
    load_fp8_rows<D>(st + S::kV, a.v8 + row_off, kv_row, valid);
    if constexpr (kMixed)
      load_bf16_rows<D>(st + S::kKop, a.k + (dt.tok0 + n0) * a.k_stride_t + hk * a.k_stride_h, a.k_stride_t, valid);
    else
      load_fp8_cols<D>(st + S::kKop, a.kt8 + int64_t(hk) * D * a.tpad + dt.pstart + n0, a.tpad, valid);
    const int64_t tok_off = hk * a.total_tokens + dt.tok0 + n0;
    if (threadIdx.x < kTileTokens) load_scalar(st + S::kSk, a.sk + tok_off, valid, threadIdx.x);
    else load_scalar(st + S::kSv, a.sv + tok_off, valid, threadIdx.x - kTileTokens);
  };
  load_key_tile(0);
  ptx::cp_async_commit();

  const int i0 = m0 + 16 * warp_id() + (lane_id() >> 2);  // this lane's queries: i0, i0 + 8
  float dq[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[c][e] = 0.0f;

  for (int n = 0; n < num_key_tiles; ++n) {
    if (n + 1 < num_key_tiles) load_key_tile(n + 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // Q, dO and key tile n landed (this thread's copies)
    const int n0 = n * kTileTokens;
    uint8_t* st_ptr = smem + S::stage(n & 1);
    if constexpr (kMixed) clear_bf16_nonfinite<D>(st_ptr + S::kKop);
    else clear_cols_tail<D>(st_ptr + S::kKop, dt.len - n0);
    wgmma::fence_proxy_async();  // the cp.async writes become visible to wgmma (S)
    __syncthreads();
    if (mask_needed_for_query_rows(mask, dt.tile, n, kTileTokens))
      dq_key_tile<D, kMixed, true>(smem, n & 1, mask, i0, n0, a.c, dq);
    else
      dq_key_tile<D, kMixed, false>(smem, n & 1, mask, i0, n0, a.c, dq);
    __syncthreads();
  }

  store_rows_bf16<D>(a.dq + dt.tok0 * q_row + h * D, q_row, dq, a.softmax_scale, m0 + 16 * warp_id(), dt.len);
}

// =====================================================================================
// launch
// =====================================================================================

template <int D, bool kMixed>
cudaError_t launch_backward(const BwdArgs& a, int64_t slots, cudaStream_t stream) {
  constexpr int kDkdvSmem = DkdvSmem<D, kMixed>::kBytes, kDqSmem = DqSmem<D, kMixed>::kBytes;
  cudaError_t attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dkdv_kernel<D, kMixed>), kDkdvSmem);
  if (attr == cudaSuccess) attr = FLAMIA_ALLOW_DYNAMIC_SMEM((dq_kernel<D, kMixed>), kDqSmem);
  if (attr != cudaSuccess) return attr;
  dkdv_kernel<D, kMixed><<<unsigned(slots * a.hkv), kThreads, kDkdvSmem, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  dq_kernel<D, kMixed><<<unsigned(slots * a.hq), kThreads, kDqSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t backward(const Params& p, const void* dout, int64_t dout_stride_t, int64_t dout_stride_h,
                     const void* out, const float* lse, const void* qkv8, void* workspace,
                     void* dq, void* dk, void* dv) {
  if (p.total_tokens == 0) return cudaSuccess;
  const bool mixed = p.recipe == FLAMIA_RECIPE_FP8_MIXED;
  if (mixed && (!quant::rows_16b_aligned(p.q, p.q_stride_t, p.q_stride_h) ||
                !quant::rows_16b_aligned(p.k, p.k_stride_t, p.k_stride_h)))
    return cudaErrorInvalidValue;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                              p.recipe, true);
  const auto ws_layout = quant::BwdWorkspaceLayout::make(p.total_tokens, p.num_docs, p.hq, p.head_dim);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const uint8_t* base = static_cast<const uint8_t*>(qkv8);
  cudaError_t err =
      quant::quantize_dout(p, dout, dout_stride_t, dout_stride_h, out, base, layout, ws, ws_layout);
  if (err != cudaSuccess) return err;

  BwdArgs a{};
  a.q8 = base + layout.q8;
  a.k8 = base + layout.k8;
  a.v8 = base + layout.v8;
  a.qt8 = mixed ? nullptr : base + layout.qt8;
  a.kt8 = mixed ? nullptr : base + layout.kt8;
  a.do8 = ws + ws_layout.do8;
  a.dot8 = ws + ws_layout.dot8;
  a.sq = reinterpret_cast<const float*>(base + layout.sq);
  a.sk = reinterpret_cast<const float*>(base + layout.sk);
  a.sv = reinterpret_cast<const float*>(base + layout.sv);
  a.sdo = reinterpret_cast<const float*>(ws + ws_layout.sdo);
  a.dvec = reinterpret_cast<const float*>(ws + ws_layout.dvec);
  a.lse = lse;
  a.status = reinterpret_cast<const guard::DeviceError*>(ws + ws_layout.status);
  a.q = static_cast<const uint16_t*>(p.q);
  a.k = static_cast<const uint16_t*>(p.k);
  a.q_stride_t = p.q_stride_t;
  a.q_stride_h = p.q_stride_h;
  a.k_stride_t = p.k_stride_t;
  a.k_stride_h = p.k_stride_h;
  a.cu_seqlens = p.cu_seqlens;
  a.work = work_list(base, layout, layout.work);
  a.dq = static_cast<uint16_t*>(dq);
  a.dk = static_cast<uint16_t*>(dk);
  a.dv = static_cast<uint16_t*>(dv);
  a.total_tokens = p.total_tokens;
  a.tpad = layout.tpad;
  a.hq = p.hq;
  a.hkv = p.hkv;
  a.causal = p.causal;
  a.c = p.softmax_scale * kLog2e;
  a.softmax_scale = p.softmax_scale;
  const int64_t slots = layout.work.capacity;
  if (p.head_dim == 64)
    return mixed ? launch_backward<64, true>(a, slots, p.stream) : launch_backward<64, false>(a, slots, p.stream);
  if (p.head_dim == 128)
    return mixed ? launch_backward<128, true>(a, slots, p.stream) : launch_backward<128, false>(a, slots, p.stream);
  return cudaErrorInvalidValue;
}

}  // namespace sm90
}  // namespace flamia
