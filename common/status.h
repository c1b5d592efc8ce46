// Status and Result<T>: recoverable failures across module and process boundaries.
// A Status is ok or carries a code and a one-line message naming what is wrong
// (file, field, value). No exceptions cross library boundaries.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace snap {

enum class StatusCode {
  k_ok = 0,
  k_invalid_argument,  // bad flag, bad request field
  k_not_found,         // missing file, missing tensor, missing config field
  k_data_loss,         // corrupt or truncated file
  k_unimplemented,     // unsupported architecture, dtype, quant type
  k_resource_exhausted,
  k_unavailable,       // shutting down, not ready: retry elsewhere or later
  k_internal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::k_ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "data_loss: model.gguf: tensor 'x' ends at 123 past file size 100"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::k_ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::k_invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::k_not_found, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::k_data_loss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::k_unimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::k_resource_exhausted, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::k_unavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::k_internal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {     // NOLINT: implicit by design
    CHECK(!std::get<Status>(v_).ok()) << "Result constructed from an ok Status";
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status k_ok_status;
    return ok() ? k_ok_status : std::get<Status>(v_);
  }
  T& value() & { CHECK(ok()) << status().to_string(); return std::get<T>(v_); }
  const T& value() const& { CHECK(ok()) << status().to_string(); return std::get<T>(v_); }
  T&& value() && { CHECK(ok()) << status().to_string(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace snap

// Propagate a failed Status / Result from the current function.
#define SNAP_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::snap::Status snap_status_ = (expr);          \
    if (!snap_status_.ok()) return snap_status_;   \
  } while (0)

#define SNAP_CONCAT_INNER(a, b) a##b
#define SNAP_CONCAT(a, b) SNAP_CONCAT_INNER(a, b)
#define SNAP_ASSIGN_OR_RETURN(lhs, expr) \
  SNAP_ASSIGN_OR_RETURN_IMPL(SNAP_CONCAT(snap_result_, __LINE__), lhs, expr)
#define SNAP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
