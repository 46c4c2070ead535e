// Workloads and checks shared by the CPU tests and the numerics study (header only, host
// only): random packed problems, outlier and loud-document injection, relative L2 errors
// against float64, and the bitwise causal-safety / document-isolation checks of DESIGN §3.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flamia/formats.h"
#include "reference/reference.h"

namespace flamia {
namespace ref {
namespace harness {

using Bits = std::vector<uint16_t>;  // BF16 bit patterns

// One packed problem with its BF16 inputs (dout is the upstream gradient).
struct Pack {
  Problem p;
  Bits q, k, v, dout;
  int64_t doc_begin(int b) const { return p.cu_seqlens[b]; }
  int64_t doc_end(int b) const { return p.cu_seqlens[b + 1]; }
  int doc_of(int64_t t) const {
    return int(std::upper_bound(p.cu_seqlens.begin(), p.cu_seqlens.end(), int32_t(t)) -
               p.cu_seqlens.begin()) - 1;
  }
};

inline Problem make_problem(const std::vector<int>& lengths, int hq, int hkv, int dim, bool causal) {
  Problem p;
  p.hq = hq;
  p.hkv = hkv;
  p.head_dim = dim;
  p.causal = causal;
  p.softmax_scale = 1.0f / std::sqrt(float(dim));
  p.cu_seqlens.push_back(0);
  for (int L : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + L);
  p.total_tokens = p.cu_seqlens.back();
  return p;
}

inline uint16_t to_bf16(float x) { return fmt::f32_to_bf16_bits(x); }
inline float from_bf16(uint16_t b) { return fmt::bf16_bits_to_f32(b); }

// Row [t, h] of a [T, H, D] tensor.
inline uint16_t* row_ptr(Bits& x, int64_t t, int h, int heads, int dim) {
  return &x[(size_t(t) * heads + h) * dim];
}

inline void fill_normal_rows(Bits& x, int64_t t0, int64_t t1, int heads, int dim, std::mt19937_64& rng,
                             double scale = 1.0) {
  std::normal_distribution<double> n01(0.0, 1.0);
  for (size_t e = size_t(t0) * heads * dim; e < size_t(t1) * heads * dim; ++e)
    x[e] = to_bf16(float(scale * n01(rng)));
}

// Random N(0, 1) BF16 inputs on a pack of the given document lengths.
inline Pack random_pack(const std::vector<int>& lengths, int hq, int hkv, int dim, bool causal,
                        uint64_t seed) {
  Pack pk;
  pk.p = make_problem(lengths, hq, hkv, dim, causal);
  const int64_t T = pk.p.total_tokens;
  std::mt19937_64 rng(seed);
  pk.q.resize(size_t(T) * hq * dim);
  pk.k.resize(size_t(T) * hkv * dim);
  pk.v.resize(size_t(T) * hkv * dim);
  pk.dout.resize(size_t(T) * hq * dim);
  fill_normal_rows(pk.q, 0, T, hq, dim, rng);
  fill_normal_rows(pk.k, 0, T, hkv, dim, rng);
  fill_normal_rows(pk.v, 0, T, hkv, dim, rng);
  fill_normal_rows(pk.dout, 0, T, hq, dim, rng);
  return pk;
}

// Long-tailed document lengths: L = clamp(round(exp(N(mu, sigma^2))), lo, hi) until the
// pack holds `total` tokens; the last document takes what is left.
inline std::vector<int> long_tailed_lengths(int total, uint64_t seed, double mu = 5.0, double sigma = 1.0,
                                            int lo = 8, int hi = 1024) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(mu, sigma);
  std::vector<int> out;
  int left = total;
  while (left > 0) {
    int L = int(std::lround(std::exp(n(rng))));
    L = std::min(std::max(L, lo), hi);
    L = std::min(L, left);
    out.push_back(L);
    left -= L;
  }
  return out;
}

// Multiplies rows [t0, t1) (all heads) of x by f, rounding back to BF16.
inline void scale_rows(Bits& x, int64_t t0, int64_t t1, int heads, int dim, float f) {
  for (size_t e = size_t(t0) * heads * dim; e < size_t(t1) * heads * dim; ++e)
    x[e] = to_bf16(from_bf16(x[e]) * f);
}

// Outlier tokens (WORKLOADS.md): a fraction of tokens with q and k rows scaled by factor.
inline void inject_outliers(Pack& pk, double fraction, float factor, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t T = pk.p.total_tokens;
  const int64_t count = std::max<int64_t>(1, int64_t(std::llround(fraction * double(T))));
  std::vector<int64_t> idx(T);
  for (int64_t t = 0; t < T; ++t) idx[t] = t;
  std::shuffle(idx.begin(), idx.end(), rng);
  for (int64_t c = 0; c < count; ++c) {
    scale_rows(pk.q, idx[c], idx[c] + 1, pk.p.hq, pk.p.head_dim, factor);
    scale_rows(pk.k, idx[c], idx[c] + 1, pk.p.hkv, pk.p.head_dim, factor);
  }
}

// A document `factor` times louder: its q, k and v scaled.
inline void make_loud(Pack& pk, int doc, float factor) {
  const int64_t t0 = pk.doc_begin(doc), t1 = pk.doc_end(doc);
  scale_rows(pk.q, t0, t1, pk.p.hq, pk.p.head_dim, factor);
  scale_rows(pk.k, t0, t1, pk.p.hkv, pk.p.head_dim, factor);
  scale_rows(pk.v, t0, t1, pk.p.hkv, pk.p.head_dim, factor);
}

inline std::vector<double> to_double(const Bits& x) {
  std::vector<double> out(x.size());
  for (size_t e = 0; e < x.size(); ++e) out[e] = double(from_bf16(x[e]));
  return out;
}

// ---------------------------------------------------------------------------------------
// Running the emulation and the exact computation.
// ---------------------------------------------------------------------------------------
struct Outputs {
  Bits o, dq, dk, dv;
  std::vector<float> lse;  // [Hq, T]
};

inline Outputs run_emulation(const Pack& pk, const EmulationConfig& cfg, bool backward) {
  const Problem& p = pk.p;
  const size_t T = size_t(p.total_tokens);
  Outputs r;
  r.o.assign(T * p.hq * p.head_dim, 0);
  r.lse.assign(T * p.hq, 0.0f);
  emulate_forward(p, cfg, pk.q.data(), pk.k.data(), pk.v.data(), r.o.data(), r.lse.data());
  if (backward) {
    r.dq.assign(T * p.hq * p.head_dim, 0);
    r.dk.assign(T * p.hkv * p.head_dim, 0);
    r.dv.assign(T * p.hkv * p.head_dim, 0);
    emulate_backward(p, cfg, pk.q.data(), pk.k.data(), pk.v.data(), pk.dout.data(), r.o.data(),
                     r.lse.data(), r.dq.data(), r.dk.data(), r.dv.data());
  }
  return r;
}

struct ExactOutputs {
  std::vector<double> o, lse, dq, dk, dv;
};

inline ExactOutputs run_exact(const Pack& pk, bool backward) {
  const Problem& p = pk.p;
  const size_t T = size_t(p.total_tokens);
  const std::vector<double> q = to_double(pk.q), k = to_double(pk.k), v = to_double(pk.v);
  ExactOutputs r;
  r.o.resize(T * p.hq * p.head_dim);
  r.lse.resize(T * p.hq);
  exact_forward(p, q.data(), k.data(), v.data(), r.o.data(), r.lse.data());
  if (backward) {
    const std::vector<double> dout = to_double(pk.dout);
    r.dq.resize(T * p.hq * p.head_dim);
    r.dk.resize(T * p.hkv * p.head_dim);
    r.dv.resize(T * p.hkv * p.head_dim);
    exact_backward(p, q.data(), k.data(), v.data(), dout.data(), r.dq.data(), r.dk.data(), r.dv.data());
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------
inline double value_of(uint16_t b) { return double(from_bf16(b)); }
inline double value_of(float x) { return double(x); }
inline double value_of(double x) { return x; }

// ||got - ref|| / ||ref|| over elements [e0, e1) (all if e1 == 0).
template <class T>
double rel_l2(const std::vector<T>& got, const std::vector<double>& ref, size_t e0 = 0, size_t e1 = 0) {
  if (e1 == 0) e1 = ref.size();
  double num = 0.0, den = 0.0;
  for (size_t e = e0; e < e1; ++e) {
    const double d = value_of(got[e]) - ref[e];
    num += d * d;
    den += ref[e] * ref[e];
  }
  return std::sqrt(num / den);
}

// Relative L2 error of [T, H, D] rows of tokens outside document `skip_doc`.
template <class T>
double rel_l2_outside_doc(const std::vector<T>& got, const std::vector<double>& ref, const Pack& pk,
                          int heads, int skip_doc) {
  const size_t row = size_t(heads) * pk.p.head_dim;
  double num = 0.0, den = 0.0;
  for (int64_t t = 0; t < pk.p.total_tokens; ++t) {
    if (pk.doc_of(t) == skip_doc) continue;
    for (size_t e = size_t(t) * row; e < size_t(t + 1) * row; ++e) {
      const double d = value_of(got[e]) - ref[e];
      num += d * d;
      den += ref[e] * ref[e];
    }
  }
  return std::sqrt(num / den);
}

struct Errors {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

inline Errors errors(const Outputs& got, const ExactOutputs& ref) {
  Errors e;
  e.o = rel_l2(got.o, ref.o);
  e.lse = rel_l2(got.lse, ref.lse);
  if (!ref.dq.empty() && !got.dq.empty()) {
    e.dq = rel_l2(got.dq, ref.dq);
    e.dk = rel_l2(got.dk, ref.dk);
    e.dv = rel_l2(got.dv, ref.dv);
  }
  return e;
}

inline bool all_finite(const Bits& x) {
  for (uint16_t b : x)
    if (!fmt::is_finite_f32(from_bf16(b))) return false;
  return true;
}
inline bool all_finite(const std::vector<float>& x) {
  for (float f : x)
    if (!fmt::is_finite_f32(f)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------
// Bitwise property checks (DESIGN §3.1 and §3.2).
// ---------------------------------------------------------------------------------------
enum class Perturbation {
  Random,   // fresh N(0, 1) values
  Huge,     // the old values times 1e4
  Rescale   // the old values times 3: every per-token scale changes, the pattern does not
};

inline const char* perturbation_name(Perturbation k) {
  switch (k) {
    case Perturbation::Random: return "random";
    case Perturbation::Huge: return "huge";
    case Perturbation::Rescale: return "rescale";
  }
  return "?";
}

inline void perturb_rows(Bits& x, int64_t t0, int64_t t1, int heads, int dim, Perturbation kind,
                         std::mt19937_64& rng) {
  if (t1 <= t0) return;
  switch (kind) {
    case Perturbation::Random: fill_normal_rows(x, t0, t1, heads, dim, rng); break;
    case Perturbation::Huge: scale_rows(x, t0, t1, heads, dim, 1e4f); break;
    case Perturbation::Rescale: scale_rows(x, t0, t1, heads, dim, 3.0f); break;
  }
}

// Are rows [t0, t1) of two [T, H, D] tensors bit-identical?
inline bool same_rows(const Bits& a, const Bits& b, int64_t t0, int64_t t1, int heads, int dim) {
  return std::equal(a.begin() + size_t(t0) * heads * dim, a.begin() + size_t(t1) * heads * dim,
                    b.begin() + size_t(t0) * heads * dim);
}

inline bool same_bits(float a, float b) { return fmt::f32_bits(a) == fmt::f32_bits(b); }

// Are LSE entries of tokens [t0, t1) (all heads) bit-identical?
inline bool same_lse(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int hq,
                     int64_t t0, int64_t t1) {
  for (int h = 0; h < hq; ++h)
    for (int64_t t = t0; t < t1; ++t)
      if (!same_bits(a[size_t(h) * T + t], b[size_t(h) * T + t])) return false;
  return true;
}

struct CheckResult {
  bool forward_identical = true;   // O and LSE
  bool backward_identical = true;  // dQ (causal check) or dQ, dK, dV (isolation check)
  bool identical() const { return forward_identical && backward_identical; }
};

// Perturbs q, k, v and dout of packed tokens [t0, t1), in that order (one RNG stream).
inline void perturb_tokens(Pack& pk, int64_t t0, int64_t t1, Perturbation kind, std::mt19937_64& rng) {
  const Problem& p = pk.p;
  perturb_rows(pk.q, t0, t1, p.hq, p.head_dim, kind, rng);
  perturb_rows(pk.k, t0, t1, p.hkv, p.head_dim, kind, rng);
  perturb_rows(pk.v, t0, t1, p.hkv, p.head_dim, kind, rng);
  perturb_rows(pk.dout, t0, t1, p.hq, p.head_dim, kind, rng);
}

// Causal safety at position t (inside document `doc`): change q/k/v/dout of the tokens of
// the document after t, then compare O and LSE (forward) and dQ (backward) at the
// document's positions <= t. `base` holds the unperturbed outputs (with backward).
inline CheckResult check_causal(const Pack& pk, const EmulationConfig& cfg, const Outputs& base, int doc,
                                int t, Perturbation kind, uint64_t seed) {
  const Problem& p = pk.p;
  const int64_t d0 = pk.doc_begin(doc), d1 = pk.doc_end(doc), cut = d0 + t + 1;
  Pack alt = pk;
  std::mt19937_64 rng(seed);
  perturb_tokens(alt, cut, d1, kind, rng);
  const bool backward = !base.dq.empty();
  const Outputs r = run_emulation(alt, cfg, backward);
  CheckResult c;
  c.forward_identical = same_rows(r.o, base.o, d0, cut, p.hq, p.head_dim) &&
                        same_lse(r.lse, base.lse, p.total_tokens, p.hq, d0, cut);
  if (backward) c.backward_identical = same_rows(r.dq, base.dq, d0, cut, p.hq, p.head_dim);
  return c;
}

// Document isolation: change q/k/v/dout of document `doc`, then compare every output of
// every other token of the pack.
inline CheckResult check_isolation(const Pack& pk, const EmulationConfig& cfg, const Outputs& base, int doc,
                                   Perturbation kind, uint64_t seed) {
  const Problem& p = pk.p;
  const int64_t d0 = pk.doc_begin(doc), d1 = pk.doc_end(doc), T = p.total_tokens;
  Pack alt = pk;
  std::mt19937_64 rng(seed);
  perturb_tokens(alt, d0, d1, kind, rng);
  const bool backward = !base.dq.empty();
  const Outputs r = run_emulation(alt, cfg, backward);
  CheckResult c;
  const int D = p.head_dim;
  c.forward_identical = same_rows(r.o, base.o, 0, d0, p.hq, D) && same_rows(r.o, base.o, d1, T, p.hq, D) &&
                        same_lse(r.lse, base.lse, T, p.hq, 0, d0) && same_lse(r.lse, base.lse, T, p.hq, d1, T);
  if (backward) {
    c.backward_identical = same_rows(r.dq, base.dq, 0, d0, p.hq, D) && same_rows(r.dq, base.dq, d1, T, p.hq, D) &&
                           same_rows(r.dk, base.dk, 0, d0, p.hkv, D) && same_rows(r.dk, base.dk, d1, T, p.hkv, D) &&
                           same_rows(r.dv, base.dv, 0, d0, p.hkv, D) && same_rows(r.dv, base.dv, d1, T, p.hkv, D);
  }
  return c;
}

}  // namespace harness
}  // namespace ref
}  // namespace flamia
