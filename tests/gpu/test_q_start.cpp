// q_start on the GPU (flamia.h): a document's rows before q_start are keys only. Every
// computed row (O, LSE, dQ) is bitwise the row of the call without q_start; the rows before
// it are left as they were; dK/dV are bitwise the call without q_start whose dO and O rows
// before q_start are zero (their contributions vanish exactly); everything agrees with the
// specification with q_start; invalid values are reported by the device guard.
#if defined(FLAMIA_WITH_CUDA)

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "checks.h"
#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

using Param = std::tuple<flamia_recipe, int /*D*/, bool /*causal*/>;

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [recipe, d, causal] = info.param;
  return std::string(recipe_name(recipe)) + "_D" + std::to_string(d) + (causal ? "_causal" : "_full");
}

constexpr uint16_t kPoison16 = 0xFFFF;

// Documents long enough for several 128-query tiles before and after the first query;
// q_start = L (no queries) and 0 (all) included.
Case make(const Param& p) {
  const auto [recipe, d, causal] = p;
  Case c;
  c.cu = cu_from_lengths({700, 256, 93, 1100, 384});
  c.q_start = {384, 256, 0, 640, 0};
  c.recipe = recipe;
  c.d = d;
  c.hq = 4;
  c.hkv = 2;
  c.causal = causal;
  return c;
}

bool keys_only(const Case& c, int64_t t) {
  for (int b = 0; b < c.num_docs(); ++b)
    if (t >= c.cu[b] && t < c.cu[b + 1]) return t - c.cu[b] < c.q_start[size_t(b)];
  return false;
}

class QStart : public ::testing::TestWithParam<Param> {};

TEST_P(QStart, LaterRowsAsWithoutItEarlierRowsUntouched) {
  const Case c = make(GetParam());
  Case whole = c;
  whole.q_start.clear();
  const Inputs in = make_inputs(c, 99);
  FwdResult fw, fq;
  BwdResult bw, bq;
  GpuRunner rw(whole), rq(c);
  ASSERT_EQ(rw.forward_backward(in, &fw, &bw), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(rq.forward_backward(in, &fq, &bq), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error();

  const int64_t T = c.tokens();
  const size_t row = size_t(c.hq) * c.d;
  int64_t computed = 0;
  for (int64_t t = 0; t < T; ++t) {
    const bool ko = keys_only(c, t);
    computed += ko ? 0 : 1;
    for (size_t x = 0; x < row; ++x) {
      const size_t i = size_t(t) * row + x;
      ASSERT_EQ(fq.o[i], ko ? kPoison16 : fw.o[i]) << "O, token " << t << (ko ? " (keys only)" : "");
      ASSERT_EQ(bq.dq[i], ko ? kPoison16 : bw.dq[i]) << "dQ, token " << t << (ko ? " (keys only)" : "");
    }
    for (int h = 0; h < c.hq; ++h) {
      const size_t i = size_t(h) * size_t(T) + size_t(t);
      if (ko) ASSERT_TRUE(std::isnan(fq.lse[i])) << "LSE written for keys-only token " << t;
      else ASSERT_TRUE(lse_rows_equal(fq.lse, fw.lse, T, c.hq, t, t + 1)) << "LSE, token " << t;
    }
  }
  ASSERT_GT(computed, 0);
  ASSERT_LT(computed, T);

  // dK/dV: the whole call with the keys-only rows' dO and O zero, on the same O and LSE.
  Inputs zeroed = in;
  FwdResult fz = fw;
  for (int64_t t = 0; t < T; ++t)
    if (keys_only(c, t))
      for (size_t x = 0; x < row; ++x) zeroed.dout[size_t(t) * row + x] = fz.o[size_t(t) * row + x] = 0;
  GpuRunner rz(whole);
  FwdResult unused;
  ASSERT_EQ(rz.forward(zeroed, &unused), FLAMIA_SUCCESS);
  // The forward just wrote O; replace it by the zeroed copy before the backward reads it.
  check_cuda(cudaMemcpy(rz.out_view().data, fz.o.data(), fz.o.size() * 2, cudaMemcpyHostToDevice), "upload O");
  BwdResult bz;
  ASSERT_EQ(rz.backward_after_forward(&bz), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(bq.dk, bz.dk) << "dK: not the sum over the later queries alone";
  EXPECT_EQ(bq.dv, bz.dv) << "dV: not the sum over the later queries alone";
  EXPECT_NE(bq.dk, bw.dk) << "q_start must change dK (queries were left out)";
  EXPECT_EQ(count_nonfinite(bq.dk), 0);
  EXPECT_EQ(count_nonfinite(bq.dv), 0);

  // The specification with q_start, on the GPU's O and LSE (rows before q_start NaN there).
  FwdResult sf;
  BwdResult sb;
  spec_forward(c, in, &sf);
  spec_backward(c, in, fq, &sb);
  const SpecTolerance tol;
  std::vector<uint16_t> go, so, gdq, sdq;
  for (int64_t t = 0; t < T; ++t)
    if (!keys_only(c, t))
      for (size_t x = 0; x < row; ++x) {
        go.push_back(fq.o[size_t(t) * row + x]);
        so.push_back(sf.o[size_t(t) * row + x]);
        gdq.push_back(bq.dq[size_t(t) * row + x]);
        sdq.push_back(sb.dq[size_t(t) * row + x]);
      }
  EXPECT_LT(rel_l2(go, so), tol.o_rel_l2) << "O against the specification";
  EXPECT_LT(rel_l2(gdq, sdq), tol.grad_rel_l2) << "dQ against the specification";
  EXPECT_LT(rel_l2(bq.dk, sb.dk), tol.grad_rel_l2) << "dK against the specification";
  EXPECT_LT(rel_l2(bq.dv, sb.dv), tol.grad_rel_l2) << "dV against the specification";
}

INSTANTIATE_TEST_SUITE_P(GPU, QStart,
                         ::testing::Values(Param{FLAMIA_RECIPE_FP8, 128, true}, Param{FLAMIA_RECIPE_FP8, 64, true},
                                           Param{FLAMIA_RECIPE_FP8_MIXED, 128, true},
                                           Param{FLAMIA_RECIPE_FP8_MIXED, 64, false},
                                           // the dK/dV pass of three warpgroups (192-key tiles)
                                           Param{FLAMIA_RECIPE_FP8_MIXED, 64, true}),
                         param_name);

// An invalid device q_start: the call succeeds without a synchronisation, its outputs are
// NaN, and flamia_check_errors names q_start.
TEST(QStartHostile, InvalidDeviceValueIsReported) {
  Case c = make(Param{FLAMIA_RECIPE_FP8, 128, true});
  c.q_start[3] = 200;  // not a multiple of 128
  const Inputs in = make_inputs(c, 5);
  GpuRunner r(c);
  FwdResult f;
  BwdResult b;
  ASSERT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(r.forward_backward(in, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(count_nonfinite(f.o), int64_t(f.o.size()));
  EXPECT_EQ(count_nonfinite(b.dk), int64_t(b.dk.size()));
  ASSERT_EQ(flamia_check_errors(-1), FLAMIA_ERROR_INVALID_ARGUMENT);
  const std::string msg = flamia_last_error();
  EXPECT_NE(msg.find("q_start: q_start[3] = 200 must be a multiple of 128 in [0, 1100]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
