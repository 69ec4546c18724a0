#pragma once
// Cache-line hints (CPU cache-line prefetches) for the planner's loops over a batch's rows; not
// the prefetcher of the cache (cache/prefetcher.hpp).

/// Marks a function whose only effect is a cache-line prefetch. GCC (12 at least) otherwise finds such a
/// function free of side effects once it is not inlined, and drops the calls: always inline it.
#define STRATA_CACHE_LINE_HINT __attribute__((always_inline)) inline
