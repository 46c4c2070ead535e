// A host-only model of how a Hopper warpgroup MMA (wgmma ... .f32 accumulate) adds one
// k-step of products to its FP32 accumulator. It is not IEEE addition. Measured on an H200
// (docs/NUMERICS.md §6), bit for bit on every probed case:
//   - every term gets an exponent: a product a·b the sum ea + eb of its operands'
//     exponents (not the exponent of the product itself, whose significand may be >= 2;
//     a subnormal operand counts with its format's smallest normal exponent); the
//     incoming accumulator its own FP32 exponent (subnormals: -126);
//   - E = the largest of these over the nonzero terms of the step;
//   - each term is cut toward zero to a multiple of 2^(E - term_frac_bits);
//   - the cut terms are summed exactly; the sum is cut toward zero to sum_frac_bits
//     fraction bits of its own exponent (and to FP32's subnormal grid).
// The functions take the parameters as data so that the probe can test neighbouring rules.
#pragma once

#include <cstdint>

namespace flamia {
namespace ref {
namespace tc {

struct StepRule {
  int k;              // products per instruction step: 32 (E4M3 k32), 16 (BF16 k16)
  int term_frac_bits; // aligned terms are cut toward zero to 2^(E - term_frac_bits), E = alignment exponent
  int sum_frac_bits;  // the exact sum is cut toward zero to 2^(e - sum_frac_bits), e = its own exponent
  int operand_min_exp;// the operand format's smallest normal exponent (E4M3: -6, BF16: -126)
};

// wgmma.mma_async m64nNk32.f32.e4m3.e4m3 {32, 13, 13, -6} and m64nNk16.f32.bf16.bf16
// {16, 25, 23, -126} on H200 (sm_90a): the same for A from shared memory or registers,
// for N = 64, 128, 256, and for scale-d 0 or scale-d 1 on a +0 accumulator.
extern const StepRule kHopperE4M3;
extern const StepRule kHopperBF16;

// One instruction step: rule.k products a[i] * b[i] (a, b: exact values of E4M3 or BF16
// operands, as floats) added to the incoming accumulator c. has_c = false is scale-d = 0
// (no accumulator term at all). Special values: a NaN anywhere, Inf - Inf, or Inf * 0 give
// the canonical NaN 0x7fffffff; otherwise an Inf term gives that Inf.
float mma_step(const StepRule& rule, float c, bool has_c, const float* a, const float* b);

// A dot product of length n as a kernel computes it: ceil(n / k) steps in ascending index
// order, a fresh accumulator (scale-d = 0) on the first, chained (scale-d = 1) after; a
// partial last step is padded with zero products (as the kernels' zero-filled tiles).
// a and b are contiguous (stride_b lets b be a column of a row-major matrix).
float mma_dot(const StepRule& rule, const float* a, const float* b, int n, int stride_b = 1);

// The same chain of steps added onto an incoming accumulator c (scale-d = 1 on every step,
// the first included), as when a kernel keeps one accumulator across several such chains.
float mma_dot_onto(const StepRule& rule, float c, const float* a, const float* b, int n, int stride_b = 1);

}  // namespace tc
}  // namespace ref
}  // namespace flamia
