#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "flamia/flamia.hpp"
#include "flamia/formats.h"

namespace flamia {
namespace api {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
static_assert(tiles::kQueryTile == FLAMIA_QUERY_TILE, "flamia.h states the kernels' query tile");

std::string list_str(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string dtype_str(flamia_dtype d) {
  const char* n = dtype_name(d);
  return n ? n : "an unknown dtype (" + std::to_string(int(d)) + ")";
}

bool valid_recipe(flamia_recipe r) { return r == FLAMIA_RECIPE_FP8 || r == FLAMIA_RECIPE_FP8_MIXED; }

Status check_head_dim(const char* name, int64_t d) {
  if (d == 64 || d == 128) return Status::success();
  return Status::invalid(std::string(name) + ": head dim unsupported: " + std::to_string(d) +
                         " (supported: 64, 128)");
}

Status check_recipe(flamia_recipe r) {
  if (valid_recipe(r)) return Status::success();
  return Status::invalid("recipe: unknown value " + std::to_string(int(r)) +
                         " (expected FLAMIA_RECIPE_FP8 or FLAMIA_RECIPE_FP8_MIXED)");
}

// How a tensor must be laid out in memory.
enum class Layout {
  kRows,  // last dim contiguous, other strides free (inputs may be views of fused tensors)
  kDense  // row-major dense (outputs and tensors the kernels index as plain arrays)
};

// What one tensor argument must look like.
struct Spec {
  const char* name;
  flamia_dtype dtype;
  const char* dims;  // symbolic shape for messages, e.g. "[T, Hq, D]"
  int ndim;
  int64_t shape[FLAMIA_MAX_DIMS];
  Layout layout;
};

// Every tensor must sit where q sits ("q" is always validated first).
Status check_device(const char* name, const flamia_tensor& t, int32_t device) {
  if (t.device < FLAMIA_DEVICE_HOST)
    return Status::invalid(std::string(name) + ": device " + std::to_string(t.device) +
                           " is neither FLAMIA_DEVICE_HOST (-1) nor a CUDA device ordinal");
  if (t.device != device)
    return Status::invalid("device mismatch: q on " + device_name(device) + ", " + name + " on " +
                           device_name(t.device));
  return Status::success();
}

Status check_dtype(const char* name, const flamia_tensor& t, flamia_dtype want) {
  if (t.dtype == want) return Status::success();
  return Status::invalid(std::string(name) + ": expected dtype " + dtype_name(want) + ", got " +
                         dtype_str(t.dtype));
}

Status check_ndim(const char* name, const flamia_tensor& t, int ndim, const char* dims) {
  if (t.ndim == ndim) return Status::success();
  return Status::invalid(std::string(name) + ": expected " + std::to_string(ndim) + (ndim == 1 ? " dim " : " dims ") + dims +
                         ", got " + std::to_string(t.ndim));
}

// Device, dtype and rank: enough to read sizes off the tensor.
Status check_kind(const Spec& s, const flamia_tensor& t, int32_t device) {
  FLAMIA_TRY(check_device(s.name, t, device));
  FLAMIA_TRY(check_dtype(s.name, t, s.dtype));
  return check_ndim(s.name, t, s.ndim, s.dims);
}

Status check_shape(const Spec& s, const flamia_tensor& t) {
  for (int i = 0; i < s.ndim; ++i)
    if (t.shape[i] != s.shape[i])
      return Status::invalid(std::string(s.name) + ": expected shape " + s.dims + " = " +
                             list_str(s.shape, s.ndim) + ", got " + list_str(t.shape, t.ndim));
  return Status::success();
}

Status check_strides(const Spec& s, const flamia_tensor& t) {
  const std::string name = s.name;
  int64_t eff[FLAMIA_MAX_DIMS] = {};
  for (int i = 0; i < s.ndim; ++i) eff[i] = effective_stride(t, i);
  for (int i = 0; i < s.ndim; ++i)
    if (eff[i] < 0)
      return Status::invalid(name + ": negative strides are not supported, got strides " +
                             list_str(t.strides, t.ndim));
  if (s.layout == Layout::kDense) {
    int64_t dense = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
      if (eff[i] != dense)
        return Status::invalid(name + ": expected a dense (row-major contiguous) " + s.dims +
                               " tensor, got strides " + list_str(t.strides, t.ndim));
      dense *= t.shape[i];
    }
    return Status::success();
  }
  if (eff[s.ndim - 1] != 1)
    return Status::invalid(name + ": last dim must be contiguous (stride 1), got strides " +
                           list_str(t.strides, t.ndim));
  // The largest offset addressed must be representable (shapes are already bounded).
  int64_t last = 0;
  for (int i = 0; i < s.ndim; ++i) {
    int64_t term = 0;
    if (t.shape[i] > 0 && (__builtin_mul_overflow(t.shape[i] - 1, eff[i], &term) ||
                           __builtin_add_overflow(last, term, &last)))
      return Status::invalid(name + ": strides " + list_str(t.strides, t.ndim) +
                             " overflow the address range");
  }
  if (t.device != FLAMIA_DEVICE_HOST) {
    // The kernels load rows with TMA, whose strides must be multiples of 16 bytes.
    for (int i = 0; i + 1 < s.ndim; ++i)
      if ((uint64_t(eff[i]) * flamia::dtype_size(s.dtype)) % kDeviceAlignment != 0)
        return Status::invalid(name + ": strides must be multiples of 16 bytes on the device, got strides " +
                               list_str(t.strides, t.ndim) + " (elements of " +
                               std::to_string(flamia::dtype_size(s.dtype)) + " bytes)");
  }
  return Status::success();
}

Status check_data(const Spec& s, const flamia_tensor& t) {
  const std::string name = s.name;
  const int64_t n = flamia::numel(t);
  if (n == 0) return Status::success();
  if (!t.data)
    return Status::invalid(name + ": data pointer is null but the tensor has " + std::to_string(n) +
                           " elements");
  const uintptr_t align = t.device == FLAMIA_DEVICE_HOST || s.dtype == FLAMIA_DTYPE_INT32
                              ? flamia::dtype_size(s.dtype)
                              : kDeviceAlignment;
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0)
    return Status::invalid(name + ": data pointer " + ptr_str(t.data) + " is not " + std::to_string(align) +
                           "-byte aligned" +
                           (align == kDeviceAlignment ? " (required on the device)" : " (its element size)"));
  return Status::success();
}

Status check_tensor(const Spec& s, const flamia_tensor& t, int32_t device, bool data_optional = false) {
  FLAMIA_TRY(check_kind(s, t, device));
  FLAMIA_TRY(check_shape(s, t));
  FLAMIA_TRY(check_strides(s, t));
  return data_optional && !t.data ? Status::success() : check_data(s, t);
}

// Sizes read off q: T fits cu_seqlens' int32, and T * H * D elements fit int64 bytes.
Status check_q_sizes(const flamia_tensor& q) {
  const int64_t T = q.shape[0], H = q.shape[1], D = q.shape[2];
  if (T < 0 || T > kInt32Max)
    return Status::invalid("q: T = " + std::to_string(T) + " is out of range [0, 2^31 - 1] (cu_seqlens is int32)");
  if (H < 1 || H > kInt32Max)
    return Status::invalid("q: Hq = " + std::to_string(H) + " is out of range [1, 2^31 - 1]");
  FLAMIA_TRY(check_head_dim("q", D));
  int64_t n = 0;
  if (__builtin_mul_overflow(T, H * D, &n) || n > std::numeric_limits<int64_t>::max() / 8)
    return Status::invalid("q: " + list_str(q.shape, 3) + " has too many elements");
  return Status::success();
}

Status check_hkv(int64_t hq, int64_t hkv) {
  if (hkv < 1 || hkv > kInt32Max)
    return Status::invalid("k: Hkv = " + std::to_string(hkv) + " is out of range [1, 2^31 - 1]");
  if (hq % hkv != 0)
    return Status::invalid("k: Hq = " + std::to_string(hq) + " (from q) is not a multiple of Hkv = " +
                           std::to_string(hkv));
  return Status::success();
}

Status check_cu_seqlens(const flamia_tensor& cu, int32_t device) {
  const Spec s{"cu_seqlens", FLAMIA_DTYPE_INT32, "[B + 1]", 1, {cu.shape[0]}, Layout::kDense};
  FLAMIA_TRY(check_kind(s, cu, device));
  if (cu.shape[0] < 2)
    return Status::invalid("cu_seqlens: expected B + 1 >= 2 entries (at least one document), got " +
                           std::to_string(cu.shape[0]));
  if (cu.shape[0] - 1 > kInt32Max)
    return Status::invalid("cu_seqlens: " + std::to_string(cu.shape[0]) + " entries is too many");
  return check_tensor(s, cu, device);
}

// q_start is optional: absent when its data is null, whatever its shape says.
Status check_q_start(const flamia_tensor& qs, int64_t num_docs, int32_t device) {
  if (!qs.data) return Status::success();
  const Spec s{"q_start", FLAMIA_DTYPE_INT32, "[B]", 1, {num_docs}, Layout::kDense};
  return check_tensor(s, qs, device);
}

Status check_scalars(const flamia_attention_args& a) {
  if (a.max_seqlen < 1)
    return Status::invalid("max_seqlen: must be >= 1, got " + std::to_string(a.max_seqlen));
  if (!std::isfinite(a.softmax_scale) || a.softmax_scale < 0.0f)
    return Status::invalid("softmax_scale: must be finite and >= 0 (0 selects 1/sqrt(D)), got " +
                           std::to_string(a.softmax_scale));
  return check_recipe(a.recipe);
}

}  // namespace

const char* dtype_name(flamia_dtype d) {
  switch (d) {
    case FLAMIA_DTYPE_BF16: return "bf16";
    case FLAMIA_DTYPE_FP32: return "fp32";
    case FLAMIA_DTYPE_INT32: return "int32";
    case FLAMIA_DTYPE_UINT8: return "uint8";
  }
  return nullptr;
}

std::string device_name(int32_t device) {
  if (device == FLAMIA_DEVICE_HOST) return "host";
  if (device >= 0) return "cuda:" + std::to_string(device);
  return "invalid device " + std::to_string(device);
}

float resolve_softmax_scale(float requested, int head_dim) {
  return requested != 0.0f ? requested : 1.0f / std::sqrt(float(head_dim));
}

bool checking_mode() {
  // Read on every call (a getenv is negligible next to a launch) so tests and users can
  // toggle it at run time.
  const char* v = std::getenv("FLAMIA_CHECK");
  return v && *v && std::strcmp(v, "0") != 0;
}

int64_t effective_stride(const flamia_tensor& t, int dim) {
  if (t.shape[dim] != 1) return t.strides[dim];
  int64_t dense = 1;
  for (int i = dim + 1; i < t.ndim; ++i) dense *= t.shape[i];
  return dense;
}

Status validate_backward_qk(const flamia_attention_args& a) {
  for (const auto& [name, t] : {std::pair<const char*, const flamia_tensor*>{"q", &a.q}, {"k", &a.k}}) {
    if (!t->data && flamia::numel(*t) > 0)
      return Status::invalid(std::string(name) + ": data pointer is null, but recipe fp8_mixed's backward on the "
                             "device reads q and k (its dS products take their BF16 values): pass the forward's " +
                             name);
    FLAMIA_TRY(check_data({name, FLAMIA_DTYPE_BF16, "", 3, {}, Layout::kRows}, *t));
  }
  return Status::success();
}

Status validate_args(const flamia_attention_args* args, Problem* p, bool qkv_data_optional) {
  if (!args) return Status::invalid("args: null pointer");
  const flamia_attention_args& a = *args;
  const int32_t device = a.q.device;  // q decides; every other tensor must match it

  const Spec q_kind{"q", FLAMIA_DTYPE_BF16, "[T, Hq, D]", 3, {}, Layout::kRows};
  FLAMIA_TRY(check_kind(q_kind, a.q, device));
  FLAMIA_TRY(check_q_sizes(a.q));
  const int64_t T = a.q.shape[0], hq = a.q.shape[1], D = a.q.shape[2];
  FLAMIA_TRY(check_tensor({"q", FLAMIA_DTYPE_BF16, "[T, Hq, D]", 3, {T, hq, D}, Layout::kRows}, a.q, device,
                          qkv_data_optional));

  const Spec k_kind{"k", FLAMIA_DTYPE_BF16, "[T, Hkv, D]", 3, {}, Layout::kRows};
  FLAMIA_TRY(check_kind(k_kind, a.k, device));
  const int64_t hkv = a.k.shape[1];
  FLAMIA_TRY(check_hkv(hq, hkv));
  FLAMIA_TRY(check_tensor({"k", FLAMIA_DTYPE_BF16, "[T, Hkv, D]", 3, {T, hkv, D}, Layout::kRows}, a.k, device,
                          qkv_data_optional));
  FLAMIA_TRY(check_tensor({"v", FLAMIA_DTYPE_BF16, "[T, Hkv, D]", 3, {T, hkv, D}, Layout::kRows}, a.v, device,
                          qkv_data_optional));

  FLAMIA_TRY(check_cu_seqlens(a.cu_seqlens, device));
  FLAMIA_TRY(check_q_start(a.q_start, a.cu_seqlens.shape[0] - 1, device));
  FLAMIA_TRY(check_scalars(a));

  p->total_tokens = T;
  p->num_docs = int(a.cu_seqlens.shape[0] - 1);
  p->hq = int(hq);
  p->hkv = int(hkv);
  p->head_dim = int(D);
  p->max_seqlen = a.max_seqlen;
  p->causal = a.causal != 0;
  p->softmax_scale = resolve_softmax_scale(a.softmax_scale, int(D));
  p->recipe = a.recipe;
  p->device = device;
  p->has_q_start = a.q_start.data != nullptr;
  // Host values are checked always (cheap); device values only in checking mode, by the
  // device path, because reading them costs a synchronisation.
  if (p->on_host()) {
    const int32_t* cu = static_cast<const int32_t*>(a.cu_seqlens.data);
    FLAMIA_TRY(validate_cu_seqlens_values(cu, p->num_docs, T, p->max_seqlen));
    if (p->has_q_start)
      FLAMIA_TRY(validate_q_start_values(static_cast<const int32_t*>(a.q_start.data), cu, p->num_docs));
  }
  return Status::success();
}

guard::DeviceError find_cu_fault(const int32_t* cu, int num_docs, int64_t total_tokens, int max_seqlen,
                                 int32_t stage) {
  uint64_t key = guard::kNoFaultKey;
  for (int64_t i = 0; i <= num_docs; ++i) {
    const int32_t f = guard::entry_fault(cu, i, num_docs, total_tokens, max_seqlen);
    if (f != guard::kNone) key = std::min(key, guard::fault_key(f, i));
  }
  if (key == guard::kNoFaultKey) return guard::DeviceError{guard::kNone, stage, 0, 0, 0};
  return guard::make_error(guard::key_fault(key), guard::key_index(key), cu, total_tokens, max_seqlen, stage);
}

std::string describe_fault(const guard::DeviceError& e) {
  const std::string i = std::to_string(e.index), a = std::to_string(e.a), b = std::to_string(e.b);
  switch (e.fault) {
    case guard::kNone: return "no error";
    case guard::kCuFirstNotZero: return "cu_seqlens: cu_seqlens[0] must be 0, got " + a;
    case guard::kCuDecreasing:
      return "cu_seqlens: must be non-decreasing, got cu_seqlens[" + i + "] = " + a + " < cu_seqlens[" +
             std::to_string(e.index - 1) + "] = " + b;
    case guard::kCuLastNotT:
      return "cu_seqlens: last entry cu_seqlens[" + i + "] = " + a + " must equal T = " + b + " (q.shape[0])";
    case guard::kCuLongerThanMax:
      return "max_seqlen: " + b + " is less than the length " + a + " of document " + i + " (cu_seqlens[" +
             std::to_string(e.index + 1) + "] - cu_seqlens[" + i + "])";
    case guard::kWorkListOverflow:
      return "cu_seqlens: the documents need more work items than the qkv8 buffer holds";
    case guard::kQStartInvalid:
      return "q_start: q_start[" + i + "] = " + a + " must be a multiple of " + std::to_string(tiles::kQueryTile) +
             " in [0, " + b + "] (the length of document " + i + ")";
    case guard::kQkv8Mismatch:
      return "qkv8: holds q, k, v quantized for a different cu_seqlens (or T, B, heads, head dim, recipe) "
             "than this call's; quantize again (flamia_quantize_qkv, or qkv8_filled = 0). A rejected qkv8 "
             "stays rejected until it is quantized again";
  }
  return "unknown device error code " + std::to_string(e.fault);
}

Status validate_q_start_values(const int32_t* q_start, const int32_t* cu, int num_docs) {
  for (int b = 0; b < num_docs; ++b)
    if (!guard::q_start_valid(q_start[b], int64_t(cu[b + 1]) - cu[b]))
      return Status::invalid(describe_fault(guard::make_error(guard::kQStartInvalid, b, cu, 0, 0, 0, q_start)));
  return Status::success();
}

Status validate_cu_seqlens_values(const int32_t* cu, int num_docs, int64_t total_tokens, int max_seqlen) {
  const guard::DeviceError e = find_cu_fault(cu, num_docs, total_tokens, max_seqlen, 0);
  return e.fault == guard::kNone ? Status::success() : Status::invalid(describe_fault(e));
}

Status validate_forward_outputs(const Problem& p, const flamia_tensor& out, const flamia_tensor& lse) {
  const int64_t T = p.total_tokens;
  FLAMIA_TRY(check_tensor({"out", FLAMIA_DTYPE_BF16, "[T, Hq, D]", 3, {T, p.hq, p.head_dim}, Layout::kDense},
                          out, p.device));
  return check_tensor({"lse", FLAMIA_DTYPE_FP32, "[Hq, T]", 2, {p.hq, T}, Layout::kDense}, lse, p.device);
}

Status validate_backward_tensors(const Problem& p, const flamia_tensor& dout, const flamia_tensor& out,
                                 const flamia_tensor& lse, const flamia_tensor& dq, const flamia_tensor& dk,
                                 const flamia_tensor& dv) {
  const int64_t T = p.total_tokens, D = p.head_dim;
  FLAMIA_TRY(check_tensor({"dout", FLAMIA_DTYPE_BF16, "[T, Hq, D]", 3, {T, p.hq, D}, Layout::kRows}, dout,
                          p.device));
  FLAMIA_TRY(validate_forward_outputs(p, out, lse));
  FLAMIA_TRY(check_tensor({"dq", FLAMIA_DTYPE_BF16, "[T, Hq, D]", 3, {T, p.hq, D}, Layout::kDense}, dq,
                          p.device));
  FLAMIA_TRY(check_tensor({"dk", FLAMIA_DTYPE_BF16, "[T, Hkv, D]", 3, {T, p.hkv, D}, Layout::kDense}, dk,
                          p.device));
  return check_tensor({"dv", FLAMIA_DTYPE_BF16, "[T, Hkv, D]", 3, {T, p.hkv, D}, Layout::kDense}, dv,
                      p.device);
}

Status validate_sizes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv, int32_t head_dim,
                      flamia_recipe recipe) {
  if (total_tokens < 0 || total_tokens > kInt32Max)
    return Status::invalid("total_tokens: " + std::to_string(total_tokens) + " is out of range [0, 2^31 - 1]");
  if (num_docs < 1 || num_docs > kInt32Max)
    return Status::invalid("num_docs: " + std::to_string(num_docs) + " is out of range [1, 2^31 - 1]");
  if (hq < 1) return Status::invalid("hq: must be >= 1, got " + std::to_string(hq));
  if (hkv < 1) return Status::invalid("hkv: must be >= 1, got " + std::to_string(hkv));
  if (hq % hkv != 0)
    return Status::invalid("hkv: Hq = " + std::to_string(hq) + " is not a multiple of Hkv = " + std::to_string(hkv));
  FLAMIA_TRY(check_head_dim("head_dim", head_dim));
  return check_recipe(recipe);
}

Status validate_recipe_and_head_dim(flamia_recipe recipe, int32_t head_dim) {
  FLAMIA_TRY(check_recipe(recipe));
  return check_head_dim("head_dim", head_dim);
}

Status check_finite_rows(const char* name, const uint16_t* x, int64_t tokens, int heads, int dim) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h) {
      const uint16_t* row = x + (t * heads + h) * dim;
      for (int d = 0; d < dim; ++d)
        if (!fmt::is_finite_f32(fmt::bf16_bits_to_f32(row[d])))
          return Status::nonfinite(std::string(name) + ": NaN or Inf at token " + std::to_string(t) +
                                   ", head " + std::to_string(h) + ", index " + std::to_string(d) +
                                   " (checking mode, FLAMIA_CHECK=1)");
    }
  return Status::success();
}

Status validate_buffer(const char* name, const char* bytes_name, const void* ptr, size_t have, size_t need,
                       const char* sizer) {
  if (have < need)
    return Status::invalid(std::string(bytes_name) + ": " + std::to_string(have) + " is less than the " +
                           std::to_string(need) + " bytes required (" + sizer + ")");
  if (need == 0) return Status::success();
  if (!ptr)
    return Status::invalid(std::string(name) + ": null pointer, but " + std::to_string(need) +
                           " bytes are required");
  if (reinterpret_cast<uintptr_t>(ptr) % kDeviceAlignment != 0)
    return Status::invalid(std::string(name) + ": pointer " + ptr_str(ptr) + " is not 16-byte aligned");
  return Status::success();
}

}  // namespace api
}  // namespace flamia
