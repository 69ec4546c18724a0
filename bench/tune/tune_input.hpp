#pragma once
// The keys strata-tune plans for: a synthetic workload (bench/workload.hpp) or a recorded trace
// (bench/trace.hpp), turned into one key trace per table (cache/analysis.hpp's KeyTrace, one batch
// per training step) with the table's shape and its per-step key counts.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/workload.hpp"
#include "cache/analysis.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::tune {

/// Called with a short progress line ("read 120 of 1000 batches") during long work.
using ProgressFn = std::function<void(const std::string&)>;

/// One table's keys over the steps.
struct TableTrace {
  TableSpec spec;         ///< name, rows, dim and optimizer (what the plan's store config gets)
  cache::KeyTrace keys;   ///< rows used, batch b = step b (every step has a batch, maybe empty)
  std::int64_t bags = 0;  ///< bags over all steps

  /// Key occurrences per step, averaged over the steps.
  double keys_per_step() const noexcept;
  /// Bags per step, averaged over the steps.
  double bags_per_step() const noexcept;
  /// The most key occurrences of one step (an upper bound of its distinct rows).
  std::int64_t max_keys_per_step() const noexcept;
};

/// The tables and their traces; every table has the same number of steps.
struct TuneInput {
  std::string source;              ///< what was read, for reports ("trace day0.strtrace, 500 steps")
  std::int64_t steps = 0;          ///< batches per table
  std::vector<TableTrace> tables;  ///< in workload or trace-header order
};

/// The keys of `spec` (validated) over `steps` training steps (>= 1): the spec's
/// distinct_batches batches (make_batches) cycled, as strata-bench runs them. Every table gets
/// `optimizer`. Errors: an invalid spec, steps < 1.
Result<TuneInput> load_workload(const bench::WorkloadSpec& spec, std::int64_t steps, OptimizerKind optimizer,
                                const ProgressFn& progress = {});

/// The keys of a STRTRACE file: one step per record, every header table with `dim` (> 0) and
/// `optimizer` (a trace records rows, not dims). The whole file is checked as it is read (bad
/// magic, truncation, checksums): errors name the file and the offset, before any analysis.
/// An empty trace (no batches, or no keys at all) is an error ("trace X has no keys").
Result<TuneInput> load_trace(const std::string& path, int dim, OptimizerKind optimizer,
                             const ProgressFn& progress = {});

}  // namespace strata::tune
