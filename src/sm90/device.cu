// Buffer sizes and device check of the sm_90a path.
#include "quantize/layout.cuh"
#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {

size_t qkv8_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv, int head_dim,
                  flamia_recipe recipe, bool for_backward) {
  return quant::Qkv8Layout::make(total_tokens, num_docs, hq, hkv, head_dim, recipe, for_backward).bytes;
}

size_t backward_workspace_bytes(int64_t total_tokens, int64_t num_docs, int hq, int hkv,
                                int head_dim, flamia_recipe recipe) {
  return quant::BwdWorkspaceLayout::make(total_tokens, num_docs, hq, hkv, head_dim, recipe,
                                         backward_dq_fused(recipe, head_dim))
      .bytes;
}

bool device_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so later calls do not report it
    return false;
  }
  return major == 9 && minor == 0;  // the binary holds sm_90a code only
}

}  // namespace sm90
}  // namespace flamia
