// Fused per-token FP8 quantizer (docs/ALGORITHM.md §1): one pass over bf16 q/k/v (or dO)
// writes every layout the kernels read — natural [T,H,D] FP8, transposed [H][D][Tpad] FP8
// in fragment order (layout.cuh), per-(token, head) scales — and, for dO, D = rowsum(dO*O).
//
// Work unit: one warp per 16-token group of the padded token axis of one head. The group
// maps to one document (or to padding) by a binary search over the closed-form padded
// starts, so every padded position — padding included — is written exactly once and every
// token is quantized exactly once. Rows are read with 16-byte loads (D/8 lanes per row);
// the transpose goes through a per-warp shared tile and __byte_perm, and each lane writes
// whole 16-byte groups of the transposed copy (the 4 warps of a block complete 64-byte runs).
#include "quantize/quantize.cuh"

#include "flamia/formats.h"
#include "sm90/ptx.cuh"
#include "sm90/schedule.cuh"

namespace flamia {
namespace quant {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

struct QuantTensor {
  const uint16_t* src = nullptr;      // bf16 [T, H, D], head_dim contiguous
  int64_t stride_t = 0, stride_h = 0; // elements
  const uint16_t* dot_src = nullptr;  // optional: O (same strides) for rowdot = sum src * O
  int heads = 0;
  uint8_t* nat = nullptr;             // [T, H, D] FP8, or null
  uint8_t* trans = nullptr;           // [H][D][Tpad] FP8, or null
  float* scale = nullptr;             // [H][T]
  float* rowdot = nullptr;            // [H][T], with dot_src
};

struct QuantBatch {
  QuantTensor t[3];
  const int32_t* cu = nullptr;
  int num_docs = 0;
  int64_t total_tokens = 0, tpad = 0;
};

// Largest b with padded_doc_start(b) <= pos (starts strictly increase with b).
__device__ __forceinline__ int doc_of_padded_position(const int32_t* cu, int num_docs, int64_t pos) {
  int lo = 0, hi = num_docs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (padded_doc_start(cu[mid], mid) <= pos) lo = mid; else hi = mid - 1;
  }
  return lo;
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
  return make_uint2(sm90::ptx::pack_e4m3x4(f[0], f[1], f[2], f[3]),
                    sm90::ptx::pack_e4m3x4(f[4], f[5], f[6], f[7]));
}

__device__ __forceinline__ float dot_bf16x8(uint4 a, uint4 b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = __fadd_rn(s, __fmul_rn(bf16_lo(x[i]), bf16_lo(y[i])));
    s = __fadd_rn(s, __fmul_rn(bf16_hi(x[i]), bf16_hi(y[i])));
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

template <int D>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const __grid_constant__ QuantBatch batch) {
  constexpr int kLanesPerRow = D / 8;                   // 16 bytes of bf16 per lane
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  constexpr int kPasses = kTokenGroup / kRowsPerPass;
  __shared__ uint32_t tile[kWarps][kTokenGroup][D / 4];  // FP8 rows of the group, for the transpose

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int head = blockIdx.y, which = 0;
  if (head >= batch.t[0].heads) {
    head -= batch.t[0].heads;
    which = 1;
    if (head >= batch.t[1].heads) { head -= batch.t[1].heads; which = 2; }
  }
  const QuantTensor& t = which == 0 ? batch.t[0] : which == 1 ? batch.t[1] : batch.t[2];

  const int64_t pos0 = (int64_t(blockIdx.x) * kWarps + warp) * kTokenGroup;
  if (pos0 >= batch.tpad) return;
  const int b = doc_of_padded_position(batch.cu, batch.num_docs, pos0);
  const int64_t doc_first = batch.cu[b];
  const int64_t local = pos0 - padded_doc_start(doc_first, b);
  const int64_t left = int64_t(batch.cu[b + 1]) - doc_first - local;
  const int rows = left <= 0 ? 0 : (left >= kTokenGroup ? kTokenGroup : int(left));  // 0: padding
  const int64_t tok0 = doc_first + local;

  const int chunk = lane % kLanesPerRow;
  uint4 x[kPasses], o[kPasses];
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int r = it * kRowsPerPass + lane / kLanesPerRow;
    x[it] = o[it] = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const int64_t off = (tok0 + r) * t.stride_t + head * t.stride_h + 8 * chunk;
      x[it] = __ldg(reinterpret_cast<const uint4*>(t.src + off));
      if (t.dot_src) o[it] = __ldg(reinterpret_cast<const uint4*>(t.dot_src + off));
    }
  }

#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    const int r = it * kRowsPerPass + lane / kLanesPerRow;
    uint32_t amax = abs_max_bits_bf16x8(x[it]);
#pragma unroll
    for (int off = kLanesPerRow / 2; off > 0; off >>= 1)
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float scale = fmt::pow2_scale(__uint_as_float(amax << 16));
    // A non-finite row keeps its NaN scale, which carries the NaN into every product the
    // token takes part in, but gets zero codes: NaN codes would also reach the rows that
    // merely mask this token out, through 0 * NaN inside an MMA.
    const uint2 q = fmt::is_nan_f32(scale) ? make_uint2(0u, 0u) : quantize_bf16x8(x[it], __frcp_rn(scale));
    float dot = 0.0f;
    if (t.dot_src) {
      dot = dot_bf16x8(x[it], o[it]);
#pragma unroll
      for (int off = kLanesPerRow / 2; off > 0; off >>= 1)
        dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, off));
    }
    if (r < rows) {
      const int64_t tok = tok0 + r;
      if (t.nat) *reinterpret_cast<uint2*>(t.nat + (tok * t.heads + head) * D + 8 * chunk) = q;
      if (chunk == 0) {
        t.scale[head * batch.total_tokens + tok] = scale;
        if (t.rowdot) t.rowdot[head * batch.total_tokens + tok] = dot;
      }
    }
    tile[warp][r][2 * chunk] = q.x;
    tile[warp][r][2 * chunk + 1] = q.y;
  }

  if (t.trans == nullptr) return;
  __syncwarp();
  // Lane l owns columns 4l..4l+3 and writes one 16-byte group (fragment order) for each.
  if (lane < D / 4) {
    uint32_t w[kTokenGroup];
#pragma unroll
    for (int r = 0; r < kTokenGroup; ++r) w[r] = tile[warp][r][lane];
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
      uint8_t* dst = t.trans + (int64_t(head) * D + 4 * lane + k) * batch.tpad + pos0;
      *reinterpret_cast<uint4*>(dst) = make_uint4(col[k][0], col[k][1], col[k][2], col[k][3]);
    }
  }
}

cudaError_t launch_quantize(const QuantBatch& batch, int head_dim, cudaStream_t stream) {
  const int heads = batch.t[0].heads + batch.t[1].heads + batch.t[2].heads;
  const int64_t groups = batch.tpad / kTokenGroup;
  const dim3 grid(unsigned((groups + kWarps - 1) / kWarps), unsigned(heads));
  if (head_dim == 64) quantize_kernel<64><<<grid, kThreads, 0, stream>>>(batch);
  else if (head_dim == 128) quantize_kernel<128><<<grid, kThreads, 0, stream>>>(batch);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

QuantTensor source(const void* x, int64_t stride_t, int64_t stride_h, int heads) {
  QuantTensor t;
  t.src = static_cast<const uint16_t*>(x);
  t.stride_t = stride_t;
  t.stride_h = stride_h;
  t.heads = heads;
  return t;
}

}  // namespace

cudaError_t quantize_dout(const sm90::Params& p, const void* dout, int64_t stride_t,
                          int64_t stride_h, const void* out, uint8_t* workspace,
                          const BwdWorkspaceLayout& layout) {
  if (p.total_tokens == 0) return cudaSuccess;
  if (!rows_16b_aligned(dout, stride_t, stride_h) || !rows_16b_aligned(out, stride_t, stride_h))
    return cudaErrorInvalidValue;
  QuantBatch batch;
  batch.cu = p.cu_seqlens;
  batch.num_docs = p.num_docs;
  batch.total_tokens = p.total_tokens;
  batch.tpad = layout.tpad;
  QuantTensor& t = batch.t[0];
  t = source(dout, stride_t, stride_h, p.hq);
  t.dot_src = static_cast<const uint16_t*>(out);
  t.nat = workspace + layout.do8;
  t.trans = workspace + layout.dot8;
  t.scale = reinterpret_cast<float*>(workspace + layout.sdo);
  t.rowdot = reinterpret_cast<float*>(workspace + layout.dvec);
  return launch_quantize(batch, p.head_dim, p.stream);
}

}  // namespace quant

namespace sm90 {

cudaError_t quantize_qkv(const Params& p, void* qkv8, bool for_backward) {
  if (p.total_tokens == 0) return cudaSuccess;
  if (!quant::rows_16b_aligned(p.q, p.q_stride_t, p.q_stride_h) ||
      !quant::rows_16b_aligned(p.k, p.k_stride_t, p.k_stride_h) ||
      !quant::rows_16b_aligned(p.v, p.v_stride_t, p.v_stride_h))
    return cudaErrorInvalidValue;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv,
                                              p.head_dim, p.recipe, for_backward);
  uint8_t* base = static_cast<uint8_t*>(qkv8);
  const bool transposed_qk = for_backward && p.recipe == FLAMIA_RECIPE_FP8;

  quant::QuantBatch batch;
  batch.cu = p.cu_seqlens;
  batch.num_docs = p.num_docs;
  batch.total_tokens = p.total_tokens;
  batch.tpad = layout.tpad;
  quant::QuantTensor& q = batch.t[0];
  q = quant::source(p.q, p.q_stride_t, p.q_stride_h, p.hq);
  q.nat = base + layout.q8;
  q.trans = transposed_qk ? base + layout.qt8 : nullptr;
  q.scale = reinterpret_cast<float*>(base + layout.sq);
  quant::QuantTensor& k = batch.t[1];
  k = quant::source(p.k, p.k_stride_t, p.k_stride_h, p.hkv);
  k.nat = base + layout.k8;
  k.trans = transposed_qk ? base + layout.kt8 : nullptr;
  k.scale = reinterpret_cast<float*>(base + layout.sk);
  quant::QuantTensor& v = batch.t[2];
  v = quant::source(p.v, p.v_stride_t, p.v_stride_h, p.hkv);
  v.nat = for_backward ? base + layout.v8 : nullptr;
  v.trans = base + layout.vt8;
  v.scale = reinterpret_cast<float*>(base + layout.sv);

  cudaError_t err = quant::launch_quantize(batch, p.head_dim, p.stream);
  if (err != cudaSuccess) return err;
  return build_work_list(p.cu_seqlens, p.num_docs, p.causal, base, layout, p.stream);
}

}  // namespace sm90
}  // namespace flamia
