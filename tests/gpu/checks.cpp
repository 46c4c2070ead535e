// GPU vs specification and GPU vs float64 exact (see checks.h).
#if defined(FLAMIA_WITH_CUDA)

#include "checks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

namespace flamia_gpu_test {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Per-row allowance for O: an FP8 flip of p8_j moves O[i] by at most 2^-3 * (p_j / l) * |v_j|,
// and all flips of a row together by at most 2^-3 * max_j |v_j| over the row's visible keys.
// max over the document's v rows (of the kv head) bounds that from above.
std::vector<double> o_flip_allowance(const Case& c, const Inputs& in) {
  const int G = c.hq / c.hkv;
  std::vector<double> extra(size_t(c.tokens()) * c.hq, 0.0);
  for (int b = 0; b < c.num_docs(); ++b) {
    for (int g = 0; g < c.hkv; ++g) {
      double vmax = 0;
      for (int64_t t = c.cu[b]; t < c.cu[b + 1]; ++t)
        for (int i = 0; i < c.d; ++i)
          vmax = std::max(vmax, double(std::fabs(f32(in.v[(size_t(t) * c.hkv + g) * c.d + i]))));
      for (int64_t t = c.cu[b]; t < c.cu[b + 1]; ++t)
        for (int h = g * G; h < (g + 1) * G; ++h) extra[size_t(t) * c.hq + h] = vmax / 8.0;
    }
  }
  return extra;
}

void expect_rows(const char* what, const RowStats& s, double rel_l2_max, double soft_fraction,
                 const Case& c) {
  const int64_t soft_allowed = std::max<int64_t>(4, int64_t(soft_fraction * double(s.rows)));
  EXPECT_LE(s.rel_l2, rel_l2_max) << what << " vs spec, " << c.describe() << ": " << s.summary();
  EXPECT_LE(s.rows_over_soft, soft_allowed) << what << " vs spec, " << c.describe() << ": " << s.summary();
  EXPECT_LE(s.worst_row_ratio, 1.0) << what << " vs spec, " << c.describe() << ": " << s.summary();
}

}  // namespace

void check_against_references(const Case& c, const CheckOptions& opt) {
  const Inputs in = opt.inputs ? *opt.inputs : make_inputs(c, opt.seed);
  GpuRunner gpu(c);
  FwdResult g_fwd;
  BwdResult g_bwd;
  // Forward first and on its own, so that a failing backward does not hide the forward's result.
  ASSERT_EQ(gpu.forward(in, &g_fwd), FLAMIA_SUCCESS) << "forward, " << c.describe() << ": " << flamia_last_error();
  // Poisoned with NaN before the run; finite inputs: every element must have been written.
  EXPECT_EQ(count_nonfinite(g_fwd.o), 0) << "O not fully written / non-finite, " << c.describe();
  EXPECT_EQ(count_nonfinite(g_fwd.lse), 0) << "LSE not fully written / non-finite, " << c.describe();
  flamia_status bwd_status = FLAMIA_SUCCESS;
  if (opt.backward) {
    bwd_status = gpu.backward_after_forward(&g_bwd);
    EXPECT_EQ(bwd_status, FLAMIA_SUCCESS) << "backward, " << c.describe() << ": " << flamia_last_error();
    if (bwd_status == FLAMIA_SUCCESS) {
      EXPECT_EQ(count_nonfinite(g_bwd.dq), 0) << "dQ not fully written / non-finite, " << c.describe();
      EXPECT_EQ(count_nonfinite(g_bwd.dk), 0) << "dK not fully written / non-finite, " << c.describe();
      EXPECT_EQ(count_nonfinite(g_bwd.dv), 0) << "dV not fully written / non-finite, " << c.describe();
    }
  }
  const bool backward = opt.backward && bwd_status == FLAMIA_SUCCESS;

  // --- specification ---------------------------------------------------------------------
  auto t0 = std::chrono::steady_clock::now();
  FwdResult s_fwd;
  spec_forward(c, in, &s_fwd);
  const auto extra = o_flip_allowance(c, in);
  const RowStats o = compare_rows(g_fwd.o, s_fwd.o, c.hq, c.d, c.cu, opt.spec.o_rows, &extra);
  const double lse_diff = max_abs_diff(g_fwd.lse, s_fwd.lse);
  // The tensor core's error in S is relative to the products' size, i.e. to the logits.
  const double lse_tol =
      opt.spec.lse_max_abs * std::max(1.0, double(c.resolved_scale()) * std::sqrt(double(c.d)));
  expect_rows("O", o, opt.spec.o_rel_l2, opt.spec.o_soft_fraction, c);
  EXPECT_LE(lse_diff, lse_tol) << "LSE vs spec, " << c.describe();
  std::printf("[spec]  %s\n        O: %s\n        LSE max|diff| %.3g\n", c.describe().c_str(),
              o.summary().c_str(), lse_diff);
  if (backward) {
    // The specification's backward is given the GPU's O and LSE: this isolates the backward
    // kernels (the forward was compared just above).
    BwdResult s_bwd;
    spec_backward(c, in, g_fwd, &s_bwd);
    const RowStats dq = compare_rows(g_bwd.dq, s_bwd.dq, c.hq, c.d, c.cu, opt.spec.grad_rows);
    const RowStats dk = compare_rows(g_bwd.dk, s_bwd.dk, c.hkv, c.d, c.cu, opt.spec.grad_rows);
    const RowStats dv = compare_rows(g_bwd.dv, s_bwd.dv, c.hkv, c.d, c.cu, opt.spec.grad_rows);
    expect_rows("dQ", dq, opt.spec.grad_rel_l2, opt.spec.grad_soft_fraction, c);
    expect_rows("dK", dk, opt.spec.grad_rel_l2, opt.spec.grad_soft_fraction, c);
    expect_rows("dV", dv, opt.spec.grad_rel_l2, opt.spec.grad_soft_fraction, c);
    std::printf("        dQ: %s\n        dK: %s\n        dV: %s\n", dq.summary().c_str(), dk.summary().c_str(),
                dv.summary().c_str());
  }
  std::printf("        (CPU specification: %.1f s)\n", seconds_since(t0));

  // --- float64 exact ---------------------------------------------------------------------
  if (opt.exact) {
    t0 = std::chrono::steady_clock::now();
    ExactResult ex;
    exact_forward_backward(c, in, &ex);
    const ExactTolerance tol = opt.exact_bounds_from_recipe ? ExactTolerance::for_recipe(c.recipe) : opt.ex;
    const double eo = rel_l2(g_fwd.o, ex.o), e_lse = rel_l2(g_fwd.lse, ex.lse);
    EXPECT_LT(eo, tol.o) << "O vs exact, " << c.describe();
    std::printf("[exact] %s\n        O relL2 %.4f, LSE %.2e", c.describe().c_str(), eo, e_lse);
    if (backward) {
      const double edq = rel_l2(g_bwd.dq, ex.dq), edk = rel_l2(g_bwd.dk, ex.dk), edv = rel_l2(g_bwd.dv, ex.dv);
      EXPECT_LT(edq, tol.dq) << "dQ vs exact, " << c.describe();
      EXPECT_LT(edk, tol.dk) << "dK vs exact, " << c.describe();
      EXPECT_LT(edv, tol.dv) << "dV vs exact, " << c.describe();
      std::printf(", dQ %.4f, dK %.4f, dV %.4f", edq, edk, edv);
    }
    std::printf("  (%.1f s)\n", seconds_since(t0));
  }
  std::fflush(stdout);
}

}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
