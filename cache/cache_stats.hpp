#pragma once
// CacheStats: the counters of a cached table or of a slot pool (hits, misses, bytes moved), kept by
// the cache planners (cache/cache_planner.hpp) and reported by the store (StoreStats). A header of
// its own so that the store's public header reports them without pulling the planners.

#include <cstdint>

namespace strata::cache {

/// Counters of a table or a pool.
struct CacheStats {
  std::int64_t accesses = 0;            ///< unique (batch, row) lookups planned
  std::int64_t hits = 0;                ///< of which already resident
  std::int64_t misses = 0;              ///< of which filled from the host
  std::int64_t evictions = 0;           ///< resident rows dropped to make room
  std::int64_t writebacks = 0;          ///< rows copied back to the host (dirty evictions, flushes, bypassed rows)
  std::int64_t bytes_filled = 0;        ///< record bytes moved host -> device
  std::int64_t bytes_written_back = 0;  ///< record bytes moved device -> host
  /// Of the accesses, those served outside the cache: misses that did not fit it (beside the rows
  /// pinned by batches in flight, or at all) and hits on such rows of batches in flight. Counted
  /// in `misses` or `hits` too; each is written back after its batch's backward (`writebacks`).
  std::int64_t bypassed = 0;
  /// Batches (counted once per table they touch) whose plan did not fit beside the rows pinned by
  /// batches in flight when it was due: planned later, once batches retired, so their prefetch
  /// overlapped less (counted by cache::Prefetcher, not by the pool).
  std::int64_t deferred = 0;
  double hit_rate() const noexcept {
    return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0;
  }
  /// Calls `f(name, member)` for each counter, in one order: the one list of the counters that the
  /// arithmetic below and every report (strata-bench's JSON, the Python package's stats()) go
  /// through, so that a new counter is added, summed and reported in one place.
  template <typename F>
  static void for_each_counter(F&& f) {
    f("accesses", &CacheStats::accesses);
    f("hits", &CacheStats::hits);
    f("misses", &CacheStats::misses);
    f("evictions", &CacheStats::evictions);
    f("writebacks", &CacheStats::writebacks);
    f("bytes_filled", &CacheStats::bytes_filled);
    f("bytes_written_back", &CacheStats::bytes_written_back);
    f("bypassed", &CacheStats::bypassed);
    f("deferred", &CacheStats::deferred);
  }
  CacheStats& operator+=(const CacheStats& o) noexcept;
  CacheStats& operator-=(const CacheStats& o) noexcept;
};

}  // namespace strata::cache
