#pragma once
// What the cache tests share: the CachePlannerOptions they build pools from, and taking a pool's
// dirty rows as a flush does (listed, then marked clean).
#include <utility>
#include <vector>

#include "cache/cache_planner.hpp"

namespace strata::cache::testing {

inline CachePlannerOptions pool_options(std::int64_t slots, Policy p, std::vector<PoolTable> tables) {
  CachePlannerOptions o;
  o.slots = slots;
  o.policy = p;
  o.record_bytes = 16;
  o.name = "(test)";
  o.tables = std::move(tables);
  return o;
}

/// pool.dirty(), then marked clean (CachePlanner or PartitionedPlanner).
template <class Planner>
std::vector<Transfer> take_dirty(Planner& pool) {
  std::vector<Transfer> rows = pool.dirty();
  pool.mark_clean(rows);
  return rows;
}

}  // namespace strata::cache::testing
