// The stored dS (fp8_mixed at D = 128 by default, every call with FLAMIA_BWD_DQ=hbm: the dK/dV
// pass writes each tile's dQ operand — fp8_mixed's bf16(dS), fp8's q8(dS sk / rho) codes and
// rho — and a GEMM over it forms dQ instead of recomputing S, dP and dS). Its dQ takes the
// same operands through the same wgmma steps (and, for fp8, the same fold) as the dQ pass,
// and dK, dV are computed as before: all three must be bitwise the recomputing backward's
// (FLAMIA_BWD_DQ=recompute), for both recipes, at head dims 128 and 64, with GQA, causal and
// not, documents at the 64-token edges, q_start, heads in slabs (their launches overlapped or
// not, one slab buffer or two); the default must store only where the workspace holds the
// tiles, and hbm must refuse a workspace that does not.
#if defined(FLAMIA_WITH_CUDA)

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "checks.h"
#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

// FLAMIA_BWD_DQ for the scope (null: unset); runners built inside size their workspace for it.
struct DqEnv : ScopedEnv {
  explicit DqEnv(const char* dq) : ScopedEnv("FLAMIA_BWD_DQ", dq) {}
};

// The workspace without the stored tiles (flamia_backward_workspace_bytes); the tiles lie past it.
size_t plain_workspace_bytes(const Case& c) {
  return flamia_backward_workspace_bytes(c.tokens(), c.num_docs(), c.hq, c.hkv, c.d, c.recipe);
}

// The recomputing backward and the stored-dS one on the same inputs; mib: the tiles' budget
// (1: one kv head a slab).
void expect_bitwise(const Case& c, uint64_t seed, const char* mib = nullptr) {
  const Inputs in = make_inputs(c, seed);
  FwdResult f0, f1;
  BwdResult b0, b1;
  {
    DqEnv recompute("recompute");
    GpuRunner r0(c);
    ASSERT_EQ(r0.forward_backward(in, &f0, &b0), FLAMIA_SUCCESS) << flamia_last_error();
  }
  {
    DqEnv stored("hbm");
    std::optional<ScopedEnv> budget;  // the tiles' budget, where given
    if (mib != nullptr) budget.emplace("FLAMIA_BWD_DS_MIB", mib);
    GpuRunner r1(c);
    ASSERT_EQ(r1.forward_backward(in, &f1, &b1), FLAMIA_SUCCESS) << flamia_last_error();
    // Written only where the stored path ran.
    EXPECT_GT(r1.workspace_bytes_written_from(plain_workspace_bytes(c)), 0u) << "no stored dS tile written";
  }
  EXPECT_EQ(b1.dq, b0.dq) << "dQ";
  EXPECT_EQ(b1.dk, b0.dk) << "dK";
  EXPECT_EQ(b1.dv, b0.dv) << "dV";
}

using Param = std::tuple<int /*gqa ratio*/, bool /*causal*/, int /*shape*/, int /*head dim*/, bool /*mixed*/>;

Case make(const Param& p) {
  const auto [ratio, causal, shape, d, mixed] = p;
  Case c;
  // Many short documents around the 64-token edges (a CTA whose second warpgroup has no
  // keys or no queries), and longer ones with several 128-token tiles.
  c.cu = shape == 0 ? cu_from_lengths({1, 2, 63, 64, 65, 127, 129, 131, 257, 509})
                    : cu_from_lengths({1100, 300, 640, 77});
  c.recipe = mixed ? FLAMIA_RECIPE_FP8_MIXED : FLAMIA_RECIPE_FP8;
  c.d = d;
  c.hkv = 2;
  c.hq = 2 * ratio;
  c.causal = causal;
  return c;
}

class StoredDq : public ::testing::TestWithParam<Param> {};

TEST_P(StoredDq, BitwiseTheDeterministicBackward) { expect_bitwise(make(GetParam()), 5151); }

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [ratio, causal, shape, d, mixed] = info.param;
  return std::string(mixed ? "fp8_mixed" : "fp8") + "_d" + std::to_string(d) + "_gqa" + std::to_string(ratio) +
         (causal ? "_causal" : "_full") + (shape == 0 ? "_short" : "_long");
}

INSTANTIATE_TEST_SUITE_P(Gpu, StoredDq,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Values(true, false),
                                            ::testing::Values(0, 1), ::testing::Values(128, 64),
                                            ::testing::Values(true, false)),
                         param_name);

// Keys-only rows (q_start): the dK/dV pass skips their query tiles, the GEMM their dQ.
TEST(StoredDqQStart, BitwiseTheDeterministicBackward) {
  for (const bool mixed : {true, false}) {
    Case c = make(Param{2, true, 1, 128, mixed});
    c.q_start = {384, 128, 0, 0};
    expect_bitwise(c, 77);
  }
}

// A budget of 1 MiB: one kv head (and its query heads) a slab, the documents' bases shared.
TEST(StoredDqSlabs, OneKvHeadASlab) {
  for (const bool mixed : {true, false}) {
    for (const bool causal : {true, false}) expect_bitwise(make(Param{4, causal, 1, 128, mixed}), 31, "1");
    expect_bitwise(make(Param{1, true, 0, 64, mixed}), 32, "1");
  }
}

// Seven kv heads under a 10 MiB budget (a head's run is 361 tiles here: 2.96 MB with
// fp8_mixed's, 1.57 MB with fp8's): at most three a slab, dealt 3 + 2 + 2 (fp8: at most six,
// 4 + 3), each launch at its own first head.
TEST(StoredDqSlabs, UnevenHeadsDealtEvenly) {
  for (const bool mixed : {true, false}) {
    Case c = make(Param{1, true, 1, 128, mixed});
    c.hkv = c.hq = 7;
    expect_bitwise(c, 33, "10");
  }
}

// After the first, a slab's launches may start in the last wave of the launch before them
// (programmatic dependent launch): a slab's dK/dV pass must not write the shared tile buffer
// before the previous slab's GEMM has read it, nor a GEMM read it before its slab's pass has
// written it. Eight slabs of one kv head, each launch of fewer CTAs than the GPU has SMs (so
// that the next one's CTAs start at once beside it), with the overlap on (the default) and off
// (FLAMIA_PDL=0): bitwise the recomputing backward both ways.
TEST(StoredDqSlabs, OverlappedLaunchesKeepEachSlabsTiles) {
  for (const char* pdl : {static_cast<const char*>(nullptr), "0"}) {
    ScopedEnv overlap("FLAMIA_PDL", pdl);
    for (const bool mixed : {true, false}) {
      Case c;
      c.cu = cu_from_lengths({2048, 1536, 448, 64});
      c.recipe = mixed ? FLAMIA_RECIPE_FP8_MIXED : FLAMIA_RECIPE_FP8;
      c.hq = c.hkv = 8;
      expect_bitwise(c, 34, "1");
    }
  }
}

// FLAMIA_BWD_DS_OVERLAP=1: two slab buffers, each slab's GEMM on a second stream beside the
// next slab's dK/dV pass, slab i + 2's pass only after slab i's GEMM has read buffer i % 2.
// Eight slabs of one kv head, each launch of fewer CTAs than the GPU has SMs (so that the two
// streams' kernels run side by side): the workspace one slab larger than without the switch,
// the second buffer written, and bitwise the recomputing backward.
TEST(StoredDqSlabs, TwoBuffersTheGemmBesideTheNextPass) {
  for (const bool mixed : {true, false}) {
    Case c;
    c.cu = cu_from_lengths({2048, 1536, 448, 64});
    c.recipe = mixed ? FLAMIA_RECIPE_FP8_MIXED : FLAMIA_RECIPE_FP8;
    c.hq = c.hkv = 8;
    const Inputs in = make_inputs(c, 35);
    FwdResult f;
    BwdResult want, got;
    {
      DqEnv recompute("recompute");
      GpuRunner r(c);
      ASSERT_EQ(r.forward_backward(in, &f, &want), FLAMIA_SUCCESS) << flamia_last_error();
    }
    DqEnv stored("hbm");
    ScopedEnv budget("FLAMIA_BWD_DS_MIB", "1");
    size_t one_buffer = 0;
    {
      GpuRunner r(c);
      one_buffer = r.workspace_bytes();
    }
    ScopedEnv beside("FLAMIA_BWD_DS_OVERLAP", "1");
    GpuRunner r(c);
    ASSERT_GT(r.workspace_bytes(), one_buffer) << "no second slab buffer sized";
    ASSERT_EQ(r.forward_backward(in, &f, &got), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_GT(r.workspace_bytes_written_from(one_buffer), 0u) << "the second buffer was not written";
    EXPECT_EQ(got.dq, want.dq) << "dQ";
    EXPECT_EQ(got.dk, want.dk) << "dK";
    EXPECT_EQ(got.dv, want.dv) << "dV";
  }
}

// The default (FLAMIA_BWD_DQ unset): fp8_mixed at D = 128 stores with a workspace sized by
// flamia_backward_workspace_bytes_for, and recomputes with the plain size; both bitwise the
// recomputing backward.
TEST(StoredDqDefault, Fp8MixedStoresWhereTheWorkspaceHoldsIt) {
  const Case c = make(Param{2, true, 1, 128, true});
  const Inputs in = make_inputs(c, 404);
  FwdResult f;
  BwdResult want, stored, plain;
  {
    DqEnv recompute("recompute");
    GpuRunner r(c);
    ASSERT_EQ(r.forward_backward(in, &f, &want), FLAMIA_SUCCESS) << flamia_last_error();
  }
  DqEnv unset(nullptr);
  GpuRunner big(c);
  const flamia_attention_args a = big.args();
  const size_t plain_bytes = plain_workspace_bytes(c);
  ASSERT_GT(big.workspace_bytes(), plain_bytes) << "the default sizes room for fp8_mixed's stored dS at D = 128";
  ASSERT_EQ(big.workspace_bytes(), flamia_backward_workspace_bytes_for(&a));
  {
    DqEnv recompute("recompute");  // the same workspace, the tiles' part left alone
    ASSERT_EQ(big.forward_backward(in, &f, &stored), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(big.workspace_bytes_written_from(plain_bytes), 0u) << "recompute wrote past the plain workspace";
  }
  ASSERT_EQ(big.forward_backward(in, &f, &stored), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_GT(big.workspace_bytes_written_from(plain_bytes), 0u) << "the default did not store dS";
  std::unique_ptr<GpuRunner> small;
  {
    DqEnv recompute("recompute");  // sizes the plain workspace
    small = std::make_unique<GpuRunner>(c);
  }
  ASSERT_EQ(small->workspace_bytes(), plain_bytes);
  ASSERT_EQ(small->forward_backward(in, &f, &plain), FLAMIA_SUCCESS)
      << "the plain workspace is enough by default: " << flamia_last_error();
  for (const BwdResult* b : {&stored, &plain}) {
    EXPECT_EQ(b->dq, want.dq) << "dQ";
    EXPECT_EQ(b->dk, want.dk) << "dK";
    EXPECT_EQ(b->dv, want.dv) << "dV";
  }
}

// FLAMIA_BWD_DQ=hbm requires the stored tiles: the plain workspace is refused, naming the size
// function; a value that is no option is refused, naming the variable.
TEST(StoredDqDefault, HbmRefusesThePlainWorkspaceAndUnknownValuesAreErrors) {
  const Case c = make(Param{1, true, 0, 128, true});
  const Inputs in = make_inputs(c, 405);
  std::unique_ptr<GpuRunner> r;
  {
    DqEnv recompute("recompute");
    r = std::make_unique<GpuRunner>(c);
  }
  FwdResult f;
  BwdResult b;
  {
    DqEnv hbm("hbm");
    EXPECT_EQ(r->forward_backward(in, &f, &b), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flamia_last_error()).find("flamia_backward_workspace_bytes_for"), std::string::npos)
        << flamia_last_error();
  }
  {
    DqEnv bogus("stored");
    EXPECT_EQ(r->forward_backward(in, &f, &b), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flamia_last_error()).find("FLAMIA_BWD_DQ"), std::string::npos) << flamia_last_error();
  }
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
