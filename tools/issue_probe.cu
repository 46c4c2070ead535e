// How fast the fast forward's per-score instruction mix runs on an SM by itself: the D = 128
// consumer's softmax and fold (kernels/forward_fast.cu, collective/fwd_softmax.cuh) as a
// loop over register tiles, with no ring and no barrier in the loop — so that the kernel's
// measured rate (scores a SM-clock) can be set against what the mix alone reaches, with 1 to 3
// warps a scheduler, and with 1 or 2 beside a warpgroup that keeps the tensor core busy with
// S-sized FP8 products (whether wgmma traffic slows the FP32 work around it; the products
// chained onto their accumulator as the kernel's S, or every step without the accumulator as
// input, or no product at all with the same loop as the control). If the mix runs
// near the kernel's rate, the rate is the mix's (its dependent chains and the exp unit's queue):
// only fewer instructions a score move it. If it runs much faster, also beside the tensor
// work, what holds the kernel is its structure (the waits on the tensor core and the ring, the
// two consumers' phases).
//
//   flamia_issue_probe [--tiles N]     prints, per configuration, cycles a warp-tile, scores a
//                                      SM-clock (the kernel at fixed-16k: ~5.4, i.e. 4.33e9
//                                      scores in 3.32 ms on 132 SMs at ~1.83 GHz) and the
//                                      tensor warpgroup's FLOP a SM-clock
//
// Per tile and thread (64 scores, rows r = 0, 1 of 32 each, as a lane holds an m64n128
// accumulator): t = s * sk; the row maxima over 4 chains and a quad butterfly; mc; p =
// ex2(t * sqc - mc); the sums over 4 chains; x = p * svn; P's E4M3 packs; the fold acc = acc *
// alpha + sigma * fresh. sk and svn come from shared memory as in the kernel. The next tile's
// scores are this tile's x (a chain the kernel has too: its next S waits for the tensor
// core). The loop is 638 instructions a tile (10 a score; sm_90a, CUDA 13.0) against the
// kernel's ~768, no spills in any configuration; `ncu --metrics
// smsp__inst_executed.avg.per_cycle_active` gives its issue rate.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sm90/arch/warpgroup.cuh"
#include "sm90/arch/wgmma.cuh"
#include "sm90/fragments.cuh"
#include "sm90/ptx.cuh"

namespace {

namespace ptx = flamia::sm90::ptx;
namespace mma = flamia::sm90::mma;

constexpr int kScores = 64;  // a thread's scores in a 64 x 128 tile (128 threads)
constexpr int kChains = 4;

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

// With kTensor a further warpgroup (one warp a scheduler) keeps the tensor core busy while
// the mix runs, as the kernel's S and P·V products do: S-sized FP8 products (m64n128k32, four
// k-steps, A and B zero tiles in shared memory) back to back, each waited for, until every mix
// warp is done; it counts them.
constexpr int kTensorTileBytes = 64 * 128 + 128 * 128;  // A: 64 x 128 codes, B: 128 x 128

// Which products the tensor warpgroup issues: kChained, each k-step adding onto the accumulator
// (the kernel's S); kNoInput, every k-step with scale-d 0 (the accumulator written, never
// read: whether the accumulator's reads are what slows the FP32 work beside); kIdle, the
// same loop and barriers without a product (the control).
enum TensorKind { kNone = 0, kChained = 1, kNoInput = 2, kIdle = 3 };

template <int kKind>
__device__ void tensor_loop(const int* mix_done, int mix_warps, unsigned long long* steps_out,
                            unsigned long long* cycles_out, float* sink) {
  extern __shared__ uint8_t tensor_smem[];
  const uint32_t base = (ptx::smem_addr(tensor_smem) + 1023u) & ~1023u;  // swizzle atoms 1024-aligned
  float acc[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;  // read at the end also when no product ran (kIdle)
  unsigned long long steps = 0;
  const unsigned long long t0 = clock64();
  // The warpgroup decides each round together: wgmma is .aligned, so all four warps must issue
  // every product (warps that read mix_done at different times and left the loop apart made
  // the rest issue wgmma as a partial warpgroup: "illegal instruction" on the H200).
  __shared__ int go;
  for (;;) {
    if (threadIdx.x % 128 == 0) go = *reinterpret_cast<const volatile int*>(mix_done) < mix_warps;
    flamia::sm90::warpgroup::bar_sync(flamia::sm90::warpgroup::kFirstNamedBarrier, 128);
    const bool more = go != 0;
    flamia::sm90::warpgroup::bar_sync(flamia::sm90::warpgroup::kFirstNamedBarrier, 128);  // go read before rewritten
    if (!more) break;
    if constexpr (kKind != kIdle) {
      mma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        mma::ss(acc, mma::desc<128>(base, ks), mma::desc<128>(base + 64 * 128, ks), kKind == kChained && ks > 0);
      mma::commit();
      mma::wait<0>();
      mma::pin(acc);
    }
    ++steps;
  }
  const unsigned long long t1 = clock64();
  if (threadIdx.x % 128 == 0) {
    steps_out[blockIdx.x] = steps;
    cycles_out[blockIdx.x] = t1 - t0;
  }
  if (acc[0][0] != 0.0f) sink[0] = acc[0][0];  // zeros times zeros: keeps the products live
}

template <int kWarpsPerScheduler, int kTensorKind>
__global__ void __launch_bounds__(128 * (kWarpsPerScheduler + (kTensorKind != kNone)), 1)
    mix_kernel(const float* __restrict__ keys, int tiles, float c, unsigned long long* __restrict__ cycles,
               float* __restrict__ sink, unsigned long long* __restrict__ tensor_steps,
               unsigned long long* __restrict__ tensor_cycles) {
  __shared__ __align__(16) float sk_smem[128], svn_smem[128];
  __shared__ int mix_done;
  extern __shared__ uint8_t tensor_smem[];
  constexpr int kMixThreads = 128 * kWarpsPerScheduler;
  constexpr bool kTensor = kTensorKind != kNone;
  for (int j = int(threadIdx.x); j < 128; j += blockDim.x) {
    sk_smem[j] = keys[j];
    svn_smem[j] = keys[128 + j];
  }
  if (kTensor) {
    for (int j = int(threadIdx.x); j < (kTensorTileBytes + 1024) / 4; j += blockDim.x)
      reinterpret_cast<uint32_t*>(tensor_smem)[j] = 0;
    if (threadIdx.x == 0) mix_done = 0;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros, visible to wgmma
  }
  __syncthreads();
  // Two mix warpgroups and the tensor one share the CTA's registers as the kernel's roles do
  // (setmaxnreg): the tensor warpgroup's products need ~96, the mix 200 (at 170 each it spills).
  // setmaxnreg only moves the registers the CTA was launched with, so the split must fit in
  // them: a claim beyond waits forever (208 did so and the probe hung; with 200 it runs,
  // docs/PERFORMANCE.md "v95 and v94 outcome").
  constexpr int kTensorRegs = 96, kMixRegs = 200;
  static_assert(2 * 128 * kMixRegs + 128 * kTensorRegs <= flamia::sm90::warpgroup::launch_registers(384),
                "the split fits the launch's registers");
  constexpr bool kSplit = kTensor && kWarpsPerScheduler == 2;
  if (kTensor && int(threadIdx.x) >= kMixThreads) {
    if constexpr (kSplit) flamia::sm90::warpgroup::release_registers<kTensorRegs>();
    tensor_loop<kTensorKind>(&mix_done, kMixThreads / 32, tensor_steps, tensor_cycles, sink);
    return;
  }
  if constexpr (kSplit) flamia::sm90::warpgroup::claim_registers<kMixRegs>();
  float s[kScores], acc[kScores];
  for (int j = 0; j < kScores; ++j) {
    s[j] = keys[256 + j] + float(threadIdx.x & 7);
    acc[j] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sqc[2] = {c, c * 0.5f};
  uint32_t packs = 0;
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
      const float m_new = ptx::max_nan(m[r], flamia::sm90::quad_max_nan(tm));
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
      l[r] = __fadd_rn(__fmul_rn(l[r], alpha[r]), flamia::sm90::quad_sum(rs));
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
  sink[blockIdx.x * kMixThreads + threadIdx.x] = total;
  if ((threadIdx.x & 31) == 0) {
    cycles[blockIdx.x * (kMixThreads / 32) + threadIdx.x / 32] = t1 - t0;
    if (kTensor) atomicAdd(&mix_done, 1);
  }
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each configuration's line out as it ends, also through a pipe
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
  unsigned long long *d_tsteps = nullptr, *d_tcycles = nullptr;
  if (!check(cudaMalloc(&d_tsteps, size_t(sms) * sizeof(unsigned long long)), "cudaMalloc") ||
      !check(cudaMalloc(&d_tcycles, size_t(sms) * sizeof(unsigned long long)), "cudaMalloc"))
    return 1;
  std::printf("warps/scheduler  tensor warpgroup  cycles/warp-tile  scores/SM-clock  tensor FLOP/SM-clock\n"
              "(a warp-tile: 32 lanes x %d scores; FP8 dense peak ~8192 FLOP/SM-clock)\n", kScores);
  // One CTA a SM: w mix warps on each of the four schedulers (plus one tensor warp each), at
  // most 65536 / threads registers a thread (the kernel's consumers have 232 with two a
  // scheduler).
  using Kernel = void (*)(const float*, int, float, unsigned long long*, float*, unsigned long long*,
                          unsigned long long*);
  struct Config {
    int w;
    int tensor;  // TensorKind
    Kernel k;
  };
  const char* const kTensorNames[] = {"no", "chained", "no input", "idle"};
  const Config configs[] = {{1, kNone, mix_kernel<1, kNone>},         {2, kNone, mix_kernel<2, kNone>},
                            {3, kNone, mix_kernel<3, kNone>},         {1, kChained, mix_kernel<1, kChained>},
                            {2, kChained, mix_kernel<2, kChained>},   {1, kNoInput, mix_kernel<1, kNoInput>},
                            {2, kNoInput, mix_kernel<2, kNoInput>},   {1, kIdle, mix_kernel<1, kIdle>},
                            {2, kIdle, mix_kernel<2, kIdle>}};
  for (const Config& cf : configs) {
    const int threads = 128 * (cf.w + (cf.tensor ? 1 : 0));
    const size_t smem = cf.tensor ? kTensorTileBytes + 1024 : 0;
    cf.k<<<sms, threads, smem>>>(d_keys, 10, 0.125f, d_cycles, d_sink, d_tsteps, d_tcycles);  // warm-up
    cf.k<<<sms, threads, smem>>>(d_keys, tiles, 0.125f, d_cycles, d_sink, d_tsteps, d_tcycles);
    if (!check(cudaDeviceSynchronize(), "mix_kernel")) return 1;
    const size_t ctas = size_t(sms);
    std::vector<unsigned long long> cyc(ctas * 4 * size_t(cf.w)), ts(ctas), tc(ctas);
    if (!check(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
               "cudaMemcpy") ||
        !check(cudaMemcpy(ts.data(), d_tsteps, ts.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
               "cudaMemcpy") ||
        !check(cudaMemcpy(tc.data(), d_tcycles, tc.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
               "cudaMemcpy"))
      return 1;
    double mean = 0;
    for (unsigned long long x : cyc) mean += double(x);
    mean /= double(cyc.size());
    const double per_tile = mean / tiles;  // each warp's own tiles; w of them share a scheduler
    const double scores_per_clock = 4.0 * cf.w * 32.0 * kScores / per_tile;
    double flop_per_clock = 0;
    if (cf.tensor == kChained || cf.tensor == kNoInput) {
      double steps = 0, cycles = 0;
      for (int b = 0; b < sms; ++b) steps += double(ts[size_t(b)]), cycles += double(tc[size_t(b)]);
      flop_per_clock = steps * 2.0 * 64 * 128 * 128 / cycles;  // one step: m64n128k128
    }
    std::printf("%15d  %16s  %16.1f  %15.2f  %20.0f\n", cf.w, kTensorNames[cf.tensor], per_tile, scores_per_clock,
                flop_per_clock);
  }
  cudaFree(d_tsteps);
  cudaFree(d_tcycles);
  cudaFree(d_keys);
  cudaFree(d_sink);
  cudaFree(d_cycles);
  return 0;
}
