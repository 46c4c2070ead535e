// Longest-first work lists over the tiles of a packed batch (64-, 128- and 192-token tiles:
// quantize/layout.cuh says which kernels walk which).
//
// One item = (document b, tile t). Items are sorted by decreasing cost so that the most
// expensive CTAs start first and the cheap ones fill the tail of the grid:
//   causal:     cost(b, t) = t + 1  (key tiles a query tile visits) -> sort key t;
//   non-causal: cost(b, t) = nt_b   (every tile visits the whole document) -> key nt_b - 1.
// The list is built on the device from cu_seqlens (no host synchronisation) by block 0 of
// the quantizer's launch (quantize/work_list.cuh) and stored in the qkv8 buffer next to the
// operands it schedules.
//
// The reference forwards and the backward launch one CTA per (item slot, head), a GQA group's
// query heads side by side (K/V reuse in L2); the fast forward is persistent and takes items
// from a counter; the backward's in blocks of kv heads (common/work_order.h). Slots past the real item
// count (item_count) exit at once, and so does a CTA whose item has len == 0. After an
// invalid cu_seqlens the count is 0 (quantize/guard.h): every kernel that walks the list
// through item_count and doc_tile does no work, and a last kernel fills the outputs with NaN. The backward's dK/dV kernel reads item (b, t) of the 128-token list as key tile
// nt_b - 1 - t when causal: that key tile is seen by t + 1 query tiles, the same cost order.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "quantize/layout.cuh"

namespace flamia {
namespace sm90 {

struct WorkList {
  const int* count;   // number of valid items (0 after a guard fault, quantize/guard.h)
  const int2* items;  // (document, tile), costliest first
  int capacity;       // entries of items: a kernel never reads past it, whatever count says
  int tile;           // tokens per tile
  int num_docs;
  int64_t total_tokens;
};

// Number of items to walk, clamped to the list's capacity.
__device__ __forceinline__ int item_count(const WorkList& w) { return min(max(*w.count, 0), w.capacity); }

// A tile of one document, positions relative to the document start.
struct DocTile {
  int doc;         // document index b
  int64_t tok0;    // packed index of the document's first token
  int64_t pstart;  // padded start of the document in the transposed copies
  int len;         // document length; 0 only for a corrupt item, which a kernel skips
  int num_tiles;   // ceil(len / tile)
  int tile;        // tile index inside the document
};

// Item `slot` (< capacity) of the list. Everything is clamped to the tensors' extents, so
// that not even a corrupt list or cu_seqlens can address memory outside them:
// 0 <= b < B, 0 <= tok0 <= tok0 + len <= T, 0 <= tile < max(num_tiles, 1); the transposed
// range [pstart, pstart + roundup16(len)) then lies inside Tpad (layout.cuh). A valid list
// on a validated cu_seqlens is unchanged by the clamps.
__device__ __forceinline__ int2 load_item(const WorkList& w, int slot) {
  return w.items[min(max(slot, 0), w.capacity - 1)];
}
__device__ __forceinline__ DocTile doc_tile(const int32_t* cu_seqlens, const WorkList& w, int2 item) {
  const int b = min(max(item.x, 0), w.num_docs - 1);
  DocTile d;
  d.doc = b;
  d.tok0 = min(max(int64_t(cu_seqlens[b]), int64_t(0)), w.total_tokens);
  const int64_t end = min(max(int64_t(cu_seqlens[b + 1]), d.tok0), w.total_tokens);
  d.len = int(end - d.tok0);
  d.pstart = quant::padded_doc_start(d.tok0, b);
  d.num_tiles = (d.len + w.tile - 1) / w.tile;
  d.tile = min(max(item.y, 0), max(d.num_tiles - 1, 0));
  return d;
}
__device__ __forceinline__ DocTile doc_tile(const int32_t* cu_seqlens, const WorkList& w, int slot) {
  return doc_tile(cu_seqlens, w, load_item(w, slot));
}

// The document's first query position (flamia.h, q_start): 0 without q_start. Clamped to
// [0, len] so that not even an invalid value (which the guard reports, and whose call's
// outputs are then overwritten with NaN) makes a kernel address rows outside the document.
__device__ __forceinline__ int first_query(const int32_t* q_start, const DocTile& dt) {
  return q_start ? min(max(q_start[dt.doc], 0), dt.len) : 0;
}

// A CTA's entry: the list's count and the call's fault word (0: none) together, then its
// item, then cu_seqlens and q_start together: three round trips to the L2 before the CTA's
// tiles load, where one load after another took five (docs/PERFORMANCE.md v69; ptxas puts
// the item's load after the test of the first two, even as volatile asm). ok false: the CTA
// has nothing to do (a slot past the count, a fault, an empty item).
struct CtaItem {
  DocTile dt;
  int first_query;  // first_query(q_start, dt)
  bool ok;          // false: the CTA has nothing to do
};
__device__ __forceinline__ CtaItem enter_cta(const WorkList& w, int slot, const int32_t* fault,
                                             const int32_t* cu_seqlens, const int32_t* q_start) {
  CtaItem out{};
  const int count = item_count(w), fault_code = *fault;
  if (slot >= count || fault_code != 0) return out;
  out.dt = doc_tile(cu_seqlens, w, slot);
  out.first_query = first_query(q_start, out.dt);
  out.ok = out.dt.len != 0;
  return out;
}

inline WorkList work_list(const uint8_t* qkv8, const quant::Qkv8Layout& layout,
                          const quant::WorkListRegions& regions) {
  return {reinterpret_cast<const int*>(qkv8 + regions.count),
          reinterpret_cast<const int2*>(qkv8 + regions.items), int(regions.capacity), regions.tile,
          int(layout.num_docs), layout.total_tokens};
}

}  // namespace sm90
}  // namespace flamia
