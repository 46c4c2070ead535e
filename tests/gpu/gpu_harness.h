// Test harness for the GPU suite: problem cases, host data, a runner that drives the C ABI
// with device tensors on a stream of its own, the CPU specification/exact references
// (split over kv heads across threads), and comparison metrics.
//
// Everything goes through the public C ABI (flamia.h) and the CPU reference (reference.h);
// nothing here knows how the kernels lay out their buffers.
#pragma once

#if defined(FLAMIA_WITH_CUDA)

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "flamia/flamia.h"
#include "reference/reference.h"

namespace flamia_gpu_test {

// ---------------------------------------------------------------------------------------
// Cases and host data
// ---------------------------------------------------------------------------------------

struct Case {
  std::vector<int32_t> cu;  // cu_seqlens, [B + 1]
  int hq = 4, hkv = 4, d = 128;
  bool causal = true;
  flamia_recipe recipe = FLAMIA_RECIPE_FP8;
  float softmax_scale = 0.0f;  // 0: the harness passes 1/sqrt(D) explicitly (see resolved_scale)
  std::vector<int32_t> q_start;  // [B] or empty: args.q_start (flamia.h)

  int64_t tokens() const { return cu.empty() ? 0 : cu.back(); }
  int num_docs() const { return int(cu.size()) - 1; }
  int max_seqlen() const;
  int doc_len(int b) const { return cu[b + 1] - cu[b]; }
  // The scale both sides use. Passed to the GPU explicitly, so that the test does not depend
  // on how 1/sqrt(D) is rounded by either side.
  float resolved_scale() const;
  std::string describe() const;
};

std::vector<int32_t> cu_from_lengths(const std::vector<int>& lengths);
const char* recipe_name(flamia_recipe r);

// BF16 bit patterns, dense [T, H, D]; lse FP32 [Hq, T].
struct Inputs {
  std::vector<uint16_t> q, k, v, dout;
};
struct FwdResult {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};
struct BwdResult {
  std::vector<uint16_t> dq, dk, dv;
};

// Random normal inputs (never exact zeros: values are N(0,1), rounded to BF16), fixed seed.
Inputs make_inputs(const Case& c, uint64_t seed);

uint16_t bf16(float x);
float f32(uint16_t b);

// Overwrite rows [t0, t1) (global token indices) of x [T, H, D] with new content.
enum class Perturb { Random, Huge, Tiny };
void perturb_rows(std::vector<uint16_t>& x, int heads, int d, int64_t t0, int64_t t1, Perturb kind,
                  uint64_t seed);

// ---------------------------------------------------------------------------------------
// Device buffers and the GPU runner
// ---------------------------------------------------------------------------------------

void check_cuda(cudaError_t e, const char* what);  // throws std::runtime_error

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Sets an environment variable (value null: unsets it) for the scope, unset again after: the
// library reads its run-time switches (FLAMIA_CHECK, FLAMIA_BWD_DQ, ...) at every call, and a
// runner built inside the scope sizes its workspace for them.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
};

// A dense [d0, d1, d2] (or 1-D / 2-D) tensor view.
flamia_tensor view(void* data, flamia_dtype dt, std::vector<int64_t> shape, int32_t device);

// Owns every device buffer one case needs. Each run poisons all outputs, qkv8 and the
// workspace with 0xFF bytes (NaN in BF16, FP32, E4M3 and E8M0) so that anything a kernel
// leaves unwritten or reads before writing shows up as NaN.
class GpuRunner {
 public:
  explicit GpuRunner(const Case& c);
  ~GpuRunner();

  const Case& problem() const { return c_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Device-side argument struct for this case (q, k, v, cu_seqlens on the device).
  flamia_attention_args args() const;
  flamia_tensor out_view() const;
  flamia_tensor lse_view() const;
  flamia_tensor dout_view() const;
  flamia_tensor dq_view() const;
  flamia_tensor dk_view() const;
  flamia_tensor dv_view() const;
  void* qkv8() const { return qkv8_.get(); }
  size_t qkv8_bytes() const { return qkv8_.bytes(); }
  void* workspace() const { return ws_.get(); }
  size_t workspace_bytes() const { return ws_.bytes(); }
  // Bytes of the workspace from `offset` on that the last call wrote (no longer the poison
  // byte): shows that a mode whose buffers lie past the plain workspace (the stored dS, the
  // fused dQ's sums) ran, where its results alone would match the mode it replaces.
  size_t workspace_bytes_written_from(size_t offset);

  void upload(const Inputs& in);
  void poison();            // every output and buffer the calls write
  void poison_gradients();  // dq, dk, dv only (qkv8, O and LSE stay for a backward)
  void sync();

  // flamia_quantize_qkv(for_backward = 1) then flamia_forward(qkv8_filled = 1): the training
  // path. Uploads, poisons, runs, synchronises, downloads. Throws on a CUDA error; the API
  // status is returned (outputs are downloaded only on success).
  flamia_status forward(const Inputs& in, FwdResult* out);
  // flamia_forward(qkv8_filled = 0): the forward quantizes by itself.
  flamia_status forward_self_quantizing(const Inputs& in, FwdResult* out);
  // Training step: quantize, forward, backward (dO quantized inside the backward).
  flamia_status forward_backward(const Inputs& in, FwdResult* fwd, BwdResult* bwd);

  // flamia_backward on what the last forward left in qkv8 / O / LSE (gradients and the
  // workspace poisoned first): lets a test check the forward before the backward runs.
  flamia_status backward_after_forward(BwdResult* bwd);

  // The same step with caller-made arguments (e.g. strided views of a fused qkv buffer):
  // nothing is uploaded; outputs, qkv8 and workspace are this runner's. backward=false stops
  // after the forward.
  flamia_status step(const flamia_attention_args& a, const flamia_tensor& dout, bool backward,
                     FwdResult* fwd, BwdResult* bwd);

  void download_fwd(FwdResult* out);
  void download_bwd(BwdResult* out);

 private:
  Case c_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer q_, k_, v_, dout_, cu_, q_start_, out_, lse_, dq_, dk_, dv_, qkv8_, ws_;
};

// ---------------------------------------------------------------------------------------
// CPU references (split over kv-head groups and documents, run on threads: the emulation is
// per (document, kv-head group) by construction, so splitting changes no bit).
// ---------------------------------------------------------------------------------------

flamia::ref::Problem to_problem(const Case& c);
flamia::ref::EmulationConfig spec_config(const Case& c);  // PerToken, the running kernels' tiles

void spec_forward(const Case& c, const Inputs& in, FwdResult* out);
// Uses the given O and LSE (the GPU's, in the tests: this isolates the backward kernel).
void spec_backward(const Case& c, const Inputs& in, const FwdResult& fwd, BwdResult* out);

struct ExactResult {
  std::vector<double> o, lse, dq, dk, dv;
};
void exact_forward_backward(const Case& c, const Inputs& in, ExactResult* out);

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

double rel_l2(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want);
double rel_l2(const std::vector<uint16_t>& got, const std::vector<double>& want);
double rel_l2(const std::vector<float>& got, const std::vector<double>& want);

// Per-row comparison of two BF16 tensors [T, H, D] (a row = one (token, head)).
// err_row = max |got - want| over the row, mx = max |want| over the row, rms = RMS of want.
//   soft: rows with err_row > rtol_soft * mx + atol_soft * rms are counted (should be rare);
//   hard: every row must have err_row <= rtol_hard * mx + atol_hard * rms + extra[row]
//         (worst_row_ratio <= 1), extra optional (a per-row allowance computed by the test).
struct RowTol {
  double rtol_soft, atol_soft, rtol_hard, atol_hard;
};
struct RowStats {
  double rel_l2 = 0;
  double worst_row_ratio = 0;  // max over rows of err_row / hard allowance (NaN mismatch: inf)
  int64_t rows = 0;
  int64_t rows_over_soft = 0;
  int64_t elems_bitwise_equal = 0, elems = 0;
  std::string worst_where;
  std::string summary() const;
};
RowStats compare_rows(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int heads,
                      int d, const std::vector<int32_t>& cu, const RowTol& tol,
                      const std::vector<double>* extra = nullptr);

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

int64_t count_nonfinite(const std::vector<uint16_t>& x);
int64_t count_nonfinite(const std::vector<float>& x);
// Non-finite count restricted to token rows [t0, t1) of [T, H, D] / of [H, T] (lse).
int64_t count_nonfinite_rows(const std::vector<uint16_t>& x, int heads, int d, int64_t t0, int64_t t1);
int64_t count_nonfinite_lse(const std::vector<float>& lse, int64_t T, int hq, int64_t t0, int64_t t1);

// Bitwise equality of token rows [t0, t1) of two [T, H, D] BF16 tensors / two [H, T] lse.
bool rows_equal(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int heads, int d,
                int64_t t0, int64_t t1);
bool lse_rows_equal(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int hq,
                    int64_t t0, int64_t t1);

}  // namespace flamia_gpu_test

#endif  // FLAMIA_WITH_CUDA
