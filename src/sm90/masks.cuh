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
};

// Query tile m against key tile n, when rows are queries and the row-wise reductions run
// over keys (forward, dQ): key columns past the document must be masked; query rows past
// it are never stored.
__device__ __forceinline__ bool mask_needed_for_query_rows(const DocMask& mask, int m, int n, int tile) {
  return (mask.causal && m == n) || (n + 1) * tile > mask.len;
}

// Key tile n against query tile m, when rows are keys and reductions run over queries
// (dK/dV): query columns past the document must be masked.
__device__ __forceinline__ bool mask_needed_for_key_rows(const DocMask& mask, int m, int n, int tile) {
  return (mask.causal && m == n) || (m + 1) * tile > mask.len;
}

}  // namespace sm90
}  // namespace flamia
