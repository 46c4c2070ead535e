// Model of the Hopper wgmma accumulation (tensor_core.h). Products of E4M3 or BF16
// values are exact in double (at most 16 significant bits, exponents within [-266, 256]),
// and so is every alignment below (scaling by powers of two, integers under 2^53).
#include "reference/tensor_core.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace flamia {
namespace ref {
namespace tc {

const StepRule kHopperE4M3{32, 13, 13, -6};
const StepRule kHopperBF16{16, 25, 23, -126};

namespace {

float canonical_nan() {
  const uint32_t u = 0x7fffffffu;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// |x| cut toward zero to a multiple of 2^q, sign kept (x exact in double).
double cut(double x, int q) { return std::ldexp(std::trunc(std::ldexp(x, -q)), q); }

// The exact value v (a sum of cut terms) as the FP32 the accumulator holds: cut to
// sum_frac_bits of its own exponent and to FP32's subnormal grid (measured: a BF16 sum
// below 2^-149 gives +0 for either sign). One at or beyond 2^128 becomes Inf: not
// measured (E4M3 sums cannot get there; the probe's BF16 products stay below 2^81).
float to_accumulator(double v, int sum_frac_bits) {
  if (v == 0.0) return 0.0f;  // an exact zero sum is +0 whatever the signs of the terms
  const int e = std::ilogb(v);
  v = cut(v, e - sum_frac_bits);
  v = cut(v, -149);
  if (v == 0.0) return 0.0f;  // below FP32's smallest subnormal: +0 as well
  if (std::fabs(v) >= std::ldexp(1.0, 128)) return v > 0 ? std::numeric_limits<float>::infinity()
                                                         : -std::numeric_limits<float>::infinity();
  return float(v);  // exact: at most 24 significant bits on the FP32 grid
}


double pow2(int e) {  // 2^e for e in [-1022, 1023]
  const uint64_t u = uint64_t(1023 + e) << 52;
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

bool nan_or_inf(float x) { return (bits(x) >> 23 & 0xffu) == 0xffu; }

// A step with a NaN or Inf operand (or incoming accumulator) has a NaN or Inf term, which
// decides the result alone: the canonical NaN for a NaN, Inf - Inf or Inf * 0, else that Inf.
float special_step(int n, float c, bool has_c, const float* a, const float* b) {
  bool nan = false, pinf = false, ninf = false;
  auto add = [&](double t) {
    if (std::isnan(t)) nan = true;
    else if (std::isinf(t)) (t > 0 ? pinf : ninf) = true;
  };
  if (has_c) add(double(c));
  for (int i = 0; i < n; ++i) add(double(a[i]) * double(b[i]));  // exact; Inf * 0 is NaN
  if (nan || (pinf && ninf)) return canonical_nan();
  return pinf ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
}

}  // namespace

// Every term finite: exponents from the FP32 exponent field (for the FP32-subnormal BF16
// values it gives -127, raised to the format's minimum as for ilogb's result); the terms
// cut to multiples of 2^q and summed as integers, exactly (the specification calls this
// billions of times).
float mma_step(const StepRule& rule, float c, bool has_c, const float* a, const float* b) {
  const int n = rule.k;
  bool special = has_c && nan_or_inf(c);
  for (int i = 0; i < n; ++i) special |= nan_or_inf(a[i]) | nan_or_inf(b[i]);
  if (special) return special_step(n, c, has_c, a, b);
  auto expo = [](float x, int emin) { return std::max(int(bits(x) >> 23 & 0xffu) - 127, emin); };
  constexpr int kNone = std::numeric_limits<int>::min();
  int e_max = has_c && c != 0.0f ? expo(c, -126) : kNone;
  for (int i = 0; i < n; ++i)
    if (a[i] != 0.0f && b[i] != 0.0f)
      e_max = std::max(e_max, expo(a[i], rule.operand_min_exp) + expo(b[i], rule.operand_min_exp));
  if (e_max == kNone) return 0.0f;
  const int q = e_max - rule.term_frac_bits;
  // 2^-q built from its bits (|q| < 300), and truncation as a conversion to int64: each
  // scaled term is below 2^(term_frac_bits + 2), far inside int64.
  const double down = pow2(-q);
  int64_t units = has_c ? int64_t(double(c) * down) : 0;
  for (int i = 0; i < n; ++i) units += int64_t(double(a[i]) * double(b[i]) * down);
  return to_accumulator(double(units) * pow2(q), rule.sum_frac_bits);
}

namespace {

// Steps over [0, n) in ascending k; has_c: whether the first step adds the incoming c.
float chain(const StepRule& rule, float c, bool has_c, const float* a, const float* b, int n, int stride_b) {
  float pa[64], pb[64];
  float acc = c;
  for (int k0 = 0; k0 < n; k0 += rule.k) {
    for (int i = 0; i < rule.k; ++i) {
      const bool in = k0 + i < n;
      pa[i] = in ? a[k0 + i] : 0.0f;
      pb[i] = in ? b[size_t(k0 + i) * stride_b] : 0.0f;
    }
    acc = mma_step(rule, acc, has_c || k0 > 0, pa, pb);
  }
  return acc;
}

}  // namespace

float mma_dot(const StepRule& rule, const float* a, const float* b, int n, int stride_b) {
  return chain(rule, 0.0f, false, a, b, n, stride_b);
}

float mma_dot_onto(const StepRule& rule, float c, const float* a, const float* b, int n, int stride_b) {
  return chain(rule, c, true, a, b, n, stride_b);
}

}  // namespace tc
}  // namespace ref
}  // namespace flamia
