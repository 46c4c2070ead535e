// fp8_mixed's BF16 B operands (q for dK, dO for dV, k for dQ) are the caller's tensors in
// their natural layout: a stage holds 64 token rows of one head as TMA lands them (one box
// a tile, each 64-element block of d a 128-byte-swizzled [64 tokens][128 bytes]), and the products
// read them MN-major (mma::desc_natural). Rows past the document are the next document's
// tokens (or TMA's zeros past the tensor); they meet only masked pairs, exact zeros by
// selection, so a finite row adds 0 to every product. A row that is not finite would add
// 0 * Inf = NaN there — a future token reaching an earlier one, a document reaching the next —
// so when the quantizer flagged such rows (layout.cuh, `nonfinite`), each stage's rows whose
// token scale is NaN (the scale of a non-finite row) are zeroed before a product reads them.
// That gives the specification's products: its BF16 operands have non-finite values zeroed,
// and every visible pair of such a row is NaN through the row's scale either way
// (docs/ALGORITHM.md §3).
#pragma once

#include <cstdint>

#include "flamia/formats.h"
#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

constexpr int kNaturalRowsBarrier = warpgroup::kFirstNamedBarrier + 2;  // past the stored dS's two

// Tokens [tok, tok + 64) of `head` into the natural tile at dst, counted on bar: one box of
// {128 bytes, 64 tokens, 1 head, D / 64 blocks of d}, whose blocks land kNaturalBlockBytes apart.
template <int D>
__device__ __forceinline__ void load_natural_rows(uint32_t dst, const CUtensorMap& map, uint32_t bar, int head,
                                                  int tok) {
  tma::load_4d(dst, map, bar, 0, tok, head, 0);
}

// The B tile of a product over tokens for tokens [tok, tok + 64) of `head`: fp8_mixed's
// natural BF16 rows, or fp8's transposed FP8 columns at padded position pos.
template <int D, bool kMixed>
__device__ __forceinline__ void load_token_b_tile(uint32_t dst, const CUtensorMap& map, uint32_t bar, int head,
                                                  int tok, int pos) {
  if constexpr (kMixed) load_natural_rows<D>(dst, map, bar, head, tok);
  else tma::load_2d(dst, map, bar, pos, head * D);
}

// Whether the quantizer flagged a non-finite row (flag null: the recipe has no natural rows).
__device__ __forceinline__ bool rows_flagged(const uint32_t* flag) { return flag != nullptr && __ldg(flag) != 0u; }

// Thread t of `threads` zeroes its share of the rows of the natural tile at `tile` (token
// tok0 + r in row r) whose scale (scales: the head's [T] run) is NaN. Rows at or past T are
// TMA's zeros already. Not inlined: the path is rare, and inlined its registers would stay
// reserved in every step of the kernels' loops.
template <int D>
__device__ __noinline__ void zero_nonfinite_rows(uint8_t* tile, const float* scales, int64_t tok0,
                                                    int64_t total_tokens, int t, int threads) {
  constexpr int kChunksPerRow = mma::kNaturalRowBytes / 16;
  constexpr int kChunks = (D / 64) * mma::kNaturalRows * kChunksPerRow;
  for (int c = t; c < kChunks; c += threads) {
    const int row = (c / kChunksPerRow) % mma::kNaturalRows, block = c / (kChunksPerRow * mma::kNaturalRows);
    const int64_t tok = tok0 + row;
    if (tok < total_tokens && fmt::is_nan_f32(__ldg(scales + tok)))
      *reinterpret_cast<uint4*>(tile + block * mma::kNaturalBlockBytes + row * mma::kNaturalRowBytes +
                                16 * (c % kChunksPerRow)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// After every thread's zero_nonfinite_rows: the stores, visible to every warpgroup's wgmma.
__device__ __forceinline__ void natural_rows_ready(int threads) {
  wgmma::fence_proxy_async();
  warpgroup::bar_sync(kNaturalRowsBarrier, threads);
}

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
