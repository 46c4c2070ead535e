// Exact float64 attention: closed-form cases and gradients against central finite
// differences (packed documents, causal and not, GQA).
#include <cmath>
#include <random>
#include <vector>

#include "test_util.h"

namespace flamia {
namespace ref {
namespace testing {
namespace {

struct DoubleInputs {
  Problem p;
  std::vector<double> q, k, v, dout;
};

DoubleInputs random_inputs(const std::vector<int>& lengths, int hq, int hkv, int dim, bool causal,
                           uint64_t seed) {
  DoubleInputs in;
  in.p = make_problem(lengths, hq, hkv, dim, causal);
  const size_t T = size_t(in.p.total_tokens);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  auto fill = [&](std::vector<double>& x, size_t n) {
    x.resize(n);
    for (double& e : x) e = n01(rng);
  };
  fill(in.q, T * hq * dim);
  fill(in.k, T * hkv * dim);
  fill(in.v, T * hkv * dim);
  fill(in.dout, T * hq * dim);
  return in;
}

// The scalar loss whose gradient exact_backward computes: sum(out * dout).
double loss(const DoubleInputs& in) {
  std::vector<double> out(in.q.size()), lse(size_t(in.p.total_tokens) * in.p.hq);
  exact_forward(in.p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  double s = 0.0;
  for (size_t e = 0; e < out.size(); ++e) s += out[e] * in.dout[e];
  return s;
}

// Compares one analytic gradient with central differences of the loss in every element.
void expect_matches_finite_differences(DoubleInputs in, std::vector<double> DoubleInputs::*tensor,
                                       const std::vector<double>& grad, const char* name) {
  const double h = 1e-5;
  double max_err = 0.0, max_grad = 0.0;
  std::vector<double>& x = in.*tensor;
  for (size_t e = 0; e < x.size(); ++e) {
    const double x0 = x[e];
    x[e] = x0 + h;
    const double up = loss(in);
    x[e] = x0 - h;
    const double down = loss(in);
    x[e] = x0;
    const double fd = (up - down) / (2.0 * h);
    max_err = std::max(max_err, std::fabs(fd - grad[e]));
    max_grad = std::max(max_grad, std::fabs(grad[e]));
  }
  EXPECT_GT(max_grad, 1e-3) << name << ": gradient unexpectedly zero";
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad)) << name << " max |fd - analytic| = " << max_err;
}

void check_gradients(const std::vector<int>& lengths, int hq, int hkv, int dim, bool causal, uint64_t seed) {
  const DoubleInputs in = random_inputs(lengths, hq, hkv, dim, causal, seed);
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  exact_backward(in.p, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq.data(), dk.data(), dv.data());
  expect_matches_finite_differences(in, &DoubleInputs::q, dq, "dq");
  expect_matches_finite_differences(in, &DoubleInputs::k, dk, "dk");
  expect_matches_finite_differences(in, &DoubleInputs::v, dv, "dv");
}

TEST(ExactReference, GradientsMatchFiniteDifferencesCausalGqa) {
  check_gradients({3, 1, 5, 4}, 4, 2, 8, true, 11);
}

TEST(ExactReference, GradientsMatchFiniteDifferencesNonCausalGqa) {
  check_gradients({3, 1, 5, 4}, 4, 2, 8, false, 12);
}

TEST(ExactReference, GradientsMatchFiniteDifferencesMqaAndMha) {
  check_gradients({6, 2}, 3, 1, 4, true, 13);   // MQA: three query heads share one kv head
  check_gradients({2, 7}, 2, 2, 4, false, 14);  // MHA
}

TEST(ExactReference, SingleTokenDocumentReturnsItsValue) {
  const DoubleInputs in = random_inputs({1, 1, 1}, 2, 1, 4, true, 5);
  std::vector<double> out(in.q.size()), lse(6);
  exact_forward(in.p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < 4; ++d) {
        EXPECT_DOUBLE_EQ(out[(t * 2 + h) * 4 + d], in.v[t * 4 + d]);
        double s = 0.0;
        for (int e = 0; e < 4; ++e) s += in.q[(t * 2 + h) * 4 + e] * in.k[t * 4 + e];
        EXPECT_NEAR(lse[h * 3 + t], s * in.p.softmax_scale, 1e-12);  // natural-log LSE of one logit
      }
}

TEST(ExactReference, ZeroQueriesAverageTheVisibleValues) {
  DoubleInputs in = random_inputs({5, 3}, 1, 1, 4, true, 6);
  std::fill(in.q.begin(), in.q.end(), 0.0);
  std::vector<double> out(in.q.size()), lse(8);
  exact_forward(in.p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  for (int b = 0; b < 2; ++b) {
    const int base = in.p.cu_seqlens[b], L = in.p.cu_seqlens[b + 1] - base;
    for (int i = 0; i < L; ++i) {
      EXPECT_NEAR(lse[base + i], std::log(double(i + 1)), 1e-12);  // causal: i + 1 keys
      for (int d = 0; d < 4; ++d) {
        double mean = 0.0;
        for (int j = 0; j <= i; ++j) mean += in.v[(base + j) * 4 + d];
        EXPECT_NEAR(out[(base + i) * 4 + d], mean / (i + 1), 1e-12);
      }
    }
  }
}

// GQA is MHA with each kv head repeated for its query heads; dK/dV sum over the group.
TEST(ExactReference, GqaEqualsMhaWithRepeatedKv) {
  const DoubleInputs g = random_inputs({4, 6}, 4, 2, 8, true, 7);
  DoubleInputs m = g;
  m.p.hkv = 4;
  const size_t T = size_t(g.p.total_tokens), D = 8;
  m.k.resize(T * 4 * D);
  m.v.resize(T * 4 * D);
  for (size_t t = 0; t < T; ++t)
    for (size_t h = 0; h < 4; ++h)
      for (size_t d = 0; d < D; ++d) {
        m.k[(t * 4 + h) * D + d] = g.k[(t * 2 + h / 2) * D + d];
        m.v[(t * 4 + h) * D + d] = g.v[(t * 2 + h / 2) * D + d];
      }
  std::vector<double> og(g.q.size()), om(g.q.size()), lg(T * 4), lm(T * 4);
  exact_forward(g.p, g.q.data(), g.k.data(), g.v.data(), og.data(), lg.data());
  exact_forward(m.p, m.q.data(), m.k.data(), m.v.data(), om.data(), lm.data());
  for (size_t e = 0; e < og.size(); ++e) EXPECT_NEAR(og[e], om[e], 1e-12);
  for (size_t e = 0; e < lg.size(); ++e) EXPECT_NEAR(lg[e], lm[e], 1e-12);
  std::vector<double> dqg(g.q.size()), dkg(g.k.size()), dvg(g.v.size());
  std::vector<double> dqm(m.q.size()), dkm(m.k.size()), dvm(m.v.size());
  exact_backward(g.p, g.q.data(), g.k.data(), g.v.data(), g.dout.data(), dqg.data(), dkg.data(), dvg.data());
  exact_backward(m.p, m.q.data(), m.k.data(), m.v.data(), m.dout.data(), dqm.data(), dkm.data(), dvm.data());
  for (size_t e = 0; e < dqg.size(); ++e) EXPECT_NEAR(dqg[e], dqm[e], 1e-12);
  for (size_t t = 0; t < T; ++t)
    for (size_t h = 0; h < 2; ++h)
      for (size_t d = 0; d < D; ++d) {
        const size_t a = (t * 4 + 2 * h) * D + d, b = (t * 4 + 2 * h + 1) * D + d;
        EXPECT_NEAR(dkg[(t * 2 + h) * D + d], dkm[a] + dkm[b], 1e-12);
        EXPECT_NEAR(dvg[(t * 2 + h) * D + d], dvm[a] + dvm[b], 1e-12);
      }
}

}  // namespace
}  // namespace testing
}  // namespace ref
}  // namespace flamia
