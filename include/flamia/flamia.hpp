// flamia C++ header: thin, header-only wrappers over the C ABI (flamia.h).
//
// Nothing here owns memory: tensors are views the caller keeps alive. Every wrapper
// throws flamia::Error (status + message from flamia_last_error()) instead of returning
// a status.
//
//   std::vector<uint16_t> q(T * Hq * D), k(...), v(...), out(...);
//   std::vector<float> lse(Hq * T);
//   std::vector<int32_t> cu = {0, 100, 250};
//   auto args = flamia::make_args(flamia::bf16_view(q.data(), T, Hq, D),
//                                 flamia::bf16_view(k.data(), T, Hkv, D),
//                                 flamia::bf16_view(v.data(), T, Hkv, D),
//                                 flamia::cu_seqlens_view(cu.data(), 2), /*max_seqlen=*/150);
//   flamia::forward(args, flamia::bf16_view(out.data(), T, Hq, D),
//                   flamia::lse_view(lse.data(), Hq, T));
#ifndef FLAMIA_FLAMIA_HPP
#define FLAMIA_FLAMIA_HPP

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "flamia/flamia.h"

namespace flamia {

// A failed call: the C status and the message naming the offending argument.
class Error : public std::runtime_error {
 public:
  Error(flamia_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  flamia_status status() const noexcept { return status_; }

 private:
  flamia_status status_;
};

// Throws flamia::Error for any status but FLAMIA_SUCCESS.
inline void check(flamia_status status) {
  if (status != FLAMIA_SUCCESS) throw Error(status, flamia_last_error());
}

// ---- tensor views -----------------------------------------------------------------------

inline size_t dtype_size(flamia_dtype dtype) {
  switch (dtype) {
    case FLAMIA_DTYPE_BF16: return 2;
    case FLAMIA_DTYPE_FP32: return 4;
    case FLAMIA_DTYPE_INT32: return 4;
    case FLAMIA_DTYPE_UINT8: return 1;
  }
  return 0;
}

// A dense row-major view (strides derived from the shape).
inline flamia_tensor make_tensor(const void* data, flamia_dtype dtype, std::initializer_list<int64_t> shape,
                                 int32_t device = FLAMIA_DEVICE_HOST) {
  if (shape.size() > FLAMIA_MAX_DIMS) throw Error(FLAMIA_ERROR_INVALID_ARGUMENT, "make_tensor: too many dims");
  flamia_tensor t{};
  t.data = const_cast<void*>(data);  // the C ABI takes inputs through the same struct
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  t.device = device;
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// A strided view; strides in elements.
inline flamia_tensor make_strided_tensor(const void* data, flamia_dtype dtype, std::initializer_list<int64_t> shape,
                                         std::initializer_list<int64_t> strides,
                                         int32_t device = FLAMIA_DEVICE_HOST) {
  if (strides.size() != shape.size())
    throw Error(FLAMIA_ERROR_INVALID_ARGUMENT, "make_strided_tensor: shape and strides differ in length");
  flamia_tensor t = make_tensor(data, dtype, shape, device);
  int i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

// [T, H, D] bf16, dense: q, k, v, out, dout, dq, dk, dv.
inline flamia_tensor bf16_view(const void* data, int64_t tokens, int64_t heads, int64_t head_dim,
                               int32_t device = FLAMIA_DEVICE_HOST) {
  return make_tensor(data, FLAMIA_DTYPE_BF16, {tokens, heads, head_dim}, device);
}

// [T, H, D] bf16 with a token stride of `token_stride` elements, e.g. q, k or v as a view of
// a fused [T, Hq + 2 Hkv, D] projection output.
inline flamia_tensor bf16_rows_view(const void* data, int64_t tokens, int64_t heads, int64_t head_dim,
                                    int64_t token_stride, int32_t device = FLAMIA_DEVICE_HOST) {
  return make_strided_tensor(data, FLAMIA_DTYPE_BF16, {tokens, heads, head_dim}, {token_stride, head_dim, 1},
                             device);
}

// [Hq, T] fp32, dense.
inline flamia_tensor lse_view(const void* data, int64_t heads, int64_t tokens, int32_t device = FLAMIA_DEVICE_HOST) {
  return make_tensor(data, FLAMIA_DTYPE_FP32, {heads, tokens}, device);
}

// [B + 1] int32.
inline flamia_tensor cu_seqlens_view(const int32_t* data, int64_t num_docs, int32_t device = FLAMIA_DEVICE_HOST) {
  return make_tensor(data, FLAMIA_DTYPE_INT32, {num_docs + 1}, device);
}

// args.q_start (flamia.h): document b's queries start at data[b].
inline flamia_tensor q_start_view(const int32_t* data, int64_t num_docs, int32_t device = FLAMIA_DEVICE_HOST) {
  return make_tensor(data, FLAMIA_DTYPE_INT32, {num_docs}, device);
}

inline int64_t numel(const flamia_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// ---- calls ------------------------------------------------------------------------------

inline flamia_attention_args make_args(flamia_tensor q, flamia_tensor k, flamia_tensor v, flamia_tensor cu_seqlens,
                                       int32_t max_seqlen, bool causal = true, float softmax_scale = 0.0f,
                                       flamia_recipe recipe = FLAMIA_RECIPE_FP8, void* stream = nullptr) {
  flamia_attention_args a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.cu_seqlens = cu_seqlens;
  a.max_seqlen = max_seqlen;
  a.causal = causal ? 1 : 0;
  a.softmax_scale = softmax_scale;
  a.recipe = recipe;
  a.stream = stream;
  return a;
}

// Buffer sizes for device calls: 0 for invalid sizes (flamia_last_error() says why) and in a
// build without CUDA (host calls need no buffers).
inline size_t qkv8_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv, int32_t head_dim,
                         flamia_recipe recipe, bool for_backward) {
  return flamia_qkv8_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe, for_backward ? 1 : 0);
}

inline size_t backward_workspace_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv,
                                       int32_t head_dim, flamia_recipe recipe) {
  return flamia_backward_workspace_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe);
}

inline size_t backward_workspace_bytes(const flamia_attention_args& args) {
  return flamia_backward_workspace_bytes_for(&args);
}

// How the device backward forms dQ (flamia_backward_dq_path); throws on an invalid
// FLAMIA_BWD_DQ, recipe or head dim.
inline flamia_dq_path backward_dq_path(flamia_recipe recipe, int32_t head_dim) {
  flamia_dq_path path = FLAMIA_DQ_RECOMPUTE;
  check(flamia_backward_dq_path(recipe, head_dim, &path));
  return path;
}

inline void quantize_qkv(const flamia_attention_args& args, void* qkv8, size_t qkv8_bytes, bool for_backward) {
  check(flamia_quantize_qkv(&args, qkv8, qkv8_bytes, for_backward ? 1 : 0));
}

inline void forward(const flamia_attention_args& args, flamia_tensor out, flamia_tensor lse, void* qkv8 = nullptr,
                    size_t qkv8_bytes = 0, bool qkv8_filled = false) {
  check(flamia_forward(&args, out, lse, qkv8, qkv8_bytes, qkv8_filled ? 1 : 0));
}

inline void backward(const flamia_attention_args& args, flamia_tensor dout, flamia_tensor out, flamia_tensor lse,
                     flamia_tensor dq, flamia_tensor dk, flamia_tensor dv, const void* qkv8 = nullptr,
                     size_t qkv8_bytes = 0, void* workspace = nullptr, size_t workspace_bytes = 0) {
  check(flamia_backward(&args, dout, out, lse, qkv8, qkv8_bytes, workspace, workspace_bytes, dq, dk, dv));
}

// Throws the error recorded on the device (flamia_check_errors) if there is one; device -1:
// every device this process ran calls on. Synchronises the device(s).
inline void check_errors(int32_t device = -1) { check(flamia_check_errors(device)); }

inline bool gpu_available() { return flamia_gpu_available() != 0; }
inline std::string version() { return flamia_version_string(); }
inline std::string last_error() { return flamia_last_error(); }

}  // namespace flamia

#endif  // FLAMIA_FLAMIA_HPP
