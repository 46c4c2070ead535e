// CPU reference layer: exact attention in float64 and the emulation of the quantized
// algorithm (the specification, docs/ALGORITHM.md). Host only; used by the C ABI for
// host tensors, by the tests and by the numerics study.
#pragma once

#include "common/tiles.h"
#include <cstdint>
#include <vector>

#include "flamia/flamia.h"

namespace flamia {
namespace ref {

// Shape of one packed attention problem. Tensors are dense row-major:
// q/out/dout/dq [T, Hq, D], k/v/dk/dv [T, Hkv, D], lse [Hq, T].
struct Problem {
  int64_t total_tokens = 0;
  int hq = 0, hkv = 0, head_dim = 0;
  std::vector<int32_t> cu_seqlens;  // [B + 1]
  bool causal = true;
  float softmax_scale = 0.0f;       // resolved (never 0)
  // [B] or empty: document b's queries start at position q_start[b] (flamia.h); the rows
  // before it are keys only — the emulate_* functions leave their O, LSE and dQ untouched
  // and sum dK/dV over the later query tiles alone (tiles start at multiples of the tile).
  std::vector<int32_t> q_start;
  int num_docs() const { return int(cu_seqlens.size()) - 1; }
  int first_query(int b) const { return q_start.empty() ? 0 : q_start[size_t(b)]; }
};

// Exact attention in float64. Masked-out rows (none for valid inputs) produce zeros.
void exact_forward(const Problem& p, const double* q, const double* k, const double* v,
                   double* out, double* lse);
// exact_forward for the packed tokens with rows[t] != 0 only (the others are left untouched).
void exact_forward_rows(const Problem& p, const double* q, const double* k, const double* v,
                        const std::vector<char>& rows, double* out, double* lse);
void exact_backward(const Problem& p, const double* q, const double* k, const double* v,
                    const double* dout, double* dq, double* dk, double* dv);

// How inputs (q, k, v, dO) are scaled before FP8 rounding.
enum class Scheme {
  PerToken,      // one scale per (token, head): flamia
  PerTensor,     // one scale per (tensor, head) over the whole pack (cuDNN / TE style)
  TokenBlock32,  // one scale per (32 consecutive packed tokens, head)
  Bf16           // no FP8: BF16 operands everywhere (the BF16 attention baseline)
};
const char* scheme_name(Scheme s);

// Tile sizes where they change results (docs/ALGORITHM.md); the defaults are the default
// GPU kernels' (common/tiles.h).
struct Tiling {
  int fwd_block_n = tiles::kFwdBlockN;
  int bwd_block_m = tiles::kBwdBlockM;
  int bwd_block_n = tiles::kBwdBlockN;
};

// How the dot products of a matmul are summed.
enum class Accumulation {
  Fp32,   // FP32 adds (round to nearest) of exact products, ascending index: the mma.sync
          // kernels, whose FP8 products the tensor cores add in FP32
  Wgmma   // Hopper wgmma: chains of k32 (E4M3) or k16 (BF16) steps in ascending index,
          // each step summed as tensor_core.h models (measured on H200, NUMERICS.md §6)
};

// The accumulation of each matmul that a kernel may issue as wgmma; the defaults are the
// default GPU kernels' (every matmul on wgmma).
struct Arithmetic {
  Accumulation s = Accumulation::Wgmma;   // S = q8·k8 over D, forward and backward (one definition)
  Accumulation pv = Accumulation::Wgmma;  // the forward's P·V tile product over the tile's keys
  Accumulation bwd = Accumulation::Wgmma; // the backward's dP over D and its dV, dK, dQ tile products
};

// Options of the forward (docs/ALGORITHM.md §7); the defaults are §2 as written.
//
// How each key tile's P·V product reaches O's accumulator (§2 step 6).
enum class PvFold {
  Fresh,    // the tile product in a fresh accumulator, then acc = acc * alpha + sigma * tile in FP32
  Chained   // option A: acc in units of the tile's sigma, rescaled by alpha * (sigma_prev / sigma),
            // then the tile's products summed onto it (wgmma: steps with scale-d 1)
};

// How P's per-row scale sigma is chosen for a key tile (§2 step 5). x_j = p_j * sv[j];
// pm = exp2(fmaf(m_new, c, -r)) is the largest p_j the tile can have (p_j <= pm since
// S_j <= m_new; with PRef::Running pm is 1 up to the rounding of m_new * c). With PRef::Lazy
// the key rules take 2^rescale_log2 for pm wherever fmaf(m_new, c, -r) <= rescale_log2 (every
// row but a huge or non-finite maximum's), so that sigma is the tile's for all its rows.
// The key rules quantize p_j * (sv[j] / sigma), the max rules x_j / sigma.
enum class PScale {
  TileMax,      // pow2_scale(max_j x_j) over the tile's visible keys (the reference GPU kernels)
  RunningMax,   // pow2_scale(X), X = max(alpha * X_prev, max_j x_j): bounds every key seen so far
  TileKeys,     // pow2_scale(pm * max_j sv[j]) over the tile's visible keys: no max over scores (§2)
  RunningKeys   // pow2_scale(Y), Y = max(alpha * Y_prev, pm * max_j sv[j])
};

// What P of a key tile is taken against (§2 step 3). Lazy (§2): a reference r that moves to
// the row's maximum (r = m c) only on the first tile or when fmaf(m, c, -r) exceeds
// rescale_log2 (so p <= 2^rescale_log2 and alpha = 1 on every other tile); the key rules then
// take sigma from 2^rescale_log2 * max_j sv[j]. Running: the row's running maximum over all
// tiles so far (§2 until 2026-12-05, the reference GPU kernels). Either way a tile's FP8
// codes depend on the tiles before it. Tile: the tile's own maximum m_t, the tile entering
// the row's state through beta = exp2(m_t c - mc) (l += beta * sum p, acc += (beta * sigma) *
// tile): a tile's codes depend on it alone, and key chunks may be computed apart and merged
// (docs/CONTEXT_PARALLEL.md).
enum class PRef { Lazy, Running, Tile };

// The operands of the forward's P·V product (§2 steps 5-6, §7).
enum class PvOperand {
  Fp8,  // P8 = e4m3(p * sv / sigma) times V's FP8 codes (E4M3 wgmma)
  Bf16  // option C: bf16(p) times V's BF16 input values (BF16 wgmma): no P scale (sigma = 1,
        // p_scale unused), no V scale; with the chained fold each k16 step keeps 23 fraction bits
};

struct ForwardOptions {
  PRef p_ref = PRef::Lazy;
  int rescale_log2 = tiles::kFwdRescaleLog2;  // PRef::Lazy's threshold, in [0, 8]
  PvFold fold = PvFold::Fresh;
  PScale p_scale = PScale::TileKeys;
  int p_headroom_log2 = 0;  // sigma times 2^k, k in [0, 8]: P8 stays below 448 / 2^k
  PvOperand pv_operand = PvOperand::Fp8;
};

// fp8_mixed's dQ operand (ALGORITHM.md §3). The E4M3 forms are what a stored dS of one byte a
// score (and a scale a row) computes; the GPU kernels do not run them yet.
enum class DqOperand {
  Bf16,   // bf16(dS) times the BF16 k: fp8_mixed as defined
  E4m3,   // x = bf16(dS), per key tile rho = pow2_scale(max_j |x_j|), the BF16 values
          // bf16(q8(x, rho) * rho) times the BF16 k in fp8_mixed's BF16 steps
  E4m3K8  // x = bf16(bf16(dS) * sk), rho as above, q8(x, rho) times K's codes k8 in E4M3 steps
          // (fresh accumulator, fmaf fold with rho): fp8's dQ product over fp8_mixed's dS
};

// Where the backward's D = rowsum(dO ∘ O) takes dO from (ALGORITHM.md §3).
enum class DRows {
  DpOperand,  // the dO values dP is formed from: dO's FP8 codes times its scale (its BF16 values
              // under dp_bf16), so that dP - D cancels dO's rounding (§3 as written)
  Bf16Dout    // the BF16 dO itself (the specification until 2026-12-05; NUMERICS.md §9)
};

struct EmulationConfig {
  flamia_recipe recipe = FLAMIA_RECIPE_FP8;
  Scheme scheme = Scheme::PerToken;
  Tiling tiling;
  Arithmetic arith;
  ForwardOptions fwd;
  // The backward's dP = dO Vᵀ on dO's and V's BF16 values (scales 1, BF16 wgmma) instead of
  // their FP8 codes: with fwd.pv_operand = Bf16, the V that made O (and so D = rowsum(dO O))
  // is the V of dP again (NUMERICS.md §7). Per-token scheme only.
  bool dp_bf16 = false;
  // fp8_mixed's dQ operand (DqOperand); dK's stays bf16(dS). Recipe fp8_mixed with an FP8
  // scheme for the E4M3 forms.
  DqOperand dq_operand = DqOperand::Bf16;
  DRows d_rows = DRows::DpOperand;
};

// Throws std::invalid_argument naming the field when cfg.fwd is not a valid combination
// (PvFold::Chained needs a running P scale with FP8 P, see ALGORITHM.md §7; PvOperand::Bf16 needs
// the per-token scheme). The emulate_* functions call it.
void validate(const EmulationConfig& cfg);

// The specification. Inputs and outputs are BF16 bit patterns (uint16_t), lse FP32.
void emulate_forward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                     const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse);
// The forward for the packed tokens with rows[t] != 0 only (O and LSE of the others are
// left untouched): each row is the same function as in emulate_forward. For studies of
// long documents, where computing every row would take too long.
// The forward with each row's visible keys in chunks of chunk_keys (a multiple of
// tiling.fwd_block_n) from the document start, each chunk's state computed from nothing and
// the states merged in FP32, last chunk first: what a context-parallel ring computes. Needs
// fwd.fold = PvFold::Fresh. With fwd.p_ref = PRef::Tile it differs from emulate_forward only
// by the order of FP32 operations; with PRef::Running, P's codes differ where an earlier
// chunk holds a row's maximum.
void emulate_forward_chunked(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, int chunk_keys, uint16_t* out, float* lse);
void emulate_forward_rows(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                          const uint16_t* k, const uint16_t* v, const std::vector<char>& rows,
                          uint16_t* out, float* lse);
void emulate_backward(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                      const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                      const uint16_t* out, const float* lse, uint16_t* dq, uint16_t* dk,
                      uint16_t* dv);
// The backward with dK/dV reduced as a context-parallel ring may reduce them: per chunk of
// chunk_queries queries (a multiple of tiling.bwd_block_m) from each document's start, that
// chunk's query tiles summed from zero (heads, then tiles, in the usual order), and the
// chunks' FP32 partials added in ascending chunk order. dQ (and, with one chunk, everything)
// is emulate_backward's bit for bit; dK/dV differ from it by the reassociation of FP32 adds.
// Keeps one partial per chunk (chunks x L x D floats per document and kv head).
void emulate_backward_chunked(const Problem& p, const EmulationConfig& cfg, const uint16_t* q,
                              const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                              const uint16_t* out, const float* lse, int chunk_queries, uint16_t* dq,
                              uint16_t* dk, uint16_t* dv);

}  // namespace ref
}  // namespace flamia
