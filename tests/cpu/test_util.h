// Helpers shared by the CPU tests: the workload generators and checks of
// reference/harness.h (random packs, outlier injection, relative L2 error, bitwise
// property checks) plus a few GoogleTest conveniences.
#pragma once

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

}  // namespace testing
}  // namespace ref
}  // namespace flamia
