// Forward mainloop (ALGORITHM.md §2) on mma.sync FP8.
//
// CTA = (64-query tile of one document, query head), 4 warps x 16 query rows; the CTA order
// comes from the longest-first work list (schedule.cuh). The Q tile stays in shared memory
// and its fragments are re-read per key tile: on sm_90 every FP8 mma.sync operand is
// unpacked to f16 in registers, and Q fragments held across the loop pushed the D = 128
// kernel past 255 registers into spills.
// Key tiles of 64 are visited in increasing order (the online softmax's rounding depends on
// it): K [64][D] and Vᵀ [D][64] tiles plus sk/sv arrive by cp.async, double-buffered.
// Per tile: S = Q Kᵀ (FP32) * sq * sk, masks, online softmax, fold sv into p, per-row
// sigma, p8 = q8(p * sv, sigma) with sigma from the row maximum of p * sv (ALGORITHM.md §7
// TileMax, this reference kernel's rule), and O = O * alpha + sigma * (p8 · Vᵀ tile).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sm90/forward_args.cuh"
#include "sm90/forward_item.cuh"
#include "sm90/fragments.cuh"
#include "sm90/masks.cuh"
#include "sm90/per_device.h"
#include "sm90/schedule.cuh"
#include "sm90/sm90.h"
#include "sm90/softmax.cuh"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {
namespace {

template <int D>
struct FwdSmem {
  static constexpr int kQ = 0;
  // One pipeline stage: K tile, Vᵀ tile, sk, sv.
  static constexpr int kK = 0;
  static constexpr int kVt = kK + Fp8RowTile<D>::kBytes;
  static constexpr int kSk = kVt + Fp8ColTile<D>::kBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStageBytes = kSv + kScalarTileBytes;
  static constexpr int kStage0 = kQ + Fp8RowTile<D>::kBytes;
  static constexpr int kBytes = kStage0 + 2 * kStageBytes;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
};

// One key tile for a warp's 16 query rows.
template <int D, bool kMask>
__device__ __forceinline__ void forward_key_tile(uint32_t qtile, uint32_t stage,
                                                 const uint8_t* stage_ptr, const float (&sq_row)[2],
                                                 const DocMask& mask, int i0, int n0, float c,
                                                 OnlineSoftmax& softmax, float (&acc)[D / 8][4]) {
  using S = FwdSmem<D>;
  const float* sk = reinterpret_cast<const float*>(stage_ptr + S::kSk);
  const float* sv = reinterpret_cast<const float*>(stage_ptr + S::kSv);

  TileAcc s;
  mma_rows<D>(s, qtile, 16 * warp_id(), stage + S::kK);
  float alpha[2];
  reference_probabilities<kMask>(s, sk, sv, sq_row, mask, i0, n0, c, softmax, alpha);
  float sigma[2];
  uint32_t p8[2][4];
  pack_fp8_a_row_scaled(s, sigma, p8);
  accumulate_fp8_k64<D>(acc, p8, stage + S::kVt, sigma, alpha);
}

template <int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(const __grid_constant__ FwdArgs a) {
  using S = FwdSmem<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  RefItem<D> it;
  if (!it.take(a)) return;
  const uint32_t base = ptx::smem_addr(smem);
  auto load_key_tile = [&](int n) {
    const int n0 = n * kTileTokens, valid = min(kTileTokens, it.dt.len - n0);
    const uint32_t st = base + S::stage(n & 1);
    load_fp8_rows<D>(st + S::kK, it.k_src + n0 * it.kv_row, it.kv_row, valid);
    load_fp8_cols<D>(st + S::kVt, it.vt_src + n0, a.tpad, valid);
    if (threadIdx.x < kTileTokens) load_scalar(st + S::kSk, it.sk_src + n0, valid, threadIdx.x);
    else load_scalar(st + S::kSv, it.sv_src + n0, valid, threadIdx.x - kTileTokens);
  };

  load_fp8_rows<D>(base + S::kQ, it.q_src(a), it.q_row, min(kTileTokens, it.dt.len - it.m0));
  ptx::cp_async_commit();
  load_key_tile(0);
  ptx::cp_async_commit();

  const int i0 = it.row0();
  float sq_row[2];
  it.load_sq_rows(a, i0, sq_row);

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  OnlineSoftmax softmax;

  for (int n = 0; n < it.num_key_tiles; ++n) {
    if (n + 1 < it.num_key_tiles) load_key_tile(n + 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // Q and key tile n landed (this thread's copies)
    const int n0 = n * kTileTokens;
    clear_cols_tail<D>(smem + S::stage(n & 1) + S::kVt, it.dt.len - n0);
    __syncthreads();
    const uint32_t st = base + S::stage(n & 1);
    const uint8_t* st_ptr = smem + S::stage(n & 1);
    if (mask_needed_for_query_rows(it.mask, it.dt.tile, n, kTileTokens))
      forward_key_tile<D, true>(base + S::kQ, st, st_ptr, sq_row, it.mask, i0, n0, a.c, softmax, acc);
    else
      forward_key_tile<D, false>(base + S::kQ, st, st_ptr, sq_row, it.mask, i0, n0, a.c, softmax, acc);
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }
  it.store(a, i0, acc, softmax.l, softmax.mc);
}

template <int D>
cudaError_t launch_forward(const FwdArgs& a, int64_t slots, cudaStream_t stream) {
  constexpr int kSmem = FwdSmem<D>::kBytes;
  const cudaError_t attr = FLAMIA_ALLOW_DYNAMIC_SMEM(forward_kernel<D>, kSmem);
  if (attr != cudaSuccess) return attr;
  forward_kernel<D><<<unsigned(slots * a.hq), kThreads, kSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// The default forward is the warp-specialized TMA kernel (kernels/forward_fast.cu): it
// computes S with the backward's instruction sequence (chained m64nNk32 wgmma, whose bits do
// not depend on N: docs/NUMERICS.md §6), which training needs (§5). For comparison,
// FLAMIA_FORWARD_KERNEL=wgmma_chained selects forward_wgmma.cu's chained kernel (same S,
// 64-key tiles), =mma_sync this file's kernel (S exact in FP32; not consistent with the
// backward at very large logits), =wgmma the wgmma kernel with every k-step promoted to
// FP32 (likewise).
cudaError_t forward_wgmma(const Params& p, const void* qkv8, void* out, float* lse, bool promote);
cudaError_t forward_fast(const Params& p, void* qkv8, void* out, float* lse);

namespace {
enum class Kernel { kMmaSync, kWgmma, kWgmmaChained, kFast };
Kernel selected_kernel() {
  static const Kernel kernel = [] {
    const char* v = std::getenv("FLAMIA_FORWARD_KERNEL");
    if (v != nullptr && std::strcmp(v, "mma_sync") == 0) return Kernel::kMmaSync;
    if (v != nullptr && std::strcmp(v, "wgmma") == 0) return Kernel::kWgmma;
    if (v != nullptr && std::strcmp(v, "wgmma_chained") == 0) return Kernel::kWgmmaChained;
    return Kernel::kFast;
  }();
  return kernel;
}
}  // namespace

int forward_block_n() {
  return selected_kernel() == Kernel::kFast ? tiles::kFwdBlockN : tiles::kRefFwdBlockN;
}

bool forward_is_wgmma() { return selected_kernel() != Kernel::kMmaSync; }

bool forward_p_scale_from_keys() { return selected_kernel() == Kernel::kFast; }

cudaError_t forward(const Params& p, void* qkv8, void* out, float* lse) {
  const Kernel kernel = selected_kernel();
  if (kernel == Kernel::kFast) return forward_fast(p, qkv8, out, lse);
  if (kernel != Kernel::kMmaSync) return forward_wgmma(p, qkv8, out, lse, kernel == Kernel::kWgmma);
  if (p.total_tokens == 0) return cudaSuccess;
  int64_t slots = 0;
  const FwdArgs a = make_fwd_args(p, qkv8, out, lse, &slots);
  if (p.head_dim == 64) return launch_forward<64>(a, slots, p.stream);
  if (p.head_dim == 128) return launch_forward<128>(a, slots, p.stream);
  return cudaErrorInvalidValue;
}

}  // namespace sm90
}  // namespace flamia
