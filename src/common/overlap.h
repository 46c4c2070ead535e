// Kernel launches that may overlap the kernel before them in the stream (programmatic
// dependent launch; the kernels' side and its rules: common/grid_dependency.cuh).
// FLAMIA_PDL=0 launches them in plain stream order instead (the same kernels: their waits are
// then no-ops), read at every call like the other switches, so that one build can time both.
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

namespace flamia {

inline bool overlapped_launches_enabled() {
  const char* v = std::getenv("FLAMIA_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the previous
// kernel in the stream completes when `overlap` (and FLAMIA_PDL is not 0). Returns the
// launch's error, and clears it from the thread's last error as `<<<>>>` followed by
// cudaGetLastError did (a caller's later launch check must not report it).
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
                          bool overlap, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  const bool on = overlap && overlapped_launches_enabled();
  cfg.attrs = on ? &attr : nullptr;
  cfg.numAttrs = on ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

}  // namespace flamia
