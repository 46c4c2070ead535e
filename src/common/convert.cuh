// Float -> E4M3 and -> BF16 packs (and E4M3 -> float) as single PTX conversions, shared by the
// quantizer and the attention kernels (sm_89+ for E4M3).
#pragma once

#include <cstdint>

namespace flamia {
namespace cvt {

// Four floats -> four E4M3 bytes (round to nearest even, saturate to +-448, NaN stays NaN);
// byte i of the result is x_i. cvt puts its first source in the upper byte, hence the order.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t r;
  asm("{\n"
      ".reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n"
      "}\n"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}

// Four E4M3 bytes -> their values, x_i from byte i (exact: every E4M3 value is an FP16 one).
// cvt takes an upper byte to the upper half, as the packs above put x_1 in the upper byte.
__device__ __forceinline__ void unpack_e4m3x4(uint32_t w, float (&x)[4]) {
  asm("{\n"
      ".reg .b16 lo, hi, h0, h1, h2, h3;\n"
      ".reg .b32 p01, p23;\n"
      "mov.b32 {lo, hi}, %4;\n"
      "cvt.rn.f16x2.e4m3x2 p01, lo;\n"
      "cvt.rn.f16x2.e4m3x2 p23, hi;\n"
      "mov.b32 {h0, h1}, p01;\n"
      "mov.b32 {h2, h3}, p23;\n"
      "cvt.f32.f16 %0, h0;\n"
      "cvt.f32.f16 %1, h1;\n"
      "cvt.f32.f16 %2, h2;\n"
      "cvt.f32.f16 %3, h3;\n"
      "}\n"
      : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
      : "r"(w));
}

// Two floats -> two BF16 (round to nearest even); lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(lo), "f"(hi));
  return r;
}

}  // namespace cvt
}  // namespace flamia
