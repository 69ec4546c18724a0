#pragma once
// Replacement policies of the HBM row cache. Each policy is a score per resident slot; the pool
// evicts the unpinned slot with the lowest score.
//   lru:       score = time of last use.
//   lfu:       score = (uses while resident, then time of last use to break ties).
//   lookahead: uses the keys of the batches submitted but not yet planned (the window): score =
//              (how soon the next use is in the window, 0 when there is none; then uses). So a row
//              not used again within the window is evicted first (admission: a row used once is
//              fetched for its batch and is the first to leave), else the row whose next use is
//              farthest away (Belady within the window); ties by frequency.

#include <string>

#include "core/status.hpp"

namespace strata::cache {

enum class Policy { kLru = 0, kLfu = 1, kLookahead = 2 };

const char* to_string(Policy p) noexcept;
/// "lru", "lfu" or "lookahead"; anything else is an error naming the value and the choices.
Result<Policy> parse_policy(const std::string& s);

}  // namespace strata::cache
