#include "core/table_spec.hpp"

#include <cmath>
#include <cstdio>
#include <utility>

#include "core/record_layout.hpp"
#include "core/text.hpp"

namespace strata {
namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

// A name as an error shows it: its first 32 bytes ("..." when cut), bytes outside the rule that
// would not print as \xNN.
std::string shown_name(const std::string& name) {
  constexpr std::size_t kShown = 32;
  std::string out;
  for (std::size_t i = 0; i < name.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return name.size() > kShown ? out + "..." : out;
}

}  // namespace

// The element types alone, whatever the placement: every placement serves every one (store/store_impl.cpp, above
// open_rank).
Status validate_dtypes(const TableSpec& s, const std::string& who) {
  const OptimizerKind kind = s.optimizer.kind;
  if (s.state_dtype != DType::kF32 && s.state_dtype != DType::kBF16)
    return Status::invalid_argument(who + ": state_dtype " + to_string(s.state_dtype) + " (expected fp32 or bf16)");
  if (s.state_dtype == DType::kBF16 && (kind == OptimizerKind::kSgd || kind == OptimizerKind::kRowwiseAdagrad))
    return Status::invalid_argument(
        who + ": state_dtype bf16 with optimizer " + to_string(kind) +
        " (expected fp32: bf16 state is for adagrad and adam; " +
        (kind == OptimizerKind::kSgd ? "sgd keeps no state)" : "rowwise_adagrad keeps one fp32 per row)"));
  if (s.stochastic_rounding && s.dtype == DType::kF32 && s.state_dtype == DType::kF32)
    return Status::invalid_argument(who +
                                    ": stochastic_rounding on a table of fp32 rows and fp32 state (expected a "
                                    "dtype of bf16 or fp16, or a state_dtype of bf16: fp32 elements are not rounded)");
  return Status::ok();
}

Status validate_table_name(const std::string& name) {
  const std::string rule = " (expected 1 to " + std::to_string(kMaxTableNameBytes) +
                           " bytes of letters, digits, '_', '-' and '.', not starting with '.')";
  if (name.empty()) return Status::invalid_argument("table name is empty" + rule);
  const std::string who = "table '" + shown_name(name) + "': name ";
  if (name.size() > kMaxTableNameBytes)
    return Status::invalid_argument(who + "is " + std::to_string(name.size()) + " bytes long" + rule);
  if (name[0] == '.') return Status::invalid_argument(who + "starts with '.'" + rule);
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (name_char(c)) continue;
    const auto u = static_cast<unsigned char>(c);
    char what[16];
    if (u >= 0x20 && u < 0x7f)
      std::snprintf(what, sizeof what, "'%c'", c);
    else
      std::snprintf(what, sizeof what, "byte 0x%02x", u);
    return Status::invalid_argument(who + "holds " + what + " at byte " + std::to_string(i) + rule);
  }
  return Status::ok();
}

std::int32_t optimizer_state_dim(OptimizerKind kind, std::int32_t dim) noexcept {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return dim;
    case OptimizerKind::kRowwiseAdagrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2 * dim;  // dim <= kMaxDim: no overflow
  }
  return 0;
}

Status validate(const TableSpec& s) {
  STRATA_RETURN_IF_ERROR(validate_table_name(s.name));
  const std::string who = "table '" + s.name + "'";
  if (s.rows <= 0) return Status::invalid_argument(who + ": rows " + std::to_string(s.rows) + " must be > 0");
  if (s.dim <= 0) return Status::invalid_argument(who + ": dim " + std::to_string(s.dim) + " must be > 0");
  if (s.dim > kMaxDim)
    return Status::invalid_argument(who + ": dim " + std::to_string(s.dim) + " is above the widest row, " +
                                    std::to_string(kMaxDim) + " elements");
  // Enums first: a value outside its enum (a cast integer) is named by its number, and must not
  // reach a switch over it.
  for (const auto& [field, v] : {std::pair<const char*, DType>{"dtype", s.dtype},
                                 {"state_dtype", s.state_dtype},
                                 {"output_dtype", s.output_dtype}})
    if (to_string(v)[0] == '?')
      return Status::invalid_argument(who + ": " + field + " " + std::to_string(static_cast<int>(v)) +
                                      " is out of range (expected fp32, fp16 or bf16)");
  if (to_string(s.pooling)[0] == '?')
    return Status::invalid_argument(who + ": pooling " + std::to_string(static_cast<int>(s.pooling)) +
                                    " is out of range (expected sum, mean or none)");
  if (to_string(s.optimizer.kind)[0] == '?')
    return Status::invalid_argument(who + ": optimizer kind " + std::to_string(static_cast<int>(s.optimizer.kind)) +
                                    " is out of range (expected sgd, adagrad, rowwise_adagrad or adam)");
  STRATA_RETURN_IF_ERROR(validate_dtypes(s, who));
  if (!(s.init.bound >= 0.0f) || !std::isfinite(s.init.bound))
    return Status::invalid_argument(who + ": initializer bound " + std::to_string(s.init.bound) + " must be >= 0");
  const OptimizerSpec& o = s.optimizer;
  if (!(o.learning_rate >= 0.0f) || !std::isfinite(o.learning_rate))
    return Status::invalid_argument(who + ": learning_rate " + number_text(o.learning_rate) +
                                    " (expected a finite number >= 0; 0 updates nothing)");
  if (!(o.eps > 0.0f) || !std::isfinite(o.eps))
    return Status::invalid_argument(who + ": eps " + std::to_string(o.eps) + " must be > 0");
  if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f))
    return Status::invalid_argument(who + ": beta1 " + std::to_string(o.beta1) + " must be in [0, 1)");
  if (!(o.beta2 >= 0.0f && o.beta2 < 1.0f))
    return Status::invalid_argument(who + ": beta2 " + std::to_string(o.beta2) + " must be in [0, 1)");
  if (!(o.weight_decay >= 0.0f) || !std::isfinite(o.weight_decay))
    return Status::invalid_argument(who + ": weight_decay " + std::to_string(o.weight_decay) + " must be >= 0");
  if (!(o.initial_accumulator >= 0.0f) || !std::isfinite(o.initial_accumulator))
    return Status::invalid_argument(who + ": initial_accumulator " + std::to_string(o.initial_accumulator) +
                                    " must be >= 0");
  // Sizes are computed in bytes of size_t: refuse a table whose records could not be addressed.
  const std::int64_t record_bytes = record_words(record_shape(s)) * 4;
  if (s.rows > kMaxTableBytes / record_bytes)
    return Status::invalid_argument(
        who + ": " + std::to_string(s.rows) + " rows of " + std::to_string(record_bytes) +
        " bytes (weights and optimizer state) exceed the most a table may hold, 2^48 bytes");
  return Status::ok();
}

const char* to_string(DType v) noexcept {
  switch (v) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}
const char* to_string(Pooling v) noexcept {
  switch (v) {
    case Pooling::kSum:
      return "sum";
    case Pooling::kMean:
      return "mean";
    case Pooling::kNone:
      return "none";
  }
  return "?";
}
const char* to_string(OptimizerKind v) noexcept {
  switch (v) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

Result<DType> parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "fp16") return DType::kF16;
  if (s == "bf16") return DType::kBF16;
  return Status::invalid_argument("unknown dtype '" + s + "' (expected fp32, fp16 or bf16)");
}
Result<Pooling> parse_pooling(const std::string& s) {
  if (s == "sum") return Pooling::kSum;
  if (s == "mean") return Pooling::kMean;
  if (s == "none") return Pooling::kNone;
  return Status::invalid_argument("unknown pooling '" + s + "' (expected sum, mean or none)");
}
Result<OptimizerKind> parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::kSgd;
  if (s == "adagrad") return OptimizerKind::kAdagrad;
  if (s == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  if (s == "adam") return OptimizerKind::kAdam;
  return Status::invalid_argument("unknown optimizer '" + s + "' (expected sgd, adagrad, rowwise_adagrad or adam)");
}

std::uint64_t table_name_hash(const std::string& name) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace strata
