#include "cache/policy.hpp"

namespace strata::cache {

const char* to_string(Policy p) noexcept {
  switch (p) {
    case Policy::kLru:
      return "lru";
    case Policy::kLfu:
      return "lfu";
    case Policy::kLookahead:
      return "lookahead";
  }
  return "?";
}

Result<Policy> parse_policy(const std::string& s) {
  if (s == "lru") return Policy::kLru;
  if (s == "lfu") return Policy::kLfu;
  if (s == "lookahead") return Policy::kLookahead;
  return Status::invalid_argument("unknown cache policy '" + s + "'; expected lru, lfu or lookahead");
}

}  // namespace strata::cache
