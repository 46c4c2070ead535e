// The quantizer alone, without the forward (docs/PERFORMANCE.md, "v137 outcome"): the plain
// quantizer on every SM, and the beside quantizer (quantize_qkv with a BesideLaunch) on G SMs,
// in the forward's order of kv blocks and in the plain order (one block of every head), for
// one shape of fixed-length documents and the training forward's qkv8 (fp8_mixed, with the
// backward's layouts). Printed, medians over the repetitions (the L2 flushed before each):
// the time and m, the beside quantizer's rate an SM over the plain one's
// (t_plain * SMs / (t * G)). Beside the forward only m > 1 hides anything (t_q (1 - 1/m)).
//
//   flamia_quant_probe [--docs N] [--len L] [--hq H] [--hkv H] [--d 64|128] [--reps N]
//   (defaults: fixed-4k's 8 x 4096 tokens, 16 / 16 heads, head dim 128, 15 repetitions)
#include <cuda_runtime.h>

#include "cuda_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "quantize/quantize.cuh"

namespace {

struct Shape {
  int docs = 8, len = 4096, hq = 16, hkv = 16, d = 128, reps = 15;
};

Shape parse(int argc, char** argv) {
  Shape s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int v = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--docs")) s.docs = v;
    else if (!std::strcmp(argv[i], "--len")) s.len = v;
    else if (!std::strcmp(argv[i], "--hq")) s.hq = v;
    else if (!std::strcmp(argv[i], "--hkv")) s.hkv = v;
    else if (!std::strcmp(argv[i], "--d")) s.d = v;
    else if (!std::strcmp(argv[i], "--reps")) s.reps = v;
    else { std::fprintf(stderr, "unknown option %s\n", argv[i]); std::exit(2); }
  }
  if (s.docs < 1 || s.len < 1 || s.hq < 1 || s.hkv < 1 || s.hq % s.hkv != 0 || (s.d != 64 && s.d != 128) ||
      s.reps < 1) {
    std::fprintf(stderr, "bad shape\n");
    std::exit(2);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flamia;
  const Shape s = parse(argc, argv);
  const int64_t T = int64_t(s.docs) * s.len;
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  // bf16 N(0, 1)-ish inputs: the exponent spread matters only to the scales, not to the time.
  auto bf16_tensor = [&](int heads, uint32_t seed) {
    std::vector<uint16_t> h(size_t(T) * heads * s.d);
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& x : h) {
      const float f = n(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      x = uint16_t(b >> 16);
    }
    void* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, h.size() * 2));
    CUDA_CHECK(cudaMemcpy(dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return dev;
  };
  std::vector<int32_t> cu(s.docs + 1);
  for (int b = 0; b <= s.docs; ++b) cu[b] = int32_t(int64_t(b) * s.len);
  int32_t* cu_dev = nullptr;
  CUDA_CHECK(cudaMalloc(&cu_dev, cu.size() * 4));
  CUDA_CHECK(cudaMemcpy(cu_dev, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));

  DeviceCall p{};
  p.q = bf16_tensor(s.hq, 1);
  p.q_stride_t = int64_t(s.hq) * s.d;
  p.q_stride_h = s.d;
  p.k = bf16_tensor(s.hkv, 2);
  p.k_stride_t = int64_t(s.hkv) * s.d;
  p.k_stride_h = s.d;
  p.v = bf16_tensor(s.hkv, 3);
  p.v_stride_t = int64_t(s.hkv) * s.d;
  p.v_stride_h = s.d;
  p.cu_seqlens = cu_dev;
  p.num_docs = s.docs;
  p.total_tokens = T;
  p.max_seqlen = s.len;
  p.hq = s.hq;
  p.hkv = s.hkv;
  p.head_dim = s.d;
  p.causal = true;
  p.softmax_scale = 1.0f;
  p.recipe = FLAMIA_RECIPE_FP8_MIXED;
  p.stream = nullptr;
  const auto layout = quant::Qkv8Layout::make(T, s.docs, s.hq, s.hkv, s.d, p.recipe, true);
  void* qkv8 = nullptr;
  CUDA_CHECK(cudaMalloc(&qkv8, layout.bytes));
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));

  auto time = [&](const quant::BesideLaunch* beside) {
    std::vector<float> ms;
    for (int r = -2; r < s.reps; ++r) {  // two warm-up calls
      CUDA_CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
      CUDA_CHECK(cudaEventRecord(start));
      CUDA_CHECK(quant::quantize_qkv(p, qkv8, true, beside));
      CUDA_CHECK(cudaEventRecord(stop));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (r >= 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };

  const double bytes_in = 2.0 * double(T) * (s.hq + 2 * s.hkv) * s.d;
  const double bytes = bytes_in + double(layout.bytes);  // an upper bound on what it writes
  std::printf("shape: %d docs x %d tokens, hq %d, hkv %d, head dim %d; %d SMs; reads %.0f MB, qkv8 %.0f MB\n",
              s.docs, s.len, s.hq, s.hkv, s.d, sms, bytes_in / 1e6, double(layout.bytes) / 1e6);
  const double plain = time(nullptr);
  std::printf("| quantizer | order | G (SMs) | ms | GB/s (reads + qkv8) | m |\n|---|---|---|---|---|---|\n");
  std::printf("| plain | heads fastest | %d | %.4f | %.0f | 1 |\n", sms, plain, bytes / plain / 1e6);
  const quant::BesideLaunch forward_order = quant::BesideLaunch::for_forward(p);
  for (int order = 0; order < 2; ++order) {
    const int kv_block = order == 0 ? forward_order.kv_block : s.hkv;
    for (const int g : {sms / 6, sms / 4, sms / 3, sms / 2, sms}) {
      if (order == 1 && g != sms / 3 && g != sms) continue;
      const quant::BesideLaunch b{unsigned(g), kv_block};
      const double t = time(&b);
      std::printf("| beside | %s (kv block %d) | %d | %.4f | %.0f | %.2f |\n",
                  order == 0 ? "the forward's" : "heads fastest", kv_block, g, t, bytes / t / 1e6,
                  plain * sms / (t * g));
    }
  }
  return 0;
}
