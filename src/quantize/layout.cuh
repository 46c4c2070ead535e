// Byte layout of the quantized-operand buffer ("qkv8") and of the backward workspace.
//
// Natural FP8 copies keep the input layout [T, H, D] (dense). Transposed copies are
// [H][D][Tpad]: token-contiguous, because mma/wgmma FP8 needs both operands contiguous along
// the reduction and P·V, Pᵀ·dO, dSᵀ·Q, dS·K reduce over tokens. In them every document is
// padded to a multiple of 16 tokens and starts at padded position
//     pstart(b) = roundup16(cu[b]) + 16 b            (closed form, non-overlapping),
// so each document starts 16-byte aligned; Tpad = roundup16(T) + 16 B. Inside each group
// of 16 tokens the bytes are in "fragment order": position p = 4 qd + bb holds token
// 8 (bb >> 1) + 2 qd + (bb & 1) of the group, so that the FP32 accumulator registers of
// P or dS pack straight into an mma A fragment (see src/sm90/fragments.cuh). Padding is
// zero. Recipe fp8_mixed's backward takes q, k and dO in BF16 for its dS and dV products: it
// reads them from the caller's tensors, as its B operands in their natural layout (16-bit
// wgmma operands may be MN-major), so no copy of them is kept. Per-token scales are FP32
// powers of two stored [H][T] (a tile's 64 scales are one contiguous 256-byte read). A
// non-finite row has a NaN scale and zero codes (quantize.cu); with fp8_mixed the quantizer
// also raises a flag word (`nonfinite`), so that the backward zeroes such rows of its BF16
// operands (docs/ALGORITHM.md §3).
//
// Regions read by the forward come first and do not depend on for_backward or the recipe,
// so a buffer filled for the backward also serves the forward. Recipe fp8's transposed FP8
// q and k are not in qkv8: the backward transposes q8 and k8 into its workspace, so qkv8 —
// what a caller keeps from the forward to the backward — is 0.6-0.7x the BF16 q, k, v.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flamia/flamia.h"
#include "flamia/formats.h"
#include "common/tiles.h"
#include "quantize/guard.h"

namespace flamia {
namespace quant {

constexpr int kTokenGroup = 16;   // padding granule of the transposed copies
constexpr size_t kRegionAlign = 256;

FLAMIA_HD int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

FLAMIA_HD int64_t padded_tokens(int64_t total_tokens, int64_t num_docs) {
  return round_up(total_tokens, kTokenGroup) + kTokenGroup * num_docs;
}

FLAMIA_HD int64_t padded_doc_start(int64_t doc_first_token, int64_t doc) {
  return round_up(doc_first_token, kTokenGroup) + kTokenGroup * doc;
}

// Token (0..15) stored at fragment-order position p (0..15) of a 16-token group.
FLAMIA_HD int fragment_order_token(int p) { return 8 * ((p & 3) >> 1) + 2 * (p >> 2) + (p & 1); }

// Work lists: one over 64-token tiles (backward kernels and the reference forward, whose
// tiles are all 64), one over 128-row query tiles (the fast forward at D = 128, the backward)
// and, at D = 64, one over the fast forward's 192-row items. A document of L
// tokens has ceil(L / tile) tiles, so a pack has at most ceil(T / tile) + B of them.
static_assert(tiles::kRefFwdBlockN == tiles::kBwdBlockM && tiles::kBwdBlockM == tiles::kBwdBlockN,
              "the 64-token work list assumes one tile size");
constexpr int kTile = tiles::kBwdBlockM;
constexpr int kFwdTile = tiles::kFwdBlockM;
constexpr int kFwdTile64 = tiles::kFwdBlockM64;
FLAMIA_HD int64_t max_tiles_per_doc(int64_t total_tokens, int tile = kTile) {
  return (total_tokens + tile - 1) / tile;
}

// Regions of one work list in qkv8.
struct WorkListRegions {
  int tile = kTile;
  int64_t capacity = 0;  // entries
  int64_t nt_cap = 0;    // bound on tiles per document
  size_t count = 0;      // int: number of work items
  size_t next = 0;       // int, beside count: the fast forward's next work item (its guard zeroes it)
  size_t items = 0;      // int2 [capacity]: (document, tile)
  size_t scratch = 0;    // int [3 (nt_cap + 1)]: counting-sort scratch
};

class Builder {
 public:
  size_t add(size_t bytes) {
    const size_t at = size_;
    size_ = (size_ + bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

inline WorkListRegions add_work_list(Builder& b, int64_t total_tokens, int64_t num_docs, int tile) {
  WorkListRegions w;
  w.tile = tile;
  w.nt_cap = max_tiles_per_doc(total_tokens, tile);
  w.capacity = w.nt_cap + num_docs;
  w.count = b.add(2 * sizeof(int));
  w.next = w.count + sizeof(int);
  w.items = b.add(size_t(w.capacity) * 2 * sizeof(int));
  w.scratch = b.add(size_t(3 * (w.nt_cap + 1)) * sizeof(int));
  return w;
}

// The quantizer beside the fast forward (quantize_qkv with beside): the forward's CTAs start
// while the quantizer runs on a share of the SMs and wait, instead of for the whole grid, for
// counts the quantizer raises as it finishes: one a (kv block, 128-position block) — a kv
// block is the forward's block of kv heads (common/work_order.h), its q, k and v heads —, one
// a kv block, and one for the work lists. Indices into qkv8's `ready` ints; kv blocks number
// at most hkv.
struct BesideReady {
  static constexpr int kBlockPositions = 128;  // a quantizer block's padded positions
  FLAMIA_HD static int64_t chunks(int64_t tpad) { return (tpad + kBlockPositions - 1) / kBlockPositions; }
  FLAMIA_HD static int64_t ints(int64_t tpad, int hkv) { return (chunks(tpad) + 1) * hkv + 1; }
  FLAMIA_HD static int64_t block(int64_t tpad, int kb, int64_t chunk) { return kb * chunks(tpad) + chunk; }
  FLAMIA_HD static int64_t kv_done(int64_t tpad, int hkv, int kb) { return hkv * chunks(tpad) + kb; }
  FLAMIA_HD static int64_t lists(int64_t tpad, int hkv) { return (chunks(tpad) + 1) * hkv; }
  // What a (kv block, position block) count reaches when complete: the kv block's q, k and v heads.
  FLAMIA_HD static int block_units(int kv_block, int hq, int hkv) { return kv_block * (hq / hkv + 2); }
};

struct Qkv8Layout {
  int64_t total_tokens = 0, num_docs = 0;
  int64_t tpad = 0;
  // Forward regions.
  size_t q8 = 0, k8 = 0, vt8 = 0;           // [T,Hq,D], [T,Hkv,D], [Hkv][D][Tpad]
  size_t sq = 0, sk = 0, sv = 0;            // fp32 [H][T]
  WorkListRegions work;                     // 64-token tiles
  WorkListRegions fwd_work;                 // 128-token tiles: the fast forward at D = 128, the backward
  WorkListRegions fwd_work64;               // 192-token tiles: the fast forward at D = 64 (else capacity 0)
  size_t status = 0;                        // guard::DeviceError of the last call (guard.h)
  size_t fingerprint = 0;                   // uint64: what the contents were quantized for
  // The quantizer beside the fast forward (BesideReady): int counts, zeroed before each call.
  size_t ready = 0;
  // Backward-only regions (0 when absent).
  size_t v8 = 0;                            // [T,Hkv,D]
  size_t nonfinite = 0;                     // fp8_mixed: uint32, nonzero when a q or k row is not finite
                                            // (fp8's FP8 Qᵀ, Kᵀ live in the backward workspace)
  size_t bytes = 0;

  // The fast forward's list: its items and its work counter (`next`).
  const WorkListRegions& fast_forward_work() const { return fwd_work64.capacity > 0 ? fwd_work64 : fwd_work; }

  static Qkv8Layout make(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                         flamia_recipe recipe, bool for_backward) {
    Qkv8Layout l;
    const size_t T = size_t(total_tokens), D = size_t(head_dim);
    l.total_tokens = total_tokens;
    l.num_docs = num_docs;
    l.tpad = padded_tokens(total_tokens, num_docs);
    Builder b;
    l.q8 = b.add(T * hq * D);
    l.k8 = b.add(T * hkv * D);
    l.vt8 = b.add(size_t(hkv) * D * size_t(l.tpad));
    l.sq = b.add(T * hq * sizeof(float));
    l.sk = b.add(T * hkv * sizeof(float));
    l.sv = b.add(T * hkv * sizeof(float));
    l.work = add_work_list(b, total_tokens, num_docs, kTile);
    l.fwd_work = add_work_list(b, total_tokens, num_docs, kFwdTile);
    if (head_dim == 64) l.fwd_work64 = add_work_list(b, total_tokens, num_docs, kFwdTile64);
    l.status = b.add(sizeof(guard::DeviceError));
    l.fingerprint = b.add(sizeof(uint64_t));
    l.ready = b.add(BesideReady::ints(l.tpad, hkv) * sizeof(int));
    if (for_backward) {
      l.v8 = b.add(T * hkv * D);
      if (recipe == FLAMIA_RECIPE_FP8_MIXED) l.nonfinite = b.add(sizeof(uint32_t));
    }
    l.bytes = b.size();
    return l;
  }
};

// Backward workspace: quantized dO in both layouts, its scales, and D = rowsum(dO8 * O); with
// recipe fp8 also Qᵀ and Kᵀ in FP8, transposed from qkv8's q8 and k8 at the backward's start,
// so that qkv8 (what a caller keeps from the forward to the backward) holds no copy of them.
struct BwdWorkspaceLayout {
  int64_t tpad = 0;
  size_t do8 = 0;   // [T,Hq,D]
  size_t dot8 = 0;  // [Hq][D][Tpad] FP8 (fp8; fp8_mixed's dV product reads the caller's BF16 dO)
  size_t sdo = 0;   // fp32 [Hq][T]
  size_t dvec = 0;  // fp32 [Hq][T]
  size_t lse2 = 0;  // fp32 [Hq][T]: LSE * log2(e), NaN where dO's row is not finite
  size_t qt = 0, kt = 0;  // fp8: FP8 [Hq][D][Tpad], [Hkv][D][Tpad] (0 with fp8_mixed)
  size_t status = 0;  // guard::DeviceError of the last backward (guard.h)
  size_t nonfinite = 0;  // fp8_mixed: uint32, nonzero when a dO row is not finite
  size_t dq_acc = 0;  // fp32 [T,Hq,D]: the fused dQ's sums (dq_accumulator only; last, so that
                      // the offsets before it do not depend on it)
  size_t ds = 0;      // the stored dS (stored_ds bytes, FLAMIA_BWD_DQ=hbm only; after dq_acc,
                      // which the two modes never both use)
  size_t bytes = 0;

  static BwdWorkspaceLayout make(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                                 flamia_recipe recipe, bool dq_accumulator = false, size_t stored_ds = 0) {
    BwdWorkspaceLayout l;
    const size_t T = size_t(total_tokens), D = size_t(head_dim);
    l.tpad = padded_tokens(total_tokens, num_docs);
    Builder b;
    l.do8 = b.add(T * hq * D);
    if (recipe == FLAMIA_RECIPE_FP8) l.dot8 = b.add(size_t(hq) * D * size_t(l.tpad));
    l.sdo = b.add(T * hq * sizeof(float));
    l.dvec = b.add(T * hq * sizeof(float));
    l.lse2 = b.add(T * hq * sizeof(float));
    if (recipe == FLAMIA_RECIPE_FP8) {
      l.qt = b.add(size_t(hq) * D * size_t(l.tpad));
      l.kt = b.add(size_t(hkv) * D * size_t(l.tpad));
    }
    l.status = b.add(sizeof(guard::DeviceError));
    if (recipe == FLAMIA_RECIPE_FP8_MIXED) l.nonfinite = b.add(sizeof(uint32_t));
    if (dq_accumulator) l.dq_acc = b.add(T * hq * D * sizeof(float));
    if (stored_ds > 0) l.ds = b.add(stored_ds);
    l.bytes = b.size();
    return l;
  }
};

}  // namespace quant
}  // namespace flamia
