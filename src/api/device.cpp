// Device path: tensors on one CUDA device run the sm_90a kernels on the caller's stream.
// Nothing here synchronises the device, except the checking mode (FLAMIA_CHECK=1), which
// reads device data back to validate it and says so.
#include <string>
#include <utility>

#include "api/backend.h"

#if defined(FLAMIA_WITH_CUDA)
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "quantize/quantize.cuh"
#include "sm90/sm90.h"
#endif

namespace flamia {
namespace api {

#if defined(FLAMIA_WITH_CUDA)
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::success();
  return Status::cuda(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Makes the tensors' device current for the call and restores the caller's afterwards
// (kernels launch on the current device; cudaSetDevice does not synchronise). cudaSetDevice
// runs even when the device is already the current one: it also makes the device's primary
// context current on this thread, which the tensor maps' encoding (a driver call) needs and
// which a thread that has made no other CUDA call yet (autograd's backward thread) lacks.
class DeviceGuard {
 public:
  Status enter(int device) {
    FLAMIA_TRY(cuda_status(cudaGetDevice(&previous_), "cudaGetDevice"));
    FLAMIA_TRY(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    switched_ = previous_ != device;
    return Status::success();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

Status check_device_supported(int device) {
  int major = 0, minor = 0;
  FLAMIA_TRY(cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                         "cudaDeviceGetAttribute"));
  FLAMIA_TRY(cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                         "cudaDeviceGetAttribute"));
  if (major == 9 && minor == 0) return Status::success();
  return Status::unsupported("tensors are on cuda:" + std::to_string(device) + " (compute capability " +
                             std::to_string(major) + "." + std::to_string(minor) +
                             "); the GPU kernels need sm_90 (H100/H200)");
}

sm90::Params make_params(const Problem& p, const flamia_attention_args& a) {
  sm90::Params s{};
  s.q = a.q.data;
  s.q_stride_t = effective_stride(a.q, 0);
  s.q_stride_h = effective_stride(a.q, 1);
  s.k = a.k.data;
  s.k_stride_t = effective_stride(a.k, 0);
  s.k_stride_h = effective_stride(a.k, 1);
  s.v = a.v.data;
  s.v_stride_t = effective_stride(a.v, 0);
  s.v_stride_h = effective_stride(a.v, 1);
  s.cu_seqlens = static_cast<const int32_t*>(a.cu_seqlens.data);
  s.q_start = static_cast<const int32_t*>(a.q_start.data);
  s.num_docs = p.num_docs;
  s.total_tokens = p.total_tokens;
  s.max_seqlen = p.max_seqlen;
  s.hq = p.hq;
  s.hkv = p.hkv;
  s.head_dim = p.head_dim;
  s.causal = p.causal;
  s.softmax_scale = p.softmax_scale;
  s.recipe = p.recipe;
  s.stream = static_cast<cudaStream_t>(a.stream);
  return s;
}

// ---- checking mode (FLAMIA_CHECK=1): validation that reads device memory -----------------

// The pointer must be device (or managed) memory of the declared device.
Status check_pointer(const char* name, const void* ptr, int device) {
  if (!ptr) return Status::success();
  cudaPointerAttributes attr{};
  FLAMIA_TRY(cuda_status(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes"));
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (on_device && (attr.type == cudaMemoryTypeManaged || attr.device == device)) return Status::success();
  return Status::invalid(std::string(name) + ": declared on cuda:" + std::to_string(device) +
                         " but the pointer is " +
                         (on_device ? "on cuda:" + std::to_string(attr.device) : std::string("not device memory")) +
                         " (checking mode, FLAMIA_CHECK=1)");
}

// Copies cu_seqlens (and q_start) to the host on the caller's stream and waits for it: a synchronisation,
// which is why it happens only in checking mode.
Status check_cu_seqlens_on_device(const Problem& p, const flamia_attention_args& a) {
  std::vector<int32_t> cu(size_t(p.num_docs) + 1);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  FLAMIA_TRY(cuda_status(cudaMemcpyAsync(cu.data(), a.cu_seqlens.data, cu.size() * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync(cu_seqlens)"));
  FLAMIA_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(checking cu_seqlens)"));
  FLAMIA_TRY(validate_cu_seqlens_values(cu.data(), p.num_docs, p.total_tokens, p.max_seqlen));
  if (!p.has_q_start) return Status::success();
  std::vector<int32_t> qs(size_t(p.num_docs));
  FLAMIA_TRY(cuda_status(cudaMemcpyAsync(qs.data(), a.q_start.data, qs.size() * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync(q_start)"));
  FLAMIA_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(checking q_start)"));
  return validate_q_start_values(qs.data(), cu.data(), p.num_docs);
}

// Gathers a [T, H, D] bf16 device view into a dense host array (one 2-D copy per head).
Status download_rows(const flamia_tensor& t, cudaStream_t stream, std::vector<uint16_t>& host) {
  const int64_t T = t.shape[0], H = t.shape[1], D = t.shape[2];
  host.resize(size_t(T * H * D));
  if (host.empty()) return Status::success();
  const int64_t st = effective_stride(t, 0), sh = effective_stride(t, 1);
  for (int64_t h = 0; h < H; ++h) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + h * sh;
    FLAMIA_TRY(cuda_status(cudaMemcpy2DAsync(&host[size_t(h * D)], size_t(H * D) * 2, src, size_t(st) * 2,
                                             size_t(D) * 2, size_t(T), cudaMemcpyDeviceToHost, stream),
                           "cudaMemcpy2DAsync(checking inputs)"));
  }
  return Status::success();
}

Status check_finite_on_device(const char* name, const flamia_tensor& t, cudaStream_t stream) {
  std::vector<uint16_t> host;
  FLAMIA_TRY(download_rows(t, stream, host));
  FLAMIA_TRY(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize(checking inputs)"));
  return check_finite_rows(name, host.data(), t.shape[0], int(t.shape[1]), int(t.shape[2]));
}

// Everything the checking mode verifies for the common arguments.
Status checking_mode_inputs(const Problem& p, const flamia_attention_args& a) {
  if (!checking_mode()) return Status::success();
  FLAMIA_TRY(check_pointer("cu_seqlens", a.cu_seqlens.data, p.device));
  FLAMIA_TRY(check_pointer("q_start", a.q_start.data, p.device));
  FLAMIA_TRY(check_cu_seqlens_on_device(p, a));
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  // q, k, v without data: the fp8 backward, which reads them from qkv8 (validate_args).
  const std::pair<const char*, const flamia_tensor*> qkv[] = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}};
  for (const auto& [name, t] : qkv) {
    if (!t->data) continue;
    FLAMIA_TRY(check_pointer(name, t->data, p.device));
    FLAMIA_TRY(check_finite_on_device(name, *t, stream));
  }
  return Status::success();
}

// Common preamble of every device call: supported device, current device, checking mode.
// Launches are checked with cudaGetLastError, which also returns an error that an earlier,
// unrelated runtime call on this thread left pending (that call already returned it to its
// caller): it is read and dropped here so that it is not reported as this call's. A sticky
// error (a faulted context) cannot be dropped and still fails the call.
Status prepare(const Problem& p, const flamia_attention_args& a, DeviceGuard& guard) {
  (void)cudaGetLastError();
  FLAMIA_TRY(guard.enter(p.device));
  FLAMIA_TRY(check_device_supported(p.device));
  return checking_mode_inputs(p, a);
}

// Devices this process ran calls on: what flamia_check_errors(-1) inspects.
std::atomic<uint64_t> g_devices_used{0};

void mark_used(int device) {
  if (device >= 0 && device < 64) g_devices_used.fetch_or(uint64_t(1) << device, std::memory_order_relaxed);
}

// Checking mode, qkv8_filled: the buffer must hold this call's quantization (the device
// makes the same comparison without checking mode, guard.h).
Status check_qkv8_fingerprint(const Problem& p, const flamia_attention_args& a, const void* qkv8) {
  std::vector<int32_t> cu(size_t(p.num_docs) + 1);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  FLAMIA_TRY(cuda_status(cudaMemcpyAsync(cu.data(), a.cu_seqlens.data, cu.size() * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync(cu_seqlens)"));
  uint64_t stored = 0;
  FLAMIA_TRY(cuda_status(quant::read_qkv8_fingerprint(make_params(p, a), qkv8, &stored), "read qkv8 fingerprint"));
  const uint64_t want = guard::fingerprint(
      cu.data(), p.num_docs, guard::shape_fingerprint(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe));
  if (stored == want) return Status::success();
  guard::DeviceError e{};
  e.fault = guard::kQkv8Mismatch;
  return Status::invalid(describe_fault(e) + " (checking mode, FLAMIA_CHECK=1)");
}

size_t qkv8_need(const Problem& p, bool for_backward) {
  return sm90::qkv8_bytes(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, for_backward);
}

}  // namespace

Status device_quantize(const Problem& p, const flamia_attention_args& a, void* qkv8, size_t qkv8_bytes,
                       bool for_backward) {
  FLAMIA_TRY(validate_buffer("qkv8", "qkv8_bytes", qkv8, qkv8_bytes, qkv8_need(p, for_backward),
                             for_backward ? "flamia_qkv8_bytes(..., for_backward = 1)"
                                          : "flamia_qkv8_bytes(..., for_backward = 0)"));
  DeviceGuard guard;
  FLAMIA_TRY(prepare(p, a, guard));
  if (p.total_tokens == 0) return Status::success();
  mark_used(p.device);
  return cuda_status(quant::quantize_qkv(make_params(p, a), qkv8, for_backward), "quantize_qkv");
}

Status device_forward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& out,
                      const flamia_tensor& lse, void* qkv8, size_t qkv8_bytes, bool qkv8_filled) {
  FLAMIA_TRY(validate_buffer("qkv8", "qkv8_bytes", qkv8, qkv8_bytes, qkv8_need(p, false),
                             "flamia_qkv8_bytes(..., for_backward = 0)"));
  // A buffer large enough for the backward's layouts gets them too (flamia.h).
  const bool for_backward = qkv8_bytes >= qkv8_need(p, true);
  DeviceGuard guard;
  FLAMIA_TRY(prepare(p, a, guard));
  if (checking_mode()) {
    FLAMIA_TRY(check_pointer("out", out.data, p.device));
    FLAMIA_TRY(check_pointer("lse", lse.data, p.device));
    if (qkv8_filled && p.total_tokens > 0) FLAMIA_TRY(check_qkv8_fingerprint(p, a, qkv8));
  }
  if (p.total_tokens == 0) return Status::success();
  mark_used(p.device);
  sm90::Params params = make_params(p, a);
  params.quantize_beside = !qkv8_filled && sm90::forward_quantize_beside(p.head_dim);
  // The first kernel validates cu_seqlens on the device (and, filled, the fingerprint);
  // the last fills out and lse with NaN if it found a fault (sm90.h).
  if (qkv8_filled) {
    FLAMIA_TRY(cuda_status(quant::check_qkv8(params, qkv8), "check_qkv8"));
  } else if (params.quantize_beside) {
    const quant::BesideLaunch beside = quant::BesideLaunch::for_forward(params);
    FLAMIA_TRY(cuda_status(quant::quantize_qkv(params, qkv8, for_backward, &beside), "quantize_qkv"));
  } else {
    FLAMIA_TRY(cuda_status(quant::quantize_qkv(params, qkv8, for_backward), "quantize_qkv"));
  }
  FLAMIA_TRY(cuda_status(sm90::forward(params, qkv8, out.data, static_cast<float*>(lse.data)), "forward"));
  return cuda_status(quant::poison_forward(params, qkv8, out.data, static_cast<float*>(lse.data)), "poison_forward");
}

Status device_backward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& dout,
                       const flamia_tensor& out, const flamia_tensor& lse, const void* qkv8,
                       size_t qkv8_bytes, void* workspace, size_t workspace_bytes, const flamia_tensor& dq,
                       const flamia_tensor& dk, const flamia_tensor& dv) {
  FLAMIA_TRY(validate_buffer("qkv8", "qkv8_bytes", qkv8, qkv8_bytes, qkv8_need(p, true),
                             "flamia_qkv8_bytes(..., for_backward = 1)"));
  FLAMIA_TRY(device_check_options());
  // The stored dS (fp8_mixed at D = 128 by default) runs where the workspace holds it, so the
  // plain size suffices unless FLAMIA_BWD_DQ=hbm demands it.
  const bool stored_required = sm90::backward_dq_stored_required();
  const size_t ws_need = stored_required ? device_workspace_bytes_for(p)
                                         : device_workspace_bytes(p.total_tokens, p.num_docs, p.hq, p.hkv,
                                                                  p.head_dim, p.recipe);
  FLAMIA_TRY(validate_buffer("workspace", "workspace_bytes", workspace, workspace_bytes, ws_need,
                             stored_required ? "flamia_backward_workspace_bytes_for(args) (FLAMIA_BWD_DQ=hbm)"
                                             : "flamia_backward_workspace_bytes"));
  // sm90::backward reads out with dout's strides (sm90.h), and out is dense.
  if (effective_stride(dout, 0) != int64_t(p.hq) * p.head_dim || effective_stride(dout, 1) != p.head_dim)
    return Status::unsupported("dout: a strided dout is not supported on the device yet (the kernels read dout "
                               "and out with the same strides and out is dense); pass a dense dout");
  DeviceGuard guard;
  FLAMIA_TRY(prepare(p, a, guard));
  if (checking_mode()) {
    const char* names[] = {"dout", "out", "lse", "dq", "dk", "dv"};
    const flamia_tensor* ts[] = {&dout, &out, &lse, &dq, &dk, &dv};
    for (int i = 0; i < 6; ++i) FLAMIA_TRY(check_pointer(names[i], ts[i]->data, p.device));
    FLAMIA_TRY(check_finite_on_device("dout", dout, static_cast<cudaStream_t>(a.stream)));
    if (p.total_tokens > 0) FLAMIA_TRY(check_qkv8_fingerprint(p, a, qkv8));
  }
  if (p.total_tokens == 0) return Status::success();
  mark_used(p.device);
  const sm90::Params params = make_params(p, a);
  const cudaError_t bwd = sm90::backward(params, dout.data, effective_stride(dout, 0), effective_stride(dout, 1),
                                         out.data, static_cast<const float*>(lse.data), qkv8, workspace,
                                         workspace_bytes, dq.data, dk.data, dv.data);
  FLAMIA_TRY(cuda_status(bwd, (std::string("backward (") + sm90::backward_failed_step() + ")").c_str()));
  return cuda_status(quant::poison_backward(params, workspace, dq.data, dk.data, dv.data), "poison_backward");
}

namespace {
const char* stage_name(int32_t stage) {
  switch (stage) {
    case guard::kStageQuantize: return "flamia_quantize_qkv / flamia_forward";
    case guard::kStageForward: return "flamia_forward";
    case guard::kStageBackward: return "flamia_backward";
  }
  return "a call";
}

Status take_errors_of(int device) {
  DeviceGuard on_device;
  FLAMIA_TRY(on_device.enter(device));
  guard::DeviceError e{};
  FLAMIA_TRY(cuda_status(quant::take_sticky_error(&e), "reading the device error record"));
  if (e.fault == guard::kNone) return Status::success();
  return Status::invalid(device_name(device) + ": " + describe_fault(e) + " [recorded on the device by " +
                         stage_name(e.stage) + "; that call's outputs were filled with NaN]");
}
}  // namespace

Status device_take_errors(int device) {
  if (device >= 0) return take_errors_of(device);
  const uint64_t used = g_devices_used.load(std::memory_order_relaxed);
  Status first = Status::success();
  for (int d = 0; d < 64; ++d) {
    if (!(used >> d & 1)) continue;
    Status s = take_errors_of(d);  // every device's record is read and cleared
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

Status device_check_options() {
  if (sm90::backward_dq_option_valid()) return Status::success();
  return Status::invalid(std::string("FLAMIA_BWD_DQ: '") + std::getenv("FLAMIA_BWD_DQ") +
                         "' is not one of auto (the default), recompute, hbm, fused");
}

Status device_backward_dq_path(flamia_recipe recipe, int head_dim, flamia_dq_path* path) {
  FLAMIA_TRY(device_check_options());
  // As sm90::backward picks (the fused dQ first, then the stored dS where it is on).
  if (sm90::backward_dq_fused(recipe, head_dim)) *path = FLAMIA_DQ_FUSED;
  else if (sm90::backward_dq_stored_required()) *path = FLAMIA_DQ_STORED_REQUIRED;
  else if (sm90::backward_dq_stored(recipe, head_dim)) *path = FLAMIA_DQ_STORED;
  else *path = FLAMIA_DQ_RECOMPUTE;
  return Status::success();
}

size_t device_qkv8_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                         flamia_recipe recipe, bool for_backward) {
  return sm90::qkv8_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe, for_backward);
}

size_t device_workspace_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                              flamia_recipe recipe) {
  return sm90::backward_workspace_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe);
}

size_t device_workspace_bytes_for(const Problem& p) {
  return sm90::backward_workspace_bytes_for(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe,
                                            p.max_seqlen, p.causal);
}

bool device_available() { return sm90::device_supported(); }

const char* build_flavour() { return "sm90a"; }

#else  // !FLAMIA_WITH_CUDA

namespace {
Status no_cuda(const Problem& p) {
  return Status::unsupported("tensors are on " + device_name(p.device) +
                             ", but this flamia was built without CUDA (host tensors run the CPU specification)");
}
}  // namespace

Status device_quantize(const Problem& p, const flamia_attention_args&, void*, size_t, bool) { return no_cuda(p); }

Status device_forward(const Problem& p, const flamia_attention_args&, const flamia_tensor&, const flamia_tensor&,
                      void*, size_t, bool) {
  return no_cuda(p);
}

Status device_backward(const Problem& p, const flamia_attention_args&, const flamia_tensor&, const flamia_tensor&,
                       const flamia_tensor&, const void*, size_t, void*, size_t, const flamia_tensor&,
                       const flamia_tensor&, const flamia_tensor&) {
  return no_cuda(p);
}

Status device_take_errors(int device) {
  if (device < 0) return Status::success();  // no device call can have run
  return Status::unsupported("device: cuda:" + std::to_string(device) +
                             " requested, but this flamia was built without CUDA");
}

Status device_check_options() { return Status::success(); }

Status device_backward_dq_path(flamia_recipe, int, flamia_dq_path* path) {
  *path = FLAMIA_DQ_RECOMPUTE;
  return Status::success();
}

size_t device_qkv8_bytes(int64_t, int64_t, int, int, int, flamia_recipe, bool) { return 0; }
size_t device_workspace_bytes(int64_t, int64_t, int, int, int, flamia_recipe) { return 0; }
size_t device_workspace_bytes_for(const Problem&) { return 0; }
bool device_available() { return false; }
const char* build_flavour() { return "cpu only"; }

#endif  // FLAMIA_WITH_CUDA

}  // namespace api
}  // namespace flamia
