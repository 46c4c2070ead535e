// The forward options of docs/ALGORITHM.md §7 (EmulationConfig::fwd):
//  - invalid combinations are rejected with the field named;
//  - every option keeps causal safety and document isolation bitwise (masked keys enter
//    neither P's scale nor the carried accumulator);
//  - P's scale from the keys' V scales never saturates E4M3, even where p exceeds 1 through
//    the rounding of m * c (single-key rows at logits ~1e8 equal the default bit for bit);
//  - option A with FP32 adds is the default fold up to the order of FP32 additions;
//  - accuracy against float64 stays at the default's (bounds from docs/NUMERICS.md §7);
//  - a NaN in V reaches exactly the rows that see it, as in the default;
//  - tile-local P (fwd.p_ref): a row's keys computed in chunks and merged give the one-pass
//    result up to FP32 order, where the running-maximum P differs at FP8 size;
//  - option C (fwd.pv_operand = Bf16, P·V on BF16 P and V): causally safe and isolated
//    bitwise, O closer to float64 than the default, its chained BF16 steps FP32-accurate, a
//    NaN in V reaching exactly the (row, column) pairs that see it.
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace flamia {
namespace ref {
namespace testing {
namespace {

EmulationConfig options(PvFold fold, PScale p_scale, int headroom = 0) {
  EmulationConfig cfg;
  cfg.fwd.fold = fold;
  cfg.fwd.p_scale = p_scale;
  cfg.fwd.p_headroom_log2 = headroom;
  return cfg;
}

struct Named {
  const char* name;
  EmulationConfig cfg;
};

// The options as docs/NUMERICS.md §7 measures them.
std::vector<Named> option_variants() {
  EmulationConfig tile_local = options(PvFold::Fresh, PScale::TileMax);
  tile_local.fwd.p_ref = PRef::Tile;
  EmulationConfig tile_local_keys = options(PvFold::Fresh, PScale::TileKeys);
  tile_local_keys.fwd.p_ref = PRef::Tile;
  return {{"tile-local P", tile_local},
          {"tile-local P, tile keys", tile_local_keys},
          {"tile max (reference kernels)", options(PvFold::Fresh, PScale::TileMax)},
          {"A running max", options(PvFold::Chained, PScale::RunningMax)},
          {"A+B running keys", options(PvFold::Chained, PScale::RunningKeys)},
          {"A+B headroom 2", options(PvFold::Chained, PScale::RunningKeys, 2)}};
}

// Option C, chained (the form a kernel would take: no fresh accumulator) and fresh.
std::vector<Named> bf16_pv_variants() {
  EmulationConfig chained = options(PvFold::Chained, PScale::TileKeys), fresh = options(PvFold::Fresh, PScale::TileKeys);
  chained.fwd.pv_operand = fresh.fwd.pv_operand = PvOperand::Bf16;
  return {{"C chained", chained}, {"C fresh", fresh}};
}

template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<double> ref(b.size());
  for (size_t e = 0; e < b.size(); ++e) ref[e] = value_of(b[e]);
  return rel_l2(a, ref);
}

TEST(ForwardOptions, InvalidCombinationsNameTheField) {
  const Pack pk = random_pack({5}, 1, 1, 64, true, 1);
  for (PScale tile_local : {PScale::TileMax, PScale::TileKeys}) {
    const EmulationConfig cfg = options(PvFold::Chained, tile_local);
    try {
      run_emulation(pk, cfg, false);
      FAIL() << "a chained fold with a tile-local P scale was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fwd.p_scale"), std::string::npos) << e.what();
    }
  }
  for (EmulationConfig cfg : {options(PvFold::Fresh, PScale::RunningKeys), options(PvFold::Chained, PScale::RunningMax)}) {
    cfg.fwd.p_ref = PRef::Tile;
    try {
      run_emulation(pk, cfg, false);
      FAIL() << "tile-local P with another P scale or fold was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fwd.p_ref"), std::string::npos) << e.what();
    }
  }
  for (Scheme scheme : {Scheme::PerTensor, Scheme::Bf16}) {
    EmulationConfig cfg = bf16_pv_variants()[0].cfg;
    cfg.scheme = scheme;
    try {
      run_emulation(pk, cfg, false);
      FAIL() << "BF16 P·V with scheme " << scheme_name(scheme) << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fwd.pv_operand"), std::string::npos) << e.what();
    }
  }
  for (int k : {-1, 9}) {
    const EmulationConfig cfg = options(PvFold::Fresh, PScale::TileKeys, k);
    try {
      run_emulation(pk, cfg, false);
      FAIL() << "headroom " << k << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("p_headroom_log2"), std::string::npos) << e.what();
    }
  }
  // The E4M3 dQ operands are fp8_mixed's: fp8's dS is E4M3 already, the bf16 scheme has no FP8.
  for (auto [scheme, recipe] : {std::pair{Scheme::PerToken, FLAMIA_RECIPE_FP8},
                                std::pair{Scheme::Bf16, FLAMIA_RECIPE_FP8_MIXED}}) {
    EmulationConfig cfg = config(scheme, recipe);
    cfg.dq_operand = DqOperand::E4m3;
    try {
      run_emulation(pk, cfg, true);
      FAIL() << "an E4M3 dq_operand with " << scheme_name(scheme) << " " << recipe_name(recipe) << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("dq_operand"), std::string::npos) << e.what();
    }
  }
}

// Key tiles of 32 (one wgmma step each) so that rows cross many tiles and the causal
// probes sit inside tiles, where later keys of the same tile are masked.
TEST(ForwardOptions, CausalSafeAndIsolatedBitwise) {
  const Pack causal = random_pack({1, 63, 150, 40}, 2, 1, 64, true, 11);
  const Pack full = random_pack({40, 97, 33}, 2, 1, 64, false, 12);
  std::vector<Named> variants = option_variants();
  for (const Named& v : bf16_pv_variants()) variants.push_back(v);
  for (Named v : variants) {
    if (v.cfg.fwd.p_headroom_log2 != 0) continue;  // headroom changes no dependency
    v.cfg.tiling.fwd_block_n = 32;
    SCOPED_TRACE(v.name);
    const Outputs cb = run_emulation(causal, v.cfg, true);
    const Outputs fb = run_emulation(full, v.cfg, true);
    uint64_t seed = 100;
    for (Perturbation kind : {Perturbation::Random, Perturbation::Huge, Perturbation::Rescale}) {
      for (int t : {40, 148}) {
        const CheckResult r = check_causal(causal, v.cfg, cb, 2, t, kind, ++seed);
        EXPECT_TRUE(r.forward_identical) << perturbation_name(kind) << " after t=" << t;
        EXPECT_TRUE(r.backward_identical) << perturbation_name(kind) << " after t=" << t;
      }
      EXPECT_TRUE(check_isolation(kind == Perturbation::Random ? causal : full, v.cfg,
                                  kind == Perturbation::Random ? cb : fb, 1, kind, ++seed).identical())
          << perturbation_name(kind);
    }
  }
}

// One-token documents with q = k = (x, 0, ..., 0), x with 4 significant bits, so that
// S = x^2 exactly (in FP8 and in the wgmma model) and p = pm = exp2(fmaf(S, c, -fl(S c))),
// which at S c ~ 2^21..2^28 ranges up to 2^16. A row with one key has the same P scale
// under TileMax and TileKeys exactly when the key rule includes pm; without it, rows with
// pm > 1.75 would saturate P8 at 448.
TEST(ForwardOptions, KeyScaleNeverSaturatesAtHugeLogits) {
  const int D = 64;
  std::vector<float> xs;
  for (int e = 10; e <= 11; ++e)
    for (int m = 8; m <= 15; ++m) xs.push_back(std::ldexp(float(m), e));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> scale_dist(0.02f, 0.2f);
  int saturating = 0, rows = 0;
  for (int trial = 0; trial < 16; ++trial) {
    Pack pk = random_pack(std::vector<int>(xs.size(), 1), 1, 1, D, true, rng());
    pk.p.softmax_scale = scale_dist(rng);
    const float c = pk.p.softmax_scale * 1.4426950408889634f;
    for (size_t t = 0; t < xs.size(); ++t) {
      for (int d = 0; d < D; ++d) pk.q[t * D + d] = pk.k[t * D + d] = to_bf16(d == 0 ? xs[t] : 0.0f);
      const float S = xs[t] * xs[t];
      const float pm = std::exp2(std::fmaf(S, c, -(S * c)));
      saturating += pm > 1.75f;
      ++rows;
    }
    const Outputs base = run_emulation(pk, options(PvFold::Fresh, PScale::TileMax), false);
    for (PScale rule : {PScale::TileKeys, PScale::RunningKeys}) {
      const Outputs r = run_emulation(pk, options(PvFold::Fresh, rule), false);
      EXPECT_EQ(r.o, base.o) << "softmax_scale " << pk.p.softmax_scale;
    }
    EXPECT_TRUE(all_finite(base.o));
  }
  std::printf("rows %d, with p > 1.75: %d\n", rows, saturating);
  EXPECT_GE(saturating, rows / 10) << "the inputs do not reach p > 1.75; the test has no power";
}

// With FP32 adds (arith.pv = Fp32) the chained fold is the fresh fold with the FP32
// additions reassociated: rows that see one key tile are bit-identical, the rest agree to
// FP32 noise (bound 1e-5 relative L2 on the whole O).
TEST(ForwardOptions, ChainedWithFp32AddsIsTheFreshFold) {
  const Pack pk = random_pack({1, 31, 32, 33, 200, 90}, 2, 1, 64, true, 21);
  for (PScale rule : {PScale::RunningMax, PScale::RunningKeys})
    for (Scheme scheme : {Scheme::PerToken, Scheme::Bf16}) {
      EmulationConfig fresh = options(PvFold::Fresh, rule), chained = options(PvFold::Chained, rule);
      for (EmulationConfig* cfg : {&fresh, &chained}) {
        cfg->scheme = scheme;
        cfg->tiling.fwd_block_n = 32;
        cfg->arith.pv = Accumulation::Fp32;
      }
      SCOPED_TRACE(std::string(scheme_name(scheme)) + (rule == PScale::RunningMax ? " running max" : " running keys"));
      const Outputs a = run_emulation(pk, fresh, false), b = run_emulation(pk, chained, false);
      EXPECT_EQ(a.lse, b.lse);  // the fold does not touch m, l
      int differing_rows = 0;
      for (int doc = 0; doc < pk.p.num_docs(); ++doc)
        for (int64_t t = pk.doc_begin(doc); t < pk.doc_end(doc); ++t) {
          const bool one_tile = t - pk.doc_begin(doc) < 32;
          const bool same = same_rows(a.o, b.o, t, t + 1, pk.p.hq, pk.p.head_dim);
          if (one_tile) EXPECT_TRUE(same) << "row " << t << " sees one tile";
          differing_rows += !same;
        }
      EXPECT_LT(rel_diff(b.o, a.o), 2e-5);  // 1.4e-5 for bf16 with the lazy reference (p up to 8)
      std::printf("%s: %d rows differ, O rel diff %.2e\n", scheme_name(scheme), differing_rows, rel_diff(b.o, a.o));
    }
}

// Against float64 on a pack with rows of up to 10 key tiles (BN = 32): each option stays
// next to the default and inside the §3 bounds. Measured (seed 31): O differs from the
// default's by 0 (B) and 4.8e-4 (A, A+B) relative L2, the errors against float64 by
// < 2e-5; bounds 2e-3 (about 4x) and 1e-3 (NUMERICS.md §7 shows 16k-token rows within it).
TEST(ForwardOptions, AccuracyNextToTheDefault) {
  const Pack pk = random_pack({320, 100, 37}, 2, 1, 64, true, 31);
  const ExactOutputs ex = run_exact(pk, true);
  EmulationConfig def;
  def.tiling.fwd_block_n = 32;
  const Outputs base = run_emulation(pk, def, true);
  const Errors e0 = errors(base, ex);
  for (Named v : option_variants()) {
    if (v.cfg.fwd.p_headroom_log2 != 0) continue;
    v.cfg.tiling.fwd_block_n = 32;
    SCOPED_TRACE(v.name);
    const Outputs r = run_emulation(pk, v.cfg, true);
    const Errors e = errors(r, ex);
    std::printf("%-18s O %.5f (default %.5f) diff %.2e  dQ %.5f dK %.5f dV %.5f\n", v.name, e.o, e0.o,
                rel_diff(r.o, base.o), e.dq, e.dk, e.dv);
    // Tile-local P rounds P against another maximum, so its O differs from the default's at
    // FP8 size (9.6e-3 here) while its error against float64 stays the default's.
    EXPECT_LT(rel_diff(r.o, base.o), v.cfg.fwd.p_ref == PRef::Tile ? 2e-2 : 2e-3);
    EXPECT_LT(std::fabs(e.o - e0.o), 1e-3);
    EXPECT_LT(std::fabs(e.dq - e0.dq), 1e-3);
    EXPECT_LT(std::fabs(e.dk - e0.dk), 1e-3);
    EXPECT_LT(std::fabs(e.dv - e0.dv), 1e-3);
    EXPECT_LT(e.o, 0.066);
    EXPECT_LT(e.dq, 0.090);
    EXPECT_LT(e.dk, 0.089);
    EXPECT_LT(e.dv, 0.072);
  }
}

// V scales that differ by 2^120 along a document (loud first tokens, quiet later ones and
// back): the chained fold with a running scale carries its accumulator without overflow.
TEST(ForwardOptions, ChainedFoldSurvivesWideVScales) {
  Pack pk = random_pack({300}, 1, 1, 64, true, 41);
  scale_rows(pk.v, 0, 40, 1, 64, std::ldexp(1.0f, 60));
  scale_rows(pk.v, 40, 200, 1, 64, std::ldexp(1.0f, -60));
  const ExactOutputs ex = run_exact(pk, false);
  for (PScale rule : {PScale::RunningMax, PScale::RunningKeys}) {
    EmulationConfig cfg = options(PvFold::Chained, rule);
    cfg.tiling.fwd_block_n = 32;
    const Outputs r = run_emulation(pk, cfg, false);
    EXPECT_TRUE(all_finite(r.o));
    EXPECT_LT(rel_l2(r.o, ex.o), 0.066);
  }
}

// A NaN in V of token j reaches every row that sees j (through V's scale, which the key
// rules take a maximum of, and the carried accumulator) and no other row; LSE never.
TEST(ForwardOptions, NanInVReachesExactlyTheRowsThatSeeIt) {
  const Pack pk = random_pack({150}, 1, 1, 64, true, 51);
  const int j = 70;
  Pack bad = pk;
  bad.v[size_t(j) * 64 + 5] = to_bf16(std::nanf(""));
  for (Named v : option_variants()) {
    v.cfg.tiling.fwd_block_n = 32;
    SCOPED_TRACE(v.name);
    const Outputs a = run_emulation(pk, v.cfg, false), b = run_emulation(bad, v.cfg, false);
    EXPECT_TRUE(same_rows(a.o, b.o, 0, j, 1, 64));
    for (int t = j; t < 150; ++t) EXPECT_TRUE(row_all_nan(b.o, t, 0, 1, 64)) << "row " << t;
    EXPECT_EQ(a.lse, b.lse);
  }
}

// Option C: P unquantized to BF16 and V's BF16 values take FP8's rounding of P and V out of O
// (NUMERICS.md §7: 0.044 -> 0.030 on N(0,1) packs); its chained BF16 steps keep 23 fraction
// bits, so chaining equals the fresh fold to FP32 noise. The gradients do not gain: the
// backward's dP still takes V's FP8 codes, which now differ from the V that made O (and so D).
TEST(ForwardOptions, Bf16PvMakesOMoreAccurate) {
  const Pack pk = random_pack({320, 100, 37}, 2, 1, 64, true, 31);
  const ExactOutputs ex = run_exact(pk, true);
  EmulationConfig def;
  def.tiling.fwd_block_n = 32;
  const Errors e0 = errors(run_emulation(pk, def, true), ex);
  std::vector<Outputs> outs;
  for (Named v : bf16_pv_variants()) {
    v.cfg.tiling.fwd_block_n = 32;
    SCOPED_TRACE(v.name);
    outs.push_back(run_emulation(pk, v.cfg, true));
    const Errors e = errors(outs.back(), ex);
    std::printf("%-10s O %.5f (default %.5f)  dQ %.5f (%.5f) dK %.5f (%.5f) dV %.5f (%.5f)\n", v.name, e.o, e0.o, e.dq,
                e0.dq, e.dk, e0.dk, e.dv, e0.dv);
    EXPECT_LT(e.o, 0.8 * e0.o);
    EXPECT_LT(e.lse, 1.01 * e0.lse + 1e-6);
    EXPECT_LT(e.dq, 1.15 * e0.dq);
    EXPECT_LT(e.dk, 1.15 * e0.dk);
    EXPECT_LT(std::fabs(e.dv - e0.dv), 1e-3);  // dV takes P and dO only
  }
  EXPECT_LT(rel_diff(outs[0].o, outs[1].o), 2e-3) << "chained BF16 steps against the fresh fold";
  // With the backward's dP on BF16 dO and V as well, D and dP see the same V again.
  EmulationConfig both = bf16_pv_variants()[0].cfg;
  both.tiling.fwd_block_n = 32;
  both.dp_bf16 = true;
  const Errors e = errors(run_emulation(pk, both, true), ex);
  std::printf("C + dP BF16 O %.5f  dQ %.5f dK %.5f dV %.5f\n", e.o, e.dq, e.dk, e.dv);
  EXPECT_LT(e.dq, 0.9 * e0.dq);
  EXPECT_LT(e.dk, 0.9 * e0.dk);
}

// Option C has no V scale: a NaN in element d of V's row j reaches column d of exactly the
// rows that see j, as float arithmetic does; other columns and earlier rows stay finite.
TEST(ForwardOptions, Bf16PvNanInVReachesExactlyThePairsThatSeeIt) {
  const Pack pk = random_pack({150}, 1, 1, 64, true, 51);
  const int j = 70, d = 5;
  Pack bad = pk;
  bad.v[size_t(j) * 64 + d] = to_bf16(std::nanf(""));
  for (Named v : bf16_pv_variants()) {
    v.cfg.tiling.fwd_block_n = 32;
    SCOPED_TRACE(v.name);
    const Outputs a = run_emulation(pk, v.cfg, false), b = run_emulation(bad, v.cfg, false);
    EXPECT_TRUE(same_rows(a.o, b.o, 0, j, 1, 64));
    for (int t = j; t < 150; ++t)
      for (int e = 0; e < 64; ++e)
        EXPECT_EQ(fmt::is_nan_f32(from_bf16(b.o[size_t(t) * 64 + e])), e == d) << "row " << t << " column " << e;
    EXPECT_EQ(a.lse, b.lse);
  }
}

Outputs run_chunked(const Pack& pk, const EmulationConfig& cfg, int chunk) {
  const Problem& p = pk.p;
  Outputs r;
  r.o.assign(size_t(p.total_tokens) * p.hq * p.head_dim, 0);
  r.lse.assign(size_t(p.total_tokens) * p.hq, 0.0f);
  emulate_forward_chunked(p, cfg, pk.q.data(), pk.k.data(), pk.v.data(), chunk, r.o.data(), r.lse.data());
  return r;
}

// The backward with dK/dV reduced per query chunk (what a context-parallel ring's
// reduce-scatter computes, docs/CONTEXT_PARALLEL.md "Backward"): dQ is the one-pass dQ bit for
// bit, one chunk per document is the one-pass backward bit for bit, and smaller chunks move
// dK/dV only by the reassociation of FP32 adds: at most one BF16 ulp, on few elements.
TEST(ForwardOptions, ChunkedBackwardIsTheOnePassBackwardUpToFp32Order) {
  const Pack pk = random_pack({1, 64, 65, 300, 190}, 4, 2, 64, true, 63);
  const EmulationConfig cfg = config(Scheme::PerToken, FLAMIA_RECIPE_FP8);
  const Outputs one = run_emulation(pk, cfg, true);
  const Problem& p = pk.p;
  auto chunked = [&](int chunk) {
    Outputs r = one;
    emulate_backward_chunked(p, cfg, pk.q.data(), pk.k.data(), pk.v.data(), pk.dout.data(), one.o.data(),
                             one.lse.data(), chunk, r.dq.data(), r.dk.data(), r.dv.data());
    return r;
  };
  const int BM = cfg.tiling.bwd_block_m;
  const Outputs whole = chunked(320 / BM * BM + BM);  // longer than every document
  EXPECT_EQ(whole.dq, one.dq);
  EXPECT_EQ(whole.dk, one.dk);
  EXPECT_EQ(whole.dv, one.dv);
  // The FP32 sums differ in their last bits; after the BF16 rounding of dK and dV that is at
  // most one BF16 ulp, and rarely even that.
  auto within_one_ulp = [](const Bits& a, const Bits& b, const char* what) {
    int flips = 0;
    for (size_t e = 0; e < a.size(); ++e) {
      if (a[e] == b[e]) continue;
      ++flips;
      const float x = from_bf16(a[e]), y = from_bf16(b[e]);
      EXPECT_LE(std::fabs(x - y), std::ldexp(std::fmax(std::fabs(x), std::fabs(y)), -7)) << what << " element " << e;
    }
    EXPECT_LE(flips, int(a.size() / 1000)) << what;
    return flips;
  };
  for (int chunk : {BM, 2 * BM}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Outputs parts = chunked(chunk);
    EXPECT_EQ(parts.dq, one.dq);
    const int dk = within_one_ulp(parts.dk, one.dk, "dK"), dv = within_one_ulp(parts.dv, one.dv, "dV");
    std::printf("chunk %d: %d of %zu dK and %d dV elements one BF16 ulp off the one-pass backward\n", chunk, dk,
                one.dk.size(), dv);
  }
  EXPECT_THROW(emulate_backward_chunked(p, cfg, pk.q.data(), pk.k.data(), pk.v.data(), pk.dout.data(),
                                        one.o.data(), one.lse.data(), BM + 1, nullptr, nullptr, nullptr),
               std::invalid_argument);
}

// A row's keys in chunks computed apart and merged last chunk first (what a context-parallel
// ring computes, docs/CONTEXT_PARALLEL.md): with tile-local P every tile's FP8 codes are the
// one-pass codes, so O and LSE differ only by FP32 order — rows inside one chunk bit for
// bit, the rest within an ulp of BF16 and 1e-4 relative on the whole O; with the running
// maximum's P the codes change wherever an earlier chunk holds the row's maximum, and O
// differs at FP8 size.
TEST(ForwardOptions, TileLocalPChunksMergeToTheOnePassResult) {
  const Pack pk = random_pack({1, 64, 65, 300, 190}, 2, 1, 64, true, 61);
  for (int chunk : {64, 96})
    for (PScale rule : {PScale::TileMax, PScale::TileKeys}) {
      EmulationConfig tile_local = options(PvFold::Fresh, rule), running;
      tile_local.fwd.p_ref = PRef::Tile;
      for (EmulationConfig* cfg : {&tile_local, &running}) cfg->tiling.fwd_block_n = 32;
      SCOPED_TRACE("chunk " + std::to_string(chunk) + (rule == PScale::TileKeys ? ", tile keys" : ", tile max"));
      const Outputs one = run_emulation(pk, tile_local, false), parts = run_chunked(pk, tile_local, chunk);
      int differing = 0;
      for (int doc = 0; doc < pk.p.num_docs(); ++doc)
        for (int64_t t = pk.doc_begin(doc); t < pk.doc_end(doc); ++t) {
          const bool same = same_rows(one.o, parts.o, t, t + 1, pk.p.hq, pk.p.head_dim);
          if (t - pk.doc_begin(doc) < chunk) EXPECT_TRUE(same) << "row " << t << " sees one chunk";
          differing += !same;
        }
      for (size_t e = 0; e < one.o.size(); ++e) {
        const float a = from_bf16(one.o[e]), b = from_bf16(parts.o[e]);
        // One BF16 ulp, or FP32 noise of an O of order 1 where O cancels to near 0.
        ASSERT_LE(std::fabs(a - b), std::ldexp(std::fmax(std::fabs(a), std::fabs(b)), -7) + 1e-6f) << "element " << e;
      }
      for (size_t e = 0; e < one.lse.size(); ++e)
        ASSERT_LE(std::fabs(one.lse[e] - parts.lse[e]), 1e-5f * std::fmax(1.0f, std::fabs(one.lse[e]))) << e;
      const double tile_diff = rel_diff(parts.o, one.o);
      EXPECT_LT(tile_diff, 1e-4);  // a few BF16 ulp flips (1.4e-5 measured); the running P: 5e-3
      const Outputs run_one = run_emulation(pk, running, false), run_parts = run_chunked(pk, running, chunk);
      const double running_diff = rel_diff(run_parts.o, run_one.o);
      EXPECT_GT(running_diff, 1e-3) << "the running-maximum P did not change: the test has no power";
      std::printf("chunk %d: tile-local P %d rows differ, O rel diff %.2e; running-max P O rel diff %.2e\n", chunk,
                  differing, tile_diff, running_diff);
    }
}

TEST(ForwardOptions, ChunkedNeedsWholeTilesAndTheFreshFold) {
  const Pack pk = random_pack({40}, 1, 1, 64, true, 2);
  EmulationConfig cfg;
  cfg.tiling.fwd_block_n = 32;
  EXPECT_THROW(run_chunked(pk, cfg, 48), std::invalid_argument);
  EXPECT_THROW(run_chunked(pk, cfg, 0), std::invalid_argument);
  EmulationConfig chained = options(PvFold::Chained, PScale::RunningMax);
  chained.tiling.fwd_block_n = 32;
  EXPECT_THROW(run_chunked(pk, chained, 64), std::invalid_argument);
}

}  // namespace
}  // namespace testing
}  // namespace ref
}  // namespace flamia
