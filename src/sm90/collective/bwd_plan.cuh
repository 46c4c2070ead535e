// The backward's shape: its kernel parameters, the two passes' CTAs (two warpgroups of 64
// rows sharing the other side's stages; three for fp8_mixed's dK/dV pass at D = 64), the
// streamed ring's depth, tile sizes and the shared-memory plans of the dK/dV pass, the dQ pass
// and the stored dS's dQ GEMM. The algorithm and the passes: kernels/backward.cu.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/tiles.h"
#include "quantize/guard.h"
#include "sm90/schedule.cuh"
#include "sm90/scores_wgmma.cuh"
#include "sm90/tile_io.cuh"

namespace flamia {
namespace sm90 {
namespace bwd {

struct BwdArgs {
  // The streamed tiles (TMA): row tiles box D x 1 x 64 tokens, D-byte swizzle; the B
  // operands of the products over tokens are fp8's column tiles (box 64 positions x D of a
  // transposed FP8 copy, 64-byte swizzle) or fp8_mixed's natural BF16 rows of the caller's
  // tensors (box 128 bytes x 1 x 64 tokens, 128-byte swizzle, bwd_natural_rows.cuh).
  CUtensorMap q8_rows;  // q8 [T][Hq][D]
  CUtensorMap do8_rows; // do8 [T][Hq][D]
  CUtensorMap k8_rows;  // k8 [T][Hkv][D]
  CUtensorMap v8_rows;  // v8 [T][Hkv][D]
  CUtensorMap q_b;      // B of dK: Qᵀ [Hq * D][Tpad] (fp8), q [T][Hq][D] BF16 (fp8_mixed)
  CUtensorMap k_b;      // B of dQ: Kᵀ [Hkv * D][Tpad], or k [T][Hkv][D]
  CUtensorMap do_b;     // B of dV: dOᵀ [Hq * D][Tpad], or dO [T][Hq][D]
  // fp8_mixed: the quantizers' flags of non-finite q or k rows (qkv8) and dO rows
  // (workspace); null with fp8.
  const uint32_t* nonfinite_qk;
  const uint32_t* nonfinite_do;
  // The tiles loaded once per CTA (cp.async).
  const uint8_t* q8;    // [T, Hq, D]
  const uint8_t* k8;    // [T, Hkv, D]
  const uint8_t* v8;    // [T, Hkv, D]
  const uint8_t* do8;   // [T, Hq, D]
  const float* sq;      // [Hq][T]
  const float* sk;      // [Hkv][T]
  const float* sv;      // [Hkv][T]
  const float* sdo;     // [Hq][T]
  const float* dvec;    // [Hq][T]  D = rowsum(dO8 * O) (ALGORITHM.md §3)
  const float* lse2;    // [Hq][T]  the forward's LSE * log2(e), NaN for a non-finite dO row (workspace)
  const guard::DeviceError* status;  // the backward's status word (workspace)
  const int32_t* cu_seqlens;
  const int32_t* q_start;  // [B] or null (flamia.h)
  WorkList work;  // 128-token tiles: the dK/dV pass's key tiles, the dQ pass's query tiles
  WorkList items; // 192-token tiles (the fast forward's list): the key tiles of a dK/dV pass of three warpgroups
  uint16_t* dq;         // bf16 [T, Hq, D]
  float* dq_acc;        // fp32 [T, Hq, D], zeroed: the fused dQ's sums (workspace), else null
  uint16_t* dk;         // bf16 [T, Hkv, D]
  uint16_t* dv;         // bf16 [T, Hkv, D]
  // dk, dv and dq as natural maps (the box a 64-row tile) for the dK/dV and dQ passes' TMA
  // stores, when all are 16-byte aligned (rows_by_tma); else each row by its threads' stores.
  CUtensorMap dk_rows, dv_rows, dq_rows;
  bool rows_by_tma;
  int64_t total_tokens;
  int hq, hkv;
  int kv_block;         // kv heads a block of the CTA order over all kv heads (order::backward_kv_block)
  bool causal;
  float c;              // softmax_scale * log2(e)
  float softmax_scale;
  // The stored dS (FLAMIA_BWD_DQ=hbm), else null / 0.
  uint8_t* ds;                 // the stored tiles (StoredDsRun addresses them)
  const int64_t* ds_doc_base;  // [B]: a document's first tile in a head's run (ds_doc_bases)
  int64_t ds_head_tiles;       // tiles a head's run holds (a bound over every document)
  int ds_hk0, ds_hkv;          // this launch's slab of kv heads: [ds_hk0, ds_hk0 + ds_hkv)
};
static_assert(sizeof(BwdArgs) <= 4096, "a kernel parameter block holds at most 4 KB");

// The list a dK/dV pass of `warpgroups` walks (DkdvSmem::kWarpgroups): its key tiles are 64
// tokens a warpgroup.
__host__ __device__ inline const WorkList& dkdv_list(const BwdArgs& a, int warpgroups) {
  return warpgroups == 3 ? a.items : a.work;
}

// Both passes run CTAs of two warpgroups, each owning 64 rows (keys for dK/dV, queries for
// dQ) of a 128-token tile and sharing every stage of the other side, so each byte loaded
// feeds the products of 128 rows (a 64-row CTA was waiting on memory: docs/PERFORMANCE.md
// v6b, v7). A warpgroup holds its rows' accumulators and a fresh product (up to ~224
// registers): one CTA of 256 threads per SM. Both walk the 128-token work list — except
// fp8_mixed's dK/dV pass at D = 64 without the stored dS: its step fits 168 registers (with
// ~3 local loads a step; fp8's would spill 248 bytes), so its CTAs are three warpgroups (192
// keys, the 192-token list), three warps a scheduler to cover each warp's dependent chain
// (docs/PERFORMANCE.md v87).
constexpr int kDkdvWarpgroups = 2;
constexpr int kDkdvThreads = kDkdvWarpgroups * kThreads;
template <int D, bool kMixed, bool kFused, bool kStoreDs>
constexpr int kDkdvWarpgroupsOf = D == 64 && kMixed && !kFused && !kStoreDs ? 3 : kDkdvWarpgroups;
constexpr int kDqWarpgroups = 2;
constexpr int kDqThreads = kDqWarpgroups * kThreads;
// At D = 64 the dQ CTA fits in 128 registers a thread: two CTAs (16 warps) per SM.
template <int D>
constexpr int kDqCtasPerSm = D == 64 ? 2 : 1;
// The streamed side's ring: three stages. The dK/dV pass loads one step ahead, so a
// warpgroup can run up to two steps ahead of the other before a refill waits for it (two
// ahead, which holds them within a step, was slower: docs/PERFORMANCE.md v128); the dQ pass
// loads two key tiles ahead (its next tile's products start mid-step, v128c). The fused dQ's
// dK/dV pass has two: its dS and Kᵀ tiles take the third's shared memory, and its
// warpgroups meet every step anyway.
constexpr int kBwdStages = 3;
static_assert(kDkdvWarpgroups * kTileTokens == tiles::kFwdBlockM &&
                  kDqWarpgroups * kTileTokens == tiles::kFwdBlockM,
              "the backward's two-warpgroup CTAs walk the 128-token work list");
static_assert(3 * kTileTokens == tiles::kFwdBlockM64, "a three-warpgroup dK/dV CTA walks the 192-token list");

// A BF16 tile's row of 64 values (a stored dS tile's, the fused dQ's dS buffers).
constexpr int kBf16ColRowBytes = 2 * kTileTokens;

// A row tile (64 tokens x D codes) and a column tile (D x 64 positions) are both 64 D bytes.
// Swizzled tiles start at multiples of the largest swizzle atom (8 rows x 128 bytes).
template <int D>
constexpr int kTmaTileBytes = kTileTokens * D;
// The B tile of a product over tokens: FP8 columns (D x 64 positions), or with fp8_mixed
// BF16 natural rows (64 tokens x D values, bwd_natural_rows.cuh).
template <int D, bool kMixed>
constexpr int kDsColTileBytes = kMixed ? D * kBf16ColRowBytes : kTmaTileBytes<D>;
constexpr int kSwizzleAlign = 1024;
constexpr int align_up(int x, int a) { return (x + a - 1) / a * a; }

template <int D, bool kMixed, bool kFused = false, bool kStoreDs = false>
struct DkdvSmem {
  static constexpr int kWarpgroups = kDkdvWarpgroupsOf<D, kMixed, kFused, kStoreDs>;
  static constexpr int kCtaThreads = kWarpgroups * sm90::kThreads;
  static constexpr int kStages = kFused ? 2 : kBwdStages;
  // Warpgroup w's keys at keys(w): its K (A of Sᵀ) and V (A of dPᵀ) tiles and key scales.
  static constexpr int kK = 0;
  static constexpr int kV = kK + ScoreTile<D>::kBytes;
  static constexpr int kSk = kV + ScoreTile<D>::kBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kKeyBytes = kSv + kScalarTileBytes;
  static constexpr int keys(int w) { return w * kKeyBytes; }
  // After its last step a warpgroup's keys are dead: its dK and then its dV rows go out
  // through the swizzle-aligned part of them (store_rows_tma), a bf16 tile of 64 rows.
  static constexpr int rows_out(int w) { return align_up(keys(w), kSwizzleAlign); }
  static_assert(rows_out(kWarpgroups - 1) + kTileTokens * D * 2 <= keys(kWarpgroups - 1) + kKeyBytes,
                "a warpgroup's dK or dV tile fits in its keys");
  // The fused dQ only. The CTA's k in BF16 (B of dQ = dS K): chunk w holds warpgroup w's 64
  // keys, natural rows (bwd_natural_rows.cuh). Two dS
  // buffers (A of dQ), alternating by step: chunk w of a buffer is warpgroup w's dS,
  // 64 query rows of its 64 keys (128 bytes, 128-byte swizzle).
  static constexpr int kKtChunk = D * kBf16ColRowBytes;
  static constexpr int kDsChunk = kTileTokens * kBf16ColRowBytes;
  static constexpr int kDsBuffer = kDkdvWarpgroups * kDsChunk;
  static constexpr int kKt = align_up(kWarpgroups * kKeyBytes, kSwizzleAlign);
  static constexpr int kDs = kKt + (kFused ? kDkdvWarpgroups * kKtChunk : 0);
  // The stored dS (kStoreDs): fp8_mixed uses the same two buffers, each warpgroup its own
  // chunk; fp8 two buffers of FP32 staging, 64 query rows of the warpgroup's 64 keys each.
  static constexpr int kStagingRowFloats = kTileTokens + 4;  // +4: conflict-free column writes
  static constexpr int kStagingChunk = kTileTokens * kStagingRowFloats * 4;
  static constexpr int kStoreBytes = !kStoreDs ? 0 : kMixed ? 2 * kDsBuffer : 2 * kDkdvWarpgroups * kStagingChunk;
  static constexpr int kStage0 = align_up(kDs + (kFused ? 2 * kDsBuffer : kStoreBytes), kSwizzleAlign);
  // One stage: a query tile of one head, read by every warpgroup. The TMA tiles first
  // (kTmaBytes, swizzle-aligned), then the per-query values sq, sdo, LSE, D (cp.async).
  static constexpr int kQ = 0;                                // B of Sᵀ: Q rows
  static constexpr int kDo = kQ + kTmaTileBytes<D>;           // B of dPᵀ: dO rows
  static constexpr int kDot = kDo + kTmaTileBytes<D>;         // B of dV: dOᵀ columns (FP8) or dO rows (BF16)
  static constexpr int kQt = kDot + kDsColTileBytes<D, kMixed>;  // B of dK: Qᵀ columns (FP8) or q rows (BF16)
  static constexpr int kTmaBytes = kQt + kDsColTileBytes<D, kMixed>;
  static constexpr int kSqT = kTmaBytes;
  static constexpr int kSdoT = kSqT + kScalarTileBytes;
  static constexpr int kLseT = kSdoT + kScalarTileBytes;
  static constexpr int kDvecT = kLseT + kScalarTileBytes;
  static constexpr int kStageBytes = align_up(kDvecT + kScalarTileBytes, kSwizzleAlign);
  static constexpr int kFull = kStage0 + kStages * kStageBytes;  // the ring's mbarriers
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kKtFull = kEmpty + 8 * kStages;  // the fused dQ's Kᵀ landed
  static constexpr int kBytes = kKtFull + 8;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static_assert(kAlloc <= 227 * 1024, "the dK/dV pass's shared memory");
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

// A stored tile: fp8_mixed's BF16 image (8 KB), or fp8's q8(dS sk / rho) codes as a 64-byte-
// swizzled K-major FP8 image (4 KB, keys in the transposed copies' fragment order, as dQ's
// register operand holds them) followed by the 64 rows' rho (256 bytes).
constexpr int kDsTileBytes = kTileTokens * kBf16ColRowBytes;
constexpr int kDsCodesBytes = kTileTokens * kTileTokens;
constexpr int kDsRhoBytes = kTileTokens * 4;
template <bool kMixed>
constexpr int kStoredTileBytes = kMixed ? kDsTileBytes : kDsCodesBytes + kDsRhoBytes;

template <int D, bool kMixed>
struct DqSmem {
  // Warpgroup w's queries at queries(w): its Q (A of S) and dO (A of dP) tiles and the
  // per-query values, read from shared memory where used (registers are the scarce resource).
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + ScoreTile<D>::kBytes;
  static constexpr int kSq = kDo + ScoreTile<D>::kBytes;
  static constexpr int kSdo = kSq + kScalarTileBytes;
  static constexpr int kLse = kSdo + kScalarTileBytes;
  static constexpr int kDvec = kLse + kScalarTileBytes;
  static constexpr int kQueryBytes = kDvec + kScalarTileBytes;
  static constexpr int queries(int w) { return w * kQueryBytes; }
  // After its last step a warpgroup's Q and dO are dead: its dQ rows leave through them
  // (store_rows_tma), a bf16 tile of 64 rows at a swizzle-aligned address.
  static_assert(kQueryBytes % kSwizzleAlign == 0 && kDo + ScoreTile<D>::kBytes == kTileTokens * D * 2,
                "a warpgroup's dQ tile is its Q and dO");
  static constexpr int kStage0 = align_up(kDqWarpgroups * kQueryBytes, kSwizzleAlign);
  // One stage: a key tile, read by both warpgroups. The TMA tiles first (kTmaBytes,
  // swizzle-aligned), then the key scales sk, sv (cp.async).
  static constexpr int kK = 0;                             // B of S: K rows
  static constexpr int kV = kK + kTmaTileBytes<D>;         // B of dP: V rows
  static constexpr int kKt = kV + kTmaTileBytes<D>;        // B of dQ: Kᵀ columns (FP8) or k rows (BF16)
  static constexpr int kTmaBytes = kKt + kDsColTileBytes<D, kMixed>;
  static constexpr int kSk = kTmaBytes;
  static constexpr int kSv = kSk + kScalarTileBytes;
  static constexpr int kStageBytes = align_up(kSv + kScalarTileBytes, kSwizzleAlign);
  static constexpr int kFull = kStage0 + kBwdStages * kStageBytes;  // the ring's mbarriers
  static constexpr int kEmpty = kFull + 8 * kBwdStages;
  static constexpr int kBytes = kEmpty + 8 * kBwdStages;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

// The dQ GEMM of the stored dS (FLAMIA_BWD_DQ=hbm): the dQ pass's CTAs and order (128
// queries, two warpgroups sharing each key tile, tiles ascending), but each key tile's
// product takes its A operand from the tile the dK/dV pass stored instead of forming it:
// fp8_mixed chains the BF16 k16 steps of bf16(dS) · K onto dQ from zero; fp8 forms
// codes · Kᵀ in a fresh accumulator and folds it with the rows' rho (fmaf, as the dQ
// pass). The same operands and steps as the deterministic pass, so the same bits. A stage:
// the key tile's Kᵀ (TMA, as the dQ pass streams it) and the two warpgroups' stored tiles
// (bulk copies), all announced to one mbarrier by the elected thread; nothing per thread,
// so the stages are all bytes and the pass reads them at HBM speed.
template <int D, bool kMixed>
struct DqStoredSmem {
  static constexpr int kKt = 0;                                 // B: Kᵀ columns or k rows
  static constexpr int kKtBytes = kDsColTileBytes<D, kMixed>;  // BF16 or FP8
  // A: warpgroup w's image at kDs + w * kImageBytes (1024-aligned); fp8's rho after both.
  static constexpr int kImageBytes = kMixed ? kDsTileBytes : kDsCodesBytes;
  static constexpr int kDs = kKt + kKtBytes;
  static constexpr int kRho = kDs + kDqWarpgroups * kImageBytes;
  static constexpr int kStageBytes = align_up(kRho + (kMixed ? 0 : kDqWarpgroups * kDsRhoBytes), kSwizzleAlign);
  static constexpr int kTxBytes = kKtBytes + kDqWarpgroups * kStoredTileBytes<kMixed>;
  // Two CTAs a SM where the registers allow (all but fp8 at D = 128, whose fresh accumulator
  // and sum take 176): each with three stages (fp8_mixed at D = 128: 96 KB), or one CTA with
  // six, so that an SM keeps ~100 KB of tiles in flight either way (the pass is HBM-bound).
  static constexpr bool kTwoCtas = kMixed || D == 64;
  static constexpr int kStages = kTwoCtas ? 3 : 6;
  static constexpr int kFull = kStages * kStageBytes;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kBytes = kEmpty + 8 * kStages;
  static constexpr int kAlloc = kBytes + kSwizzleAlign;
  static_assert(kDs % kSwizzleAlign == 0 && kImageBytes % kSwizzleAlign == 0, "the images stay swizzle-aligned");
  static_assert(kAlloc <= 227 * 1024, "the stored dQ's shared memory");
  static constexpr int stage(int s) { return s * kStageBytes; }
  static constexpr int full(int s) { return kFull + 8 * s; }
  static constexpr int empty(int s) { return kEmpty + 8 * s; }
};

}  // namespace bwd
}  // namespace sm90
}  // namespace flamia
