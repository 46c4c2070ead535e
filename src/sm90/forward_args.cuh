// Kernel arguments of the reference forwards, shared by the mma.sync (forward.cu) and wgmma
// (forward_wgmma.cu) mainloops: both read the same qkv8 regions and write the same outputs.
// set_forward_common fills what the fast forward's parameters (fwd::Params) carry as well.
#pragma once

#include <cstdint>

#include "flamia/formats.h"
#include "quantize/layout.cuh"
#include "sm90/schedule.cuh"
#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {

struct FwdArgs {
  const uint8_t* q8;   // [T, Hq, D]
  const uint8_t* k8;   // [T, Hkv, D]
  const uint8_t* vt8;  // [Hkv][D][Tpad]
  const float* sq;     // [Hq][T]
  const float* sk;     // [Hkv][T]
  const float* sv;     // [Hkv][T]
  const int32_t* cu_seqlens;
  const int32_t* q_start;  // [B] or null (flamia.h)
  WorkList work;
  uint16_t* out;       // bf16 [T, Hq, D]
  float* lse;          // [Hq][T]
  int64_t total_tokens, tpad;
  int hq, hkv;
  bool causal;
  float c;             // softmax_scale * log2(e)
};

// What every forward's kernel parameters carry (FwdArgs here, fwd::Params of the fast
// forward): the scales in qkv8, the documents and work list, the outputs, the shape and c.
template <class Args>
inline void set_forward_common(Args& a, const Params& p, const uint8_t* qkv8, const quant::Qkv8Layout& layout,
                               const quant::WorkListRegions& list, void* out, float* lse) {
  a.sq = reinterpret_cast<const float*>(qkv8 + layout.sq);
  a.sk = reinterpret_cast<const float*>(qkv8 + layout.sk);
  a.sv = reinterpret_cast<const float*>(qkv8 + layout.sv);
  a.cu_seqlens = p.cu_seqlens;
  a.q_start = p.q_start;
  a.work = work_list(qkv8, layout, list);
  a.out = static_cast<uint16_t*>(out);
  a.lse = lse;
  a.total_tokens = p.total_tokens;
  a.tpad = layout.tpad;
  a.hq = p.hq;
  a.hkv = p.hkv;
  a.causal = p.causal;
  a.c = p.softmax_scale * fmt::kLog2e;
}

// The forward regions of qkv8 do not depend on for_backward or the recipe (layout.cuh).
// slots: the work list's capacity, i.e. the grid size over heads.
inline FwdArgs make_fwd_args(const Params& p, const void* qkv8, void* out, float* lse, int64_t* slots) {
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim,
                                              p.recipe, false);
  const uint8_t* base = static_cast<const uint8_t*>(qkv8);
  FwdArgs a;
  a.q8 = base + layout.q8;
  a.k8 = base + layout.k8;
  a.vt8 = base + layout.vt8;
  set_forward_common(a, p, base, layout, layout.work, out, lse);
  *slots = layout.work.capacity;
  return a;
}

}  // namespace sm90
}  // namespace flamia
