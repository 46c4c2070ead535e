// The fused dQ (FLAMIA_BWD_DQ=fused: fp8_mixed at D = 128 forms dQ inside the dK/dV pass and
// adds its partials in FP32 through the L2). dK and dV are the deterministic backward's, bit
// for bit (the pass computes them as before); dQ differs from the deterministic pass only in
// the order its FP32 partials are summed, so it must agree to rounding (its BF16 values within
// a few units in the last place); every row is written; with q_start the deterministic pass
// runs. Its dQ is not deterministic, so bitwise properties (causal safety, isolation) are the
// deterministic mode's to show.
#if defined(FLAMIA_WITH_CUDA)

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "checks.h"
#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

// Largest |a - b| over |b| + 2^-10 (BF16's last place near 1 is 2^-7), and the count of
// non-finite values of a.
struct DqAgreement {
  double worst = 0.0;
  int64_t nonfinite = 0;
};
DqAgreement agreement(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  DqAgreement r;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = f32(a[i]), y = f32(b[i]);
    if (!std::isfinite(x)) {
      ++r.nonfinite;
      continue;
    }
    r.worst = std::max(r.worst, std::fabs(x - y) / (std::fabs(y) + 0x1p-10));
  }
  return r;
}

using Param = std::tuple<int /*gqa ratio*/, bool /*causal*/, int /*shape*/>;

Case make(const Param& p) {
  const auto [ratio, causal, shape] = p;
  Case c;
  // Many short documents around the 64-token edges (a CTA whose second warpgroup has no
  // keys), and longer ones with several 128-key tiles.
  c.cu = shape == 0 ? cu_from_lengths({1, 2, 63, 64, 65, 127, 129, 131, 257, 509})
                    : cu_from_lengths({1100, 300, 640, 77});
  c.recipe = FLAMIA_RECIPE_FP8_MIXED;
  c.d = 128;
  c.hkv = 2;
  c.hq = 2 * ratio;
  c.causal = causal;
  return c;
}

class FusedDq : public ::testing::TestWithParam<Param> {};

TEST_P(FusedDq, DkDvBitwiseDqToRounding) {
  const Case c = make(GetParam());
  const Inputs in = make_inputs(c, 4242);
  FwdResult f0, f1;
  BwdResult b0, b1;
  // Against the dQ pass (the default would store dS here, with the same bits).
  std::unique_ptr<GpuRunner> r0;
  {
    ScopedEnv recompute("FLAMIA_BWD_DQ", "recompute");
    r0 = std::make_unique<GpuRunner>(c);
    ASSERT_EQ(r0->forward_backward(in, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  }
  {
    ScopedEnv fused("FLAMIA_BWD_DQ", "fused");
    GpuRunner r1(c);
    ASSERT_GT(r1.workspace_bytes(), r0->workspace_bytes()) << "the fused dQ's accumulator is in the workspace";
    ASSERT_EQ(r1.forward_backward(in, &f1, &b1), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_GT(r1.workspace_bytes_written_from(r0->workspace_bytes()), 0u)
        << "the accumulator was not written: the fused dQ did not run";
  }
  EXPECT_EQ(b1.dk, b0.dk) << "dK";
  EXPECT_EQ(b1.dv, b0.dv) << "dV";
  const DqAgreement a = agreement(b1.dq, b0.dq);
  EXPECT_EQ(a.nonfinite, 0) << "dQ rows left unwritten or poisoned";
  // Partials summed in another order: FP32 differences of a few units in its last place,
  // then one BF16 rounding (2^-8 relative) that can fall either way.
  EXPECT_LT(a.worst, 0x1p-6) << "dQ against the deterministic pass";
  EXPECT_LT(rel_l2(b1.dq, b0.dq), 1e-3) << "dQ against the deterministic pass";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [ratio, causal, shape] = info.param;
  return "gqa" + std::to_string(ratio) + (causal ? "_causal" : "_full") + (shape == 0 ? "_short" : "_long");
}

INSTANTIATE_TEST_SUITE_P(Gpu, FusedDq,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Values(true, false),
                                            ::testing::Values(0, 1)),
                         param_name);

// With q_start the fused dQ would write rows before it: the deterministic pass runs instead,
// so the result is the deterministic call's, bit for bit.
TEST(FusedDqQStart, FallsBackToTheDeterministicPass) {
  Case c = make(Param{2, true, 1});
  c.q_start = {384, 128, 0, 0};
  const Inputs in = make_inputs(c, 77);
  FwdResult f0, f1;
  BwdResult b0, b1;
  GpuRunner r0(c);
  ASSERT_EQ(r0.forward_backward(in, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  ScopedEnv fused("FLAMIA_BWD_DQ", "fused");
  GpuRunner r1(c);
  ASSERT_EQ(r1.forward_backward(in, &f1, &b1), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(b1.dq, b0.dq);
  EXPECT_EQ(b1.dk, b0.dk);
  EXPECT_EQ(b1.dv, b0.dv);
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
