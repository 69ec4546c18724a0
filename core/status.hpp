#pragma once
// Status and Result<T>: the error vocabulary used across every module boundary.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace strata {

/// What kind of failure a Status reports.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     ///< bad input from the caller (batch, config, gradients)
  kNotFound,            ///< unknown table, batch or file
  kOutOfRange,          ///< a key or index outside its valid range
  kFailedPrecondition,  ///< call in the wrong state (forward before submit, ...)
  kAlreadyExists,       ///< a batch id submitted twice
  kResourceExhausted,   ///< memory (host or device) or capacity exhausted
  kDataLoss,            ///< a corrupt or truncated checkpoint / file
  kIoError,             ///< the operating system refused a file operation
  kInternal,            ///< a bug or a device fault
  kUnavailable,         ///< a peer or device did not answer in time
};

/// Name of a code ("InvalidArgument"), for messages.
const char* status_code_name(StatusCode code) noexcept;

/// Cheap success/failure value: OK holds no allocation; an error holds a code and a message that
/// names the table, the value and what was expected. Copyable; not thread-safe to mutate.
class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  static Status ok() noexcept { return Status(); }
  static Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status out_of_range(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status failed_precondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status already_exists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status resource_exhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status data_loss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  /// The Status with `code` and `msg`, for a code known only at run time (one that travelled
  /// between ranks as an integer). kOk, or a value off the enum, gives kInternal: an error that
  /// names no failure code is a bug of whoever made it; `msg` is kept.
  static Status from_code(StatusCode code, std::string msg);

  bool is_ok() const noexcept { return rep_ == nullptr; }
  explicit operator bool() const noexcept { return is_ok(); }
  StatusCode code() const noexcept { return rep_ ? rep_->code : StatusCode::kOk; }
  /// The message alone ("" when OK).
  const std::string& message() const noexcept;
  /// "InvalidArgument: table 'user': key 70000 out of range [0, 65536)" or "OK".
  std::string to_string() const;
  /// The same status with "context: " put before the message.
  Status with_context(const std::string& context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  Status(StatusCode code, std::string msg) : rep_(std::make_shared<const Rep>(Rep{code, std::move(msg)})) {}
  std::shared_ptr<const Rep> rep_;
};

/// A value or an error Status. Accessing value() of an error aborts (a programmer error).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.is_ok()) {
      std::fprintf(stderr, "strata: Result constructed from an OK status without a value\n");
      std::abort();
    }
  }
  bool is_ok() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return is_ok(); }
  const Status& status() const noexcept { return status_; }
  T& value() & {
    check();
    return *value_;
  }
  const T& value() const& {
    check();
    return *value_;
  }
  T&& value() && {
    check();
    return std::move(*value_);
  }
  T* operator->() {
    check();
    return &*value_;
  }
  const T* operator->() const {
    check();
    return &*value_;
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  void check() const {
    if (!value_) {
      std::fprintf(stderr, "strata: value() of an error Result: %s\n", status_.to_string().c_str());
      std::abort();
    }
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace strata

/// Returns the status from the enclosing function when it is an error.
#define STRATA_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    ::strata::Status strata_status_ = (expr);           \
    if (!strata_status_.is_ok()) return strata_status_; \
  } while (0)

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)
/// `STRATA_ASSIGN_OR_RETURN(auto x, make_x());` unwraps a Result or returns its status.
// NOLINTBEGIN(bugprone-macro-parentheses): lhs may be a declaration ("auto x"), which parentheses would break
#define STRATA_ASSIGN_OR_RETURN(lhs, expr)                                                                       \
  auto STRATA_CONCAT(strata_result_, __LINE__) = (expr);                                                         \
  if (!STRATA_CONCAT(strata_result_, __LINE__).is_ok()) return STRATA_CONCAT(strata_result_, __LINE__).status(); \
  lhs = std::move(STRATA_CONCAT(strata_result_, __LINE__)).value()
// NOLINTEND(bugprone-macro-parentheses)

/// Aborts with file and line on a broken internal invariant (programmer error, not bad input).
#define STRATA_CHECK(cond)                                                                    \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "strata: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
