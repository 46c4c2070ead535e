// The specification with the wgmma accumulation (EmulationConfig::arith, Accumulation::Wgmma):
//  - it changes results only slightly against the FP32-accumulating specification, and does
//    change them (the option is live);
//  - it keeps causal safety and document isolation bitwise;
//  - one definition of S for forward and backward keeps the backward's P <= 1: finite
//    gradients at logits ~1e6, where a backward that sums S differently overflows.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "test_util.h"

namespace flamia {
namespace ref {
namespace testing {
namespace {

EmulationConfig fp32_config(Scheme scheme, flamia_recipe recipe) {
  return with_accumulation(config(scheme, recipe), Accumulation::Fp32);
}

EmulationConfig wgmma_config(Scheme scheme, flamia_recipe recipe) {
  return with_accumulation(config(scheme, recipe), Accumulation::Wgmma);
}

// Relative L2 difference of two outputs of the same problem.
template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<double> ref(b.size());
  for (size_t e = 0; e < b.size(); ++e) ref[e] = value_of(b[e]);
  return rel_l2(a, ref);
}

struct Case {
  std::vector<int> lengths;
  int hq, hkv, dim;
  bool causal;
};

const Case kCases[] = {
    {{1, 63, 64, 65, 130}, 4, 1, 64, true},
    {{150, 31}, 2, 2, 128, false},
    {{200, 3}, 1, 1, 128, true},
};

TEST(WgmmaSpec, CloseToFp32AccumulationButNotEqual) {
  std::mt19937_64 rng(91);
  for (const Case& c : kCases)
    for (Scheme scheme : {Scheme::PerToken, Scheme::Bf16})
      for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
        if (scheme == Scheme::Bf16 && recipe == FLAMIA_RECIPE_FP8_MIXED) continue;  // same as fp8
        const Pack pk = random_pack(c.lengths, c.hq, c.hkv, c.dim, c.causal, rng());
        SCOPED_TRACE(describe(pk) + " " + scheme_name(scheme) + " " + recipe_name(recipe));
        const Outputs a = run_emulation(pk, fp32_config(scheme, recipe), true);
        const Outputs w = run_emulation(pk, wgmma_config(scheme, recipe), true);
        const double d_o = rel_diff(w.o, a.o), d_lse = rel_diff(w.lse, a.lse), d_dq = rel_diff(w.dq, a.dq),
                     d_dk = rel_diff(w.dk, a.dk), d_dv = rel_diff(w.dv, a.dv);
        std::printf("  %-60s O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e\n",
                    (describe(pk) + " " + scheme_name(scheme) + " " + recipe_name(recipe)).c_str(), d_o, d_lse,
                    d_dq, d_dk, d_dv);
        EXPECT_GT(d_o + d_lse, 0.0);  // the option is live
        // The steps' cut to 14 (E4M3) or 24 (BF16) significant bits moves S by ~1e-4
        // (~1e-7) relative; that flips a few FP8 (BF16) roundings of P and dS, which is
        // what O and the gradients show (measured: FP8 2e-3 .. 5e-3, BF16 ~1e-4).
        const double bound = scheme == Scheme::Bf16 ? 5e-4 : 1e-2;
        EXPECT_LT(d_o, bound);
        EXPECT_LT(d_lse, scheme == Scheme::Bf16 ? 1e-6 : 1e-4);
        EXPECT_LT(d_dq, 2 * bound);
        EXPECT_LT(d_dk, 2 * bound);
        EXPECT_LT(d_dv, 2 * bound);
      }
}

// arith.bwd selects the backward's dP and its dV, dK, dQ tile products alone: O and LSE keep
// their bits, the gradients move by the step cuts (E4M3 products cut to 13 fraction bits of
// the step's largest term, BF16 to 25) and the roundings to FP8 that those flip.
TEST(WgmmaSpec, BackwardArithmeticMovesOnlyTheGradients) {
  std::mt19937_64 rng(17);
  for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    const Pack pk = random_pack({130, 64, 7}, 4, 2, 64, true, rng());
    SCOPED_TRACE(recipe_name(recipe));
    EmulationConfig fp32_bwd = wgmma_config(Scheme::PerToken, recipe);
    fp32_bwd.arith.bwd = Accumulation::Fp32;
    const Outputs a = run_emulation(pk, fp32_bwd, true);
    const Outputs w = run_emulation(pk, wgmma_config(Scheme::PerToken, recipe), true);
    EXPECT_EQ(a.o, w.o);
    EXPECT_EQ(rel_diff(w.lse, a.lse), 0.0);
    for (const auto* g : {&w.dq, &w.dk, &w.dv}) EXPECT_TRUE(all_finite(*g));
    const double d_dq = rel_diff(w.dq, a.dq), d_dk = rel_diff(w.dk, a.dk), d_dv = rel_diff(w.dv, a.dv);
    std::printf("  %s: dQ %.2e dK %.2e dV %.2e\n", recipe_name(recipe), d_dq, d_dk, d_dv);
    EXPECT_GT(d_dq + d_dk + d_dv, 0.0);
    EXPECT_LT(d_dq, 2e-2);
    EXPECT_LT(d_dk, 2e-2);
    EXPECT_LT(d_dv, 2e-2);
  }
}

TEST(WgmmaSpec, CausalSafeAndDocumentsIsolatedBitwise) {
  std::mt19937_64 rng(92);
  const Perturbation kinds[] = {Perturbation::Random, Perturbation::Huge, Perturbation::Rescale};
  int checks = 0;
  for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    const EmulationConfig cfg = wgmma_config(Scheme::PerToken, recipe);
    for (bool causal : {true, false}) {
      const Pack pk = random_pack({65, 1, 100, 40}, 2, 1, 64, causal, rng());
      SCOPED_TRACE(describe(pk) + " " + recipe_name(recipe));
      const Outputs base = run_emulation(pk, cfg, true);
      for (Perturbation kind : kinds) {
        if (causal)
          for (int t : {0, 63, 64, 90}) {
            const CheckResult r = check_causal(pk, cfg, base, 2, t, kind, rng());
            EXPECT_TRUE(r.identical()) << "causal t " << t << " " << perturbation_name(kind);
            ++checks;
          }
        for (int doc : {0, 2}) {
          const CheckResult r = check_isolation(pk, cfg, base, doc, kind, rng());
          EXPECT_TRUE(r.identical()) << "isolation doc " << doc << " " << perturbation_name(kind);
          ++checks;
        }
      }
    }
  }
  EXPECT_GT(checks, 30);
}

// Inputs x3000: logits ~1e6. With S defined once (wgmma in forward and backward) the
// backward's P = exp2(S c - lse2) stays <= 1 and the gradients are finite; a backward that
// sums S in FP32 against the forward's wgmma LSE overflows (the failure seen on the GPU).
TEST(WgmmaSpec, OneScoreDefinitionKeepsLargeLogitGradientsFinite) {
  std::mt19937_64 rng(93);
  for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
    Pack pk = random_pack({150, 70}, 2, 1, 128, true, rng());
    scale_rows(pk.q, 0, pk.p.total_tokens, pk.p.hq, pk.p.head_dim, 3000.0f);
    scale_rows(pk.k, 0, pk.p.total_tokens, pk.p.hkv, pk.p.head_dim, 3000.0f);
    SCOPED_TRACE(std::string(recipe_name(recipe)));
    const EmulationConfig cfg = wgmma_config(Scheme::PerToken, recipe);
    const Outputs w = run_emulation(pk, cfg, true);
    EXPECT_TRUE(all_finite(w.o) && all_finite(w.lse));
    EXPECT_TRUE(all_finite(w.dq) && all_finite(w.dk) && all_finite(w.dv));

    EmulationConfig mixed = cfg;
    mixed.arith.s = Accumulation::Fp32;
    Outputs m = w;
    const Problem& p = pk.p;
    emulate_backward(p, mixed, pk.q.data(), pk.k.data(), pk.v.data(), pk.dout.data(), w.o.data(), w.lse.data(),
                     m.dq.data(), m.dk.data(), m.dv.data());
    EXPECT_FALSE(all_finite(m.dq) && all_finite(m.dk) && all_finite(m.dv))
        << "expected the two definitions of S to disagree enough to overflow exp2";
  }
}

}  // namespace
}  // namespace testing
}  // namespace ref
}  // namespace flamia
