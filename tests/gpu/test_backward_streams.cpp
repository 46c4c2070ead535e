// FLAMIA_BWD_STREAMS=2 (and 2hi) moves the backward's dQ work to a second stream: the dQ pass
// beside the dK/dV pass, or, with the stored dS, each slab's GEMM beside the next slab's
// dK/dV in two alternating buffers. The kernels are the same, so dQ, dK and dV must be
// bitwise those of one stream — for both recipes, both head dims, causal and not, GQA, and
// slabs of one kv head (so that a buffer is reused and a slab's dK/dV must wait for the GEMM
// two slabs back). A value that is no option is refused, naming the variable.
#if defined(FLAMIA_WITH_CUDA)

#include <optional>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "checks.h"
#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

BwdResult run_with(const Case& c, const Inputs& in, const char* streams, const char* dq, const char* mib) {
  ScopedEnv s("FLAMIA_BWD_STREAMS", streams);
  ScopedEnv d("FLAMIA_BWD_DQ", dq);
  std::optional<ScopedEnv> budget;
  if (mib != nullptr) budget.emplace("FLAMIA_BWD_DS_MIB", mib);
  GpuRunner r(c);
  FwdResult f;
  BwdResult b;
  EXPECT_EQ(r.forward_backward(in, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
  return b;
}

using Param = std::tuple<bool /*mixed*/, int /*head dim*/, bool /*causal*/, bool /*stored dS*/>;

class BackwardStreams : public ::testing::TestWithParam<Param> {};

TEST_P(BackwardStreams, BitwiseOneStream) {
  const auto [mixed, d, causal, stored] = GetParam();
  Case c;
  c.cu = cu_from_lengths({1100, 63, 300, 640, 129, 77});
  c.recipe = mixed ? FLAMIA_RECIPE_FP8_MIXED : FLAMIA_RECIPE_FP8;
  c.d = d;
  c.hkv = 4;  // four slabs of one kv head with the stored dS: each buffer used twice
  c.hq = 8;
  c.causal = causal;
  const Inputs in = make_inputs(c, 9090);
  const char* dq = stored ? "hbm" : "recompute";
  const char* mib = stored ? "1" : nullptr;
  const BwdResult one = run_with(c, in, "1", dq, mib);
  for (const char* streams : {"2", "2hi"}) {
    const BwdResult two = run_with(c, in, streams, dq, mib);
    EXPECT_EQ(two.dq, one.dq) << "dQ, FLAMIA_BWD_STREAMS=" << streams;
    EXPECT_EQ(two.dk, one.dk) << "dK, FLAMIA_BWD_STREAMS=" << streams;
    EXPECT_EQ(two.dv, one.dv) << "dV, FLAMIA_BWD_STREAMS=" << streams;
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [mixed, d, causal, stored] = info.param;
  return std::string(mixed ? "fp8_mixed" : "fp8") + "_d" + std::to_string(d) + (causal ? "_causal" : "_full") +
         (stored ? "_stored" : "_recompute");
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackwardStreams,
                         ::testing::Combine(::testing::Values(true, false), ::testing::Values(128, 64),
                                            ::testing::Values(true, false), ::testing::Values(true, false)),
                         param_name);

TEST(BackwardStreamsOption, UnknownValueIsAnError) {
  Case c;
  c.cu = cu_from_lengths({200});
  c.recipe = FLAMIA_RECIPE_FP8_MIXED;
  const Inputs in = make_inputs(c, 1);
  GpuRunner r(c);
  ScopedEnv bogus("FLAMIA_BWD_STREAMS", "3");
  FwdResult f;
  BwdResult b;
  EXPECT_EQ(r.forward_backward(in, &f, &b), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("FLAMIA_BWD_STREAMS"), std::string::npos) << flamia_last_error();
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
