// Exhaustive tests of include/flamia/formats.h: every FP8/FP4/E8M0 code, every rounding
// tie, the per-token scale rule, BF16 rounding and the MXFP8/NVFP4 blocks. Each encoder is
// checked against an independent brute-force oracle (nearest representable value in double,
// ties to the even code) and, when the CUDA headers are present, against CUDA's own host
// conversion functions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "flamia/formats.h"

#if defined(FLAMIA_WITH_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#if __has_include(<cuda_fp4.h>)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // inside CUDA's header, not ours
#include <cuda_fp4.h>
#pragma GCC diagnostic pop
#define FLAMIA_TEST_CUDA_FP4 1
#endif
#endif

namespace fmt = flamia::fmt;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float next_up(float x) { return std::nextafter(x, kInf); }
float next_down(float x) { return std::nextafter(x, -kInf); }

// ---- independent model of an FP8 format --------------------------------------------------
// Values come from the definition (sign, exponent, mantissa, bias) in double, not from the
// code under test.
struct Fp8Model {
  int exp_bits, man_bits, bias;
  bool ieee;            // E5M2: all-ones exponent is Inf/NaN; E4M3: only S.1111.111 is NaN
  uint8_t max_code;     // largest finite positive code
  uint8_t overflow_code;// the code "after" max_code: Inf (E5M2) or NaN (E4M3)

  bool is_nan(uint8_t c) const {
    const int e = (c >> man_bits) & ((1 << exp_bits) - 1), m = c & ((1 << man_bits) - 1);
    if (ieee) return e == (1 << exp_bits) - 1 && m != 0;
    return e == (1 << exp_bits) - 1 && m == (1 << man_bits) - 1;
  }
  bool is_inf(uint8_t c) const { return ieee && (c & 0x7f) == overflow_code; }

  // Value of a non-NaN code; also valid for overflow_code of E4M3 as the value "one step
  // above max" (480), which the rounding oracle needs.
  double value(uint8_t c) const {
    const int e = (c >> man_bits) & ((1 << exp_bits) - 1), m = c & ((1 << man_bits) - 1);
    double v = e == 0 ? std::ldexp(double(m), 1 - bias - man_bits)
                      : std::ldexp(double((1 << man_bits) | m), e - bias - man_bits);
    if (is_inf(c)) v = HUGE_VAL;
    return (c & 0x80) ? -v : v;
  }
  // Magnitude just above max in the same binade spacing (480 for E4M3, 65536 for E5M2).
  double overflow_value() const {
    const int e = (max_code >> man_bits);
    const int m = max_code & ((1 << man_bits) - 1);
    return std::ldexp(double((1 << man_bits) | m) + 1.0, e - bias - man_bits);
  }

  // Round-to-nearest-even by brute force over all positive finite codes plus the overflow
  // step; choosing the overflow step means overflow.
  uint8_t encode(float x, bool saturate) const {
    const uint8_t nan = 0x7f;
    if (std::isnan(x)) return nan;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const double a = std::fabs(double(x));
    // Beyond the overflow step every candidate is "far": overflow without comparing
    // distances that double can no longer tell apart.
    if (a > overflow_value()) return uint8_t(sign | (saturate ? max_code : overflow_code));
    int best = -1;
    double best_d = 0;
    for (int c = 0; c <= max_code + 1; ++c) {
      const double v = c <= max_code ? value(uint8_t(c)) : overflow_value();
      const double d = std::fabs(v - a);
      if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) { best = c; best_d = d; }
    }
    if (best > max_code) {
      if (saturate) return uint8_t(sign | max_code);
      return uint8_t(sign | overflow_code);
    }
    return uint8_t(sign | best);
  }
};

const Fp8Model kE4M3{4, 3, 7, false, 0x7e, 0x7f};
const Fp8Model kE5M2{5, 2, 15, true, 0x7b, 0x7c};

template <class F>
uint8_t ours_encode(float x, bool saturate) { return fmt::fp8_encode<F>(x, saturate); }

// Floats worth testing around every FP8 value: the value, its float neighbours, the
// midpoints to the next value and their neighbours.
std::vector<float> fp8_edge_floats(const Fp8Model& m) {
  std::vector<float> out;
  for (int c = 0; c <= m.max_code; ++c) {
    const float v = float(m.value(uint8_t(c)));
    const double next = c < m.max_code ? m.value(uint8_t(c + 1)) : m.overflow_value();
    const float mid = float((double(v) + next) / 2);
    for (float f : {v, next_up(v), next_down(v), mid, next_up(mid), next_down(mid), float(next)}) {
      out.push_back(f);
      out.push_back(-f);
    }
  }
  for (float f : {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()}) {
    out.push_back(f);
    out.push_back(-f);
  }
  return out;
}

// A reproducible mix of random bit patterns (every exponent) and values near FP8's range.
std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  out.reserve(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 3) {
      case 0: out.push_back(fmt::bits_f32(uint32_t(rng()))); break;
      case 1: out.push_back(normal(rng) * std::ldexp(1.0f, int(rng() % 40) - 20)); break;
      default: out.push_back(normal(rng) * 500.0f); break;
    }
  }
  return out;
}

// Every 4099th float bit pattern: a uniform sweep over all exponents (about a million).
template <class Fn>
void strided_float_sweep(Fn fn) {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) fn(fmt::bits_f32(uint32_t(u)));
}

}  // namespace

// =========================================================================================
// FP8: decoding and re-encoding of all 256 codes
// =========================================================================================

template <class F>
void check_all_codes(const Fp8Model& m) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = uint8_t(c);
    const float v = fmt::fp8_decode<F>(code);
    if (m.is_nan(code)) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      EXPECT_TRUE(m.is_nan(ours_encode<F>(v, true))) << "code " << c;
      EXPECT_TRUE(m.is_nan(ours_encode<F>(v, false))) << "code " << c;
      continue;
    }
    EXPECT_EQ(double(v), m.value(code)) << "code " << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << "code " << c;
    if (m.is_inf(code)) {
      EXPECT_EQ(ours_encode<F>(v, false), code) << "Inf code " << c;
      EXPECT_EQ(ours_encode<F>(v, true), uint8_t((c & 0x80) | m.max_code)) << "Inf code " << c;
      continue;
    }
    EXPECT_EQ(ours_encode<F>(v, true), code) << "code " << c;
    EXPECT_EQ(ours_encode<F>(v, false), code) << "code " << c;
  }
}

TEST(FormatsFp8, E4M3AllCodesDecodeAndRoundTrip) { check_all_codes<fmt::E4M3>(kE4M3); }
TEST(FormatsFp8, E5M2AllCodesDecodeAndRoundTrip) { check_all_codes<fmt::E5M2>(kE5M2); }

TEST(FormatsFp8, KnownValues) {
  EXPECT_EQ(fmt::e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fmt::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fmt::e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fmt::e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fmt::e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(fmt::e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fmt::e5m2_to_f32(0x7c), kInf);
  EXPECT_EQ(fmt::e5m2_to_f32(0xfc), -kInf);
  EXPECT_TRUE(std::isnan(fmt::e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fmt::e4m3_to_f32(0xff)));
  EXPECT_EQ(fmt::e4m3_to_f32(0x78), 256.0f);  // S.1111.000 is a number in E4M3 (no Inf)
}

// =========================================================================================
// FP8: every tie between adjacent codes, both saturation modes
// =========================================================================================

template <class F>
void check_all_ties(const Fp8Model& m) {
  for (int c = 0; c <= m.max_code; ++c) {
    const double lo = m.value(uint8_t(c));
    const bool last = c == m.max_code;
    const double hi = last ? m.overflow_value() : m.value(uint8_t(c + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoints of FP8 values are exact floats";
    for (bool sat : {true, false}) {
      for (uint8_t sign : {uint8_t(0), uint8_t(0x80)}) {
        const float s = sign ? -1.0f : 1.0f;
        const uint8_t even = uint8_t((c & 1) == 0 ? c : c + 1);
        const uint8_t below = uint8_t(sign | c);
        const bool even_is_overflow = last && even != c;
        const uint8_t overflow = uint8_t(sign | (sat ? m.max_code : m.overflow_code));
        const uint8_t above = last ? overflow : uint8_t(sign | (c + 1));
        const uint8_t tie = even_is_overflow ? overflow : uint8_t(sign | even);
        EXPECT_EQ(ours_encode<F>(s * mid, sat), tie) << "tie after code " << c << " sat " << sat;
        EXPECT_EQ(ours_encode<F>(s * next_down(mid), sat), below) << "below tie after " << c;
        EXPECT_EQ(ours_encode<F>(s * next_up(mid), sat), above) << "above tie after " << c;
      }
    }
  }
}

TEST(FormatsFp8, E4M3AllTies) { check_all_ties<fmt::E4M3>(kE4M3); }
TEST(FormatsFp8, E5M2AllTies) { check_all_ties<fmt::E5M2>(kE5M2); }

TEST(FormatsFp8, E4M3OverflowBoundary) {
  // 448 = max, 480 would be the next value (it is the NaN code), 464 is the tie.
  for (bool sat : {true, false}) {
    EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(448.0f, sat), 0x7e);
    EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(464.0f, sat), 0x7e) << "tie goes to the even 448";
    EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(-464.0f, sat), 0xfe);
    EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(next_down(464.0f), sat), 0x7e);
  }
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(next_up(464.0f), true), 0x7e);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(next_up(464.0f), false), 0x7f);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(480.0f, true), 0x7e);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(480.0f, false), 0x7f);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(-480.0f, false), 0xff);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(1e30f, true), 0x7e);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(kInf, true), 0x7e);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(-kInf, true), 0xfe);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(kInf, false), 0x7f);
  EXPECT_EQ(fmt::fp8_encode<fmt::E4M3>(-kInf, false), 0xff);
  EXPECT_EQ(fmt::e4m3_rn_sat(kNaN), 0x7f);
  EXPECT_EQ(fmt::e4m3_rn_sat(-kNaN), 0x7f) << "NaN is canonical, sign dropped";
}

TEST(FormatsFp8, E5M2OverflowBoundary) {
  // 57344 = max (odd code 0x7b), 65536 would be next (Inf, even code): the tie 61440 overflows.
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(next_down(61440.0f), false), 0x7b);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(61440.0f, false), 0x7c);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(61440.0f, true), 0x7b);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(-61440.0f, false), 0xfc);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(kInf, false), 0x7c);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(kInf, true), 0x7b);
  EXPECT_EQ(fmt::fp8_encode<fmt::E5M2>(-kInf, true), 0xfb);
  EXPECT_EQ(fmt::e5m2_rn_sat(kNaN), 0x7f);
  EXPECT_EQ(fmt::e5m2_rn_sat(-kNaN), 0x7f);
}

TEST(FormatsFp8, SubnormalRangeAndUnderflow) {
  const float e4_min = std::ldexp(1.0f, -9), e5_min = std::ldexp(1.0f, -16);
  EXPECT_EQ(fmt::e4m3_rn_sat(e4_min / 2), 0x00) << "tie between 0 and min subnormal -> 0";
  EXPECT_EQ(fmt::e4m3_rn_sat(next_up(e4_min / 2)), 0x01);
  EXPECT_EQ(fmt::e4m3_rn_sat(-e4_min / 2), 0x80) << "signed zero kept";
  EXPECT_EQ(fmt::e4m3_rn_sat(1.5f * e4_min), 0x02) << "1.5 quanta -> 2 (even)";
  EXPECT_EQ(fmt::e4m3_rn_sat(2.5f * e4_min), 0x02) << "2.5 quanta -> 2 (even)";
  EXPECT_EQ(fmt::e4m3_rn_sat(7.5f * e4_min), 0x08) << "largest subnormal rounds up into normals";
  EXPECT_EQ(fmt::e5m2_rn_sat(e5_min / 2), 0x00);
  EXPECT_EQ(fmt::e5m2_rn_sat(1.5f * e5_min), 0x02);
  EXPECT_EQ(fmt::e5m2_rn_sat(3.5f * e5_min), 0x04);
  EXPECT_EQ(fmt::e4m3_rn_sat(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(fmt::e4m3_rn_sat(-std::numeric_limits<float>::min()), 0x80);
}

// =========================================================================================
// FP8: our encoder vs the brute-force oracle over a large float sweep
// =========================================================================================

template <class F>
void check_against_oracle(const Fp8Model& m, const std::vector<float>& xs) {
  int failures = 0;
  for (float x : xs) {
    for (bool sat : {true, false}) {
      const uint8_t want = m.encode(x, sat), got = ours_encode<F>(x, sat);
      if (want != got && failures++ < 10)
        ADD_FAILURE() << "x=" << x << " (0x" << std::hex << fmt::f32_bits(x) << ") sat=" << sat
                      << " want 0x" << int(want) << " got 0x" << int(got);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(FormatsFp8, E4M3MatchesOracleOnEdgesAndRandom) {
  check_against_oracle<fmt::E4M3>(kE4M3, fp8_edge_floats(kE4M3));
  check_against_oracle<fmt::E4M3>(kE4M3, random_floats(200000, 1));
}

TEST(FormatsFp8, E5M2MatchesOracleOnEdgesAndRandom) {
  check_against_oracle<fmt::E5M2>(kE5M2, fp8_edge_floats(kE5M2));
  check_against_oracle<fmt::E5M2>(kE5M2, random_floats(200000, 2));
}

TEST(FormatsFp8, RoundingIsMonotone) {
  // Along increasing floats the encoded value never decreases (a cheap whole-range check).
  for (bool sat : {true, false}) {
    float prev = -kInf;
    for (uint32_t u = 0; u < 0x7f800000u; u += 97) {
      const float v = fmt::fp8_decode<fmt::E4M3>(fmt::fp8_encode<fmt::E4M3>(fmt::bits_f32(u), sat));
      if (std::isnan(v)) { EXPECT_FALSE(sat); break; }
      ASSERT_GE(v, prev) << "at 0x" << std::hex << u;
      prev = v;
    }
  }
}

// =========================================================================================
// E2M1 (FP4)
// =========================================================================================

TEST(FormatsE2M1, AllCodesDecodeAndRoundTrip) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float v = fmt::e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(std::fabs(v), mags[c & 7]) << "code " << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << "code " << c;
    EXPECT_EQ(fmt::e2m1_rn_sat(v), c) << "code " << c;
  }
}

TEST(FormatsE2M1, TiesGoToEvenCodes) {
  // Each tie sits between codes `below` and `below + 1`; the even one of the two wins.
  struct Tie { float x; uint8_t below, tie; };
  const Tie ties[] = {{0.25f, 0, 0}, {0.75f, 1, 2}, {1.25f, 2, 2}, {1.75f, 3, 4},
                      {2.5f, 4, 4},  {3.5f, 5, 6},  {5.0f, 6, 6}};
  for (const Tie& t : ties) {
    EXPECT_EQ(fmt::e2m1_rn_sat(t.x), t.tie) << t.x;
    EXPECT_EQ(fmt::e2m1_rn_sat(-t.x), uint8_t(t.tie | 8)) << -t.x;
    EXPECT_EQ(fmt::e2m1_rn_sat(next_down(t.x)), t.below) << "below " << t.x;
    EXPECT_EQ(fmt::e2m1_rn_sat(next_up(t.x)), t.below + 1) << "above " << t.x;
    EXPECT_EQ(fmt::e2m1_rn_sat(-next_up(t.x)), uint8_t((t.below + 1) | 8)) << "above " << -t.x;
  }
}

TEST(FormatsE2M1, SaturationAndSpecials) {
  EXPECT_EQ(fmt::e2m1_rn_sat(6.0f), 7);
  EXPECT_EQ(fmt::e2m1_rn_sat(7.0f), 7);
  EXPECT_EQ(fmt::e2m1_rn_sat(1e30f), 7);
  EXPECT_EQ(fmt::e2m1_rn_sat(kInf), 7);
  EXPECT_EQ(fmt::e2m1_rn_sat(-kInf), 15);
  EXPECT_EQ(fmt::e2m1_rn_sat(kNaN), 7) << "NaN -> +6, as CUDA";
  EXPECT_EQ(fmt::e2m1_rn_sat(-kNaN), 7);
  EXPECT_EQ(fmt::e2m1_rn_sat(-0.0f), 8);
  EXPECT_EQ(fmt::e2m1_rn_sat(-0.1f), 8);
  EXPECT_EQ(fmt::e2m1_rn_sat(std::numeric_limits<float>::denorm_min()), 0);
}

TEST(FormatsE2M1, MatchesNearestValueOracle) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  auto oracle = [&](float x) {
    const double a = std::min(std::fabs(double(x)), 6.0);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      const double d = std::fabs(mags[c] - a), bd = std::fabs(mags[best] - a);
      if (d < bd || (d == bd && (c & 1) == 0)) best = c;
    }
    return uint8_t((std::signbit(x) ? 8 : 0) | best);
  };
  for (float x : random_floats(100000, 3)) {
    if (std::isnan(x)) continue;
    ASSERT_EQ(fmt::e2m1_rn_sat(x), oracle(x)) << x;
  }
  for (int i = -1000; i <= 1000; ++i) {
    const float x = float(i) / 128.0f;  // a dense grid through every tie
    ASSERT_EQ(fmt::e2m1_rn_sat(x), oracle(x)) << x;
  }
}

// =========================================================================================
// E8M0
// =========================================================================================

TEST(FormatsE8M0, AllCodes) {
  for (int c = 0; c < 255; ++c) {
    const float v = fmt::e8m0_to_f32(uint8_t(c));
    EXPECT_EQ(double(v), std::ldexp(1.0, c - 127)) << "code " << c;
    EXPECT_EQ(fmt::e8m0_from_exponent(c - 127), c);
  }
  EXPECT_TRUE(std::isnan(fmt::e8m0_to_f32(0xff)));
  EXPECT_GT(fmt::e8m0_to_f32(0), 0.0f) << "2^-127 is an fp32 subnormal, not zero";
}

TEST(FormatsE8M0, Exp2iIsExactOverItsRange) {
  for (int e = -149; e <= 127; ++e) EXPECT_EQ(double(fmt::exp2i(e)), std::ldexp(1.0, e)) << e;
}

// =========================================================================================
// The per-token scale rule
// =========================================================================================

namespace {
// Smallest e with amax <= 448 * 2^e, clamped to [-126, 127] (exact in double).
int oracle_scale_exponent(float amax) {
  if (amax == 0.0f) return fmt::kScaleExpMin;
  int e = -200;
  while (double(amax) > 448.0 * std::ldexp(1.0, e)) ++e;
  return std::min(std::max(e, fmt::kScaleExpMin), fmt::kScaleExpMax);
}
}  // namespace

TEST(FormatsScale, Pow2ScaleSweep) {
  std::vector<float> amaxes;
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float m : {1.0f, 1.5f, 1.75f, 1.8f, 1.99f}) {
      const float v = m * p;
      if (!std::isfinite(v) || v == 0.0f) continue;
      for (float f : {v, next_up(v), next_down(v)})
        if (f > 0.0f && std::isfinite(f)) amaxes.push_back(f);
    }
  }
  for (float f : random_floats(100000, 4)) {
    const float a = std::fabs(f);
    if (std::isfinite(a)) amaxes.push_back(a);
  }
  for (float amax : amaxes) {
    const float s = fmt::pow2_scale(amax);
    const int e = fmt::pow2_scale_exponent(amax);
    ASSERT_EQ(double(s), std::ldexp(1.0, e)) << amax;
    ASSERT_EQ(e, oracle_scale_exponent(amax)) << amax;
    if (amax == 0.0f) continue;
    EXPECT_LE(double(amax), 448.0 * double(s)) << amax;
    if (e > fmt::kScaleExpMin) {
      EXPECT_GT(double(amax), 448.0 * double(s) / 2) << amax;
      // The scaled row maximum lands in E4M3's top binade: above 224 and never saturated.
      const float q = fmt::e4m3_to_f32(fmt::quantize_e4m3(amax, s));
      EXPECT_GE(q, 224.0f) << amax;
      EXPECT_LE(q, 448.0f) << amax;
    }
  }
}

TEST(FormatsScale, Pow2ScaleSpecialValues) {
  // An all-zero row gets the smallest scale, so that it never dominates a maximum over
  // scaled values (formats.h).
  EXPECT_EQ(fmt::pow2_scale(0.0f), std::ldexp(1.0f, fmt::kScaleExpMin));
  EXPECT_EQ(fmt::pow2_scale(-0.0f), std::ldexp(1.0f, fmt::kScaleExpMin));
  EXPECT_EQ(fmt::pow2_scale(448.0f), 1.0f);
  EXPECT_EQ(fmt::pow2_scale(next_up(448.0f)), 2.0f);
  EXPECT_EQ(fmt::pow2_scale(224.0f), 0.5f);
  EXPECT_EQ(fmt::pow2_scale(next_up(224.0f)), 1.0f);
  EXPECT_EQ(fmt::pow2_scale(1.0f), std::ldexp(1.0f, -8));
  EXPECT_EQ(fmt::pow2_scale(std::numeric_limits<float>::max()), std::ldexp(1.0f, 120));
  EXPECT_TRUE(std::isnan(fmt::pow2_scale(kInf)));
  EXPECT_TRUE(std::isnan(fmt::pow2_scale(-kInf)));
  EXPECT_TRUE(std::isnan(fmt::pow2_scale(kNaN)));
  // fp32 subnormal amax: clamped to 2^-126 (normal, so FTZ arithmetic cannot zero it).
  EXPECT_EQ(fmt::pow2_scale(std::numeric_limits<float>::denorm_min()), std::ldexp(1.0f, -126));
  EXPECT_EQ(fmt::pow2_scale(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -126));
  EXPECT_EQ(fmt::pow2_scale_exponent(std::ldexp(1.0f, -100)), -108);
}

// The kernels' select-only form equals pow2_scale bit for bit: every exponent with the
// mantissas around 1.75 (where the rounding up happens), a stride through all 2^32 bit
// patterns (both signs, subnormals, Inf, NaN payloads), and the special values.
TEST(FormatsScale, Pow2ScaleE4m3IsPow2Scale) {
  auto same = [](float a) {
    const float x = fmt::pow2_scale(a), y = fmt::pow2_scale_e4m3(a);
    return std::isnan(x) ? std::isnan(y) : fmt::f32_bits(x) == fmt::f32_bits(y);
  };
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m : {0u, 1u, 0x5fffffu, 0x600000u, 0x600001u, 0x7fffffu})
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float a = fmt::bits_f32(sign | (e << 23) | m);
        ASSERT_TRUE(same(a)) << std::hexfloat << a;
      }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4093) {
    const float a = fmt::bits_f32(uint32_t(b));
    ASSERT_TRUE(same(a)) << std::hexfloat << a;
  }
  for (float a : {0.0f, -0.0f, kInf, -kInf, kNaN, std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::max(), 448.0f, 224.0f})
    EXPECT_TRUE(same(a)) << a;
}

TEST(FormatsScale, Pow2ReciprocalIsExactOverTheScaleRange) {
  for (int e = fmt::kScaleExpMin; e <= fmt::kScaleExpMax; ++e) {
    const float s = std::ldexp(1.0f, e);
    const float r = fmt::pow2_reciprocal(s);
    ASSERT_EQ(double(r), std::ldexp(1.0, -e)) << "2^" << e;
    ASSERT_EQ(r, 1.0f / s) << "2^" << e;  // the division it replaces (2^-127: subnormal, exact)
  }
  EXPECT_TRUE(std::isnan(fmt::pow2_reciprocal(kNaN)));
  EXPECT_TRUE(std::isnan(fmt::pow2_reciprocal(fmt::pow2_scale(kInf))));
}

// ALGORITHM.md §3: the backward multiplies the power-of-two scales first, P = exp2(fma(dot,
// (sk c) sq, -lse2)) and dP - D = fma(dot, sdo sv, -D), and claims this rounds exactly as
// exp2(fma((dot sq) sk, c, -lse2)) and ((dot sdo) sv) - D wherever the products are normal
// numbers (the kernels' and the specification's forms agree with the plain ones). Most samples
// come from the scales the workloads see; a tenth from the whole scale range, where some
// products overflow or go subnormal: there the forms must be seen to differ (one overflows
// where the other does not, or loses bits), or the condition the claim states would be vacuous.
TEST(FormatsScale, ScaleProductsKeepTheBackwardsRoundings) {
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> typical(-40, 12), any(fmt::kScaleExpMin, fmt::kScaleExpMax), tenth(0, 9);
  std::uniform_real_distribution<float> dot(-3.0e6f, 3.0e6f), lse(-50.0f, 400.0f), dsum(-8.0f, 8.0f);
  const float c = (1.0f / std::sqrt(128.0f)) * 1.4426950408889634f;
  auto normal = [](std::initializer_list<float> xs) {
    for (float x : xs)
      if (!std::isfinite(x) || (x != 0.0f && std::fabs(x) < std::numeric_limits<float>::min())) return false;
    return true;
  };
  int checked = 0, differ_outside = 0;
  for (int i = 0; i < 2000000; ++i) {
    const bool wide = tenth(rng) == 0;
    auto e = [&](int shift) { return std::ldexp(1.0f, (wide ? any(rng) : typical(rng)) + (wide ? 0 : shift)); };
    const float sq = e(0), sk = e(0), sdo = e(-20), sv = e(0);
    const float s_dot = dot(rng), dp_dot = dot(rng), lse2 = lse(rng), d = dsum(rng);
    const float s = (s_dot * sq) * sk, s_comb = (sk * c) * sq;
    const float plain_arg = std::fmaf(s, c, -lse2);
    const float folded_arg = std::fmaf(s_dot, s_comb, -lse2);
    const float dp = (dp_dot * sdo) * sv, dp_comb = sdo * sv;
    const float plain_diff = dp - d;
    const float folded_diff = std::fmaf(dp_dot, dp_comb, -d);
    if (normal({s_dot * sq, s, sk * c, s_comb, plain_arg, folded_arg, dp_dot * sdo, dp, dp_comb, plain_diff,
                folded_diff})) {
      ++checked;
      ASSERT_EQ(fmt::f32_bits(plain_arg), fmt::f32_bits(folded_arg)) << s_dot << " " << sq << " " << sk;
      ASSERT_EQ(fmt::f32_bits(plain_diff), fmt::f32_bits(folded_diff)) << dp_dot << " " << sdo << " " << sv;
    } else {
      differ_outside += fmt::f32_bits(plain_arg) != fmt::f32_bits(folded_arg) ||
                        fmt::f32_bits(plain_diff) != fmt::f32_bits(folded_diff);
    }
  }
  EXPECT_GT(checked, 1800000);
  EXPECT_GT(differ_outside, 0) << "outside the normal range the two forms should differ somewhere";
}

TEST(FormatsScale, QuantizeE4M3) {
  EXPECT_EQ(fmt::quantize_e4m3(448.0f, 1.0f), 0x7e);
  EXPECT_EQ(fmt::quantize_e4m3(896.0f, 2.0f), 0x7e);
  EXPECT_EQ(fmt::quantize_e4m3(1.0f, 0.5f), fmt::e4m3_rn_sat(2.0f));
  EXPECT_EQ(fmt::quantize_e4m3(1e9f, 1.0f), 0x7e) << "satfinite";
  EXPECT_EQ(fmt::quantize_e4m3(1.0f, kNaN), 0x7f) << "NaN scale poisons the element";
  // Division by a power of two is exact: quantizing x with scale s equals encoding x/s.
  for (float x : random_floats(20000, 5)) {
    if (!std::isfinite(x)) continue;
    const float a = std::fabs(x);
    const float s = fmt::pow2_scale(a);
    EXPECT_EQ(fmt::quantize_e4m3(x, s), fmt::e4m3_rn_sat(float(double(x) / double(s)))) << x;
  }
}

// =========================================================================================
// BF16
// =========================================================================================

namespace {
uint16_t oracle_bf16(float x) {
  const uint32_t u = fmt::f32_bits(x);
  const uint32_t lo = u & 0xffff0000u;
  const uint32_t hi = lo + 0x10000u;  // next bf16 away from zero (may be Inf)
  const double dl = std::fabs(std::fabs(double(fmt::bits_f32(lo))) - std::fabs(double(x)));
  // Past the largest finite bf16, round as if the exponent range went on (2^128), then
  // overflow to Inf: IEEE 754's rule.
  const double hv = (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::fabs(double(fmt::bits_f32(hi)));
  const double dh = std::fabs(hv - std::fabs(double(x)));
  if (dl < dh) return uint16_t(lo >> 16);
  if (dh < dl) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1u) ? uint16_t(hi >> 16) : uint16_t(lo >> 16);
}
}  // namespace

TEST(FormatsBf16, RoundToNearestEven) {
  EXPECT_EQ(fmt::f32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x3f808000u)), 0x3f80) << "tie down to even";
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x3f818000u)), 0x3f82) << "tie up to even";
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x3f808001u)), 0x3f81);
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0xbf818000u)), 0xbf82);
  EXPECT_EQ(fmt::f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80) << "overflow -> Inf";
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(fmt::f32_to_bf16_bits(kInf), 0x7f80);
  EXPECT_EQ(fmt::f32_to_bf16_bits(-kInf), 0xff80);
  EXPECT_EQ(fmt::f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x00008000u)), 0x0000) << "subnormal tie";
  EXPECT_EQ(fmt::f32_to_bf16_bits(fmt::bits_f32(0x00018000u)), 0x0002);
}

TEST(FormatsBf16, NaNStaysNaN) {
  // Signalling NaNs whose payload lies only in the dropped bits must not become Inf.
  for (uint32_t u : {0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    const uint16_t b = fmt::f32_to_bf16_bits(fmt::bits_f32(u));
    EXPECT_TRUE(std::isnan(fmt::bf16_bits_to_f32(b))) << std::hex << u;
    EXPECT_EQ(b & 0x8000, (u >> 16) & 0x8000) << std::hex << u;
  }
}

TEST(FormatsBf16, MatchesOracleEverywhere) {
  int failures = 0;
  auto check = [&](float x) {
    if (std::isnan(x)) return;
    const uint16_t want = oracle_bf16(x), got = fmt::f32_to_bf16_bits(x);
    if (want != got && failures++ < 10)
      ADD_FAILURE() << std::hex << "x=0x" << fmt::f32_bits(x) << " want " << want << " got " << got;
  };
  strided_float_sweep(check);
  for (uint32_t hi = 0; hi < 0x10000u; hi += 7) {  // every tie pattern for many upper halves
    check(fmt::bits_f32((hi << 16) | 0x8000u));
    check(fmt::bits_f32((hi << 16) | 0x7fffu));
    check(fmt::bits_f32((hi << 16) | 0x8001u));
  }
  EXPECT_EQ(failures, 0);
  for (float x : {1.0f, -3.5f, 1e-40f}) EXPECT_EQ(fmt::round_bf16(x), fmt::bf16_bits_to_f32(fmt::f32_to_bf16_bits(x)));
}

// =========================================================================================
// MXFP8 blocks
// =========================================================================================

TEST(FormatsMx, ScaleCode) {
  // X = 2^(floor(log2 amax) - 8): amax / X lies in [256, 512).
  for (float amax : random_floats(50000, 6)) {
    amax = std::fabs(amax);
    if (!std::isfinite(amax) || amax < std::numeric_limits<float>::min()) continue;
    const float x = fmt::e8m0_to_f32(fmt::mx_scale_code(amax));
    const double r = double(amax) / double(x);
    if (fmt::mx_scale_code(amax) == 0 || fmt::mx_scale_code(amax) == 254) continue;  // clamped
    EXPECT_GE(r, 256.0) << amax;
    EXPECT_LT(r, 512.0) << amax;
  }
  EXPECT_EQ(fmt::mx_scale_code(1.0f), 127 - 8);
  EXPECT_EQ(fmt::mx_scale_code(448.0f), 127);
  EXPECT_EQ(fmt::mx_scale_code(0.0f), 0);
  EXPECT_EQ(fmt::mx_scale_code(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(fmt::mx_scale_code(kInf), fmt::kE8M0Nan);
  EXPECT_EQ(fmt::mx_scale_code(kNaN), fmt::kE8M0Nan);
}

TEST(FormatsMx, BlockRoundTripAndErrorBound) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(rng() % fmt::kMxBlock);
    const float mag = std::ldexp(1.0f, int(rng() % 60) - 30);
    float x[fmt::kMxBlock];
    for (int i = 0; i < n; ++i) x[i] = normal(rng) * mag;
    uint8_t codes[fmt::kMxBlock], sc;
    fmt::mxfp8_quantize_block(x, n, codes, &sc);
    const float s = fmt::e8m0_to_f32(sc);
    for (int i = 0; i < n; ++i) {
      const double y = double(fmt::e4m3_to_f32(codes[i])) * s;
      const double err = std::fabs(y - x[i]);
      // Half an ulp of a 3-bit mantissa, or half the subnormal quantum; the block maximum
      // may saturate at 448 * X (amax / X < 512), losing at most 64 * X.
      const double bound = std::max(std::fabs(double(x[i])) / 16, std::ldexp(double(s), -10));
      const bool saturated = std::fabs(double(x[i])) > 448.0 * s;
      EXPECT_LE(err, saturated ? 64.0 * s : bound) << "trial " << trial << " i " << i;
    }
  }
  // Values already on the grid come back exactly.
  float x[fmt::kMxBlock];
  for (int i = 0; i < fmt::kMxBlock; ++i) x[i] = fmt::e4m3_to_f32(uint8_t(i * 3)) * 0.25f;
  x[5] = 256.0f * 0.25f;  // the block maximum sits at 2^8 * X
  uint8_t codes[fmt::kMxBlock], sc;
  fmt::mxfp8_quantize_block(x, fmt::kMxBlock, codes, &sc);
  for (int i = 0; i < fmt::kMxBlock; ++i)
    EXPECT_EQ(fmt::e4m3_to_f32(codes[i]) * fmt::e8m0_to_f32(sc), x[i]) << i;
}

TEST(FormatsMx, NonFiniteBlockDecodesToNaN) {
  for (float bad : {kNaN, kInf, -kInf}) {
    float x[fmt::kMxBlock];
    for (int i = 0; i < fmt::kMxBlock; ++i) x[i] = float(i);
    x[17] = bad;
    uint8_t codes[fmt::kMxBlock], sc;
    fmt::mxfp8_quantize_block(x, fmt::kMxBlock, codes, &sc);
    EXPECT_EQ(sc, fmt::kE8M0Nan);
    for (int i = 0; i < fmt::kMxBlock; ++i)
      EXPECT_TRUE(std::isnan(fmt::e4m3_to_f32(codes[i]) * fmt::e8m0_to_f32(sc)));
  }
  float zeros[4] = {0, 0, 0, 0};
  uint8_t codes[4], sc;
  fmt::mxfp8_quantize_block(zeros, 4, codes, &sc);
  for (uint8_t c : codes) EXPECT_EQ(fmt::e4m3_to_f32(c), 0.0f);
}

// =========================================================================================
// NVFP4 blocks
// =========================================================================================

TEST(FormatsNvfp4, TensorScale) {
  EXPECT_EQ(fmt::nvfp4_tensor_scale(2688.0f), 1.0f);
  EXPECT_EQ(fmt::nvfp4_tensor_scale(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(fmt::nvfp4_tensor_scale(kInf)));
  EXPECT_TRUE(std::isnan(fmt::nvfp4_tensor_scale(kNaN)));
}

TEST(FormatsNvfp4, BlockRoundTripAndErrorBound) {
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const float mag = std::ldexp(1.0f, int(rng() % 40) - 20);
    float x[fmt::kNvfp4Block];
    float amax = 0.0f;
    for (float& v : x) { v = normal(rng) * mag; amax = std::max(amax, std::fabs(v)); }
    // The tensor amax is at least the block amax; sometimes much larger (quiet blocks).
    const float g = fmt::nvfp4_tensor_scale(amax * float(1 + rng() % 50));
    uint8_t codes[fmt::kNvfp4Block], bsc;
    fmt::nvfp4_quantize_block(x, fmt::kNvfp4Block, g, codes, &bsc);
    const double unit = double(fmt::e4m3_to_f32(bsc)) * g;
    ASSERT_TRUE(std::isfinite(unit));
    for (int i = 0; i < fmt::kNvfp4Block; ++i) {
      const double y = fmt::nvfp4_decode(codes[i], bsc, g);
      // E2M1's widest gap is 2 (4 -> 6), so rounding is within one block unit; a block
      // scale rounded down saturates |x| / unit <= 6 * 16/15 at 6, also within one unit.
      // A block scale in E4M3's subnormal range adds its own relative error (up to 1/2 of
      // its quantum 2^-9 relative to amax_block / 6).
      const double bound = unit + std::ldexp(double(g), -10) * 6.0 * 8.0;
      EXPECT_LE(std::fabs(y - x[i]), bound) << "trial " << trial << " i " << i;
    }
  }
  // Values on the grid come back exactly.
  const float g = 0.5f;
  float x[fmt::kNvfp4Block];
  for (int i = 0; i < fmt::kNvfp4Block; ++i) x[i] = fmt::e2m1_to_f32(uint8_t(i)) * 2.0f * g;
  uint8_t codes[fmt::kNvfp4Block], bsc;
  fmt::nvfp4_quantize_block(x, fmt::kNvfp4Block, g, codes, &bsc);
  EXPECT_EQ(fmt::e4m3_to_f32(bsc), 2.0f);
  for (int i = 0; i < fmt::kNvfp4Block; ++i) EXPECT_EQ(fmt::nvfp4_decode(codes[i], bsc, g), x[i]) << i;
}

TEST(FormatsNvfp4, NonFiniteBlockDecodesToNaN) {
  for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
    for (int pos : {0, 7, 15}) {
      float x[fmt::kNvfp4Block];
      for (int i = 0; i < fmt::kNvfp4Block; ++i) x[i] = 0.1f * float(i) - 0.7f;
      x[pos] = bad;
      uint8_t codes[fmt::kNvfp4Block], bsc;
      fmt::nvfp4_quantize_block(x, fmt::kNvfp4Block, 0.01f, codes, &bsc);
      EXPECT_EQ(bsc, 0x7f) << "block scale is E4M3 NaN";
      for (int i = 0; i < fmt::kNvfp4Block; ++i)
        EXPECT_TRUE(std::isnan(fmt::nvfp4_decode(codes[i], bsc, 0.01f))) << bad << " at " << pos;
    }
  }
  // A finite block beside it is unaffected.
  float ok[fmt::kNvfp4Block] = {};
  ok[3] = 1.0f;
  uint8_t codes[fmt::kNvfp4Block], bsc;
  fmt::nvfp4_quantize_block(ok, fmt::kNvfp4Block, 1.0f / 6.0f, codes, &bsc);
  EXPECT_FALSE(std::isnan(fmt::e4m3_to_f32(bsc)));
  EXPECT_EQ(fmt::nvfp4_decode(codes[3], bsc, 1.0f / 6.0f), 1.0f);
}

TEST(FormatsNvfp4, ZeroBlock) {
  float x[fmt::kNvfp4Block] = {};
  uint8_t codes[fmt::kNvfp4Block], bsc;
  fmt::nvfp4_quantize_block(x, fmt::kNvfp4Block, 1.0f, codes, &bsc);
  for (int i = 0; i < fmt::kNvfp4Block; ++i) EXPECT_EQ(fmt::nvfp4_decode(codes[i], bsc, 1.0f), 0.0f);
}

// =========================================================================================
// Agreement with CUDA's host conversion functions
// =========================================================================================
#if defined(FLAMIA_WITH_CUDA)

namespace {
uint8_t cuda_fp8(float x, bool sat, __nv_fp8_interpretation_t kind) {
  return uint8_t(__nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, kind));
}
float cuda_fp8_to_f32(uint8_t c, __nv_fp8_interpretation_t kind) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), kind)));
}

template <class F>
void check_cuda_encode(const std::vector<float>& xs, __nv_fp8_interpretation_t kind) {
  int failures = 0;
  for (float x : xs) {
    for (bool sat : {true, false}) {
      const uint8_t want = cuda_fp8(x, sat, kind), got = fmt::fp8_encode<F>(x, sat);
      if (want != got && failures++ < 10)
        ADD_FAILURE() << "x=" << x << " (0x" << std::hex << fmt::f32_bits(x) << ") sat=" << sat
                      << " cuda 0x" << int(want) << " ours 0x" << int(got);
    }
  }
  EXPECT_EQ(failures, 0);
}
}  // namespace

TEST(FormatsCuda, Fp8DecodeMatchesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    for (auto kind : {__NV_E4M3, __NV_E5M2}) {
      const float want = cuda_fp8_to_f32(uint8_t(c), kind);
      const float got = kind == __NV_E4M3 ? fmt::e4m3_to_f32(uint8_t(c)) : fmt::e5m2_to_f32(uint8_t(c));
      if (std::isnan(want)) { EXPECT_TRUE(std::isnan(got)) << c; continue; }
      EXPECT_EQ(fmt::f32_bits(want), fmt::f32_bits(got)) << "code " << c << " kind " << int(kind);
    }
  }
}

TEST(FormatsCuda, Fp8EncodeMatchesOnCodesAndTies) {
  std::vector<float> e4 = fp8_edge_floats(kE4M3), e5 = fp8_edge_floats(kE5M2);
  for (int c = 0; c < 256; ++c) {
    e4.push_back(fmt::e4m3_to_f32(uint8_t(c)));
    e5.push_back(fmt::e5m2_to_f32(uint8_t(c)));
  }
  check_cuda_encode<fmt::E4M3>(e4, __NV_E4M3);
  check_cuda_encode<fmt::E5M2>(e5, __NV_E5M2);
  // And the edges of the other format, which land on arbitrary points of this one.
  check_cuda_encode<fmt::E4M3>(e5, __NV_E4M3);
  check_cuda_encode<fmt::E5M2>(e4, __NV_E5M2);
}

TEST(FormatsCuda, Fp8EncodeMatchesOnRandomAndStridedSweep) {
  std::vector<float> xs = random_floats(500000, 9);
  strided_float_sweep([&](float x) { xs.push_back(x); });
  check_cuda_encode<fmt::E4M3>(xs, __NV_E4M3);
  check_cuda_encode<fmt::E5M2>(xs, __NV_E5M2);
}

TEST(FormatsCuda, Bf16MatchesFloat2Bfloat16Rn) {
  int failures = 0;
  auto check = [&](float x) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    const uint16_t want = __nv_bfloat16_raw(b).x, got = fmt::f32_to_bf16_bits(x);
    if (std::isnan(x)) {
      if (!std::isnan(fmt::bf16_bits_to_f32(got)) && failures++ < 10) ADD_FAILURE() << "NaN lost";
      return;
    }
    if (want != got && failures++ < 10)
      ADD_FAILURE() << std::hex << "x=0x" << fmt::f32_bits(x) << " cuda " << want << " ours " << got;
  };
  strided_float_sweep(check);
  for (float x : random_floats(100000, 10)) check(x);
  EXPECT_EQ(failures, 0);
}

#if defined(FLAMIA_TEST_CUDA_FP4)
TEST(FormatsCuda, E2M1MatchesCvtFloatToFp4) {
  std::vector<float> xs = random_floats(200000, 11);
  for (int i = -2000; i <= 2000; ++i) xs.push_back(float(i) / 256.0f);  // every tie, densely
  for (int c = 0; c < 16; ++c) xs.push_back(fmt::e2m1_to_f32(uint8_t(c)));
  for (float f : {kInf, -kInf, kNaN, -kNaN, 0.0f, -0.0f, 1e30f, -1e30f}) xs.push_back(f);
  int failures = 0;
  for (float x : xs) {
    const uint8_t want = uint8_t(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest));
    const uint8_t got = fmt::e2m1_rn_sat(x);
    if (want != got && failures++ < 10)
      ADD_FAILURE() << "x=" << x << " cuda " << int(want) << " ours " << int(got);
  }
  EXPECT_EQ(failures, 0);
  for (int c = 0; c < 16; ++c) {
    const float want = __half2float(__half(__nv_cvt_fp4_to_halfraw(__nv_fp4_storage_t(c), __NV_E2M1)));
    EXPECT_EQ(fmt::f32_bits(want), fmt::f32_bits(fmt::e2m1_to_f32(uint8_t(c)))) << c;
  }
}
#endif  // FLAMIA_TEST_CUDA_FP4

#endif  // FLAMIA_WITH_CUDA
