// flamia_numerics: what the input-scale granularity does to accuracy and to causal /
// document safety, on the CPU specification (the emulation of docs/ALGORITHM.md).
//
// For each scheme (per_token, per_tensor, token_block32, bf16) and recipe (fp8, fp8_mixed)
// it prints relative L2 errors against float64 attention on a packed workload, on normal
// inputs, on outlier inputs, the quiet documents' O error next to one loud document, and
// whether causal safety and document isolation hold bitwise.
//
// Usage: flamia_numerics [--quick] [--seed N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reference/harness.h"
#include "reference/reference.h"

using namespace flamia::ref;
using namespace flamia::ref::harness;

namespace {

struct Options {
  bool quick = false;
  uint64_t seed = 2025;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--quick")) {
      o.quick = true;
    } else if (!std::strcmp(argv[a], "--seed") && a + 1 < argc) {
      o.seed = std::strtoull(argv[++a], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--seed N]\n", argv[0]);
      std::exit(2);
    }
  }
  return o;
}

const char* recipe_name(flamia_recipe r) { return r == FLAMIA_RECIPE_FP8 ? "fp8" : "fp8_mixed"; }

// The longest document (the loud one, and the one probed for causal safety).
int longest_doc(const Pack& pk) {
  int best = 0;
  for (int b = 1; b < pk.p.num_docs(); ++b)
    if (pk.doc_end(b) - pk.doc_begin(b) > pk.doc_end(best) - pk.doc_begin(best)) best = b;
  return best;
}

// A document that shares a 32-token block with a neighbour (so block scales can leak);
// the longest one if none does.
int doc_for_isolation(const Pack& pk) {
  const int64_t T = pk.p.total_tokens;
  for (int b = 0; b < pk.p.num_docs(); ++b) {
    const int64_t d0 = pk.doc_begin(b), d1 = pk.doc_end(b);
    if (d1 - d0 >= 8 && ((d0 > 0 && d0 % 32 != 0) || (d1 < T && d1 % 32 != 0))) return b;
  }
  return longest_doc(pk);
}

struct Row {
  Scheme scheme;
  flamia_recipe recipe;
  Errors normal, outlier;
  double loud4 = 0, loud5 = 0;
  bool causal_safe = true, isolated = true;
};

// Bitwise checks: one perturbation kind at each of three positions of the longest document
// (causal) and on one document that shares a 32-token block with a neighbour (isolation).
void check_safety(const Pack& pk, const EmulationConfig& cfg, const Outputs& base, Row& row) {
  const int doc = longest_doc(pk);
  const int L = int(pk.doc_end(doc) - pk.doc_begin(doc));
  uint64_t seed = 99;
  const int ts[3] = {L / 3, L / 2 - 1, L - 2};
  const Perturbation kinds[3] = {Perturbation::Random, Perturbation::Huge, Perturbation::Rescale};
  for (int n = 0; n < 3; ++n) {
    int t = std::max(ts[n], 0);
    while (t > 0 && (pk.doc_begin(doc) + t) % 32 == 31) --t;  // a successor in the same block
    row.causal_safe = row.causal_safe && check_causal(pk, cfg, base, doc, t, kinds[n], ++seed).identical();
  }
  const int iso = doc_for_isolation(pk);
  for (Perturbation kind : {Perturbation::Random, Perturbation::Huge, Perturbation::Rescale})
    row.isolated = row.isolated && check_isolation(pk, cfg, base, iso, kind, ++seed).identical();
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  const auto start = std::chrono::steady_clock::now();
  const int total = opt.quick ? 512 : 2048;
  const int hq = 4, hkv = 2, dim = opt.quick ? 64 : 128;
  const std::vector<int> lengths = long_tailed_lengths(total, opt.seed, 5.0, 1.0, 8, opt.quick ? 256 : 1024);

  const Pack normal = random_pack(lengths, hq, hkv, dim, true, opt.seed + 1);
  Pack outlier = normal;
  inject_outliers(outlier, 0.01, 100.0f, opt.seed + 2);
  const int loud_doc = longest_doc(normal);
  Pack loud4 = normal, loud5 = normal;
  make_loud(loud4, loud_doc, 1e4f);
  make_loud(loud5, loud_doc, 1e5f);

  std::printf("flamia numerics study: the CPU specification (docs/ALGORITHM.md) against float64 attention\n");
  std::printf("workload: T=%d tokens, %zu documents, Hq=%d Hkv=%d D=%d, causal, seed %llu%s\n", total,
              lengths.size(), hq, hkv, dim, (unsigned long long)opt.seed, opt.quick ? " (--quick)" : "");
  std::printf("document lengths (long-tailed, exp(N(5, 1)) clamped to [8, %d]):", opt.quick ? 256 : 1024);
  for (int L : lengths) std::printf(" %d", L);
  std::printf("\ninputs N(0,1) BF16; outliers: 1%% of tokens with q and k x100; loud: document %d (%d tokens)"
              " with q, k, v x1e4 / x1e5\n",
              loud_doc, int(normal.doc_end(loud_doc) - normal.doc_begin(loud_doc)));
  std::printf("errors: relative L2 vs float64 (O, LSE, dQ, dK, dV); quiet O: O error of the other documents\n\n");
  std::fflush(stdout);

  const ExactOutputs ex_normal = run_exact(normal, true);
  const ExactOutputs ex_outlier = run_exact(outlier, true);
  const ExactOutputs ex_loud4 = run_exact(loud4, false);
  const ExactOutputs ex_loud5 = run_exact(loud5, false);

  std::vector<Row> rows;
  for (Scheme scheme : {Scheme::PerToken, Scheme::PerTensor, Scheme::TokenBlock32, Scheme::Bf16})
    for (flamia_recipe recipe : {FLAMIA_RECIPE_FP8, FLAMIA_RECIPE_FP8_MIXED}) {
      if (scheme == Scheme::Bf16 && recipe == FLAMIA_RECIPE_FP8_MIXED) {
        rows.push_back(rows.back());  // bf16 has no FP8 matmul, so the recipe changes nothing
        rows.back().recipe = recipe;
        continue;
      }
      EmulationConfig cfg;
      cfg.scheme = scheme;
      cfg.recipe = recipe;
      Row row{scheme, recipe, {}, {}};
      const Outputs base = run_emulation(normal, cfg, true);
      row.normal = errors(base, ex_normal);
      row.outlier = errors(run_emulation(outlier, cfg, true), ex_outlier);
      row.loud4 = rel_l2_outside_doc(run_emulation(loud4, cfg, false).o, ex_loud4.o, loud4, hq, loud_doc);
      row.loud5 = rel_l2_outside_doc(run_emulation(loud5, cfg, false).o, ex_loud5.o, loud5, hq, loud_doc);
      check_safety(normal, cfg, base, row);
      rows.push_back(row);
    }

  std::printf("| scheme | recipe | O | LSE | dQ | dK | dV | outl. O | outl. LSE | outl. dQ | outl. dK | outl. dV |"
              " quiet O, 1e4 loud | quiet O, 1e5 loud | causal safe | doc isolated |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %.4f | %.1e | %.4f | %.4f | %.4f | %.4f | %.1e | %.4f | %.4f | %.4f | %.4f | %.4f | %s | %s |\n",
                scheme_name(r.scheme), recipe_name(r.recipe), r.normal.o, r.normal.lse, r.normal.dq, r.normal.dk,
                r.normal.dv, r.outlier.o, r.outlier.lse, r.outlier.dq, r.outlier.dk, r.outlier.dv, r.loud4, r.loud5,
                r.causal_safe ? "yes" : "NO", r.isolated ? "yes" : "NO");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n(bf16 ignores the recipe: no FP8 anywhere; %.1f s)\n", secs);
  return 0;
}
