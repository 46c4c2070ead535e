// Bad input on the device path: the call returns the documented status with a message that
// names the argument, launches nothing (outputs keep their poison), and leaves the library
// and the CUDA context usable (a valid call right after succeeds).
#if defined(FLAMIA_WITH_CUDA)

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_harness.h"

namespace flamia_gpu_test {
namespace {

// Every element of a downloaded output still holds the 0xFF poison.
void expect_poisoned(const std::vector<uint16_t>& g, const char* what) {
  EXPECT_EQ(g, std::vector<uint16_t>(g.size(), 0xFFFF)) << "a rejected call wrote " << what;
}

class ErrorsSmall : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.cu = cu_from_lengths({64, 100});
    c_.recipe = FLAMIA_RECIPE_FP8;
    c_.d = 128;
    c_.hq = 4;
    c_.hkv = 2;
    in_ = make_inputs(c_, 3);
    r_ = std::make_unique<GpuRunner>(c_);
    r_->upload(in_);
    // A valid step first, so that qkv8 / O / LSE hold real data for the backward checks.
    ASSERT_EQ(r_->forward_backward(in_, &f_, &b_), FLAMIA_SUCCESS) << flamia_last_error();
    host_q_ = in_.q;
    host_cu_ = c_.cu;
  }

  void TearDown() override {
    // The context is still healthy and a valid call still works.
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    FwdResult f;
    BwdResult b;
    EXPECT_EQ(r_->forward_backward(in_, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(f.o, f_.o);
    EXPECT_EQ(b.dq, b_.dq);
  }

  // A rejected call says why: its message holds `says` (the argument it names). The message
  // is the thread's last failure's and stays until the next one, so only its content tells
  // this call's from an earlier call's.
  static void expect_message(const char* says) {
    EXPECT_NE(std::string(flamia_last_error()).find(says), std::string::npos)
        << "the message \"" << flamia_last_error() << "\" should say \"" << says << "\"";
  }

  // Status of a forward with the given arguments; a rejected one's message holds `says` and
  // the output keeps its poison.
  flamia_status forward(const flamia_attention_args& a, flamia_tensor out, flamia_tensor lse, void* qkv8,
                        size_t qkv8_bytes, int filled, const char* says) {
    r_->poison();
    const flamia_status st = flamia_forward(&a, out, lse, qkv8, qkv8_bytes, filled);
    r_->sync();
    if (st != FLAMIA_SUCCESS) {
      expect_message(says);
      expect_untouched();
    }
    return st;
  }

  flamia_status quantize(const flamia_attention_args& a, void* qkv8, size_t bytes, int for_backward,
                         const char* says) {
    r_->poison();
    const flamia_status st = flamia_quantize_qkv(&a, qkv8, bytes, for_backward);
    r_->sync();
    if (st != FLAMIA_SUCCESS) expect_message(says);
    return st;
  }

  // The backward needs a filled qkv8 and the forward's O/LSE: run a valid quantize + forward
  // first (they overwrite the poison), then poison only the gradients.
  flamia_status backward(const flamia_attention_args& a, flamia_tensor dout, const void* qkv8, size_t qkv8_bytes,
                         void* ws, size_t ws_bytes, flamia_tensor dq, const char* says) {
    FwdResult f;
    EXPECT_EQ(r_->step(r_->args(), r_->dout_view(), false, &f, nullptr), FLAMIA_SUCCESS);
    r_->poison_gradients();
    r_->sync();
    const flamia_status st = flamia_backward(&a, dout, r_->out_view(), r_->lse_view(), qkv8, qkv8_bytes, ws,
                                             ws_bytes, dq, r_->dk_view(), r_->dv_view());
    r_->sync();
    if (st != FLAMIA_SUCCESS) {
      expect_message(says);
      BwdResult b;
      r_->download_bwd(&b);
      expect_poisoned(b.dq, "dQ");
    }
    return st;
  }

  // The runner's own backward, into its own gradients (a forward left O, LSE and qkv8).
  flamia_status backward_in_place() {
    flamia_attention_args a = r_->args();
    return flamia_backward(&a, r_->dout_view(), r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(),
                           r_->workspace(), r_->workspace_bytes(), r_->dq_view(), r_->dk_view(), r_->dv_view());
  }

  // dQ, dK and dV of the last backward are the fixture's reference gradients.
  void expect_reference_gradients() {
    r_->sync();
    BwdResult b;
    r_->download_bwd(&b);
    EXPECT_EQ(b.dq, b_.dq);
    EXPECT_EQ(b.dk, b_.dk);
    EXPECT_EQ(b.dv, b_.dv);
  }

  void expect_untouched() {
    FwdResult f;
    r_->download_fwd(&f);
    EXPECT_EQ(f.o, std::vector<uint16_t>(f.o.size(), 0xFFFF)) << "a rejected forward wrote O";
    std::vector<uint32_t> lse_bits(f.lse.size());
    std::memcpy(lse_bits.data(), f.lse.data(), f.lse.size() * 4);
    EXPECT_EQ(lse_bits, std::vector<uint32_t>(f.lse.size(), 0xFFFFFFFFu)) << "a rejected forward wrote LSE";
  }

  Case c_;
  Inputs in_;
  std::unique_ptr<GpuRunner> r_;
  FwdResult f_;
  BwdResult b_;
  std::vector<uint16_t> host_q_;
  std::vector<int32_t> host_cu_;
};

// A failed runtime call of the caller's leaves its error pending on the thread until
// cudaGetLastError reads it. flamia checks its launches with cudaGetLastError, so without
// care it reports that earlier error as its own: the harness's first backward failed this
// way with cudaErrorInvalidValue (autograd runs it on its own thread). The calls must
// succeed and compute the same bits.
TEST_F(ErrorsSmall, AnEarlierCallsPendingErrorIsNotThisCallsError) {
  // Any failing runtime call leaves its error pending; this one changes nothing.
  auto leave_an_error_pending = [] {
    ASSERT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
    ASSERT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice) << "the test needs a pending error";
  };
  leave_an_error_pending();
  FwdResult f;
  BwdResult b;
  ASSERT_EQ(r_->forward_backward(in_, &f, &b), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(f.o, f_.o);
  EXPECT_EQ(b.dq, b_.dq);
  EXPECT_EQ(b.dk, b_.dk);
  EXPECT_EQ(b.dv, b_.dv);
  // The backward alone, after a forward, with an error pending.
  ASSERT_EQ(r_->step(r_->args(), r_->dout_view(), false, &f, nullptr), FLAMIA_SUCCESS) << flamia_last_error();
  leave_an_error_pending();
  EXPECT_EQ(backward_in_place(), FLAMIA_SUCCESS) << flamia_last_error();
  expect_reference_gradients();
}

// A backward on a thread that has made no CUDA call before, as autograd runs it on its own
// device thread: the tensor maps are encoded by a driver call, which needs the device's
// context current on the calling thread, and the runtime makes it current only on the first
// call that needs it (without that, the first fp8 backward of a PyTorch process failed when
// nothing else had run on autograd's thread first: docs/PERFORMANCE.md "Memory").
TEST_F(ErrorsSmall, ABackwardOnAThreadWithoutCudaCallsSucceeds) {
  FwdResult f;
  ASSERT_EQ(r_->step(r_->args(), r_->dout_view(), false, &f, nullptr), FLAMIA_SUCCESS) << flamia_last_error();
  r_->sync();
  flamia_status status = FLAMIA_SUCCESS;
  std::string message;
  std::thread fresh([&] {
    status = backward_in_place();
    if (status != FLAMIA_SUCCESS) message = flamia_last_error();
  });
  fresh.join();
  ASSERT_EQ(status, FLAMIA_SUCCESS) << message;
  expect_reference_gradients();
}

TEST_F(ErrorsSmall, HostTensorInDeviceCall) {
  // q decides where the call runs; here on the host, with k still on the device.
  flamia_attention_args a = r_->args();
  a.q.data = host_q_.data();
  a.q.device = FLAMIA_DEVICE_HOST;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "device mismatch: q on host"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize(a, r_->qkv8(), r_->qkv8_bytes(), 1, "device mismatch: q on host"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(backward(a, r_->dout_view(), r_->qkv8(), r_->qkv8_bytes(), r_->workspace(), r_->workspace_bytes(),
                     r_->dq_view(), "device mismatch: q on host"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  // cu_seqlens on the host while the tensors are on the device.
  a = r_->args();
  a.cu_seqlens.data = host_cu_.data();
  a.cu_seqlens.device = FLAMIA_DEVICE_HOST;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "cu_seqlens on host"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  // An output on the host.
  std::vector<uint16_t> host_out(in_.q.size());
  flamia_tensor out = r_->out_view();
  out.data = host_out.data();
  out.device = FLAMIA_DEVICE_HOST;
  EXPECT_EQ(forward(r_->args(), out, r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "out on host"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(host_out, std::vector<uint16_t>(host_out.size(), 0)) << "a rejected call wrote a host output";

  // A gradient on the host: nothing is written, neither it nor the device's dK and dV.
  std::vector<uint16_t> host_dq(in_.q.size(), 0);
  flamia_tensor dq = r_->dq_view();
  dq.data = host_dq.data();
  dq.device = FLAMIA_DEVICE_HOST;
  a = r_->args();
  r_->poison();
  EXPECT_EQ(flamia_backward(&a, r_->dout_view(), r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(),
                            r_->workspace(), r_->workspace_bytes(), dq, r_->dk_view(), r_->dv_view()),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  expect_message("dq on host");
  r_->sync();
  EXPECT_EQ(host_dq, std::vector<uint16_t>(host_dq.size(), 0)) << "a rejected backward wrote a host dQ";
  BwdResult b;
  r_->download_bwd(&b);
  expect_poisoned(b.dk, "dK");
  expect_poisoned(b.dv, "dV");
}

TEST_F(ErrorsSmall, TensorsOnDifferentDevices) {
  // One tensor claims another device ordinal (present or not, the call cannot run).
  flamia_attention_args a = r_->args();
  a.v.device = r_->device() + 1;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, ", v on cuda:"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  flamia_tensor lse = r_->lse_view();
  lse.device = r_->device() + 1;
  EXPECT_EQ(forward(r_->args(), r_->out_view(), lse, r_->qkv8(), r_->qkv8_bytes(), 0, ", lse on cuda:"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
}

TEST_F(ErrorsSmall, MisalignedPointers) {
  // A BF16 tensor at an odd address cannot be read as BF16 at all.
  flamia_attention_args a = r_->args();
  a.q.data = static_cast<char*>(a.q.data) + 1;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "q: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize(a, r_->qkv8(), r_->qkv8_bytes(), 1, "q: data pointer"), FLAMIA_ERROR_INVALID_ARGUMENT);

  a = r_->args();
  a.k.data = static_cast<char*>(a.k.data) + 1;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "k: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  flamia_tensor out = r_->out_view();
  out.data = static_cast<char*>(out.data) + 1;
  EXPECT_EQ(forward(r_->args(), out, r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "out: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  flamia_tensor lse = r_->lse_view();
  lse.data = static_cast<char*>(lse.data) + 2;  // FP32 at a 2-byte offset
  EXPECT_EQ(forward(r_->args(), r_->out_view(), lse, r_->qkv8(), r_->qkv8_bytes(), 0, "lse: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  flamia_tensor dout = r_->dout_view();
  dout.data = static_cast<char*>(dout.data) + 1;
  EXPECT_EQ(backward(r_->args(), dout, r_->qkv8(), r_->qkv8_bytes(), r_->workspace(), r_->workspace_bytes(),
                     r_->dq_view(), "dout: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);

  flamia_tensor dq = r_->dq_view();
  dq.data = static_cast<char*>(dq.data) + 1;
  EXPECT_EQ(backward(r_->args(), r_->dout_view(), r_->qkv8(), r_->qkv8_bytes(), r_->workspace(),
                     r_->workspace_bytes(), dq, "dq: data pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
}

TEST_F(ErrorsSmall, QuantizedBufferTooSmall) {
  const size_t need_fwd = flamia_qkv8_bytes(c_.tokens(), c_.num_docs(), c_.hq, c_.hkv, c_.d, c_.recipe, 0);
  const size_t need_bwd = flamia_qkv8_bytes(c_.tokens(), c_.num_docs(), c_.hq, c_.hkv, c_.d, c_.recipe, 1);
  ASSERT_GT(need_fwd, 0u);
  ASSERT_GE(need_bwd, need_fwd);
  ASSERT_EQ(r_->qkv8_bytes(), need_bwd);
  const flamia_attention_args a = r_->args();
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), need_fwd - 1, 0, "qkv8_bytes:"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), nullptr, need_bwd, 0, "qkv8: null pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize(a, r_->qkv8(), need_fwd - 1, 0, "qkv8_bytes:"), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize(a, r_->qkv8(), need_bwd - 1, 1, "qkv8_bytes:"), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(backward(a, r_->dout_view(), r_->qkv8(), need_bwd - 1, r_->workspace(), r_->workspace_bytes(),
                     r_->dq_view(), "qkv8_bytes:"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(backward(a, r_->dout_view(), nullptr, need_bwd, r_->workspace(), r_->workspace_bytes(), r_->dq_view(),
                     "qkv8: null pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  // The size functions reject nonsense with 0.
  EXPECT_EQ(flamia_qkv8_bytes(c_.tokens(), c_.num_docs(), 3, 2, c_.d, c_.recipe, 1), 0u) << "Hq % Hkv != 0";
  EXPECT_EQ(flamia_qkv8_bytes(-1, 1, c_.hq, c_.hkv, c_.d, c_.recipe, 1), 0u) << "negative T";
}

TEST_F(ErrorsSmall, WorkspaceTooSmall) {
  const size_t need = flamia_backward_workspace_bytes(c_.tokens(), c_.num_docs(), c_.hq, c_.hkv, c_.d, c_.recipe);
  ASSERT_GT(need, 0u) << "the backward needs at least the quantized dO";
  const flamia_attention_args a = r_->args();
  EXPECT_EQ(backward(a, r_->dout_view(), r_->qkv8(), r_->qkv8_bytes(), r_->workspace(), need - 1, r_->dq_view(),
                     "workspace_bytes:"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(backward(a, r_->dout_view(), r_->qkv8(), r_->qkv8_bytes(), nullptr, need, r_->dq_view(),
                     "workspace: null pointer"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
}

TEST_F(ErrorsSmall, ShapeAndDtypeMismatch) {
  flamia_attention_args a = r_->args();
  a.q.dtype = FLAMIA_DTYPE_FP32;
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0, "q: expected dtype bf16"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  flamia_tensor lse = r_->lse_view();
  lse.shape[1] -= 1;  // [Hq, T - 1]
  EXPECT_EQ(forward(r_->args(), r_->out_view(), lse, r_->qkv8(), r_->qkv8_bytes(), 0, "lse: expected shape"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  a = r_->args();
  a.k.shape[1] = 3;  // Hq = 4 is not a multiple of Hkv = 3
  EXPECT_EQ(forward(a, r_->out_view(), r_->lse_view(), r_->qkv8(), r_->qkv8_bytes(), 0,
                    "is not a multiple of Hkv = 3"),
            FLAMIA_ERROR_INVALID_ARGUMENT);
}


// The device backward reads v (and with fp8 also q, k) from qkv8, so those may come without
// data; fp8_mixed's reads the BF16 q and k themselves: without them it is refused, naming the
// tensor, and writes nothing; with them (v still absent) it computes the same gradients.
TEST(BackwardInputs, Fp8MixedNeedsQAndK) {
  for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    Case c;
    c.cu = cu_from_lengths({100, 37});
    c.recipe = recipe;
    const Inputs in = make_inputs(c, 3);
    GpuRunner r(c);
    FwdResult f;
    BwdResult want;
    ASSERT_EQ(r.forward_backward(in, &f, &want), FLAMIA_SUCCESS) << flamia_last_error();
    auto run = [&](bool q, bool k) {
      flamia_attention_args a = r.args();
      if (!q) a.q.data = nullptr;
      if (!k) a.k.data = nullptr;
      a.v.data = nullptr;
      const flamia_status st = flamia_backward(&a, r.dout_view(), r.out_view(), r.lse_view(), r.qkv8(),
                                               r.qkv8_bytes(), r.workspace(), r.workspace_bytes(), r.dq_view(),
                                               r.dk_view(), r.dv_view());
      r.sync();
      return st;
    };
    const bool mixed = recipe == FLAMIA_RECIPE_FP8_MIXED;
    for (const bool q : {false, true}) {
      for (const bool k : {false, true}) {
        if (q && k) continue;
        if (mixed) r.poison_gradients();
        const flamia_status st = run(q, k);
        if (mixed) {
          EXPECT_EQ(st, FLAMIA_ERROR_INVALID_ARGUMENT);
          const std::string want_name = std::string(q ? "k" : "q") + ": data pointer is null";
          EXPECT_NE(std::string(flamia_last_error()).find(want_name), std::string::npos) << flamia_last_error();
          BwdResult untouched;
          r.download_bwd(&untouched);
          expect_poisoned(untouched.dq, "dQ");
          expect_poisoned(untouched.dk, "dK");
          expect_poisoned(untouched.dv, "dV");
        } else {
          EXPECT_EQ(st, FLAMIA_SUCCESS) << flamia_last_error();
        }
      }
    }
    ASSERT_EQ(run(true, true), FLAMIA_SUCCESS) << flamia_last_error();
    BwdResult b;
    r.download_bwd(&b);
    EXPECT_EQ(b.dq, want.dq);
    EXPECT_EQ(b.dk, want.dk);
    EXPECT_EQ(b.dv, want.dv);
  }
}

}  // namespace
}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
