// Forward mainloop (ALGORITHM.md §2) on wgmma (FP8 E4M3 warpgroup MMA, sm_90a).
//
// Same work decomposition as forward.cu: CTA = (64-query tile of one document, query head),
// one warpgroup; warp w owns query rows 16 w .. 16 w + 15, so the per-row softmax, the
// pow2 scales and the FP8 packing of fragments.cuh / softmax.cuh apply unchanged (the
// m64nN accumulator has the mma.sync m16n8 layout per warp). Key tiles of 64, ascending.
//
// Per key tile:
//   S = Q Kᵀ         wgmma m64n64k32, Q and K tiles in shared memory, D/32 k-steps;
//   softmax, fold sv, sigma (the row maximum of p * sv: ALGORITHM.md §7 TileMax),
//                    p8 = q8(p * sv, sigma) in registers (no shuffles: Vᵀ is stored
//                    in fragment order, layout.cuh);
//   p8 Vᵀ            wgmma m64nDk32 with A = p8 from registers, 2 k-steps (32 keys each);
//   acc = acc * alpha + sigma * (p8 Vᵀ).
// Accumulation precision (kPromote). Chaining the k-steps inside one wgmma accumulator
// (scale-d = 1) misses the CPU specification by far more than FP32 rounding on H200: the
// FP8 wgmma accumulator keeps fewer bits than FP32 (../shared/HOPPER-FP8-NOTES.md §7).
// Measured with chained k-steps, D = 64 and 128: LSE max |diff| 3e-4 .. 3e-3 (S is already
// off), O rel L2 0.002 .. 0.004 with 70 .. 87 % of outputs bitwise equal; the mma.sync
// forward gives O rel L2 ~7e-6. The promoted kernel therefore issues every k32 step into a
// fresh accumulator (scale-d = 0) and adds it to FP32 registers with FADDs: S in increasing
// k order; O as acc = acc * alpha + sigma * step0, then acc += sigma * step1 (the addition
// order inside a tile is free in the specification). Measured with promotion: LSE max
// |diff| 1e-4 .. 6e-4, O rel L2 0.0016 .. 0.0024 (86 .. 92 % bitwise equal), at 90 % of the
// chained speed: one k32 step already rounds below FP32, so promotion narrows the gap but
// does not close it.
// The chained kernel (FLAMIA_FORWARD_KERNEL=wgmma_chained; the default forward is
// kernels/forward_fast.cu) computes S as the backward does, bit for bit (the same instruction
// sequence, scores_wgmma.cuh), so the backward's P = exp2(S c - lse2)
// never exceeds 1 beyond the FP32 rounding of LSE, also at logits ~1e6, where an S rounded
// differently overflows exp2 and makes the gradients Inf. The promoted kernel rounds S
// differently from the backward and stays selectable for comparison only (forward.cu).
// The P·V product of tile n - 1 (chained: both k-steps; promoted: its first k-step) is
// issued after S of tile n and runs while the softmax of tile n does, so the tensor cores
// see back-to-back work from one warpgroup (a second CTA per SM fills the remaining gaps).
// Operand tiles are loaded by cp.async (all 128 threads, three stages, one tile ahead)
// straight into the K-major no-swizzle core-matrix layout of wgmma.cuh.
#include <cmath>
#include <cstring>

#include "sm90/forward_args.cuh"
#include "sm90/forward_item.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/per_device.h"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/sm90.h"
#include "sm90/softmax.cuh"
#include "sm90/tile_io.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace {

constexpr int kStages = 3;  // key tiles in shared memory: loading, read by S, read by P·V

template <int D>
struct WgSmem {
  using QTile = ScoreTile<D>;                        // A of S: [64 queries][D]
  using KTile = ScoreTile<D>;                        // B of S: [64 keys][D]
  using VtTile = ColTile<D>;                         // B of P·V: [D][64 key positions]
  static constexpr int kQ = 0;
  // One pipeline stage: K tile, Vᵀ tile, sk, sv.
  static constexpr int kK = 0;
  static constexpr int kVt = kK + KTile::kBytes;
  static constexpr int kSk = kVt + VtTile::kBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStageBytes = kSv + kScalarTileBytes;
  static constexpr int kStage0 = kQ + QTile::kBytes;
  static constexpr int kBytes = kStage0 + kStages * kStageBytes;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
};

// S = Q Kᵀ for one key tile. Chained: the shared definition of S (scores_wgmma.cuh), left
// in flight. Promoted: each k-step after the first goes into the fresh accumulator `step`
// and is added to s in FP32; s is complete on return.
template <int D, bool kPromote>
__device__ __forceinline__ void scores(TileAcc& s, TileAcc& step, uint32_t qtile, uint32_t ktile) {
  if constexpr (!kPromote) {
    issue_scores<D>(s, qtile, ktile);
  } else {
    using S = WgSmem<D>;
    auto qd = [&](int ks) { return wgmma::desc<typename S::QTile>(qtile, ks); };
    auto kd = [&](int ks) { return wgmma::desc<typename S::KTile>(ktile, ks); };
    wgmma::mma_ss<false>(s, qd(0), kd(0));
#pragma unroll
    for (int ks = 1; ks < D / 32; ++ks) {
      if (ks > 1) wgmma::fence();  // s and step were touched by the previous FADDs
      wgmma::mma_ss<false>(step, qd(ks), kd(ks));
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::pin(s);
      wgmma::pin(step);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = __fadd_rn(s[n][e], step[n][e]);
    }
  }
}

// Issues p8 · Vᵀ tile into fresh (zero-initialised: scale-d = 0). Chained: both k-steps
// (64 keys); promoted: the first k-step only, finish_tile_product issues the second.
template <int D, bool kPromote>
__device__ __forceinline__ void issue_tile_product(float (&fresh)[D / 8][4], const uint32_t (&p8)[2][4],
                                                   uint32_t vttile) {
  using Vt = typename WgSmem<D>::VtTile;
  wgmma::mma_rs<false>(fresh, p8[0], wgmma::desc<Vt>(vttile, 0));
  if constexpr (!kPromote) wgmma::mma_rs<true>(fresh, p8[1], wgmma::desc<Vt>(vttile, 1));
  wgmma::commit();
}

// Scores of one key tile -> p8 = q8(p * sv, sigma), with the online-softmax update (rows
// i0 and i0 + 8 of this thread). alpha rescales what was accumulated before this tile.
template <bool kMask>
__device__ __forceinline__ void softmax_tile(TileAcc& s, const float* sk, const float* sv,
                                             const float (&sq_row)[2], const DocMask& mask, int i0, int n0,
                                             float c, OnlineSoftmax& softmax, uint32_t (&p8)[2][4],
                                             float (&sigma)[2], float (&alpha)[2]) {
  reference_probabilities<kMask>(s, sk, sv, sq_row, mask, i0, n0, c, softmax, alpha);
  pack_fp8_a_row_scaled(s, sigma, p8);
}

// Waits for the product issued by issue_tile_product and folds it into acc:
// acc = acc * alpha + sigma * fresh; promoted, then acc += sigma * (second k-step).
// sigma is a power of two: the products with it are exact.
template <int D, bool kPromote>
__device__ __forceinline__ void finish_tile_product(float (&acc)[D / 8][4], float (&fresh)[D / 8][4],
                                                    uint32_t (&p8)[2][4], uint32_t vttile,
                                                    const float (&alpha)[2], const float (&sigma)[2]) {
  wgmma::wait<0>();
  wgmma::pin(fresh);
  wgmma::pin(p8[0]);
  wgmma::pin(p8[1]);
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = __fadd_rn(__fmul_rn(acc[n][e], alpha[e >> 1]), __fmul_rn(sigma[e >> 1], fresh[n][e]));
  if constexpr (kPromote) {
    wgmma::fence();  // fresh was read by the FADDs above
    wgmma::mma_rs<false>(fresh, p8[1], wgmma::desc<typename WgSmem<D>::VtTile>(vttile, 1));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(fresh);
    wgmma::pin(p8[1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = __fadd_rn(acc[n][e], __fmul_rn(sigma[e >> 1], fresh[n][e]));
  }
}

template <int D, bool kPromote>
__global__ void __launch_bounds__(kThreads) forward_wgmma_kernel(const __grid_constant__ FwdArgs a) {
  using S = WgSmem<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  RefItem<D> it;
  if (!it.take(a)) return;
  const DocTile& dt = it.dt;
  const DocMask& mask = it.mask;
  const int m0 = it.m0, num_key_tiles = it.num_key_tiles;
  const int64_t q_row = it.q_row, kv_row = it.kv_row;
  const uint8_t* k_src = it.k_src;
  const uint8_t* vt_src = it.vt_src;
  const float* sk_src = it.sk_src;
  const float* sv_src = it.sv_src;
  const uint32_t base = ptx::smem_addr(smem);
  auto load_key_tile = [&](int n) {
    const int n0 = n * kTileTokens, valid = min(kTileTokens, dt.len - n0);
    const uint32_t st = base + S::stage(n % kStages);
    load_kmajor_rows<D>(st + S::kK, k_src + n0 * kv_row, kv_row, valid);
    load_kmajor_cols<D>(st + S::kVt, vt_src + n0, a.tpad, valid);
    if (threadIdx.x < kTileTokens) load_scalar(st + S::kSk, sk_src + n0, valid, threadIdx.x);
    else load_scalar(st + S::kSv, sv_src + n0, valid, threadIdx.x - kTileTokens);
  };

  load_kmajor_rows<D>(base + S::kQ, it.q_src(a), q_row, min(kTileTokens, dt.len - m0));
  load_key_tile(0);
  ptx::cp_async_commit();

  const int i0 = it.row0();  // this lane's rows: i0 and i0 + 8
  float sq_row[2];
  it.load_sq_rows(a, i0, sq_row);

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  OnlineSoftmax softmax;
  // Tile n - 1's operand of its P·V product and its fold factors, carried into iteration n.
  uint32_t p8[2][4];
  float sigma[2], alpha[2];
  float fresh[D / 8][4];

  // Iteration n issues S_n = Q K_nᵀ and then P_{n-1} V_{n-1}; the softmax of S_n runs while
  // the P·V product is still on the tensor cores, and tile n - 1 is folded into acc after it.
  // Three stages: tile n + 1 is loading, tile n is read by S_n, tile n - 1 by P·V.
  for (int n = 0; n < num_key_tiles; ++n) {
    const int n0 = n * kTileTokens;
    ptx::cp_async_wait<0>();  // key tile n (and Q) landed: this thread's copies
    clear_kmajor_cols_tail<D>(smem + S::stage(n % kStages) + S::kVt, dt.len - n0);
    wgmma::fence_proxy_async();
    // Also orders every warp's wait for P_{n-2} V_{n-2} before the refill of its stage.
    __syncthreads();
    if (n + 1 < num_key_tiles) {
      load_key_tile(n + 1);
      ptx::cp_async_commit();
    }
    const uint32_t st = base + S::stage(n % kStages);
    const uint8_t* st_ptr = smem + S::stage(n % kStages);

    TileAcc s, s_step;
    wgmma::pin(p8[0]);  // the P·V operand is final before the fence (no copy may follow it)
    wgmma::pin(p8[1]);
    wgmma::fence();
    scores<D, kPromote>(s, s_step, base + S::kQ, st + S::kK);
    const uint32_t prev_vt = base + S::stage((n + kStages - 1) % kStages) + S::kVt;
    if (n > 0) {
      wgmma::fence();  // ptxas tracks the fence per basic block; without it, it injects one here
      issue_tile_product<D, kPromote>(fresh, p8, prev_vt);
      wgmma::wait<1>();
    } else {
      wgmma::wait<0>();
    }
    wgmma::pin(s);

    uint32_t p8_next[2][4];
    float sigma_next[2], alpha_next[2];
    const float* sk = reinterpret_cast<const float*>(st_ptr + S::kSk);
    const float* sv = reinterpret_cast<const float*>(st_ptr + S::kSv);
    if (mask_needed_for_query_rows(mask, dt.tile, n, kTileTokens))
      softmax_tile<true>(s, sk, sv, sq_row, mask, i0, n0, a.c, softmax, p8_next, sigma_next, alpha_next);
    else
      softmax_tile<false>(s, sk, sv, sq_row, mask, i0, n0, a.c, softmax, p8_next, sigma_next, alpha_next);

    if (n > 0) finish_tile_product<D, kPromote>(acc, fresh, p8, prev_vt, alpha, sigma);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sigma[r] = sigma_next[r];
      alpha[r] = alpha_next[r];
#pragma unroll
      for (int i = 0; i < 4; ++i) p8[r][i] = p8_next[r][i];
    }
  }
  // The last tile's P·V.
  wgmma::pin(p8[0]);
  wgmma::pin(p8[1]);
  wgmma::fence();
  const uint32_t last_vt = base + S::stage((num_key_tiles - 1) % kStages) + S::kVt;
  issue_tile_product<D, kPromote>(fresh, p8, last_vt);
  finish_tile_product<D, kPromote>(acc, fresh, p8, last_vt, alpha, sigma);

  it.store(a, i0, acc, softmax.l, softmax.mc);
}

template <int D, bool kPromote>
cudaError_t launch(const FwdArgs& a, int64_t slots, cudaStream_t stream) {
  constexpr int kSmem = WgSmem<D>::kBytes;
  const cudaError_t attr = FLAMIA_ALLOW_DYNAMIC_SMEM((forward_wgmma_kernel<D, kPromote>), kSmem);
  if (attr != cudaSuccess) return attr;
  forward_wgmma_kernel<D, kPromote><<<unsigned(slots * a.hq), kThreads, kSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t forward_wgmma(const Params& p, const void* qkv8, void* out, float* lse, bool promote) {
  if (p.total_tokens == 0) return cudaSuccess;
  int64_t slots = 0;
  const FwdArgs a = make_fwd_args(p, qkv8, out, lse, &slots);
  if (p.head_dim == 64)
    return promote ? launch<64, true>(a, slots, p.stream) : launch<64, false>(a, slots, p.stream);
  if (p.head_dim == 128)
    return promote ? launch<128, true>(a, slots, p.stream) : launch<128, false>(a, slots, p.stream);
  return cudaErrorInvalidValue;
}

}  // namespace sm90
}  // namespace flamia
