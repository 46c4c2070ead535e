// Tensor-memory-accelerator loads (cp.async.bulk.tensor, sm_90): a box of a global tensor,
// described by a CUtensorMap kernel parameter, lands in shared memory in the layout (and
// swizzle) the map declares and signals an mbarrier with its byte count. Elements outside
// the tensor are filled with zeros. PTX ISA "cp.async.bulk.tensor"; the maps are encoded on
// the host (launch/tensor_map.cu). load_bulk copies a plain block the same way.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace flamia {
namespace sm90 {
namespace tma {

__device__ __forceinline__ uint64_t map_address(const CUtensorMap& map) {
  return reinterpret_cast<uint64_t>(&map);
}

// Hints the descriptor into the cache before its first use.
__device__ __forceinline__ void prefetch_map(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_address(map)) : "memory");
}

// Coordinates are element indices, innermost dimension first.
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map_address(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void load_3d(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1,
                                        int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1,
                                        int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// The box at coordinates {c0, c1, c2, c3} of map from shared memory at src (the layout a
// load of that box lands), in the issuing thread's bulk groups (commit_bulk, wait_bulk_read
// below); parts of the box outside the tensor are not written. PTX ISA
// "cp.async.bulk.tensor".
__device__ __forceinline__ void store_4d(uint32_t src, const CUtensorMap& map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   map_address(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// The L2 cache policy of a copy whose bytes are used once (PTX ISA "createpolicy"): a line
// it brings into the L2 (or writes there) is the first one replaced, so that a stream of
// gigabytes leaves the L2 to the tiles other CTAs reuse. The bulk copies below take it.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// A contiguous block of global memory (no tensor map) into shared memory under an L2 cache
// policy, signalling bar with its byte count: bytes a multiple of 16, both addresses 16-byte
// aligned. PTX ISA "cp.async.bulk".
__device__ __forceinline__ void load_bulk(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// A contiguous block of shared memory to global memory under an L2 cache policy, in the
// issuing thread's bulk groups: commit_bulk closes a group, wait_bulk_read<N> waits until at most N of its groups still
// read shared memory (their sources may then be written again), wait_bulk<N> until at most N
// have not completed their writes. bytes a multiple of 16, both addresses 16-byte aligned;
// shared-memory writes of other threads reach the copy only through fence.proxy.async and a
// barrier. PTX ISA "cp.async.bulk", "cp.async.bulk.wait_group".
__device__ __forceinline__ void store_bulk(void* dst, uint32_t src, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n" ::"l"(dst), "r"(src),
               "r"(bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void commit_bulk() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_bulk_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void wait_bulk() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace tma
}  // namespace sm90
}  // namespace flamia
