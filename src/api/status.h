// Status values carried through the API layer, and the per-thread message behind
// flamia_last_error().
#pragma once

#include <string>
#include <utility>

#include "flamia/flamia.h"

namespace flamia {
namespace api {

// Outcome of one step of a call: a flamia_status and, on failure, a message that names the
// offending argument and what was expected.
struct Status {
  flamia_status code = FLAMIA_SUCCESS;
  std::string message;

  bool ok() const { return code == FLAMIA_SUCCESS; }
  static Status success() { return {}; }
  static Status invalid(std::string m) { return {FLAMIA_ERROR_INVALID_ARGUMENT, std::move(m)}; }
  static Status unsupported(std::string m) { return {FLAMIA_ERROR_UNSUPPORTED, std::move(m)}; }
  static Status cuda(std::string m) { return {FLAMIA_ERROR_CUDA, std::move(m)}; }
  static Status nonfinite(std::string m) { return {FLAMIA_ERROR_NONFINITE, std::move(m)}; }
};

// Stores the message of a failed status for flamia_last_error() and returns the status
// code: the last step of every C entry point. A success leaves the message of the last
// failure in place ("the last failed call", as errno).
flamia_status report(const Status& s);

// The message of the last failure on this thread ("" if none).
const char* last_error_message();

}  // namespace api
}  // namespace flamia

// Returns from the enclosing function when a step fails.
#define FLAMIA_TRY(expr)                                   \
  do {                                                     \
    ::flamia::api::Status flamia_try_status_ = (expr);     \
    if (!flamia_try_status_.ok()) return flamia_try_status_; \
  } while (0)
