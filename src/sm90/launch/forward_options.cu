// The fast forward's run-time options (host code): FLAMIA_FWD_TRACE, the file its phase clocks
// go to (kernels/forward_fast.cu runs the traced kernel when it is set), and FLAMIA_QUANT_BESIDE.
#include <cstdlib>
#include <cstring>

#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {

// Read at every call (a getenv is negligible next to a launch), so that a process can trace
// some calls and not others.
const char* forward_trace_path() {
  const char* v = std::getenv("FLAMIA_FWD_TRACE");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The quantizer on a third of the SMs beside the fast forward, which waits for what it needs as
// the quantizer finishes it (quantize.cuh) instead of for the whole quantizer: by default at head
// dim 128, where the quantizing forward measured 1-7 % faster (docs/PERFORMANCE.md, "v140 landing:
// outcome"; at 64 it gained nothing). FLAMIA_QUANT_BESIDE=0 turns it off at every head dim, any
// other value on. Only where the fast forward runs the call.
bool forward_quantize_beside(int head_dim) {
  const char* v = std::getenv("FLAMIA_QUANT_BESIDE");
  const bool on = v != nullptr && *v != '\0' ? std::strcmp(v, "0") != 0 : head_dim == 128;
  return on && forward_p_scale_from_keys();  // the fast forward's rule
}

}  // namespace sm90
}  // namespace flamia
