#include "cache/cache_stats.hpp"

namespace strata::cache {

CacheStats& CacheStats::operator+=(const CacheStats& o) noexcept {
  for_each_counter([&](const char*, std::int64_t CacheStats::*c) { this->*c += o.*c; });
  return *this;
}

CacheStats& CacheStats::operator-=(const CacheStats& o) noexcept {
  for_each_counter([&](const char*, std::int64_t CacheStats::*c) { this->*c -= o.*c; });
  return *this;
}

}  // namespace strata::cache
