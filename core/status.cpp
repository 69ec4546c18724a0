#include "core/status.hpp"

namespace strata {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kUnavailable:
      return "Unavailable";
  }
  return "Unknown";
}

Status Status::from_code(StatusCode code, std::string msg) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists:
    case StatusCode::kResourceExhausted:
    case StatusCode::kDataLoss:
    case StatusCode::kIoError:
    case StatusCode::kInternal:
    case StatusCode::kUnavailable:
      return {code, std::move(msg)};
    case StatusCode::kOk:
      break;
  }
  return {StatusCode::kInternal, std::move(msg)};
}

const std::string& Status::message() const noexcept {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(status_code_name(rep_->code)) + ": " + rep_->message;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(rep_->code, context + ": " + rep_->message);
}

}  // namespace strata
