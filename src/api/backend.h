// The two back ends behind the C ABI, called with validated arguments: the host path runs
// the CPU specification (src/reference), the device path the sm_90a kernels (src/sm90).
#pragma once

#include <cstddef>

#include "api/status.h"
#include "api/validate.h"
#include "flamia/flamia.h"

namespace flamia {
namespace api {

// ---- host: the exact emulation of the quantized algorithm ------------------------------
Status host_forward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& out,
                    const flamia_tensor& lse);
Status host_backward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& dout,
                     const flamia_tensor& out, const flamia_tensor& lse, const flamia_tensor& dq,
                     const flamia_tensor& dk, const flamia_tensor& dv);

// ---- device: GPU kernels on args.stream (FLAMIA_ERROR_UNSUPPORTED without CUDA) --------
Status device_quantize(const Problem& p, const flamia_attention_args& a, void* qkv8, size_t qkv8_bytes,
                       bool for_backward);
Status device_forward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& out,
                      const flamia_tensor& lse, void* qkv8, size_t qkv8_bytes, bool qkv8_filled);
Status device_backward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& dout,
                       const flamia_tensor& out, const flamia_tensor& lse, const void* qkv8,
                       size_t qkv8_bytes, void* workspace, size_t workspace_bytes, const flamia_tensor& dq,
                       const flamia_tensor& dk, const flamia_tensor& dv);

// The run-time switches the backward reads (FLAMIA_BWD_DQ): an error naming the variable when
// one holds a value that is no option, so that a typo fails at the size query already.
Status device_check_options();

// How the device backward of this recipe and head dim forms dQ under FLAMIA_BWD_DQ
// (flamia.h, flamia_backward_dq_path); FLAMIA_DQ_RECOMPUTE without CUDA.
Status device_backward_dq_path(flamia_recipe recipe, int head_dim, flamia_dq_path* path);

// Buffer sizes of the GPU path (0 without CUDA: there is no device buffer to size).
size_t device_qkv8_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                         flamia_recipe recipe, bool for_backward);
size_t device_workspace_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                              flamia_recipe recipe);
// The workspace of one backward call (also the stored dS's part, which needs max_seqlen and
// causal); 0 without CUDA.
size_t device_workspace_bytes_for(const Problem& p);

// Reads and clears the sticky error record of one device (or, device < 0, of every device
// this process ran calls on); a recorded fault becomes FLAMIA_ERROR_INVALID_ARGUMENT with its
// message. Synchronises the device(s).
Status device_take_errors(int device);

bool device_available();
// What this build runs on the device: "sm90a", or "cpu only" without CUDA.
const char* build_flavour();

}  // namespace api
}  // namespace flamia
