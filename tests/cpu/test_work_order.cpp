// The fast forward's work order (common/work_order.h): every item exactly once, blocks of kv
// heads whose query heads stay together, slots costliest first inside a block, and the block
// size rule; the backward's CTA order; the stored dS's slabs; the launch-constant division.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/fast_div.h"
#include "common/work_order.h"

namespace flamia {
namespace {

struct Shape {
  int slots, hq, hkv, kv_block;
};

// Checks that (slot, head) lies in the grid of s and counts it in seen ([slot][head]).
void take(const order::SlotHead& c, const Shape& s, std::vector<int>& seen) {
  ASSERT_GE(c.slot, 0);
  ASSERT_LT(c.slot, s.slots);
  ASSERT_GE(c.h, 0);
  ASSERT_LT(c.h, s.hq);
  ++seen[size_t(c.slot) * s.hq + c.h];
}

void expect_each_once(const std::vector<int>& seen) {
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "(slot, head) " << i << " taken " << seen[i] << " times";
}

TEST(WorkOrder, EveryItemOnceInBlocksOfKvHeads) {
  for (const Shape s : {Shape{256, 16, 16, 2}, Shape{256, 16, 16, 16}, Shape{7, 32, 8, 1}, Shape{45, 32, 8, 2},
                        Shape{1, 4, 1, 1}, Shape{13, 12, 4, 4}, Shape{5, 6, 2, 1}}) {
    const int group = s.hq / s.hkv, block_heads = s.kv_block * group, items = s.slots * s.hq;
    std::vector<int> seen(size_t(items), 0);
    int prev_block = -1, prev_slot = -1;
    for (int w = 0; w < items; ++w) {
      const order::SlotHead sh = order::forward_item(w, s.slots, s.hq, s.hkv, s.kv_block);
      ASSERT_NO_FATAL_FAILURE(take(sh, s, seen)) << "w = " << w;
      // The block is the query head's kv heads' block: a GQA group never spans two blocks.
      const int block = (sh.h / group) / s.kv_block;
      EXPECT_GE(block, prev_block) << "blocks run one after another, w = " << w;
      if (block == prev_block) EXPECT_GE(sh.slot, prev_slot) << "slots costliest first inside a block, w = " << w;
      // Each slot's query heads of the block are side by side.
      EXPECT_EQ(sh.h, block * block_heads + w % block_heads) << "w = " << w;
      prev_block = block;
      prev_slot = sh.slot;
    }
    expect_each_once(seen);
  }
}

// The backward's CTA order: every (slot, head) of the grid once, block of kv heads by block,
// slots in list order (costliest first) inside a block, each slot's query heads of the block
// side by side; and the block size rule.
TEST(WorkOrder, BackwardCtasInBlocksOfKvHeads) {
  for (const Shape s : {Shape{264, 16, 16, 2}, Shape{264, 16, 1, 1}, Shape{1069, 32, 8, 2}, Shape{3, 6, 3, 3},
                        Shape{1, 1, 1, 1}, Shape{5, 12, 4, 2}, Shape{7, 16, 16, 16}}) {
    const int group = s.hq / s.hkv, block_heads = s.kv_block * group, ctas = s.slots * s.hq;
    std::vector<int> seen(size_t(ctas), 0);
    for (int x = 0; x < ctas; ++x) {
      const order::SlotHead c = order::backward_cta(x, s.slots, s.hq, s.hkv, s.kv_block);
      ASSERT_NO_FATAL_FAILURE(take(c, s, seen)) << "x = " << x;
      EXPECT_EQ(c.h / block_heads, x / (s.slots * block_heads)) << "one block's CTAs together, x = " << x;
      EXPECT_EQ(c.slot, (x / block_heads) % s.slots) << "slots in list order inside a block, x = " << x;
      EXPECT_EQ(c.h % block_heads, x % block_heads) << "a slot's heads of the block side by side, x = " << x;
    }
    expect_each_once(seen);
  }
  // A block of all the kv heads is the order with the head fastest.
  for (int x = 0; x < 7 * 16; ++x) {
    const order::SlotHead c = order::backward_cta(x, 7, 16, 16, 16);
    EXPECT_EQ(c.slot, x / 16);
    EXPECT_EQ(c.h, x % 16);
  }
  for (int hkv = 1; hkv <= 64; ++hkv) {
    const int b = order::backward_kv_block(hkv);
    EXPECT_EQ(hkv % b, 0) << hkv;
    if (hkv % 2 == 0) EXPECT_EQ(b, 2) << hkv;
    for (int d = 2; d < b; ++d) EXPECT_NE(hkv % d, 0) << hkv << ": " << d << " is a smaller divisor";
  }
}

TEST(WorkOrder, KvBlockFitsTheBudgetAndDividesHkv) {
  // 2 T D bytes of K and Vᵀ codes a kv head, within 24 MiB.
  EXPECT_EQ(order::forward_kv_block(32768, 16, 128), 2);  // fixed-16k, pack-32k: 8 MiB a head
  EXPECT_EQ(order::forward_kv_block(131072, 16, 128), 1);  // pack-128k: 32 MiB, still one
  EXPECT_EQ(order::forward_kv_block(65536, 8, 128), 1);   // llama8b-pack
  EXPECT_EQ(order::forward_kv_block(65536, 8, 64), 2);    // llama1b-pack
  EXPECT_EQ(order::forward_kv_block(100, 6, 64), 6);      // small: every kv head in one block
  EXPECT_EQ(order::forward_kv_block(4096, 12, 128), 12);
  EXPECT_EQ(order::forward_kv_block(32768, 12, 128), 3);  // three fit and divide 12
  EXPECT_EQ(order::forward_kv_block(32768, 8, 128), 2);   // three fit, two divide 8
  for (int hkv : {1, 2, 3, 5, 8, 12, 16})
    for (long long t : {1LL, 1000LL, 65536LL, 1LL << 20}) {
      const int b = order::forward_kv_block(t, hkv, 128);
      EXPECT_GE(b, 1);
      EXPECT_EQ(hkv % b, 0) << "hkv " << hkv << ", T " << t;
      if (b > 1) EXPECT_LE(2 * t * 128 * b, 24LL << 20) << "hkv " << hkv << ", T " << t;
    }
}

// The stored dS's slabs: every kv head in exactly one slab, consecutive, none larger than the
// plan's slab (the workspace holds one), as few slabs as that allows, sizes within one.
TEST(WorkOrder, StoredDsSlabsDealHeadsEvenly) {
  for (int hkv = 1; hkv <= 64; ++hkv)
    for (int slab = 1; slab <= hkv; ++slab) {
      const order::Slabs s = order::stored_ds_slabs(hkv, slab);
      ASSERT_EQ(s.count, (hkv + slab - 1) / slab) << hkv << " heads, slab " << slab;
      int total = 0, lo = hkv, hi = 0;
      for (int i = 0; i < s.count; ++i) {
        const int h = s.heads(i);
        ASSERT_GE(h, 1) << hkv << " heads, slab " << slab << ", slab " << i;
        ASSERT_LE(h, slab) << hkv << " heads, slab " << slab << ", slab " << i;
        if (i > 0) ASSERT_LE(h, s.heads(i - 1)) << "larger slabs first";
        total += h;
        lo = std::min(lo, h);
        hi = std::max(hi, h);
      }
      EXPECT_EQ(total, hkv) << hkv << " heads, slab " << slab;
      EXPECT_LE(hi - lo, 1) << hkv << " heads, slab " << slab;
    }
  // fixed-16k's plan: 16 kv heads, at most three a slab: 3 + 3 + 3 + 3 + 2 + 2, not 3 x 5 + 1.
  const order::Slabs s = order::stored_ds_slabs(16, 3);
  EXPECT_EQ(s.count, 6);
  EXPECT_EQ(s.heads(0), 3);
  EXPECT_EQ(s.heads(4), 2);
  EXPECT_EQ(s.heads(5), 2);
}

// FastDiv against the integer division: every divisor up to 4096 and the powers of two and
// their neighbours up to 2^31 - 1, at numerators near 0, near multiples of d, near 2^31 and at random.
TEST(FastDiv, MatchesIntegerDivisionBelow2To31) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int b = 12; b < 31; ++b)
    for (int64_t off : {-1, 0, 1}) divisors.push_back(uint32_t((int64_t(1) << b) + off));
  divisors.push_back(0x7fffffffu);
  std::mt19937 rng(7);
  const uint32_t top = 0x7fffffffu;
  for (uint32_t d : divisors) {
    const FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, top, top - 1, top - d + 1, (top / d) * d, (top / d) * d - 1};
    for (int i = 0; i < 64; ++i) ns.push_back(rng() & top);
    for (int i = 0; i < 16; ++i) {
      const uint32_t k = (rng() & top) / d;
      ns.push_back(k * d);
      if (k > 0) ns.push_back(k * d - 1);
    }
    for (uint32_t n : ns)
      if (n <= top) ASSERT_EQ(f.div(n), n / d) << "n " << n << " d " << d;
  }
}

}  // namespace
}  // namespace flamia
