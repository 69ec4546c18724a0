#include "cache/cache_stats.hpp"

namespace strata::cache {

CacheStats& CacheStats::operator+=(const CacheStats& o) noexcept {
  accesses += o.accesses;
  hits += o.hits;
  misses += o.misses;
  evictions += o.evictions;
  writebacks += o.writebacks;
  bytes_filled += o.bytes_filled;
  bytes_written_back += o.bytes_written_back;
  bypassed += o.bypassed;
  deferred += o.deferred;
  return *this;
}

CacheStats& CacheStats::operator-=(const CacheStats& o) noexcept {
  accesses -= o.accesses;
  hits -= o.hits;
  misses -= o.misses;
  evictions -= o.evictions;
  writebacks -= o.writebacks;
  bytes_filled -= o.bytes_filled;
  bytes_written_back -= o.bytes_written_back;
  bypassed -= o.bypassed;
  deferred -= o.deferred;
  return *this;
}

}  // namespace strata::cache
