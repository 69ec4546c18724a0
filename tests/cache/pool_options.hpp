#pragma once
// The CachePoolOptions the cache tests build pools from.
#include <utility>
#include <vector>

#include "cache/cache_pool.hpp"

namespace strata::cache::testing {

inline CachePoolOptions pool_options(std::int64_t slots, Policy p, std::vector<PoolTable> tables) {
  CachePoolOptions o;
  o.slots = slots;
  o.policy = p;
  o.record_bytes = 16;
  o.name = "(test)";
  o.tables = std::move(tables);
  return o;
}

}  // namespace strata::cache::testing
