// Number formats shared by host and device code: FP8 (E4M3, E5M2), E8M0 scales,
// E2M1 (FP4), BF16 rounding, the per-token power-of-two scale rule, MXFP8 and NVFP4 blocks.
//
// Everything here is exact integer/float arithmetic with no dependence on the
// floating-point environment beyond round-to-nearest-even, so the CPU specification
// and the GPU kernels compute bit-identical values from these functions.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define FLAMIA_HD __host__ __device__ __forceinline__
#else
#define FLAMIA_HD inline
#endif

namespace flamia {
namespace fmt {

// log2(e) in FP32: c = softmax_scale * kLog2e and lse2 = LSE * kLog2e (ALGORITHM.md §2, §3)
// are the same products wherever they are formed.
constexpr float kLog2e = 1.4426950408889634f;

FLAMIA_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

FLAMIA_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

FLAMIA_HD bool is_nan_f32(float x) { return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }
FLAMIA_HD bool is_finite_f32(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

// 2^e as a float for e in [-149, 127], built from bits (exact, no libm).
FLAMIA_HD float exp2i(int e) {
  if (e >= -126) return bits_f32(uint32_t(e + 127) << 23);
  return bits_f32(1u << (e + 149));  // subnormal
}

// ---------------------------------------------------------------------------------------
// Generic minifloat with E exponent bits, M mantissa bits and bias 2^(E-1)-1.
// E4M3 (OCP "FN" variant): no infinities, S.1111.111 is NaN, max normal 448.
// E5M2: IEEE-like, infinities and NaNs, max normal 57344.
// ---------------------------------------------------------------------------------------
struct E4M3 { static constexpr int kExp = 4, kMan = 3, kBias = 7; static constexpr bool kIeee = false;
              static constexpr float kMax = 448.0f; };
struct E5M2 { static constexpr int kExp = 5, kMan = 2, kBias = 15; static constexpr bool kIeee = true;
              static constexpr float kMax = 57344.0f; };

template <class F>
FLAMIA_HD float fp8_decode(uint8_t code) {
  const uint32_t sign = code >> 7;
  const uint32_t e = (code >> F::kMan) & ((1u << F::kExp) - 1u);
  const uint32_t m = code & ((1u << F::kMan) - 1u);
  float v;
  if (F::kIeee && e == (1u << F::kExp) - 1u) {
    v = (m == 0) ? bits_f32(0x7f800000u) : bits_f32(0x7fc00000u);
  } else if (!F::kIeee && e == (1u << F::kExp) - 1u && m == (1u << F::kMan) - 1u) {
    v = bits_f32(0x7fc00000u);
  } else if (e == 0) {
    v = float(m) * exp2i(1 - F::kBias - F::kMan);
  } else {
    v = float((1u << F::kMan) | m) * exp2i(int(e) - F::kBias - F::kMan);
  }
  return sign ? -v : v;
}

// Round x to the nearest representable value (ties to even) and encode it.
// saturate=true  : |x| beyond the largest finite value gives +-max ("satfinite"); NaN stays NaN.
// saturate=false : overflow gives Inf (E5M2) or NaN (E4M3, which has no Inf).
template <class F>
FLAMIA_HD uint8_t fp8_encode(float x, bool saturate) {
  const uint32_t bits = f32_bits(x);
  const uint8_t sign = uint8_t((bits >> 31) << 7);
  const uint32_t abits = bits & 0x7fffffffu;
  // NaN encodes as the positive canonical code 0x7f in both formats (S.1111.111 for E4M3,
  // S.11111.11 for E5M2). OCP FP8 leaves the NaN sign and payload open; 0x7f is what CUDA's
  // conversions (__nv_cvt_float_to_fp8 on the host, cvt.rn.satfinite on sm_89+) produce, so
  // CPU and GPU quantizers agree bit for bit even on NaN inputs.
  constexpr uint8_t kNan = 0x7f;
  constexpr uint8_t kInf = 0x7c;  // E5M2 only
  constexpr uint8_t kMaxCode = F::kIeee ? 0x7b : 0x7e;
  if (abits > 0x7f800000u) return kNan;
  if (abits == 0x7f800000u) return saturate ? uint8_t(sign | kMaxCode) : uint8_t(sign | (F::kIeee ? kInf : kNan));
  // Work in units of the smallest subnormal: value = n * 2^(1-bias-M), n an integer after rounding.
  // For normals of exponent e the quantum is 2^(e-M); below the normal range it is the subnormal quantum.
  const int e_f32 = int(abits >> 23) - 127;           // unbiased fp32 exponent (-127 for fp32 subnormals)
  const int emin = 1 - F::kBias;                       // smallest normal exponent of the format
  const int e = e_f32 < emin ? emin : e_f32;
  // Significand of |x| as an integer with 23 fraction bits (fp32 subnormals are far below any fp8 value).
  const uint32_t sig = (abits >> 23) ? ((abits & 0x7fffffu) | 0x800000u) : (abits & 0x7fffffu);
  const int shift = 23 - F::kMan + (e - (e_f32 < -126 ? -126 : e_f32));  // bits dropped
  uint32_t q;
  if (shift >= 32) {
    q = 0;
  } else {
    const uint32_t kept = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    q = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
  }
  // q counts quanta of 2^(e-M); renormalise into (exponent field, mantissa).
  int ebiased = e + F::kBias;                 // biased exponent for a normal with implicit bit
  uint32_t mant;
  if (q >= (2u << F::kMan)) { q >>= 1; ebiased += 1; }  // rounding carried into the next binade
  if (q < (1u << F::kMan)) { ebiased = 0; mant = q; }   // subnormal (only possible when e == emin)
  else { mant = q - (1u << F::kMan); }
  const uint32_t code = (uint32_t(ebiased) << F::kMan) | mant;
  const bool overflow = F::kIeee ? (ebiased >= (1 << F::kExp) - 1) : (code > kMaxCode);
  if (overflow) return saturate ? uint8_t(sign | kMaxCode) : uint8_t(sign | (F::kIeee ? kInf : kNan));
  return uint8_t(sign | code);
}

FLAMIA_HD uint8_t e4m3_rn_sat(float x) { return fp8_encode<E4M3>(x, true); }
FLAMIA_HD float e4m3_to_f32(uint8_t c) { return fp8_decode<E4M3>(c); }
FLAMIA_HD uint8_t e5m2_rn_sat(float x) { return fp8_encode<E5M2>(x, true); }
FLAMIA_HD float e5m2_to_f32(uint8_t c) { return fp8_decode<E5M2>(c); }

// ---------------------------------------------------------------------------------------
// BF16: round-to-nearest-even from fp32, NaN kept quiet.
// ---------------------------------------------------------------------------------------
FLAMIA_HD uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
FLAMIA_HD float bf16_bits_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }
FLAMIA_HD float round_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

// ---------------------------------------------------------------------------------------
// E8M0 (MX shared scale): value 2^(code-127); code 0xFF is NaN. No sign, no zero.
// ---------------------------------------------------------------------------------------
constexpr uint8_t kE8M0Nan = 0xff;
FLAMIA_HD float e8m0_to_f32(uint8_t code) {
  return code == kE8M0Nan ? bits_f32(0x7fc00000u) : exp2i(int(code) - 127);
}
FLAMIA_HD uint8_t e8m0_from_exponent(int e) { return uint8_t(e + 127); }

// ---------------------------------------------------------------------------------------
// The per-token scale rule (DESIGN §2): s = 2^e with e the smallest integer such that
// amax <= 448 * 2^e, i.e. e = ceil(log2(amax / 448)) evaluated exactly (no division).
// amax == 0 gives the smallest scale, s = 2^-126: an all-zero row has zero codes whatever its
// scale, but its scale is also folded into maxima taken over scaled values (P·sdo for dV's
// per-key scale, p·sv for P's scale, dS·sq, dS·sk), where s = 1 would dominate every real row
// (whose scales are ~amax/448) and flush their FP8 codes to zero: tokens without a loss term
// (dO = 0) would wipe out dV. e is clamped to [-126, 127] so that s is a normal fp32 number
// (flush-to-zero arithmetic on the GPU then cannot zero it) and an E8M0 code.
// A non-finite amax gives NaN, so that NaN/Inf inputs poison their row instead of being
// saturated into finite values.
// ---------------------------------------------------------------------------------------
constexpr int kScaleExpMin = -126;
constexpr int kScaleExpMax = 127;

// Exponent for a finite amax >= 0; kScaleExpMin for amax == 0.
FLAMIA_HD int pow2_scale_exponent(float amax, float max_elem = E4M3::kMax) {
  if (!(amax > 0.0f)) return kScaleExpMin;
  // amax = f * 2^ea with f in [1, 2); max_elem = g * 2^eg with g in [1, 2).
  const uint32_t ua = f32_bits(amax), ug = f32_bits(max_elem);
  int ea = int(ua >> 23) - 127;
  uint32_t fa = ua & 0x7fffffu;
  if ((ua >> 23) == 0) {  // fp32 subnormal amax: normalise
    int lz = 0;
    while (!(fa & 0x800000u)) { fa <<= 1; ++lz; }
    fa &= 0x7fffffu;
    ea = -126 - lz;
  }
  const int eg = int(ug >> 23) - 127;
  const uint32_t fg = ug & 0x7fffffu;
  // amax <= max_elem * 2^e  <=>  e >= ea - eg + (fa > fg ? 1 : 0)
  int e = ea - eg + (fa > fg ? 1 : 0);
  if (e < kScaleExpMin) e = kScaleExpMin;
  if (e > kScaleExpMax) e = kScaleExpMax;
  return e;
}

FLAMIA_HD float pow2_scale(float amax, float max_elem = E4M3::kMax) {
  if (!is_finite_f32(amax)) return bits_f32(0x7fc00000u);
  return exp2i(pow2_scale_exponent(amax, max_elem));
}

// pow2_scale(amax) for E4M3's maximum (448 = 1.75 * 2^8) in a few integer operations and
// selects, no branch: the same value for every float (tests/cpu/test_formats.cpp), for the
// kernels, where pow2_scale's branches and loop sat in the hot loops (docs/PERFORMANCE.md
// v17). Adding 0x1fffff to the bits carries into the exponent exactly when the mantissa
// exceeds 1.75's (0x600000), i.e. when amax > 1.75 * 2^ea; the biased exponent minus 8 is
// then the scale's, clamped to [kScaleExpMin, kScaleExpMax] (subnormal amax: the minimum).
FLAMIA_HD float pow2_scale_e4m3(float amax) {
  const uint32_t ua = f32_bits(amax);
  int eb = int((ua + 0x1fffffu) >> 23) - 8;  // for 0 <= amax < Inf
  eb = eb < kScaleExpMin + 127 ? kScaleExpMin + 127 : eb;
  eb = eb > kScaleExpMax + 127 ? kScaleExpMax + 127 : eb;
  uint32_t r = uint32_t(eb) << 23;
  r = (ua >> 31) != 0u ? uint32_t(kScaleExpMin + 127) << 23 : r;  // negative, -0
  r = (ua & 0x7fffffffu) >= 0x7f800000u ? 0x7fc00000u : r;          // Inf, NaN
  return bits_f32(r);
}

// 1/s, exactly, for a scale s = 2^e with e in [kScaleExpMin, kScaleExpMax] (pow2_scale's
// range) or NaN: the biased exponent is mirrored, no division or reciprocal unit needed
// (2^127's inverse, 2^-127, is subnormal; NaN stays NaN). Selects only, as above.
FLAMIA_HD float pow2_reciprocal(float s) {
  const uint32_t b = f32_bits(s);
  const uint32_t r = b > 0x7f000000u ? b : 0x7f000000u - b;
  return bits_f32(b == 0x7f000000u ? 0x00400000u : r);
}

// Quantize one element given its (power-of-two) scale: e4m3_rn_satfinite(x / s).
// Division by a power of two is exact, so x * (1/s) is used (1/s is exact too).
FLAMIA_HD uint8_t quantize_e4m3(float x, float scale) {
  return e4m3_rn_sat(x * (1.0f / scale));
}

// ---------------------------------------------------------------------------------------
// E2M1 (FP4): 1 sign, 2 exponent, 1 mantissa bits, bias 1, no Inf/NaN.
// Values: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
// ---------------------------------------------------------------------------------------
FLAMIA_HD float e2m1_to_f32(uint8_t code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[code & 7u];
  return (code & 8u) ? -v : v;
}

// Round to nearest, ties to even code (even mantissa), saturating at 6 (Inf too). E2M1 has
// no NaN and OCP leaves its conversion open: NaN gives +6 (code 0x7), as CUDA's
// __nv_cvt_float_to_fp4 / cvt.rn.satfinite.e2m1x2 do, so that CPU and GPU codes agree.
// NVFP4 carries NaN in its block scale instead (nvfp4_quantize_block).
FLAMIA_HD uint8_t e2m1_rn_sat(float x) {
  const uint32_t b = f32_bits(x);
  const uint8_t sign = uint8_t((b >> 31) << 3);
  const float a = bits_f32(b & 0x7fffffffu);
  if (is_nan_f32(a)) return 0x7;
  uint8_t c;
  if (a <= 0.25f) c = 0;           // tie 0.25 -> 0 (even)
  else if (a < 0.75f) c = 1;       // 0.5
  else if (a <= 1.25f) c = 2;      // tie 0.75 -> 1.0 (even); tie 1.25 -> 1.0 (even)
  else if (a < 1.75f) c = 3;       // 1.5
  else if (a <= 2.5f) c = 4;       // tie 1.75 -> 2.0 (even); tie 2.5 -> 2.0 (even)
  else if (a < 3.5f) c = 5;        // 3
  else if (a <= 5.0f) c = 6;       // tie 3.5 -> 4 (even); tie 5 -> 4 (even)
  else c = 7;                      // 6, saturating
  return uint8_t(sign | c);
}

// ---------------------------------------------------------------------------------------
// MXFP8 (OCP MX v1.0): blocks of 32 elements share an E8M0 scale
// X = 2^(floor(log2(amax)) - emax_elem), emax_elem = 8 for E4M3; elements are
// e4m3_rn_satfinite(x / X).
// ---------------------------------------------------------------------------------------
constexpr int kMxBlock = 32;

FLAMIA_HD uint8_t mx_scale_code(float amax) {
  if (!is_finite_f32(amax)) return kE8M0Nan;
  if (amax == 0.0f) return e8m0_from_exponent(-127);
  const uint32_t u = f32_bits(amax);
  int e = int(u >> 23) - 127;
  if ((u >> 23) == 0) e = -127;  // subnormal amax: below the E8M0 range, clamp
  e -= 8;
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return e8m0_from_exponent(e);
}

// Quantize n (<= 32) contiguous values into one MX block.
FLAMIA_HD void mxfp8_quantize_block(const float* x, int n, uint8_t* codes, uint8_t* scale_code) {
  float amax = 0.0f;
  bool bad = false;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (!is_finite_f32(x[i])) bad = true;
    amax = a > amax ? a : amax;
  }
  *scale_code = bad ? kE8M0Nan : mx_scale_code(amax);
  const float s = e8m0_to_f32(*scale_code);
  for (int i = 0; i < n; ++i) codes[i] = e4m3_rn_sat(x[i] / s);
}

// ---------------------------------------------------------------------------------------
// NVFP4: E2M1 elements, one E4M3 scale per 16 elements, one FP32 scale per tensor (or
// tensor-head). Tensor scale g = amax_tensor / (448 * 6) so that block scales use E4M3's
// range; block scale b = e4m3(amax_block / (6 * g)); element = e2m1(x / (b * g)).
// A block holding NaN or Inf gets the E4M3 NaN code as its scale, so every element of it
// decodes to NaN: E2M1 cannot carry NaN, and a saturated scale would launder it.
// ---------------------------------------------------------------------------------------
constexpr int kNvfp4Block = 16;

FLAMIA_HD float nvfp4_tensor_scale(float amax_tensor) {
  if (!is_finite_f32(amax_tensor)) return bits_f32(0x7fc00000u);
  return amax_tensor > 0.0f ? amax_tensor / (448.0f * 6.0f) : 1.0f;
}

FLAMIA_HD void nvfp4_quantize_block(const float* x, int n, float tensor_scale, uint8_t* codes,
                                    uint8_t* block_scale_code) {
  float amax = 0.0f;
  bool bad = false;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (!is_finite_f32(x[i])) bad = true;
    amax = a > amax ? a : amax;
  }
  *block_scale_code = bad ? uint8_t(0x7f) : e4m3_rn_sat(amax / (6.0f * tensor_scale));
  const float s = e4m3_to_f32(*block_scale_code) * tensor_scale;
  for (int i = 0; i < n; ++i) codes[i] = (s > 0.0f) ? e2m1_rn_sat(x[i] / s) : uint8_t(0);
}

FLAMIA_HD float nvfp4_decode(uint8_t code, uint8_t block_scale_code, float tensor_scale) {
  return e2m1_to_f32(code) * e4m3_to_f32(block_scale_code) * tensor_scale;
}

}  // namespace fmt
}  // namespace flamia
