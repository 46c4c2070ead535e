// NaN/Inf in one document (DESIGN §2: not laundered into finite garbage): the affected
// document's outputs carry non-finite values, every other document is bit-identical to a
// clean run and finite, and (causal) positions before the bad token are untouched.
#if defined(FLAMIA_WITH_CUDA)

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

enum class Where { Q, K, V, Dout };
const char* where_name(Where w) {
  return w == Where::Q ? "q" : w == Where::K ? "k" : w == Where::V ? "v" : "dout";
}

struct Bad {
  Where where;
  float value;
  const char* name;
};

// doc, pos: the bad token. Inside a document's first tile (pos 50 of document 1), or at the
// start of a document whose first tokens the previous document's last tile also holds (the
// fp8_mixed backward reads the BF16 rows of a tile as they are: bwd_natural_rows.cuh).
void run_nonfinite(const Case& c, const Bad& bad, int doc, int pos) {
  ASSERT_GT(c.doc_len(doc), pos);
  const int64_t d0 = c.cu[doc], d1 = c.cu[doc + 1], t = d0 + pos;
  const std::string what = c.describe() + ", " + bad.name + " in " + where_name(bad.where) + " at token " +
                           std::to_string(t);

  const Inputs clean = make_inputs(c, 61);
  Inputs in = clean;
  const int heads = (bad.where == Where::K || bad.where == Where::V) ? c.hkv : c.hq;
  std::vector<uint16_t>& x = bad.where == Where::Q ? in.q : bad.where == Where::K ? in.k
                             : bad.where == Where::V ? in.v : in.dout;
  x[(size_t(t) * heads + 0) * c.d + 5] = bf16(bad.value);  // head 0, one element

  GpuRunner r(c);
  FwdResult f0, f;
  BwdResult b0, b;
  ASSERT_EQ(r.forward_backward(clean, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(r.forward_backward(in, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
  {
    // The forward that quantizes by itself (qkv8_filled = 0, fp8_mixed's non-finite flag
    // included) and the backward on what it leaves in qkv8: the same bits.
    FwdResult fq;
    BwdResult bq;
    ASSERT_EQ(r.forward_self_quantizing(in, &fq), FLAMIA_SUCCESS) << flamia_last_error();
    ASSERT_EQ(r.backward_after_forward(&bq), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(fq.o, f.o) << what << ": O of the quantizing forward";
    EXPECT_TRUE(lse_rows_equal(fq.lse, f.lse, c.tokens(), c.hq, 0, c.tokens()))
        << what << ": LSE of the quantizing forward (bits)";
    EXPECT_EQ(bq.dq, b.dq) << what << ": dQ after the quantizing forward";
    EXPECT_EQ(bq.dk, b.dk) << what << ": dK after the quantizing forward";
    EXPECT_EQ(bq.dv, b.dv) << what << ": dV after the quantizing forward";
  }

  // Other documents: bit-identical to the clean run, and finite.
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, d0}, std::pair<int64_t, int64_t>{d1, c.tokens()}}) {
    EXPECT_TRUE(rows_equal(f.o, f0.o, c.hq, c.d, t0, t1)) << what << ": O of another document changed";
    EXPECT_TRUE(lse_rows_equal(f.lse, f0.lse, c.tokens(), c.hq, t0, t1)) << what << ": LSE of another document";
    EXPECT_TRUE(rows_equal(b.dq, b0.dq, c.hq, c.d, t0, t1)) << what << ": dQ of another document";
    EXPECT_TRUE(rows_equal(b.dk, b0.dk, c.hkv, c.d, t0, t1)) << what << ": dK of another document";
    EXPECT_TRUE(rows_equal(b.dv, b0.dv, c.hkv, c.d, t0, t1)) << what << ": dV of another document";
    EXPECT_EQ(count_nonfinite_rows(f.o, c.hq, c.d, t0, t1), 0) << what;
    EXPECT_EQ(count_nonfinite_lse(f.lse, c.tokens(), c.hq, t0, t1), 0) << what;
    EXPECT_EQ(count_nonfinite_rows(b.dq, c.hq, c.d, t0, t1), 0) << what;
    EXPECT_EQ(count_nonfinite_rows(b.dk, c.hkv, c.d, t0, t1), 0) << what;
    EXPECT_EQ(count_nonfinite_rows(b.dv, c.hkv, c.d, t0, t1), 0) << what;
  }

  // The affected document: the bad value shows.
  const int64_t grads_bad = count_nonfinite_rows(b.dq, c.hq, c.d, d0, d1) +
                            count_nonfinite_rows(b.dk, c.hkv, c.d, d0, d1) +
                            count_nonfinite_rows(b.dv, c.hkv, c.d, d0, d1);
  EXPECT_GT(grads_bad, 0) << what << ": no non-finite gradient in the affected document";
  if (bad.where == Where::Dout) {
    EXPECT_EQ(f.o, f0.o) << what << ": dO must not change the forward";
    EXPECT_EQ(f.lse, f0.lse) << what;
  } else {
    EXPECT_GT(count_nonfinite_rows(f.o, c.hq, c.d, d0, d1), 0) << what << ": no non-finite O in the document";
  }

  // Causal: positions before the bad token cannot see it.
  if (c.causal) {
    EXPECT_TRUE(rows_equal(f.o, f0.o, c.hq, c.d, d0, t)) << what << ": O before the bad token changed";
    EXPECT_TRUE(lse_rows_equal(f.lse, f0.lse, c.tokens(), c.hq, d0, t)) << what << ": LSE before the bad token";
    EXPECT_TRUE(rows_equal(b.dq, b0.dq, c.hq, c.d, d0, t)) << what << ": dQ before the bad token changed";
  }
}

const Bad kBad[] = {
    {Where::Q, std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {Where::K, std::numeric_limits<float>::infinity(), "+Inf"},
    {Where::K, std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {Where::V, -std::numeric_limits<float>::infinity(), "-Inf"},
    {Where::V, std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {Where::Dout, std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {Where::Dout, std::numeric_limits<float>::infinity(), "+Inf"},
};

using Param = std::tuple<flamia_recipe, int /*D*/, bool /*causal*/>;

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [recipe, d, causal] = info.param;
  return std::string(recipe_name(recipe)) + "_D" + std::to_string(d) + (causal ? "_causal" : "_full");
}

class NonFinite : public ::testing::TestWithParam<Param> {};

TEST_P(NonFinite, ConfinedToItsDocument) {
  const auto [recipe, d, causal] = GetParam();
  Case c;
  c.cu = cu_from_lengths({100, 200, 150});
  c.recipe = recipe;
  c.d = d;
  c.hq = 4;
  c.hkv = 2;
  c.causal = causal;
  for (const Bad& bad : kBad) {
    run_nonfinite(c, bad, 1, 50);
    run_nonfinite(c, bad, 2, 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, NonFinite,
                         ::testing::Combine(::testing::Values(FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED),
                                            ::testing::Values(64, 128), ::testing::Values(true, false)),
                         param_name);

TEST(NonFiniteSmall, ConfinedToItsDocument) {
  Case c;
  c.cu = cu_from_lengths({20, 70, 10});
  c.recipe = FLAMIA_RECIPE_FP8;
  c.d = 128;
  c.hq = 2;
  c.hkv = 1;
  run_nonfinite(c, kBad[0], 1, 50);
  run_nonfinite(c, kBad[3], 1, 50);
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
