// Attention masks in document-local positions (ALGORITHM.md §2-3): query i sees key j iff
// both lie inside the document and, when causal, j <= i. Tiles start at the document
// start, so a tile pair needs per-element masking only on the causal diagonal or where a
// tile runs past the document end.
#pragma once

namespace flamia {
namespace sm90 {

struct DocMask {
  int len;
  bool causal;
  __device__ __forceinline__ bool visible(int i, int j) const {
    return i < len && j < len && (!causal || j <= i);
  }
  // What a row sees of a tile is a run of its columns, so a masked tile needs one compare per
  // element against a per-row bound instead of the three of visible() and its index sums.
  // Query i sees key n0 + col (col >= 0) iff col < visible_keys(i, n0).
  __device__ __forceinline__ int visible_keys(int i, int n0) const {
    return i < len ? (causal ? i + 1 : len) - n0 : 0;
  }
  // The same for the two rows i0, i0 + 8 of an accumulator lane whose columns start at 2 q:
  // its element [n][e] is visible iff 8 n + (e & 1) < seen[e >> 1], a compare with a constant.
  __device__ __forceinline__ void visible_keys_of_lane(int i0, int n0, int q, int (&seen)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) seen[r] = visible_keys(i0 + 8 * r, n0) - 2 * q;
  }
  // Key j sees query m0 + col (col >= 0) iff lo <= col < hi.
  struct Run {
    int lo, hi;
  };
  __device__ __forceinline__ Run visible_queries(int j, int m0) const {
    return {causal ? j - m0 : 0, j < len ? len - m0 : 0};
  }
};

// Query tile m against key tile n, when rows are queries and the row-wise reductions run
// over keys (forward, dQ): key columns past the document must be masked; query rows past
// it are never stored.
__device__ __forceinline__ bool mask_needed_for_query_rows(const DocMask& mask, int m, int n, int tile) {
  return (mask.causal && m == n) || (n + 1) * tile > mask.len;
}

// The same for query rows from m0 (a multiple of 64) against the key tile from n0, where the
// two tiles differ in length (the fast forward's 64-row warpgroups, 128-key tiles): a key
// after the rows' first must be masked when causal.
__device__ __forceinline__ bool mask_needed_for_rows(const DocMask& mask, int m0, int n0, int tile) {
  return (mask.causal && n0 + tile - 1 > m0) || n0 + tile > mask.len;
}

// Key tile n against query tile m, when rows are keys and reductions run over queries
// (dK/dV): query columns past the document must be masked.
__device__ __forceinline__ bool mask_needed_for_key_rows(const DocMask& mask, int m, int n, int tile) {
  return (mask.causal && m == n) || (m + 1) * tile > mask.len;
}

}  // namespace sm90
}  // namespace flamia
