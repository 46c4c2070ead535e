// Once-per-device host setup. Kernel attributes such as the dynamic shared-memory opt-in
// (cudaFuncSetAttribute) belong to a device, not to the process: a function-local static
// would set them on the first device only, and a second GPU of the same process would then
// launch without them (cudaErrorInvalidValue for > 48 KB of shared memory).
#pragma once

#include <atomic>

#include <cuda_runtime.h>

namespace flamia {
namespace sm90 {

class PerDeviceOnce {
 public:
  // Runs fn on the current device unless it already succeeded there. Concurrent first
  // calls may both run fn: the setups this serves are idempotent.
  template <class Fn>
  cudaError_t run(Fn&& fn) {
    int device = 0;
    const cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    if (device < 0 || device >= kMaxDevices) return fn();  // not cached: still correct
    if (done_[device].load(std::memory_order_acquire)) return cudaSuccess;
    const cudaError_t r = fn();
    if (r == cudaSuccess) done_[device].store(true, std::memory_order_release);
    return r;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<bool> done_[kMaxDevices] = {};
};

// Opt kernel in to `bytes` of dynamic shared memory on the current device (once per device
// per call site; above the 48 KB default only).
#define FLAMIA_ALLOW_DYNAMIC_SMEM(kernel, bytes)                                                  \
  ([&]() -> cudaError_t {                                                                          \
    if ((bytes) <= 48 * 1024) return cudaSuccess;                                                 \
    static ::flamia::sm90::PerDeviceOnce once_;                                                    \
    return once_.run(                                                                              \
        [&] { return cudaFuncSetAttribute((kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes)); }); \
  }())

}  // namespace sm90
}  // namespace flamia
