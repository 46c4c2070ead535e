// Per-device kernel setup. Function attributes such as the dynamic shared-memory opt-in
// belong to a (kernel, device) pair, so a process that drives several GPUs must set them on
// each device it launches on, once.
#pragma once

#include <atomic>

#include <cuda_runtime.h>

namespace flamia {
namespace sm90 {

constexpr int kMaxDevices = 64;

// Sets cudaFuncAttributeMaxDynamicSharedMemorySize for `kKernel` on the current device the
// first time this (kernel, device) pair is seen; returns the current device in *device.
// The kernel is a template argument, not a parameter, so that each kernel has its own
// table (kernels of one signature would share it).
template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes, int* device) {
  static std::atomic<bool> done[kMaxDevices];
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return err;
  if (*device < 0 || *device >= kMaxDevices) return cudaErrorInvalidDevice;
  if (done[*device].load(std::memory_order_acquire)) return cudaSuccess;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done[*device].store(true, std::memory_order_release);
  return err;
}

}  // namespace sm90
}  // namespace flamia
