// Bitwise properties on the GPU (DESIGN §3.1, §3.2): causal safety, document isolation and
// run-to-run determinism. The backward of this version has no atomics, so dQ/dK/dV are held
// to bitwise equality as well. Also: the self-quantizing forward equals quantize + forward,
// and strided q/k/v views of a fused qkv buffer give the same bits as dense tensors.
#if defined(FLAMIA_WITH_CUDA)

#include <cstring>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

using Param = std::tuple<flamia_recipe, int /*D*/, int /*gqa ratio*/>;

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [recipe, d, ratio] = info.param;
  return std::string(recipe_name(recipe)) + "_D" + std::to_string(d) + "_gqa" + std::to_string(ratio);
}

Case make(const std::vector<int>& lengths, const Param& p, bool causal) {
  const auto [recipe, d, ratio] = p;
  Case c;
  c.cu = cu_from_lengths(lengths);
  c.recipe = recipe;
  c.d = d;
  c.hkv = 2;
  c.hq = 2 * ratio;
  c.causal = causal;
  return c;
}

void expect_all_finite(const FwdResult& f, const BwdResult& b, const std::string& what) {
  EXPECT_EQ(count_nonfinite(f.o), 0) << what << ": O";
  EXPECT_EQ(count_nonfinite(f.lse), 0) << what << ": LSE";
  EXPECT_EQ(count_nonfinite(b.dq), 0) << what << ": dQ";
  EXPECT_EQ(count_nonfinite(b.dk), 0) << what << ": dK";
  EXPECT_EQ(count_nonfinite(b.dv), 0) << what << ": dV";
}

// Every output of tokens [t0, t1) is bit-identical between runs a and b.
void expect_doc_identical(const Case& c, const FwdResult& fa, const BwdResult& ba, const FwdResult& fb,
                          const BwdResult& bb, int64_t t0, int64_t t1, const std::string& what) {
  EXPECT_TRUE(rows_equal(fa.o, fb.o, c.hq, c.d, t0, t1)) << what << ": O of tokens [" << t0 << "," << t1 << ")";
  EXPECT_TRUE(lse_rows_equal(fa.lse, fb.lse, c.tokens(), c.hq, t0, t1)) << what << ": LSE";
  EXPECT_TRUE(rows_equal(ba.dq, bb.dq, c.hq, c.d, t0, t1)) << what << ": dQ";
  EXPECT_TRUE(rows_equal(ba.dk, bb.dk, c.hkv, c.d, t0, t1)) << what << ": dK";
  EXPECT_TRUE(rows_equal(ba.dv, bb.dv, c.hkv, c.d, t0, t1)) << what << ": dV";
}

const char* perturb_name(Perturb p) {
  return p == Perturb::Random ? "random" : p == Perturb::Huge ? "huge" : "tiny";
}

// ---- causal safety ------------------------------------------------------------------------

// For cut positions t inside document 1, replace q/k/v/dO of tokens t+1.. of that document
// (random, 3000x larger, 1e-4x smaller: the latter two change every per-token scale).
// O, LSE and dQ at positions <= t must stay bit-identical; all other documents entirely.
void run_causal_safety(const Case& c, const std::vector<int>& cuts) {
  const Inputs base = make_inputs(c, 11);
  GpuRunner r(c);
  FwdResult f0;
  BwdResult b0;
  ASSERT_EQ(r.forward_backward(base, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  expect_all_finite(f0, b0, "baseline " + c.describe());
  const int doc = 1;
  const int64_t d0 = c.cu[doc], d1 = c.cu[doc + 1];
  for (int t : cuts) {
    for (Perturb kind : {Perturb::Random, Perturb::Huge, Perturb::Tiny}) {
      const std::string what = c.describe() + ", cut " + std::to_string(t) + ", " + perturb_name(kind);
      Inputs in = base;
      const int64_t f0t = d0 + t + 1;  // first changed token
      const uint64_t s = 1000 + t * 3 + int(kind);
      perturb_rows(in.q, c.hq, c.d, f0t, d1, kind, s);
      perturb_rows(in.k, c.hkv, c.d, f0t, d1, kind, s + 1);
      perturb_rows(in.v, c.hkv, c.d, f0t, d1, kind, s + 2);
      perturb_rows(in.dout, c.hq, c.d, f0t, d1, kind, s + 3);
      FwdResult f;
      BwdResult b;
      ASSERT_EQ(r.forward_backward(in, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
      expect_all_finite(f, b, what);
      // The past of the cut, inside the document.
      EXPECT_TRUE(rows_equal(f.o, f0.o, c.hq, c.d, d0, f0t)) << what << ": O at positions <= t changed";
      EXPECT_TRUE(lse_rows_equal(f.lse, f0.lse, c.tokens(), c.hq, d0, f0t)) << what << ": LSE at <= t changed";
      EXPECT_TRUE(rows_equal(b.dq, b0.dq, c.hq, c.d, d0, f0t)) << what << ": dQ at positions <= t changed";
      // Every other document, every output.
      expect_doc_identical(c, f, b, f0, b0, 0, d0, what + " (documents before)");
      expect_doc_identical(c, f, b, f0, b0, d1, c.tokens(), what + " (documents after)");
      // The perturbation did reach the future (the test has teeth).
      if (f0t < d1) {
        EXPECT_FALSE(rows_equal(f.o, f0.o, c.hq, c.d, f0t, d1)) << what << ": future unchanged?";
      }
    }
  }
}

class CausalSafety : public ::testing::TestWithParam<Param> {};

TEST_P(CausalSafety, PastIsBitIdentical) {
  // Document 1 spans several 64-token tiles; cuts on both sides of tile edges.
  const Case c = make({300, 700, 77}, GetParam(), true);
  run_causal_safety(c, {0, 1, 62, 63, 64, 65, 127, 128, 333, 698});
}

TEST(CausalSafetySmall, PastIsBitIdentical) {
  const Case c = make({40, 130, 9}, Param{FLAMIA_RECIPE_FP8, 128, 2}, true);
  run_causal_safety(c, {0, 64, 100});
}

INSTANTIATE_TEST_SUITE_P(Gpu, CausalSafety,
                         ::testing::Combine(::testing::Values(FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4)),
                         param_name);

// ---- document isolation ---------------------------------------------------------------------

// Replace all of document b's q/k/v/dO (random, or 3000x louder: a loud neighbour must not
// push the others into subnormals). Every output of every other document stays bit-identical.
void run_isolation(const Case& c, const std::vector<int>& docs) {
  const Inputs base = make_inputs(c, 21);
  GpuRunner r(c);
  FwdResult f0;
  BwdResult b0;
  ASSERT_EQ(r.forward_backward(base, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  for (int doc : docs) {
    for (Perturb kind : {Perturb::Random, Perturb::Huge, Perturb::Tiny}) {
      const std::string what = c.describe() + ", doc " + std::to_string(doc) + " " + perturb_name(kind);
      const int64_t d0 = c.cu[doc], d1 = c.cu[doc + 1];
      Inputs in = base;
      const uint64_t s = 5000 + doc * 7 + int(kind);
      perturb_rows(in.q, c.hq, c.d, d0, d1, kind, s);
      perturb_rows(in.k, c.hkv, c.d, d0, d1, kind, s + 1);
      perturb_rows(in.v, c.hkv, c.d, d0, d1, kind, s + 2);
      perturb_rows(in.dout, c.hq, c.d, d0, d1, kind, s + 3);
      FwdResult f;
      BwdResult b;
      ASSERT_EQ(r.forward_backward(in, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
      expect_all_finite(f, b, what);
      expect_doc_identical(c, f, b, f0, b0, 0, d0, what + " (documents before)");
      expect_doc_identical(c, f, b, f0, b0, d1, c.tokens(), what + " (documents after)");
    }
  }
}

std::string isolation_name(const ::testing::TestParamInfo<std::tuple<Param, bool>>& info) {
  const auto [p, causal] = info.param;
  return param_name(::testing::TestParamInfo<Param>(p, info.index)) + (causal ? "_causal" : "_full");
}

class DocumentIsolation : public ::testing::TestWithParam<std::tuple<Param, bool>> {};

TEST_P(DocumentIsolation, OtherDocumentsBitIdentical) {
  const auto [p, causal] = GetParam();
  const Case c = make({129, 64, 1, 500, 3, 255, 66}, p, causal);
  run_isolation(c, {0, 2, 3, 6});
}

TEST(DocumentIsolationSmall, OtherDocumentsBitIdentical) {
  const Case c = make({65, 1, 70, 20}, Param{FLAMIA_RECIPE_FP8_MIXED, 64, 4}, true);
  run_isolation(c, {0, 1, 3});
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, DocumentIsolation,
    ::testing::Combine(::testing::Combine(::testing::Values(FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED),
                                          ::testing::Values(64, 128), ::testing::Values(1, 4)),
                       ::testing::Values(true, false)),
    isolation_name);

// ---- determinism --------------------------------------------------------------------------

void run_determinism(const Case& c) {
  const Inputs in = make_inputs(c, 31);
  GpuRunner r(c);
  FwdResult f1, f2, f3;
  BwdResult b1, b2;
  ASSERT_EQ(r.forward_backward(in, &f1, &b1), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(r.forward_backward(in, &f2, &b2), FLAMIA_SUCCESS) << flamia_last_error();
  expect_all_finite(f1, b1, c.describe());
  EXPECT_EQ(f1.o, f2.o) << "O differs run to run, " << c.describe();
  EXPECT_EQ(f1.lse, f2.lse) << "LSE differs run to run, " << c.describe();
  EXPECT_EQ(b1.dq, b2.dq) << "dQ differs run to run, " << c.describe();
  EXPECT_EQ(b1.dk, b2.dk) << "dK differs run to run, " << c.describe();
  EXPECT_EQ(b1.dv, b2.dv) << "dV differs run to run, " << c.describe();
  // The forward that quantizes by itself (qkv8_filled = 0) is the same function.
  ASSERT_EQ(r.forward_self_quantizing(in, &f3), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(f1.o, f3.o) << "forward(qkv8_filled=0) != quantize + forward(qkv8_filled=1), " << c.describe();
  EXPECT_EQ(f1.lse, f3.lse) << "LSE: forward(qkv8_filled=0) != quantize + forward, " << c.describe();
  // And what it leaves in qkv8 (poisoned before it) gives the backward the same gradients.
  BwdResult b3;
  ASSERT_EQ(r.backward_after_forward(&b3), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(b1.dq, b3.dq) << "dQ after forward(qkv8_filled=0) differs, " << c.describe();
  EXPECT_EQ(b1.dk, b3.dk) << "dK after forward(qkv8_filled=0) differs, " << c.describe();
  EXPECT_EQ(b1.dv, b3.dv) << "dV after forward(qkv8_filled=0) differs, " << c.describe();
  // Again on the same filled qkv8 (the last step's quantization), O and LSE poisoned first:
  // the fast forward takes its work items from a counter in qkv8, which every call's first
  // kernel must start from zero, or this call would skip items and leave poison behind.
  const size_t T = size_t(c.tokens());
  check_cuda(cudaMemsetAsync(r.out_view().data, 0xFF, T * c.hq * c.d * 2, r.stream()), "poison out");
  check_cuda(cudaMemsetAsync(r.lse_view().data, 0xFF, T * c.hq * 4, r.stream()), "poison lse");
  const flamia_attention_args a = r.args();
  ASSERT_EQ(flamia_forward(&a, r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), 1), FLAMIA_SUCCESS)
      << flamia_last_error();
  r.sync();
  FwdResult f4;
  r.download_fwd(&f4);
  EXPECT_EQ(f1.o, f4.o) << "a second forward on a filled qkv8 differs, " << c.describe();
  EXPECT_EQ(f1.lse, f4.lse) << "LSE: a second forward on a filled qkv8 differs, " << c.describe();
}

class Determinism : public ::testing::TestWithParam<Param> {};

TEST_P(Determinism, RepeatedRunsBitIdentical) {
  // Long enough for several CTAs per document and a persistent scheduler's reordering.
  run_determinism(make({2048, 1000, 37, 900, 111}, GetParam(), true));
  run_determinism(make({513, 1024}, GetParam(), false));
}

TEST(DeterminismSmall, RepeatedRunsBitIdentical) {
  run_determinism(make({130, 7, 64}, Param{FLAMIA_RECIPE_FP8, 64, 1}, true));
}

INSTANTIATE_TEST_SUITE_P(Gpu, Determinism,
                         ::testing::Combine(::testing::Values(FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4)),
                         param_name);

// ---- strided views ------------------------------------------------------------------------

// q, k, v as views of one fused [T, Hq + 2 Hkv, D] buffer (what a fused QKV projection
// produces): same bits as dense tensors.
void run_fused_views(const Case& c) {
  const Inputs in = make_inputs(c, 41);
  GpuRunner r(c);
  FwdResult f_dense, f_fused;
  BwdResult b_dense, b_fused;
  ASSERT_EQ(r.forward_backward(in, &f_dense, &b_dense), FLAMIA_SUCCESS) << flamia_last_error();

  const int64_t T = c.tokens();
  const int H = c.hq + 2 * c.hkv;
  std::vector<uint16_t> fused(size_t(T) * H * c.d);
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* row = &fused[size_t(t) * H * c.d];
    std::memcpy(row, &in.q[size_t(t) * c.hq * c.d], size_t(c.hq) * c.d * 2);
    std::memcpy(row + size_t(c.hq) * c.d, &in.k[size_t(t) * c.hkv * c.d], size_t(c.hkv) * c.d * 2);
    std::memcpy(row + size_t(c.hq + c.hkv) * c.d, &in.v[size_t(t) * c.hkv * c.d], size_t(c.hkv) * c.d * 2);
  }
  DeviceBuffer buf(fused.size() * 2);
  check_cuda(cudaMemcpy(buf.get(), fused.data(), fused.size() * 2, cudaMemcpyHostToDevice), "upload fused");
  flamia_attention_args a = r.args();
  auto strided = [&](int head_offset, int heads) {
    flamia_tensor t = view(static_cast<uint16_t*>(buf.get()) + size_t(head_offset) * c.d, FLAMIA_DTYPE_BF16,
                           {T, heads, c.d}, r.device());
    t.strides[0] = int64_t(H) * c.d;
    return t;
  };
  a.q = strided(0, c.hq);
  a.k = strided(c.hq, c.hkv);
  a.v = strided(c.hq + c.hkv, c.hkv);
  const flamia_status st = r.step(a, r.dout_view(), true, &f_fused, &b_fused);
  ASSERT_EQ(st, FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(f_dense.o, f_fused.o);
  EXPECT_EQ(f_dense.lse, f_fused.lse);
  EXPECT_EQ(b_dense.dq, b_fused.dq);
  EXPECT_EQ(b_dense.dk, b_fused.dk);
  EXPECT_EQ(b_dense.dv, b_fused.dv);
}

TEST(FusedQkvViewsSmall, SameBitsAsDense) {
  Case c = make({100, 29, 64}, Param{FLAMIA_RECIPE_FP8, 128, 4}, true);
  run_fused_views(c);
}

TEST(FusedQkvViews, SameBitsAsDenseD64Mixed) {
  Case c = make({300, 1, 250}, Param{FLAMIA_RECIPE_FP8_MIXED, 64, 1}, true);
  run_fused_views(c);
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
