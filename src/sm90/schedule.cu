// Device-side construction of the longest-first work list (see schedule.cuh).
#include "sm90/schedule.cuh"

namespace flamia {
namespace sm90 {
namespace {

constexpr int kThreads = 1024;

// data[k] <- sum_{k' > k} data[k'] for k in [0, n) (exclusive scan from the top).
// Returns the sum of all n inputs. Called by every thread of the block.
__device__ int reverse_exclusive_scan(int* data, int n) {
  __shared__ int warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int carry = 0;
  for (int base = 0; base < n; base += kThreads) {
    const int k = n - 1 - (base + int(threadIdx.x));
    const int v = k >= 0 ? data[k] : 0;
    int x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int s = warp_sums[lane];
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, s, off);
        if (lane >= off) s += y;
      }
      warp_sums[lane] = s;
    }
    __syncthreads();
    const int inclusive = x + (warp > 0 ? warp_sums[warp - 1] : 0);
    if (k >= 0) data[k] = carry + inclusive - v;
    carry += warp_sums[kThreads / 32 - 1];
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
  return carry;
}

__device__ __forceinline__ int tiles_of(const int32_t* cu, int b) {
  return (cu[b + 1] - cu[b] + quant::kTile - 1) / quant::kTile;
}

// Counting sort of all (document, tile) items by decreasing key (schedule.cuh).
// docs_per_tiles[n] = number of documents with n tiles; start[k] = first slot of key k;
// cursor[k] = slots of key k handed out so far. Slot order within a key is arbitrary,
// which changes only the launch order, never a result.
__global__ void __launch_bounds__(kThreads)
build_work_list_kernel(const int32_t* __restrict__ cu, int num_docs, int nt_cap, bool causal,
                       int* __restrict__ count, int2* __restrict__ items,
                       int* __restrict__ scratch) {
  int* docs_per_tiles = scratch;
  int* start = scratch + (nt_cap + 1);
  int* cursor = scratch + 2 * (nt_cap + 1);
  for (int k = threadIdx.x; k <= nt_cap; k += kThreads) {
    docs_per_tiles[k] = 0;
    cursor[k] = 0;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < num_docs; b += kThreads) {
    const int nt = tiles_of(cu, b);
    if (nt > 0) atomicAdd(&docs_per_tiles[nt], 1);
  }
  __syncthreads();
  // Items per key k (k in [0, nt_cap)):
  //   causal:     #{b : nt_b > k}       (suffix sum of docs_per_tiles)
  //   non-causal: (k + 1) * docs_per_tiles[k + 1]
  if (causal) {
    for (int k = threadIdx.x; k <= nt_cap; k += kThreads) start[k] = docs_per_tiles[k];
    __syncthreads();
    reverse_exclusive_scan(start, nt_cap + 1);
  } else {
    for (int k = threadIdx.x; k <= nt_cap; k += kThreads)
      start[k] = k < nt_cap ? (k + 1) * docs_per_tiles[k + 1] : 0;
  }
  __syncthreads();
  const int total = reverse_exclusive_scan(start, nt_cap + 1);
  if (threadIdx.x == 0) *count = total;
  __syncthreads();
  for (int b = threadIdx.x; b < num_docs; b += kThreads) {
    const int nt = tiles_of(cu, b);
    if (nt == 0) continue;
    if (causal) {
      for (int t = 0; t < nt; ++t) items[start[t] + atomicAdd(&cursor[t], 1)] = make_int2(b, t);
    } else {
      const int first = start[nt - 1] + atomicAdd(&cursor[nt - 1], nt);
      for (int t = 0; t < nt; ++t) items[first + t] = make_int2(b, t);
    }
  }
}

}  // namespace

cudaError_t build_work_list(const int32_t* cu_seqlens, int num_docs, bool causal,
                           uint8_t* qkv8, const quant::Qkv8Layout& layout,
                           cudaStream_t stream) {
  build_work_list_kernel<<<1, kThreads, 0, stream>>>(
      cu_seqlens, num_docs, int(layout.nt_cap), causal,
      reinterpret_cast<int*>(qkv8 + layout.sched_count),
      reinterpret_cast<int2*>(qkv8 + layout.sched_items),
      reinterpret_cast<int*>(qkv8 + layout.sched_scratch));
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flamia
