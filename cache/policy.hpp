#pragma once
// Replacement policies of the HBM row cache. Each policy is a score per resident slot; the pool
// evicts the unpinned slot with the lowest score.
//   lru:       score = time of last use (within a batch: the order of first use).
//   lfu:       score = (uses while resident, then time of last use to break ties).
//   lookahead: uses the keys of the batches submitted but not yet planned and of the batches the
//              trainer previewed (Store::preview): the window. Rows used again within the window
//              rank above all others, the sooner the higher (Belady within the window). Rows with
//              no use in the window leave first, by recency aged with frequency (LRFU): score =
//              time of last use + half_life / 4 x level, the level being 4 log2 of the row's
//              exponentially decayed use count (half-life 16 x the pool's slots in rows planned),
//              kept for every key, resident or not, in a count-min sketch
//              (cache/detail/frequency_sketch.hpp). So a row used once leaves soon (admission),
//              and a row that was hot before it was evicted comes back ranked as hot.

#include <string>

#include "core/status.hpp"

namespace strata::cache {

enum class Policy { kLru = 0, kLfu = 1, kLookahead = 2 };

const char* to_string(Policy p) noexcept;
/// "lru", "lfu" or "lookahead"; anything else is an error naming the value and the choices.
Result<Policy> parse_policy(const std::string& s);

}  // namespace strata::cache
