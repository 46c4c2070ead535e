// Hostile device arguments (flamia.h, "Device cu_seqlens and max_seqlen"): an invalid
// cu_seqlens or max_seqlen, or a qkv8 / backward whose cu_seqlens differs from the quantized
// one, never computes finite numbers: checking mode rejects the call with a message naming
// the argument; default mode fills the outputs with NaN and records the fault for
// flamia_check_errors. The CUDA context stays usable. Run under compute-sanitizer memcheck
// (names contain "Small") for the no-out-of-bounds half of the contract.
#if defined(FLAMIA_WITH_CUDA)

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

struct ScopedCheck : ScopedEnv {
  explicit ScopedCheck(bool on) : ScopedEnv("FLAMIA_CHECK", on ? "1" : nullptr) {}
};

bool all_nan(const std::vector<uint16_t>& x) {
  for (uint16_t b : x)
    if ((b & 0x7fffu) <= 0x7f80u) return false;
  return !x.empty();
}
bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (!std::isnan(v)) return false;
  return !x.empty();
}
bool all_zero(const std::vector<uint16_t>& x) {
  for (uint16_t b : x)
    if (b != 0) return false;
  return true;
}

// The report's setting: T = 512, 4 heads, D = 128, causal, fp8.
Case issue_case(int num_docs) {
  Case c;
  c.cu = num_docs == 2 ? cu_from_lengths({256, 256}) : cu_from_lengths({200, 200, 112});
  c.hq = c.hkv = 4;
  c.d = 128;
  c.causal = true;
  c.recipe = FLAMIA_RECIPE_FP8;
  return c;
}

struct Hostile {
  std::vector<int32_t> cu;
  const char* message;
};
const Hostile kIssueInputs[] = {
    {{0, 256, 1024}, "cu_seqlens: last entry cu_seqlens[2] = 1024 must equal T = 512"},
    {{0, 400, 100, 512}, "cu_seqlens: must be non-decreasing, got cu_seqlens[2] = 100 < cu_seqlens[1] = 400"},
    {{0, 100, 300}, "cu_seqlens: last entry cu_seqlens[2] = 300 must equal T = 512"},
};

class HostileSmall : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error(); }
  void TearDown() override {
    unsetenv("FLAMIA_CHECK");
    unsetenv("FLAMIA_BWD_DQ");
  }

  static void set_cu(GpuRunner& r, const std::vector<int32_t>& cu) {
    check_cuda(cudaMemcpyAsync(r.args().cu_seqlens.data, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice,
                               r.stream()),
               "upload cu_seqlens");
    r.sync();
  }
  static void zero_outputs(GpuRunner& r) {
    for (const flamia_tensor& t : {r.out_view(), r.lse_view(), r.dq_view(), r.dk_view(), r.dv_view()}) {
      int64_t n = t.dtype == FLAMIA_DTYPE_FP32 ? 4 : 2;
      for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
      check_cuda(cudaMemsetAsync(t.data, 0, size_t(n), r.stream()), "zero outputs");
    }
  }
  // quantize (or not) -> forward -> backward with the runner's current device cu_seqlens.
  static std::vector<flamia_status> step(GpuRunner& r, bool self_quantize, std::string* first_message,
                                         int max_seqlen = 0) {
    flamia_attention_args a = r.args();
    if (max_seqlen) a.max_seqlen = max_seqlen;
    std::vector<flamia_status> st;
    auto note = [&](flamia_status s) {
      if (s != FLAMIA_SUCCESS && first_message->empty()) *first_message = flamia_last_error();
      st.push_back(s);
    };
    if (!self_quantize) note(flamia_quantize_qkv(&a, r.qkv8(), r.qkv8_bytes(), 1));
    note(flamia_forward(&a, r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), self_quantize ? 0 : 1));
    note(flamia_backward(&a, r.dout_view(), r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), r.workspace(),
                         r.workspace_bytes(), r.dq_view(), r.dk_view(), r.dv_view()));
    check_cuda(cudaStreamSynchronize(r.stream()), "step");
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return st;
  }
  // Case c's inputs with the hostile cu_seqlens on the device and zeroed outputs, through one
  // step whose calls must all succeed: the device records the fault, the host sees none.
  static void step_with_hostile_cu(GpuRunner& r, const Case& c, const std::vector<int32_t>& cu,
                                   bool self_quantize) {
    r.upload(make_inputs(c, 1));
    set_cu(r, cu);
    zero_outputs(r);
    std::string msg;
    for (flamia_status s : step(r, self_quantize, &msg)) EXPECT_EQ(s, FLAMIA_SUCCESS) << msg;
  }
  static void expect_recorded(const std::string& message) {
    ASSERT_EQ(flamia_check_errors(-1), FLAMIA_ERROR_INVALID_ARGUMENT) << "no fault recorded";
    const std::string got = flamia_last_error();
    EXPECT_NE(got.find(message), std::string::npos) << got;
    EXPECT_NE(got.find("cuda:"), std::string::npos) << got;
    EXPECT_NE(got.find("NaN"), std::string::npos) << got;
    EXPECT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << "the record was not cleared";
  }
  // A valid call on a fresh case gives finite numbers: the context and library are fine.
  static void expect_usable() {
    Case c = issue_case(2);
    GpuRunner r(c);
    FwdResult f;
    BwdResult b;
    ASSERT_EQ(r.forward_backward(make_inputs(c, 5), &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(count_nonfinite(f.o) + count_nonfinite(f.lse) + count_nonfinite(b.dq), 0);
    EXPECT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error();
  }
};

TEST_F(HostileSmall, IssueInputsDefaultModeGiveNaNAndARecordedError) {
  ScopedCheck check(false);
  for (const Hostile& h : kIssueInputs)
    for (bool self_quantize : {false, true}) {
      SCOPED_TRACE(testing::Message() << "cu_seqlens " << ::testing::PrintToString(h.cu)
                                      << (self_quantize ? " self-quantizing" : " quantize + filled"));
      const Case c = issue_case(int(h.cu.size()) - 1);
      GpuRunner r(c);
      step_with_hostile_cu(r, c, h.cu, self_quantize);
      FwdResult f;
      BwdResult b;
      r.download_fwd(&f);
      r.download_bwd(&b);
      EXPECT_TRUE(all_nan(f.o) && all_nan(f.lse)) << "O / LSE not all NaN";
      EXPECT_TRUE(all_nan(b.dq) && all_nan(b.dk) && all_nan(b.dv)) << "dQ / dK / dV not all NaN";
      expect_recorded(h.message);
    }
  expect_usable();
}

// The same inputs with the stored dS (FLAMIA_BWD_DQ=hbm: the workspace sized for it, the
// tiles addressed from the device's documents), both recipes: NaN and the recorded fault,
// nothing written outside the buffers (memcheck).
TEST_F(HostileSmall, IssueInputsWithTheStoredDsGiveNaNAndARecordedError) {
  ScopedCheck check(false);
  {
    ScopedEnv hbm("FLAMIA_BWD_DQ", "hbm");
    for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED})
      for (const Hostile& h : kIssueInputs) {
        SCOPED_TRACE(testing::Message() << "cu_seqlens " << ::testing::PrintToString(h.cu) << " recipe " << recipe);
        Case c = issue_case(int(h.cu.size()) - 1);
        c.recipe = recipe;
        GpuRunner r(c);
        step_with_hostile_cu(r, c, h.cu, false);
        BwdResult b;
        r.download_bwd(&b);
        EXPECT_TRUE(all_nan(b.dq) && all_nan(b.dk) && all_nan(b.dv)) << "dQ / dK / dV not all NaN";
        expect_recorded(h.message);
      }
  }
  expect_usable();
}

TEST_F(HostileSmall, IssueInputsCheckingModeFailWithAMessage) {
  ScopedCheck check(true);
  for (const Hostile& h : kIssueInputs) {
    SCOPED_TRACE(::testing::PrintToString(h.cu));
    const Case c = issue_case(int(h.cu.size()) - 1);
    GpuRunner r(c);
    r.upload(make_inputs(c, 1));
    set_cu(r, h.cu);
    zero_outputs(r);
    std::string msg;
    for (flamia_status s : step(r, false, &msg)) EXPECT_EQ(s, FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find(h.message), std::string::npos) << msg;
    FwdResult f;
    r.download_fwd(&f);
    EXPECT_TRUE(all_zero(f.o)) << "a rejected call wrote O";
    EXPECT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << "checking mode recorded a device fault too";
  }
  unsetenv("FLAMIA_CHECK");
  expect_usable();
}

TEST_F(HostileSmall, MaxSeqlenShorterThanADocument) {
  ScopedCheck check(false);
  const Case c = issue_case(2);
  GpuRunner r(c);
  r.upload(make_inputs(c, 2));
  zero_outputs(r);
  std::string msg;
  step(r, false, &msg, 255);
  FwdResult f;
  r.download_fwd(&f);
  EXPECT_TRUE(all_nan(f.o));
  expect_recorded("max_seqlen: 255 is less than the length 256 of document 0");
}

// A qkv8 quantized for one cu_seqlens, used with another valid one: rejected (NaN), and it
// stays rejected, even with the right cu_seqlens, until it is quantized again.
TEST_F(HostileSmall, FilledQkv8WithAnotherCuSeqlensIsRejected) {
  ScopedCheck check(false);
  const Case c = issue_case(2);
  const Inputs in = make_inputs(c, 3);
  GpuRunner r(c);
  FwdResult want;
  BwdResult want_b;
  ASSERT_EQ(r.forward_backward(in, &want, &want_b), FLAMIA_SUCCESS) << flamia_last_error();
  flamia_attention_args a = r.args();
  a.max_seqlen = 512;  // both splits are valid: only the fingerprint differs
  const std::vector<int32_t> other = {0, 300, 512};
  auto forward_filled = [&](FwdResult* f) {
    zero_outputs(r);
    EXPECT_EQ(flamia_forward(&a, r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), 1), FLAMIA_SUCCESS);
    r.download_fwd(f);
  };
  ASSERT_EQ(flamia_quantize_qkv(&a, r.qkv8(), r.qkv8_bytes(), 1), FLAMIA_SUCCESS);
  set_cu(r, other);
  FwdResult f;
  forward_filled(&f);
  EXPECT_TRUE(all_nan(f.o) && all_nan(f.lse));
  expect_recorded("qkv8: holds q, k, v quantized for a different cu_seqlens");
  set_cu(r, c.cu);
  forward_filled(&f);
  EXPECT_TRUE(all_nan(f.o)) << "a rejected qkv8 was used again without quantizing";
  expect_recorded("qkv8: holds q, k, v quantized for a different cu_seqlens");
  ASSERT_EQ(flamia_quantize_qkv(&a, r.qkv8(), r.qkv8_bytes(), 1), FLAMIA_SUCCESS);
  forward_filled(&f);
  EXPECT_EQ(f.o, want.o);
  EXPECT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error();
  // Checking mode says so at once.
  set_cu(r, other);
  ScopedCheck on(true);
  EXPECT_EQ(flamia_forward(&a, r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), 1),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("qkv8: holds q, k, v quantized for a different cu_seqlens"),
            std::string::npos)
      << flamia_last_error();
}

TEST_F(HostileSmall, BackwardWithAnotherCuSeqlensIsRejected) {
  ScopedCheck check(false);
  const Case c = issue_case(3);
  GpuRunner r(c);
  FwdResult f;
  ASSERT_EQ(r.forward(make_inputs(c, 4), &f), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(count_nonfinite(f.o), 0);
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{0, 200, 300, 512}, std::vector<int32_t>{0, 200, 400, 1 << 30}}) {
    set_cu(r, cu);
    zero_outputs(r);
    flamia_attention_args a = r.args();
    a.max_seqlen = 512;  // the first split is valid, so that only the fingerprint differs
    EXPECT_EQ(flamia_backward(&a, r.dout_view(), r.out_view(), r.lse_view(), r.qkv8(), r.qkv8_bytes(), r.workspace(),
                              r.workspace_bytes(), r.dq_view(), r.dk_view(), r.dv_view()),
              FLAMIA_SUCCESS);
    BwdResult b;
    r.download_bwd(&b);
    EXPECT_TRUE(all_nan(b.dq) && all_nan(b.dk) && all_nan(b.dv));
    expect_recorded(cu.back() == 512 ? "qkv8: holds q, k, v quantized for a different cu_seqlens"
                                     : "cu_seqlens: last entry cu_seqlens[3] = 1073741824 must equal T = 512");
    set_cu(r, c.cu);
    ASSERT_EQ(r.forward(make_inputs(c, 4), &f), FLAMIA_SUCCESS);  // a fresh qkv8 for the next round
  }
}

// Zero-length documents are valid anywhere and change no bit of the other documents' outputs.
TEST_F(HostileSmall, ZeroLengthDocumentsAreValid) {
  ScopedCheck check(false);
  Case packed = issue_case(3);
  packed.hkv = 2;
  Case sparse = packed;
  sparse.cu = {0, 0, 200, 200, 200, 400, 512, 512};
  const Inputs in = make_inputs(packed, 6);
  FwdResult f1, f2;
  BwdResult b1, b2;
  GpuRunner r1(packed), r2(sparse);
  ASSERT_EQ(r1.forward_backward(in, &f1, &b1), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(r2.forward_backward(in, &f2, &b2), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(f1.o, f2.o);
  EXPECT_EQ(0, std::memcmp(f1.lse.data(), f2.lse.data(), f1.lse.size() * 4));
  EXPECT_EQ(b1.dq, b2.dq);
  EXPECT_EQ(b1.dk, b2.dk);
  EXPECT_EQ(b1.dv, b2.dv);
  EXPECT_EQ(count_nonfinite(f2.o) + count_nonfinite(b2.dq), 0);
  EXPECT_EQ(flamia_check_errors(-1), FLAMIA_SUCCESS) << flamia_last_error();
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
