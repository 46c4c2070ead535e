// Validation of every argument of the C ABI. Each check returns a Status whose message
// names the argument and what was expected; the sizes of the problem are resolved from
// the tensors on the way (q gives T, Hq and D; k gives Hkv; cu_seqlens gives B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/status.h"
#include "flamia/flamia.h"
#include "quantize/guard.h"

namespace flamia {
namespace api {

// Alignment of every tensor and buffer on the device: what TMA and 16-byte vector loads
// need. cu_seqlens only needs its natural 4 (kernels read it with scalar loads).
constexpr uintptr_t kDeviceAlignment = 16;

// Sizes and options of one validated call.
struct Problem {
  int64_t total_tokens = 0;  // T
  int num_docs = 0;          // B
  int hq = 0, hkv = 0, head_dim = 0;
  int max_seqlen = 0;
  bool causal = false;
  float softmax_scale = 0.0f;  // resolved: never 0
  flamia_recipe recipe = FLAMIA_RECIPE_FP8;
  int device = FLAMIA_DEVICE_HOST;  // where every tensor lives
  bool has_q_start = false;         // args.q_start given (its data non-null)
  bool on_host() const { return device == FLAMIA_DEVICE_HOST; }
};

// softmax_scale as the call uses it: 0 selects 1/sqrt(D), computed in FP32 as the
// reference harness and the kernels do.
float resolve_softmax_scale(float requested, int head_dim);

// FLAMIA_CHECK=1 (any value but empty or "0") turns on the checks that cost a device
// round trip or a pass over the data: device cu_seqlens values, pointer locations, and
// NaN/Inf in inputs.
bool checking_mode();

const char* dtype_name(flamia_dtype d);
std::string device_name(int32_t device);

// q, k, v, cu_seqlens (shape, dtype, layout, device; values too for host cu_seqlens) and
// the scalar arguments. Fills *p. qkv_data_optional: q, k, v may come without data (shape,
// dtype, device and strides still checked) — the device backward of recipe fp8, which reads
// them only through the forward's qkv8 buffer.
Status validate_args(const flamia_attention_args* args, Problem* p, bool qkv_data_optional = false);
// Recipe fp8_mixed's device backward reads q and k themselves: they must have data (16-byte
// aligned; shapes and strides as validate_args checked them).
Status validate_backward_qk(const flamia_attention_args& a);

// Values of cu_seqlens (host memory): 0 = cu[0] <= ... <= cu[B] = T and every document no
// longer than max_seqlen. The first fault in guard.h's order, as the device reports it.
Status validate_cu_seqlens_values(const int32_t* cu, int num_docs, int64_t total_tokens, int max_seqlen);
guard::DeviceError find_cu_fault(const int32_t* cu, int num_docs, int64_t total_tokens, int max_seqlen,
                                 int32_t stage);

// Values of q_start (host memory; cu_seqlens already valid): each a multiple of
// FLAMIA_QUERY_TILE in [0, L_b]. The first fault, as the device reports it.
Status validate_q_start_values(const int32_t* q_start, const int32_t* cu, int num_docs);

// The message of a fault (host check or device record), naming the argument and the
// broken invariant.
std::string describe_fault(const guard::DeviceError& e);

// out [T, Hq, D] bf16 dense, lse [Hq, T] fp32 dense.
Status validate_forward_outputs(const Problem& p, const flamia_tensor& out, const flamia_tensor& lse);

// dout [T, Hq, D] bf16 (last dim contiguous), out [T, Hq, D] and lse [Hq, T] dense as the
// forward wrote them, dq [T, Hq, D], dk and dv [T, Hkv, D] bf16 dense.
Status validate_backward_tensors(const Problem& p, const flamia_tensor& dout, const flamia_tensor& out,
                                 const flamia_tensor& lse, const flamia_tensor& dq, const flamia_tensor& dk,
                                 const flamia_tensor& dv);

// Sizes passed to flamia_qkv8_bytes / flamia_backward_workspace_bytes.
Status validate_sizes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv, int32_t head_dim,
                      flamia_recipe recipe);

// A recipe and a head dim the kernels support (flamia_backward_dq_path's arguments).
Status validate_recipe_and_head_dim(flamia_recipe recipe, int32_t head_dim);

// A caller-provided device buffer: at least `need` bytes, aligned, non-null when need > 0.
Status validate_buffer(const char* name, const char* bytes_name, const void* ptr, size_t have, size_t need,
                       const char* sizer);

// Checking mode: FLAMIA_ERROR_NONFINITE naming the first NaN/Inf of a dense bf16
// [tokens, heads, dim] tensor.
Status check_finite_rows(const char* name, const uint16_t* x, int64_t tokens, int heads, int dim);

// Stride of dimension `dim` as the kernels should use it: a size-1 dimension's stride is
// never used to address memory, so callers may pass anything there; it is replaced by the
// dense stride so that descriptors built from it stay valid.
int64_t effective_stride(const flamia_tensor& t, int dim);

}  // namespace api
}  // namespace flamia
