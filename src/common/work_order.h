// The fast forward's work order (sm90/collective/fwd_plan.cuh): which (work-list slot, query
// head) the CTAs' w-th item is, and how many kv heads a block of the order holds. Host and
// device code; no CUDA runtime (tests/cpu/test_work_order.cpp checks it on the CPU).
//
// Items run in blocks of kv_block kv heads, one block after another; inside a block the
// work list's slots costliest first, and for each slot the block's query heads side by side
// (a GQA group's heads share K and Vᵀ). CTAs take items in this order as they become free, so
// the items in flight are mostly of one block, whose K and Vᵀ stay in the L2, and each block
// ends on its cheapest items while the next block's costliest start.
#pragma once

#include <cstdint>

#include "flamia/formats.h"  // FLAMIA_HD

namespace flamia {
namespace order {

struct SlotHead {
  int slot, h;
};

// Item w of slots * hq (kv_block divides hkv, hkv divides hq).
FLAMIA_HD SlotHead forward_item(int w, int slots, int hq, int hkv, int kv_block) {
  const int block_heads = kv_block * (hq / hkv), per_block = slots * block_heads;
  const int block = w / per_block, r = w - block * per_block;
  const int h = block * block_heads + r % block_heads;
  return {r / block_heads, h};
}

// The backward passes' CTA order (sm90/kernels/backward.cu): CTA x of a grid of slots * heads
// (heads: the launch's query heads, kv_heads of them, or its kv heads with kv_heads = heads)
// is item x of the forward's order in blocks of kv_block kv heads. The hardware starts CTAs
// about in index order, so the CTAs in flight are mostly one block's, and those of one
// (document, head) stream the same rows (dK/dV a query head's q and dO, dQ a kv head's k and
// v) from the L2: with every head side by side, a wave of fixed-4k's dK/dV pass held 128
// distinct streams and read 4.6 GB from DRAM (docs/PERFORMANCE.md v66).
FLAMIA_HD SlotHead backward_cta(int x, int slots, int heads, int kv_heads, int kv_block) {
  return forward_item(x, slots, heads, kv_heads, kv_block);
}

// The block for a launch over all kv heads: two where they divide evenly, else the smallest
// divisor. One kv head a block shares the most but starts the last head's costliest CTAs
// late (a list-scheduling model of the packs: up to 3 % longer, as measured at pack-32k and
// llama1b-pack in v66); two keep the launch within 1 % of an even split and still share each
// stream about 8 ways at fixed-4k.
inline int backward_kv_block(int hkv) {
  for (int b = 2; b < hkv; ++b)
    if (hkv % b == 0) return b;
  return hkv;
}

// As many kv heads as keep a block's K and Vᵀ codes (2 T D bytes a kv head) within about half
// the H200's 50 MB L2, at least one, a divisor of hkv.
inline int forward_kv_block(int64_t total_tokens, int hkv, int head_dim) {
  constexpr int64_t kBudget = int64_t(24) << 20;
  const int64_t per_head = 2 * total_tokens * head_dim;
  int best = 1;
  for (int b = 1; b <= hkv; ++b)
    if (hkv % b == 0 && b * per_head <= kBudget) best = b;
  return best;
}

// The stored dS's launches (sm90/kernels/backward.cu): hkv kv heads in slabs of at most
// `slab` (the workspace plan's, which holds one slab), as few slabs as that allows, the heads
// dealt out evenly: sizes differ by at most one, larger first. A remainder slab of one head
// would be a launch of about two waves (docs/PERFORMANCE.md v46, v62).
struct Slabs {
  int count, smaller, larger;  // slabs; heads in the smaller ones; how many hold one more
  FLAMIA_HD int heads(int i) const { return smaller + (i < larger ? 1 : 0); }
};
FLAMIA_HD Slabs stored_ds_slabs(int hkv, int slab) {
  const int count = (hkv + slab - 1) / slab;
  return {count, hkv / count, hkv % count};
}

}  // namespace order
}  // namespace flamia
