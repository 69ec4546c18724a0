#pragma once
// The machine's floors for the host kernels' memory work, measured by strata-bench once per
// distinct row size of its workload (docs/bench.md, "Gather limit" and "Update floor"):
//  - the random-row gather limit: how many table rows per second a bare gather + sum-pool loop
//    reads, for a given row size, key sequence and thread count; each mode's forward is reported
//    as a fraction of it;
//  - the update floor: how many records per second a bare read-modify-write of each distinct row
//    of a batch moves; with the gather limit it gives the floor of a training step.
//
// The gather loop is what a forward pass cannot do without: for every bag, read each key's row
// from a table laid out as the store lays out its host tables (rows `stride` floats apart, 2 MiB
// aligned, transparent huge pages), add it into accumulators held in registers (simd::Floats, the
// host kernels' register width), and store the bag's sum once. The update loop reads each
// distinct row's record (row and optimizer state), subtracts a scaled gradient held in L1 and
// writes it back. Rows are prefetched a fixed distance ahead. Both run on oneTBB's persistent
// workers in tasks of the host kernels' size (work stealing balances the threads, as in the
// kernels). Nothing else: no key validation, no dedup, no bounds checks.
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace strata::bench {

/// One timed pass of the probe: bags as offsets (bags + 1 entries, from 0, non-decreasing, ending
/// at rows.size()) over row indices into the probe table.
struct GatherProbeBatch {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> rows;
};

struct GatherProbeSpec {
  std::int32_t dim = 0;         ///< floats summed per row (> 0)
  std::int64_t stride = 0;      ///< floats from one row to the next (>= dim; the store's record stride)
  std::int64_t table_rows = 0;  ///< rows of the probe table (> 0); every row index must be below it
  int threads = 1;              ///< threads pooling bags (> 0)
};

struct GatherProbeResult {
  std::int32_t dim = 0;
  std::int64_t row_bytes = 0;  ///< dim * 4: the bytes of each row that are read
  std::int64_t table_rows = 0;
  std::int64_t table_bytes = 0;  ///< table_rows * stride * 4
  int threads = 0;
  int repetitions = 0;            ///< timed passes (one batch each)
  int prefetch_distance = 0;      ///< keys ahead whose rows are prefetched (the best of those tried)
  double lookups_per_s = 0;       ///< rows per second, median over the timed passes
  double gb_per_s = 0;            ///< lookups_per_s * row_bytes / 1e9
  double best_lookups_per_s = 0;  ///< the fastest pass
};

/// Allocates and fills the probe table, then times `repetitions` passes (pass i pools
/// batches[i % batches.size()] on spec.threads threads) for each prefetch distance it tries, and
/// keeps the distance whose median is highest. Errors: invalid_argument naming the field for a
/// spec out of range, no batches, malformed offsets or a row index outside [0, table_rows);
/// resource_exhausted when the table cannot be allocated. Blocks for the passes (about
/// repetitions x 3 x one forward step, plus filling the table).
Result<GatherProbeResult> measure_gather_limit(const GatherProbeSpec& spec,
                                               const std::vector<GatherProbeBatch>& batches, int repetitions);

struct UpdateProbeSpec {
  std::int32_t record_floats = 0;  ///< floats read and written per row: the row and its optimizer state (> 0)
  std::int64_t stride = 0;         ///< floats from one record to the next (>= record_floats)
  std::int64_t table_rows = 0;     ///< rows of the probe table (> 0); every row index must be below it
  int threads = 1;                 ///< threads updating rows (> 0)
};

struct UpdateProbeResult {
  std::int32_t record_floats = 0;
  std::int64_t record_bytes = 0;  ///< record_floats * 4: read, then written, per row
  std::int64_t table_rows = 0;
  std::int64_t table_bytes = 0;  ///< table_rows * stride * 4
  int threads = 0;
  int repetitions = 0;         ///< timed passes (one pass's rows each)
  int prefetch_distance = 0;   ///< rows ahead prefetched into L2 (the best of those tried)
  double rows_per_s = 0;       ///< records updated per second, median over the timed passes
  double gb_per_s = 0;         ///< rows_per_s * record_bytes * 2 / 1e9 (read and written)
  double best_rows_per_s = 0;  ///< the fastest pass
};

/// Allocates and fills a probe table, then times `repetitions` passes (pass i updates every row of
/// passes[i % passes.size()] once, in that order: a batch's distinct rows in the order of their
/// first use, as the backward visits them) for each prefetch distance it tries, and keeps the
/// distance whose median is highest. Errors: invalid_argument naming the field for a spec out of
/// range, no passes, an empty pass or a row index outside [0, table_rows); resource_exhausted when
/// the table cannot be allocated.
Result<UpdateProbeResult> measure_update_limit(const UpdateProbeSpec& spec,
                                               const std::vector<std::vector<std::int64_t>>& passes, int repetitions);

}  // namespace strata::bench
