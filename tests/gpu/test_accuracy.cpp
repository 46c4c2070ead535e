// GPU = specification, and GPU vs float64 exact, over recipes x head dims x GQA x masking,
// and over the shapes where tiling and packing go wrong (lengths around tile edges, primes,
// many tiny documents, one long document, empty documents).
#if defined(FLAMIA_WITH_CUDA)

#include <ostream>
#include <random>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "checks.h"

namespace flamia_gpu_test {
namespace {

// Lengths on both sides of the 64-token tile edges, primes, and a few multi-tile documents.
// 1351 tokens: keeps the CPU specification of each case to about a second.
const std::vector<int> kMixedLengths = {1, 2, 3, 63, 64, 65, 127, 129, 131, 257, 509};

// ---- recipe x D x GQA x causal --------------------------------------------------------------

using MatrixParam = std::tuple<flamia_recipe, int /*D*/, int /*gqa ratio*/, bool /*causal*/>;

class Matrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(Matrix, MatchesSpecAndExact) {
  const auto [recipe, d, ratio, causal] = GetParam();
  Case c;
  c.cu = cu_from_lengths(kMixedLengths);
  c.recipe = recipe;
  c.d = d;
  c.hkv = ratio == 1 ? 4 : 2;
  c.hq = c.hkv * ratio;
  c.causal = causal;
  CheckOptions opt;
  opt.seed = 100 + d + 10 * ratio + (causal ? 1 : 0) + 1000 * int(recipe);
  check_against_references(c, opt);
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [recipe, d, ratio, causal] = info.param;
  return std::string(recipe_name(recipe)) + "_D" + std::to_string(d) + "_gqa" + std::to_string(ratio) +
         (causal ? "_causal" : "_full");
}

INSTANTIATE_TEST_SUITE_P(Gpu, Matrix,
                         ::testing::Combine(::testing::Values(FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4),
                                            ::testing::Values(true, false)),
                         matrix_name);

// ---- shapes -----------------------------------------------------------------------------------

struct ShapeParam {
  std::string name;
  Case c;
  bool exact;
};

// How gtest prints the parameter (instead of its bytes).
void PrintTo(const ShapeParam& p, std::ostream* os) { *os << p.name << ": " << p.c.describe(); }

std::vector<int> short_docs(int n, int max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> len(1, max_len);
  std::vector<int> out(n);
  for (int& l : out) l = len(rng);
  return out;
}

Case make_case(std::vector<int32_t> cu, flamia_recipe r, int d, int hq, int hkv, bool causal) {
  Case c;
  c.cu = std::move(cu);
  c.recipe = r;
  c.d = d;
  c.hq = hq;
  c.hkv = hkv;
  c.causal = causal;
  return c;
}

std::vector<ShapeParam> shape_params() {
  const auto fp8 = FLAMIA_RECIPE_FP8, mixed = FLAMIA_RECIPE_FP8_MIXED;
  const std::vector<int> primes = {2, 3, 5, 7, 11, 13, 17, 31, 61, 67, 97, 193, 251, 509, 1021};
  // Empty documents: repeated cu_seqlens values, at the start, in the middle and at the end.
  const std::vector<int32_t> empty_cu = {0, 0, 5, 5, 5, 70, 200, 200, 331, 331};
  std::vector<ShapeParam> p;
  p.push_back({"Small_tiny_docs_fp8", make_case(cu_from_lengths({1, 2, 3, 17, 70}), fp8, 64, 2, 1, true), true});
  p.push_back({"Small_tiny_docs_mixed_D128",
               make_case(cu_from_lengths({3, 65, 1, 66}), mixed, 128, 2, 2, true), true});
  p.push_back({"edges_fp8_D128", make_case(cu_from_lengths({1, 2, 3, 63, 64, 65, 127, 129}), fp8, 128, 4, 1, true),
               true});
  p.push_back({"edges_mixed_D64_full",
               make_case(cu_from_lengths({1, 2, 3, 63, 64, 65, 127, 129}), mixed, 64, 4, 4, false), true});
  p.push_back({"primes_fp8_D64", make_case(cu_from_lengths(primes), fp8, 64, 4, 2, true), true});
  // Around the D = 64 forward's 192-row items: its three 64-row consumers see different key
  // tile counts on the diagonal, and the later ones none where the document ends early.
  const std::vector<int> edges192 = {63, 64, 65, 128, 129, 191, 192, 193, 255, 256, 257, 320, 383, 384, 385, 449, 577};
  p.push_back({"edges192_fp8_D64", make_case(cu_from_lengths(edges192), fp8, 64, 4, 2, true), true});
  p.push_back({"edges192_mixed_D64_full", make_case(cu_from_lengths(edges192), mixed, 64, 2, 1, false), true});
  p.push_back({"primes_mixed_D128_full", make_case(cu_from_lengths(primes), mixed, 128, 2, 2, false), false});
  p.push_back({"short300_fp8_D128", make_case(cu_from_lengths(short_docs(300, 40, 7)), fp8, 128, 4, 2, true), true});
  p.push_back({"short300_mixed_D64", make_case(cu_from_lengths(short_docs(300, 40, 8)), mixed, 64, 8, 2, true),
               false});
  p.push_back({"empty_docs_fp8_D128", make_case(empty_cu, fp8, 128, 4, 2, true), true});
  p.push_back({"empty_docs_mixed_D64_full", make_case(empty_cu, mixed, 64, 4, 1, false), true});
  // One long document: long reductions (P.V over 4096 keys, dK/dV over 64 query tiles) are
  // where a tensor-core accumulation narrower than FP32 would show (DESIGN §4).
  p.push_back({"long4096_fp8_D128", make_case(cu_from_lengths({4096}), fp8, 128, 2, 2, true), false});
  p.push_back({"long3000_mixed_D64_gqa", make_case(cu_from_lengths({3000}), mixed, 64, 4, 2, true), false});
  return p;
}

class Shapes : public ::testing::TestWithParam<ShapeParam> {};

TEST_P(Shapes, MatchesSpec) {
  CheckOptions opt;
  opt.exact = GetParam().exact;
  opt.seed = 77;
  check_against_references(GetParam().c, opt);
}

INSTANTIATE_TEST_SUITE_P(Gpu, Shapes, ::testing::ValuesIn(shape_params()),
                         [](const ::testing::TestParamInfo<ShapeParam>& info) { return info.param.name; });

// ---- P's scale at huge logits ------------------------------------------------------------------

// q = k = x e0 per token, x with 4 significant bits in [2^13, 2^15): S = x_i x_j exactly (E4M3
// and any accumulation), S c ~2^23-2^27, where m c's rounding moves pm = exp2(fmaf(m, c,
// -fl(m c))) anywhere between 2^-8 and 2^8 (ALGORITHM.md §2 step 5). Rows past the first 128
// of each document see whole key tiles, where the fast forward uses the tile's sigma only when
// every row of the warp has pm in [0.917, 1.415] (fwd_softmax.cuh; inside (0.875, 1.75]); a
// row left at the tile's sigma with pm > 1.75 saturates P8 and its O leaves the
// specification's (a probe that always took the tile's sigma failed here).
TEST(GpuHugeLogits, RowSigmaOnWholeTilesMatchesSpec) {
  for (int d : {64, 128}) {
    const Case c = make_case(cu_from_lengths({300, 257}), FLAMIA_RECIPE_FP8, d, 2, 1, true);
    Inputs in = make_inputs(c, 77 + d);
    std::mt19937 rng(5 + d);
    for (int64_t t = 0; t < c.tokens(); ++t) {
      const float x = std::ldexp(float(8 + rng() % 8), 10 + int(rng() % 2));
      for (int e = 0; e < d; ++e) {
        for (int h = 0; h < c.hq; ++h) in.q[(size_t(t) * c.hq + h) * d + e] = bf16(e == 0 ? x : 0.0f);
        in.k[size_t(t) * c.hkv * d + e] = bf16(e == 0 ? x : 0.0f);
      }
    }
    CheckOptions opt;
    opt.exact = false;
    opt.backward = false;  // P = exp2(S c - LSE) at these logits: LargeLogits's part
    opt.inputs = &in;
    check_against_references(c, opt);
  }
}

// ---- the lazy reference moving on later tiles -------------------------------------------------

// q and k carry a ramp r_t on element 0 (r from 2 to 40 over each document) beside their
// random values, so row i's scores grow along its keys by about r_i * 4.75 * c in exp2's
// argument a 128-key tile of the 1024-token document (more in the 300-token one): past the
// lazy reference's threshold of 3 for all but its first rows, whose reference then moves on
// every tile. So every unmasked later tile of the fast forward takes its lazy pass, finds a
// row that moved and takes the tile again with its maxima first (fwd_softmax.cuh), which the
// other cases' inputs rarely make it do.
TEST(GpuLazyReference, MovesOnLaterTilesMatchSpec) {
  for (int d : {64, 128})
    for (bool causal : {true, false}) {
      const Case c = make_case(cu_from_lengths({1024, 300}), FLAMIA_RECIPE_FP8, d, 2, 1, causal);
      Inputs in = make_inputs(c, 91 + d);
      int64_t t0 = 0;
      for (size_t doc = 0; doc + 1 < c.cu.size(); ++doc) {
        const int len = c.cu[doc + 1] - c.cu[doc];
        for (int i = 0; i < len; ++i, ++t0) {
          const float r = 2.0f + 38.0f * float(i) / float(len);
          for (int h = 0; h < c.hq; ++h) in.q[(size_t(t0) * c.hq + h) * d] = bf16(r);
          in.k[size_t(t0) * c.hkv * d] = bf16(r);
        }
      }
      CheckOptions opt;
      opt.exact = false;
      opt.backward = false;
      opt.inputs = &in;
      check_against_references(c, opt);
    }
}

// ---- softmax_scale ----------------------------------------------------------------------------

// softmax_scale = 0 selects 1/sqrt(D): for D = 64 that is exactly 0.125, so the two calls must
// agree bitwise. A non-default scale goes through the specification comparison.
TEST(GpuScale, SmallDefaultScaleIsOneOverSqrtD) {
  Case c = make_case(cu_from_lengths({70, 33}), FLAMIA_RECIPE_FP8, 64, 2, 1, true);
  const Inputs in = make_inputs(c, 5);
  GpuRunner r(c);
  FwdResult explicit_scale, default_scale;
  BwdResult b1, b2;
  ASSERT_EQ(r.forward_backward(in, &explicit_scale, &b1), FLAMIA_SUCCESS) << flamia_last_error();
  flamia_attention_args a = r.args();
  a.softmax_scale = 0.0f;
  ASSERT_EQ(r.step(a, r.dout_view(), true, &default_scale, &b2), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(explicit_scale.o, default_scale.o);
  EXPECT_EQ(explicit_scale.lse, default_scale.lse);
  EXPECT_EQ(b1.dq, b2.dq);
  EXPECT_EQ(b1.dk, b2.dk);
  EXPECT_EQ(b1.dv, b2.dv);
}

TEST(GpuScale, CustomScaleMatchesSpec) {
  Case c = make_case(cu_from_lengths({200, 65, 300}), FLAMIA_RECIPE_FP8, 128, 4, 2, true);
  c.softmax_scale = 0.21f;
  // 2.4x the default scale sharpens the softmax and raises the FP8 error against float64
  // (O 0.064, dQ 0.092 in the specification) beyond the default-scale bounds of
  // NUMERICS.md; only the specification comparison is asserted here.
  CheckOptions opt;
  opt.exact = false;
  check_against_references(c, opt);
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
