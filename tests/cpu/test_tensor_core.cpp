// The wgmma accumulation model (src/reference/tensor_core.h) on hand-made cases, one per
// rule, each built so that the neighbouring rule (the product's own exponent for alignment,
// rounding instead of cutting, cutting the sum instead of each term, IEEE FP32 adds) gives
// a different answer. The rule itself was measured on an H200 (docs/NUMERICS.md §6).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "flamia/formats.h"
#include "reference/tensor_core.h"

namespace flamia {
namespace ref {
namespace tc {
namespace {

uint32_t bits(float x) { return fmt::f32_bits(x); }
float p2(int e) { return std::ldexp(1.0f, e); }

// One step of k products: the listed (a, b) pairs, the rest zero.
float step(const StepRule& r, float c, bool has_c, std::vector<std::pair<float, float>> ab) {
  std::vector<float> a(r.k, 0.0f), b(r.k, 0.0f);
  for (size_t i = 0; i < ab.size(); ++i) {
    a[i] = ab[i].first;
    b[i] = ab[i].second;
  }
  return mma_step(r, c, has_c, a.data(), b.data());
}
float fp8_step(std::vector<std::pair<float, float>> ab) { return step(kHopperE4M3, 0.0f, false, ab); }

#define EXPECT_SAME(x, y) EXPECT_EQ(bits(x), bits(y)) << (x) << " vs " << (y)

TEST(TensorCoreModel, MeasuredParameters) {
  EXPECT_EQ(kHopperE4M3.k, 32);
  EXPECT_EQ(kHopperE4M3.term_frac_bits, 13);
  EXPECT_EQ(kHopperE4M3.sum_frac_bits, 13);
  EXPECT_EQ(kHopperBF16.k, 16);
  EXPECT_EQ(kHopperBF16.term_frac_bits, 25);
  EXPECT_EQ(kHopperBF16.sum_frac_bits, 23);
}

// Exact sums whose terms and result fit the grid come out exact.
TEST(TensorCoreModel, ExactWhenNothingIsCut) {
  EXPECT_SAME(fp8_step({{1.5f, 2.0f}, {-0.25f, 3.0f}, {1.0f, 4.0f}}), 6.25f);
  EXPECT_SAME(step(kHopperE4M3, 10.0f, true, {{1.0f, 1.0f}}), 11.0f);
}

// Alignment exponent of a product = ea + eb, not the product's own exponent: 1.875 * 1.875
// = 3.52 (exponent 1) aligns at 0, so a 2^-13 term survives (at exponent 1 it would not).
TEST(TensorCoreModel, ProductsAlignAtTheSumOfOperandExponents) {
  const float got = fp8_step({{1.875f, 1.875f}, {-1.875f, 1.0f}, {p2(-6), p2(-7)}});
  EXPECT_SAME(got, 1.640625f + p2(-13));
}

// Each term is cut toward zero to 2^(E - 13) (E4M3): a negative 1.5-unit term loses half a
// unit toward zero (floor would give -2 units, rounding -2 units too).
TEST(TensorCoreModel, TermsAreCutTowardZero) {
  EXPECT_SAME(fp8_step({{1.0f, 1.0f}, {-3.0f * p2(-8), p2(-6)}}), 1.0f - p2(-13));
  EXPECT_SAME(fp8_step({{-1.0f, 1.0f}, {3.0f * p2(-8), p2(-6)}}), -1.0f + p2(-13));
  EXPECT_SAME(fp8_step({{1.0f, 1.0f}, {3.0f * p2(-8), p2(-6)}}), 1.0f + p2(-13));
}

// Each term is cut before the sum: two half-unit terms vanish (an exact sum, cut once,
// would keep one unit).
TEST(TensorCoreModel, TermsAreCutOneByOne) {
  EXPECT_SAME(fp8_step({{1.0f, 1.0f}, {p2(-7), p2(-7)}, {p2(-7), p2(-7)}}), 1.0f);
}

// The sum is cut toward zero to 13 fraction bits of its own exponent (E4M3): a carry into
// exponent 1 drops a 2^-13 bit; and the same for a negative sum.
TEST(TensorCoreModel, SumIsCutToItsOwnExponent) {
  EXPECT_SAME(fp8_step({{1.875f, 1.0f}, {0.25f, 1.0f}, {p2(-6), p2(-7)}}), 2.125f);
  EXPECT_SAME(fp8_step({{-1.875f, 1.0f}, {-0.25f, 1.0f}, {-p2(-6), p2(-7)}}), -2.125f);
  // Cancellation: the sum's exponent falls below E; nothing more is cut.
  EXPECT_SAME(fp8_step({{1.0f, 1.0f}, {-1.0f, 1.0f}, {p2(-6), p2(-7)}}), p2(-13));
}

// The incoming accumulator is one more term, with its own FP32 exponent (subnormals: -126).
TEST(TensorCoreModel, AccumulatorIsATermOfTheStep) {
  const StepRule& r = kHopperE4M3;
  EXPECT_SAME(step(r, 1.0f + p2(-20), true, {}), 1.0f);             // cut to 13 fraction bits
  EXPECT_SAME(step(r, -(1.0f + p2(-20)), true, {}), -1.0f);
  EXPECT_SAME(step(r, p2(-20), true, {{1.0f, 1.0f}}), 1.0f);         // below 2^-13 of the product
  EXPECT_SAME(step(r, 1024.0f, true, {{p2(-3), p2(-1)}}), 1024.0f); // 2^-4 below 2^(10-13)
  const float sub = fmt::bits_f32(0x00100001u);                     // 2^-129 + 2^-149
  EXPECT_SAME(step(r, sub, true, {}), fmt::bits_f32(0x00100000u));  // cut at 2^(-126-13)
  EXPECT_SAME(step(r, std::numeric_limits<float>::max(), true, {{448.0f, 448.0f}}),
              fmt::bits_f32(0x7f7ffc00u));                           // 13 fraction bits of 2^127
}

// scale-d = 0 ignores the accumulator; a +0 accumulator with scale-d = 1 changes nothing.
TEST(TensorCoreModel, ScaleDZero) {
  const StepRule& r = kHopperE4M3;
  EXPECT_SAME(step(r, 5.0f, false, {{1.5f, 1.0f}}), 1.5f);
  for (float x : {1.5f, -3.25f, 1.125f})
    EXPECT_SAME(step(r, 0.0f, true, {{x, 1.0f}, {p2(-7), p2(-7)}}), step(r, 0.0f, false, {{x, 1.0f}, {p2(-7), p2(-7)}}));
}

// A zero sum is +0 whatever the signs (exact cancellation, -0 terms, -0 accumulator).
TEST(TensorCoreModel, ZeroIsPositive) {
  EXPECT_EQ(bits(fp8_step({{1.0f, 1.0f}, {-1.0f, 1.0f}})), 0u);
  EXPECT_EQ(bits(fp8_step({{-0.0f, 1.0f}, {0.0f, -2.0f}})), 0u);
  EXPECT_EQ(bits(step(kHopperE4M3, -0.0f, true, {{-0.0f, 1.0f}})), 0u);
  // BF16: a negative sum below FP32's subnormal grid is +0 too.
  EXPECT_EQ(bits(step(kHopperBF16, 0.0f, false, {{-p2(-100), p2(-100)}})), 0u);
}

TEST(TensorCoreModel, NonFinite) {
  const StepRule& r = kHopperE4M3;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(bits(step(r, nan, true, {{1.0f, 1.0f}})), 0x7fffffffu);
  EXPECT_EQ(bits(step(r, 0.0f, false, {{nan, 1.0f}})), 0x7fffffffu);
  EXPECT_SAME(step(r, inf, true, {{-448.0f, 448.0f}}), inf);
  EXPECT_SAME(step(r, -inf, true, {{1.0f, 1.0f}}), -inf);
  EXPECT_EQ(bits(step(kHopperBF16, inf, true, {{-p2(100), p2(100)}, {p2(100), p2(100)}})), 0x7f800000u);
  EXPECT_EQ(bits(step(kHopperBF16, 0.0f, false, {{inf, 0.0f}})), 0x7fffffffu);  // Inf * 0
}

// BF16 k16: terms keep 25 fraction bits of E, the sum 23 of its own exponent (FP32's grid,
// cut toward zero). 1 - 2^-25 becomes 1 - 2^-24 (FP32 round-to-nearest would give 1).
TEST(TensorCoreModel, Bf16Step) {
  const StepRule& r = kHopperBF16;
  EXPECT_SAME(step(r, 0.0f, false, {{1.0f, 1.0f}, {-p2(-12), p2(-13)}}), 1.0f - p2(-24));
  EXPECT_SAME(step(r, 0.0f, false, {{1.0f, 1.0f}, {-p2(-13), p2(-13)}}), 1.0f);  // 2^-26: cut away
  EXPECT_SAME(step(r, 0.0f, false, {{1.0f, 1.0f}, {p2(-12), p2(-12)}}), 1.0f);   // 1 + 2^-24: sum cut
  // Alignment at ea + eb again: 1.9921875^2 = 3.97 aligns at 0, keeping a 2^-25 term
  // that an alignment at 1 would cut (the sum, 0.48, keeps 2^-25 too).
  const float m = 1.9921875f;
  EXPECT_SAME(step(r, 0.0f, false, {{m, m}, {-m, 1.75f}, {p2(-12), p2(-13)}}), 7905.0f * p2(-14) + p2(-25));
}

// A dot product is the chain of steps, the first with scale-d = 0; a partial last step
// equals one padded with zeros; the chain differs from one long exact sum.
TEST(TensorCoreModel, DotIsAChainOfSteps) {
  const StepRule& r = kHopperE4M3;
  std::vector<float> a(96, 0.0f), b(96, 1.0f);
  a[0] = 1.0f;
  a[33] = a[34] = b[33] = b[34] = p2(-7);  // two 2^-14 terms in step 1: cut against the accumulator 1.0
  a[70] = 3.0f;
  const float s0 = mma_step(r, 0.0f, false, a.data(), b.data());
  const float s1 = mma_step(r, s0, true, a.data() + 32, b.data() + 32);
  const float s2 = mma_step(r, s1, true, a.data() + 64, b.data() + 64);
  EXPECT_SAME(mma_dot(r, a.data(), b.data(), 96), s2);
  EXPECT_SAME(s2, 4.0f);
  EXPECT_SAME(mma_dot(r, a.data(), b.data(), 71), s2);  // 71 = 2 steps + a padded one
  // Strided b: a column of a row-major [n][4] matrix.
  std::vector<float> bm(96 * 4, 0.0f);
  for (int i = 0; i < 96; ++i) bm[size_t(i) * 4 + 2] = b[i];
  EXPECT_SAME(mma_dot(r, a.data(), bm.data() + 2, 96, 4), s2);
}

}  // namespace
}  // namespace tc
}  // namespace ref
}  // namespace flamia
