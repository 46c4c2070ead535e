// Shared-memory operand tiles and their cp.async loaders (one warpgroup of 128 threads each).
//
// Every tile covers 64 tokens of one document and one head. Rows are padded by 16 bytes:
// the eight 16-byte rows one ldmatrix phase reads then start in distinct 4-bank groups
// (row strides of 80, 144 and 272 bytes are 4 banks apart modulo 32). Tokens outside the
// document are zero in shared memory — cp.async zero-fill for whole rows / 16-token groups,
// and an explicit clear of the partial last group of a transposed tile — so that a NaN of a
// neighbouring document can never enter this one through 0 * NaN in an MMA.
#pragma once

#include <cstdint>

#include "quantize/layout.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {

constexpr int kThreads = 128;  // 4 warps x 16 rows of a 64-row tile
constexpr int kTileTokens = 64;
constexpr int kRowPad = 16;

// The loaders below are run by one warpgroup (128 threads): this thread's index in it. A CTA
// of several warpgroups gives each tile to one of them.
__device__ __forceinline__ int tile_tid() { return int(threadIdx.x) & (kThreads - 1); }

// [64 tokens][D] FP8, D contiguous (natural layout; operand of the D-reducing matmuls).
template <int D>
struct Fp8RowTile {
  static constexpr int kStride = D + kRowPad;
  static constexpr int kBytes = kTileTokens * kStride;
};
// [D][64 token positions] FP8, tokens contiguous in fragment order (transposed copies).
template <int D>
struct Fp8ColTile {
  static constexpr int kStride = kTileTokens + kRowPad;
  static constexpr int kBytes = D * kStride;
};
// 64 per-token FP32 values (scales, LSE, D).
constexpr int kScalarTileBytes = kTileTokens * 4;

// Rows [0, valid) from src (row r at src + r * row_stride bytes); rows >= valid are zeros.
// valid >= 1 (a tile is only loaded when it holds a token of the document).
template <int D>
__device__ __forceinline__ void load_fp8_rows(uint32_t dst, const uint8_t* src, int64_t row_stride,
                                              int valid) {
  constexpr int kChunks = D / 16, kRowsPerPass = kThreads / kChunks;
  const int r0 = tile_tid() / kChunks, c = tile_tid() % kChunks;
  dst += r0 * Fp8RowTile<D>::kStride + 16 * c;
  src += 16 * c;
#pragma unroll
  for (int k = 0; k < kTileTokens / kRowsPerPass; ++k) {
    const int r = r0 + k * kRowsPerPass;
    // Skipped rows read nothing; their address is clamped to a valid row of the tile.
    ptx::cp_async_16(dst + k * kRowsPerPass * Fp8RowTile<D>::kStride, src + min(r, valid - 1) * row_stride,
                     r < valid);
  }
}

// The same rows into a wgmma::KMajorTile<64, D> (the operands of S, scores_wgmma.cuh):
// rows >= valid are zero. Eight consecutive threads copy chunk c of eight consecutive rows
// = one core matrix (128 contiguous bytes).
template <int D>
__device__ __forceinline__ void load_kmajor_rows(uint32_t dst, const uint8_t* src, int64_t row_stride,
                                                 int valid) {
  using Tile = wgmma::KMajorTile<kTileTokens, D>;
  constexpr int kChunks = D / 16;
#pragma unroll
  for (int k = 0; k < kTileTokens * kChunks / kThreads; ++k) {
    const int idx = tile_tid() + k * kThreads;
    const int c = (idx >> 3) % kChunks, r = (idx & 7) + 8 * (idx / (8 * kChunks));
    // Skipped rows read nothing; their address is clamped to a valid row of the tile.
    ptx::cp_async_16(dst + Tile::chunk_offset(r, c), src + min(r, valid - 1) * row_stride + 16 * c, r < valid);
  }
}

// Transposed tile: D rows of 64 positions starting at src (= position 0 of row d = 0),
// rows tpad bytes apart. 16-token groups that start at or past `valid` are zeros.
template <int D>
__device__ __forceinline__ void load_fp8_cols(uint32_t dst, const uint8_t* src, int64_t tpad, int valid) {
  constexpr int kRowsPerPass = kThreads / 4;
  const int d0 = tile_tid() >> 2, c = tile_tid() & 3;
  const bool ok = 16 * c < valid;
  dst += d0 * Fp8ColTile<D>::kStride + 16 * c;
  src += d0 * tpad + 16 * min(c, (valid - 1) >> 4);  // skipped groups: an in-document address
#pragma unroll
  for (int k = 0; k < D / kRowsPerPass; ++k)
    ptx::cp_async_16(dst + k * kRowsPerPass * Fp8ColTile<D>::kStride, src + k * kRowsPerPass * tpad, ok);
}

// [D][64 token positions] FP8 in wgmma's K-major core-matrix layout: the B operand of the
// matmuls reduced over tokens (P·V, Pᵀ·dO, dSᵀ·Q, dS·K), from the transposed copies.
template <int D>
using ColTile = wgmma::KMajorTile<D, kTileTokens>;
// Transposed tile: D rows of 64 positions (row d at src + d * tpad) into a ColTile<D>;
// 16-token groups that start at or past `valid` are zeros. Thread t always copies chunk
// (t / 8) % 4 of its rows, which clear_kmajor_cols_tail relies on.
template <int D>
__device__ __forceinline__ void load_kmajor_cols(uint32_t dst, const uint8_t* src, int64_t tpad, int valid) {
#pragma unroll
  for (int k = 0; k < D * 4 / kThreads; ++k) {
    const int idx = tile_tid() + k * kThreads;
    const int c = (idx >> 3) & 3, d = (idx & 7) + 8 * (idx >> 5);
    const bool ok = 16 * c < valid;
    ptx::cp_async_16(dst + ColTile<D>::chunk_offset(d, c), src + d * tpad + (ok ? 16 * c : 0), ok);
  }
}

// Byte masks over one fragment-ordered 16-token group (4 words) keeping tokens < keep.
__device__ __forceinline__ void tail_group_mask(int keep, uint32_t (&mask)[4]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    mask[w] = 0;
#pragma unroll
    for (int bb = 0; bb < 4; ++bb)
      if (quant::fragment_order_token(4 * w + bb) < keep) mask[w] |= 0xffu << (8 * bb);
  }
}

// After this thread's copies of load_fp8_cols landed (cp_async_wait) and before the CTA
// barrier: zero the positions of tokens >= valid in the partial 16-token group. The same
// thread -> chunk mapping as load_fp8_cols, so each thread only touches bytes it copied.
template <int D>
__device__ __forceinline__ void clear_cols_tail(uint8_t* tile, int valid) {
  const int group = valid >> 4, keep = valid & 15;
  if (valid >= kTileTokens || keep == 0 || (tile_tid() & 3) != group) return;
  uint32_t mask[4];
  tail_group_mask(keep, mask);
#pragma unroll
  for (int k = 0; k < D * 4 / kThreads; ++k) {
    const int d = (tile_tid() >> 2) + k * (kThreads / 4);
    uint4* p = reinterpret_cast<uint4*>(tile + d * Fp8ColTile<D>::kStride + 16 * group);
    uint4 v = *p;
    v.x &= mask[0]; v.y &= mask[1]; v.z &= mask[2]; v.w &= mask[3];
    *p = v;
  }
}

// After this thread's load_kmajor_cols copies landed: zero the positions of tokens >= valid
// in the partial 16-token group (the padding bytes of the transposed copies are not read as
// zero). Each thread touches only the chunks it copied itself.
template <int D>
__device__ __forceinline__ void clear_kmajor_cols_tail(uint8_t* tile, int valid) {
  const int group = valid >> 4, keep = valid & 15;
  if (valid >= kTileTokens || keep == 0 || ((tile_tid() >> 3) & 3) != group) return;
  uint32_t mask[4];
  tail_group_mask(keep, mask);
#pragma unroll
  for (int k = 0; k < D * 4 / kThreads; ++k) {
    const int idx = tile_tid() + k * kThreads;
    const int d = (idx & 7) + 8 * (idx >> 5);
    uint4* p = reinterpret_cast<uint4*>(tile + ColTile<D>::chunk_offset(d, group));
    uint4 v = *p;
    v.x &= mask[0]; v.y &= mask[1]; v.z &= mask[2]; v.w &= mask[3];
    *p = v;
  }
}

// One FP32 per token for tokens [0, 64): thread i (0..63) of the caller copies element i.
__device__ __forceinline__ void load_scalar(uint32_t dst, const float* src, int valid, int i) {
  const bool ok = i < valid;
  ptx::cp_async_4(dst + 4 * i, ok ? src + i : src, ok);
}

}  // namespace sm90
}  // namespace flamia
