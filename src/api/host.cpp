// Host path: tensors in host memory run the CPU specification (ref::emulate_*), with the
// per-token scheme and the tile sizes of the GPU kernels, so that a host call computes
// exactly what the specification says the device computes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "api/backend.h"
#include "reference/reference.h"

namespace flamia {
namespace api {
namespace {

ref::EmulationConfig host_config(const Problem& p) {
  ref::EmulationConfig cfg;
  cfg.recipe = p.recipe;
  cfg.scheme = ref::Scheme::PerToken;
  cfg.tiling = ref::Tiling{};  // the default GPU kernels' tiles
  return cfg;
}

ref::Problem host_problem(const Problem& p, const flamia_attention_args& a) {
  ref::Problem rp;
  rp.total_tokens = p.total_tokens;
  rp.hq = p.hq;
  rp.hkv = p.hkv;
  rp.head_dim = p.head_dim;
  const int32_t* cu = static_cast<const int32_t*>(a.cu_seqlens.data);
  rp.cu_seqlens.assign(cu, cu + p.num_docs + 1);
  if (p.has_q_start) {
    const int32_t* qs = static_cast<const int32_t*>(a.q_start.data);
    rp.q_start.assign(qs, qs + p.num_docs);
  }
  rp.causal = p.causal;
  rp.softmax_scale = p.softmax_scale;
  return rp;
}

// A [T, H, D] bf16 view as a dense array: the view itself when it already is dense (no
// copy), else a gathered copy held in `storage`.
const uint16_t* dense_rows(const flamia_tensor& t, std::vector<uint16_t>& storage) {
  const int64_t T = t.shape[0], H = t.shape[1], D = t.shape[2];
  const int64_t st = effective_stride(t, 0), sh = effective_stride(t, 1);
  const uint16_t* src = static_cast<const uint16_t*>(t.data);
  if (sh == D && st == H * D) return src;
  storage.resize(size_t(T * H * D));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(&storage[size_t((i * H + h) * D)], src + i * st + h * sh, size_t(D) * sizeof(uint16_t));
  return storage.data();
}

// Checking mode only: NaN/Inf in an input is reported instead of propagated.
Status check_inputs_finite(const Problem& p, const uint16_t* q, const uint16_t* k, const uint16_t* v) {
  if (!checking_mode()) return Status::success();
  FLAMIA_TRY(check_finite_rows("q", q, p.total_tokens, p.hq, p.head_dim));
  FLAMIA_TRY(check_finite_rows("k", k, p.total_tokens, p.hkv, p.head_dim));
  return check_finite_rows("v", v, p.total_tokens, p.hkv, p.head_dim);
}

}  // namespace

Status host_forward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& out,
                    const flamia_tensor& lse) {
  std::vector<uint16_t> qs, ks, vs;
  const uint16_t* q = dense_rows(a.q, qs);
  const uint16_t* k = dense_rows(a.k, ks);
  const uint16_t* v = dense_rows(a.v, vs);
  FLAMIA_TRY(check_inputs_finite(p, q, k, v));
  ref::emulate_forward(host_problem(p, a), host_config(p), q, k, v, static_cast<uint16_t*>(out.data),
                       static_cast<float*>(lse.data));
  return Status::success();
}

Status host_backward(const Problem& p, const flamia_attention_args& a, const flamia_tensor& dout,
                     const flamia_tensor& out, const flamia_tensor& lse, const flamia_tensor& dq,
                     const flamia_tensor& dk, const flamia_tensor& dv) {
  std::vector<uint16_t> qs, ks, vs, dos;
  const uint16_t* q = dense_rows(a.q, qs);
  const uint16_t* k = dense_rows(a.k, ks);
  const uint16_t* v = dense_rows(a.v, vs);
  const uint16_t* d_o = dense_rows(dout, dos);
  FLAMIA_TRY(check_inputs_finite(p, q, k, v));
  if (checking_mode()) FLAMIA_TRY(check_finite_rows("dout", d_o, p.total_tokens, p.hq, p.head_dim));
  ref::emulate_backward(host_problem(p, a), host_config(p), q, k, v, d_o,
                        static_cast<const uint16_t*>(out.data), static_cast<const float*>(lse.data),
                        static_cast<uint16_t*>(dq.data), static_cast<uint16_t*>(dk.data),
                        static_cast<uint16_t*>(dv.data));
  return Status::success();
}

}  // namespace api
}  // namespace flamia
