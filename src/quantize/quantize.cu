// Fused per-token FP8 quantizer (docs/ALGORITHM.md §1): one pass over bf16 q/k/v (or dO)
// writes every layout the kernels read — natural [T,H,D] FP8, transposed [H][D][Tpad] FP8
// in fragment order (layout.cuh), per-(token, head) scales — and, for dO, D = rowsum(dO8*O) from
// the codes it writes times their scale (the dO that dP is formed from, ALGORITHM.md §3).
// For recipe fp8_mixed it also raises a flag word when a row is not finite: that backward
// reads the BF16 rows themselves and must then zero such rows (layout.cuh).
// quantize_qkv also builds the work lists (work_list.cuh) in block 0 of the same grid.
//
// Work unit: one warp per 16-token group of the padded token axis of one head; a block takes
// 8 consecutive groups (128 padded positions) of one head. A group maps to one document (or
// to padding) by a 32-way warp search over the closed-form padded starts, so every padded
// position — padding included — is written exactly once and every token is quantized
// exactly once. Rows are read with 16-byte loads (D/8 lanes per row), all of a warp's rows
// in flight before the first use. The block stages its FP8 rows in shared memory (swizzled,
// conflict-free) and writes the transposed copy as 128-byte runs of each [h][d] row.
//
// Why this shape (bytes per call, e.g. fixed-4k: 403 MB read + 410 MB written = 812 MB):
// - Blocks are ordered head-fastest, so the blocks resident together cover all heads of a
//   token range: each token's [H, D] bf16 row (4 KB) and its natural FP8 row are read and
//   written as whole contiguous runs, not as 256-byte / 128-byte pieces 4 KB / 2 KB apart
//   revisited many microseconds later (poor DRAM page locality).
// - Transposed writes: one warp store covers 4 rows x 128 contiguous bytes (full sectors)
//   instead of 32 rows x 16 bytes (half sectors, completed by another warp): 8x fewer L2
//   write requests for a quarter of the bytes; scales are one 64-byte store per group.
// - The work list was a separate one-block launch whose loop did, per tile of the longest
//   document, a dependent global atomic and load (~0.3 us each): ~20 us for fixed-4k and
//   ~150 us for fixed-32k, plus a launch gap. In block 0 it is parallel and hidden.
// Expected: ~3.4-3.6 TB/s (fixed-*: ~0.23-0.24 ms, pack-128k ~0.93 ms, llama8b ~0.47 ms).
#include "quantize/quantize.cuh"

#include "common/convert.cuh"
#include "common/fast_div.h"
#include "common/grid_dependency.cuh"
#include "common/overlap.h"
#include "flamia/formats.h"
#include "quantize/guard.cuh"
#include "quantize/work_list.cuh"
#include "common/work_order.h"
// The beside quantizer's PTX (bulk copies into shared memory, mbarriers, the counts' fences).
#include "sm90/arch/mbarrier.cuh"
#include "sm90/arch/tma.cuh"
#include "sm90/ptx.cuh"
#include "sm90/launch/tensor_map.h"

namespace flamia {
namespace quant {
namespace {

constexpr int kWarps = 8;  // 16-token groups per block
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockPositions = kWarps * kTokenGroup;
static_assert(kBlockPositions == BesideReady::kBlockPositions, "the forward's counts cover the quantizer's blocks");

struct QuantTensor {
  const uint16_t* src = nullptr;      // bf16 [T, H, D], head_dim contiguous
  int64_t stride_t = 0, stride_h = 0; // elements
  const uint16_t* dot_src = nullptr;  // dO variant: O (same strides), rowdot = D from the codes and O
  int heads = 0;
  uint8_t* nat = nullptr;             // [T, H, D] FP8, or null
  uint8_t* trans = nullptr;           // [H][D][Tpad] FP8, or null
  uint32_t* nonfinite = nullptr;      // set to 1 when a row's scale is NaN (fp8_mixed), or null
  float* scale = nullptr;             // [H][T]
  float* rowdot = nullptr;            // [H][T], with dot_src
  const float* lse = nullptr;         // dO variant: the forward's LSE [H][T], and
  float* lse2 = nullptr;              // lse * log2(e), NaN for a non-finite dO row (ALGORITHM.md §3)
};

struct QuantBatch {
  QuantTensor t[3];
  const int32_t* cu = nullptr;
  int num_docs = 0;
  int heads = 0;                      // t[0].heads + t[1].heads + t[2].heads
  int64_t total_tokens = 0, tpad = 0;
  guard::GuardArgs guard;             // block 0 validates cu_seqlens first (guard.cuh)
  WorkListOut work[3];                // then builds the lists when work[0].count is set (each
                                      // one whose count is set: the third exists at D = 64 only)
  int* ready = nullptr;               // beside the forward: qkv8's counts (BesideReady)
  int kv_block = 0;                   // beside the forward: its kv heads a block
  FastDiv units_a_block, block_heads; // beside the forward: chunks * a kv block's heads, and those heads
  // Beside the forward: t[i].src as boxes of 16 tokens of one head's row (bytes), by TMA.
  CUtensorMap rows_map[3];
};

// Largest b with padded_doc_start(b) <= pos (starts strictly increase with b). Called by
// the whole warp: each step probes 32 evenly spaced documents at once.
__device__ __forceinline__ int doc_of_padded_position(const int32_t* cu, int num_docs, int64_t pos,
                                                      int lane) {
  int lo = 0, n = num_docs;  // the answer lies in [lo, lo + n)
  while (n > 1) {
    const int stride = (n + 31) / 32;
    const int probe = lo + lane * stride;
    const bool below = probe < lo + n && padded_doc_start(__ldg(cu + probe), probe) <= pos;
    // Lane 0 probes lo: true for a valid cu_seqlens; the max keeps lo in range otherwise.
    const int k = max(__popc(__ballot_sync(0xffffffffu, below)) - 1, 0);
    lo += k * stride;
    n = min(stride, n - k * stride);
  }
  return lo;
}

// The tokens of the 16-position group at padded position pos0 of document b: how many (0
// for padding or past Tpad), *tok0 the first. Clamped to the document and to [0, T): a kernel
// may run before (or beside) the one that validates cu_seqlens, so it may see any values (the
// call's outputs are then NaN, guard.cuh).
__device__ __forceinline__ int group_rows_in_doc(const int32_t* cu, int b, int64_t total_tokens, int64_t pos0,
                                                 int64_t* tok0) {
  const int64_t doc_first = __ldg(cu + b);
  const int64_t first = doc_first + (pos0 - padded_doc_start(doc_first, b));
  const int64_t last = min(int64_t(__ldg(cu + b + 1)), total_tokens);
  *tok0 = min(max(first, int64_t(0)), total_tokens);
  const int64_t left = first < 0 ? 0 : last - *tok0;
  return left <= 0 ? 0 : (left >= kTokenGroup ? kTokenGroup : int(left));
}

// group_rows_in_doc for the group at pos0, its document found by the whole warp.
__device__ __forceinline__ int group_rows(const int32_t* cu, int num_docs, int64_t total_tokens, int64_t tpad,
                                          int64_t pos0, int lane, int64_t* tok0) {
  *tok0 = 0;
  if (pos0 >= tpad) return 0;
  return group_rows_in_doc(cu, doc_of_padded_position(cu, num_docs, pos0, lane), total_tokens, pos0, tok0);
}

// group_rows for one lane alone: a binary search (its steps dependent loads, for a warp whose
// lanes each look up a different group off the critical path). Any cu_seqlens keeps it in range.
__device__ __forceinline__ int group_rows_one_lane(const int32_t* cu, int num_docs, int64_t total_tokens,
                                                   int64_t tpad, int64_t pos0, int64_t* tok0) {
  *tok0 = 0;
  if (pos0 >= tpad) return 0;
  int lo = 0, hi = num_docs - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (padded_doc_start(__ldg(cu + mid), mid) <= pos0) lo = mid;
    else hi = mid - 1;
  }
  return group_rows_in_doc(cu, lo, total_tokens, pos0, tok0);
}

// Max of |x| over the 8 bf16 of a 16-byte chunk, as bits (NaN compares above Inf, so a
// non-finite row gets a NaN scale instead of being saturated).
__device__ __forceinline__ uint32_t abs_max_bits_bf16x8(uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) m = max(m, max(w[i] & 0x7fffu, (w[i] >> 16) & 0x7fffu));
  return m;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// q8(x, s) for 8 bf16: two words of 4 E4M3 bytes, x * (1/s) with 1/s exact (power of two).
__device__ __forceinline__ uint2 quantize_bf16x8(uint4 v, float inv_scale) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __fmul_rn(bf16_lo(w[i]), inv_scale);
    f[2 * i + 1] = __fmul_rn(bf16_hi(w[i]), inv_scale);
  }
  return make_uint2(cvt::pack_e4m3x4(f[0], f[1], f[2], f[3]),
                    cvt::pack_e4m3x4(f[4], f[5], f[6], f[7]));
}

// The dot product of 8 E4M3 codes (two words, in element order) times dO's scale with 8 bf16 of
// O, in FP32 and element order: a lane's part of D = rowsum(dO8 ∘ O) (ALGORITHM.md §3). Each code
// times the scale (a power of two) and each product with O (4 by 8 significant bits) is exact:
// the sum differs from the specification's only in its order (here 8 a lane, then a tree).
__device__ __forceinline__ float dot_e4m3x8_bf16x8(uint2 codes, float scale, uint4 o) {
  const uint32_t c[2] = {codes.x, codes.y}, y[4] = {o.x, o.y, o.z, o.w};
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    float x[4];
    cvt::unpack_e4m3x4(c[w], x);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      s = __fadd_rn(s, __fmul_rn(__fmul_rn(x[2 * i], scale), bf16_lo(y[2 * w + i])));
      s = __fadd_rn(s, __fmul_rn(__fmul_rn(x[2 * i + 1], scale), bf16_hi(y[2 * w + i])));
    }
  }
  return s;
}

// Four rows' words (a, b, c, d) -> for each byte k the word [a.k, b.k, c.k, d.k].
__device__ __forceinline__ void transpose_4x4_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                                    uint32_t (&out)[4]) {
  const uint32_t ab01 = __byte_perm(a, b, 0x5140), cd01 = __byte_perm(c, d, 0x5140);
  const uint32_t ab23 = __byte_perm(a, b, 0x7362), cd23 = __byte_perm(c, d, 0x7362);
  out[0] = __byte_perm(ab01, cd01, 0x5410);
  out[1] = __byte_perm(ab01, cd01, 0x7632);
  out[2] = __byte_perm(ab23, cd23, 0x5410);
  out[3] = __byte_perm(ab23, cd23, 0x7632);
}

// Shared tile of a block's FP8 rows: [group g][token r][column quad j] (D / 4 words a row).
// Word j of a row is stored at j ^ (4g mod D/4) and row r at r ^ (g >> 2): the transpose's
// reads (8 groups x 4 quads per warp) then hit 32 distinct banks, the row writes stay
// 8-byte pairs.
template <int D>
struct StageTile {
  static constexpr int kQuads = D / 4;
  uint32_t w[kWarps][kTokenGroup][kQuads];
  __device__ __forceinline__ uint32_t* at(int g, int r, int j) {
    return &w[g][r ^ (g >> 2)][j ^ ((4 * g) % kQuads)];
  }
};

// The block's 8 staged groups (tile) -> the transposed copy [H][D][Tpad] of head `head`,
// positions block_pos .. block_pos + 127, in fragment order (layout.cuh). Item (group g,
// column quad j) -> the 16-byte fragment-order groups of rows 4j..4j+3; g runs fastest over
// the lanes, so each store covers 128 contiguous bytes of 4 rows.
template <int D>
__device__ __forceinline__ void write_fp8_transposed(StageTile<D>& tile, uint8_t* trans, int head,
                                                     int64_t block_pos, int64_t tpad, int tid) {
  constexpr int kItems = kWarps * (D / 4);
  for (int item = tid; item < kItems; item += kThreads) {
    const int g = item % kWarps, j = item / kWarps;
    const int64_t pos = block_pos + g * kTokenGroup;
    if (pos >= tpad) continue;
    // Row r sits at r ^ (g >> 2): the even rows at fixed offsets from row 0's word, the odd
    // ones from row 1's, so the 16 reads take two address computations, not sixteen.
    const uint32_t* const even = tile.at(g, 0, j);
    const uint32_t* const odd = tile.at(g, 1, j);
    uint32_t w[kTokenGroup];
#pragma unroll
    for (int r = 0; r < kTokenGroup; ++r) w[r] = (r & 1 ? odd : even)[(r & ~1) * StageTile<D>::kQuads];
    uint32_t col[4][4];  // [column k][word qd]
#pragma unroll
    for (int qd = 0; qd < 4; ++qd) {
      uint32_t out[4];
      // Word qd of a group holds tokens 2qd, 2qd+1, 8+2qd, 9+2qd (fragment_order_token).
      transpose_4x4_bytes(w[2 * qd], w[2 * qd + 1], w[8 + 2 * qd], w[9 + 2 * qd], out);
#pragma unroll
      for (int k = 0; k < 4; ++k) col[k][qd] = out[k];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint8_t* dst = trans + (int64_t(head) * D + 4 * j + k) * tpad + pos;
      *reinterpret_cast<uint4*>(dst) = make_uint4(col[k][0], col[k][1], col[k][2], col[k][3]);
    }
  }
}

// Block 0's work: validate cu_seqlens (guard.cuh), then build the work lists when asked.
template <int kBlockThreads>
__device__ __forceinline__ void guard_and_lists(const QuantBatch& batch) {
  if (guard::guard_block<kBlockThreads>(batch.guard) && batch.work[0].count != nullptr)
    for (const WorkListOut& list : batch.work)
      if (list.count != nullptr && !build_work_list_block<kBlockThreads>(batch.cu, batch.num_docs, list) &&
          threadIdx.x == 0)
        guard::record(batch.guard, guard::DeviceError{guard::kWorkListOverflow, batch.guard.stage, 0, 0, 0});
}

// The tensor of the batch's head index *head (q's heads, then k's, then v's), *head made its own.
__device__ __forceinline__ const QuantTensor& tensor_of(const QuantBatch& batch, int* head) {
  if (*head < batch.t[0].heads) return batch.t[0];
  *head -= batch.t[0].heads;
  if (*head < batch.t[1].heads) return batch.t[1];
  *head -= batch.t[1].heads;
  return batch.t[2];
}

// One block's unit: 128 padded positions of one head of tensor t. Warp w holds its 16-token
// group's rows with D / 8 lanes a row (16 bytes of bf16 each), all its loads in flight before
// the first use; the codes go to t.nat and the staging tile, the scales (and dots) to their
// arrays, then the transposed copy from the tile.
template <int D, bool kDot>
__device__ __forceinline__ void quantize_unit(const QuantBatch& batch, const QuantTensor& t, int head,
                                              int64_t block_pos, StageTile<D>& tile) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  constexpr int kPasses = kTokenGroup / kRowsPerPass;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, chunk = lane % kLanesPerRow;
  int64_t tok0 = 0;
  const int rows = group_rows(batch.cu, batch.num_docs, batch.total_tokens, batch.tpad,
                              block_pos + warp * kTokenGroup, lane, &tok0);
  uint4 x[kPasses], o[kPasses];
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int r = it * kRowsPerPass + lane / kLanesPerRow;
    x[it] = o[it] = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const int64_t off = (tok0 + r) * t.stride_t + head * t.stride_h + 8 * chunk;
      x[it] = __ldcs(reinterpret_cast<const uint4*>(t.src + off));
      if (kDot) o[it] = __ldcs(reinterpret_cast<const uint4*>(t.dot_src + off));
    }
  }

  float row_scale = 0.0f, row_dot = 0.0f;  // lane r < 16: values of row r
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int r = it * kRowsPerPass + lane / kLanesPerRow;
    uint32_t amax = abs_max_bits_bf16x8(x[it]);
#pragma unroll
    for (int off = kLanesPerRow / 2; off > 0; off >>= 1)
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float scale = fmt::pow2_scale_e4m3(__uint_as_float(amax << 16));
    // A non-finite row keeps its NaN scale, which carries the NaN into every product the
    // token takes part in, but gets zero codes: NaN codes would also reach the rows that
    // merely mask this token out, through 0 * NaN inside an MMA.
    const uint2 q = fmt::is_nan_f32(scale) ? make_uint2(0u, 0u) : quantize_bf16x8(x[it], fmt::pow2_reciprocal(scale));
    // Gather the group's scales (and dots) into lanes 0..15, for one coalesced store each:
    // src_lane holds row it * kRowsPerPass + lane % kRowsPerPass.
    const int src_lane = (lane % kRowsPerPass) * kLanesPerRow;
    const float s = __shfl_sync(0xffffffffu, scale, src_lane);
    if (lane / kRowsPerPass == it) row_scale = s;
    if (kDot) {
      float dot = dot_e4m3x8_bf16x8(q, scale, o[it]);  // a non-finite row: zero codes times NaN
#pragma unroll
      for (int off = kLanesPerRow / 2; off > 0; off >>= 1)
        dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, off));
      const float d = __shfl_sync(0xffffffffu, dot, src_lane);
      if (lane / kRowsPerPass == it) row_dot = d;
    }
    if (r < rows && t.nat)
      *reinterpret_cast<uint2*>(t.nat + ((tok0 + r) * t.heads + head) * D + 8 * chunk) = q;
    if (t.trans != nullptr) *reinterpret_cast<uint2*>(tile.at(warp, r, 2 * chunk)) = q;
  }
  if (lane < rows) {
    const int64_t at = head * batch.total_tokens + tok0 + lane;
    t.scale[at] = row_scale;
    if (t.nonfinite != nullptr && fmt::is_nan_f32(row_scale)) *t.nonfinite = 1u;  // the same value from every writer
    if (kDot) {
      t.rowdot[at] = row_dot;
      t.lse2[at] = fmt::is_nan_f32(row_scale) ? __int_as_float(0x7fc00000) : __fmul_rn(__ldg(t.lse + at), fmt::kLog2e);
    }
  }

  if (t.trans == nullptr) return;  // uniform over the block
  __syncthreads();
  write_fp8_transposed<D>(tile, t.trans, head, block_pos, batch.tpad, tid);
}

// The beside quantizer's lane layout: D / 32 lanes a row, four 16-byte chunks (8 bf16) a lane.
// quantize_unit's D / 8 lanes a row spend a 4-step shuffle tree and a scale computation on every
// 8 elements and an address computation on every 8-byte store, ~16 instructions an element:
// more than a third of the SMs can issue at the full bandwidth (docs/PERFORMANCE.md, v140).
// Lane c of its row holds chunks c + L (i ^ (row & 3)), i = 0..3 (L lanes a row): rows that
// share a quarter-warp's 16-byte shared-memory reads (or a half-warp's 8-byte tile writes)
// start on different chunks and hit different banks. A lane's rows differ by multiples of 4,
// so its chunks are the same in every pass. (The plain quantizer keeps D / 8 lanes: there,
// HBM-bound, this layout's stores of 8 or 16 bytes a row an instruction read 3-23 % slower,
// v140 outcome.)
template <int D>
struct LeanLanes {
  static constexpr int kLanesPerRow = D / 32;
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;
  static constexpr int kPasses = kTokenGroup / kRowsPerPass;
  static_assert(kRowsPerPass % 4 == 0, "a lane's chunks must not depend on the pass");
  __device__ __forceinline__ static int row(int it, int lane) { return it * kRowsPerPass + lane / kLanesPerRow; }
  // c + L (i ^ p) = (c + L p) ^ L i, as c < L: one XOR from the lane's first chunk.
  __device__ __forceinline__ static int chunk(int i, int lane) {
    return (lane % kLanesPerRow + kLanesPerRow * ((lane / kLanesPerRow) & 3)) ^ (kLanesPerRow * i);
  }
};

// abs_max_bits_bf16x8 over a lane's four chunks, two bf16 a 16-bit lane of the max.
__device__ __forceinline__ uint32_t abs_max_bits_bf16x32(const uint4 (&x)[4]) {
  constexpr uint32_t kMag = 0x7fff7fffu;
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m = __vimax3_u16x2(m, x[i].x & kMag, x[i].y & kMag);
    m = __vimax3_u16x2(m, x[i].z & kMag, x[i].w & kMag);
  }
  return max(m & 0xffffu, m >> 16);
}

// quantize_unit's quantization for the lean layout (x[it][i]: chunk LeanLanes::chunk(i) of row
// LeanLanes::row(it), zeros past `rows`; 8 warps, `warp` 0..7 and `tid` 0..255 the unit's
// threads, sync() their barrier): the same codes, scales and transposed copy.
template <int D, class Sync>
__device__ __forceinline__ void quantize_rows_lean(const QuantBatch& batch, const QuantTensor& t, int head,
                                                   int64_t block_pos, StageTile<D>& tile, int warp, int tid,
                                                   const uint4 (&x)[LeanLanes<D>::kPasses][4], int64_t tok0,
                                                   int rows, Sync sync) {
  using L = LeanLanes<D>;
  const int lane = tid & 31;
  const int64_t row_bytes = int64_t(t.heads) * D;
  uint8_t* const nat = t.nat != nullptr ? t.nat + (tok0 * t.heads + head) * D : nullptr;
  float* const scale_out = t.scale + int64_t(head) * batch.total_tokens + tok0;
#pragma unroll
  for (int it = 0; it < L::kPasses; ++it) {
    const int r = L::row(it, lane);
    uint32_t amax = abs_max_bits_bf16x32(x[it]);
#pragma unroll
    for (int off = L::kLanesPerRow / 2; off > 0; off >>= 1)
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float scale = fmt::pow2_scale_e4m3(__uint_as_float(amax << 16));
    const bool nonfinite = fmt::is_nan_f32(scale);  // zero codes, as quantize_unit says
    const float inv_scale = fmt::pow2_reciprocal(scale);
    uint2 q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = quantize_bf16x8(x[it][i], inv_scale);
    if (__any_sync(0xffffffffu, nonfinite))  // rare: no selects on the common path
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = nonfinite ? make_uint2(0u, 0u) : q[i];
    if (r < rows) {
      if (nat != nullptr) {
        uint8_t* const row = nat + r * row_bytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(row + 8 * L::chunk(i, lane)) = q[i];
      }
      if (lane % L::kLanesPerRow == 0) {
        scale_out[r] = scale;
        if (t.nonfinite != nullptr && nonfinite) *t.nonfinite = 1u;
      }
    }
    if (t.trans != nullptr)
#pragma unroll
      for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(tile.at(warp, r, 2 * L::chunk(i, lane))) = q[i];
  }
  if (t.trans == nullptr) return;  // uniform over the unit
  sync();
  write_fp8_transposed<D>(tile, t.trans, head, block_pos, batch.tpad, tid);
}

// kDot: the dO variant (also reads O for the row dot product). Blocks per SM: the most that
// fit the registers without spills (4-5 = 32-40 warps, 64-128 KB of loads in flight).
template <int D, bool kDot>
__global__ void __launch_bounds__(kThreads, kDot ? 3 : (D == 64 ? 5 : 4))
quantize_kernel(const __grid_constant__ QuantBatch batch) {
  __shared__ __align__(16) StageTile<D> tile;  // the block's rows for the transposed copy
  // Launched in plain stream order: the kernel after it may start in its last wave
  // (common/grid_dependency.cuh; it waits for this one before reading anything).
  grid::allow_dependents();

  int block = int(blockIdx.x);
  if (block == 0) {
    guard_and_lists<kThreads>(batch);
    return;
  }
  --block;
  // Head fastest (file comment): the blocks running together share a token range.
  int head = block % batch.heads;
  const int64_t block_pos = int64_t(block / batch.heads) * kBlockPositions;
  const QuantTensor& t = tensor_of(batch, &head);
  quantize_unit<D, kDot>(batch, t, head, block_pos, tile);
}

// The quantizer beside the fast forward (BesideReady, layout.cuh): a persistent grid, one CTA
// an SM, on a share of the SMs (launch_beside); the forward's CTAs take the others from the
// start (it may launch once every CTA here has started, so none of them waits on a unit that
// no SM is left to run). There it must stream several times faster an SM than the plain
// quantizer does on every SM, where that one is HBM-bound and issues under half of what an SM
// can: so the rows are quantized in the lean lanes (LeanLanes, ~7 instructions an element
// against D / 8 lanes' ~16, which no third of the SMs can issue at the full bandwidth;
// docs/PERFORMANCE.md, v140), they arrive by TMA (a box of 16 tokens a group) into a ring of
// shared-memory stages kStages - 1 units ahead of the one being quantized, and the bookkeeping
// (which unit, which tokens, the copies, the counts) is a producer warp's.
//
// Part p of a CTA (warps 8p .. 8p + 7, its own staging tile and named barrier, and producer
// warp p) takes units p, p + parts, ... of the order the forward reads them in: kv block by kv
// block (its q, k and v heads), each block's positions from the first, heads fastest. Warp g of
// a part quantizes the 16-token group g of each unit from its slice of the unit's stage, which
// lane g of the producer warp filled (a box, an mbarrier a slice). After a unit (the part's
// barrier) the part's first thread publishes how many units it has finished; the producer warp,
// seeing that count move, refills the finished units' stages and then fences once at GPU scope
// and raises the counts of every unit finished since it last looked. CTA 0 first validates
// cu_seqlens and builds the work lists with all its threads, then raises the lists' count.
template <int D>
struct BesidePlan {
  static constexpr int kParts = D == 128 ? 2 : 3;
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr int kThreads = kParts * (quant::kThreads + 32);  // the parts' warps, then their producer warps
  static constexpr int kGroupBytes = kTokenGroup * D * 2;             // a warp's bf16 rows
  static constexpr int kSlots = kParts * kStages * kWarps;             // (part, stage, warp)
  struct Slot {                                                        // what a slice's box holds
    int64_t tok0;
    int rows, chunk, which, head;
  };
  static constexpr int kRows0 = 0;
  static constexpr int kTiles0 = kRows0 + kSlots * kGroupBytes;
  static constexpr int kSlots0 = kTiles0 + kParts * int(sizeof(StageTile<D>));
  static constexpr int kBars0 = kSlots0 + kSlots * int(sizeof(Slot));
  static constexpr int kDone0 = kBars0 + 8 * kSlots;  // units finished, a part
  static constexpr int kBytes = kDone0 + 4 * kParts;
  static_assert(kBytes <= 227 * 1024 - 256, "one CTA an SM, with the guard's and lists' static shared memory");
  static constexpr int slot(int part, int stage, int warp) { return (part * kStages + stage) * kWarps + warp; }
};

__device__ __forceinline__ void part_sync(int part) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + part), "r"(kThreads) : "memory");
}

// A unit of the beside order -> kv block, 128-position block, tensor and head.
struct BesideUnit {
  int kb, chunk, which, head;
};
__device__ __forceinline__ BesideUnit beside_unit(const QuantBatch& batch, int chunks, int u) {
  const int hkv = batch.t[1].heads, kvb = batch.kv_block, group_heads = kvb * (batch.t[0].heads / hkv);
  const int block_heads = group_heads + 2 * kvb;  // a kv block's q, k and v heads
  BesideUnit b;
  b.kb = int(batch.units_a_block.div(uint32_t(u)));
  const int r = u - b.kb * chunks * block_heads;
  b.chunk = int(batch.block_heads.div(uint32_t(r)));
  int hh = r - b.chunk * block_heads;
  if (hh < group_heads) b.which = 0, b.head = b.kb * group_heads + hh;
  else if ((hh -= group_heads) < kvb) b.which = 1, b.head = b.kb * kvb + hh;
  else b.which = 2, b.head = b.kb * kvb + hh - kvb;
  return b;
}

template <int D>
__global__ void __launch_bounds__(BesidePlan<D>::kThreads, 1) quantize_beside_kernel(const __grid_constant__ QuantBatch batch) {
  using P = BesidePlan<D>;
  using L = LeanLanes<D>;
  extern __shared__ __align__(128) uint8_t beside_smem[];
  const uint32_t base = sm90::ptx::smem_addr(beside_smem);
  int* const done = reinterpret_cast<int*>(beside_smem + P::kDone0);
  grid::allow_dependents();
  const int chunks = int(BesideReady::chunks(batch.tpad)), hkv = batch.t[1].heads;
  const int units = chunks * batch.heads;
  if (threadIdx.x == 0) {
    for (int i = 0; i < P::kSlots; ++i) sm90::mbar::init(base + P::kBars0 + 8 * i, 1);
    for (int p = 0; p < P::kParts; ++p) done[p] = 0;
    sm90::mbar::fence_init();
  }
  if (blockIdx.x == 0) {
    guard_and_lists<P::kThreads>(batch);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(batch.ready + BesideReady::lists(batch.tpad, hkv), 1);
    }
  }
  __syncthreads();
  const int warp_all = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int first = int(blockIdx.x) * P::kParts, stride = int(gridDim.x) * P::kParts;

  if (warp_all >= P::kParts * kWarps) {  // a part's producer warp
    const int part = warp_all - P::kParts * kWarps;
    // Lane g < 8 copies group g of the part's k-th unit into stage k % kStages: one box of 16
    // tokens (rows past the document are the next tokens, or zeros past the tensor; the
    // quantizing warps read them as zeros), none for a group without tokens.
    auto issue = [&](int k) {
      const int u = first + part + k * stride;
      if (u >= units || lane >= kWarps) return;
      const BesideUnit b = beside_unit(batch, chunks, u);
      int64_t tok0 = 0;
      const int rows = group_rows_one_lane(batch.cu, batch.num_docs, batch.total_tokens, batch.tpad,
                                           int64_t(b.chunk) * kBlockPositions + lane * kTokenGroup, &tok0);
      const int i = P::slot(part, k % P::kStages, lane);
      const uint32_t bar = base + P::kBars0 + 8 * i;
      *reinterpret_cast<typename P::Slot*>(beside_smem + P::kSlots0 + i * int(sizeof(typename P::Slot))) =
          {tok0, rows, b.chunk, b.which, b.head};
      if (rows > 0) {
        sm90::mbar::arrive_expect_tx(bar, P::kGroupBytes);
        sm90::tma::load_3d(base + P::kRows0 + i * P::kGroupBytes, batch.rows_map[b.which], bar, 0, b.head, int(tok0));
      } else {
        sm90::mbar::arrive(bar);
      }
    };
    for (int k = 0; k < P::kStages; ++k) issue(k);
    for (int k = 0; first + part + k * stride < units;) {
      int finished = 0;
      if (lane == 0)
        while ((finished = sm90::ptx::ld_acquire_cta_shared(base + P::kDone0 + 4 * part)) <= k) __nanosleep(64);
      finished = __shfl_sync(0xffffffffu, finished, 0);
      // A finished unit's stage has been read into registers: its next copies may overwrite it.
      for (int j = k; j < finished; ++j) issue(j + P::kStages);
      if (lane == 0) {
        sm90::ptx::fence_acq_rel_gpu();
        for (int j = k; j < finished; ++j) {
          const BesideUnit b = beside_unit(batch, chunks, first + part + j * stride);
          sm90::ptx::red_add_gpu(batch.ready + BesideReady::block(batch.tpad, b.kb, b.chunk), 1);
          sm90::ptx::red_add_gpu(batch.ready + BesideReady::kv_done(batch.tpad, hkv, b.kb), 1);
        }
      }
      k = finished;
    }
    return;
  }

  const int part = warp_all / kWarps, warp = warp_all % kWarps, tid = int(threadIdx.x) % kThreads;
  StageTile<D>& tile = reinterpret_cast<StageTile<D>*>(beside_smem + P::kTiles0)[part];
  for (int k = 0; first + part + k * stride < units; ++k) {
    const int i = P::slot(part, k % P::kStages, warp);
    sm90::mbar::wait(base + P::kBars0 + 8 * i, uint32_t(k / P::kStages) & 1u);
    const typename P::Slot s =
        *reinterpret_cast<const typename P::Slot*>(beside_smem + P::kSlots0 + i * int(sizeof(typename P::Slot)));
    const uint8_t* const rows_at = beside_smem + P::kRows0 + i * P::kGroupBytes;
    uint4 x[L::kPasses][4];
#pragma unroll
    for (int it = 0; it < L::kPasses; ++it) {
      const int r = L::row(it, lane);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        x[it][c] = r < s.rows ? *reinterpret_cast<const uint4*>(rows_at + r * D * 2 + 16 * L::chunk(c, lane))
                              : make_uint4(0, 0, 0, 0);
    }
    const QuantTensor& t = s.which == 0 ? batch.t[0] : s.which == 1 ? batch.t[1] : batch.t[2];
    quantize_rows_lean<D>(batch, t, s.head, int64_t(s.chunk) * kBlockPositions, tile, warp, tid, x, s.tok0, s.rows,
                          [part] { part_sync(part); });
    part_sync(part);  // the part's writes before the count below; the tile and the stage free
    if (tid == 0) sm90::ptx::st_release_cta_shared(base + P::kDone0 + 4 * part, k + 1);
  }
}

// Recipe fp8's backward: Qᵀ and Kᵀ, transposed from qkv8's natural q8 and k8 into the
// workspace — the bytes the quantizer would write (the same codes through the same staging
// and writer; zero past each document and in the padding), without keeping them in qkv8
// from the forward to the backward. One warp a 16-position group, 8 groups a block, as the
// quantizer; blocks head-fastest.
struct CodesTensor {
  const uint8_t* nat = nullptr;  // [T, H, D] FP8
  uint8_t* trans = nullptr;      // [H][D][Tpad] FP8
  int heads = 0;
};
struct TransposeBatch {
  CodesTensor t[2];
  const int32_t* cu = nullptr;
  int num_docs = 0;
  int heads = 0;  // t[0].heads + t[1].heads
  int64_t total_tokens = 0, tpad = 0;
};

template <int D>
__global__ void __launch_bounds__(kThreads) transpose_codes_kernel(const __grid_constant__ TransposeBatch batch) {
  constexpr int kLanesPerRow = D / 8;  // 8 code bytes a lane
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  constexpr int kPasses = kTokenGroup / kRowsPerPass;
  __shared__ __align__(16) StageTile<D> tile;
  grid::allow_dependents();  // as quantize_kernel's
  const int block = int(blockIdx.x);
  int head = block % batch.heads;
  const int64_t block_pos = int64_t(block / batch.heads) * kBlockPositions;
  const bool is_k = head >= batch.t[0].heads;
  const CodesTensor& t = is_k ? batch.t[1] : batch.t[0];
  if (is_k) head -= batch.t[0].heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunk = lane % kLanesPerRow;
  int64_t tok0 = 0;
  const int rows = group_rows(batch.cu, batch.num_docs, batch.total_tokens, batch.tpad,
                              block_pos + warp * kTokenGroup, lane, &tok0);
  uint2 x[kPasses];
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int r = it * kRowsPerPass + lane / kLanesPerRow;
    x[it] = r < rows ? __ldcs(reinterpret_cast<const uint2*>(t.nat + ((tok0 + r) * t.heads + head) * D + 8 * chunk))
                     : make_uint2(0u, 0u);
  }
#pragma unroll
  for (int it = 0; it < kPasses; ++it)
    *reinterpret_cast<uint2*>(tile.at(warp, it * kRowsPerPass + lane / kLanesPerRow, 2 * chunk)) = x[it];
  __syncthreads();
  write_fp8_transposed<D>(tile, t.trans, head, block_pos, batch.tpad, int(threadIdx.x));
}

template <bool kDot>
cudaError_t launch_quantize(QuantBatch batch, int head_dim, cudaStream_t stream) {
  batch.heads = batch.t[0].heads + batch.t[1].heads + batch.t[2].heads;
  const int64_t chunks = (batch.tpad + kBlockPositions - 1) / kBlockPositions;
  const int64_t blocks = chunks * batch.heads + 1;  // + block 0: guard (and work lists)
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid{unsigned(blocks)};
  if (head_dim == 64) quantize_kernel<64, kDot><<<grid, kThreads, 0, stream>>>(batch);
  else if (head_dim == 128) quantize_kernel<128, kDot><<<grid, kThreads, 0, stream>>>(batch);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

// Beside the forward: a third of the SMs, where a CTA that keeps ~64 KB or more of loads in
// flight streams at the copy bandwidth (docs/PERFORMANCE.md, "the partition probe: outcome").
// Its shared memory (the stages) holds an SM: the grid holds exactly that many SMs.
template <int D>
cudaError_t launch_beside(const QuantBatch& batch, unsigned grid, cudaStream_t stream) {
  using P = BesidePlan<D>;
  const cudaError_t e =
      cudaFuncSetAttribute(quantize_beside_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kBytes);
  if (e != cudaSuccess) return e;
  quantize_beside_kernel<D><<<grid, P::kThreads, P::kBytes, stream>>>(batch);
  return cudaGetLastError();
}

cudaError_t launch_quantize_beside(QuantBatch batch, int head_dim, unsigned ctas, cudaStream_t stream) {
  batch.heads = batch.t[0].heads + batch.t[1].heads + batch.t[2].heads;
  if (head_dim == 64) return launch_beside<64>(batch, ctas, stream);
  if (head_dim == 128) return launch_beside<128>(batch, ctas, stream);
  return cudaErrorInvalidValue;
}

QuantTensor source(const void* x, int64_t stride_t, int64_t stride_h, int heads) {
  QuantTensor t;
  t.src = static_cast<const uint16_t*>(x);
  t.stride_t = stride_t;
  t.stride_h = stride_h;
  t.heads = heads;
  return t;
}

guard::GuardArgs make_guard(const DeviceCall& p, guard::FingerprintMode mode, uint64_t* fingerprint,
                            guard::DeviceError* status, int32_t stage) {
  guard::GuardArgs g;
  g.cu = p.cu_seqlens;
  g.q_start = p.q_start;
  g.num_docs = p.num_docs;
  g.total_tokens = p.total_tokens;
  g.max_seqlen = p.max_seqlen;
  g.shape = guard::shape_fingerprint(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, int(p.recipe));
  g.mode = mode;
  g.fingerprint = fingerprint;
  g.status = status;
  g.stage = stage;
  return g;
}

// What a fault zeroes in qkv8 (guard.cuh): every work list's count and the fast forward's
// counter, so that no kernel walks a list built from an invalid cu_seqlens.
void guard_work_lists(guard::GuardArgs& g, uint8_t* qkv8, const Qkv8Layout& layout) {
  g.counts[0] = reinterpret_cast<int*>(qkv8 + layout.work.count);
  g.counts[1] = reinterpret_cast<int*>(qkv8 + layout.fwd_work.count);
  if (layout.fwd_work64.capacity > 0) g.counts[2] = reinterpret_cast<int*>(qkv8 + layout.fwd_work64.count);
  g.next_item = reinterpret_cast<int*>(qkv8 + layout.fast_forward_work().next);
}

// The forward on a filled qkv8: validate cu_seqlens and compare the fingerprint before the
// forward kernels trust the stored work list.
__global__ void __launch_bounds__(kThreads) check_qkv8_kernel(const __grid_constant__ guard::GuardArgs g) {
  grid::allow_dependents();  // as quantize_kernel's
  guard::guard_block<kThreads>(g);
}

// Fills words [0, n) of each region with its pattern when the call's status records a
// fault; otherwise every block returns after one load.
struct PoisonRegion {
  uint32_t* data = nullptr;
  int64_t words = 0;
  uint32_t pattern = 0;
};
struct PoisonArgs {
  const guard::DeviceError* status;
  PoisonRegion r[3];
};

// It may start beside the call's last kernel (launch_poison), which writes the status.
__global__ void __launch_bounds__(256) poison_kernel(const __grid_constant__ PoisonArgs a) {
  grid::wait_for_prior_grids();
  if (a.status->fault == guard::kNone) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
#pragma unroll
  for (int k = 0; k < 3; ++k)
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.r[k].words; i += stride)
      a.r[k].data[i] = a.r[k].pattern;
}

cudaError_t launch_poison(const PoisonArgs& a, cudaStream_t stream) {
  int64_t most = 0;
  for (const PoisonRegion& r : a.r) most = r.words > most ? r.words : most;
  // Enough blocks to fill quickly when needed, few enough to cost ~nothing when not.
  const int64_t blocks = (most + 255) / 256 < 264 ? (most + 255) / 256 : 264;
  if (blocks == 0) return cudaSuccess;
  return launch_kernel(poison_kernel, unsigned(blocks), 256, 0, stream, true, a);
}

constexpr uint32_t kBf16NanPair = 0x7fc07fc0u;
constexpr uint32_t kF32Nan = 0x7fc00000u;

}  // namespace

cudaError_t quantize_dout(const DeviceCall& p, const void* dout, int64_t stride_t,
                          int64_t stride_h, const void* out, const float* lse, const uint8_t* qkv8,
                          const Qkv8Layout& qkv8_layout, uint8_t* workspace,
                          const BwdWorkspaceLayout& layout) {
  if (p.total_tokens == 0) return cudaSuccess;  // dout and out: 16-byte aligned rows (sm90::backward checks)
  QuantBatch batch;
  batch.guard = make_guard(p, guard::FingerprintMode::kCompare,
                           const_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(qkv8 + qkv8_layout.fingerprint)),
                           reinterpret_cast<guard::DeviceError*>(workspace + layout.status), guard::kStageBackward);
  batch.cu = p.cu_seqlens;
  batch.num_docs = p.num_docs;
  batch.total_tokens = p.total_tokens;
  batch.tpad = layout.tpad;
  QuantTensor& t = batch.t[0];
  t = source(dout, stride_t, stride_h, p.hq);
  t.dot_src = static_cast<const uint16_t*>(out);
  t.nat = workspace + layout.do8;
  t.scale = reinterpret_cast<float*>(workspace + layout.sdo);
  t.rowdot = reinterpret_cast<float*>(workspace + layout.dvec);
  t.lse = lse;
  t.lse2 = reinterpret_cast<float*>(workspace + layout.lse2);
  // dV's B operand: FP8 dOᵀ (fp8), or dout itself (fp8_mixed), whose non-finite rows the
  // backward zeroes when the flag says there are any.
  if (p.recipe == FLAMIA_RECIPE_FP8_MIXED) {
    t.nonfinite = reinterpret_cast<uint32_t*>(workspace + layout.nonfinite);
    const cudaError_t e = cudaMemsetAsync(t.nonfinite, 0, sizeof(uint32_t), p.stream);
    if (e != cudaSuccess) return e;
  } else {
    t.trans = workspace + layout.dot8;
  }
  return launch_quantize<true>(batch, p.head_dim, p.stream);
}

cudaError_t transpose_qk_codes(const DeviceCall& p, const uint8_t* qkv8, const Qkv8Layout& qkv8_layout,
                               uint8_t* workspace, const BwdWorkspaceLayout& layout) {
  if (p.total_tokens == 0) return cudaSuccess;
  TransposeBatch b;
  b.t[0] = CodesTensor{qkv8 + qkv8_layout.q8, workspace + layout.qt, p.hq};
  b.t[1] = CodesTensor{qkv8 + qkv8_layout.k8, workspace + layout.kt, p.hkv};
  b.cu = p.cu_seqlens;
  b.num_docs = p.num_docs;
  b.heads = p.hq + p.hkv;
  b.total_tokens = p.total_tokens;
  b.tpad = layout.tpad;
  const int64_t blocks = (b.tpad + kBlockPositions - 1) / kBlockPositions * b.heads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (p.head_dim == 64) transpose_codes_kernel<64><<<unsigned(blocks), kThreads, 0, p.stream>>>(b);
  else if (p.head_dim == 128) transpose_codes_kernel<128><<<unsigned(blocks), kThreads, 0, p.stream>>>(b);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t check_qkv8(const DeviceCall& p, void* qkv8) {
  if (p.total_tokens == 0) return cudaSuccess;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, false);
  uint8_t* base = static_cast<uint8_t*>(qkv8);
  guard::GuardArgs g = quant::make_guard(p, guard::FingerprintMode::kCompareAndReject,
                                         reinterpret_cast<uint64_t*>(base + layout.fingerprint),
                                         reinterpret_cast<guard::DeviceError*>(base + layout.status),
                                         guard::kStageForward);
  quant::guard_work_lists(g, base, layout);
  quant::check_qkv8_kernel<<<1, quant::kThreads, 0, p.stream>>>(g);
  return cudaGetLastError();
}

cudaError_t poison_forward(const DeviceCall& p, const void* qkv8, void* out, float* lse) {
  if (p.total_tokens == 0) return cudaSuccess;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, false);
  quant::PoisonArgs a{};
  a.status = reinterpret_cast<const guard::DeviceError*>(static_cast<const uint8_t*>(qkv8) + layout.status);
  a.r[0] = {static_cast<uint32_t*>(out), p.total_tokens * p.hq * p.head_dim / 2, quant::kBf16NanPair};
  a.r[1] = {reinterpret_cast<uint32_t*>(lse), p.total_tokens * p.hq, quant::kF32Nan};
  return quant::launch_poison(a, p.stream);
}

cudaError_t poison_backward(const DeviceCall& p, const void* workspace, void* dq, void* dk, void* dv) {
  if (p.total_tokens == 0) return cudaSuccess;
  const auto layout = quant::BwdWorkspaceLayout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe);
  quant::PoisonArgs a{};
  a.status = reinterpret_cast<const guard::DeviceError*>(static_cast<const uint8_t*>(workspace) + layout.status);
  a.r[0] = {static_cast<uint32_t*>(dq), p.total_tokens * p.hq * p.head_dim / 2, quant::kBf16NanPair};
  a.r[1] = {static_cast<uint32_t*>(dk), p.total_tokens * p.hkv * p.head_dim / 2, quant::kBf16NanPair};
  a.r[2] = {static_cast<uint32_t*>(dv), p.total_tokens * p.hkv * p.head_dim / 2, quant::kBf16NanPair};
  return quant::launch_poison(a, p.stream);
}

cudaError_t take_sticky_error(guard::DeviceError* out) {
  // Kernels of this process still running could record a fault after the read.
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return e;
  e = cudaMemcpyFromSymbol(out, guard::g_sticky, sizeof(guard::DeviceError));
  if (e != cudaSuccess || out->fault == guard::kNone) return e;
  const guard::DeviceError none{};
  return cudaMemcpyToSymbol(guard::g_sticky, &none, sizeof(guard::DeviceError));
}

cudaError_t read_qkv8_fingerprint(const DeviceCall& p, const void* qkv8, uint64_t* fingerprint) {
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, false);
  const cudaError_t e = cudaMemcpyAsync(fingerprint, static_cast<const uint8_t*>(qkv8) + layout.fingerprint,
                                        sizeof(uint64_t), cudaMemcpyDeviceToHost, p.stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(p.stream);
}

BesideLaunch BesideLaunch::for_forward(const DeviceCall& p) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms = 3;  // the launch that follows reports the device's error
  return {unsigned(sms / 3 > 1 ? sms / 3 : 1), order::forward_kv_block(p.total_tokens, p.hkv, p.head_dim)};
}

cudaError_t quantize_qkv(const DeviceCall& p, void* qkv8, bool for_backward, const BesideLaunch* beside) {
  if (p.total_tokens == 0) return cudaSuccess;
  if (!quant::rows_16b_aligned(p.q, p.q_stride_t, p.q_stride_h) ||
      !quant::rows_16b_aligned(p.k, p.k_stride_t, p.k_stride_h) ||
      !quant::rows_16b_aligned(p.v, p.v_stride_t, p.v_stride_h))
    return cudaErrorInvalidValue;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv,
                                              p.head_dim, p.recipe, for_backward);
  uint8_t* base = static_cast<uint8_t*>(qkv8);
  // fp8_mixed's backward reads q and k themselves (BF16) and needs to know whether a row is
  // not finite; fp8's transposed FP8 copies are made by the backward (transpose_qk_codes).
  uint32_t* nonfinite = nullptr;
  if (for_backward && p.recipe == FLAMIA_RECIPE_FP8_MIXED) {
    nonfinite = reinterpret_cast<uint32_t*>(base + layout.nonfinite);
    const cudaError_t e = cudaMemsetAsync(nonfinite, 0, sizeof(uint32_t), p.stream);
    if (e != cudaSuccess) return e;
  }

  quant::QuantBatch batch;
  batch.cu = p.cu_seqlens;
  batch.num_docs = p.num_docs;
  batch.total_tokens = p.total_tokens;
  batch.tpad = layout.tpad;
  quant::QuantTensor& q = batch.t[0];
  q = quant::source(p.q, p.q_stride_t, p.q_stride_h, p.hq);
  q.nat = base + layout.q8;
  q.nonfinite = nonfinite;
  q.scale = reinterpret_cast<float*>(base + layout.sq);
  quant::QuantTensor& k = batch.t[1];
  k = quant::source(p.k, p.k_stride_t, p.k_stride_h, p.hkv);
  k.nat = base + layout.k8;
  k.nonfinite = nonfinite;
  k.scale = reinterpret_cast<float*>(base + layout.sk);
  quant::QuantTensor& v = batch.t[2];
  v = quant::source(p.v, p.v_stride_t, p.v_stride_h, p.hkv);
  v.nat = for_backward ? base + layout.v8 : nullptr;
  v.trans = base + layout.vt8;
  v.scale = reinterpret_cast<float*>(base + layout.sv);

  batch.work[0] = quant::work_list_out(base, layout.work, p.causal);
  batch.work[1] = quant::work_list_out(base, layout.fwd_work, p.causal);
  if (layout.fwd_work64.capacity > 0) batch.work[2] = quant::work_list_out(base, layout.fwd_work64, p.causal);
  batch.guard = quant::make_guard(p, guard::FingerprintMode::kRecord,
                                  reinterpret_cast<uint64_t*>(base + layout.fingerprint),
                                  reinterpret_cast<guard::DeviceError*>(base + layout.status),
                                  guard::kStageQuantize);
  quant::guard_work_lists(batch.guard, base, layout);
  if (beside == nullptr) return quant::launch_quantize<false>(batch, p.head_dim, p.stream);
  if (beside->ctas == 0 || beside->kv_block < 1 || p.hkv % beside->kv_block != 0) return cudaErrorInvalidValue;
  for (int i = 0; i < 3; ++i) {  // bytes {a head's row, head, token}; the rows are 16-byte aligned (above)
    const QuantTensor& t = batch.t[i];
    const uint64_t dims[3] = {uint64_t(p.head_dim) * 2, uint64_t(t.heads), uint64_t(p.total_tokens)};
    const uint64_t strides[2] = {uint64_t(t.stride_h) * 2, uint64_t(t.stride_t) * 2};
    const uint32_t box[3] = {uint32_t(p.head_dim) * 2, 1, uint32_t(kTokenGroup)};
    if (const cudaError_t e = sm90::encode_u8_map(&batch.rows_map[i], t.src, 3, dims, strides, box, 0, 256)) return e;
  }
  batch.ready = reinterpret_cast<int*>(base + layout.ready);
  batch.kv_block = beside->kv_block;
  const uint32_t block_heads = uint32_t(quant::BesideReady::block_units(beside->kv_block, p.hq, p.hkv));
  batch.block_heads = FastDiv(block_heads);
  batch.units_a_block = FastDiv(uint32_t(quant::BesideReady::chunks(layout.tpad)) * block_heads);
  const cudaError_t e =
      cudaMemsetAsync(batch.ready, 0, size_t(quant::BesideReady::ints(layout.tpad, p.hkv)) * sizeof(int), p.stream);
  return e != cudaSuccess ? e : quant::launch_quantize_beside(batch, p.head_dim, beside->ctas, p.stream);
}

}  // namespace quant
}  // namespace flamia
