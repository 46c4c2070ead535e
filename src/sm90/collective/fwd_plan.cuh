// The fast forward's shape: roles, tiles, pipeline depth and shared-memory plan, the kernel
// parameters and the work order. One CTA per SM (persistent); 1 + kConsumers warpgroups:
//   warpgroup 0   producer: one warp takes the CTA's work items from a counter, issues the
//                 TMA loads and copies the key scales, a second derives P's key-rule scale
//                 of each tile from them;
//   warpgroups 1.. consumers: 64 query rows each of the CTA's query tile — two (128 rows) at
//                 D = 128, three (192 rows) at D = 64, where a consumer warp's own dependent
//                 chain binds and a third warp a scheduler covers it (docs/PERFORMANCE.md v85).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/tiles.h"
#include "common/work_order.h"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/schedule.cuh"

namespace flamia {
namespace sm90 {
namespace fwd {

template <int D>
struct Plan {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int kConsumers = D == 64 ? 3 : 2;
  static constexpr int kRowsPerConsumer = 64;                 // one wgmma M
  static constexpr int kBlockM = kConsumers * kRowsPerConsumer;  // query rows per work item
  static constexpr int kBlockN = tiles::kFwdBlockN;             // keys per key tile
  static_assert(kBlockM == (D == 64 ? tiles::kFwdBlockM64 : tiles::kFwdBlockM), "the quantizer's list of items");
  static_assert(kBlockN == 128, "the mainloop is written for m64 x n128 tiles");
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // Key/value stages in flight: the producer refills a stage only after both consumers'
  // P·V of it, so two stages leave one tile of slack for the loads; more hide HBM latency.
  static constexpr int kStages = D == 128 ? 3 : 4;
  // A consumer may hold its last tile's stage and leave the item's one tile more (a 192-row
  // item's last consumer sees one more on the diagonal) unreleased while it waits for the next
  // item's first: with two stages that wait would be on itself (fwd_consumer.cuh).
  static_assert(kStages >= 3, "consumers that compute fewer of an item's tiles need a third stage");
  // Registers per thread after setmaxnreg, within the 64 K of the SM: at D = 128,
  // 128 * 40 + 256 * 232 = 384 * 168, the CTA's allocation at launch. The consumers hold O
  // (D/2 per thread), the tile's fresh P·V product (D/2) and the next tile's scores (64, in
  // flight) at once, which 232 still holds without spills (224 does not, at D = 128); the
  // producer warp issues TMA and copies scales, the key-scale warp scans 4 scales a lane — at
  // 24 registers they spilled 104-120 bytes, at 40 12-20. At D = 64, 128 * 32 + 384 * 160 =
  // 512 * 128: three consumers fit only at 160 (kScoresInFlight).
  static constexpr int kProducerRegs = D == 64 ? 32 : 40;
  static constexpr int kConsumerRegs = D == 64 ? 160 : 232;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= warpgroup::launch_registers(kThreads),
                "the register split fits the launch's registers (setmaxnreg moves only those)");
  // Whether a consumer keeps the next tile's S in flight while it folds P·V (64 more
  // registers a thread; fwd_consumer.cuh).
  static constexpr bool kScoresInFlight = D == 128;
  // Whether an unmasked tile's p are formed before its maximum (softmax_tile_lazy): at D = 64
  // the pass's t, P8 and sums beside O spill the three consumers' 160 registers.
  static constexpr bool kSpeculativeSoftmax = D == 128;
  // Whether a tile's row sums reach l in the fold (in S's shadow, after P·V and the next S
  // are issued) rather than at the softmax's end: −0.7 to −1.6 % at D = 128, +1.0 % at D = 64
  // (docs/PERFORMANCE.md v110), whose S is issued after the fold.
  static constexpr bool kSumsInFold = D == 128;
  // Whether the maxima-first softmax packs P8 as it forms each pair of n8-tiles, as the lazy
  // pass does, rather than after every exp: −0.7 % at D = 128 (its masked tiles and retakes),
  // +0.5 % at D = 64 (docs/PERFORMANCE.md v122), and no gain there at the power cap (v130).
  static constexpr bool kPackAsFormed = D == 128;

  // Operand rows: Q and K rows are one token's D codes (D-byte swizzle), Vᵀ rows one d's 128
  // key codes (128-byte swizzle).
  static constexpr int kQKRowBytes = D;
  static constexpr int kVtRowBytes = kBlockN;

  // Q buffers. With two the producer loads the next item's Q while the consumers still work
  // on the current one; measured no faster than one (docs/PERFORMANCE.md v52b), whose Q lands
  // while the item's last tile is computed.
  static constexpr int kQBuffers = 1;

  // Shared memory, offsets from a 1024-byte aligned base (swizzle atoms must not straddle).
  static constexpr int kQTile = kRowsPerConsumer * D;
  static constexpr int kKTile = kBlockN * D;
  static constexpr int kVtTile = D * kBlockN;
  static constexpr int kScaleBytes = kBlockN * 4;
  static constexpr int kQBufBytes = kConsumers * kQTile;
  static constexpr int kQ = 0;  // buffer b's Q rows of consumer c at kQ + b * kQBufBytes + c * kQTile
  static constexpr int kStage0 = kQ + kQBuffers * kQBufBytes;
  // A stage: K and Vᵀ (TMA), the key scales sk, sv (the producer's cp.async), and what the
  // key-scale warp derives from sv for P's scale (ALGORITHM.md §2 step 5): svn = sv / sigma of
  // the whole tile (sk's order), the prefix maxima of sv in key order, and sigma itself.
  static constexpr int kK = 0, kVt = kKTile, kSk = kVt + kVtTile, kSv = kSk + kScaleBytes;
  static constexpr int kSvn = kSv + kScaleBytes, kYpre = kSvn + kScaleBytes, kSigma = kYpre + kScaleBytes;
  // int: the tile's keys inside the document (the producer's, for the key-scale warp; 0 ends
  // the key-scale warp's walk).
  static constexpr int kValid = kSigma + 4;
  static constexpr int kStageBytes = (kSigma + 16 + 1023) / 1024 * 1024;
  static_assert(kKTile % 1024 == 0 && kVtTile % 1024 == 0, "aligned tiles");
  // Each consumer's O rows on their way out (kit/rows_out.cuh): 64 rows of D bf16.
  static constexpr int kOutTile = kRowsPerConsumer * D * 2;
  static constexpr int kOut0 = kStage0 + kStages * kStageBytes;
  static_assert(kOutTile % 1024 == 0, "a swizzled tile of rows");
  static constexpr int kBarriers = kOut0 + kConsumers * kOutTile;
  // mbarriers (8 bytes each): q_full[kQBuffers], q_empty[kQBuffers], full[kStages],
  // empty[kStages], ready[kStages].
  static constexpr int kQFull0 = kBarriers, kQEmpty0 = kQFull0 + 8 * kQBuffers;
  static constexpr int kFull0 = kQEmpty0 + 8 * kQBuffers, kEmpty0 = kFull0 + 8 * kStages,
                       kReady0 = kEmpty0 + 8 * kStages;
  // Beside each Q buffer, what q_full announces with it (the producer's): the item, decoded
  // (ItemSlot), and the per-token scales of its kBlockM query rows, copied by cp.async.
  static constexpr int kSlot0 = kReady0 + 8 * kStages;
  static constexpr int kSlotBytes = 64 + kBlockM * 4;
  static constexpr int kSlotSq = 64;  // offset of the rows' sq in a slot
  static constexpr int kBytes = kSlot0 + kQBuffers * kSlotBytes;
  static constexpr int kAlloc = kBytes + 1024;  // room to align the dynamic base
  static_assert(kAlloc <= 227 * 1024, "the forward's shared memory (one CTA an SM)");

  __host__ __device__ static constexpr int stage(int s) { return kStage0 + s * kStageBytes; }
  __host__ __device__ static constexpr int q_buffer(int b) { return kQ + b * kQBufBytes; }
  __host__ __device__ static constexpr int slot(int b) { return kSlot0 + b * kSlotBytes; }
  __host__ __device__ static constexpr int out_tile(int c) { return kOut0 + c * kOutTile; }
  // Arrivals that complete a phase: full and q_full = the producer lane's expect_tx + 32
  // lanes' scale copies landing; empty and q_empty = every consumer thread once it is done
  // reading the stage or the slot (each releasing its own reads; Q itself is read only by the
  // warpgroup's wgmma, waited for before).
  static constexpr int kFullArrivals = 1 + 32;
  static constexpr int kEmptyArrivals = kConsumers * 128;
  static constexpr int kQFullArrivals = 1 + 32;
  static constexpr int kQEmptyArrivals = kConsumers * 128;
  static constexpr int kReadyArrivals = 32;  // the key-scale warp's lanes, each once its writes are done
  static constexpr int kTmaBytesPerStage = kKTile + kVtTile;
};

struct Params {
  CUtensorMap q8;   // [T][Hq][D] codes: box D x 1 x 64
  CUtensorMap k8;   // [T][Hkv][D] codes: box D x 1 x 128
  CUtensorMap vt8;  // [Hkv * D][Tpad] codes: box 128 x D
  const float* sq;  // [Hq][T] per-token pow2 scales
  const float* sk;  // [Hkv][T]
  const float* sv;  // [Hkv][T]
  const int32_t* cu_seqlens;
  const int32_t* q_start;  // [B] or null (flamia.h)
  WorkList work;    // Plan::kBlockM-row query tiles, costliest first
  int* next_item;   // items taken so far beyond the grid's first (all of them beside the quantizer;
                    // qkv8, zeroed by the guard)
  int kv_block;     // kv heads per block of the work order (divides hkv)
  // Beside the quantizer (quant::BesideReady): its counts, or null when it ran before; the
  // units a (kv block, position block) holds and a kv block holds.
  const int* ready = nullptr;
  int ready_block = 0, ready_kv_block = 0;
  uint16_t* out;    // bf16 [T][Hq][D]
  CUtensorMap o_rows;  // out as natural rows (launch/tensor_map.h), when rows_by_tma
  bool rows_by_tma;    // out 16-byte aligned: whole 64-row tiles leave by TMA
  float* lse;       // [Hq][T]
  int64_t total_tokens, tpad;
  int hq, hkv;
  bool causal;
  float c;          // softmax_scale * log2(e)
};

// Whether the forward runs beside the quantizer (Params::ready). The kernel that may
// (kMayBeside) reads it from the parameters; the plain one is compiled without the beside path,
// so that it carries none of its checks or registers (docs/PERFORMANCE.md, "v140 landing:
// outcome": they cost the plain path up to 1.7 % at head dim 64).
template <bool kMayBeside>
__device__ __forceinline__ bool beside_quantizer(const Params& p) {
  return kMayBeside && p.ready != nullptr;
}

// Work item w in the order of common/work_order.h (blocks of kv heads that fit the L2).
struct Item {
  DocTile dt;
  int h, hk;
  int first_query;    // the document's first query row (q_start; 0 without it)
  // Key tiles the producer loads: the most any consumer computes (consumer_key_tiles). 0:
  // nothing to compute (rows all before q_start or past the document, an empty document).
  int num_key_tiles;
};

// What the producer announces with a Q buffer: the item it decoded (the consumers read it,
// not the work list and cu_seqlens again), or none left.
struct ItemSlot {
  Item item;
  int more;  // 0: no item is left
};
static_assert(sizeof(ItemSlot) <= 64, "the slot's item fits before its scales");

// An item's rows, document-local: a document's rows are cut into 64-row blocks, one a
// consumer, and an item takes kConsumers of them — except that when the blocks do not divide
// evenly, the remainder is the document's first item. That item sees the fewest key tiles
// (causal), so the consumers left without rows idle through the cheapest item, not through
// the costliest, its last. Items stay ceil(len / kBlockM), the list's count.
struct ItemRows {
  int first;   // the item's first row
  int blocks;  // its 64-row blocks: consumers c < blocks have rows
};
template <int D>
__device__ __forceinline__ ItemRows item_rows(const DocTile& dt) {
  using P = Plan<D>;
  const int blocks = (dt.len + P::kRowsPerConsumer - 1) / P::kRowsPerConsumer;
  const int lead = blocks % P::kConsumers;  // the first item's blocks, when not 0
  if (lead == 0) return {dt.tile * P::kBlockM, P::kConsumers};
  if (dt.tile == 0) return {0, lead};
  return {(lead + (dt.tile - 1) * P::kConsumers) * P::kRowsPerConsumer, P::kConsumers};
}

// Key tiles consumer c computes of item it: those its 64 rows see, each row at least one key
// of every such tile (a tile starts at a multiple of 128 <= the rows' first, 64-aligned); 0
// when it has no rows in the item or they all lie before the document's first query
// (q_start is a multiple of 128, common/tiles.h, so 64 rows lie wholly on one side of it).
template <int D>
__device__ __forceinline__ int consumer_key_tiles(const Item& it, bool causal, int c) {
  using P = Plan<D>;
  const ItemRows rows = item_rows<D>(it.dt);
  const int r0 = rows.first + c * P::kRowsPerConsumer;
  if (c >= rows.blocks || r0 >= it.dt.len || r0 < it.first_query) return 0;
  const int key_tiles = (it.dt.len + P::kBlockN - 1) / P::kBlockN;
  return causal ? min((r0 + P::kRowsPerConsumer - 1) / P::kBlockN + 1, key_tiles) : key_tiles;
}

template <int D>
__device__ __forceinline__ Item item_at(const Params& p, int w) {
  Item it;
  const order::SlotHead sh = order::forward_item(w, item_count(p.work), p.hq, p.hkv, p.kv_block);
  it.h = sh.h;
  it.hk = it.h / (p.hq / p.hkv);
  it.dt = doc_tile(p.cu_seqlens, p.work, sh.slot);
  it.first_query = first_query(p.q_start, it.dt);
  it.num_key_tiles = 0;
#pragma unroll
  for (int c = 0; c < Plan<D>::kConsumers; ++c)
    it.num_key_tiles = max(it.num_key_tiles, consumer_key_tiles<D>(it, p.causal, c));
  return it;
}

}  // namespace fwd
}  // namespace sm90
}  // namespace flamia
