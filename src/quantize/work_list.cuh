// The longest-first work list of sm90/schedule.cuh, built by one block of the quantizer's
// grid: it then runs beside the quantization instead of as a launch of its own.
//
// Same contents as schedule.cuh specifies: items (document b, tile t) sorted by decreasing
// key (causal: t; non-causal: nt_b - 1), count = number of items. Within a key the slot
// order is free; here it comes from one atomic rank per document (not per item), and the
// items are written by all lanes in parallel, so no thread walks a long document's tiles
// one global round trip at a time.
#pragma once

#include <cstdint>

#include "quantize/layout.cuh"

namespace flamia {
namespace quant {

struct WorkListOut {
  int* count = nullptr;    // null: no list to build
  int2* items = nullptr;
  int* scratch = nullptr;  // 3 (nt_cap + 1) ints (WorkListRegions::scratch)
  int nt_cap = 0;
  int tile = kTile;        // tokens per tile
  int64_t capacity = 0;    // entries of items (WorkListRegions::capacity)
  bool causal = false;
};

inline WorkListOut work_list_out(uint8_t* qkv8, const WorkListRegions& r, bool causal) {
  WorkListOut w;
  w.count = reinterpret_cast<int*>(qkv8 + r.count);
  w.items = reinterpret_cast<int2*>(qkv8 + r.items);
  w.scratch = reinterpret_cast<int*>(qkv8 + r.scratch);
  w.nt_cap = int(r.nt_cap);
  w.tile = r.tile;
  w.capacity = r.capacity;
  w.causal = causal;
  return w;
}

// Tiles of document b. cu_seqlens was validated by guard_block before the list is built;
// the clamp to [0, nt_cap] keeps every scratch index in bounds regardless.
__device__ __forceinline__ int doc_tiles(const int32_t* cu, int b, const WorkListOut& out) {
  const int64_t len = int64_t(cu[b + 1]) - cu[b];
  return int(min(max((len + out.tile - 1) / out.tile, int64_t(0)), int64_t(out.nt_cap)));
}

// data[k] <- sum_{k' > k} data[k'] for k in [0, n); returns the sum of all n inputs. Called
// by every thread of the block, after a barrier that completes data. Each thread owns one
// contiguous run (from the top), so every entry is read twice and written once.
template <int kThreads>
__device__ int reverse_exclusive_scan(int* data, int n, int (&warp_sums)[kThreads / 32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per = (n + kThreads - 1) / kThreads;
  const int u0 = min(int(threadIdx.x) * per, n), u1 = min(u0 + per, n);  // u = n - 1 - k
  int sum = 0;
  for (int u = u0; u < u1; ++u) sum += data[n - 1 - u];
  int x = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int run = x - sum, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) run += warp_sums[w];
    total += warp_sums[w];
  }
  for (int u = u0; u < u1; ++u) {
    const int v = data[n - 1 - u];
    data[n - 1 - u] = run;
    run += v;
  }
  __syncthreads();  // data complete; warp_sums free again
  return total;
}

// Returns false when the items would not fit (impossible for a validated cu_seqlens): the
// caller then records a fault; no entry past the capacity is written either way.
template <int kThreads>
__device__ bool build_work_list_block(const int32_t* cu, int num_docs, const WorkListOut& out) {
  __shared__ int warp_sums[kThreads / 32];
  const int n = out.nt_cap + 1;
  int* docs_per_tiles = out.scratch;  // [k]: documents with k tiles
  int* start = out.scratch + n;       // [k]: first slot of key k
  int* cursor = out.scratch + 2 * n;  // [k]: next rank handed to a document with k tiles
  for (int k = threadIdx.x; k < n; k += kThreads) docs_per_tiles[k] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < num_docs; b += kThreads) {
    const int nt = doc_tiles(cu, b, out);
    if (nt > 0) atomicAdd(&docs_per_tiles[nt], 1);
  }
  __syncthreads();
  int total;
  if (out.causal) {
    // Key t holds one item per document with more than t tiles. Ranking documents by
    // decreasing tile count puts exactly those at ranks [0, #{nt_b > t}): a document's rank
    // is its slot offset under every key it appears in.
    for (int k = threadIdx.x; k < n; k += kThreads) start[k] = docs_per_tiles[k];
    __syncthreads();
    reverse_exclusive_scan<kThreads>(start, n, warp_sums);  // start[k] = #{b : nt_b > k}
    for (int k = threadIdx.x; k < n; k += kThreads) cursor[k] = start[k];
    __syncthreads();
    total = reverse_exclusive_scan<kThreads>(start, n, warp_sums);
  } else {
    // Key nt - 1 holds the nt consecutive items of each document with nt tiles.
    for (int k = threadIdx.x; k < n; k += kThreads) {
      start[k] = k < out.nt_cap ? (k + 1) * docs_per_tiles[k + 1] : 0;
      cursor[k] = 0;
    }
    __syncthreads();
    total = reverse_exclusive_scan<kThreads>(start, n, warp_sums);
  }
  const bool fits = total <= out.capacity;
  if (threadIdx.x == 0) *out.count = fits ? total : 0;
  if (!fits) return false;  // uniform: total is the same in every thread

  // A warp takes 32 documents, one per lane, and spreads their tiles over its lanes.
  const int lane = threadIdx.x & 31;
  for (int first = int(threadIdx.x) - lane; first < num_docs; first += kThreads) {
    const int b = first + lane;
    const int nt = b < num_docs ? doc_tiles(cu, b, out) : 0;
    const int rank = nt > 0 ? atomicAdd(&cursor[nt], 1) : 0;
    int incl = nt;  // inclusive prefix of the lanes' tile counts
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const int excl = incl - nt;
    const int tiles = __shfl_sync(0xffffffffu, incl, 31);
    for (int base = 0; base < tiles; base += 32) {
      const int i = base + lane;
      // Owner of item i: the last lane with excl <= i (it has tiles, as i < tiles).
      int owner = 0;
#pragma unroll
      for (int step = 16; step > 0; step >>= 1)
        if (__shfl_sync(0xffffffffu, excl, owner + step) <= i) owner += step;
      const int t = i - __shfl_sync(0xffffffffu, excl, owner);
      const int ont = __shfl_sync(0xffffffffu, nt, owner);
      const int orank = __shfl_sync(0xffffffffu, rank, owner);
      if (i < tiles) {
        const int slot = out.causal ? start[t] + orank : start[ont - 1] + orank * ont + t;
        out.items[slot] = make_int2(first + owner, t);
      }
    }
  }
  return true;
}

}  // namespace quant
}  // namespace flamia
