// One attention call as the device code receives it, after the API layer validated it: the
// quantizer (quantize/) and the sm_90a kernels (sm90/) both take it.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "flamia/flamia.h"

namespace flamia {

// One packed problem on the device. Strides are in elements; the head_dim axis is
// contiguous. q/k/v may be strided views (e.g. of a fused qkv tensor).
struct DeviceCall {
  const void* q; int64_t q_stride_t, q_stride_h;   // bf16 [T, Hq, D]
  const void* k; int64_t k_stride_t, k_stride_h;   // bf16 [T, Hkv, D]
  const void* v; int64_t v_stride_t, v_stride_h;   // bf16 [T, Hkv, D]
  const int32_t* cu_seqlens;                       // [num_docs + 1], device
  const int32_t* q_start;                          // [num_docs] or null (flamia.h)
  int num_docs;
  int64_t total_tokens;
  int max_seqlen;
  int hq, hkv, head_dim;
  bool causal;
  float softmax_scale;                             // resolved (never 0)
  flamia_recipe recipe;
  cudaStream_t stream;
  // The fast forward after a quantize_qkv that ran beside it (quantize.cuh): it waits for the
  // quantizer's counts instead of for its grid.
  bool quantize_beside;
};

}  // namespace flamia
