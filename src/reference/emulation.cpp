// The specification: a CPU emulation of the quantized attention algorithm of
// docs/ALGORITHM.md, rounding point for rounding point.
//
// Loops are written so that every FP32 sum runs in a fixed, documented order (ascending
// d for dot products, ascending token for tile sums), and so that the compiler can still
// vectorize them *across* independent sums (e.g. S_j for many j at once, acc[d] for many
// d at once) without reassociating any single sum. Every product inside a matmul is exact
// in FP32 (E4M3*E4M3 and BF16*BF16 significands fit in 24 bits), so fused or unfused
// multiply-adds give the same bits there. With EmulationConfig::arith = Wgmma, S and the
// forward's P·V are summed as Hopper's wgmma sums them instead (tensor_core.h, ALGORITHM.md §6).
// EmulationConfig::fwd selects the forward options of ALGORITHM.md §7 (P's scale, the fold).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "flamia/formats.h"
#include "reference/reference.h"
#include "reference/tensor_core.h"

namespace flamia {
namespace ref {

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::PerToken: return "per_token";
    case Scheme::PerTensor: return "per_tensor";
    case Scheme::TokenBlock32: return "token_block32";
    case Scheme::Bf16: return "bf16";
  }
  return "unknown";
}

void validate(const EmulationConfig& cfg) {
  const ForwardOptions& o = cfg.fwd;
  if (o.p_headroom_log2 < 0 || o.p_headroom_log2 > 8)
    throw std::invalid_argument("EmulationConfig::fwd.p_headroom_log2: must be in [0, 8], got " +
                                std::to_string(o.p_headroom_log2));
  if (o.rescale_log2 < 0 || o.rescale_log2 > 8)
    throw std::invalid_argument("EmulationConfig::fwd.rescale_log2: must be in [0, 8], got " +
                                std::to_string(o.rescale_log2));
  if (o.p_ref == PRef::Tile &&
      !(o.fold == PvFold::Fresh && (o.p_scale == PScale::TileMax || o.p_scale == PScale::TileKeys)))
    throw std::invalid_argument(
        "EmulationConfig::fwd.p_ref: PRef::Tile needs fold = PvFold::Fresh and a tile-local p_scale "
        "(PScale::TileMax or PScale::TileKeys)");
  if (o.pv_operand == PvOperand::Fp8 && o.fold == PvFold::Chained &&
      !(o.p_scale == PScale::RunningMax || o.p_scale == PScale::RunningKeys))
    throw std::invalid_argument(
        "EmulationConfig::fwd.p_scale: PvFold::Chained needs PScale::RunningMax or PScale::RunningKeys "
        "(a tile-local sigma can shrink without bound between tiles and overflow the carried accumulator)");
  if (cfg.dp_bf16 && cfg.scheme != Scheme::PerToken)
    throw std::invalid_argument("EmulationConfig::dp_bf16: needs scheme = Scheme::PerToken");
  if (cfg.dq_operand != DqOperand::Bf16 && (cfg.recipe != FLAMIA_RECIPE_FP8_MIXED || cfg.scheme == Scheme::Bf16))
    throw std::invalid_argument(
        "EmulationConfig::dq_operand: the E4M3 forms need recipe = FLAMIA_RECIPE_FP8_MIXED and an FP8 scheme "
        "(fp8's dS is E4M3 already)");
  if (o.pv_operand == PvOperand::Bf16 && (cfg.scheme != Scheme::PerToken || o.p_ref == PRef::Tile))
    throw std::invalid_argument(
        "EmulationConfig::fwd.pv_operand: PvOperand::Bf16 needs scheme = Scheme::PerToken and p_ref = PRef::Lazy "
        "or PRef::Running");
}

namespace {

using fmt::kLog2e;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// max that keeps NaN (std::max and fmaxf drop it, which would launder a NaN input into a
// finite scale or softmax maximum). The GPU uses max.NaN.f32 for the same reason.
inline float max_nan(float a, float b) {
  if (fmt::is_nan_f32(a) || fmt::is_nan_f32(b)) return kNan;
  return a > b ? a : b;
}

inline float bf16_value(uint16_t b) { return fmt::bf16_bits_to_f32(b); }

// An input tensor as it enters the matmuls: element values (FP8 codes decoded, or BF16
// values) and one scale per (token, head); value * scale approximates the input.
struct Operand {
  int64_t tokens = 0;
  int heads = 0, dim = 0;
  std::vector<float> val;    // [T, H, D]
  std::vector<float> scale;  // [T, H]
  std::vector<float> bf16;   // [T, H, D] the BF16 input itself (fp8_mixed's dS matmuls)
  const float* row(int64_t t, int h) const { return &val[(size_t(t) * heads + h) * dim]; }
  const float* bf16_row(int64_t t, int h) const { return &bf16[(size_t(t) * heads + h) * dim]; }
  float s(int64_t t, int h) const { return scale[size_t(t) * heads + h]; }
};

// e4m3_to_f32(e4m3_rn_satfinite(y)) for every y that is a BF16 value, tabulated once.
// Inputs are BF16 and scales powers of two, so x / s is (almost always) a BF16 value too;
// the table only makes the emulation faster, it computes the same function.
const std::vector<float>& e4m3_of_bf16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t b = 0; b < 65536; ++b)
      t[b] = fmt::e4m3_to_f32(fmt::e4m3_rn_sat(fmt::bf16_bits_to_f32(uint16_t(b))));
    return t;
  }();
  return table;
}

// The value of q8(x, s) = e4m3_rn_satfinite(x / s), as a float.
inline float fp8_value(float x, float s, const std::vector<float>& table) {
  const float y = x * (1.0f / s);  // exact: s is a power of two (as fmt::quantize_e4m3)
  const uint32_t u = fmt::f32_bits(y);
  if ((u & 0xffffu) == 0) return table[u >> 16];
  return fmt::e4m3_to_f32(fmt::quantize_e4m3(x, s));
}

// Token range [t0, t1) that shares one scale with token t under a scheme.
void scale_group(Scheme scheme, int64_t t, int64_t tokens, int64_t* t0, int64_t* t1) {
  switch (scheme) {
    case Scheme::PerTensor: *t0 = 0; *t1 = tokens; return;
    case Scheme::TokenBlock32: *t0 = t / 32 * 32; *t1 = std::min<int64_t>(*t0 + 32, tokens); return;
    default: *t0 = t; *t1 = t + 1; return;
  }
}

// Quantize x [T, H, D] (BF16 bits) once, as docs/ALGORITHM.md §1 and §5.
Operand quantize_input(const uint16_t* x, int64_t tokens, int heads, int dim, Scheme scheme) {
  Operand op;
  op.tokens = tokens;
  op.heads = heads;
  op.dim = dim;
  const size_t n = size_t(tokens) * heads * dim;
  op.bf16.resize(n);
  for (size_t e = 0; e < n; ++e) op.bf16[e] = bf16_value(x[e]);
  op.scale.assign(size_t(tokens) * heads, 1.0f);
  if (scheme == Scheme::Bf16) {  // no FP8, no scales
    op.val = op.bf16;
    return op;
  }
  // amax per (token, head) first; group maxima are maxima of those.
  std::vector<float> amax(size_t(tokens) * heads, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* r = &op.bf16[(size_t(t) * heads + h) * dim];
      float a = 0.0f;
      for (int d = 0; d < dim; ++d) a = max_nan(a, std::fabs(r[d]));
      amax[size_t(t) * heads + h] = a;
    }
  for (int h = 0; h < heads; ++h) {
    int64_t t = 0;
    while (t < tokens) {
      int64_t t0, t1;
      scale_group(scheme, t, tokens, &t0, &t1);
      float a = 0.0f;
      for (int64_t u = t0; u < t1; ++u) a = max_nan(a, amax[size_t(u) * heads + h]);
      const float s = fmt::pow2_scale(a);
      for (int64_t u = t0; u < t1; ++u) op.scale[size_t(u) * heads + h] = s;
      t = t1;
    }
  }
  op.val.resize(n);
  const std::vector<float>& table = e4m3_of_bf16_table();
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h) {
      const size_t base = (size_t(t) * heads + h) * dim;
      const float s = op.scale[size_t(t) * heads + h];
      for (int d = 0; d < dim; ++d)
        op.val[base + d] = fp8_value(op.bf16[base + d], s, table);
    }
  return op;
}

// A computed operand (P, dS, with a folded input scale) rounded for its matmul:
// FP8 with a tile scale, or BF16 (scheme bf16, and fp8_mixed's dS) with scale 1.
// Rounds x[0..n) in place and returns the scale that multiplies the tile product.
float round_tile_operand(float* x, int n, bool to_fp8) {
  if (!to_fp8) {
    for (int e = 0; e < n; ++e) x[e] = fmt::round_bf16(x[e]);
    return 1.0f;
  }
  float amax = 0.0f;
  for (int e = 0; e < n; ++e) amax = max_nan(amax, std::fabs(x[e]));
  const float s = fmt::pow2_scale(amax);
  for (int e = 0; e < n; ++e) x[e] = fmt::e4m3_to_f32(fmt::quantize_e4m3(x[e], s));
  return s;
}

// Rows [0, n) of one (document, head) of an operand, transposed to [D][n], so that a
// query row's dot products with many keys vectorize across keys while each one still
// sums over d in ascending order.
std::vector<float> transpose_rows(const Operand& op, int64_t base, int n, int h, bool bf16 = false) {
  std::vector<float> tr(size_t(op.dim) * n);
  for (int j = 0; j < n; ++j) {
    const float* r = bf16 ? op.bf16_row(base + j, h) : op.row(base + j, h);
    for (int d = 0; d < op.dim; ++d) tr[size_t(d) * n + j] = r[d];
  }
  return tr;
}

// out[j - j0] = sum_d a[d] * bt[d][j] for j in [j0, j1), each sum in ascending d.
void dot_rows(const float* a, const float* bt, int n, int dim, int j0, int j1, float* out) {
  const int w = j1 - j0;
  for (int j = 0; j < w; ++j) out[j] = 0.0f;
  for (int d = 0; d < dim; ++d) {
    const float ad = a[d];
    const float* b = bt + size_t(d) * n + j0;
    for (int j = 0; j < w; ++j) out[j] += ad * b[j];
  }
}

// Runs body(first, stride) on the machine's threads, worker w taking rows w, w + W, ... of
// [0, n) (interleaved: the cost of a causal row grows or shrinks along the document). Every
// row of the specification is an independent function, so the split cannot change a bit;
// body must write only its own rows' results and keep its own scratch.
template <class Body>
void for_rows(int n, Body body) {
  const int hw = int(std::thread::hardware_concurrency());
  const int workers = std::max(1, std::min(hw, n / 64));
  if (workers == 1) {
    body(0, 1);
    return;
  }
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back([&body, w, workers] { body(w, workers); });
  for (auto& t : pool) t.join();
}

// The wgmma step rule for the operands of a scheme: E4M3, or BF16 for the bf16 scheme.
const tc::StepRule& wgmma_rule(Scheme scheme) {
  return scheme == Scheme::Bf16 ? tc::kHopperBF16 : tc::kHopperE4M3;
}

// out[j - j0] = a · row_j for keys j in [j0, j1) of a document, summed as `acc` says: FP32
// over bt (the rows transposed, [D][n]), or the kernels' chain of D/32 (D/16) wgmma steps
// over the rows themselves (rows(j): D contiguous values).
template <class Rows>
void row_dots(Accumulation acc, Scheme scheme, const float* a, const float* bt, Rows rows, int n, int dim, int j0,
              int j1, float* out) {
  if (acc == Accumulation::Fp32) {
    dot_rows(a, bt, n, dim, j0, j1, out);
    return;
  }
  const tc::StepRule& rule = wgmma_rule(scheme);
  for (int j = j0; j < j1; ++j) out[j - j0] = tc::mma_dot(rule, a, rows(j), dim);
}

// S_j = q8·k8_j for keys j in [j0, j1) of the document at `base` (kt: its keys transposed,
// [D][n]): the one definition of the raw scores that the forward and both backward passes
// use. Wgmma: each dot product is the chain of steps of the kernel's S = Q Kᵀ, which is the
// same for (Q Kᵀ) and (K Qᵀ)ᵀ and for every instruction N (measured).
void raw_scores(const EmulationConfig& cfg, const float* q, const float* kt, const Operand& k8, int64_t base,
                int kvh, int n, int dim, int j0, int j1, float* out) {
  row_dots(cfg.arith.s, cfg.scheme, q, kt, [&](int j) { return k8.row(base + j, kvh); }, n, dim, j0, j1, out);
}

// The visible key range of query row i in a document of length L.
inline int key_end(int i, int L, bool causal) { return causal ? i + 1 : L; }
// The visible query range of key row j.
inline int query_begin(int j, bool causal) { return causal ? j : 0; }

struct ForwardContext {
  const Problem* p;
  const EmulationConfig* cfg;
  const Operand* q;
  const Operand* k;
  const Operand* v;
  float c;  // softmax_scale * log2(e)
};

bool running_p_scale(PScale r) { return r == PScale::RunningMax || r == PScale::RunningKeys; }
bool key_p_scale(PScale r) { return r == PScale::TileKeys || r == PScale::RunningKeys; }

// P's per-row scale sigma for one key tile (ALGORITHM.md §2 step 5, §7). x: the tile's
// p_j * sv[j] over its visible keys (>= 0 or NaN, so the float maximum orders like |x|;
// read by the max rules only);
// sv: their V scales; alpha, pm: the tile's rescale factor and largest possible p;
// bound: X or Y of the running rules, updated (0 before the first tile, where alpha = 0).
float p_scale(const ForwardOptions& o, const float* x, const float* sv, int w, float alpha, float pm,
              float* bound) {
  float a = 0.0f;
  if (o.p_scale == PScale::TileMax || o.p_scale == PScale::RunningMax) {
    for (int j = 0; j < w; ++j) a = max_nan(a, x[j]);
  } else {
    float y = 0.0f;
    for (int j = 0; j < w; ++j) y = max_nan(y, sv[j]);
    a = pm * y;
  }
  if (running_p_scale(o.p_scale)) {
    a = max_nan(alpha * *bound, a);
    *bound = a;
  }
  return std::ldexp(fmt::pow2_scale(a), o.p_headroom_log2);  // exact: a power of two
}

// A row's state between key tiles (§2): running maximum m, mc = m * c of the last tile, the
// denominator l, the accumulator acc[D] (in sigma's units with the chained fold), the last
// tile's sigma and the running P-scale bound.
struct RowState {
  float m = -kInf, l = 0.0f, mc = 0.0f, sigma = 1.0f, bound = 0.0f;
};

// Query row i of document [base, base + L), head h: the key tiles [n_begin, n_end) of the
// row's visible keys folded into st and acc (docs/ALGORITHM.md §2, §7).
void visit_tiles(const ForwardContext& cx, int64_t base, int L, int h, int kvh, int i, const std::vector<float>& kt,
                 int n_begin, int n_end, float* s_buf, float* p_buf, float* sv_buf, float* acc, float* tile,
                 RowState& st) {
  const int D = cx.p->head_dim, BN = cx.cfg->tiling.fwd_block_n;
  const ForwardOptions& opt = cx.cfg->fwd;
  const bool fp8 = cx.cfg->scheme != Scheme::Bf16;
  const bool tile_local = opt.p_ref == PRef::Tile;
  const bool lazy = opt.p_ref == PRef::Lazy;
  const float threshold = float(opt.rescale_log2), bound_p = std::ldexp(1.0f, opt.rescale_log2);
  const bool bf16_pv = opt.pv_operand == PvOperand::Bf16;
  // S's wgmma rule is the scheme's; the P·V product's is BF16's under option C.
  const tc::StepRule& rule = bf16_pv ? tc::kHopperBF16 : wgmma_rule(cx.cfg->scheme);
  const float c = cx.c;
  const float* qi = cx.q->row(base + i, h);
  const float sq = cx.q->s(base + i, h);
  float m = st.m, l = st.l, mc = st.mc, sigma = st.sigma, bound = st.bound;
  for (int n0 = n_begin; n0 < n_end; n0 += BN) {
    const int n1 = std::min(n0 + BN, n_end), w = n1 - n0;
    // 1. logits of the visible keys (masked keys are simply not in [n0, n1)).
    raw_scores(*cx.cfg, qi, kt.data(), *cx.k, base, kvh, L, D, n0, n1, s_buf);
    for (int j = 0; j < w; ++j) s_buf[j] = (s_buf[j] * sq) * cx.k->s(base + n0 + j, kvh);
    // 2. running maximum.
    float tile_max = -kInf;
    for (int j = 0; j < w; ++j) tile_max = max_nan(tile_max, s_buf[j]);
    const float m_new = max_nan(m, tile_max);
    const float mc_prev = mc;  // what the earlier tiles' p were taken against
    // The reference moves to m_new c unless it is lazy and m_new passes it by at most the
    // threshold (NaN moves it); on the first tile it always does.
    const bool moves = !lazy || m == -kInf || !(std::fmaf(m_new, c, -mc) <= threshold);
    if (moves) mc = m_new * c;
    // 3. probabilities and the rescale factor. Tile-local P (§7): against the tile's own
    // maximum, the tile entering the row's state through beta = exp2(m_t c - mc).
    const float pc = tile_local ? tile_max * c : mc;
    for (int j = 0; j < w; ++j) p_buf[j] = std::exp2(std::fmaf(s_buf[j], c, -pc));
    const float alpha = (m == -kInf) ? 0.0f : moves ? std::exp2(mc_prev - mc) : 1.0f;
    const float beta = tile_local ? std::exp2(std::fmaf(tile_max, c, -mc)) : 1.0f;
    // 4. denominator from the unquantized p.
    float rowsum = 0.0f;
    for (int j = 0; j < w; ++j) rowsum += p_buf[j];
    l = tile_local ? l * alpha + beta * rowsum : l * alpha + rowsum;
    // 5. fold V's scale into P, round P for the PV matmul.
    for (int j = 0; j < w; ++j) sv_buf[j] = cx.v->s(base + n0 + j, kvh);
    float sigma_t = 1.0f;
    // >= every p_j of the tile: p is taken against pc (mc, or the tile's own maximum with
    // tile-local P, whose pm then depends on the tile alone). Read by the key rules only.
    const float pm_log2 = std::fmaf(tile_local ? tile_max : m_new, c, -pc);
    const float pm = lazy && pm_log2 <= threshold ? bound_p : std::exp2(pm_log2);
    if (bf16_pv) {
      // Option C: p (<= pm, about 1) as BF16; V's scale does not enter (its BF16 values do).
      for (int j = 0; j < w; ++j) p_buf[j] = fmt::round_bf16(p_buf[j]);
    } else if (fp8 && key_p_scale(opt.p_scale)) {
      // The key rules know sigma before any p: codes e4m3(p_j * (sv[j] / sigma)), sv[j] / sigma
      // exact (powers of two), so that a kernel can scale the keys once for all rows.
      sigma_t = p_scale(opt, nullptr, sv_buf, w, alpha, pm, &bound);
      const float inv = 1.0f / sigma_t;
      for (int j = 0; j < w; ++j) p_buf[j] = fmt::e4m3_to_f32(fmt::e4m3_rn_sat(p_buf[j] * (sv_buf[j] * inv)));
    } else if (fp8) {
      for (int j = 0; j < w; ++j) p_buf[j] *= sv_buf[j];
      sigma_t = p_scale(opt, p_buf, sv_buf, w, alpha, pm, &bound);
      for (int j = 0; j < w; ++j) p_buf[j] = fmt::e4m3_to_f32(fmt::quantize_e4m3(p_buf[j], sigma_t));
    } else {
      for (int j = 0; j < w; ++j) p_buf[j] = fmt::round_bf16(p_buf[j] * sv_buf[j]);
    }
    // 6. the tile's products. Wgmma: per output element, the chain of steps over the tile's
    // keys in ascending order (the kernel's P operand holds keys 32 s .. 32 s + 31 in step s;
    // masked keys are zero products, and trailing all-zero steps leave a step's result
    // unchanged).
    const float* v0 = bf16_pv ? cx.v->bf16_row(base + n0, kvh) : cx.v->row(base + n0, kvh);
    const int v_stride = cx.v->heads * D;
    const bool first = n0 == n_begin;
    if (opt.fold == PvFold::Fresh) {
      // In a fresh accumulator, then scaled and added in FP32.
      if (cx.cfg->arith.pv == Accumulation::Fp32) {
        for (int d = 0; d < D; ++d) tile[d] = 0.0f;
        for (int j = 0; j < w; ++j) {
          const float pj = p_buf[j];
          const float* vj = v0 + size_t(j) * v_stride;
          for (int d = 0; d < D; ++d) tile[d] += pj * vj[d];
        }
      } else {
        for (int d = 0; d < D; ++d) tile[d] = tc::mma_dot(rule, p_buf, v0 + d, w, v_stride);
      }
      const float tile_scale = tile_local ? beta * sigma_t : sigma_t;  // beta * sigma: exact (a power of two)
      for (int d = 0; d < D; ++d) acc[d] = acc[d] * alpha + tile_scale * tile[d];
    } else {
      // Option A: acc holds O's numerator in units of sigma; it moves to this tile's units
      // (alpha * sigma / sigma_t is exact when alpha * sigma is normal) and the products are
      // added onto it. The first tile starts from nothing (scale-d 0; alpha = 0 there).
      if (!first) {
        const float factor = (alpha * sigma) / sigma_t;
        for (int d = 0; d < D; ++d) acc[d] = acc[d] * factor;
      }
      if (cx.cfg->arith.pv == Accumulation::Fp32) {
        for (int j = 0; j < w; ++j) {
          const float pj = p_buf[j];
          const float* vj = v0 + size_t(j) * v_stride;
          for (int d = 0; d < D; ++d) acc[d] += pj * vj[d];
        }
      } else {
        for (int d = 0; d < D; ++d)
          acc[d] = first ? tc::mma_dot(rule, p_buf, v0 + d, w, v_stride)
                         : tc::mma_dot_onto(rule, acc[d], p_buf, v0 + d, w, v_stride);
      }
    }
    sigma = sigma_t;
    m = m_new;
  }
  st = RowState{m, l, mc, sigma, bound};
}

// O and LSE of a row from its final state (ALGORITHM.md §2): one division per row, then a
// multiply per element.
void finish_row(const ForwardContext& cx, const RowState& st, const float* acc, uint16_t* out_row, float* lse_out) {
  const int D = cx.p->head_dim;
  const float inv_l = 1.0f / st.l;
  for (int d = 0; d < D; ++d) {
    // Option A: acc * sigma is exact (a power of two).
    const float o = cx.cfg->fwd.fold == PvFold::Fresh ? acc[d] * inv_l : (acc[d] * st.sigma) * inv_l;
    out_row[d] = fmt::f32_to_bf16_bits(o);
  }
  *lse_out = (st.mc + std::log2(st.l)) * kLn2;
}

// One query row i of document [base, base + L), head h: docs/ALGORITHM.md §2 (and §7).
void forward_row(const ForwardContext& cx, int64_t base, int L, int h, int kvh, int i,
                 const std::vector<float>& kt, float* s_buf, float* p_buf, float* sv_buf, float* acc,
                 float* tile, uint16_t* out_row, float* lse_out) {
  for (int d = 0; d < cx.p->head_dim; ++d) acc[d] = 0.0f;
  RowState st;
  visit_tiles(cx, base, L, h, kvh, i, kt, 0, key_end(i, L, cx.p->causal), s_buf, p_buf, sv_buf, acc, tile, st);
  finish_row(cx, st, acc, out_row, lse_out);
}

// The same row with its visible keys cut into chunks of `chunk` keys from the document start,
// each chunk's state computed from nothing (as a context-parallel rank computes the keys it
// holds) and the states merged in FP32, last chunk first (the order a ring may deliver them):
// m = max(m_a, m_b), each side scaled by exp2(mc_x - m c) (step 3's alpha). Fresh fold only.
void forward_row_chunked(const ForwardContext& cx, int64_t base, int L, int h, int kvh, int i, int chunk,
                         const std::vector<float>& kt, float* s_buf, float* p_buf, float* sv_buf, float* acc,
                         float* tile, std::vector<float>& part, uint16_t* out_row, float* lse_out) {
  const int D = cx.p->head_dim;
  const float c = cx.c;
  const int jend = key_end(i, L, cx.p->causal);
  RowState merged;
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int start = (jend - 1) / chunk * chunk; start >= 0; start -= chunk) {
    RowState st;
    for (int d = 0; d < D; ++d) part[d] = 0.0f;
    visit_tiles(cx, base, L, h, kvh, i, kt, start, std::min(start + chunk, jend), s_buf, p_buf, sv_buf, part.data(),
                tile, st);
    if (merged.m == -kInf) {  // the first chunk merged: its state as it is
      merged = st;
      for (int d = 0; d < D; ++d) acc[d] = part[d];
      continue;
    }
    const float m = max_nan(merged.m, st.m), mc = m * c;
    const float ea = std::exp2(merged.mc - mc), eb = std::exp2(st.mc - mc);  // as step 3's alpha
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * ea + part[d] * eb;
    merged = RowState{m, merged.l * ea + st.l * eb, mc, 1.0f, 0.0f};
  }
  finish_row(cx, merged, acc, out_row, lse_out);
}

float softmax_c(const Problem& p) { return p.softmax_scale * kLog2e; }

}  // namespace

namespace {

// rows: null for every token, else the packed tokens to compute.
void forward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q, const uint16_t* k,
             const uint16_t* v, const std::vector<char>* rows, uint16_t* out, float* lse, int chunk = 0) {
  const int64_t T = p.total_tokens;
  const int Hq = p.hq, Hkv = p.hkv, D = p.head_dim, group = Hq / Hkv;
  const Operand q8 = quantize_input(q, T, Hq, D, cfg.scheme);
  const Operand k8 = quantize_input(k, T, Hkv, D, cfg.scheme);
  const Operand v8 = quantize_input(v, T, Hkv, D, cfg.scheme);
  const ForwardContext cx{&p, &cfg, &q8, &k8, &v8, softmax_c(p)};
  validate(cfg);
  const int BN = cfg.tiling.fwd_block_n;
  for (int b = 0; b < p.num_docs(); ++b) {
    const int64_t base = p.cu_seqlens[b];
    const int L = int(p.cu_seqlens[b + 1] - base);
    const int q0 = p.first_query(b);
    if (L <= 0) continue;
    for (int kvh = 0; kvh < Hkv; ++kvh) {
      const std::vector<float> kt = transpose_rows(k8, base, L, kvh);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h)
        for_rows(L, [&](int first, int stride) {
          std::vector<float> s_buf(BN), p_buf(BN), sv_buf(BN), acc(D), tile(D), part(D);
          for (int i = first; i < L; i += stride) {
            if (i < q0 || (rows && !(*rows)[size_t(base + i)])) continue;
            uint16_t* o = out + (size_t(base + i) * Hq + h) * D;
            float* ls = lse + size_t(h) * T + base + i;
            if (chunk > 0)
              forward_row_chunked(cx, base, L, h, kvh, i, chunk, kt, s_buf.data(), p_buf.data(), sv_buf.data(),
                                  acc.data(), tile.data(), part, o, ls);
            else
              forward_row(cx, base, L, h, kvh, i, kt, s_buf.data(), p_buf.data(), sv_buf.data(), acc.data(),
                          tile.data(), o, ls);
          }
        });
    }
  }
}

}  // namespace

void emulate_forward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                     const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse) {
  forward(p, cfg, q, k, v, nullptr, out, lse);
}

void emulate_forward_chunked(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, int chunk_keys, uint16_t* out, float* lse) {
  if (chunk_keys <= 0 || chunk_keys % cfg.tiling.fwd_block_n != 0)
    throw std::invalid_argument("emulate_forward_chunked: chunk_keys must be a positive multiple of "
                                "tiling.fwd_block_n (" + std::to_string(cfg.tiling.fwd_block_n) + "), got " +
                                std::to_string(chunk_keys));
  if (cfg.fwd.fold != PvFold::Fresh)
    throw std::invalid_argument("emulate_forward_chunked: needs EmulationConfig::fwd.fold = PvFold::Fresh");
  forward(p, cfg, q, k, v, nullptr, out, lse, chunk_keys);
}

void emulate_forward_rows(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                          const uint16_t* k, const uint16_t* v, const std::vector<char>& rows,
                          uint16_t* out, float* lse) {
  if (rows.size() != size_t(p.total_tokens))
    throw std::invalid_argument("emulate_forward_rows: rows must have one entry per packed token");
  forward(p, cfg, q, k, v, &rows, out, lse);
}

namespace {

// P and dS of one (document, query head) for all visible pairs, row-major [L][L]
// (entries of masked pairs are left 0 and never read).
struct PairMatrices {
  std::vector<float> P, dS;
};

PairMatrices pair_matrices(const Problem& p, const EmulationConfig& cfg, const Operand& q8, const Operand& k8,
                           const Operand& v8, const Operand& do8, const float* lse2,
                           const float* Drow, int64_t base, int L, int q0, int h, int kvh) {
  const int D = p.head_dim;
  const float c = softmax_c(p);
  PairMatrices pm;
  pm.P.assign(size_t(L) * L, 0.0f);
  pm.dS.assign(size_t(L) * L, 0.0f);
  const std::vector<float> kt = transpose_rows(k8, base, L, kvh);
  // dP on BF16 dO and V (cfg.dp_bf16): their input values, scales 1, BF16 wgmma steps.
  const bool dp_bf16 = cfg.dp_bf16;
  const Scheme dp_scheme = dp_bf16 ? Scheme::Bf16 : cfg.scheme;
  const std::vector<float> vt = transpose_rows(v8, base, L, kvh, dp_bf16);
  for_rows(L, [&](int first, int stride) {
    std::vector<float> s(L), dp(L);
    for (int i = first; i < L; i += stride) {
      if (i < q0) continue;  // a key-only row: its P and dS are never read
      const int jend = key_end(i, L, p.causal);
      const int64_t ti = base + i;
      raw_scores(cfg, q8.row(ti, h), kt.data(), k8, base, kvh, L, D, 0, jend, s.data());
      // dP (and the kernels' dPᵀ): the same chain of steps over D as S.
      row_dots(cfg.arith.bwd, dp_scheme, dp_bf16 ? do8.bf16_row(ti, h) : do8.row(ti, h), vt.data(),
               [&](int j) { return dp_bf16 ? v8.bf16_row(base + j, kvh) : v8.row(base + j, kvh); }, L, D, 0, jend,
               dp.data());
      // S c = s (sk c) sq and dP = dp sdo sv with the powers of two multiplied first (exact,
      // so each of exp2's argument and dP - D keeps its one rounding), as the kernels do; the
      // BF16 dP has no scales.
      const float sq = q8.s(ti, h), sdo = dp_bf16 ? 1.0f : do8.s(ti, h);
      for (int j = 0; j < jend; ++j) {
        const float P = std::exp2(std::fmaf(s[j], (k8.s(base + j, kvh) * c) * sq, -lse2[i]));
        const float sv = dp_bf16 ? 1.0f : v8.s(base + j, kvh);
        pm.P[size_t(i) * L + j] = P;
        pm.dS[size_t(i) * L + j] = P * std::fmaf(dp[j], sdo * sv, -Drow[i]);
      }
    }
  });
  return pm;
}

// Which of the backward's tile products are FP8 (the rest are BF16): recipe fp8 all of them,
// fp8_mixed none (dO Vᵀ, a product over D like S, is FP8 whenever the scheme is).
struct BackwardPrecision {
  bool pdo_fp8;           // P^T dO (dV)
  bool ds_fp8;            // dS^T Q (dK) and, recipe fp8, dS K (dQ)
  DqOperand dq_operand;   // fp8_mixed's dQ operand
};

BackwardPrecision backward_precision(const EmulationConfig& cfg) {
  const bool fp8 = cfg.scheme != Scheme::Bf16 && cfg.recipe == FLAMIA_RECIPE_FP8;
  return {fp8, fp8, cfg.dq_operand};
}

// One tile product reduced over tokens, added to acc: acc[d] += scale * sum_r x[r] * rows[r][d]
// for r in [0, n), rows[r] = row(r) (D values). Fp32: the product by FP32 adds in ascending r
// over the rows with r >= r0 (the visible ones), then fmaf(scale, product, acc). Wgmma: the
// kernels' chain of k32 (E4M3) or k16 (BF16) steps over r from the tile start (x[r] = 0 for
// r < r0); within a step the sum does not depend on the order of its products, so the
// fragment order of the transposed operands does not matter. An FP8 product is formed in a
// fresh accumulator and folded by fmaf (its k32 steps keep 13 fraction bits, too few for a
// long sum); a BF16 product (scale 1) is chained onto acc itself, whose k16 steps keep 23
// (ALGORITHM.md §3).
template <class Row>
void add_tile_product(const EmulationConfig& cfg, bool fp8, const float* x, float scale, int r0, int n, int D,
                      Row row, std::vector<float>& col, float* tile, float* acc) {
  for (int d = 0; d < D; ++d) tile[d] = 0.0f;
  if (cfg.arith.bwd == Accumulation::Fp32) {
    for (int r = r0; r < n; ++r) {
      const float* o = row(r);
      for (int d = 0; d < D; ++d) tile[d] += x[r] * o[d];
    }
    for (int d = 0; d < D; ++d) acc[d] = std::fma(scale, tile[d], acc[d]);
    return;
  }
  const tc::StepRule& rule = fp8 ? tc::kHopperE4M3 : tc::kHopperBF16;
  // A copy per tile rather than one transpose per document: its rows r < r0 (masked) stay
  // zero, as the kernels' masked products are (0 times a finite code); the specification's
  // operand values of a non-finite row are NaN, and 0 * NaN would reach other rows' results.
  col.assign(size_t(D) * n, 0.0f);  // [D][n]
  for (int r = r0; r < n; ++r) {
    const float* o = row(r);
    for (int d = 0; d < D; ++d) col[size_t(d) * n + r] = o[d];
  }
  for (int d = 0; d < D; ++d) {
    const float* b = col.data() + size_t(d) * n;
    acc[d] = fp8 ? std::fma(scale, tc::mma_dot(rule, x, b, n), acc[d]) : tc::mma_dot_onto(rule, acc[d], x, b, n);
  }
}

// dV and dK contributions of one query head to key rows of one document: for each key j,
// query tiles [m0, m0 + BM) from the document start, each tile product added as
// add_tile_product says. Only the tiles that start in
// [q_lo, q_hi) (a context-parallel rank's query chunk; all of them by default).
void accumulate_dkdv(const Problem& p, const EmulationConfig& cfg, const PairMatrices& pm,
                     const Operand& q8, const Operand& do8, int64_t base, int L, int h,
                     float* dk_acc, float* dv_acc, int q_lo = 0,
                     int q_hi = std::numeric_limits<int>::max()) {
  const int D = p.head_dim, BM = cfg.tiling.bwd_block_m;
  const BackwardPrecision prec = backward_precision(cfg);
  for_rows(L, [&](int first, int stride) {
    std::vector<float> x(BM), tile(D), col;
    for (int j = first; j < L; j += stride) {
      float* dkj = dk_acc + size_t(j) * D;
      float* dvj = dv_acc + size_t(j) * D;
      const int ibeg = query_begin(j, p.causal);
      for (int m0 = std::max(ibeg / BM * BM, q_lo); m0 < std::min(L, q_hi); m0 += BM) {
        // Tile rows r in [0, n) are queries m0 + r; the visible ones start at r0.
        const int r0 = std::max(m0, ibeg) - m0, n = std::min(m0 + BM, L) - m0;
        std::fill(x.begin(), x.end(), 0.0f);
        // dV. FP8: P with dO's scale folded in, times dO8, one scale per query tile from the
        // tile's largest dO scale, which bounds every P·sdo since P <= 1 (ALGORITHM.md §3;
        // fmax skips a NaN scale). BF16: bf16(P) times dO's BF16 values. A non-finite dO row
        // has P = NaN (its lse2 is NaN), so its query poisons only the keys that see it.
        for (int r = r0; r < n; ++r)
          x[r] = pm.P[size_t(m0 + r) * L + j] * (prec.pdo_fp8 ? do8.s(base + m0 + r, h) : 1.0f);
        float scale;
        if (prec.pdo_fp8) {
          float sdo_max = 0.0f;
          for (int r = 0; r < n; ++r) sdo_max = std::fmax(sdo_max, do8.s(base + m0 + r, h));
          scale = fmt::pow2_scale(sdo_max);
          for (int r = r0; r < n; ++r) x[r] = fmt::e4m3_to_f32(fmt::quantize_e4m3(x[r], scale));
        } else {
          scale = round_tile_operand(x.data() + r0, n - r0, false);
        }
        add_tile_product(cfg, prec.pdo_fp8, x.data(), scale, r0, n, D,
                         [&](int r) { return prec.pdo_fp8 ? do8.row(base + m0 + r, h) : do8.bf16_row(base + m0 + r, h); },
                         col, tile.data(), dvj);
        // dK: dS with Q's scale folded in, times q8 (fp8); or bf16(dS) times bf16 q.
        for (int r = r0; r < n; ++r) {
          const float ds = pm.dS[size_t(m0 + r) * L + j];
          x[r] = prec.ds_fp8 ? ds * q8.s(base + m0 + r, h) : ds;
        }
        scale = round_tile_operand(x.data() + r0, n - r0, prec.ds_fp8);
        add_tile_product(cfg, prec.ds_fp8, x.data(), scale, r0, n, D,
                         [&](int r) { return prec.ds_fp8 ? q8.row(base + m0 + r, h) : q8.bf16_row(base + m0 + r, h); },
                         col, tile.data(), dkj);
      }
    }
  });
}

// dQ of one query head for the rows [q0, L) of one document: key tiles [n0, n0 + BN).
void compute_dq(const Problem& p, const EmulationConfig& cfg, const PairMatrices& pm,
                const Operand& k8, int64_t base, int L, int q0, int h, int kvh, uint16_t* dq) {
  const int D = p.head_dim, BN = cfg.tiling.bwd_block_n;
  const BackwardPrecision prec = backward_precision(cfg);
  // E4m3K8: fp8's product (E4M3 steps over K's codes) of x = bf16(bf16(dS) sk).
  const bool codes = prec.ds_fp8 || prec.dq_operand == DqOperand::E4m3K8;
  for_rows(L, [&](int first, int stride) {
    std::vector<float> x(BN), tile(D), acc(D), col;
    for (int i = first; i < L; i += stride) {
      if (i < q0) continue;
      for (int d = 0; d < D; ++d) acc[d] = 0.0f;
      const int jend = key_end(i, L, p.causal);
      for (int n0 = 0; n0 < jend; n0 += BN) {
        const int w = std::min(n0 + BN, jend) - n0;
        for (int r = 0; r < w; ++r) {
          const float ds = pm.dS[size_t(i) * L + n0 + r], sk = k8.s(base + n0 + r, kvh);
          if (prec.ds_fp8) x[r] = ds * sk;
          else if (prec.dq_operand == DqOperand::E4m3K8) x[r] = fmt::round_bf16(fmt::round_bf16(ds) * sk);
          else x[r] = ds;
        }
        const float scale = round_tile_operand(x.data(), w, codes);
        if (prec.dq_operand == DqOperand::E4m3) {
          // bf16(dS) to E4M3 values, then the BF16 operand they make (round_bf16 matters only
          // below BF16's normal range; a NaN rho makes the whole row NaN).
          const float rho = round_tile_operand(x.data(), w, true);
          for (int r = 0; r < w; ++r) x[r] = fmt::round_bf16(x[r] * rho);
        }
        add_tile_product(cfg, codes, x.data(), scale, 0, w, D,
                         [&](int r) { return codes ? k8.row(base + n0 + r, kvh) : k8.bf16_row(base + n0 + r, kvh); },
                         col, tile.data(), acc.data());
      }
      uint16_t* out = dq + (size_t(base + i) * p.hq + h) * D;
      for (int d = 0; d < D; ++d) out[d] = fmt::f32_to_bf16_bits(p.softmax_scale * acc[d]);
    }
  });
}

}  // namespace

namespace {

// D = rowsum(dO ∘ O) of token t's row (ALGORITHM.md §3) in FP32, in d order: from the BF16 dO,
// or (DRows::DpOperand) from the values dP is formed from, dO's codes times its scale (exact: a
// power of two) — so that in dS = P (dP - D) the rounding of dO cancels where P is one-hot.
float d_row(const EmulationConfig& cfg, const Operand& do8, int64_t t, int h, const uint16_t* o) {
  const bool codes = cfg.d_rows == DRows::DpOperand && !cfg.dp_bf16;
  const float* x = codes ? do8.row(t, h) : do8.bf16_row(t, h);
  const float s = codes ? do8.s(t, h) : 1.0f;
  float acc = 0.0f;
  for (int d = 0; d < do8.dim; ++d) acc += (x[d] * s) * bf16_value(o[d]);
  return acc;
}

// chunk_queries = 0: the specification's backward. Otherwise dK/dV as a context-parallel
// ring may reduce them: per chunk of chunk_queries queries from the document start (its
// tiles over the group's query heads in the usual order, from zero), the chunks' FP32
// partials then added in ascending chunk order. dQ is the same in both.
void backward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q, const uint16_t* k,
              const uint16_t* v, const uint16_t* dout, const uint16_t* out, const float* lse, int chunk_queries,
              uint16_t* dq, uint16_t* dk, uint16_t* dv) {
  const int64_t T = p.total_tokens;
  const int Hq = p.hq, Hkv = p.hkv, D = p.head_dim, group = Hq / Hkv;
  // The same quantized operands and scales as the forward (§2 of DESIGN.md).
  const Operand q8 = quantize_input(q, T, Hq, D, cfg.scheme);
  const Operand k8 = quantize_input(k, T, Hkv, D, cfg.scheme);
  const Operand v8 = quantize_input(v, T, Hkv, D, cfg.scheme);
  const Operand do8 = quantize_input(dout, T, Hq, D, cfg.scheme);
  for (int b = 0; b < p.num_docs(); ++b) {
    const int64_t base = p.cu_seqlens[b];
    const int L = int(p.cu_seqlens[b + 1] - base);
    const int q0 = p.first_query(b);
    if (L <= 0) continue;
    const int chunk = chunk_queries > 0 ? chunk_queries : L;
    const int chunks = (L + chunk - 1) / chunk;
    for (int kvh = 0; kvh < Hkv; ++kvh) {
      // dK/dV of a kv head sum over its query heads in increasing order, then tiles; per
      // query chunk when chunked.
      std::vector<float> dk_acc(size_t(chunks) * L * D, 0.0f), dv_acc(size_t(chunks) * L * D, 0.0f);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        std::vector<float> lse2(L), Drow(L);
        for (int i = 0; i < L; ++i) {
          const size_t row = (size_t(base + i) * Hq + h) * D;
          Drow[i] = d_row(cfg, do8, base + i, h, out + row);
          // NaN for a non-finite dO row (its scale is NaN): P of its pairs is NaN, which carries
          // it into every gradient its query touches (the kernels read the same lse2).
          lse2[i] = std::isnan(do8.s(base + i, h)) ? NAN : lse[size_t(h) * T + base + i] * kLog2e;
        }
        const PairMatrices pm =
            pair_matrices(p, cfg, q8, k8, v8, do8, lse2.data(), Drow.data(), base, L, q0, h, kvh);
        for (int c = 0; c < chunks; ++c)
          accumulate_dkdv(p, cfg, pm, q8, do8, base, L, h, dk_acc.data() + size_t(c) * L * D,
                          dv_acc.data() + size_t(c) * L * D, std::max(c * chunk, q0), (c + 1) * chunk);
        compute_dq(p, cfg, pm, k8, base, L, q0, h, kvh, dq);
      }
      // The partials added in chunk order (the first taken as it is: one chunk is the
      // specification's sum bit for bit).
      for (int c = 1; c < chunks; ++c)
        for (size_t e = 0; e < size_t(L) * D; ++e) {
          dk_acc[e] += dk_acc[size_t(c) * L * D + e];
          dv_acc[e] += dv_acc[size_t(c) * L * D + e];
        }
      for (int j = 0; j < L; ++j) {
        const size_t row = (size_t(base + j) * Hkv + kvh) * D;
        for (int d = 0; d < D; ++d) {
          dk[row + d] = fmt::f32_to_bf16_bits(p.softmax_scale * dk_acc[size_t(j) * D + d]);
          dv[row + d] = fmt::f32_to_bf16_bits(dv_acc[size_t(j) * D + d]);
        }
      }
    }
  }
}

}  // namespace

void emulate_backward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                      const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                      const uint16_t* out, const float* lse, uint16_t* dq, uint16_t* dk,
                      uint16_t* dv) {
  validate(cfg);
  backward(p, cfg, q, k, v, dout, out, lse, 0, dq, dk, dv);
}

void emulate_backward_chunked(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                              const uint16_t* out, const float* lse, int chunk_queries, uint16_t* dq,
                              uint16_t* dk, uint16_t* dv) {
  validate(cfg);
  if (chunk_queries <= 0 || chunk_queries % cfg.tiling.bwd_block_m != 0)
    throw std::invalid_argument("chunk_queries: expected a positive multiple of tiling.bwd_block_m");
  backward(p, cfg, q, k, v, dout, out, lse, chunk_queries, dq, dk, dv);
}

}  // namespace ref
}  // namespace flamia
