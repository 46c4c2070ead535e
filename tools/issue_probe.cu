// How fast the fast forward's per-score instruction mix runs on an SM by itself: the D = 128
// consumer's softmax and fold (kernels/forward_fast.cu, collective/fwd_softmax.cuh) as a
// loop over register tiles, with no tensor core, no ring and no barrier in the loop — so that
// the kernel's measured rate (scores a SM-clock) can be set against what the mix alone
// reaches, with 1 to 3 warps a scheduler. If the mix alone runs near the kernel's rate, the
// rate is the mix's (its dependent chains and the exp unit's queue): only fewer instructions a
// score move it. If it runs much faster, what holds the kernel is its structure (the waits on
// the tensor core and the ring, the two consumers' phases).
//
//   flamia_issue_probe [--tiles N]     prints, per warps a scheduler, cycles a warp-tile and
//                                      scores a SM-clock (the kernel at fixed-16k: ~5.4, i.e.
//                                      4.33e9 scores in 3.32 ms on 132 SMs at ~1.83 GHz)
//
// Per tile and thread (64 scores, rows r = 0, 1 of 32 each, as a lane holds an m64n128
// accumulator): t = s * sk; the row maxima over 4 chains and a quad butterfly; mc; p =
// ex2(t * sqc - mc); the sums over 4 chains; x = p * svn; P's E4M3 packs; the fold acc = acc *
// alpha + sigma * fresh. sk and svn come from shared memory as in the kernel. The next tile's
// scores are this tile's x (a chain the kernel has too: its next S waits for the tensor
// core). The loop is 638 instructions a tile (10 a score; sm_90a, CUDA 13.0) against the
// kernel's ~768; `ncu --metrics smsp__inst_executed.avg.per_cycle_active` gives its issue rate.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sm90/ptx.cuh"

namespace {

namespace ptx = flamia::sm90::ptx;

constexpr int kScores = 64;  // a thread's scores in a 64 x 128 tile (128 threads)
constexpr int kChains = 4;

__device__ __forceinline__ float quad_max(float v) {
  v = ptx::max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return ptx::max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// f(j, e, v) for the lane's scores j = 8 n2 + e, v the per-key value of j's column, from
// shared memory as in the kernel (fwd_softmax.cuh's for_each_score: one 16-byte load serves 8
// of a lane's scores).
template <class F>
__device__ __forceinline__ void for_each_key(const float4* key4, F f) {
#pragma unroll
  for (int n2 = 0; n2 < 8; ++n2) {
    const float4 v4 = key4[4 * n2];
    const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) f(8 * n2 + e, e, vv[2 * (e >> 2) + (e & 1)]);
  }
}

template <int kWarpsPerScheduler>
__global__ void __launch_bounds__(128 * kWarpsPerScheduler, 1)
    mix_kernel(const float* __restrict__ keys, int tiles, float c, unsigned long long* __restrict__ cycles,
               float* __restrict__ sink) {
  __shared__ __align__(16) float sk_smem[128], svn_smem[128];
  for (int j = int(threadIdx.x); j < 128; j += blockDim.x) {
    sk_smem[j] = keys[j];
    svn_smem[j] = keys[128 + j];
  }
  float s[kScores], acc[kScores];
  for (int j = 0; j < kScores; ++j) {
    s[j] = keys[256 + j] + float(threadIdx.x & 7);
    acc[j] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sqc[2] = {c, c * 0.5f};
  uint32_t packs = 0;
  __syncthreads();
  const float4* sk4 = reinterpret_cast<const float4*>(sk_smem) + (threadIdx.x & 3);
  const float4* svn4 = reinterpret_cast<const float4*>(svn_smem) + (threadIdx.x & 3);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < tiles; ++it) {
    float tmax[2][kChains];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int k = 0; k < kChains; ++k) tmax[r][k] = -INFINITY;
    for_each_key(sk4, [&](int j, int e, float sk) {
      const float t = __fmul_rn(s[j], sk);
      s[j] = t;
      float& mm = tmax[(e >> 1) & 1][(j >> 2) % kChains];
      mm = ptx::max_nan(mm, t);
    });
    float mc[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tm = tmax[r][0];
#pragma unroll
      for (int k = 1; k < kChains; ++k) tm = ptx::max_nan(tm, tmax[r][k]);
      const float m_new = ptx::max_nan(m[r], quad_max(tm));
      mc[r] = __fmul_rn(m_new, c);
      alpha[r] = ptx::ex2(__fsub_rn(__fmul_rn(m[r], c), mc[r]));
      m[r] = m_new;
    }
    float sum[2][kChains];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int k = 0; k < kChains; ++k) sum[r][k] = 0.0f;
    for_each_key(svn4, [&](int j, int e, float svn) {
      const int r = (e >> 1) & 1;
      const float p = ptx::ex2(__fmaf_rn(s[j], sqc[r], -mc[r]));
      sum[r][(j >> 2) % kChains] = __fadd_rn(sum[r][(j >> 2) % kChains], p);
      s[j] = __fmul_rn(p, svn);
    });
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float rs = sum[r][0];
#pragma unroll
      for (int k = 1; k < kChains; ++k) rs = __fadd_rn(rs, sum[r][k]);
      l[r] = __fadd_rn(__fmul_rn(l[r], alpha[r]), quad_sum(rs));
    }
#pragma unroll
    for (int j = 0; j < kScores; j += 4) packs ^= ptx::pack_e4m3x4(s[j], s[j + 1], s[j + 2], s[j + 3]);
    // The fold, with this tile's x standing in for P·V's fresh accumulator.
#pragma unroll
    for (int j = 0; j < kScores; ++j) {
      acc[j] = __fmaf_rn(0.5f, s[j], __fmul_rn(acc[j], alpha[(j >> 1) & 1]));
    }
  }
  const unsigned long long t1 = clock64();
  float total = l[0] + l[1] + float(packs & 1);
  for (int j = 0; j < kScores; ++j) total += acc[j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = total;
  if ((threadIdx.x & 31) == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = t1 - t0;
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int tiles = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
      tiles = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--tiles N]\n", argv[0]);
      return 2;
    }
  }
  int device = 0, sms = 0;
  if (!check(cudaGetDevice(&device), "cudaGetDevice") ||
      !check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"))
    return 1;
  std::vector<float> keys(256 + kScores);
  for (int j = 0; j < 128; ++j) {
    keys[j] = 1.0f / float(1 << (j % 3));  // powers of two, as the quantizer's scales
    keys[128 + j] = float(1 << (j % 5));
  }
  for (int j = 0; j < kScores; ++j) keys[256 + j] = 0.25f * float(j % 11) - 1.0f;
  float *d_keys = nullptr, *d_sink = nullptr;
  unsigned long long* d_cycles = nullptr;
  if (!check(cudaMalloc(&d_keys, keys.size() * sizeof(float)), "cudaMalloc") ||
      !check(cudaMalloc(&d_sink, size_t(sms) * 384 * sizeof(float)), "cudaMalloc") ||
      !check(cudaMalloc(&d_cycles, size_t(sms) * 12 * sizeof(unsigned long long)), "cudaMalloc") ||
      !check(cudaMemcpy(d_keys, keys.data(), keys.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy"))
    return 1;
  std::printf("warps/scheduler  cycles/warp-tile  scores/SM-clock  (a warp-tile: 32 lanes x %d scores)\n", kScores);
  // One CTA a SM: w warps on each of the four schedulers, at most 65536 / (128 w) registers a
  // thread (the kernel's consumers have 232 with two a scheduler).
  void (*const kernels[3])(const float*, int, float, unsigned long long*, float*) = {mix_kernel<1>, mix_kernel<2>,
                                                                                     mix_kernel<3>};
  for (int w = 1; w <= 3; ++w) {
    const int threads = 128 * w;
    kernels[w - 1]<<<sms, threads>>>(d_keys, 10, 0.125f, d_cycles, d_sink);  // warm-up
    kernels[w - 1]<<<sms, threads>>>(d_keys, tiles, 0.125f, d_cycles, d_sink);
    if (!check(cudaDeviceSynchronize(), "mix_kernel")) return 1;
    std::vector<unsigned long long> cyc(size_t(sms) * (threads / 32));
    if (!check(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
               "cudaMemcpy"))
      return 1;
    double mean = 0;
    for (unsigned long long x : cyc) mean += double(x);
    mean /= double(cyc.size());
    const double per_tile = mean / tiles;  // each warp's own tiles; w of them share a scheduler
    const double scores_per_clock = 4.0 * w * 32.0 * kScores / per_tile;
    std::printf("%15d  %16.1f  %15.2f\n", w, per_tile, scores_per_clock);
  }
  cudaFree(d_keys);
  cudaFree(d_sink);
  cudaFree(d_cycles);
  return 0;
}
