// A host-only model of how a Hopper warpgroup MMA (wgmma ... .f32 accumulate) adds one
// k-step of products to its FP32 accumulator. It is not IEEE addition: the products of
// one step and the incoming accumulator are aligned to the largest exponent among them,
// each aligned term keeps a fixed number of fraction bits (cut toward zero), the terms are
// summed exactly, and the sum is cut again to a fixed number of fraction bits of its own
// exponent. The rule's parameters (fraction bits, alignment floor) were measured on an
// H200 (docs/NUMERICS.md §6); the functions below take them as data so that the probe can
// test neighbouring hypotheses with the same code.
#pragma once

#include <cstdint>

namespace flamia {
namespace ref {
namespace tc {

struct StepRule {
  int k;              // products per instruction step: 32 (E4M3 k32), 16 (BF16 k16)
  int term_frac_bits; // aligned terms are cut toward zero to 2^(E - term_frac_bits), E = alignment exponent
  int sum_frac_bits;  // the exact sum is cut toward zero to 2^(e - sum_frac_bits), e = its own exponent
  int min_align_exp;  // E = max(largest exponent among the nonzero terms, min_align_exp)
};

// wgmma.mma_async m64nNk32.f32.e4m3.e4m3 and m64nNk16.f32.bf16.bf16 on H200 (sm_90a).
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

}  // namespace tc
}  // namespace ref
}  // namespace flamia
