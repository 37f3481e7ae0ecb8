#pragma once
// Errors as values at every boundary a user can reach (files, configs, requests):
// a Status carries a code and one human-readable line naming what was wrong.
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a user-supplied value is wrong (flag, request field, config key)
  kNotFound,         // a file, tensor or key is missing
  kDataLoss,         // a file is truncated or lies about its contents
  kUnimplemented,    // valid input we do not support (yet)
  kResourceExhausted,
  kInternal,
  kUnavailable,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: model/config.json: no such file"
  std::string to_string() const;

  // Prefix context ("loading tiny-llama: " + message), keeping the code.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status data_loss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
inline Status unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
inline Status resource_exhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}                    // NOLINT(implicit)
  StatusOr(Status status) : status_(std::move(status)) {}            // NOLINT(implicit)

  bool is_ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tessera

// Return early from a Status-returning function when `expr` failed.
#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::tessera::Status _st = (expr);                    \
    if (!_st.is_ok()) return _st;                      \
  } while (0)

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)
// TESSERA_ASSIGN_OR_RETURN(auto x, make_x());
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_statusor_, __LINE__), lhs, expr)
#define TESSERA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
