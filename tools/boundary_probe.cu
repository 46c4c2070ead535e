// What the boundary between two kernels of a stream costs when the second places one CTA per
// SM with a large shared-memory allocation, as the fast forward after the quantizer and the
// dK/dV pass after the dO quantizer do. docs/PERFORMANCE.md v132 measured 10-170 us a call
// saved by launching such kernels to overlap the one before them (programmatic dependent
// launch), several times a launch latency; v132b found nothing to save between two small
// kernels; v133 did not find the SMs' shared-memory split to be the cost. This probe times the
// boundary alone: kernel A, shaped like the quantizer (blocks of 256 threads with 16 KB of
// static shared memory, each streaming 32 KB in and 16 KB out), then kernel B, one CTA per SM,
// which reads %globaltimer at its first instruction and again after griddepcontrol.wait, then
// spins for a fixed time. Per configuration — B's dynamic shared memory, its threads, B
// launched plainly or to overlap A — it prints, relative to the end of A's last block
// (%globaltimer, ns): when B's first and last CTAs started, when their waits returned, and the
// event-timed A + B against A and B timed alone. If the plain boundary's gap grows with B's
// shared memory or threads, the placement of large CTAs is the cost; if it is the same for
// all, it is the launch; what the overlap leaves of it is what v132 could not take.
//
//   flamia_boundary_probe [--reps N]      (default 20; medians over the repetitions)
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/overlap.h"

namespace {

constexpr int kAThreads = 256;
constexpr int kAStage = 1024;      // uint4: 16 KB of shared memory a block
constexpr int kABlocks = 12288;    // the quantizer's grid at 32k tokens and 48 heads
constexpr long long kBWorkNs = 50000;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A: each block reads 2 x 16 KB, combines them in shared memory, writes 16 KB; its end goes
// into *a_end (the largest over the blocks). With `overlap`, B may launch once every block
// has started (as the quantizer lets the forward).
__global__ void __launch_bounds__(kAThreads) stream_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                           unsigned long long* a_end, bool overlap) {
  __shared__ uint4 stage[kAStage];
  if (overlap) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const size_t in0 = size_t(blockIdx.x) * 2 * kAStage;
  for (int i = threadIdx.x; i < kAStage; i += kAThreads) {
    const uint4 a = __ldcs(src + in0 + i), b = __ldcs(src + in0 + kAStage + i);
    stage[i] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kAStage; i += kAThreads)
    dst[size_t(blockIdx.x) * kAStage + i] = stage[(i * 33) % kAStage];
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(a_end, global_ns());
}

// B: one CTA per SM; its first instruction's and its wait's return times, then kBWorkNs of
// spinning (the shared memory is only allocated: its placement is what is timed).
__global__ void b_kernel(unsigned long long* start, unsigned long long* waited, int smem_bytes) {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x == 0) start[blockIdx.x] = global_ns();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long t0 = global_ns();
  if (threadIdx.x == 0) {
    waited[blockIdx.x] = t0;
    if (smem_bytes > 0) smem[0] = 1;
  }
  while (global_ns() - t0 < (unsigned long long)kBWorkNs) {
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  double first_start, last_start, first_wait, last_wait, pair_ms;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (!flamia::overlapped_launches_enabled()) std::printf("FLAMIA_PDL=0: the \"overlap\" rows are launched plainly\n");
  std::printf("%s, %d SMs; A: %d blocks x %d threads, 16 KB static shared memory, 48 KB of traffic a block; "
              "B: %d CTAs, %lld us of spinning\n",
              prop.name, sms, kABlocks, kAThreads, sms, kBWorkNs / 1000);

  const size_t in_elems = size_t(kABlocks) * 2 * kAStage, out_elems = size_t(kABlocks) * kAStage;
  uint4 *src = nullptr, *dst = nullptr;
  unsigned long long *a_end = nullptr, *start = nullptr, *waited = nullptr;
  CUDA_CHECK(cudaMalloc(&src, in_elems * sizeof(uint4)));
  CUDA_CHECK(cudaMalloc(&dst, out_elems * sizeof(uint4)));
  CUDA_CHECK(cudaMemset(src, 1, in_elems * sizeof(uint4)));
  CUDA_CHECK(cudaMalloc(&a_end, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMalloc(&start, sms * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMalloc(&waited, sms * sizeof(unsigned long long)));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  const int max_smem = 200 * 1024;
  CUDA_CHECK(cudaFuncSetAttribute(b_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));

  auto launch_a = [&](bool overlap) {
    stream_kernel<<<kABlocks, kAThreads, 0, stream>>>(src, dst, a_end, overlap);
    CUDA_CHECK(cudaGetLastError());
  };
  // The library's launch (common/overlap.h), so FLAMIA_PDL=0 makes the overlapped rows plain.
  auto launch_b = [&](int smem, int threads, bool overlap) {
    CUDA_CHECK(flamia::launch_kernel(b_kernel, unsigned(sms), unsigned(threads), size_t(smem), stream, overlap, start,
                                     waited, smem));
  };
  auto timed = [&](auto&& body) {
    CUDA_CHECK(cudaEventRecord(e0, stream));
    body();
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms);
  };
  for (int w = 0; w < 3; ++w) timed([&] { launch_a(false); launch_b(max_smem, 384, false); });

  std::printf("\n%-10s %-8s %-8s | %-28s | %-28s | %-22s\n", "B smem KB", "threads", "launch",
              "B CTAs start, us after A", "B waits return, us after A", "A+B ms (A, B alone)");
  for (int smem_kb : {0, 48, 100, 200}) {
    for (int threads : {128, 384}) {
      std::vector<double> a_alone, b_alone;
      for (int r = 0; r < reps; ++r) {
        a_alone.push_back(timed([&] { launch_a(false); }));
        b_alone.push_back(timed([&] { launch_b(smem_kb * 1024, threads, false); }));
      }
      for (bool overlap : {false, true}) {
        std::vector<double> fs, ls, fw, lw, pair;
        for (int r = 0; r < reps; ++r) {
          CUDA_CHECK(cudaMemsetAsync(a_end, 0, sizeof(unsigned long long), stream));
          pair.push_back(timed([&] { launch_a(overlap); launch_b(smem_kb * 1024, threads, overlap); }));
          unsigned long long end = 0;
          std::vector<unsigned long long> s(sms), wt(sms);
          CUDA_CHECK(cudaMemcpy(&end, a_end, sizeof(end), cudaMemcpyDeviceToHost));
          CUDA_CHECK(cudaMemcpy(s.data(), start, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
          CUDA_CHECK(cudaMemcpy(wt.data(), waited, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
          const auto rel = [&](unsigned long long t) { return (double(t) - double(end)) / 1000.0; };
          fs.push_back(rel(*std::min_element(s.begin(), s.end())));
          ls.push_back(rel(*std::max_element(s.begin(), s.end())));
          fw.push_back(rel(*std::min_element(wt.begin(), wt.end())));
          lw.push_back(rel(*std::max_element(wt.begin(), wt.end())));
        }
        std::printf("%-10d %-8d %-8s | first %7.2f  last %7.2f   | first %7.2f  last %7.2f   | %.4f (%.4f, %.4f)\n",
                    smem_kb, threads, overlap ? "overlap" : "plain", median(fs), median(ls), median(fw), median(lw),
                    median(pair), median(a_alone), median(b_alone));
      }
    }
  }
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
  CUDA_CHECK(cudaFree(a_end));
  CUDA_CHECK(cudaFree(start));
  CUDA_CHECK(cudaFree(waited));
  return 0;
}
