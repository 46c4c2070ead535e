// Accumulator rows out to a caller's natural BF16 [T, H, D] tensor, used by the forward's O and
// the backward's dQ, dK, dV epilogues: a warpgroup's 64 rows by one TMA store, or (a document's
// last, partial tile) a warp's 16 rows by plain stores.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "sm90/arch/tma.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/fragments.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flamia {
namespace sm90 {

// The warpgroup writes its 64 rows of the m64nD accumulator (lane (g, q) of warp w: rows
// 16 w + g + 8 r, columns 8 n + 2 q + {0, 1}), each row r times scale[r] and rounded to bf16,
// into `tile` (shared memory, 1024-byte aligned) as the natural map's box lays them out
// (D / 64 blocks of [64 rows][128 bytes], 128-byte swizzle: 16-byte chunk c of row r at chunk
// c ^ (r & 7), so that a warp's 32 four-byte writes hit 32 banks), and its first thread
// stores the box at rows [tok, tok + 64) of `head`. The caller stores only boxes whose 64 rows
// are all its own (a document's last, partial tile goes row by row). Sixty-four 4-byte
// global stores a thread had the load-store unit throttling the epilogue (docs/PERFORMANCE.md
// v67). The tile may still be read by this thread's previous store from it: waited for first;
// before the CTA exits its first thread waits once more (rows_out_drain). `barrier`: a named
// barrier of the warpgroup's own.
template <int D>
__device__ __forceinline__ void store_rows_tma(uint32_t tile, const CUtensorMap& map, int head, int tok,
                                               const float (&acc)[D / 8][4], const float (&scale)[2], int barrier) {
  const bool first = (threadIdx.x % warpgroup::kThreads) == 0;
  if (first) tma::wait_bulk_read<0>();
  warpgroup::bar_sync(barrier, warpgroup::kThreads);
  const int g = lane_id() >> 2, q = lane_id() & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * (warp_id() & 3) + g + 8 * r;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t at = tile + (n / 8) * mma::kNaturalBlockBytes + row * mma::kNaturalRowBytes +
                          (((n % 8) ^ (row & 7)) << 4) + 4 * q;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                   "r"(ptx::pack_bf16x2(__fmul_rn(scale[r], acc[n][2 * r]), __fmul_rn(scale[r], acc[n][2 * r + 1])))
                   : "memory");
    }
  }
  wgmma::fence_proxy_async();
  warpgroup::bar_sync(barrier, warpgroup::kThreads);
  if (first) {
    tma::store_4d(tile, map, 0, tok, head, 0);
    tma::commit_bulk();
  }
}

// A warp's rows [row_base, row_base + 16) of the m64nD accumulator (its 16 of the warpgroup's
// 64), row r of the lane times scale[r], to out + row * row_stride as bf16, for rows < len.
template <int D>
__device__ __forceinline__ void store_rows_bf16(uint16_t* out, int64_t row_stride, const float (&acc)[D / 8][4],
                                                const float (&scale)[2], int row_base, int len) {
  const int g = lane_id() >> 2, q = lane_id() & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + g + 8 * r;
    if (row >= len) continue;
    uint16_t* o = out + row * row_stride + 2 * q;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(o + 8 * n) =
          ptx::pack_bf16x2(__fmul_rn(scale[r], acc[n][2 * r]), __fmul_rn(scale[r], acc[n][2 * r + 1]));
  }
}

// A warpgroup's rows [m0, m0 + 64) of a document (tok0: its first token, len: its length) out
// to the tensor whose head column starts at `out` (token 0; rows row_stride apart): by TMA
// through `tile` when by_tma and all 64 rows are the document's, else (TMA off, or the
// document's last, partial tile, where a box would write the next document's rows) row by row.
template <int D>
__device__ __forceinline__ void store_rows(bool by_tma, uint32_t tile, const CUtensorMap& map, uint16_t* out,
                                           int64_t row_stride, int head, int64_t tok0, int m0, int len,
                                           const float (&acc)[D / 8][4], const float (&scale)[2], int barrier) {
  if (by_tma && m0 + 64 <= len)
    store_rows_tma<D>(tile, map, head, int(tok0) + m0, acc, scale, barrier);
  else
    store_rows_bf16<D>(out + tok0 * row_stride, row_stride, acc, scale, m0 + 16 * (warp_id() & 3), len);
}

// Before the CTA's shared memory goes: its last store has read the tile (nothing to wait for
// when no row left by TMA).
__device__ __forceinline__ void rows_out_drain() {
  if ((threadIdx.x % warpgroup::kThreads) == 0) tma::wait_bulk_read<0>();
}

}  // namespace sm90
}  // namespace flamia
