// The fast forward (sm_90a): a persistent, warp-specialized kernel composed of the producer
// and key-scale warps (collective/fwd_producer.cuh) and the consumer warpgroups (collective/fwd_consumer.cuh)
// over a TMA + mbarrier pipeline, walking the quantizer's longest-first list of query tiles
// (128 rows, two consumer warpgroups, at D = 128; 192 rows, three, at D = 64). Shapes and the
// shared-memory plan: collective/fwd_plan.cuh.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/grid_dependency.cuh"
#include "common/overlap.h"
#include "quantize/layout.cuh"
#include "quantize/quantize.cuh"
#include "sm90/arch/warpgroup.cuh"
#include "sm90/collective/fwd_consumer.cuh"
#include "sm90/collective/fwd_producer.cuh"
#include "sm90/forward_args.cuh"
#include "sm90/launch/tensor_map.h"
#include "sm90/per_device.h"
#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {
namespace fwd {
namespace {

// The kernel's body; phases: trace::Off in the production kernel, trace::Clocks in the
// traced one (FLAMIA_FWD_TRACE).
template <int D, bool kMayBeside, class Trace>
__device__ __forceinline__ void forward_fast_body(const Params& p, Trace phases) {
  using P = Plan<D>;
  extern __shared__ uint8_t smem_raw[];
  // Swizzle atoms of 1024 bytes must start 1024-byte aligned.
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);

  if (threadIdx.x == 0) {
    for (int b = 0; b < P::kQBuffers; ++b) {
      mbar::init(base + P::kQFull0 + 8 * b, P::kQFullArrivals);
      mbar::init(base + P::kQEmpty0 + 8 * b, P::kQEmptyArrivals);
    }
    for (int s = 0; s < P::kStages; ++s) {
      mbar::init(base + P::kFull0 + 8 * s, P::kFullArrivals);
      mbar::init(base + P::kEmpty0 + 8 * s, P::kEmptyArrivals);
      mbar::init(base + P::kReady0 + 8 * s, P::kReadyArrivals);
    }
    mbar::fence_init();
  }
  __syncthreads();
  // The CTA may have started in the last wave of the quantizer (or the check of a filled
  // qkv8) before it, which writes everything it reads: qkv8 and the work list. Whatever
  // follows (the poisoning of a faulted call) reads only what the kernel's completion leaves.
  // Beside the quantizer the producer waits for its counts instead (fwd_producer.cuh), and
  // every thread waits for its grid at the end, so that this kernel's completion still
  // implies the quantizer's (the status word, the backward's copies).
  if (!beside_quantizer<kMayBeside>(p)) grid::wait_for_prior_grids();
  grid::allow_dependents();

  const int role = warpgroup::index();
  if (role == 0) {
    warpgroup::release_registers<P::kProducerRegs>();
    if (threadIdx.x < 32) producer<D, kMayBeside>(p, smem, base, int(threadIdx.x));
    else if (threadIdx.x < 64) key_scales<D>(smem, base, int(threadIdx.x) - 32);
  } else {
    warpgroup::claim_registers<P::kConsumerRegs>();
    consumer<D>(p, smem, base, role - 1, phases);
  }
  if (beside_quantizer<kMayBeside>(p)) grid::wait_for_prior_grids();
}

// kMayBeside: the kernel the forward runs beside the quantizer; the other one after it.
template <int D, bool kMayBeside>
__global__ void __launch_bounds__(Plan<D>::kThreads, 1) forward_fast_kernel(const __grid_constant__ Params p) {
  forward_fast_body<D, kMayBeside>(p, trace::Off{});
}

// The traced kernel: the consumer warps of the first kTracedCtas CTAs record up to kTraceCap
// marks each (the producer warpgroup's four warps record none).
constexpr int kTracedCtas = 4, kTraceCap = 1 << 14;
constexpr int kWarpsPerWarpgroup = warpgroup::kThreads / 32;  // the first consumer warp: after the producer's
template <int D>
constexpr int kTracedWarps = Plan<D>::kConsumers * kWarpsPerWarpgroup;  // a CTA's consumer warps
template <int D>
using TraceClocks = trace::Clocks<kTracedCtas, kTracedWarps<D>, kWarpsPerWarpgroup, kTraceCap>;
template <int D>
__global__ void __launch_bounds__(Plan<D>::kThreads, 1)
    forward_fast_traced_kernel(const __grid_constant__ Params p, uint64_t* clocks) {
  forward_fast_body<D, true>(p, TraceClocks<D>{clocks});
}

// FLAMIA_FWD_TRACE=FILE: the call runs the traced kernel, waits for it and writes FILE — a
// header of eight int64 (the bytes "FLMTRACE", version 1, D, CTAs, consumer warps a CTA, marks
// a warp, the SM clock in kHz, 0), then the marks, warp after warp, CTA after CTA (unwritten
// ones all ones); tools/fwd_trace_summary.py reads it. For diagnosis: the forward then
// synchronizes, and a failure to write the file is the call's error (the path and reason on stderr).
template <int D>
cudaError_t launch_traced(const Params& prm, unsigned grid, int device, cudaStream_t stream, const char* path) {
  using P = Plan<D>;
  constexpr auto kernel = forward_fast_traced_kernel<D>;
  constexpr int kCap = kTraceCap, kWarps = kTracedWarps<D>;
  const size_t words = size_t(kTracedCtas) * kWarps * kCap;
  cudaError_t err = FLAMIA_ALLOW_DYNAMIC_SMEM(kernel, P::kAlloc);
  uint64_t* clocks = nullptr;
  if (err == cudaSuccess) err = cudaMalloc(&clocks, words * sizeof(uint64_t));
  if (err != cudaSuccess) return err;
  std::vector<uint64_t> host(words);
  int khz = 0;
  if ((err = cudaMemsetAsync(clocks, 0xFF, words * sizeof(uint64_t), stream)) == cudaSuccess) {
    kernel<<<grid, P::kThreads, P::kAlloc, stream>>>(prm, clocks);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(host.data(), clocks, words * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  cudaFree(clocks);
  if (err != cudaSuccess) return err;
  int64_t header[8] = {0, 1, D, kTracedCtas, kWarps, kCap, khz, 0};
  std::memcpy(header, "FLMTRACE", 8);
  std::FILE* f = std::fopen(path, "wb");
  bool ok = f != nullptr && std::fwrite(header, sizeof(header), 1, f) == 1 &&
            std::fwrite(host.data(), sizeof(uint64_t), words, f) == words;
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok) std::fprintf(stderr, "flamia: FLAMIA_FWD_TRACE: could not write %s: %s\n", path, std::strerror(errno));
  return ok ? cudaSuccess : cudaErrorUnknown;
}

// One attribute setting a kernel and device (the macro's once-flag is per expansion).
template <int D, bool kMayBeside>
cudaError_t allow_smem() {
  constexpr auto kernel = forward_fast_kernel<D, kMayBeside>;
  return FLAMIA_ALLOW_DYNAMIC_SMEM(kernel, Plan<D>::kAlloc);
}

template <int D>
cudaError_t launch(const Params& prm, int64_t capacity, cudaStream_t stream) {
  using P = Plan<D>;
  const bool beside = prm.ready != nullptr;
  const auto kernel = beside ? forward_fast_kernel<D, true> : forward_fast_kernel<D, false>;
  int device = 0, sms = 0;
  cudaError_t err = beside ? allow_smem<D, true>() : allow_smem<D, false>();
  if (err != cudaSuccess || (err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
  const int64_t work = capacity * prm.hq;  // an upper bound: the real count is on the device
  const unsigned grid = unsigned(work < sms ? work : sms);
  if (const char* trace_path = forward_trace_path()) return launch_traced<D>(prm, grid, device, stream, trace_path);
  return launch_kernel(kernel, grid, P::kThreads, P::kAlloc, stream, true, prm);
}

}  // namespace
}  // namespace fwd

cudaError_t forward_fast(const Params& p, void* qkv8, void* out, float* lse) {
  if (p.total_tokens == 0) return cudaSuccess;
  const auto layout = quant::Qkv8Layout::make(p.total_tokens, p.num_docs, p.hq, p.hkv, p.head_dim, p.recipe, false);
  uint8_t* base = static_cast<uint8_t*>(qkv8);
  fwd::Params prm;
  const uint64_t D = uint64_t(p.head_dim), T = uint64_t(p.total_tokens);
  const int swz = p.head_dim == 128 ? 128 : 64;
  {
    const uint64_t dims[3] = {D, uint64_t(p.hq), T}, strides[2] = {D, uint64_t(p.hq) * D};
    const uint32_t box[3] = {uint32_t(D), 1, 64};
    if (cudaError_t e = encode_u8_map(&prm.q8, base + layout.q8, 3, dims, strides, box, swz)) return e;
  }
  {
    const uint64_t dims[3] = {D, uint64_t(p.hkv), T}, strides[2] = {D, uint64_t(p.hkv) * D};
    const uint32_t box[3] = {uint32_t(D), 1, uint32_t(tiles::kFwdBlockN)};
    if (cudaError_t e = encode_u8_map(&prm.k8, base + layout.k8, 3, dims, strides, box, swz)) return e;
  }
  {
    const uint64_t dims[2] = {uint64_t(layout.tpad), uint64_t(p.hkv) * D}, strides[1] = {uint64_t(layout.tpad)};
    const uint32_t box[2] = {uint32_t(tiles::kFwdBlockN), uint32_t(D)};
    if (cudaError_t e = encode_u8_map(&prm.vt8, base + layout.vt8, 2, dims, strides, box, 128)) return e;
  }
  const quant::WorkListRegions& work = layout.fast_forward_work();  // 128- or 192-row items (fwd_plan.cuh)
  set_forward_common(prm, p, base, layout, work, out, lse);
  const int64_t o_row = int64_t(p.hq) * p.head_dim;
  prm.rows_by_tma = quant::rows_16b_aligned(out, o_row, p.head_dim);
  if (prm.rows_by_tma)
    if (cudaError_t e = encode_natural_map(&prm.o_rows, out, p.total_tokens, p.hq, p.head_dim, o_row, p.head_dim))
      return e;
  prm.next_item = reinterpret_cast<int*>(base + work.next);
  prm.kv_block = order::forward_kv_block(p.total_tokens, p.hkv, p.head_dim);
  if (p.quantize_beside) {  // quantize_qkv ran with beside, in the same order of kv blocks
    prm.ready = reinterpret_cast<const int*>(base + layout.ready);
    prm.ready_block = quant::BesideReady::block_units(prm.kv_block, p.hq, p.hkv);
    prm.ready_kv_block = int(quant::BesideReady::chunks(layout.tpad)) * prm.ready_block;
  }
  if (p.head_dim == 64 && work.tile == fwd::Plan<64>::kBlockM) return fwd::launch<64>(prm, work.capacity, p.stream);
  if (p.head_dim == 128 && work.tile == fwd::Plan<128>::kBlockM) return fwd::launch<128>(prm, work.capacity, p.stream);
  return cudaErrorInvalidValue;
}

}  // namespace sm90
}  // namespace flamia
