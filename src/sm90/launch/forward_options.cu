// The fast forward's run-time option (host code): FLAMIA_FWD_TRACE, the file its phase clocks
// go to (kernels/forward_fast.cu runs the traced kernel when it is set).
#include <cstdlib>

#include "sm90/sm90.h"

namespace flamia {
namespace sm90 {

// Read at every call (a getenv is negligible next to a launch), so that a process can trace
// some calls and not others.
const char* forward_trace_path() {
  const char* v = std::getenv("FLAMIA_FWD_TRACE");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace sm90
}  // namespace flamia
