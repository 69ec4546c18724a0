#pragma once
// Software prefetch of a row: every 64-byte line of `floats` floats starting at `p`. Gathers of
// random rows keep many misses in flight only if they ask for rows well ahead of using them.

#include <cstdint>

namespace strata {

/// Where a prefetch puts the lines: into L2 (table rows, far ahead: an L1 prefetch holds a
/// line-fill buffer until the line arrives, so few rows would be in flight), into L1 (rows
/// already in L2/L3, just ahead), or into L1 for writing (prefetchw: exclusive state, just before
/// an update, so its stores do not wait for ownership).
enum class Into { kL2, kL1, kWrite };

/// Prefetches every line of a row or record of `floats` floats at `p` (64-byte aligned records).
template <Into kInto = Into::kL2>
inline void prefetch_row(const float* p, std::int64_t floats) {
  const char* c = reinterpret_cast<const char*>(p);
  for (std::int64_t off = 0; off < floats * 4; off += 64) {
    if constexpr (kInto == Into::kWrite) {
      __builtin_prefetch(c + off, 1, 3);
    } else {
      __builtin_prefetch(c + off, 0, kInto == Into::kL1 ? 3 : 2);
    }
  }
}

}  // namespace strata
