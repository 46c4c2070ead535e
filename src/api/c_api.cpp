// The C ABI (include/flamia/flamia.h): validate, dispatch to the host or device path,
// and turn every failure, C++ exceptions included, into a status and a message.
#include <exception>
#include <new>
#include <string>

#include "api/backend.h"
#include "api/status.h"
#include "api/validate.h"
#include "flamia/flamia.h"

namespace flamia {
namespace api {
namespace {

// Runs one entry point; no exception crosses the C boundary.
template <class Fn>
flamia_status guarded(Fn&& fn) {
  try {
    return report(fn());
  } catch (const std::bad_alloc&) {
    return report(Status::unsupported("out of host memory"));
  } catch (const std::exception& e) {
    return report(Status::unsupported(std::string("internal error: ") + e.what()));
  } catch (...) {
    return report(Status::unsupported("internal error"));
  }
}

Status quantize_impl(const flamia_attention_args* args, void* qkv8, size_t qkv8_bytes, bool for_backward) {
  Problem p;
  FLAMIA_TRY(validate_args(args, &p));
  if (p.on_host()) return Status::success();  // the host path quantizes inside each call
  return device_quantize(p, *args, qkv8, qkv8_bytes, for_backward);
}

Status forward_impl(const flamia_attention_args* args, const flamia_tensor& out, const flamia_tensor& lse,
                    void* qkv8, size_t qkv8_bytes, bool qkv8_filled) {
  Problem p;
  FLAMIA_TRY(validate_args(args, &p));
  FLAMIA_TRY(validate_forward_outputs(p, out, lse));
  if (p.on_host()) return host_forward(p, *args, out, lse);
  return device_forward(p, *args, out, lse, qkv8, qkv8_bytes, qkv8_filled);
}

Status backward_impl(const flamia_attention_args* args, const flamia_tensor& dout, const flamia_tensor& out,
                     const flamia_tensor& lse, const void* qkv8, size_t qkv8_bytes, void* workspace,
                     size_t workspace_bytes, const flamia_tensor& dq, const flamia_tensor& dk,
                     const flamia_tensor& dv) {
  Problem p;
  // The device backward reads q, k, v as the forward's quantizer wrote them into qkv8 (FP8
  // codes), so a caller may drop the BF16 tensors after the forward — except fp8_mixed's q
  // and k, whose BF16 values its dS products read (flamia.h).
  const bool qkv_data_optional = args && args->q.device != FLAMIA_DEVICE_HOST;
  FLAMIA_TRY(validate_args(args, &p, qkv_data_optional));
  if (qkv_data_optional && p.recipe == FLAMIA_RECIPE_FP8_MIXED) FLAMIA_TRY(validate_backward_qk(*args));
  FLAMIA_TRY(validate_backward_tensors(p, dout, out, lse, dq, dk, dv));
  if (p.on_host()) return host_backward(p, *args, dout, out, lse, dq, dk, dv);
  return device_backward(p, *args, dout, out, lse, qkv8, qkv8_bytes, workspace, workspace_bytes, dq, dk, dv);
}

#define FLAMIA_STR_(x) #x
#define FLAMIA_STR(x) FLAMIA_STR_(x)
constexpr const char* kVersion =
    "flamia " FLAMIA_STR(FLAMIA_VERSION_MAJOR) "." FLAMIA_STR(FLAMIA_VERSION_MINOR) "." FLAMIA_STR(FLAMIA_VERSION_PATCH);

}  // namespace
}  // namespace api
}  // namespace flamia

using flamia::api::guarded;
using flamia::api::Status;

extern "C" {

size_t flamia_qkv8_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv, int32_t head_dim,
                         flamia_recipe recipe, int32_t for_backward) {
  size_t bytes = 0;
  guarded([&] {
    FLAMIA_TRY(flamia::api::validate_sizes(total_tokens, num_docs, hq, hkv, head_dim, recipe));
    bytes = flamia::api::device_qkv8_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe, for_backward != 0);
    return Status::success();
  });
  return bytes;
}

size_t flamia_backward_workspace_bytes(int64_t total_tokens, int64_t num_docs, int32_t hq, int32_t hkv,
                                       int32_t head_dim, flamia_recipe recipe) {
  size_t bytes = 0;
  guarded([&] {
    FLAMIA_TRY(flamia::api::validate_sizes(total_tokens, num_docs, hq, hkv, head_dim, recipe));
    FLAMIA_TRY(flamia::api::device_check_options());
    bytes = flamia::api::device_workspace_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe);
    return Status::success();
  });
  return bytes;
}

size_t flamia_backward_workspace_bytes_for(const flamia_attention_args* args) {
  size_t bytes = 0;
  guarded([&] {
    flamia::api::Problem p;
    // As flamia_backward: device q, k, v may come without data.
    FLAMIA_TRY(flamia::api::validate_args(args, &p, args && args->q.device != FLAMIA_DEVICE_HOST));
    if (p.on_host()) return Status::success();  // host calls take no workspace
    FLAMIA_TRY(flamia::api::device_check_options());
    bytes = flamia::api::device_workspace_bytes_for(p);
    return Status::success();
  });
  return bytes;
}

flamia_status flamia_backward_dq_path(flamia_recipe recipe, int32_t head_dim, flamia_dq_path* path) {
  return guarded([&] {
    if (path == nullptr) return Status::invalid("path: must not be NULL");
    FLAMIA_TRY(flamia::api::validate_recipe_and_head_dim(recipe, head_dim));
    return flamia::api::device_backward_dq_path(recipe, head_dim, path);
  });
}

flamia_status flamia_quantize_qkv(const flamia_attention_args* args, void* qkv8, size_t qkv8_bytes,
                                  int32_t for_backward) {
  return guarded([&] { return flamia::api::quantize_impl(args, qkv8, qkv8_bytes, for_backward != 0); });
}

flamia_status flamia_forward(const flamia_attention_args* args, flamia_tensor out, flamia_tensor lse, void* qkv8,
                             size_t qkv8_bytes, int32_t qkv8_filled) {
  return guarded([&] { return flamia::api::forward_impl(args, out, lse, qkv8, qkv8_bytes, qkv8_filled != 0); });
}

flamia_status flamia_backward(const flamia_attention_args* args, flamia_tensor dout, flamia_tensor out,
                              flamia_tensor lse, const void* qkv8, size_t qkv8_bytes, void* workspace,
                              size_t workspace_bytes, flamia_tensor dq, flamia_tensor dk, flamia_tensor dv) {
  return guarded([&] {
    return flamia::api::backward_impl(args, dout, out, lse, qkv8, qkv8_bytes, workspace, workspace_bytes, dq, dk,
                                      dv);
  });
}

flamia_status flamia_check_errors(int32_t device) {
  return guarded([&] { return flamia::api::device_take_errors(device); });
}

const char* flamia_last_error(void) { return flamia::api::last_error_message(); }

int32_t flamia_gpu_available(void) {
  try {
    return flamia::api::device_available() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

const char* flamia_version_string(void) {
  static const std::string s = std::string(flamia::api::kVersion) + " (" + flamia::api::build_flavour() + ")";
  return s.c_str();
}

}  // extern "C"
