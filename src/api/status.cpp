#include "api/status.h"

namespace flamia {
namespace api {
namespace {
// Per thread, so concurrent callers (e.g. one per GPU) do not see each other's messages.
thread_local std::string t_last_error;
}  // namespace

flamia_status report(const Status& s) {
  if (!s.ok()) t_last_error = s.message;
  return s.code;
}

const char* last_error_message() { return t_last_error.c_str(); }

}  // namespace api
}  // namespace flamia
