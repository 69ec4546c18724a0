#pragma once
// Hit-rate curves of the tables and of their shared cache pools: the exact LRU curve at every
// size in one pass (cache::lru_curve, per batch distinct: a step's repeated keys are one access,
// a key hits when it is resident at the start of its step, as the cache works) and Belady's
// optimum (cache::belady_hits) at a few sizes.

#include <cstdint>
#include <string>
#include <vector>

#include "bench/tune/tune_input.hpp"
#include "cache/analysis.hpp"

namespace strata::tune {

/// One size of a curve.
struct CurvePoint {
  std::int64_t rows = 0;  ///< cache capacity in rows
  double lru = 0;         ///< LRU hit rate at this size, in [0, 1]
  double belady = -1;     ///< Belady's optimum at this size, or -1 when not computed
};

/// The curve of one table or one pool.
struct HitCurve {
  std::string name;                 ///< the table, or "pool (dim D, state S)"
  std::vector<std::string> tables;  ///< the tables whose keys it counts
  std::int64_t rows = 0;            ///< rows of those tables (the largest useful cache)
  cache::LruCurve lru;              ///< exact, every size
  std::vector<CurvePoint> points;   ///< sizes for reports, ascending, each >= lru.min_capacity()

  /// Mean distinct rows per step (accesses / steps).
  double distinct_per_step(std::int64_t steps) const noexcept;
};

/// `count` (>= 2) sizes from `lo` to `hi` (1 <= lo <= hi), spaced evenly on a log scale, rounded,
/// distinct and ascending (fewer when the range is narrow).
std::vector<std::int64_t> log_sizes(std::int64_t lo, std::int64_t hi, int count);

/// The curve of one table: LRU at every size, and at `points` log-spaced sizes from the smallest
/// cache that holds a step (min_capacity) to the table's rows the LRU rate and, at
/// `belady_points` of them spread evenly (0: none; each is one pass over the trace, several times
/// the LRU curve's cost), Belady's optimum.
Result<HitCurve> table_curve(const TableTrace& table, int points, int belady_points);

/// The curves of the shared pools: the tables of each (dim, optimizer state) shape that has more
/// than one table, their keys tagged by table (cache::cache_key) so that rows of different tables
/// never collide, one access per distinct (step, table, row). LRU only.
Result<std::vector<HitCurve>> pool_curves(const TuneInput& input, int points);

}  // namespace strata::tune
