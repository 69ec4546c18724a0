#pragma once
// What the cache tests share: the CachePoolOptions they build pools from, and taking a pool's
// dirty rows as a flush does (listed, then marked clean).
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

/// pool.dirty(), then marked clean (CachePool or ShardedPool).
template <class Pool>
std::vector<Transfer> take_dirty(Pool& pool) {
  std::vector<Transfer> rows = pool.dirty();
  pool.mark_clean(rows);
  return rows;
}

}  // namespace strata::cache::testing
