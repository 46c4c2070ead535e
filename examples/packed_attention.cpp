// Packed FP8 attention through the C++ header: forward and backward over a batch of three
// documents, on the host (the CPU specification) and, when available, on the GPU.
//
//   build/flamia_example
//
// The host call needs no GPU: host tensors run the CPU specification, the exact emulation
// of the quantized algorithm. The GPU run uses the same inputs, so the difference printed
// at the end is the GPU kernels' distance from the specification (expected tiny: the two
// differ only in FP32 accumulation order).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flamia/flamia.hpp"
#include "flamia/formats.h"

#ifdef FLAMIA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using Bf16 = std::vector<uint16_t>;  // BF16 bit patterns, as the C ABI takes them

constexpr int32_t kHq = 4, kHkv = 2, kD = 64;  // GQA: two query heads share each k/v head
const std::vector<int32_t> kDocLengths = {5, 130, 70};

Bf16 random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bf16 x(n);
  for (auto& b : x) b = flamia::fmt::f32_to_bf16_bits(normal(rng));
  return x;
}

float to_f32(uint16_t b) { return flamia::fmt::bf16_bits_to_f32(b); }
float to_f32(float x) { return x; }

template <class T>
void summary(const char* name, const std::vector<T>& x) {
  double sum_abs = 0, max_abs = 0;
  for (auto e : x) {
    double a = std::fabs(double(to_f32(e)));
    sum_abs += a;
    max_abs = std::max(max_abs, a);
  }
  std::printf("  %-4s %6zu values  mean|x| %.5f  max|x| %.5f\n", name, x.size(), sum_abs / double(x.size()),
              max_abs);
}

// Everything one training step of attention reads and writes, on the host.
struct Problem {
  int64_t T = 0;
  std::vector<int32_t> cu{0};  // cu_seqlens: document b is tokens [cu[b], cu[b+1])
  int32_t max_seqlen = 0;
  Bf16 q, k, v, dout;      // inputs
  Bf16 out, dq, dk, dv;    // outputs
  std::vector<float> lse;  // [Hq, T], natural log
};

Problem make_problem() {
  Problem p;
  for (int32_t len : kDocLengths) {
    p.cu.push_back(p.cu.back() + len);
    p.max_seqlen = std::max(p.max_seqlen, len);
  }
  p.T = p.cu.back();
  std::mt19937 rng(1234);
  p.q = random_bf16(p.T * kHq * kD, rng);
  p.k = random_bf16(p.T * kHkv * kD, rng);
  p.v = random_bf16(p.T * kHkv * kD, rng);
  p.dout = random_bf16(p.T * kHq * kD, rng);  // stands in for the loss gradient w.r.t. O
  p.out.resize(p.q.size());
  p.dq.resize(p.q.size());
  p.dk.resize(p.k.size());
  p.dv.resize(p.v.size());
  p.lse.resize(size_t(kHq) * p.T);
  return p;
}

int64_t num_docs(const Problem& p) { return int64_t(p.cu.size()) - 1; }

void run_host(Problem& p) {
  using namespace flamia;
  auto args = make_args(bf16_view(p.q.data(), p.T, kHq, kD), bf16_view(p.k.data(), p.T, kHkv, kD),
                        bf16_view(p.v.data(), p.T, kHkv, kD), cu_seqlens_view(p.cu.data(), num_docs(p)),
                        p.max_seqlen, /*causal=*/true, /*softmax_scale=*/0.0f, FLAMIA_RECIPE_FP8);
  // Host calls quantize internally and need neither the qkv8 buffer nor a workspace.
  forward(args, bf16_view(p.out.data(), p.T, kHq, kD), lse_view(p.lse.data(), kHq, p.T));
  backward(args, bf16_view(p.dout.data(), p.T, kHq, kD), bf16_view(p.out.data(), p.T, kHq, kD),
           lse_view(p.lse.data(), kHq, p.T), bf16_view(p.dq.data(), p.T, kHq, kD),
           bf16_view(p.dk.data(), p.T, kHkv, kD), bf16_view(p.dv.data(), p.T, kHkv, kD));
}

#ifdef FLAMIA_WITH_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A cudaMalloc'd buffer freed on scope exit, so an exception thrown mid-run leaks nothing.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda_check(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    cuda_check(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  void copy_to(std::vector<T>& host) const {
    cuda_check(cudaMemcpy(host.data(), ptr, host.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

// Same step on the GPU: inputs from `in`, outputs into `g` (a copy of `in` to overwrite).
void run_gpu(const Problem& in, Problem& g) {
  using namespace flamia;
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  struct StreamGuard { cudaStream_t s; ~StreamGuard() { cudaStreamDestroy(s); } } guard{stream};

  DeviceBuffer q(in.q), k(in.k), v(in.v), dout(in.dout), cu(in.cu);
  DeviceBuffer out(in.out.size() * 2), dq(in.dq.size() * 2), dk(in.dk.size() * 2), dv(in.dv.size() * 2);
  DeviceBuffer lse(in.lse.size() * 4);
  // qkv8: the forward quantizes q/k/v into it once; for_backward = 1 makes room for the
  // layouts the backward reads, so the backward does not quantize them again.
  const size_t qkv8_size = qkv8_bytes(in.T, num_docs(in), kHq, kHkv, kD, FLAMIA_RECIPE_FP8, true);
  if (qkv8_size == 0) throw Error(FLAMIA_ERROR_INVALID_ARGUMENT, "qkv8_bytes: " + last_error());
  DeviceBuffer qkv8(qkv8_size);

  auto args = make_args(bf16_view(q.ptr, in.T, kHq, kD, dev), bf16_view(k.ptr, in.T, kHkv, kD, dev),
                        bf16_view(v.ptr, in.T, kHkv, kD, dev),
                        cu_seqlens_view(static_cast<const int32_t*>(cu.ptr), num_docs(in), dev), in.max_seqlen,
                        /*causal=*/true, /*softmax_scale=*/0.0f, FLAMIA_RECIPE_FP8, stream);
  // The backward's scratch depends on the call's options (max_seqlen and causal for the
  // stored dS of FLAMIA_BWD_DQ=hbm), so it is sized from the arguments themselves.
  const size_t ws_size = backward_workspace_bytes(args);
  if (ws_size == 0) throw Error(FLAMIA_ERROR_INVALID_ARGUMENT, "backward_workspace_bytes: " + last_error());
  DeviceBuffer workspace(ws_size);
  forward(args, bf16_view(out.ptr, in.T, kHq, kD, dev), lse_view(lse.ptr, kHq, in.T, dev), qkv8.ptr, qkv8_size);
  backward(args, bf16_view(dout.ptr, in.T, kHq, kD, dev), bf16_view(out.ptr, in.T, kHq, kD, dev),
           lse_view(lse.ptr, kHq, in.T, dev), bf16_view(dq.ptr, in.T, kHq, kD, dev),
           bf16_view(dk.ptr, in.T, kHkv, kD, dev), bf16_view(dv.ptr, in.T, kHkv, kD, dev), qkv8.ptr, qkv8_size,
           workspace.ptr, ws_size);
  // The library never synchronises; the caller does before reading results.
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  out.copy_to(g.out);
  lse.copy_to(g.lse);
  dq.copy_to(g.dq);
  dk.copy_to(g.dk);
  dv.copy_to(g.dv);
}

template <class T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(to_f32(a[i])) - double(to_f32(b[i]))));
  return m;
}
#endif

}  // namespace

int main() {
  try {
    std::printf("%s\n", flamia::version().c_str());
    Problem p = make_problem();
    std::printf("packed batch: T = %lld tokens in %lld documents (5, 130, 70), Hq/Hkv = %d/%d, D = %d, causal, fp8\n",
                (long long)p.T, (long long)num_docs(p), kHq, kHkv, kD);

    run_host(p);
    std::printf("host (CPU specification):\n");
    summary("O", p.out);
    summary("LSE", p.lse);
    summary("dQ", p.dq);
    summary("dK", p.dk);
    summary("dV", p.dv);

#ifdef FLAMIA_WITH_CUDA
    if (!flamia::gpu_available()) {
      std::printf("GPU part skipped: no supported (sm_90) GPU\n");
      return 0;
    }
    Problem g = p;
    run_gpu(p, g);
    std::printf("GPU vs host, max |difference|:  O %.3g  LSE %.3g  dQ %.3g  dK %.3g  dV %.3g\n",
                max_abs_diff(g.out, p.out), max_abs_diff(g.lse, p.lse), max_abs_diff(g.dq, p.dq),
                max_abs_diff(g.dk, p.dk), max_abs_diff(g.dv, p.dv));
#else
    std::printf("GPU part skipped: built without CUDA\n");
#endif
    return 0;
  } catch (const flamia::Error& e) {
    std::fprintf(stderr, "flamia error (status %d): %s\n", int(e.status()), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}
