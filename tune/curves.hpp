#pragma once
// Hit-rate curves of the tables and of their shared slot pools: the exact LRU curve at every
// size in one pass (cache::lru_curve, per batch distinct: a step's repeated keys are one access,
// a key hits when it is resident at the start of its step, as the cache works) and Belady's
// optimum (cache::belady_hits) at a few sizes.
//
// A sampled input (TuneInput::sample_rate R < 1, SHARDS) has the curve of the sampled keys: a
// cache of c rows is read at R c rows of it (the sampled keys' stack distances are about R times
// the true ones), and its hit rate is the sampled hits there over the sampled accesses (SHARDS'
// plain estimate; its "adj" variant, the misses over R against the exact access count, did worse
// on a trace of rows x u^3, u uniform: 1.8 against 0.9 points off exact at 1%). The error is
// measured, not assumed: on the exact keys kept from the first steps (TableTrace::check), the
// sampled curve (the same hash test) is set against the exact curve at every report size, and the
// largest difference is the curve's `error`. It is the error on that prefix, which has fewer keys
// than the whole trace; the whole trace's sample has more, so its error is expected to be smaller
// (SHARDS' error falls with the number of sampled keys), not guaranteed to be.

#include <cstdint>
#include <string>
#include <vector>

#include "cache/analysis.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Most curve points per table in a report (plan --points, --belady-points): far more than a chart
/// shows, few enough that no count of them is long work.
inline constexpr int kMaxCurvePoints = 1024;

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
  std::vector<CurvePoint> points;   ///< sizes for reports, ascending, each >= min_rows
  double sample_rate = 1.0;         ///< the keys' sampling rate (1: exact)
  std::int64_t exact_accesses = 0;  ///< distinct (step, row) pairs of every key (exact, sampled or not)
  std::int64_t min_rows = 0;        ///< the smallest cache that holds a step (exact, sampled or not)
  double error = -1;                ///< sampled: largest |sampled - exact| hit rate on the prefix; -1: exact
  std::int64_t error_keys = 0;      ///< sampled: key occurrences of the prefix `error` was measured on

  /// Whether a cache smaller than the table (the pool) holds a step: false when some step touches
  /// every row (min_rows >= rows), so the only cache is the whole table (the planner's cached
  /// sizes are below the rows) and the curve is one point.
  bool cacheable() const noexcept { return min_rows < rows; }
  /// Mean distinct rows per step (accesses / steps; sampled accesses / sample_rate).
  double distinct_per_step(std::int64_t steps) const noexcept;
  /// The LRU hit rate of a cache of `rows` rows (sampled: the sampled curve at sample_rate x rows).
  double hit_rate(std::int64_t rows) const;
  /// The size from which the LRU rate stops rising (the largest stack distance, rescaled).
  std::int64_t saturation_rows() const noexcept;
  /// "" for an exact curve; else "sampled at 1%, error <= 0.3 points (measured against exact on the
  /// first 4194304 lookups)".
  std::string sampling_note() const;
};

/// `count` (>= 2) sizes from `lo` to `hi` (1 <= lo <= hi), spaced evenly on a log scale, rounded,
/// distinct and ascending (fewer when the range is narrow).
std::vector<std::int64_t> log_sizes(std::int64_t lo, std::int64_t hi, int count);

/// The curve of one table: LRU at every size, and at `points` log-spaced sizes from the smallest
/// cache that holds a step (min_capacity) to the table's rows the LRU rate and, at
/// `belady_points` of them spread evenly (0: none; each is one pass over the trace, several times
/// the LRU curve's cost), Belady's optimum. Sampled: Belady runs on the sampled keys at
/// sample_rate x the size (an estimate, as the LRU rate is), and the error is measured on
/// table.check (the tables' sampled trace: TuneInput::sample_rate, given as `sample_rate`).
Result<HitCurve> table_curve(const TableTrace& table, int points, int belady_points, double sample_rate = 1.0);

/// The curves of the shared pools: the tables of each record shape (dim, dtype, optimizer state and
/// its dtype: the store's slot pools, store/model/table_cost.hpp's slot_pools) that has more than
/// one table, their keys tagged by table (cache::cache_key) so that rows of different tables never
/// collide, one access per distinct (step, table, row). LRU only; sampled as the tables are (their
/// keys are the tables' sampled keys), the error measured on the tables' check prefixes. `specs`:
/// the tables as planned (their dtypes; input.tables order), or empty for the input's.
Result<std::vector<HitCurve>> pool_curves(const TuneInput& input, int points, const std::vector<TableSpec>& specs = {});

}  // namespace strata::tune
