// GPU fuzzer: random packs and hostile arguments through the C ABI, each case checked
// against the CPU specification (small cases) or against invariants (large ones).
//
//   flamia_fuzz [--cases N] [--seconds S] [--seed X] [--small] [--replay CASE_SEED] [--verbose]
//               [--list]
//
// Every case is generated from its own 64-bit seed (derived from --seed and the case number)
// and printed on failure; --replay runs that case alone. --small keeps every case small
// (for compute-sanitizer). --list prints the cases (and checks that each is what its class
// promises) without a GPU. Exit status: 0 all passed, 1 a failure, 77 no usable GPU.
//
// Case classes:
//   spec     T <= 640, moderate magnitudes: GPU = specification within the GPU suite's
//            tolerances (tests/gpu/checks.h), then the bitwise checks below;
//   large    1..300 documents, lengths 0..20k (many near multiples of 16/64/128), per-document
//            magnitudes 1e-30..1e30 per tensor, NaN/Inf in single elements: outputs finite
//            wherever the inputs are and the magnitudes keep the arithmetic in FP32 range;
//            a changed document (new values, or a NaN/Inf) leaves every other document's
//            outputs bit-identical and shows up in its own; with causal, a changed suffix
//            leaves the prefix's O, LSE and dQ bit-identical;
//   hostile  an invalid cu_seqlens, max_seqlen or q_start (valid first query rows elsewhere),
//            or a qkv8 / backward call whose cu_seqlens
//            differs from the quantized one: in checking mode the call fails with the
//            message the host validation gives; otherwise every affected output is NaN,
//            flamia_check_errors reports the fault once, and CUDA stays usable.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/validate.h"
#include "flamia/flamia.h"
#include "gpu_harness.h"
#include "quantize/guard.h"

namespace {

using namespace flamia_gpu_test;
namespace guard = flamia::guard;

// ---- randomness ------------------------------------------------------------------------

struct Rng {
  uint64_t s;
  uint64_t next() { return s = guard::mix64(s + 0x9e3779b97f4a7c15ull); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return n <= 0 ? 0 : int64_t(next() % uint64_t(n)); }
  bool chance(double p) { return uniform() < p; }
  // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), one draw per value
  // (millions per case); never exactly 0 (the suite's inputs avoid exact zeros).
  float normal() {
    const uint64_t x = next();
    const int sum = int(x & 0xffff) + int(x >> 16 & 0xffff) + int(x >> 32 & 0xffff) + int(x >> 48);
    const float r = float(sum - 2 * 65535) * (1.7320508f / 65536.0f);
    return r == 0.0f ? 1e-3f : r;
  }
};

// ---- case description -------------------------------------------------------------------

enum class Kind { Spec, Large, Hostile };
enum class Hostility {
  FirstNotZero, Decreasing, LastNotT, MaxSeqlen, Extreme, Qkv8Mismatch, BackwardMismatch, BackwardInvalid, QStart
};
const char* hostility_name(Hostility h) {
  static const char* n[] = {"first!=0", "decreasing", "last!=T", "max_seqlen", "extreme", "qkv8-mismatch",
                            "bwd-mismatch", "bwd-invalid", "q_start"};
  return n[int(h)];
}

struct Mag {
  double q = 1, k = 1, v = 1, dout = 1;
};

struct Fuzz {
  uint64_t seed = 0;
  Kind kind = Kind::Large;
  Case c;
  std::vector<Mag> mag;     // per document
  bool self_quantize = false;
  int max_seqlen = 0;       // passed to the call
  // Perturbation of the second run (valid cases).
  int pdoc = -1;            // changed document
  int64_t pcut = -1;        // causal: tokens after pcut (document position) change; -1: whole document
  int inject = -1;          // 0..3: NaN/Inf into q/k/v/dout instead of new values
  int64_t inj_tok = 0;
  int inj_head = 0, inj_dim = 0;
  float inj_val = 0;
  // Hostile cases.
  Hostility hostility = Hostility::LastNotT;
  std::vector<int32_t> bad_cu;  // cu_seqlens of the hostile call (same size as c.cu)
  bool checking = false;

  std::string describe() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "seed=0x%016llx ", (unsigned long long)seed);
    std::string s = buf;
    s += kind == Kind::Spec ? "spec " : kind == Kind::Large ? "large " : "hostile ";
    s += c.describe();
    if (self_quantize) s += " self-quantizing";
    if (kind == Kind::Hostile) s += std::string(" ") + hostility_name(hostility) + (checking ? " checking" : " default");
    return s;
  }
};

// Lengths with adversarial values around tile edges, zero-length documents included.
std::vector<int> gen_lengths(Rng& r, int B, int max_len) {
  std::vector<int> len(static_cast<size_t>(B));
  for (int& l : len) {
    const double u = r.uniform();
    if (u < 0.12) {
      l = 0;
    } else if (u < 0.5) {
      const int m = r.chance(0.4) ? 16 : r.chance(0.5) ? 64 : 128;
      const int k = 1 + int(r.below(std::max(1, max_len / m)));
      l = std::clamp(k * m + int(r.below(3)) - 1, 0, max_len);
    } else {
      l = 1 + int(r.below(max_len));
    }
  }
  return len;
}

// Trims the pack to at most cap tokens (keeps the document count).
void cap_tokens(std::vector<int>& len, int64_t cap) {
  int64_t total = 0;
  for (int l : len) total += l;
  for (size_t i = len.size(); total > cap && i-- > 0;) {
    const int64_t cut = std::min<int64_t>(len[i], total - cap);
    len[i] -= int(cut);
    total -= cut;
  }
}

double mag_draw(Rng& r, double lo_exp, double hi_exp) { return std::pow(10.0, lo_exp + (hi_exp - lo_exp) * r.uniform()); }

Fuzz generate(uint64_t seed, bool small) {
  Rng r{seed};
  Fuzz f;
  f.seed = seed;
  const double u = r.uniform();
  f.kind = u < 0.3 ? Kind::Spec : u < 0.85 ? Kind::Large : Kind::Hostile;
  Case& c = f.c;
  c.d = r.chance(0.5) ? 64 : 128;
  c.causal = r.chance(0.7);
  c.recipe = r.chance(0.5) ? FLAMIA_RECIPE_FP8 : FLAMIA_RECIPE_FP8_MIXED;
  std::vector<int> len;
  if (f.kind == Kind::Spec) {
    c.hkv = 1 + int(r.below(2));
    c.hq = c.hkv * (1 + int(r.below(2)));
    len = gen_lengths(r, 1 + int(r.below(12)), 300);
    cap_tokens(len, 640);
  } else {
    c.hkv = 1 << r.below(3);
    c.hq = c.hkv << r.below(3);
    while (c.hq > 8) c.hq /= 2;
    const double shape = r.uniform();
    if (small) len = gen_lengths(r, 1 + int(r.below(40)), 200);
    else if (shape < 0.25) len = gen_lengths(r, 1 + int(r.below(300)), 200);     // many short documents
    else if (shape < 0.45) len = gen_lengths(r, 1 + int(r.below(3)), 20000);     // a few long ones
    else len = gen_lengths(r, 1 + int(r.below(40)), 3000);
    // Bound the work per case: at most ~2M elements per [T, H, D] tensor (700 tokens small).
    cap_tokens(len, small ? 700 : std::max<int64_t>(256, (int64_t(1) << 21) / (int64_t(c.hq) * c.d)));
  }
  c.cu = cu_from_lengths(len);
  if (c.tokens() == 0) {  // an empty call is valid but has nothing to check: give it a token
    c.cu.back() = 1;
  }
  f.mag.assign(size_t(c.num_docs()), Mag{});
  f.self_quantize = r.chance(0.3);
  f.max_seqlen = std::max(1, c.max_seqlen());
  if (r.chance(0.2)) f.max_seqlen = r.chance(0.5) ? INT_MAX : f.max_seqlen + int(r.below(1000));

  if (f.kind == Kind::Spec) {
    // q, k keep |S c| moderate (the specification is matched to FP32-order noise, which
    // large logits amplify); v and dO span many binades per document.
    for (Mag& m : f.mag) {
      if (!r.chance(0.5)) continue;
      m.q = mag_draw(r, -3, 0.3);
      m.k = mag_draw(r, -3, 0.3);
      m.v = mag_draw(r, -10, 10);
      m.dout = mag_draw(r, -10, 10);
    }
  } else if (f.kind == Kind::Large) {
    for (Mag& m : f.mag) {
      if (!r.chance(0.5)) continue;
      for (double* x : {&m.q, &m.k, &m.v, &m.dout})
        if (r.chance(0.5)) *x = mag_draw(r, -30, 30);
    }
  }

  if (f.kind != Kind::Hostile) {
    std::vector<int> nonempty;
    for (int b = 0; b < c.num_docs(); ++b)
      if (c.doc_len(b) > 0) nonempty.push_back(b);
    f.pdoc = nonempty[size_t(r.below(int64_t(nonempty.size())))];
    const int64_t L = c.doc_len(f.pdoc);
    const double p = r.uniform();
    if (f.kind == Kind::Large && p < 0.35) {
      f.inject = int(r.below(4));
      f.inj_tok = r.below(L);
      f.inj_head = int(r.below(f.inject == 0 || f.inject == 3 ? c.hq : c.hkv));
      f.inj_dim = int(r.below(c.d));
      f.inj_val = r.chance(0.5) ? NAN : r.chance(0.5) ? INFINITY : -INFINITY;
    } else if (c.causal && p < 0.7) {
      f.pcut = r.below(L);
    }
    return f;
  }

  // Hostile.
  f.hostility = Hostility(r.below(9));
  f.checking = r.chance(0.25);
  f.bad_cu = c.cu;
  const int B = c.num_docs();
  std::vector<int32_t>& h = f.bad_cu;
  switch (f.hostility) {
    case Hostility::FirstNotZero: h[0] = r.chance(0.5) ? int32_t(1 + r.below(100)) : -int32_t(1 + r.below(100)); break;
    case Hostility::Decreasing: {
      const int i = 1 + int(r.below(B));
      h[size_t(i)] = h[size_t(i) - 1] - int32_t(1 + r.below(500));
      break;
    }
    case Hostility::LastNotT: h[size_t(B)] += r.chance(0.5) ? int32_t(1 + r.below(5000)) : -int32_t(1 + r.below(h[size_t(B)] + 1)); break;
    case Hostility::MaxSeqlen:
      f.max_seqlen = std::max(1, c.max_seqlen() - 1 - int(r.below(std::max(1, c.max_seqlen() - 1))));
      if (c.max_seqlen() <= 1) h[size_t(B)] += 5;  // nothing shorter to ask for: break last == T instead
      break;
    case Hostility::Extreme: {
      const int32_t vals[] = {INT_MIN, INT_MAX, -1, INT_MAX - 15, int32_t(c.tokens()) + 64};
      const int n = 1 + int(r.below(3));
      for (int k = 0; k < n; ++k) h[size_t(r.below(B + 1))] = vals[r.below(5)];
      if (h == c.cu) h[size_t(B)] = INT_MAX;
      break;
    }
    case Hostility::Qkv8Mismatch:
    case Hostility::BackwardMismatch: {
      // A valid cu_seqlens with the same T and B, but other boundaries.
      if (B < 2 || c.tokens() < 2) {
        h[size_t(B)] = h[size_t(B)] + 1;  // no other valid split exists: make it invalid
        f.hostility = Hostility::LastNotT;
        break;
      }
      const int i = 1 + int(r.below(B - 1));
      const int32_t lo = h[size_t(i) - 1], hi = h[size_t(i) + 1];
      int32_t nv = lo + int32_t(r.below(int64_t(hi) - lo + 1));
      if (nv == h[size_t(i)]) nv = nv == hi ? lo : nv + 1;
      if (nv == h[size_t(i)]) {  // lo == hi: both neighbours empty; move the first boundary instead
        h[1] = h[1] == 0 ? 1 : 0;
        if (h[1] > h[2]) h[1] = h[2];
      } else {
        h[size_t(i)] = nv;
      }
      if (h == c.cu) h[size_t(B)] += 1, f.hostility = Hostility::LastNotT;
      // Keep every document within max_seqlen: this tests the fingerprint, not max_seqlen.
      f.max_seqlen = INT_MAX;
      break;
    }
    case Hostility::BackwardInvalid: h[size_t(B)] = INT_MAX; break;
    case Hostility::QStart: {
      // Valid first queries (multiples of 128 inside each document), then one or two broken.
      c.q_start.assign(size_t(B), 0);
      for (int b = 0; b < B; ++b) c.q_start[size_t(b)] = 128 * int32_t(r.below(c.doc_len(b) / 128 + 1));
      const int n = 1 + int(r.below(2));
      for (int k = 0; k < n; ++k) {
        const size_t b = size_t(r.below(B));
        const int32_t L = c.doc_len(int(b));
        const int32_t vals[] = {INT_MIN, INT_MAX, -128, -1, L + 1, (L / 128 + 1) * 128, 1 + int32_t(r.below(127)) + 128 * int32_t(r.below(L / 128 + 1))};
        c.q_start[b] = vals[r.below(7)];
      }
      if (flamia::api::validate_q_start_values(c.q_start.data(), c.cu.data(), B).ok())
        c.q_start[0] = c.doc_len(0) + 1;  // every draw happened to be valid: break one for sure
      break;
    }
  }
  return f;
}

// ---- inputs -------------------------------------------------------------------------------

void fill(std::vector<uint16_t>& x, const Case& c, int heads, Rng& r, const std::vector<Mag>& mag,
          double Mag::*which) {
  const size_t row = size_t(heads) * c.d;
  x.resize(size_t(c.tokens()) * row);
  for (int b = 0; b < c.num_docs(); ++b) {
    const float m = float(mag[size_t(b)].*which);
    for (size_t i = size_t(c.cu[size_t(b)]) * row; i < size_t(c.cu[size_t(b) + 1]) * row; ++i) x[i] = bf16(r.normal() * m);
  }
}

Inputs make(const Fuzz& f, uint64_t salt) {
  Rng r{f.seed ^ salt};
  Inputs in;
  fill(in.q, f.c, f.c.hq, r, f.mag, &Mag::q);
  fill(in.k, f.c, f.c.hkv, r, f.mag, &Mag::k);
  fill(in.v, f.c, f.c.hkv, r, f.mag, &Mag::v);
  fill(in.dout, f.c, f.c.hq, r, f.mag, &Mag::dout);
  return in;
}

// The second run's inputs: document pdoc changed (from pcut + 1 on when causal-cut).
Inputs perturbed(const Fuzz& f, const Inputs& base) {
  Inputs in = base;
  const Case& c = f.c;
  const int64_t d0 = c.cu[size_t(f.pdoc)], d1 = c.cu[size_t(f.pdoc) + 1];
  if (f.inject >= 0) {
    std::vector<uint16_t>* t[] = {&in.q, &in.k, &in.v, &in.dout};
    const int heads = f.inject == 0 || f.inject == 3 ? c.hq : c.hkv;
    (*t[f.inject])[(size_t(d0 + f.inj_tok) * heads + f.inj_head) * c.d + f.inj_dim] = bf16(f.inj_val);
    return in;
  }
  Rng r{f.seed ^ 0x5eed};
  const int64_t from = f.pcut >= 0 ? d0 + f.pcut + 1 : d0;
  const float mul = r.chance(0.3) ? 3000.0f : r.chance(0.3) ? 1e-4f : 1.0f;
  for (auto [x, heads] : {std::pair{&in.q, c.hq}, {&in.k, c.hkv}, {&in.v, c.hkv}, {&in.dout, c.hq}})
    for (size_t i = size_t(from) * heads * c.d; i < size_t(d1) * heads * c.d; ++i) (*x)[i] = bf16(r.normal() * mul);
  return in;
}

// ---- running ------------------------------------------------------------------------------

struct Outputs {
  FwdResult f;
  BwdResult b;
};

void fill_outputs(GpuRunner& g, int byte) {
  for (const flamia_tensor& t : {g.out_view(), g.lse_view(), g.dq_view(), g.dk_view(), g.dv_view()}) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
    check_cuda(cudaMemsetAsync(t.data, byte, size_t(n) * (t.dtype == FLAMIA_DTYPE_FP32 ? 4 : 2), g.stream()), "fill");
  }
}

void upload_cu(GpuRunner& g, const std::vector<int32_t>& cu) {
  check_cuda(cudaMemcpyAsync(g.args().cu_seqlens.data, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice, g.stream()),
             "upload cu_seqlens");
  g.sync();
}

struct Statuses {
  flamia_status quantize = FLAMIA_SUCCESS, forward = FLAMIA_SUCCESS, backward = FLAMIA_SUCCESS;
  std::string message;  // of the first failure
};

// quantize (unless self-quantizing) -> forward -> backward; cu_fwd / cu_bwd are uploaded
// before the forward part / the backward. Outputs are prefilled with `byte`.
Statuses run(GpuRunner& g, const Fuzz& f, int byte, const std::vector<int32_t>& cu_fwd,
             const std::vector<int32_t>& cu_bwd, Outputs* out) {
  fill_outputs(g, byte);
  upload_cu(g, cu_fwd);
  flamia_attention_args a = g.args();
  a.max_seqlen = f.max_seqlen;
  Statuses s;
  auto note = [&](flamia_status st) {
    if (st != FLAMIA_SUCCESS && s.message.empty()) s.message = flamia_last_error();
    return st;
  };
  if (!f.self_quantize) s.quantize = note(flamia_quantize_qkv(&a, g.qkv8(), g.qkv8_bytes(), 1));
  s.forward = note(flamia_forward(&a, g.out_view(), g.lse_view(), g.qkv8(), g.qkv8_bytes(), f.self_quantize ? 0 : 1));
  if (cu_bwd != cu_fwd) upload_cu(g, cu_bwd);
  s.backward = note(flamia_backward(&a, g.dout_view(), g.out_view(), g.lse_view(), g.qkv8(), g.qkv8_bytes(),
                                    g.workspace(), g.workspace_bytes(), g.dq_view(), g.dk_view(), g.dv_view()));
  check_cuda(cudaStreamSynchronize(g.stream()), "run");
  check_cuda(cudaGetLastError(), "run (last error)");
  g.download_fwd(&out->f);
  g.download_bwd(&out->b);
  return s;
}

// ---- checks ---------------------------------------------------------------------------------

struct Verdict {
  std::vector<std::string> problems;
  void fail(const std::string& s) { problems.push_back(s); }
  bool ok() const { return problems.empty(); }
};

bool all_nan(const std::vector<uint16_t>& x) {
  for (uint16_t b : x)
    if ((b & 0x7fffu) <= 0x7f80u) return false;
  return true;
}
bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (!std::isnan(v)) return false;
  return true;
}

// Whether the outputs of document b must be finite (module comment). Forward: a bound on
// the logits |S c| (12 D mq mk scale log2e is ~20x the typical size): the specification and
// the kernels compute p = exp2(fma(s, c, -fl(m c))), whose exponent at s = m is the rounding
// error of m c, half an ulp; beyond |m c| ~ 1e8 that reaches tens and exp2 overflows, so
// larger logits give NaN/Inf (never finite numbers) — measured with the CPU specification:
// finite at logits ~1e8 for 100 keys, non-finite at ~3e8 for 300 keys. Backward: dS, dQ/dK
// and dV bounded well inside FP32/BF16 range.
bool expect_finite_fwd(const Fuzz& f, int b) {
  const Mag& m = f.mag[size_t(b)];
  return 12.0 * f.c.d * m.q * m.k * f.c.resolved_scale() * 1.4426950408889634 < 1e7;
}
bool expect_finite_bwd(const Fuzz& f, int b) {
  const Mag& m = f.mag[size_t(b)];
  const double L = f.c.doc_len(b);
  return expect_finite_fwd(f, b) &&
         1e4 * f.c.d * (L + 1) * m.dout * m.v * std::max({m.q, m.k, 1.0}) * f.c.resolved_scale() < 1e35 &&
         1e4 * (L + 1) * m.dout < 1e35;
}

void check_finite(const Fuzz& f, const Outputs& o, Verdict& v) {
  const Case& c = f.c;
  for (int b = 0; b < c.num_docs(); ++b) {
    const int64_t t0 = c.cu[size_t(b)], t1 = c.cu[size_t(b) + 1];
    if (t0 == t1) continue;
    const std::string doc = "document " + std::to_string(b);
    if (expect_finite_fwd(f, b)) {
      if (count_nonfinite_rows(o.f.o, c.hq, c.d, t0, t1)) v.fail(doc + ": non-finite O from finite inputs");
      if (count_nonfinite_lse(o.f.lse, c.tokens(), c.hq, t0, t1)) v.fail(doc + ": non-finite LSE from finite inputs");
    }
    if (expect_finite_bwd(f, b)) {
      if (count_nonfinite_rows(o.b.dq, c.hq, c.d, t0, t1)) v.fail(doc + ": non-finite dQ from finite inputs");
      if (count_nonfinite_rows(o.b.dk, c.hkv, c.d, t0, t1)) v.fail(doc + ": non-finite dK from finite inputs");
      if (count_nonfinite_rows(o.b.dv, c.hkv, c.d, t0, t1)) v.fail(doc + ": non-finite dV from finite inputs");
    }
  }
}

void check_spec(const Fuzz& f, const Inputs& in, const Outputs& o, Verdict& v) {
  const Case& c = f.c;
  FwdResult sf;
  spec_forward(c, in, &sf);
  // The GPU suite's tolerances (tests/gpu/checks.h, SpecTolerance), rows counted per case.
  const RowTol o_rows{1.0 / 64, 1e-3, 1.0 / 128, 1e-3}, g_rows{1.0 / 32, 1.0 / 128, 1.0 / 4, 1.0 / 8};
  auto rows = [&](const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int heads,
                  const RowTol& tol, double l2, double soft) {
    const RowStats s = compare_rows(got, want, heads, c.d, c.cu, tol);
    if (!(s.rel_l2 <= l2) || !(s.worst_row_ratio <= 1.0) || double(s.rows_over_soft) > soft * double(s.rows) + 1)
      v.fail(std::string(what) + " vs specification: " + s.summary());
  };
  rows("O", o.f.o, sf.o, c.hq, o_rows, 2e-3, 0.01);
  double lse_diff = 0;
  for (size_t i = 0; i < sf.lse.size(); ++i) {
    const double d = std::fabs(double(o.f.lse[i]) - sf.lse[i]) / (1.0 + 1e-3 * std::fabs(sf.lse[i]));
    lse_diff = std::isnan(d) ? INFINITY : std::max(lse_diff, d);
  }
  if (!(lse_diff <= 2e-3)) v.fail("LSE vs specification: max |diff| " + std::to_string(lse_diff));
  BwdResult sb;
  spec_backward(c, in, o.f, &sb);
  rows("dQ", o.b.dq, sb.dq, c.hq, g_rows, 5e-3, 0.02);
  rows("dK", o.b.dk, sb.dk, c.hkv, g_rows, 5e-3, 0.02);
  rows("dV", o.b.dv, sb.dv, c.hkv, g_rows, 5e-3, 0.02);
}

void check_bitwise(const Fuzz& f, const Outputs& a, const Outputs& b, Verdict& v) {
  const Case& c = f.c;
  const int64_t d0 = c.cu[size_t(f.pdoc)], d1 = c.cu[size_t(f.pdoc) + 1], T = c.tokens();
  auto same = [&](int64_t t0, int64_t t1, bool grads_kv, const std::string& what) {
    if (!rows_equal(a.f.o, b.f.o, c.hq, c.d, t0, t1)) v.fail(what + ": O changed");
    if (!lse_rows_equal(a.f.lse, b.f.lse, T, c.hq, t0, t1)) v.fail(what + ": LSE changed");
    if (!rows_equal(a.b.dq, b.b.dq, c.hq, c.d, t0, t1)) v.fail(what + ": dQ changed");
    if (grads_kv && !rows_equal(a.b.dk, b.b.dk, c.hkv, c.d, t0, t1)) v.fail(what + ": dK changed");
    if (grads_kv && !rows_equal(a.b.dv, b.b.dv, c.hkv, c.d, t0, t1)) v.fail(what + ": dV changed");
  };
  const std::string tag = "document " + std::to_string(f.pdoc) + " changed";
  same(0, d0, true, tag + ", documents before it");
  same(d1, T, true, tag + ", documents after it");
  if (f.pcut >= 0) same(d0, d0 + f.pcut + 1, false, tag + " after position " + std::to_string(f.pcut) + ", its prefix");
  if (f.inject >= 0) {
    // Not laundered: the document shows a non-finite output where the value flows.
    const bool fwd = f.inject < 3;
    const int64_t n = fwd ? count_nonfinite_rows(b.f.o, c.hq, c.d, d0, d1) + count_nonfinite_lse(b.f.lse, T, c.hq, d0, d1)
                          : count_nonfinite_rows(b.b.dq, c.hq, c.d, d0, d1) +
                                count_nonfinite_rows(b.b.dk, c.hkv, c.d, d0, d1) +
                                count_nonfinite_rows(b.b.dv, c.hkv, c.d, d0, d1);
    if (n == 0) v.fail(tag + " (NaN/Inf injected into " + "qkvd"[f.inject] + std::string(") but its outputs are finite"));
  }
}

// The fault the hostile call should report, as the host validation words it.
std::string expected_fault(const Fuzz& f) {
  guard::DeviceError e{};
  if (f.hostility == Hostility::Qkv8Mismatch || f.hostility == Hostility::BackwardMismatch) {
    e.fault = guard::kQkv8Mismatch;
  } else if (f.hostility == Hostility::QStart) {
    const flamia::api::Status st = flamia::api::validate_q_start_values(f.c.q_start.data(), f.c.cu.data(), f.c.num_docs());
    return st.ok() ? std::string() : st.message;
  } else {
    e = flamia::api::find_cu_fault(f.bad_cu.data(), f.c.num_docs(), f.c.tokens(), f.max_seqlen, 0);
  }
  return e.fault == guard::kNone ? std::string() : flamia::api::describe_fault(e);
}

void check_hostile(const Fuzz& f, GpuRunner& g, Verdict& v) {
  const std::string want = expected_fault(f);
  if (want.empty()) {
    v.fail("generator made a valid hostile cu_seqlens");
    return;
  }
  if (f.checking) setenv("FLAMIA_CHECK", "1", 1);
  else unsetenv("FLAMIA_CHECK");
  const bool fwd_bad = f.hostility != Hostility::BackwardMismatch && f.hostility != Hostility::BackwardInvalid;
  const std::vector<int32_t>& cu_fwd = fwd_bad ? f.bad_cu : f.c.cu;
  Outputs o;
  Statuses s;
  if (f.hostility == Hostility::Qkv8Mismatch) {
    // Quantize with the true cu_seqlens, then forward (filled) and backward with another.
    fill_outputs(g, 0);
    upload_cu(g, f.c.cu);
    flamia_attention_args a = g.args();
    a.max_seqlen = f.max_seqlen;
    unsetenv("FLAMIA_CHECK");
    if (flamia_quantize_qkv(&a, g.qkv8(), g.qkv8_bytes(), 1) != FLAMIA_SUCCESS) {
      v.fail(std::string("quantize with the valid cu_seqlens failed: ") + flamia_last_error());
      return;
    }
    if (f.checking) setenv("FLAMIA_CHECK", "1", 1);
    upload_cu(g, f.bad_cu);
    s.forward = flamia_forward(&a, g.out_view(), g.lse_view(), g.qkv8(), g.qkv8_bytes(), 1);
    if (s.forward != FLAMIA_SUCCESS) s.message = flamia_last_error();
    s.backward = flamia_backward(&a, g.dout_view(), g.out_view(), g.lse_view(), g.qkv8(), g.qkv8_bytes(),
                                 g.workspace(), g.workspace_bytes(), g.dq_view(), g.dk_view(), g.dv_view());
    if (s.backward != FLAMIA_SUCCESS && s.message.empty()) s.message = flamia_last_error();
    check_cuda(cudaStreamSynchronize(g.stream()), "run");
    check_cuda(cudaGetLastError(), "run (last error)");
    g.download_fwd(&o.f);
    g.download_bwd(&o.b);
  } else {
    s = run(g, f, 0, cu_fwd, f.bad_cu, &o);
  }
  unsetenv("FLAMIA_CHECK");
  const flamia_status first_bad = fwd_bad ? (s.quantize != FLAMIA_SUCCESS ? s.quantize : s.forward) : s.backward;
  if (f.checking) {
    if (first_bad != FLAMIA_ERROR_INVALID_ARGUMENT)
      v.fail("checking mode: expected FLAMIA_ERROR_INVALID_ARGUMENT, got status " + std::to_string(first_bad));
    else if (s.message.find(want) == std::string::npos)
      v.fail("checking mode: message \"" + s.message + "\" lacks \"" + want + "\"");
    if (flamia_check_errors(-1) != FLAMIA_SUCCESS)
      v.fail(std::string("checking mode: a fault was recorded on the device too: ") + flamia_last_error());
    return;
  }
  if (s.quantize != FLAMIA_SUCCESS || s.forward != FLAMIA_SUCCESS || s.backward != FLAMIA_SUCCESS)
    v.fail("default mode: a call failed at once: " + s.message);
  if (fwd_bad && !(all_nan(o.f.o) && all_nan(o.f.lse))) v.fail("default mode: forward outputs are not all NaN");
  if (!fwd_bad && (count_nonfinite(o.f.o) + count_nonfinite(o.f.lse)) != 0)
    v.fail("default mode: the valid forward before a hostile backward has non-finite outputs");
  if (!(all_nan(o.b.dq) && all_nan(o.b.dk) && all_nan(o.b.dv))) v.fail("default mode: dQ/dK/dV are not all NaN");
  const flamia_status st = flamia_check_errors(-1);
  const std::string msg = flamia_last_error();
  if (st != FLAMIA_ERROR_INVALID_ARGUMENT) v.fail("flamia_check_errors: expected a recorded fault, got status " + std::to_string(st));
  else if (msg.find(want) == std::string::npos) v.fail("flamia_check_errors: message \"" + msg + "\" lacks \"" + want + "\"");
  if (flamia_check_errors(-1) != FLAMIA_SUCCESS) v.fail("flamia_check_errors: the record was not cleared");
}

Verdict run_case(const Fuzz& f) {
  Verdict v;
  GpuRunner g(f.c);
  const Inputs base = make(f, 0x1234);
  g.upload(base);
  if (f.kind == Kind::Hostile) {
    check_hostile(f, g, v);
  } else {
    unsetenv("FLAMIA_CHECK");
    Outputs a, b;
    Statuses s = run(g, f, 0xFF, f.c.cu, f.c.cu, &a);  // NaN prefill: an unwritten output shows
    if (s.quantize || s.forward || s.backward) {
      v.fail("valid call failed: " + s.message);
      return v;
    }
    check_finite(f, a, v);
    if (f.kind == Kind::Spec) check_spec(f, base, a, v);
    g.upload(perturbed(f, base));
    s = run(g, f, 0xFF, f.c.cu, f.c.cu, &b);
    if (s.quantize || s.forward || s.backward) v.fail("valid call (second run) failed: " + s.message);
    else check_bitwise(f, a, b, v);
    if (flamia_check_errors(-1) != FLAMIA_SUCCESS) v.fail(std::string("a valid call recorded a fault: ") + flamia_last_error());
  }
  // The context is usable: a trivial CUDA call succeeds and no error is pending.
  void* probe = nullptr;
  if (cudaMalloc(&probe, 256) != cudaSuccess || cudaFree(probe) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
    v.fail("CUDA context unusable after the case");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t cases = 200;
  double seconds = 1e9;
  uint64_t seed = 1;
  bool small = false, verbose = false, replay = false, list = false;
  uint64_t replay_seed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--cases") cases = std::strtoll(val(), nullptr, 0);
    else if (a == "--seconds") seconds = std::strtod(val(), nullptr);
    else if (a == "--seed") seed = std::strtoull(val(), nullptr, 0);
    else if (a == "--replay") replay = true, replay_seed = std::strtoull(val(), nullptr, 0);
    else if (a == "--small") small = true;
    else if (a == "--verbose") verbose = true;
    else if (a == "--list") list = true;
    else {
      std::fprintf(stderr, "usage: %s [--cases N] [--seconds S] [--seed X] [--small] [--replay CASE_SEED] [--verbose] [--list]\n", argv[0]);
      return 2;
    }
  }
  if (list) {
    // Generation only: every valid case must pass the host validation, every hostile one
    // must fail it (or be a fingerprint mismatch with valid values).
    int64_t bad = 0;
    for (int64_t i = 0; i < cases; ++i) {
      const uint64_t cs = replay ? replay_seed : guard::mix64(seed * 0x100000001b3ull + uint64_t(i));
      const Fuzz f = generate(cs, small);
      const int B = f.c.num_docs();
      const auto valid = flamia::api::find_cu_fault(f.c.cu.data(), B, f.c.tokens(), f.max_seqlen, 0);
      std::string problem;
      if (f.kind != Kind::Hostile && valid.fault != guard::kNone) problem = "valid case fails validation";
      if (f.kind == Kind::Hostile) {
        const auto e = flamia::api::find_cu_fault(f.bad_cu.data(), B, f.c.tokens(), f.max_seqlen, 0);
        const bool mismatch = f.hostility == Hostility::Qkv8Mismatch || f.hostility == Hostility::BackwardMismatch;
        if (mismatch && (e.fault != guard::kNone || f.bad_cu == f.c.cu)) problem = "mismatch case is not a valid other split";
        const bool q_start_ok = f.c.q_start.empty() ||
                                flamia::api::validate_q_start_values(f.c.q_start.data(), f.c.cu.data(), B).ok();
        if (!mismatch && e.fault == guard::kNone && q_start_ok) problem = "hostile case passes validation";
      }
      if (!problem.empty()) ++bad;
      if (verbose || !problem.empty()) std::printf("%s%s%s\n", f.describe().c_str(), problem.empty() ? "" : ": ", problem.c_str());
      if (replay) break;
    }
    std::printf("listed %lld cases, %lld inconsistent\n", (long long)(replay ? 1 : cases), (long long)bad);
    return bad == 0 ? 0 : 1;
  }
  if (flamia_gpu_available() == 0) {
    std::printf("no usable sm_90 GPU: fuzzer skipped (%s)\n", flamia_version_string());
    return 77;
  }
  flamia_check_errors(-1);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int64_t run_count = 0, failures = 0, by_kind[3] = {0, 0, 0};
  std::vector<uint64_t> failed_seeds;
  const int64_t n = replay ? 1 : cases;
  for (int64_t i = 0; i < n && (replay || elapsed() < seconds); ++i) {
    const uint64_t cs = replay ? replay_seed : guard::mix64(seed * 0x100000001b3ull + uint64_t(i));
    Fuzz f;
    Verdict v;
    try {
      f = generate(cs, small);
      v = run_case(f);
    } catch (const std::exception& e) {
      v.fail(std::string("exception: ") + e.what());
    }
    ++run_count;
    ++by_kind[int(f.kind)];
    if (!v.ok()) {
      ++failures;
      failed_seeds.push_back(cs);
      std::printf("FAIL %s\n", f.describe().c_str());
      for (const std::string& p : v.problems) std::printf("     %s\n", p.c_str());
      std::printf("     replay: flamia_fuzz --replay 0x%016llx%s\n", (unsigned long long)cs, small ? " --small" : "");
    } else if (verbose) {
      std::printf("ok   %s\n", f.describe().c_str());
    }
    std::fflush(stdout);
  }
  std::printf("fuzz: %lld cases (%lld spec, %lld large, %lld hostile), %lld failures, %.1f s, seed %llu%s\n",
              (long long)run_count, (long long)by_kind[0], (long long)by_kind[1], (long long)by_kind[2],
              (long long)failures, elapsed(), (unsigned long long)seed, small ? ", small" : "");
  for (uint64_t s : failed_seeds) std::printf("failed case seed: 0x%016llx\n", (unsigned long long)s);
  return failures == 0 ? 0 : 1;
}
