#pragma once
// Replacement policies of the HBM row cache. Each policy is a score per resident slot; the pool
// evicts the unpinned slot with the lowest score.
//   lru:       score = time of last use (within a batch: the order of first use).
//   lfu:       score = (uses while resident, then time of last use to break ties).
//   lookahead: uses the keys of the batches submitted but not yet planned (the window). Rows used
//              again within the window rank above all others, the sooner the higher (Belady
//              within the window); rows with no use in the window are ranked as by lfu and leave
//              first (admission: a row used once is fetched for its batch and is among the first
//              to leave).

#include <string>

#include "core/status.hpp"

namespace strata::cache {

enum class Policy { kLru = 0, kLfu = 1, kLookahead = 2 };

const char* to_string(Policy p) noexcept;
/// "lru", "lfu" or "lookahead"; anything else is an error naming the value and the choices.
Result<Policy> parse_policy(const std::string& s);

}  // namespace strata::cache
