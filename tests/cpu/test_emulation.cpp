// The emulation against a second, deliberately literal transcription of
// docs/ALGORITHM.md (scalar loops, one pair at a time), bit for bit; power-of-two
// invariances; NaN/Inf propagation confined to the affected document.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test_util.h"

namespace flamia {
namespace ref {
namespace testing {
namespace {

// ---------------------------------------------------------------------------------------
// Literal transcription of docs/ALGORITHM.md. Slow and simple on purpose.
// ---------------------------------------------------------------------------------------
// Rounds values for a matmul: FP8 with the scale of their max, or BF16 (scale 1).
float literal_round(std::vector<float>& x, bool fp8) {
  if (!fp8) {
    for (float& e : x) e = fmt::round_bf16(e);
    return 1.0f;
  }
  float amax = 0.0f;
  for (float e : x) amax = nanmax(amax, std::fabs(e));
  const float s = fmt::pow2_scale(amax);
  for (float& e : x) e = fmt::e4m3_to_f32(fmt::quantize_e4m3(e, s));
  return s;
}

struct Literal {
  const Pack& pk;
  EmulationConfig cfg;
  Quantized q, k, v, dO;
  float c;
  Literal(const Pack& p, const EmulationConfig& c_)
      : pk(p), cfg(c_),
        q(literal_quantize(p.q, p.p.total_tokens, p.p.hq, p.p.head_dim, c_.scheme)),
        k(literal_quantize(p.k, p.p.total_tokens, p.p.hkv, p.p.head_dim, c_.scheme)),
        v(literal_quantize(p.v, p.p.total_tokens, p.p.hkv, p.p.head_dim, c_.scheme)),
        dO(literal_quantize(p.dout, p.p.total_tokens, p.p.hq, p.p.head_dim, c_.scheme)),
        c(p.p.softmax_scale * 1.4426950408889634f) {}
  bool fp8() const { return cfg.scheme != Scheme::Bf16; }
  int kvh(int h) const { return h / (pk.p.hq / pk.p.hkv); }
  bool visible(int i, int j, int L) const { return j < L && (!pk.p.causal || j <= i); }

  float S(int64_t base, int i, int j, int h) const {
    float dot = 0.0f;
    for (int d = 0; d < pk.p.head_dim; ++d) dot += q.e(base + i, h, d) * k.e(base + j, kvh(h), d);
    return dot * q.sc(base + i, h) * k.sc(base + j, kvh(h));
  }

  void forward(Bits& out, std::vector<float>& lse) const {
    // The transcription is of §2 as written: the lazy reference, the key rule, no headroom.
    EXPECT_TRUE(cfg.fwd.p_ref == PRef::Lazy && cfg.fwd.p_scale == PScale::TileKeys && cfg.fwd.p_headroom_log2 == 0 &&
                cfg.fwd.fold == PvFold::Fresh && cfg.fwd.pv_operand == PvOperand::Fp8)
        << "the literal transcription is of the default forward options only";
    const int D = pk.p.head_dim, BN = cfg.tiling.fwd_block_n;
    const int64_t T = pk.p.total_tokens;
    for (int b = 0; b < pk.p.num_docs(); ++b) {
      const int64_t base = pk.doc_begin(b);
      const int L = int(pk.doc_end(b) - base);
      for (int h = 0; h < pk.p.hq; ++h)
        for (int i = 0; i < L; ++i) {
          float m = -INFINITY, l = 0.0f, mc = 0.0f;
          std::vector<float> acc(D, 0.0f);
          for (int n0 = 0; n0 < L; n0 += BN) {
            std::vector<int> js;
            for (int j = n0; j < n0 + BN; ++j)
              if (visible(i, j, L)) js.push_back(j);
            if (js.empty()) continue;
            std::vector<float> s, p, x;
            float mt = -INFINITY;
            for (int j : js) { s.push_back(S(base, i, j, h)); mt = nanmax(mt, s.back()); }
            const float m_new = nanmax(m, mt);
            const float mc_prev = mc;
            // The reference moves on the first tile, or when m_new passes it by more than T.
            const float T = float(cfg.fwd.rescale_log2);
            const bool moves = m == -INFINITY || !(std::fmaf(m_new, c, -mc) <= T);
            if (moves) mc = m_new * c;
            for (float sj : s) p.push_back(std::exp2(std::fmaf(sj, c, -mc)));
            const float alpha = m == -INFINITY ? 0.0f : moves ? std::exp2(mc_prev - mc) : 1.0f;
            float sum = 0.0f;
            for (float pj : p) sum += pj;
            l = l * alpha + sum;
            float sigma = 1.0f;
            if (fp8()) {
              // The key rule: sigma = pow2_scale(pm * Y), pm = 2^T while m_new is within T of
              // the reference, Y the largest V scale of the visible keys.
              const float d = std::fmaf(m_new, c, -mc);
              const float pm = d <= T ? std::ldexp(1.0f, cfg.fwd.rescale_log2) : std::exp2(d);
              float y = 0.0f;
              for (int j : js) y = nanmax(y, v.sc(base + j, kvh(h)));
              sigma = fmt::pow2_scale(pm * y);
              for (size_t n = 0; n < js.size(); ++n)
                x.push_back(fmt::e4m3_to_f32(fmt::e4m3_rn_sat(p[n] * (v.sc(base + js[n], kvh(h)) / sigma))));
            } else {
              for (size_t n = 0; n < js.size(); ++n) x.push_back(fmt::round_bf16(p[n] * v.sc(base + js[n], kvh(h))));
            }
            for (int d = 0; d < D; ++d) {
              float t = 0.0f;
              for (size_t n = 0; n < js.size(); ++n) t += x[n] * v.e(base + js[n], kvh(h), d);
              acc[d] = acc[d] * alpha + sigma * t;
            }
            m = m_new;
          }
          const float inv_l = 1.0f / l;  // one division a row, then a multiply (§2)
          for (int d = 0; d < D; ++d) out[((base + i) * pk.p.hq + h) * D + d] = to_bf16(acc[d] * inv_l);
          lse[h * T + base + i] = (mc + std::log2(l)) * 0.6931471805599453f;
        }
    }
  }

  void backward(const Bits& out, const std::vector<float>& lse, Bits& dq, Bits& dk, Bits& dv) const {
    const int D = pk.p.head_dim, Hq = pk.p.hq, Hkv = pk.p.hkv;
    const int64_t T = pk.p.total_tokens;
    // Recipe fp8: every tile product FP8; fp8_mixed: dV's and dK's, dQ's in BF16.
    const bool ds_fp8 = fp8() && cfg.recipe == FLAMIA_RECIPE_FP8, dv_fp8 = ds_fp8;
    for (int b = 0; b < pk.p.num_docs(); ++b) {
      const int64_t base = pk.doc_begin(b);
      const int L = int(pk.doc_end(b) - base);
      // P and dS of pair (i, j) for head h, straight from the formulas.
      // D from dO's codes times their scale, the dO that dP is formed from.
      auto Dsum = [&](int i, int h) {
        float a = 0.0f;
        for (int d = 0; d < D; ++d)
          a += (dO.e(base + i, h, d) * dO.sc(base + i, h)) * from_bf16(out[((base + i) * Hq + h) * D + d]);
        return a;
      };
      // lse2 is NaN for a dO row that is not finite (its scale is NaN).
      auto P = [&](int i, int j, int h) {
        const float lse2 = std::isnan(dO.sc(base + i, h)) ? NAN : lse[h * T + base + i] * 1.4426950408889634f;
        return std::exp2(std::fmaf(S(base, i, j, h), c, -lse2));
      };
      auto dS = [&](int i, int j, int h) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += dO.e(base + i, h, d) * v.e(base + j, kvh(h), d);
        const float dP = dot * dO.sc(base + i, h) * v.sc(base + j, kvh(h));
        return P(i, j, h) * (dP - Dsum(i, h));
      };
      for (int g = 0; g < Hkv; ++g)
        for (int j = 0; j < L; ++j) {
          std::vector<float> dka(D, 0.0f), dva(D, 0.0f);
          for (int h = 0; h < Hq; ++h) {
            if (kvh(h) != g) continue;
            for (int m0 = 0; m0 < L; m0 += cfg.tiling.bwd_block_m) {
              std::vector<int> is;
              for (int i = m0; i < std::min(m0 + cfg.tiling.bwd_block_m, L); ++i)
                if (visible(i, j, L)) is.push_back(i);
              if (is.empty()) continue;
              std::vector<float> x, y;
              for (int i : is) {
                x.push_back(dv_fp8 ? P(i, j, h) * dO.sc(base + i, h) : P(i, j, h));
                y.push_back(ds_fp8 ? dS(i, j, h) * q.sc(base + i, h) : dS(i, j, h));
              }
              // dV's FP8 scale: the tile's largest dO scale (P <= 1), the same for every key.
              float sigma = 1.0f;
              if (dv_fp8) {
                float sdo_max = 0.0f;
                for (int i = m0; i < std::min(m0 + cfg.tiling.bwd_block_m, L); ++i)
                  sdo_max = std::fmax(sdo_max, dO.sc(base + i, h));
                sigma = fmt::pow2_scale(sdo_max);
                for (float& e : x) e = fmt::e4m3_to_f32(fmt::quantize_e4m3(e, sigma));
              } else {
                literal_round(x, false);
              }
              const float tau = literal_round(y, ds_fp8);
              for (int d = 0; d < D; ++d) {
                float tv = 0.0f, tk = 0.0f;
                for (size_t n = 0; n < is.size(); ++n) {
                  tv += x[n] * (dv_fp8 ? dO.e(base + is[n], h, d) : dO.r(base + is[n], h, d));
                  tk += y[n] * (ds_fp8 ? q.e(base + is[n], h, d) : q.r(base + is[n], h, d));
                }
                dva[d] += sigma * tv;
                dka[d] += tau * tk;
              }
            }
          }
          for (int d = 0; d < D; ++d) {
            dk[((base + j) * Hkv + g) * D + d] = to_bf16(pk.p.softmax_scale * dka[d]);
            dv[((base + j) * Hkv + g) * D + d] = to_bf16(dva[d]);
          }
        }
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < L; ++i) {
          std::vector<float> acc(D, 0.0f);
          for (int n0 = 0; n0 < L; n0 += cfg.tiling.bwd_block_n) {
            std::vector<int> js;
            for (int j = n0; j < n0 + cfg.tiling.bwd_block_n; ++j)
              if (visible(i, j, L)) js.push_back(j);
            if (js.empty()) continue;
            std::vector<float> y;
            const bool k8 = cfg.dq_operand == DqOperand::E4m3K8, codes = ds_fp8 || k8;
            for (int j : js) {
              const float ds = dS(i, j, h), sk = k.sc(base + j, kvh(h));
              y.push_back(ds_fp8 ? ds * sk : k8 ? fmt::round_bf16(fmt::round_bf16(ds) * sk) : ds);
            }
            const float rho = literal_round(y, codes);
            if (cfg.dq_operand == DqOperand::E4m3) {  // y = bf16(dS) here
              const float r = literal_round(y, true);
              for (float& e : y) e = fmt::round_bf16(e * r);
            }
            for (int d = 0; d < D; ++d) {
              float t = 0.0f;
              for (size_t n = 0; n < js.size(); ++n)
                t += y[n] * (codes ? k.e(base + js[n], kvh(h), d) : k.r(base + js[n], kvh(h), d));
              acc[d] += rho * t;
            }
          }
          for (int d = 0; d < D; ++d) dq[((base + i) * Hq + h) * D + d] = to_bf16(pk.p.softmax_scale * acc[d]);
        }
    }
  }
};

void expect_bits_equal(const Bits& a, const Bits& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  size_t diff = 0;
  for (size_t e = 0; e < a.size(); ++e) diff += a[e] != b[e];
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " elements differ";
}

// The transcription sums every dot product in FP32; the wgmma accumulation has its own tests
// (test_tensor_core.cpp, test_wgmma_spec.cpp).
void expect_matches_literal(const Pack& pk, EmulationConfig cfg) {
  cfg = with_accumulation(cfg, Accumulation::Fp32);
  SCOPED_TRACE(std::string(scheme_name(cfg.scheme)) + " " + recipe_name(cfg.recipe) + " dq_operand " +
               std::to_string(int(cfg.dq_operand)) + " " + describe(pk));
  const Outputs got = run_emulation(pk, cfg, true);
  const Literal lit(pk, cfg);
  Bits o(got.o.size()), dq(got.dq.size()), dk(got.dk.size()), dv(got.dv.size());
  std::vector<float> lse(got.lse.size());
  lit.forward(o, lse);
  expect_bits_equal(got.o, o, "O");
  size_t lse_diff = 0;
  for (size_t e = 0; e < lse.size(); ++e) lse_diff += !same_bits(got.lse[e], lse[e]);
  EXPECT_EQ(lse_diff, 0u) << "LSE";
  // The literal backward reads the emulation's forward outputs, as training does.
  lit.backward(got.o, got.lse, dq, dk, dv);
  expect_bits_equal(got.dq, dq, "dQ");
  expect_bits_equal(got.dk, dk, "dK");
  expect_bits_equal(got.dv, dv, "dV");
}

const Scheme kSchemes[] = {Scheme::PerToken, Scheme::PerTensor, Scheme::TokenBlock32, Scheme::Bf16};
const flamia_recipe kRecipes[] = {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED};

TEST(EmulationSpec, MatchesLiteralTranscriptionBitwiseSmallTiles) {
  // Small tiles so that rows span several tiles and tile edges fall mid-document.
  for (bool causal : {true, false})
    for (Scheme s : kSchemes)
      for (flamia_recipe r : kRecipes) {
        EmulationConfig cfg = config(s, r);
        cfg.tiling = {8, 16, 4};
        expect_matches_literal(random_pack({1, 19, 2, 33, 8}, 4, 2, 16, causal, 21), cfg);
        if (r == FLAMIA_RECIPE_FP8_MIXED && s != Scheme::Bf16)
          for (DqOperand dq : {DqOperand::E4m3, DqOperand::E4m3K8}) {
            cfg.dq_operand = dq;
            expect_matches_literal(random_pack({1, 19, 2, 33, 8}, 4, 2, 16, causal, 21), cfg);
          }
      }
}

TEST(EmulationSpec, MatchesLiteralTranscriptionBitwiseDefaultTiles) {
  for (Scheme s : {Scheme::PerToken, Scheme::TokenBlock32})
    for (flamia_recipe r : kRecipes)
      expect_matches_literal(random_pack({70, 3, 130}, 2, 1, 64, true, 22), config(s, r));
  expect_matches_literal(random_pack({65, 64}, 2, 2, 128, false, 23), config(Scheme::PerToken, FLAMIA_RECIPE_FP8));
}

// Power-of-two scales change no rounding: multiplying V by 2^k multiplies O by exactly 2^k,
// and with it D = rowsum(dO O) and dP = dO Vᵀ, so dS, dQ and dK scale by 2^k too; LSE and
// dV = Pᵀ dO do not change at all. Every scheme and recipe, the backward included.
TEST(EmulationSpec, PowerOfTwoScalingOfVIsExact) {
  auto expect_scaled = [](const Bits& a, const Bits& b, float f, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t e = 0; e < a.size(); ++e)
      ASSERT_TRUE(same_bits(from_bf16(a[e]) * f, from_bf16(b[e]))) << what << " element " << e;
  };
  for (Scheme s : {Scheme::PerToken, Scheme::PerTensor, Scheme::TokenBlock32, Scheme::Bf16})
    for (flamia_recipe r : kRecipes) {
      SCOPED_TRACE(std::string(scheme_name(s)) + " " + recipe_name(r));
      const EmulationConfig cfg = config(s, r);
      const Pack a = random_pack({40, 90}, 2, 1, 64, true, 31);
      Pack b = a;
      scale_rows(b.v, 0, b.p.total_tokens, 1, 64, 8.0f);
      const Outputs ra = run_emulation(a, cfg, true), rb = run_emulation(b, cfg, true);
      expect_scaled(ra.o, rb.o, 8.0f, "O");
      expect_scaled(ra.dq, rb.dq, 8.0f, "dQ");
      expect_scaled(ra.dk, rb.dk, 8.0f, "dK");
      EXPECT_EQ(ra.dv, rb.dv);
      for (size_t e = 0; e < ra.lse.size(); ++e) ASSERT_TRUE(same_bits(ra.lse[e], rb.lse[e]));
    }
}

TEST(EmulationSpec, Bf16SchemeIsCloseToExact) {
  const Pack pk = random_pack({100, 37, 200}, 4, 2, 64, true, 41);
  const Errors e = errors(run_emulation(pk, config(Scheme::Bf16, FLAMIA_RECIPE_FP8), true), run_exact(pk, true));
  EXPECT_LT(e.o, 0.005);
  EXPECT_LT(e.lse, 1e-5);
  EXPECT_LT(e.dq, 0.006);
  EXPECT_LT(e.dk, 0.006);
  EXPECT_LT(e.dv, 0.006);
}

// ALGORITHM.md §2 step 3: alpha = exp2(mc_prev - mc) is exactly 1 when a tile leaves a row's
// maximum where it was, so a key tile whose every p is 0 (scores far below the maximum)
// leaves the row's O and LSE bit for bit as they were: each row of a one-tile document equals
// the same row with a second key tile of such keys appended (non-causal, so the first rows
// see it). With alpha = exp2(fmaf(m, c, -mc)) — 1 up to m c's rounding error — they differ.
TEST(EmulationSpec, AKeyTileThatAddsNothingChangesNothing) {
  for (int D : {64, 128}) {
    SCOPED_TRACE(D);
    const int BN = tiles::kFwdBlockN, H = 2;
    Pack one = random_pack({BN}, H, H, D, false, 61);
    for (uint16_t& x : one.q) x = to_bf16(0.5f + std::fabs(from_bf16(x)) / 4);  // positive queries
    Pack two = random_pack({2 * BN}, H, H, D, false, 62);
    const size_t half = one.q.size();  // the first BN tokens: the one-tile document's
    for (size_t e = 0; e < 2 * half; ++e) {
      two.q[e] = one.q[e % half];
      // The appended keys are -64 in every entry: their scores sit hundreds of exp2 octaves
      // below any row's maximum, so every p of theirs is 0.
      two.k[e] = e < half ? one.k[e] : to_bf16(-64.0f);
      if (e < half) two.v[e] = one.v[e];
    }
    const EmulationConfig cfg = config(Scheme::PerToken, FLAMIA_RECIPE_FP8);
    const Outputs a = run_emulation(one, cfg, false), b = run_emulation(two, cfg, false);
    for (int64_t t = 0; t < BN; ++t)
      for (int h = 0; h < H; ++h) {
        ASSERT_TRUE(same_bits(a.lse[size_t(h) * BN + t], b.lse[size_t(h) * 2 * BN + t])) << "LSE row " << t;
        for (int d = 0; d < D; ++d)
          ASSERT_EQ(a.o[(size_t(t) * H + h) * D + d], b.o[(size_t(t) * H + h) * D + d]) << "O row " << t;
      }
  }
}

TEST(EmulationSpec, EmptyDocumentsAreAllowed) {
  const Pack with = random_pack({0, 20, 0, 0, 30, 0}, 2, 2, 64, true, 51);
  Pack without = with;
  without.p.cu_seqlens = {0, 20, 50};
  const EmulationConfig cfg = config(Scheme::PerToken, FLAMIA_RECIPE_FP8);
  const Outputs a = run_emulation(with, cfg, true), b = run_emulation(without, cfg, true);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

// A document that fits in one key tile does not depend on the tile width (forward and
// backward tiles of 64 against 128).
TEST(EmulationSpec, SingleTileDocumentsIgnoreTileWidth) {
  const Pack pk = random_pack({64, 17, 1}, 2, 1, 64, true, 52);
  EmulationConfig a = config(Scheme::PerToken, FLAMIA_RECIPE_FP8), b = a;
  a.tiling = {64, 64, 64};
  b.tiling = {128, 128, 128};
  const Outputs ra = run_emulation(pk, a, true), rb = run_emulation(pk, b, true);
  EXPECT_EQ(ra.o, rb.o);
  for (size_t e = 0; e < ra.lse.size(); ++e) ASSERT_TRUE(same_bits(ra.lse[e], rb.lse[e]));
  EXPECT_EQ(ra.dq, rb.dq);
  EXPECT_EQ(ra.dk, rb.dk);
  EXPECT_EQ(ra.dv, rb.dv);
}

// ---------------------------------------------------------------------------------------
// NaN / Inf: poison the rows that see the bad value, and nothing else.
// ---------------------------------------------------------------------------------------
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInfinity = std::numeric_limits<float>::infinity();

struct NanCase {
  Pack pk;
  Outputs clean;
};

NanCase nan_case(bool causal, const EmulationConfig& cfg) {
  NanCase c{random_pack({30, 50, 20}, 4, 2, 64, causal, 61), {}};
  c.clean = run_emulation(c.pk, cfg, true);
  return c;
}

// Checks O/LSE rows of document 1 (tokens 30..79): `poisoned(i, h)` rows all NaN, the
// others bit-identical to the clean run; other documents bit-identical. A bad value in V
// leaves LSE (a function of q and k only) untouched.
template <class Pred>
void expect_forward_poison(const NanCase& c, const Outputs& r, Pred poisoned, bool lse_poisoned = true) {
  const Problem& p = c.pk.p;
  const int D = p.head_dim;
  EXPECT_TRUE(same_rows(r.o, c.clean.o, 0, 30, p.hq, D));
  EXPECT_TRUE(same_rows(r.o, c.clean.o, 80, 100, p.hq, D));
  EXPECT_TRUE(same_lse(r.lse, c.clean.lse, 100, p.hq, 0, 30));
  EXPECT_TRUE(same_lse(r.lse, c.clean.lse, 100, p.hq, 80, 100));
  int bad = 0;
  for (int i = 0; i < 50; ++i)
    for (int h = 0; h < p.hq; ++h) {
      const int64_t t = 30 + i;
      const float lse = r.lse[size_t(h) * 100 + t];
      if (poisoned(i, h)) {
        ++bad;
        EXPECT_TRUE(row_all_nan(r.o, t, h, p.hq, D)) << "row " << i << " head " << h;
        if (lse_poisoned)
          EXPECT_TRUE(std::isnan(lse)) << "lse row " << i << " head " << h;
        else
          EXPECT_TRUE(same_bits(lse, c.clean.lse[size_t(h) * 100 + t]));
      } else {
        EXPECT_TRUE(std::equal(r.o.begin() + (t * p.hq + h) * D, r.o.begin() + (t * p.hq + h + 1) * D,
                               c.clean.o.begin() + (t * p.hq + h) * D))
            << "row " << i << " head " << h;
        EXPECT_TRUE(same_bits(lse, c.clean.lse[size_t(h) * 100 + t]));
      }
    }
  EXPECT_GT(bad, 0);
}

TEST(EmulationNonFinite, NanInQueryPoisonsOnlyThatRow) {
  for (flamia_recipe rc : kRecipes) {
    const EmulationConfig cfg = config(Scheme::PerToken, rc);
    const NanCase c = nan_case(true, cfg);
    Pack bad = c.pk;
    row_ptr(bad.q, 30 + 7, 3, 4, 64)[5] = to_bf16(kNaN);  // doc 1, position 7, head 3
    const Outputs r = run_emulation(bad, cfg, false);
    expect_forward_poison(c, r, [](int i, int h) { return i == 7 && h == 3; });
  }
}

TEST(EmulationNonFinite, NanOrInfInKeyOrValuePoisonsRowsThatSeeIt) {
  for (bool causal : {true, false})
    for (int which = 0; which < 2; ++which)
      for (float bad_value : {kNaN, kInfinity}) {
        SCOPED_TRACE(std::string(causal ? "causal " : "non-causal ") + (which ? "v " : "k ") +
                     (std::isnan(bad_value) ? "NaN" : "Inf"));
        const EmulationConfig cfg = config(Scheme::PerToken, FLAMIA_RECIPE_FP8);
        const NanCase c = nan_case(causal, cfg);
        Pack bad = c.pk;
        Bits& x = which ? bad.v : bad.k;
        row_ptr(x, 30 + 12, 1, 2, 64)[0] = to_bf16(bad_value);  // doc 1, position 12, kv head 1
        const Outputs r = run_emulation(bad, cfg, false);
        // Query heads 2 and 3 read kv head 1; rows that see position 12 are poisoned.
        expect_forward_poison(c, r, [&](int i, int h) { return h >= 2 && (!causal || i >= 12); }, which == 0);
      }
}

TEST(EmulationNonFinite, NanInUpstreamGradientStaysInItsDocument) {
  const EmulationConfig cfg = config(Scheme::PerToken, FLAMIA_RECIPE_FP8);
  const NanCase c = nan_case(true, cfg);
  Pack bad = c.pk;
  row_ptr(bad.dout, 30 + 20, 0, 4, 64)[9] = to_bf16(kNaN);  // doc 1, position 20, head 0
  Bits o = c.clean.o, dq(o.size()), dk(c.clean.dk.size()), dv(c.clean.dv.size());
  emulate_backward(bad.p, cfg, bad.q.data(), bad.k.data(), bad.v.data(), bad.dout.data(), o.data(),
                   c.clean.lse.data(), dq.data(), dk.data(), dv.data());
  for (auto range : {std::pair<int, int>{0, 30}, std::pair<int, int>{80, 100}}) {
    EXPECT_TRUE(same_rows(dq, c.clean.dq, range.first, range.second, 4, 64));
    EXPECT_TRUE(same_rows(dk, c.clean.dk, range.first, range.second, 2, 64));
    EXPECT_TRUE(same_rows(dv, c.clean.dv, range.first, range.second, 2, 64));
  }
  EXPECT_TRUE(row_all_nan(dq, 50, 0, 4, 64));
  for (int j = 0; j <= 20; ++j) {  // keys seen by query 20 (kv head 0)
    EXPECT_TRUE(row_all_nan(dk, 30 + j, 0, 2, 64)) << j;
    EXPECT_TRUE(row_all_nan(dv, 30 + j, 0, 2, 64)) << j;
  }
  EXPECT_TRUE(same_rows(dq, c.clean.dq, 30, 50, 4, 64));  // earlier queries do not see it
  EXPECT_TRUE(same_rows(dk, c.clean.dk, 51, 80, 2, 64));  // later keys are not seen by it
  EXPECT_TRUE(same_rows(dv, c.clean.dv, 51, 80, 2, 64));
}

}  // namespace
}  // namespace testing
}  // namespace ref
}  // namespace flamia
