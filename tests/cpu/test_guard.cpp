// Hostile cu_seqlens / max_seqlen (quantize/guard.h): the validation the device runs, as the
// host runs it, against the rules written out on their own; the order in which faults are
// reported; the messages; the qkv8 fingerprint; and flamia_check_errors where no device call
// has run.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api/validate.h"
#include "flamia/flamia.h"
#include "quantize/guard.h"
#include "quantize/layout.cuh"

namespace {

using flamia::api::describe_fault;
using flamia::api::find_cu_fault;
namespace guard = flamia::guard;

guard::DeviceError fault_of(const std::vector<int32_t>& cu, int64_t T, int max_seqlen) {
  return find_cu_fault(cu.data(), int(cu.size()) - 1, T, max_seqlen, guard::kStageForward);
}

// The verdict the rules state (guard.h's list of faults, in its order), written without
// entry_fault and the fault keys that the device (guard_block, an atomicMin over the entries)
// and the host (find_cu_fault) reduce: the first entry if not 0; else the first decrease; else
// the last entry if not T; else the first document longer than max_seqlen.
guard::DeviceError rule_fault(const std::vector<int32_t>& cu, int64_t T, int max_seqlen) {
  const int64_t B = int64_t(cu.size()) - 1;
  guard::DeviceError e{};
  if (cu[0] != 0) {
    e.fault = guard::kCuFirstNotZero, e.index = 0, e.a = cu[0];
    return e;
  }
  for (int64_t i = 1; i <= B; ++i)
    if (cu[size_t(i)] < cu[size_t(i - 1)]) {
      e.fault = guard::kCuDecreasing, e.index = i, e.a = cu[size_t(i)], e.b = cu[size_t(i - 1)];
      return e;
    }
  if (cu[size_t(B)] != T) {
    e.fault = guard::kCuLastNotT, e.index = B, e.a = cu[size_t(B)], e.b = T;
    return e;
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = int64_t(cu[size_t(b + 1)]) - cu[size_t(b)];
    if (len > max_seqlen) {
      e.fault = guard::kCuLongerThanMax, e.index = b, e.a = len, e.b = max_seqlen;
      return e;
    }
  }
  return e;
}

struct CuCase {
  const char* name;
  std::vector<int32_t> cu;
  int64_t T;
  int max_seqlen;
  int32_t fault;
  const char* message;  // substring of the message ("" for valid input)
};

const std::vector<CuCase>& cases() {
  static const std::vector<CuCase> c = {
      // The three inputs of the hostile-input report (T = 512).
      {"last > T", {0, 256, 1024}, 512, 1024, guard::kCuLastNotT,
       "cu_seqlens: last entry cu_seqlens[2] = 1024 must equal T = 512"},
      {"decreasing", {0, 400, 100, 512}, 512, 512, guard::kCuDecreasing,
       "cu_seqlens: must be non-decreasing, got cu_seqlens[2] = 100 < cu_seqlens[1] = 400"},
      {"last < T", {0, 100, 300}, 512, 512, guard::kCuLastNotT,
       "cu_seqlens: last entry cu_seqlens[2] = 300 must equal T = 512"},
      // Valid: zero-length documents anywhere, a single document, max_seqlen an upper bound.
      {"zero-length docs", {0, 0, 5, 5, 5, 70, 70}, 70, 65, guard::kNone, ""},
      {"all empty but one", {0, 0, 0, 128}, 128, 128, guard::kNone, ""},
      {"one doc", {0, 4096}, 4096, 100000, guard::kNone, ""},
      // Every invariant, and the order in which several are reported.
      {"first not 0", {3, 10, 20}, 20, 20, guard::kCuFirstNotZero, "cu_seqlens: cu_seqlens[0] must be 0, got 3"},
      {"first negative", {-64, 10, 20}, 20, 100, guard::kCuFirstNotZero, "cu_seqlens[0] must be 0, got -64"},
      {"first beats decreasing", {5, 3, 20}, 20, 100, guard::kCuFirstNotZero, "cu_seqlens[0] must be 0"},
      {"decreasing beats last", {0, 30, 10, 25}, 20, 100, guard::kCuDecreasing, "cu_seqlens[2] = 10 < cu_seqlens[1] = 30"},
      {"first decrease reported", {0, 30, 10, 40, 5, 50}, 50, 100, guard::kCuDecreasing, "cu_seqlens[2] = 10"},
      {"last decreasing", {0, 30, 10}, 10, 100, guard::kCuDecreasing, "cu_seqlens[2] = 10 < cu_seqlens[1] = 30"},
      {"longer than max_seqlen", {0, 10, 80, 90}, 90, 64, guard::kCuLongerThanMax,
       "max_seqlen: 64 is less than the length 70 of document 1 (cu_seqlens[2] - cu_seqlens[1])"},
      {"last beats max_seqlen", {0, 100, 300}, 512, 64, guard::kCuLastNotT, "must equal T = 512"},
      {"int32 extremes", {0, INT_MAX, INT_MIN, 0}, 0, INT_MAX, guard::kCuDecreasing,
       "cu_seqlens[2] = -2147483648 < cu_seqlens[1] = 2147483647"},
      {"length past int32", {0, INT_MAX, INT_MAX}, INT_MAX, 1, guard::kCuLongerThanMax,
       "length 2147483647 of document 0"},
  };
  return c;
}

TEST(Guard, CuSeqlensFaults) {
  for (const CuCase& c : cases()) {
    const guard::DeviceError e = fault_of(c.cu, c.T, c.max_seqlen);
    EXPECT_EQ(e.fault, c.fault) << c.name;
    if (c.fault == guard::kNone) continue;
    const std::string msg = describe_fault(e);
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(Guard, KeyReductionGivesTheRulesVerdict) {
  std::mt19937_64 rng(7);
  int faults = 0, valid = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int B = 1 + int(rng() % 40);
    std::vector<int32_t> cu(size_t(B + 1));
    int32_t x = 0;
    for (int i = 0; i <= B; ++i) {
      cu[size_t(i)] = x;
      x += int32_t(rng() % 100);
      if (rng() % 10 == 0) cu[size_t(i)] = int32_t(rng() % 300) - 20;  // a corrupt entry
    }
    const int64_t T = rng() % 4 == 0 ? int64_t(rng() % 3000) : cu.back();
    const int max_seqlen = 1 + int(rng() % 120);
    const guard::DeviceError got = fault_of(cu, T, max_seqlen), want = rule_fault(cu, T, max_seqlen);
    ASSERT_EQ(got.fault, want.fault) << "trial " << trial;
    if (want.fault == guard::kNone) {
      // What the kernels rely on from a valid verdict: every document within [0, T].
      for (int b = 0; b < B; ++b) ASSERT_TRUE(0 <= cu[size_t(b)] && cu[size_t(b)] <= cu[size_t(b + 1)] && cu[size_t(b + 1)] <= T);
      ++valid;
      continue;
    }
    ++faults;
    ASSERT_EQ(got.index, want.index) << "trial " << trial;
    ASSERT_EQ(got.a, want.a) << "trial " << trial;
    ASSERT_EQ(got.b, want.b) << "trial " << trial;
  }
  EXPECT_GT(faults, 500) << "the random packs should mostly be invalid";
  EXPECT_GT(valid, 20) << "and some valid";
}

// A validated cu_seqlens fits the work list and the transposed copies (layout.cuh), the
// capacities the device no longer checks one by one.
TEST(Guard, ValidPacksFitTheBuffers) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const int B = 1 + int(rng() % 50);
    std::vector<int32_t> cu(size_t(B + 1), 0);
    for (int b = 0; b < B; ++b) cu[size_t(b + 1)] = cu[size_t(b)] + int32_t(rng() % 3 == 0 ? 0 : rng() % 700);
    const int64_t T = cu.back();
    ASSERT_EQ(fault_of(cu, T, 700).fault, guard::kNone);
    const auto l = flamia::quant::Qkv8Layout::make(T, B, 4, 2, 64, FLAMIA_RECIPE_FP8, true);
    // Every list of the layout (at D = 64 also the fast forward's 192-row one).
    const flamia::quant::WorkListRegions* lists[] = {&l.work, &l.fwd_work, &l.fwd_work64};
    ASSERT_EQ(l.fwd_work64.tile, 192);
    ASSERT_EQ(&l.fast_forward_work(), &l.fwd_work64);
    for (const auto* list : lists) {
      int64_t items = 0;
      for (int b = 0; b < B; ++b) {
        const int64_t nt = (cu[size_t(b + 1)] - cu[size_t(b)] + list->tile - 1) / list->tile;
        ASSERT_LE(nt, list->nt_cap);
        items += nt;
      }
      ASSERT_LE(items, list->capacity);
    }
    // Each document's transposed range ends inside Tpad.
    for (int b = 0; b < B; ++b) {
      const int64_t len16 = (cu[size_t(b + 1)] - cu[size_t(b)] + 15) / 16 * 16;
      ASSERT_LE(flamia::quant::padded_doc_start(cu[size_t(b)], b) + len16, l.tpad);
    }
  }
}

// At D = 128 the fast forward walks the 128-row list and no 192-row list is laid out.
TEST(Guard, TheFastForwardListFollowsTheHeadDim) {
  const auto l128 = flamia::quant::Qkv8Layout::make(1000, 3, 4, 2, 128, FLAMIA_RECIPE_FP8, false);
  EXPECT_EQ(l128.fwd_work64.capacity, 0);
  EXPECT_EQ(&l128.fast_forward_work(), &l128.fwd_work);
  EXPECT_EQ(l128.fast_forward_work().tile, 128);
  const auto l64 = flamia::quant::Qkv8Layout::make(1000, 3, 4, 2, 64, FLAMIA_RECIPE_FP8, false);
  EXPECT_EQ(l64.fast_forward_work().tile, 192);
  EXPECT_EQ(l64.fwd_work64.capacity, (1000 + 191) / 192 + 3);
}

TEST(Guard, MessagesNameTheArgument) {
  guard::DeviceError e{};
  e.fault = guard::kQkv8Mismatch;
  const std::string m = describe_fault(e);
  EXPECT_EQ(m.rfind("qkv8: ", 0), 0u) << m;
  EXPECT_NE(m.find("different cu_seqlens"), std::string::npos) << m;
  e.fault = guard::kWorkListOverflow;
  EXPECT_EQ(describe_fault(e).rfind("cu_seqlens: ", 0), 0u);
  e.fault = 99;
  EXPECT_NE(describe_fault(e).find("99"), std::string::npos);
}

TEST(Guard, FingerprintSeparatesCallsThatDiffer) {
  const std::vector<int32_t> cu = {0, 100, 100, 356, 512};
  const uint64_t shape = guard::shape_fingerprint(512, 4, 8, 2, 128, FLAMIA_RECIPE_FP8);
  const uint64_t base = guard::fingerprint(cu.data(), 4, shape);
  EXPECT_NE(base, 0u);  // 0 means "rejected / never filled"
  EXPECT_EQ(base, guard::fingerprint(cu.data(), 4, shape));
  std::set<uint64_t> seen = {base};
  // Any single entry moved, two entries swapped, any shape parameter changed.
  for (size_t i = 0; i < cu.size(); ++i)
    for (int delta : {-1, 1, 64}) {
      std::vector<int32_t> c = cu;
      c[i] += delta;
      EXPECT_TRUE(seen.insert(guard::fingerprint(c.data(), 4, shape)).second) << "entry " << i << " + " << delta;
    }
  std::vector<int32_t> swapped = {0, 100, 356, 100, 512};
  EXPECT_TRUE(seen.insert(guard::fingerprint(swapped.data(), 4, shape)).second);
  const uint64_t shapes[] = {
      guard::shape_fingerprint(513, 4, 8, 2, 128, FLAMIA_RECIPE_FP8),
      guard::shape_fingerprint(512, 5, 8, 2, 128, FLAMIA_RECIPE_FP8),
      guard::shape_fingerprint(512, 4, 4, 2, 128, FLAMIA_RECIPE_FP8),
      guard::shape_fingerprint(512, 4, 8, 1, 128, FLAMIA_RECIPE_FP8),
      guard::shape_fingerprint(512, 4, 8, 2, 64, FLAMIA_RECIPE_FP8),
      guard::shape_fingerprint(512, 4, 8, 2, 128, FLAMIA_RECIPE_FP8_MIXED),
  };
  for (uint64_t s : shapes) EXPECT_TRUE(seen.insert(guard::fingerprint(cu.data(), 4, s)).second);
  // The sum is order-free: the device adds its threads' parts in any order.
  uint64_t reversed = shape;
  for (int64_t i = 4; i >= 0; --i) reversed += guard::entry_fingerprint(i, cu[size_t(i)]);
  EXPECT_EQ(guard::finish_fingerprint(reversed), base);
}

}  // namespace

// Recipe fp8 keeps no transposed Qᵀ/Kᵀ in qkv8 (the backward transposes q8 and k8 into its
// workspace); fp8_mixed keeps no BF16 copy of q, k or dO anywhere (its backward reads the
// caller's tensors), only the flag words of non-finite rows.
TEST(Guard, TransposedQkLiveWhereTheirRecipeMakesThem) {
  using flamia::quant::BwdWorkspaceLayout;
  using flamia::quant::Qkv8Layout;
  const int64_t T = 1000, B = 3;
  const int hq = 8, hkv = 2, D = 128;
  const auto q8 = Qkv8Layout::make(T, B, hq, hkv, D, FLAMIA_RECIPE_FP8, true);
  const auto ws8 = BwdWorkspaceLayout::make(T, B, hq, hkv, D, FLAMIA_RECIPE_FP8);
  const auto qm = Qkv8Layout::make(T, B, hq, hkv, D, FLAMIA_RECIPE_FP8_MIXED, true);
  const auto wsm = BwdWorkspaceLayout::make(T, B, hq, hkv, D, FLAMIA_RECIPE_FP8_MIXED);
  EXPECT_EQ(q8.nonfinite, 0u);
  EXPECT_NE(qm.nonfinite, 0u);
  EXPECT_EQ(wsm.qt, 0u);
  EXPECT_EQ(wsm.kt, 0u);
  EXPECT_EQ(wsm.dot8, 0u);
  EXPECT_NE(wsm.nonfinite, 0u);
  EXPECT_EQ(ws8.nonfinite, 0u);
  // Sizes: the backward-only qkv8 region is v8 alone (and fp8_mixed's flag word); fp8's
  // workspace holds the two transposed copies and dO transposed in FP8, fp8_mixed's none.
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const auto q8f = Qkv8Layout::make(T, B, hq, hkv, D, FLAMIA_RECIPE_FP8, false);
  EXPECT_EQ(q8.bytes - q8f.bytes, aligned(size_t(T) * hkv * D));
  EXPECT_EQ(qm.bytes - q8f.bytes, aligned(size_t(T) * hkv * D) + aligned(sizeof(uint32_t)));
  const size_t dot = size_t(hq) * D * size_t(ws8.tpad);
  EXPECT_EQ(ws8.dot8 + aligned(dot), ws8.sdo);
  EXPECT_EQ(ws8.bytes + aligned(sizeof(uint32_t)) - wsm.bytes,
            aligned(dot) + aligned(size_t(hq) * D * size_t(ws8.tpad)) + aligned(size_t(hkv) * D * size_t(ws8.tpad)));
}
