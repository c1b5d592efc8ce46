// Status names and formatting.
#include "common/status.h"

namespace snap {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::k_ok: return "ok";
    case StatusCode::k_invalid_argument: return "invalid_argument";
    case StatusCode::k_not_found: return "not_found";
    case StatusCode::k_data_loss: return "data_loss";
    case StatusCode::k_unimplemented: return "unimplemented";
    case StatusCode::k_resource_exhausted: return "resource_exhausted";
    case StatusCode::k_unavailable: return "unavailable";
    case StatusCode::k_internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace snap
