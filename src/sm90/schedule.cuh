// Longest-first work list over the 64-token tiles of a packed batch.
//
// One item = (document b, tile t). Items are sorted by decreasing cost so that the most
// expensive CTAs start first and the cheap ones fill the tail of the grid:
//   causal:     cost(b, t) = t + 1  (key tiles a query tile visits) -> sort key t;
//   non-causal: cost(b, t) = nt_b   (every tile visits the whole document) -> key nt_b - 1.
// The list is built on the device from cu_seqlens (no host synchronisation) by block 0 of
// the quantizer's launch (quantize/work_list.cuh) and stored in the qkv8 buffer next to the
// operands it schedules.
//
// Kernels launch one CTA per (item slot, head) with the head index fastest, so that the
// query heads sharing a kv head run side by side (K/V reuse in L2); slots past the real item
// count exit at once. The backward's dK/dV kernel reads item (b, t) as key tile
// nt_b - 1 - t when causal: that key tile is seen by t + 1 query tiles, the same cost order.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "quantize/layout.cuh"

namespace flamia {
namespace sm90 {

struct WorkList {
  const int* count;  // number of valid items
  const int2* items; // (document, tile), costliest first
};

// A tile of one document, positions relative to the document start.
struct DocTile {
  int64_t tok0;    // packed index of the document's first token
  int64_t pstart;  // padded start of the document in the transposed copies
  int len;         // document length
  int num_tiles;   // ceil(len / 64)
  int tile;        // tile index inside the document
};

__device__ __forceinline__ DocTile doc_tile(const int32_t* cu_seqlens, int2 item, int tile = quant::kTile) {
  DocTile d;
  const int b = item.x;
  d.tok0 = cu_seqlens[b];
  d.len = cu_seqlens[b + 1] - cu_seqlens[b];
  d.pstart = quant::padded_doc_start(d.tok0, b);
  d.num_tiles = (d.len + tile - 1) / tile;
  d.tile = item.y;
  return d;
}

inline WorkList work_list(const uint8_t* qkv8, const quant::WorkListRegions& regions) {
  return {reinterpret_cast<const int*>(qkv8 + regions.count),
          reinterpret_cast<const int2*>(qkv8 + regions.items)};
}

}  // namespace sm90
}  // namespace flamia
