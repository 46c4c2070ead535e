// The C ABI on the host: every rejected argument gives the documented status and a message
// naming it (and writes nothing); valid host calls equal direct calls of the specification
// (ref::emulate_*) bit for bit, including strided input views.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "flamia/flamia.h"
#include "flamia/flamia.hpp"
#include "reference/harness.h"
#include "reference/reference.h"

namespace {

using flamia::ref::harness::Bits;
using flamia::ref::harness::Pack;
using flamia::ref::harness::random_pack;

constexpr uint16_t kPoison16 = 0xFFFF;
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;
constexpr size_t kCanary = 64;  // elements past the end of every output, checked untouched

// Sets an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// One host problem with inputs, outputs (with canaries) and views of them.
struct HostCall {
  Pack pk;
  std::vector<int32_t> cu;
  Bits out, dq, dk, dv;  // each kCanary elements longer than the tensor
  std::vector<float> lse;
  flamia_attention_args args{};
  flamia_tensor out_t{}, lse_t{}, dout_t{}, dq_t{}, dk_t{}, dv_t{};

  HostCall(const std::vector<int>& lengths, int hq, int hkv, int dim, bool causal,
           flamia_recipe recipe = FLAMIA_RECIPE_FP8, uint64_t seed = 1)
      : pk(random_pack(lengths, hq, hkv, dim, causal, seed)), cu(pk.p.cu_seqlens) {
    const int64_t T = pk.p.total_tokens;
    out.assign(size_t(T) * hq * dim + kCanary, kPoison16);
    dq.assign(size_t(T) * hq * dim + kCanary, kPoison16);
    dk.assign(size_t(T) * hkv * dim + kCanary, kPoison16);
    dv.assign(size_t(T) * hkv * dim + kCanary, kPoison16);
    lse.assign(size_t(hq) * T + kCanary, std::numeric_limits<float>::quiet_NaN());
    poison_lse();
    int max_len = 1;
    for (int L : lengths) max_len = std::max(max_len, L);
    args = flamia::make_args(flamia::bf16_view(pk.q.data(), T, hq, dim), flamia::bf16_view(pk.k.data(), T, hkv, dim),
                             flamia::bf16_view(pk.v.data(), T, hkv, dim),
                             flamia::cu_seqlens_view(cu.data(), int64_t(cu.size()) - 1), max_len, causal, 0.0f,
                             recipe);
    out_t = flamia::bf16_view(out.data(), T, hq, dim);
    lse_t = flamia::lse_view(lse.data(), hq, T);
    dout_t = flamia::bf16_view(pk.dout.data(), T, hq, dim);
    dq_t = flamia::bf16_view(dq.data(), T, hq, dim);
    dk_t = flamia::bf16_view(dk.data(), T, hkv, dim);
    dv_t = flamia::bf16_view(dv.data(), T, hkv, dim);
  }

  // args.q_start with the given values (held here).
  void set_q_start(std::vector<int32_t> values) {
    q_start = std::move(values);
    args.q_start = flamia::q_start_view(q_start.data(), int64_t(q_start.size()));
  }
  std::vector<int32_t> q_start;

  void poison_lse() {
    for (float& x : lse) std::memcpy(&x, &kPoison32, 4);
  }

  flamia_status forward() { return flamia_forward(&args, out_t, lse_t, nullptr, 0, 0); }
  flamia_status backward() {
    return flamia_backward(&args, dout_t, out_t, lse_t, nullptr, 0, nullptr, 0, dq_t, dk_t, dv_t);
  }

  // The specification called directly, as the host path is documented to call it.
  flamia::ref::EmulationConfig config() const {
    flamia::ref::EmulationConfig cfg;
    cfg.recipe = args.recipe;
    cfg.scheme = flamia::ref::Scheme::PerToken;
    cfg.tiling = flamia::ref::Tiling{};
    return cfg;
  }
};

bool all_poison(const Bits& x) {
  for (uint16_t b : x)
    if (b != kPoison16) return false;
  return true;
}

bool all_poison(const std::vector<float>& x) {
  for (float f : x) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u != kPoison32) return false;
  }
  return true;
}

bool canaries_intact(const HostCall& c) {
  auto tail16 = [](const Bits& x) {
    for (size_t i = x.size() - kCanary; i < x.size(); ++i)
      if (x[i] != kPoison16) return false;
    return true;
  };
  for (size_t i = c.lse.size() - kCanary; i < c.lse.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &c.lse[i], 4);
    if (u != kPoison32) return false;
  }
  return tail16(c.out) && tail16(c.dq) && tail16(c.dk) && tail16(c.dv);
}

Bits head(const Bits& x, size_t n) { return Bits(x.begin(), x.begin() + n); }
std::vector<uint32_t> bits_of(const std::vector<float>& x, size_t n) {
  std::vector<uint32_t> u(n);
  std::memcpy(u.data(), x.data(), n * 4);
  return u;
}

// Runs the forward and the backward of both calls and expects the same bits in every output.
void expect_same_step(HostCall& want, HostCall& got) {
  for (HostCall* x : {&want, &got}) {
    ASSERT_EQ(x->forward(), FLAMIA_SUCCESS) << flamia_last_error();
    ASSERT_EQ(x->backward(), FLAMIA_SUCCESS) << flamia_last_error();
  }
  EXPECT_EQ(got.out, want.out) << "O";
  EXPECT_EQ(bits_of(got.lse, got.lse.size()), bits_of(want.lse, want.lse.size())) << "LSE";
  EXPECT_EQ(got.dq, want.dq) << "dQ";
  EXPECT_EQ(got.dk, want.dk) << "dK";
  EXPECT_EQ(got.dv, want.dv) << "dV";
}

// =========================================================================================
// Valid host calls equal the specification bit for bit
// =========================================================================================

struct Shape {
  std::vector<int> lengths;
  int hq, hkv, dim;
  bool causal;
  flamia_recipe recipe;
};

class HostMatchesSpec : public ::testing::TestWithParam<Shape> {};

TEST_P(HostMatchesSpec, ForwardAndBackward) {
  const Shape& s = GetParam();
  HostCall c(s.lengths, s.hq, s.hkv, s.dim, s.causal, s.recipe, 7);
  const int64_t T = c.pk.p.total_tokens;
  const size_t nq = size_t(T) * s.hq * s.dim, nkv = size_t(T) * s.hkv * s.dim, nl = size_t(s.hq) * T;

  ASSERT_EQ(c.forward(), FLAMIA_SUCCESS) << flamia_last_error();
  ASSERT_EQ(c.backward(), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_TRUE(canaries_intact(c)) << "a host call wrote past the end of an output";

  Bits o(nq), dq(nq), dk(nkv), dv(nkv);
  std::vector<float> lse(nl);
  flamia::ref::emulate_forward(c.pk.p, c.config(), c.pk.q.data(), c.pk.k.data(), c.pk.v.data(), o.data(),
                               lse.data());
  flamia::ref::emulate_backward(c.pk.p, c.config(), c.pk.q.data(), c.pk.k.data(), c.pk.v.data(),
                                c.pk.dout.data(), o.data(), lse.data(), dq.data(), dk.data(), dv.data());
  EXPECT_EQ(head(c.out, nq), o);
  EXPECT_EQ(bits_of(c.lse, nl), bits_of(lse, nl));
  EXPECT_EQ(head(c.dq, nq), dq);
  EXPECT_EQ(head(c.dk, nkv), dk);
  EXPECT_EQ(head(c.dv, nkv), dv);
}

INSTANTIATE_TEST_SUITE_P(
    Api, HostMatchesSpec,
    ::testing::Values(Shape{{5, 70, 20}, 4, 2, 64, true, FLAMIA_RECIPE_FP8},
                      Shape{{5, 70, 20}, 4, 2, 64, false, FLAMIA_RECIPE_FP8_MIXED},
                      Shape{{33, 0, 40}, 2, 1, 128, true, FLAMIA_RECIPE_FP8_MIXED},
                      Shape{{130}, 2, 2, 128, false, FLAMIA_RECIPE_FP8}));

TEST(Api, DefaultSoftmaxScaleIsOneOverSqrtD) {
  for (int dim : {64, 128}) {
    HostCall implicit({40, 30}, 2, 1, dim, true), explicit_({40, 30}, 2, 1, dim, true);
    explicit_.args.softmax_scale = 1.0f / std::sqrt(float(dim));
    ASSERT_EQ(implicit.forward(), FLAMIA_SUCCESS) << flamia_last_error();
    ASSERT_EQ(explicit_.forward(), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(implicit.out, explicit_.out);
    EXPECT_EQ(bits_of(implicit.lse, implicit.lse.size()), bits_of(explicit_.lse, explicit_.lse.size()));
  }
  // A different explicit scale gives different results (the argument is really used).
  HostCall a({40}, 1, 1, 64, true), b({40}, 1, 1, 64, true);
  b.args.softmax_scale = 0.3f;
  ASSERT_EQ(a.forward(), FLAMIA_SUCCESS);
  ASSERT_EQ(b.forward(), FLAMIA_SUCCESS);
  EXPECT_NE(a.out, b.out);
}

// q, k, v as views of one fused [T, Hq + 2 Hkv, D] buffer and a strided dout: same bits as
// dense tensors.
TEST(Api, StridedInputViewsMatchDense) {
  HostCall dense({50, 17, 64}, 4, 2, 64, true, FLAMIA_RECIPE_FP8, 3);
  HostCall strided({50, 17, 64}, 4, 2, 64, true, FLAMIA_RECIPE_FP8, 3);
  const int64_t T = dense.pk.p.total_tokens;
  const int hq = 4, hkv = 2, D = 64, H = hq + 2 * hkv;
  Bits fused(size_t(T) * H * D), dout_wide(size_t(T) * (hq + 1) * D, 0);
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* row = &fused[size_t(t) * H * D];
    std::memcpy(row, &dense.pk.q[size_t(t) * hq * D], size_t(hq) * D * 2);
    std::memcpy(row + size_t(hq) * D, &dense.pk.k[size_t(t) * hkv * D], size_t(hkv) * D * 2);
    std::memcpy(row + size_t(hq + hkv) * D, &dense.pk.v[size_t(t) * hkv * D], size_t(hkv) * D * 2);
    std::memcpy(&dout_wide[size_t(t) * (hq + 1) * D], &dense.pk.dout[size_t(t) * hq * D], size_t(hq) * D * 2);
  }
  strided.args.q = flamia::bf16_rows_view(fused.data(), T, hq, D, int64_t(H) * D);
  strided.args.k = flamia::bf16_rows_view(fused.data() + size_t(hq) * D, T, hkv, D, int64_t(H) * D);
  strided.args.v = flamia::bf16_rows_view(fused.data() + size_t(hq + hkv) * D, T, hkv, D, int64_t(H) * D);
  strided.dout_t = flamia::bf16_rows_view(dout_wide.data(), T, hq, D, int64_t(hq + 1) * D);
  expect_same_step(dense, strided);
}

// Hkv = 1: the head strides of k, v and dk are never used to address memory; odd values are
// accepted and give the dense call's bits.
TEST(Api, StridesOfSizeOneDimsAreIgnored) {
  HostCall dense({20, 12}, 2, 1, 64, true), c({20, 12}, 2, 1, 64, true);
  c.args.k.strides[1] = 12345;
  c.args.v.strides[1] = 0;
  c.dk_t.strides[1] = 7;
  expect_same_step(dense, c);
}

TEST(Api, EmptyPackSucceeds) {
  HostCall c({0}, 2, 2, 64, true);
  c.args.max_seqlen = 1;
  EXPECT_EQ(c.forward(), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_EQ(c.backward(), FLAMIA_SUCCESS) << flamia_last_error();
  EXPECT_TRUE(canaries_intact(c));
}

// max_seqlen only bounds the documents: a loose bound gives the tight one's bits.
TEST(Api, MaxSeqlenMayBeAnUpperBound) {
  HostCall tight({20, 12}, 2, 1, 64, true), c({20, 12}, 2, 1, 64, true);
  c.args.max_seqlen = 4096;
  expect_same_step(tight, c);
}

TEST(Api, HostQuantizeIsAValidatedNoOp) {
  HostCall c({20, 12}, 2, 1, 64, true);
  EXPECT_EQ(flamia_quantize_qkv(&c.args, nullptr, 0, 1), FLAMIA_SUCCESS) << flamia_last_error();
  c.args.q.dtype = FLAMIA_DTYPE_FP32;
  EXPECT_EQ(flamia_quantize_qkv(&c.args, nullptr, 0, 1), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("q: expected dtype bf16, got fp32"), std::string::npos);
}

TEST(Api, NanPropagatesAndCheckingModeReportsIt) {
  HostCall c({20, 12}, 2, 1, 64, true);
  c.pk.k[size_t(5) * 64 + 3] = 0x7fc0;  // NaN in k, token 5 (document 0)
  ASSERT_EQ(c.forward(), FLAMIA_SUCCESS) << "without checking mode NaN propagates";
  EXPECT_TRUE(std::isnan(flamia::fmt::bf16_bits_to_f32(c.out[size_t(5) * 2 * 64])));
  {
    ScopedEnv check("FLAMIA_CHECK", "1");
    EXPECT_EQ(c.forward(), FLAMIA_ERROR_NONFINITE);
    const std::string msg = flamia_last_error();
    EXPECT_NE(msg.find("k: NaN or Inf at token 5, head 0"), std::string::npos) << msg;
    c.pk.k[size_t(5) * 64 + 3] = 0;
    c.pk.dout[size_t(7) * 2 * 64 + 64] = 0x7f80;  // +Inf in dout, token 7, head 1
    EXPECT_EQ(c.forward(), FLAMIA_SUCCESS) << flamia_last_error();
    EXPECT_EQ(c.backward(), FLAMIA_ERROR_NONFINITE);
    EXPECT_NE(std::string(flamia_last_error()).find("dout: NaN or Inf at token 7, head 1"), std::string::npos)
        << flamia_last_error();
  }
  ScopedEnv off("FLAMIA_CHECK", "0");
  EXPECT_EQ(c.backward(), FLAMIA_SUCCESS);
}

// =========================================================================================
// Every rejected argument
// =========================================================================================

struct BadCase {
  const char* what;
  std::function<void(HostCall&)> mutate;
  const char* message;  // substring the error must contain
  bool forward = true;  // also rejected by the forward (else backward only)
  flamia_status status = FLAMIA_ERROR_INVALID_ARGUMENT;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.what; }

// Some pointer that is never dereferenced (validation fails before any access).
void* fake_device_ptr(uintptr_t offset = 0) { return reinterpret_cast<void*>(uintptr_t(0x7f0000000000) + offset); }

// Everything on "cuda:0" with fake (aligned) pointers: validation runs without a GPU.
void move_all_to_device(HostCall& c) {
  for (flamia_tensor* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.cu_seqlens, &c.out_t, &c.lse_t, &c.dout_t,
                           &c.dq_t, &c.dk_t, &c.dv_t}) {
    t->device = 0;
    t->data = fake_device_ptr();
  }
}

const BadCase kBadCases[] = {
    // ---- dtype -------------------------------------------------------------------------
    {"q dtype", [](HostCall& c) { c.args.q.dtype = FLAMIA_DTYPE_FP32; }, "q: expected dtype bf16, got fp32"},
    {"k dtype", [](HostCall& c) { c.args.k.dtype = FLAMIA_DTYPE_INT32; }, "k: expected dtype bf16, got int32"},
    {"v dtype", [](HostCall& c) { c.args.v.dtype = FLAMIA_DTYPE_UINT8; }, "v: expected dtype bf16, got uint8"},
    {"q unknown dtype", [](HostCall& c) { c.args.q.dtype = flamia_dtype(42); },
     "q: expected dtype bf16, got an unknown dtype (42)"},
    {"out dtype", [](HostCall& c) { c.out_t.dtype = FLAMIA_DTYPE_FP32; }, "out: expected dtype bf16, got fp32"},
    {"lse dtype", [](HostCall& c) { c.lse_t.dtype = FLAMIA_DTYPE_BF16; }, "lse: expected dtype fp32, got bf16"},
    {"cu_seqlens dtype", [](HostCall& c) { c.args.cu_seqlens.dtype = FLAMIA_DTYPE_FP32; },
     "cu_seqlens: expected dtype int32, got fp32"},
    {"dout dtype", [](HostCall& c) { c.dout_t.dtype = FLAMIA_DTYPE_FP32; }, "dout: expected dtype bf16, got fp32",
     false},
    {"dq dtype", [](HostCall& c) { c.dq_t.dtype = FLAMIA_DTYPE_FP32; }, "dq: expected dtype bf16, got fp32", false},
    {"dk dtype", [](HostCall& c) { c.dk_t.dtype = FLAMIA_DTYPE_FP32; }, "dk: expected dtype bf16, got fp32", false},
    {"dv dtype", [](HostCall& c) { c.dv_t.dtype = FLAMIA_DTYPE_FP32; }, "dv: expected dtype bf16, got fp32", false},
    // ---- rank and shape ----------------------------------------------------------------
    {"q rank", [](HostCall& c) { c.args.q.ndim = 2; }, "q: expected 3 dims [T, Hq, D], got 2"},
    {"k rank", [](HostCall& c) { c.args.k.ndim = 4; }, "k: expected 3 dims [T, Hkv, D], got 4"},
    {"lse rank", [](HostCall& c) { c.lse_t.ndim = 3; }, "lse: expected 2 dims [Hq, T], got 3"},
    {"cu_seqlens rank", [](HostCall& c) { c.args.cu_seqlens.ndim = 2; }, "cu_seqlens: expected 1 dim [B + 1], got 2"},
    // ---- q_start (documents of 5, 70, 20 tokens: only 0 is a valid first query) --------
    {"q_start past the document", [](HostCall& c) { c.set_q_start({0, 128, 0}); },
     "q_start: q_start[1] = 128 must be a multiple of 128 in [0, 70] (the length of document 1)"},
    {"q_start not a multiple of the tile", [](HostCall& c) { c.set_q_start({0, 0, 8}); },
     "q_start: q_start[2] = 8 must be a multiple of 128 in [0, 20]"},
    {"q_start negative", [](HostCall& c) { c.set_q_start({-128, 0, 0}); }, "q_start: q_start[0] = -128"},
    {"q_start dtype",
     [](HostCall& c) {
       c.set_q_start({0, 0, 0});
       c.args.q_start.dtype = FLAMIA_DTYPE_FP32;
     },
     "q_start: expected dtype int32, got fp32"},
    {"q_start shape", [](HostCall& c) { c.set_q_start({0, 0, 0, 0}); }, "q_start: expected shape [B] = [3], got [4]"},
    {"q_start device",
     [](HostCall& c) {
       c.set_q_start({0, 0, 0});
       c.args.q_start.device = 0;
     },
     "device mismatch: q on host, q_start on cuda:0"},
    {"head dim 96",
     [](HostCall& c) {
       c.args.q.shape[2] = 96;
       c.args.q.strides[1] = 96;
     },
     "q: head dim unsupported: 96"},
    {"head dim 256", [](HostCall& c) { c.args.q.shape[2] = 256; }, "q: head dim unsupported: 256"},
    {"negative T", [](HostCall& c) { c.args.q.shape[0] = -1; }, "q: T = -1 is out of range"},
    {"T beyond int32", [](HostCall& c) { c.args.q.shape[0] = int64_t(1) << 31; }, "q: T = 2147483648 is out of range"},
    {"Hq zero", [](HostCall& c) { c.args.q.shape[1] = 0; }, "q: Hq = 0 is out of range"},
    {"Hkv zero", [](HostCall& c) { c.args.k.shape[1] = 0; }, "k: Hkv = 0 is out of range"},
    {"Hq not multiple of Hkv", [](HostCall& c) { c.args.k.shape[1] = 3; },
     "k: Hq = 4 (from q) is not a multiple of Hkv = 3"},
    {"k tokens", [](HostCall& c) { c.args.k.shape[0] -= 1; }, "k: expected shape [T, Hkv, D] = [95, 2, 64], got [94, 2, 64]"},
    {"k head dim", [](HostCall& c) { c.args.k.shape[2] = 128; }, "k: expected shape [T, Hkv, D]"},
    {"v heads", [](HostCall& c) { c.args.v.shape[1] = 1; }, "v: expected shape [T, Hkv, D] = [95, 2, 64], got [95, 1, 64]"},
    {"out heads", [](HostCall& c) { c.out_t.shape[1] = 2; }, "out: expected shape [T, Hq, D] = [95, 4, 64]"},
    {"lse transposed",
     [](HostCall& c) {
       std::swap(c.lse_t.shape[0], c.lse_t.shape[1]);
       c.lse_t.strides[0] = 4;
     },
     "lse: expected shape [Hq, T] = [4, 95], got [95, 4]"},
    {"dout shape", [](HostCall& c) { c.dout_t.shape[0] = 10; }, "dout: expected shape [T, Hq, D]", false},
    {"dq shape", [](HostCall& c) { c.dq_t.shape[1] = 2; }, "dq: expected shape [T, Hq, D]", false},
    {"dk with Hq heads",
     [](HostCall& c) { c.dk_t = flamia::bf16_view(c.dk.data(), 95, 4, 64); },
     "dk: expected shape [T, Hkv, D] = [95, 2, 64], got [95, 4, 64]", false},
    {"dv shape", [](HostCall& c) { c.dv_t.shape[2] = 128; }, "dv: expected shape [T, Hkv, D]", false},
    // ---- layout ------------------------------------------------------------------------
    {"q last dim strided", [](HostCall& c) { c.args.q.strides[2] = 2; }, "q: last dim must be contiguous (stride 1)"},
    {"v last dim strided", [](HostCall& c) { c.args.v.strides[2] = 0; }, "v: last dim must be contiguous"},
    {"dout last dim strided", [](HostCall& c) { c.dout_t.strides[2] = 3; }, "dout: last dim must be contiguous",
     false},
    {"q negative stride", [](HostCall& c) { c.args.q.strides[0] = -256; }, "q: negative strides are not supported"},
    {"q stride overflow", [](HostCall& c) { c.args.q.strides[0] = int64_t(1) << 60; },
     "q: strides [1152921504606846976, 64, 1] overflow the address range"},
    {"out not dense", [](HostCall& c) { c.out_t.strides[0] = 512; },
     "out: expected a dense (row-major contiguous) [T, Hq, D] tensor, got strides [512, 64, 1]"},
    {"lse not dense", [](HostCall& c) { c.lse_t.strides[1] = 2; }, "lse: expected a dense"},
    {"dq not dense", [](HostCall& c) { c.dq_t.strides[1] = 128; }, "dq: expected a dense", false},
    {"dk not dense", [](HostCall& c) { c.dk_t.strides[2] = 2; }, "dk: expected a dense", false},
    {"dv not dense", [](HostCall& c) { c.dv_t.strides[0] = 64; }, "dv: expected a dense", false},
    {"out in backward not dense", [](HostCall& c) { c.out_t.strides[0] = 512; }, "out: expected a dense", false},
    {"cu_seqlens strided", [](HostCall& c) { c.args.cu_seqlens.strides[0] = 2; },
     "cu_seqlens: expected a dense (row-major contiguous) [B + 1] tensor, got strides [2]"},
    // ---- cu_seqlens --------------------------------------------------------------------
    {"cu_seqlens one entry", [](HostCall& c) { c.args.cu_seqlens.shape[0] = 1; },
     "cu_seqlens: expected B + 1 >= 2 entries (at least one document), got 1"},
    {"cu_seqlens first not 0", [](HostCall& c) { c.cu[0] = 1; }, "cu_seqlens: cu_seqlens[0] must be 0, got 1"},
    {"cu_seqlens decreasing", [](HostCall& c) { c.cu[1] = 80; },
     "cu_seqlens: must be non-decreasing, got cu_seqlens[2] = 75 < cu_seqlens[1] = 80"},
    {"cu_seqlens last != T", [](HostCall& c) { c.cu[3] = 94; },
     "cu_seqlens: last entry cu_seqlens[3] = 94 must equal T = 95"},
    {"cu_seqlens short of T", [](HostCall& c) { c.args.cu_seqlens.shape[0] = 3; },
     "cu_seqlens: last entry cu_seqlens[2] = 75 must equal T = 95"},
    // ---- scalars -----------------------------------------------------------------------
    {"max_seqlen zero", [](HostCall& c) { c.args.max_seqlen = 0; }, "max_seqlen: must be >= 1, got 0"},
    {"max_seqlen negative", [](HostCall& c) { c.args.max_seqlen = -5; }, "max_seqlen: must be >= 1, got -5"},
    {"max_seqlen too small", [](HostCall& c) { c.args.max_seqlen = 69; },
     "max_seqlen: 69 is less than the length 70 of document 1"},
    {"softmax_scale negative", [](HostCall& c) { c.args.softmax_scale = -0.125f; },
     "softmax_scale: must be finite and >= 0"},
    {"softmax_scale NaN", [](HostCall& c) { c.args.softmax_scale = std::nanf(""); }, "softmax_scale: must be finite"},
    {"softmax_scale Inf", [](HostCall& c) { c.args.softmax_scale = INFINITY; }, "softmax_scale: must be finite"},
    {"recipe", [](HostCall& c) { c.args.recipe = flamia_recipe(7); }, "recipe: unknown value 7"},
    // ---- null and misaligned pointers ------------------------------------------------
    {"q null", [](HostCall& c) { c.args.q.data = nullptr; }, "q: data pointer is null but the tensor has 24320 elements"},
    {"v null", [](HostCall& c) { c.args.v.data = nullptr; }, "v: data pointer is null"},
    {"cu_seqlens null", [](HostCall& c) { c.args.cu_seqlens.data = nullptr; }, "cu_seqlens: data pointer is null"},
    {"out null", [](HostCall& c) { c.out_t.data = nullptr; }, "out: data pointer is null"},
    {"lse null", [](HostCall& c) { c.lse_t.data = nullptr; }, "lse: data pointer is null"},
    {"dout null", [](HostCall& c) { c.dout_t.data = nullptr; }, "dout: data pointer is null", false},
    {"dk null", [](HostCall& c) { c.dk_t.data = nullptr; }, "dk: data pointer is null", false},
    {"q misaligned", [](HostCall& c) { c.args.q.data = static_cast<char*>(c.args.q.data) + 1; },
     "q: data pointer"},
    {"q misaligned, the reason", [](HostCall& c) { c.args.q.data = static_cast<char*>(c.args.q.data) + 1; },
     "is not 2-byte aligned (its element size)"},
    {"lse misaligned", [](HostCall& c) { c.lse_t.data = static_cast<char*>(c.lse_t.data) + 2; },
     "lse: data pointer"},
    {"lse misaligned, the reason", [](HostCall& c) { c.lse_t.data = static_cast<char*>(c.lse_t.data) + 2; },
     "is not 4-byte aligned (its element size)"},
    {"cu_seqlens misaligned", [](HostCall& c) { c.args.cu_seqlens.data = reinterpret_cast<char*>(c.cu.data()) + 1; },
     "cu_seqlens: data pointer"},
    // ---- devices -----------------------------------------------------------------------
    {"k on a device", [](HostCall& c) { c.args.k.device = 0; }, "device mismatch: q on host, k on cuda:0"},
    {"cu_seqlens on a device", [](HostCall& c) { c.args.cu_seqlens.device = 1; },
     "device mismatch: q on host, cu_seqlens on cuda:1"},
    {"out on a device", [](HostCall& c) { c.out_t.device = 0; }, "device mismatch: q on host, out on cuda:0"},
    {"lse on a device", [](HostCall& c) { c.lse_t.device = 2; }, "device mismatch: q on host, lse on cuda:2"},
    {"dv on a device", [](HostCall& c) { c.dv_t.device = 0; }, "device mismatch: q on host, dv on cuda:0", false},
    {"q on device, k on host",
     [](HostCall& c) {
       c.args.q.device = 0;
       c.args.q.data = fake_device_ptr();
     },
     "device mismatch: q on cuda:0, k on host"},
    {"invalid device", [](HostCall& c) { c.args.v.device = -2; },
     "v: device -2 is neither FLAMIA_DEVICE_HOST (-1) nor a CUDA device ordinal"},
    {"invalid q device", [](HostCall& c) { c.args.q.device = -7; }, "q: device -7 is neither"},
    // ---- device-only rules (checked before any CUDA call, so no GPU is needed) -----------
    {"device q not 16-byte aligned",
     [](HostCall& c) {
       move_all_to_device(c);
       c.args.q.data = fake_device_ptr(8);
     },
     "q: data pointer 0x7f0000000008 is not 16-byte aligned (required on the device)"},
    {"device dq not 16-byte aligned",
     [](HostCall& c) {
       move_all_to_device(c);
       c.dq_t.data = fake_device_ptr(2);
     },
     "dq: data pointer", false},
    {"device lse not 16-byte aligned",
     [](HostCall& c) {
       move_all_to_device(c);
       c.lse_t.data = fake_device_ptr(4);
     },
     "lse: data pointer"},
    {"device q token stride not 16 bytes",
     [](HostCall& c) {
       move_all_to_device(c);
       c.args.q.strides[0] = 4 * 64 + 4;
     },
     "q: strides must be multiples of 16 bytes on the device"},
    {"device dout head stride not 16 bytes",
     [](HostCall& c) {
       move_all_to_device(c);
       c.dout_t.strides[1] = 68;
       c.dout_t.strides[0] = 4 * 68;
     },
     "dout: strides must be multiples of 16 bytes on the device", false},
};

class BadArgument : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadArgument, IsRejectedWithAMessageNamingIt) {
  const BadCase& bc = GetParam();
  HostCall c({5, 70, 20}, 4, 2, 64, true);
  bc.mutate(c);
  if (bc.forward) {
    EXPECT_EQ(c.forward(), bc.status);
    const std::string msg = flamia_last_error();
    EXPECT_NE(msg.find(bc.message), std::string::npos) << "message: " << msg;
    EXPECT_TRUE(all_poison(c.out)) << "a rejected forward wrote out";
    EXPECT_TRUE(all_poison(c.lse)) << "a rejected forward wrote lse";
  }
  // The backward validates the same common arguments (and its own tensors).
  EXPECT_EQ(c.backward(), bc.status);
  const std::string msg = flamia_last_error();
  EXPECT_NE(msg.find(bc.message), std::string::npos) << "message: " << msg;
  EXPECT_TRUE(all_poison(c.dq) && all_poison(c.dk) && all_poison(c.dv)) << "a rejected backward wrote a gradient";
}

INSTANTIATE_TEST_SUITE_P(Api, BadArgument, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           std::string n = info.param.what;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(Api, NullArgs) {
  HostCall c({10}, 1, 1, 64, true);
  EXPECT_EQ(flamia_forward(nullptr, c.out_t, c.lse_t, nullptr, 0, 0), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flamia_last_error(), "args: null pointer");
  EXPECT_EQ(flamia_backward(nullptr, c.dout_t, c.out_t, c.lse_t, nullptr, 0, nullptr, 0, c.dq_t, c.dk_t, c.dv_t),
            FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flamia_quantize_qkv(nullptr, nullptr, 0, 0), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flamia_last_error(), "args: null pointer");
}

// The device backward reads q, k, v only from qkv8 (both recipes: fp8_mixed's BF16 q and k
// as the quantizer copied them there), so their descriptors may come without data
// (flamia.h); host calls quantize q, k, v themselves and still need it. Validation runs
// without a GPU: the call fails afterwards (no buffers here), never on q's data.
// The device backward reads v (and with fp8 also q, k) from qkv8; fp8_mixed's reads q and k.
TEST(Api, DeviceBackwardTakesQkvWithoutData) {
  for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    HostCall c({5, 70, 20}, 4, 2, 64, true, recipe);
    move_all_to_device(c);
    const bool mixed = recipe == FLAMIA_RECIPE_FP8_MIXED;
    c.args.v.data = nullptr;
    if (!mixed) c.args.q.data = c.args.k.data = nullptr;
    EXPECT_NE(c.backward(), FLAMIA_SUCCESS);
    const std::string msg = flamia_last_error();
    EXPECT_EQ(msg.find("data pointer is null"), std::string::npos) << "recipe " << int(recipe) << ": " << msg;
    if (mixed) {
      c.args.k.data = nullptr;
      EXPECT_EQ(c.backward(), FLAMIA_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(flamia_last_error()).find("k: data pointer is null, but recipe fp8_mixed"),
                std::string::npos)
          << flamia_last_error();
      c.args.q.data = nullptr;
    }
    // The forward always reads q, k, v.
    EXPECT_EQ(c.forward(), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flamia_last_error()).find("q: data pointer is null"), std::string::npos);
  }
  HostCall host({5, 70, 20}, 4, 2, 64, true, FLAMIA_RECIPE_FP8);
  host.args.v.data = nullptr;
  EXPECT_EQ(host.backward(), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("v: data pointer is null"), std::string::npos);
}

#if defined(FLAMIA_WITH_CUDA)
// The quantized-operand buffer and the workspace of a device call are checked before any CUDA
// call, so this runs without a GPU: each error names the argument and the size it needs.
TEST(Api, DeviceBuffersAreCheckedByName) {
  for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    SCOPED_TRACE(int(recipe));
    HostCall c({5, 70, 20}, 4, 2, 64, true, recipe);
    move_all_to_device(c);
    const size_t fwd = flamia_qkv8_bytes(95, 3, 4, 2, 64, recipe, 0), bwd = flamia_qkv8_bytes(95, 3, 4, 2, 64, recipe, 1);
    const size_t ws = flamia_backward_workspace_bytes(95, 3, 4, 2, 64, recipe);
    ASSERT_GT(fwd, 0u);
    ASSERT_GT(bwd, fwd);
    ASSERT_GT(ws, 0u);
    auto expect_error = [](flamia_status st, const std::string& want) {
      EXPECT_EQ(st, FLAMIA_ERROR_INVALID_ARGUMENT);
      EXPECT_EQ(std::string(flamia_last_error()), want);
    };
    const std::string n_fwd = std::to_string(fwd), n_bwd = std::to_string(bwd);
    expect_error(flamia_forward(&c.args, c.out_t, c.lse_t, nullptr, 0, 0),
                 "qkv8_bytes: 0 is less than the " + n_fwd + " bytes required (flamia_qkv8_bytes(..., for_backward = 0))");
    expect_error(flamia_forward(&c.args, c.out_t, c.lse_t, fake_device_ptr(), fwd - 1, 0),
                 "qkv8_bytes: " + std::to_string(fwd - 1) + " is less than the " + n_fwd +
                     " bytes required (flamia_qkv8_bytes(..., for_backward = 0))");
    expect_error(flamia_forward(&c.args, c.out_t, c.lse_t, nullptr, fwd, 0),
                 "qkv8: null pointer, but " + n_fwd + " bytes are required");
    expect_error(flamia_forward(&c.args, c.out_t, c.lse_t, fake_device_ptr(8), fwd, 0),
                 "qkv8: pointer 0x7f0000000008 is not 16-byte aligned");
    expect_error(flamia_quantize_qkv(&c.args, fake_device_ptr(), fwd, 1),
                 "qkv8_bytes: " + n_fwd + " is less than the " + n_bwd +
                     " bytes required (flamia_qkv8_bytes(..., for_backward = 1))");
    // The backward needs the for_backward buffer, then its workspace.
    expect_error(flamia_backward(&c.args, c.dout_t, c.out_t, c.lse_t, fake_device_ptr(), fwd, fake_device_ptr(), ws,
                                 c.dq_t, c.dk_t, c.dv_t),
                 "qkv8_bytes: " + n_fwd + " is less than the " + n_bwd +
                     " bytes required (flamia_qkv8_bytes(..., for_backward = 1))");
    expect_error(flamia_backward(&c.args, c.dout_t, c.out_t, c.lse_t, fake_device_ptr(), bwd, nullptr, 0, c.dq_t,
                                 c.dk_t, c.dv_t),
                 "workspace_bytes: 0 is less than the " + std::to_string(ws) +
                     " bytes required (flamia_backward_workspace_bytes)");
    expect_error(flamia_backward(&c.args, c.dout_t, c.out_t, c.lse_t, fake_device_ptr(), bwd, nullptr, ws, c.dq_t,
                                 c.dk_t, c.dv_t),
                 "workspace: null pointer, but " + std::to_string(ws) + " bytes are required");
  }
}
#endif

#if !defined(FLAMIA_WITH_CUDA)
TEST(Api, DeviceCallInACpuBuildIsUnsupported) {
  HostCall c({5, 70, 20}, 4, 2, 64, true);
  move_all_to_device(c);
  EXPECT_EQ(c.forward(), FLAMIA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(flamia_last_error()).find("built without CUDA"), std::string::npos) << flamia_last_error();
  EXPECT_EQ(c.backward(), FLAMIA_ERROR_UNSUPPORTED);
  EXPECT_EQ(flamia_quantize_qkv(&c.args, fake_device_ptr(), 1 << 20, 1), FLAMIA_ERROR_UNSUPPORTED);
  EXPECT_EQ(flamia_gpu_available(), 0);
  EXPECT_NE(std::string(flamia_version_string()).find("cpu only"), std::string::npos);
}
#endif

// =========================================================================================
// Sizes, last error, version, C++ wrappers
// =========================================================================================

TEST(Api, BufferSizesRejectInvalidArguments) {
  struct Bad { int64_t T, B; int hq, hkv, d; flamia_recipe r; const char* msg; };
  const Bad bad[] = {
      {-1, 1, 4, 2, 64, FLAMIA_RECIPE_FP8, "total_tokens: -1"},
      {100, 0, 4, 2, 64, FLAMIA_RECIPE_FP8, "num_docs: 0"},
      {100, 1, 0, 1, 64, FLAMIA_RECIPE_FP8, "hq: must be >= 1"},
      {100, 1, 4, 0, 64, FLAMIA_RECIPE_FP8, "hkv: must be >= 1"},
      {100, 1, 3, 2, 64, FLAMIA_RECIPE_FP8, "hkv: Hq = 3 is not a multiple of Hkv = 2"},
      {100, 1, 4, 2, 80, FLAMIA_RECIPE_FP8, "head_dim: head dim unsupported: 80"},
      {100, 1, 4, 2, 64, flamia_recipe(5), "recipe: unknown value 5"},
  };
  for (const Bad& b : bad) {
    EXPECT_EQ(flamia_qkv8_bytes(b.T, b.B, b.hq, b.hkv, b.d, b.r, 1), 0u) << b.msg;
    EXPECT_NE(std::string(flamia_last_error()).find(b.msg), std::string::npos) << flamia_last_error();
    EXPECT_EQ(flamia_backward_workspace_bytes(b.T, b.B, b.hq, b.hkv, b.d, b.r), 0u) << b.msg;
    EXPECT_NE(std::string(flamia_last_error()).find(b.msg), std::string::npos) << flamia_last_error();
  }
#if defined(FLAMIA_WITH_CUDA)
  const size_t fwd = flamia_qkv8_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8, 0);
  const size_t bwd = flamia_qkv8_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8, 1);
  EXPECT_GT(fwd, 0u);
  EXPECT_GE(bwd, fwd);
  EXPECT_GT(flamia_backward_workspace_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8), 0u);
#else
  EXPECT_EQ(flamia_qkv8_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8, 1), 0u) << "no device buffers without CUDA";
#endif
}

#if defined(FLAMIA_WITH_CUDA)
// The workspace of one call: the plain query's plus, where the stored dS is on (fp8_mixed at
// D = 128 by default, every call with FLAMIA_BWD_DQ=hbm, none with recompute), its tiles —
// query head runs bounded from T, B and max_seqlen, one slab of kv heads under
// FLAMIA_BWD_DS_MIB (at least one), the documents' bases — host arithmetic, no GPU.
TEST(Api, WorkspaceForTheCallSizesTheStoredDs) {
  unsetenv("FLAMIA_BWD_DQ");
  unsetenv("FLAMIA_BWD_DS_MIB");
  HostCall c({500, 300, 200}, 8, 2, 128, true, FLAMIA_RECIPE_FP8_MIXED);
  flamia_attention_args a = c.args;
  for (flamia_tensor* t : {&a.q, &a.k, &a.v, &a.cu_seqlens}) t->device = 0;
  a.q.data = a.k.data = a.v.data = nullptr;  // as flamia_backward, the device call needs no q, k, v data
  ASSERT_EQ(a.max_seqlen, 500);
  const size_t mixed = flamia_backward_workspace_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8_MIXED);
  const size_t fp8 = flamia_backward_workspace_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8);
  ASSERT_GT(mixed, 0u);
  // At most 16 + 3 query tiles over the documents, 8 in one: (19 * 9 + 1) / 2 = 86 causal
  // tiles a query head, 19 * 8 = 152 not causal; 8 KB a tile (fp8: 4 KB of codes + 256 B).
  const size_t both_heads = mixed + 256 + size_t(2 * 4) * 86 * 8192;
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), both_heads)
      << "the default stores fp8_mixed's dS at D = 128: both kv heads (4 query heads each) in one slab (44 CTAs of work a kv head, far from six waves; 5.6 MB); "
      << flamia_last_error();
  setenv("FLAMIA_BWD_DQ", "auto", 1);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), both_heads) << "auto is the default";
  setenv("FLAMIA_BWD_DQ", "recompute", 1);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), mixed) << "recompute stores nothing";
  unsetenv("FLAMIA_BWD_DQ");
  {
    HostCall d64({500, 300, 200}, 8, 2, 64, true, FLAMIA_RECIPE_FP8_MIXED);
    flamia_attention_args b = d64.args;
    for (flamia_tensor* t : {&b.q, &b.k, &b.v, &b.cu_seqlens}) t->device = 0;
    b.q.data = b.k.data = b.v.data = nullptr;
    EXPECT_EQ(flamia_backward_workspace_bytes_for(&b),
              flamia_backward_workspace_bytes(1000, 3, 8, 2, 64, FLAMIA_RECIPE_FP8_MIXED))
        << "the default recomputes at D = 64";
  }
  setenv("FLAMIA_BWD_DQ", "hbm", 1);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), both_heads);
  setenv("FLAMIA_BWD_DS_MIB", "1", 1);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), mixed + 256 + size_t(4) * 86 * 8192)
      << "a budget below one kv head: one a slab";
  a.causal = 0;
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), mixed + 256 + size_t(4) * 152 * 8192);
  a.recipe = FLAMIA_RECIPE_FP8;
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), fp8 + 256 + size_t(4) * 152 * (4096 + 256));
  unsetenv("FLAMIA_BWD_DS_MIB");
  unsetenv("FLAMIA_BWD_DQ");
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), fp8) << "the default recomputes fp8's dS";
  // A value that is no option fails at the size queries already, naming the variable.
  setenv("FLAMIA_BWD_DQ", "stored", 1);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), 0u);
  EXPECT_NE(std::string(flamia_last_error()).find("FLAMIA_BWD_DQ: 'stored'"), std::string::npos) << flamia_last_error();
  EXPECT_EQ(flamia_backward_workspace_bytes(1000, 3, 8, 2, 128, FLAMIA_RECIPE_FP8), 0u);
  EXPECT_NE(std::string(flamia_last_error()).find("FLAMIA_BWD_DQ"), std::string::npos) << flamia_last_error();
  unsetenv("FLAMIA_BWD_DQ");
  // The slabs of the benchmark's shapes (fp8_mixed, causal): the fewest kv heads that give the
  // dK/dV launch 768 CTAs' work, within the budget (default 2 GiB), at least one.
  const auto sized = [&](int64_t T, int B, int hq, int hkv, int max_seqlen) {
    flamia_attention_args b = a;
    b.recipe = FLAMIA_RECIPE_FP8_MIXED;
    b.causal = 1;
    b.q.shape[0] = b.k.shape[0] = b.v.shape[0] = T;
    b.q.shape[1] = hq;
    b.k.shape[1] = b.v.shape[1] = hkv;
    b.q.strides[0] = int64_t(hq) * 128;
    b.k.strides[0] = b.v.strides[0] = int64_t(hkv) * 128;
    b.cu_seqlens.shape[0] = B + 1;
    b.max_seqlen = max_seqlen;
    const size_t plain = flamia_backward_workspace_bytes(T, B, hq, hkv, 128, FLAMIA_RECIPE_FP8_MIXED);
    const size_t got = flamia_backward_workspace_bytes_for(&b);
    EXPECT_GT(got, plain) << flamia_last_error();
    return got - plain;
  };
  std::vector<int32_t> cu(46, 0);  // the size functions read only cu_seqlens' shape on the device
  a.cu_seqlens.data = cu.data();
  // A head's run: N = T / 64 + B query tiles, M = max_seqlen / 64, (N (M + 1) + 1) / 2 tiles
  // of 8 KB; CTAs a kv head: T / 128 + B work-list slots.
  const auto run = [](int64_t T, int B, int max_seqlen) {
    const int64_t n = T / 64 + B, m = max_seqlen / 64;
    return size_t((n * (m + 1) + 1) / 2) * 8192;
  };
  EXPECT_EQ(sized(32768, 8, 16, 16, 4096), 256 + 3 * run(32768, 8, 4096)) << "fixed-4k: 264 CTAs a head, three";
  EXPECT_EQ(sized(32768, 2, 16, 16, 16384), 256 + 3 * run(32768, 2, 16384)) << "fixed-16k: 258 a head, three";
  EXPECT_EQ(sized(65536, 45, 32, 8, 7428), 512 + 4 * ((int64_t(1069) * 118 + 1) / 2) * size_t(8192))
      << "llama8b-pack: one kv head (557 CTAs x 4 query heads) and its four query heads; 45 bases";
  setenv("FLAMIA_BWD_DS_MIB", "1024", 1);
  EXPECT_EQ(sized(32768, 2, 16, 16, 16384), 256 + run(32768, 2, 16384)) << "fixed-16k within 1 GiB: one";
  unsetenv("FLAMIA_BWD_DS_MIB");
  // FLAMIA_BWD_DS_OVERLAP=1: a second slab buffer where there are two slabs or more; one slab
  // (the small call above: both kv heads in one) keeps one buffer. Any other value is off.
  setenv("FLAMIA_BWD_DS_OVERLAP", "1", 1);
  EXPECT_EQ(sized(32768, 2, 16, 16, 16384), 256 + 2 * 3 * run(32768, 2, 16384)) << "fixed-16k: two slabs' buffers";
  EXPECT_EQ(sized(65536, 45, 32, 8, 7428), 512 + 2 * 4 * ((int64_t(1069) * 118 + 1) / 2) * size_t(8192))
      << "llama8b-pack: two one-kv-head buffers";
  EXPECT_EQ(sized(1000, 3, 8, 2, 500), both_heads - mixed) << "one slab: one buffer";
  setenv("FLAMIA_BWD_DS_OVERLAP", "yes", 1);
  EXPECT_EQ(sized(32768, 2, 16, 16, 16384), 256 + 3 * run(32768, 2, 16384)) << "only 1 turns it on";
  unsetenv("FLAMIA_BWD_DS_OVERLAP");
  // Host calls need no workspace; invalid arguments give 0 and name what is wrong.
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&c.args), 0u);
  EXPECT_EQ(flamia_backward_workspace_bytes_for(nullptr), 0u);
  EXPECT_NE(std::string(flamia_last_error()).find("args"), std::string::npos) << flamia_last_error();
  a.q.shape[1] = 3;
  a.q.strides[0] = 3 * 128;
  EXPECT_EQ(flamia_backward_workspace_bytes_for(&a), 0u);
  EXPECT_NE(std::string(flamia_last_error()).find("not a multiple"), std::string::npos) << flamia_last_error();
}
#endif

// The dQ path the backward takes, as FLAMIA_BWD_DQ selects it (host code: no GPU needed); the
// same decision sm90::backward and the workspace query make.
TEST(Api, BackwardDqPathFollowsTheSwitch) {
  const auto path = [](flamia_recipe r, int d) {
    flamia_dq_path p = flamia_dq_path(-1);
    EXPECT_EQ(flamia_backward_dq_path(r, d, &p), FLAMIA_SUCCESS) << flamia_last_error();
    return p;
  };
  const flamia_recipe kMixed = FLAMIA_RECIPE_FP8_MIXED, kFp8 = FLAMIA_RECIPE_FP8;
  unsetenv("FLAMIA_BWD_DQ");
#if defined(FLAMIA_WITH_CUDA)
  EXPECT_EQ(path(kMixed, 128), FLAMIA_DQ_STORED) << "the default stores fp8_mixed's dS at D = 128";
  EXPECT_EQ(path(kMixed, 64), FLAMIA_DQ_RECOMPUTE);
  EXPECT_EQ(path(kFp8, 128), FLAMIA_DQ_RECOMPUTE);
  setenv("FLAMIA_BWD_DQ", "recompute", 1);
  EXPECT_EQ(path(kMixed, 128), FLAMIA_DQ_RECOMPUTE);
  setenv("FLAMIA_BWD_DQ", "hbm", 1);
  for (const flamia_recipe r : {kMixed, kFp8})
    for (const int d : {64, 128}) EXPECT_EQ(path(r, d), FLAMIA_DQ_STORED_REQUIRED) << "hbm stores every call's";
  setenv("FLAMIA_BWD_DQ", "fused", 1);
  EXPECT_EQ(path(kMixed, 128), FLAMIA_DQ_FUSED);
  EXPECT_EQ(path(kMixed, 64), FLAMIA_DQ_RECOMPUTE) << "the fused dQ is fp8_mixed's at D = 128 only";
  EXPECT_EQ(path(kFp8, 128), FLAMIA_DQ_RECOMPUTE);
  setenv("FLAMIA_BWD_DQ", "stored", 1);
  flamia_dq_path p = FLAMIA_DQ_RECOMPUTE;
  EXPECT_EQ(flamia_backward_dq_path(kMixed, 128, &p), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("FLAMIA_BWD_DQ: 'stored'"), std::string::npos) << flamia_last_error();
  unsetenv("FLAMIA_BWD_DQ");
#else
  EXPECT_EQ(path(kMixed, 128), FLAMIA_DQ_RECOMPUTE) << "no device backward without CUDA";
#endif
  flamia_dq_path q = FLAMIA_DQ_RECOMPUTE;
  EXPECT_EQ(flamia_backward_dq_path(kMixed, 96, &q), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("head_dim"), std::string::npos) << flamia_last_error();
  EXPECT_EQ(flamia_backward_dq_path(flamia_recipe(7), 128, &q), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("recipe"), std::string::npos) << flamia_last_error();
  EXPECT_EQ(flamia_backward_dq_path(kMixed, 128, nullptr), FLAMIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flamia_last_error()).find("path"), std::string::npos) << flamia_last_error();
}

TEST(Api, LastErrorIsPerThreadAndKeptAfterSuccess) {
  HostCall bad({10}, 1, 1, 64, true);
  bad.args.recipe = flamia_recipe(9);
  ASSERT_EQ(bad.forward(), FLAMIA_ERROR_INVALID_ARGUMENT);
  const std::string mine = flamia_last_error();
  std::string other = "unset";
  std::thread([&] { other = flamia_last_error(); }).join();
  EXPECT_EQ(other, "") << "another thread saw this thread's error";
  HostCall good({10}, 1, 1, 64, true);
  ASSERT_EQ(good.forward(), FLAMIA_SUCCESS);
  EXPECT_EQ(std::string(flamia_last_error()), mine) << "the last failure's message stays until the next failure";
}

TEST(Api, VersionString) {
  const std::string v = flamia_version_string();
  EXPECT_EQ(v.rfind("flamia 0.1.0 (", 0), 0u) << v;
  EXPECT_EQ(v.back(), ')');
}

TEST(Api, CppWrappersThrowWithStatusAndMessage) {
  HostCall c({30, 2}, 2, 2, 64, true);
  EXPECT_NO_THROW(flamia::forward(c.args, c.out_t, c.lse_t));
  EXPECT_NO_THROW(flamia::backward(c.args, c.dout_t, c.out_t, c.lse_t, c.dq_t, c.dk_t, c.dv_t));
  flamia_attention_args bad = c.args;
  bad.k.shape[2] = 128;
  try {
    flamia::forward(bad, c.out_t, c.lse_t);
    FAIL() << "no exception";
  } catch (const flamia::Error& e) {
    EXPECT_EQ(e.status(), FLAMIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("k: expected shape"), std::string::npos) << e.what();
  }
  const flamia_tensor t = flamia::make_tensor(c.out.data(), FLAMIA_DTYPE_BF16, {95, 4, 64});
  EXPECT_EQ(t.strides[0], 256);
  EXPECT_EQ(t.strides[1], 64);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(flamia::numel(t), 95 * 4 * 64);
  EXPECT_EQ(flamia::dtype_size(FLAMIA_DTYPE_FP32), 4u);
  EXPECT_THROW(flamia::make_strided_tensor(nullptr, FLAMIA_DTYPE_BF16, {1, 2}, {1}), flamia::Error);
  unsetenv("FLAMIA_BWD_DQ");
  EXPECT_EQ(flamia::backward_dq_path(FLAMIA_RECIPE_FP8, 64), FLAMIA_DQ_RECOMPUTE);
  EXPECT_THROW(flamia::backward_dq_path(FLAMIA_RECIPE_FP8, 80), flamia::Error);
}

// =========================================================================================
// q_start: a document's first query rows (flamia.h)
// =========================================================================================

// Rows at or after q_start equal the call without it bit for bit (O, LSE, dQ); rows before
// it are left untouched; dK/dV are the sums over the later queries alone — bitwise the call
// without q_start whose dO and O rows before q_start are zero (their P·dO and dS are zero,
// and a zero tile product leaves an FP32 sum unchanged). Nothing the call reads of a
// keys-only row's query side (q, dO, O, LSE) reaches an output.
TEST(Api, QStartComputesTheLaterRowsAsTheFullCallDoes) {
  const std::vector<int> lengths = {300, 70, 513, 128, 256};
  const std::vector<int32_t> q_start = {128, 0, 384, 128, 0};
  for (const bool causal : {true, false})
    for (const flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "non-causal") + (recipe == FLAMIA_RECIPE_FP8 ? " fp8" : " fp8_mixed"));
      const int hq = 4, hkv = 2, dim = 64;
      HostCall full(lengths, hq, hkv, dim, causal, recipe, 11);
      ASSERT_EQ(full.forward(), FLAMIA_SUCCESS) << flamia_last_error();
      ASSERT_EQ(full.backward(), FLAMIA_SUCCESS) << flamia_last_error();

      HostCall part(lengths, hq, hkv, dim, causal, recipe, 11);
      part.set_q_start(q_start);
      // Keys-only rows' query side is garbage: it must not matter.
      const int64_t T = part.pk.p.total_tokens;
      std::vector<char> keys_only(size_t(T), 0);
      for (size_t b = 0; b < lengths.size(); ++b)
        for (int i = 0; i < q_start[b]; ++i) keys_only[size_t(part.cu[b] + i)] = 1;
      for (int64_t t = 0; t < T; ++t) {
        if (!keys_only[size_t(t)]) continue;
        for (int x = 0; x < hq * dim; ++x) {
          part.pk.q[size_t(t * hq * dim + x)] = 0x7fc0;     // NaN
          part.pk.dout[size_t(t * hq * dim + x)] = 0xff80;  // -Inf
        }
      }
      ASSERT_EQ(part.forward(), FLAMIA_SUCCESS) << flamia_last_error();
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < hq; ++h) {
          const size_t row = size_t((t * hq + h) * dim);
          const size_t l = size_t(h * T + t);
          if (keys_only[size_t(t)]) {
            ASSERT_EQ(part.out[row], kPoison16) << "token " << t << ": a keys-only row's O was written";
            uint32_t u;
            std::memcpy(&u, &part.lse[l], 4);
            ASSERT_EQ(u, kPoison32) << "token " << t << ": a keys-only row's LSE was written";
            // The backward reads O and LSE of every row: make the unwritten ones hostile too.
            for (int d = 0; d < dim; ++d) part.out[row + size_t(d)] = 0x7fc0;
            part.lse[l] = -std::numeric_limits<float>::infinity();
          } else {
            ASSERT_TRUE(std::equal(full.out.begin() + long(row), full.out.begin() + long(row) + dim,
                                   part.out.begin() + long(row)))
                << "token " << t << " head " << h << ": O differs from the call without q_start";
            ASSERT_EQ(bits_of({full.lse[l]}, 1), bits_of({part.lse[l]}, 1)) << "token " << t;
          }
        }
      ASSERT_EQ(part.backward(), FLAMIA_SUCCESS) << flamia_last_error();
      EXPECT_TRUE(canaries_intact(part));
      for (int64_t t = 0; t < T; ++t) {
        const size_t row = size_t(t * hq * dim);
        for (int x = 0; x < hq * dim; ++x)
          ASSERT_EQ(part.dq[row + size_t(x)], keys_only[size_t(t)] ? kPoison16 : full.dq[row + size_t(x)])
              << "token " << t << ": dQ";
      }

      // dK/dV: the specification without q_start, the keys-only rows' dO and O zeroed.
      flamia::ref::Problem p = full.pk.p;
      Bits dout = full.pk.dout, out(full.out.begin(), full.out.begin() + long(T * hq * dim));
      for (int64_t t = 0; t < T; ++t)
        if (keys_only[size_t(t)])
          for (int x = 0; x < hq * dim; ++x) dout[size_t(t * hq * dim + x)] = out[size_t(t * hq * dim + x)] = 0;
      const size_t nq = size_t(T) * hq * dim, nkv = size_t(T) * hkv * dim;
      Bits dq(nq), dk(nkv), dv(nkv);
      flamia::ref::emulate_backward(p, full.config(), full.pk.q.data(), full.pk.k.data(), full.pk.v.data(),
                                    dout.data(), out.data(), full.lse.data(), dq.data(), dk.data(), dv.data());
      EXPECT_EQ(head(part.dk, nkv), dk);
      EXPECT_EQ(head(part.dv, nkv), dv);
      EXPECT_NE(head(part.dk, nkv), head(full.dk, nkv)) << "q_start must change dK (queries were left out)";
    }
}

// q_start = 0 everywhere is the call without it; q_start = L leaves a document's rows
// untouched and its dK/dV zero.
TEST(Api, QStartAtTheEndsOfTheDocument) {
  HostCall full({200, 128}, 2, 1, 128, true, FLAMIA_RECIPE_FP8, 5);
  ASSERT_EQ(full.forward(), FLAMIA_SUCCESS);
  ASSERT_EQ(full.backward(), FLAMIA_SUCCESS);
  HostCall zero({200, 128}, 2, 1, 128, true, FLAMIA_RECIPE_FP8, 5);
  zero.set_q_start({0, 0});
  ASSERT_EQ(zero.forward(), FLAMIA_SUCCESS);
  ASSERT_EQ(zero.backward(), FLAMIA_SUCCESS);
  EXPECT_EQ(zero.out, full.out);
  EXPECT_EQ(zero.dq, full.dq);
  EXPECT_EQ(zero.dk, full.dk);
  EXPECT_EQ(zero.dv, full.dv);

  HostCall last({200, 128}, 2, 1, 128, true, FLAMIA_RECIPE_FP8, 5);
  last.set_q_start({0, 128});
  ASSERT_EQ(last.forward(), FLAMIA_SUCCESS);
  last.lse = full.lse;  // the backward reads LSE; document 1's rows are not this call's
  ASSERT_EQ(last.backward(), FLAMIA_SUCCESS);
  const size_t doc1 = size_t(200) * 2 * 128, doc1_kv = size_t(200) * 1 * 128;
  EXPECT_TRUE(std::equal(full.out.begin(), full.out.begin() + long(doc1), last.out.begin()));
  for (size_t i = doc1; i < doc1 + size_t(128) * 2 * 128; ++i) {
    ASSERT_EQ(last.out[i], kPoison16);
    ASSERT_EQ(last.dq[i], kPoison16);
  }
  for (size_t i = doc1_kv; i < doc1_kv + size_t(128) * 128; ++i) {
    ASSERT_EQ(last.dk[i], 0) << "no query sees document 1's keys";
    ASSERT_EQ(last.dv[i], 0);
  }
}

}  // namespace
