// Helpers shared by the CPU tests: the workload generators and checks of
// reference/harness.h (random packs, outlier injection, relative L2 error, bitwise
// property checks) plus a few GoogleTest conveniences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/harness.h"
#include "reference/reference.h"

namespace flamia {
namespace ref {
namespace testing {

using namespace harness;

inline EmulationConfig config(Scheme scheme, flamia_recipe recipe) {
  EmulationConfig cfg;
  cfg.scheme = scheme;
  cfg.recipe = recipe;
  return cfg;
}

// cfg with every matmul summed by `acc` (S, the forward's P·V, the backward's products).
inline EmulationConfig with_accumulation(EmulationConfig cfg, Accumulation acc) {
  cfg.arith = Arithmetic{acc, acc, acc};
  return cfg;
}

inline const char* recipe_name(flamia_recipe r) { return r == FLAMIA_RECIPE_FP8 ? "fp8" : "fp8_mixed"; }

inline std::string describe(const Pack& pk) {
  std::string s = "docs=[";
  for (int b = 0; b < pk.p.num_docs(); ++b) {
    if (b) s += ",";
    if (b == 12 && pk.p.num_docs() > 16) {
      s += "... (" + std::to_string(pk.p.num_docs()) + " docs)";
      break;
    }
    s += std::to_string(pk.doc_end(b) - pk.doc_begin(b));
  }
  s += "] Hq=" + std::to_string(pk.p.hq) + " Hkv=" + std::to_string(pk.p.hkv) +
       " D=" + std::to_string(pk.p.head_dim) + (pk.p.causal ? " causal" : " non-causal");
  return s;
}

// Is the BF16 row [t, h] (or FP32 value) entirely NaN?
inline bool row_all_nan(const Bits& x, int64_t t, int h, int heads, int dim) {
  for (int d = 0; d < dim; ++d)
    if (!fmt::is_nan_f32(from_bf16(x[(size_t(t) * heads + h) * dim + d]))) return false;
  return true;
}

// Input quantization transcribed literally from docs/ALGORITHM.md §1 (and the comparison
// schemes of §5), slow and simple on purpose: the independent side of tests that check the
// emulation, or that need q, k, v's quantized values in a float64 reference.
inline float nanmax(float a, float b) { return (std::isnan(a) || std::isnan(b)) ? NAN : (a > b ? a : b); }

struct Quantized {
  std::vector<float> x8, s, raw;  // element values, scales [T, H], BF16 input values
  int H, D;
  float e(int64_t t, int h, int d) const { return x8[(t * H + h) * D + d]; }
  float r(int64_t t, int h, int d) const { return raw[(t * H + h) * D + d]; }
  float sc(int64_t t, int h) const { return s[t * H + h]; }
};

inline Quantized literal_quantize(const Bits& x, int64_t T, int H, int D, Scheme scheme) {
  Quantized out{std::vector<float>(x.size()), std::vector<float>(T * H, 1.0f), std::vector<float>(x.size()), H, D};
  for (size_t e = 0; e < x.size(); ++e) out.raw[e] = from_bf16(x[e]);
  for (int h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t) {
      int64_t g0 = t, g1 = t + 1;  // tokens sharing t's scale
      if (scheme == Scheme::PerTensor) { g0 = 0; g1 = T; }
      if (scheme == Scheme::TokenBlock32) { g0 = t - t % 32; g1 = std::min<int64_t>(g0 + 32, T); }
      float amax = 0.0f;
      for (int64_t u = g0; u < g1; ++u)
        for (int d = 0; d < D; ++d) amax = nanmax(amax, std::fabs(out.r(u, h, d)));
      const float s = scheme == Scheme::Bf16 ? 1.0f : fmt::pow2_scale(amax);
      out.s[t * H + h] = s;
      for (int d = 0; d < D; ++d)
        out.x8[(t * H + h) * D + d] =
            scheme == Scheme::Bf16 ? out.r(t, h, d) : fmt::e4m3_to_f32(fmt::quantize_e4m3(out.r(t, h, d), s));
    }
  return out;
}

}  // namespace testing
}  // namespace ref
}  // namespace flamia
