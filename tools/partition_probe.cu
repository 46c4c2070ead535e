// Whether a memory-bound pass can run under an issue-bound one on a share of the SMs — the
// lead "the quantizer beside the forward" of docs/PERFORMANCE.md (the packs' row of "Where it
// stands"): the quantizer moves ~0.8 GB at 32k tokens at about the copy bandwidth, then the
// forward, issue-bound, reads little. Stand-ins, one CTA an SM each (dynamic shared memory
// above half an SM's): S streams 512 MB in and 512 MB out with a persistent grid of G CTAs
// (64 KB of loads in flight a CTA); C is a persistent grid of 384-thread CTAs (the fast
// forward's three warpgroups) taking units of FMA chains from a counter. Printed, medians
// over the repetitions: S alone on G SMs (its bandwidth), C alone, and S on G SMs with C
// started beside it on a second stream (C's CTAs take the other SMs, then all): the pair's
// time against S on every SM followed by C.
// If the pair beats the sequence by most of S's time at some G, the lead's first risk (the
// quantizer's bandwidth from fewer SMs) is not what would stop it.
//
//   flamia_partition_probe [--reps N]      (default 10)
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kSThreads = 1024, kSLoads = 4;  // 64 KB a CTA in flight
constexpr size_t kSBytes = size_t(512) << 20;
constexpr int kCThreads = 384, kCChains = 8;
constexpr int kOneCtaAnSm = 120 * 1024;  // dynamic shared memory: no second CTA fits an SM

__global__ void __launch_bounds__(kSThreads, 1) stream_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                              size_t n) {
  const size_t per_pass = size_t(kSThreads) * kSLoads;
  for (size_t base = size_t(blockIdx.x) * per_pass; base < n; base += size_t(gridDim.x) * per_pass) {
    uint4 v[kSLoads];
#pragma unroll
    for (int i = 0; i < kSLoads; ++i) v[i] = __ldcs(src + base + size_t(i) * kSThreads + threadIdx.x);
#pragma unroll
    for (int i = 0; i < kSLoads; ++i)
      __stcs(dst + base + size_t(i) * kSThreads + threadIdx.x, make_uint4(v[i].x ^ 1u, v[i].y, v[i].z, v[i].w));
  }
}

// Persistent, as the fast forward: each CTA takes units of FMA chains from a counter until
// none is left, so that the CTAs that start late (on the SMs S held) take fewer.
__global__ void __launch_bounds__(kCThreads, 1) fma_kernel(float* out, int* next, int units, int iters) {
  __shared__ int unit;
  float x[kCChains];
#pragma unroll
  for (int c = 0; c < kCChains; ++c) x[c] = float(threadIdx.x + c);
  for (;;) {
    if (threadIdx.x == 0) unit = atomicAdd(next, 1);
    __syncthreads();
    const int u = unit;
    __syncthreads();
    if (u >= units) break;
    for (int i = 0; i < iters; ++i)
#pragma unroll
      for (int c = 0; c < kCChains; ++c) x[c] = fmaf(x[c], 0.999999f, 1e-7f);
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kCChains; ++c) s += x[c];
  if (s == 12345.0f) out[blockIdx.x] = s;  // never true: keeps the chains
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOneCtaAnSm));
  CUDA_CHECK(cudaFuncSetAttribute(fma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOneCtaAnSm));
  uint4 *src = nullptr, *dst = nullptr;
  float* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&src, kSBytes));
  CUDA_CHECK(cudaMalloc(&dst, kSBytes));
  CUDA_CHECK(cudaMalloc(&sink, 4096 * sizeof(float)));
  CUDA_CHECK(cudaMemset(src, 1, kSBytes));
  const size_t n = kSBytes / sizeof(uint4);
  // C: 400 units of ~3.6 us an SM, about four times S's time on every SM (as the fast forward
  // is to the quantizer at fixed-4k), in units as fine as the forward's items.
  const int units = 400 * sms, iters = 250;
  int* next = nullptr;
  CUDA_CHECK(cudaMalloc(&next, sizeof(int)));
  cudaStream_t s0, s1;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  cudaEvent_t e[6];
  for (cudaEvent_t& ev : e) CUDA_CHECK(cudaEventCreate(&ev));
  auto run_s = [&](int g, cudaStream_t st) { stream_kernel<<<g, kSThreads, kOneCtaAnSm, st>>>(src, dst, n); };
  auto run_c = [&](cudaStream_t st) {
    CUDA_CHECK(cudaMemsetAsync(next, 0, sizeof(int), st));
    fma_kernel<<<sms, kCThreads, kOneCtaAnSm, st>>>(sink, next, units, iters);
  };
  auto elapsed = [&](cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  };
  for (int w = 0; w < 3; ++w) {  // warm-up
    run_s(sms, s0);
    run_c(s0);
  }
  CUDA_CHECK(cudaStreamSynchronize(s0));

  std::vector<float> c_alone, s_full;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(e[0], s0));
    run_s(sms, s0);
    CUDA_CHECK(cudaEventRecord(e[1], s0));
    run_c(s0);
    CUDA_CHECK(cudaEventRecord(e[2], s0));
    CUDA_CHECK(cudaEventSynchronize(e[2]));
    s_full.push_back(elapsed(e[0], e[1]));
    c_alone.push_back(elapsed(e[1], e[2]));
  }
  const float s_ms = median(s_full), c_ms = median(c_alone);
  std::printf("device SMs %d; S alone on %d SMs %.3f ms (%.0f GB/s); C alone %.3f ms; S then C %.3f ms\n", sms, sms,
              s_ms, 2.0 * kSBytes / s_ms / 1e6, c_ms, s_ms + c_ms);
  std::printf("%5s %10s %8s %12s %12s %10s %14s\n", "G", "S alone", "GB/s", "S beside C", "pair", "vs S+C",
              "S's time hidden");
  const int shares[] = {sms, sms * 3 / 4, sms / 2, sms / 3, sms / 4, sms / 6};
  for (int g : shares) {
    std::vector<float> alone, beside, pair;
    for (int r = 0; r < reps; ++r) {
      CUDA_CHECK(cudaEventRecord(e[0], s0));
      run_s(g, s0);
      CUDA_CHECK(cudaEventRecord(e[1], s0));
      CUDA_CHECK(cudaEventSynchronize(e[1]));
      alone.push_back(elapsed(e[0], e[1]));
      // The pair: S's CTAs placed first, then C on the second stream, the first joining it.
      CUDA_CHECK(cudaEventRecord(e[2], s0));
      run_s(g, s0);
      CUDA_CHECK(cudaEventRecord(e[3], s0));
      CUDA_CHECK(cudaStreamWaitEvent(s1, e[2], 0));
      run_c(s1);
      CUDA_CHECK(cudaEventRecord(e[4], s1));
      CUDA_CHECK(cudaStreamWaitEvent(s0, e[4], 0));
      CUDA_CHECK(cudaEventRecord(e[5], s0));
      CUDA_CHECK(cudaEventSynchronize(e[5]));
      beside.push_back(elapsed(e[2], e[3]));
      pair.push_back(elapsed(e[2], e[5]));
    }
    const float a = median(alone), b = median(beside), p = median(pair);
    std::printf("%5d %10.3f %8.0f %12.3f %12.3f %+9.1f%% %13.0f%%\n", g, a, 2.0 * kSBytes / a / 1e6, b, p,
                100.0 * (p / (s_ms + c_ms) - 1.0), 100.0 * (s_ms + c_ms - p) / s_ms);
  }
  CUDA_CHECK(cudaGetLastError());
  return 0;
}
