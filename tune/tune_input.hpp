#pragma once
// The keys strata-tune plans for: a synthetic workload (toolkit/workload.hpp), a recorded trace
// (toolkit/trace.hpp) or a Criteo TSV file (toolkit/criteo_tsv.hpp), turned into one key trace per
// table (cache/analysis.hpp's KeyTrace, one batch per training step) with the table's shape and
// its per-step key counts.
//
// Files are read through toolkit/batch_source.hpp, as strata-bench reads them: the whole file is
// checked first (checksums, every TSV line), then streamed once, one batch in memory at a time.
// What is kept: the exact per-step counts (keys, bags, distinct rows) of every table, and the keys
// themselves, all of them (8 bytes per key occurrence) or, with spatial sampling (SHARDS, Waldspurger
// et al., FAST '15), only the keys whose hash falls in the sample: a key (table t, row r) is kept when
// mix64(cache_key(t, r) ^ kSampleSalt) mod 2^24 < round(rate x 2^24), every occurrence of it or none.
// A sampled trace also keeps the exact keys of its first steps (at most `check_keys` occurrences over
// all tables): the curves measure their sampling error there (tune/curves.hpp).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/analysis.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "store/store_config.hpp"
#include "toolkit/batch_source.hpp"
#include "toolkit/feature_tables.hpp"
#include "toolkit/workload.hpp"

namespace strata::tune {

/// Called with a short progress line ("read 120 of 1000 batches") during long work.
using ProgressFn = std::function<void(const std::string&)>;

/// The hash range of the spatial sample: a rate is kept as a multiple of 1 / kSampleModulus.
inline constexpr std::uint64_t kSampleModulus = std::uint64_t{1} << 24;
/// Mixed into the key before hashing, so the sample is independent of the cache's own key hash.
inline constexpr std::uint64_t kSampleSalt = 0x5348415244535354ull;

/// Spatial sampling of the keys.
struct Sampling {
  double rate = 1.0;                                ///< in (0, 1]; 1: every key (exact)
  std::int64_t check_keys = std::int64_t{1} << 22;  ///< exact keys kept from the first steps (rate < 1)

  /// The threshold of the hash test: round(rate x kSampleModulus), at least 1.
  std::uint64_t threshold() const noexcept;
  /// The rate actually sampled: threshold() / kSampleModulus.
  double effective_rate() const noexcept;
  /// Whether the cache key `key` is in the sample (always true at rate 1).
  bool keeps(std::uint64_t key) const noexcept;
};

/// One table's keys over the steps: the keys of all its features, as a batch dedups them per table.
struct TableTrace {
  TableSpec spec;                       ///< name, rows, dim and optimizer (what the plan's store config gets)
  std::vector<std::string> features;    ///< its features, when other than itself (the plan's features list)
  cache::KeyTrace keys;                 ///< rows used (all, or the sampled ones), batch b = step b
  cache::KeyTrace check;                ///< sampled traces: every row of the first steps (see the header)
  cache::KeyTrace check_sample;         ///< sampled traces: the rows of `check` in the sample
  std::int64_t bags = 0;                ///< bags over all steps (each step's once, whatever its features)
  std::vector<std::int64_t> step_bags;  ///< bags of each step (a table of several features: the batch's, once)
  /// A table of several features: each step's key occurrences of each of them (`features` order).
  std::vector<std::vector<std::int64_t>> feature_keys;
  std::int64_t key_count = 0;       ///< key occurrences over all steps (exact, sampled or not)
  std::int64_t distinct_count = 0;  ///< distinct rows of each step, summed over the steps (exact)
  std::int64_t max_keys = 0;        ///< the most key occurrences of one step
  std::int64_t max_distinct = 0;    ///< the most distinct rows of one step (the smallest cache)

  /// Key occurrences per step, averaged over the steps.
  double keys_per_step() const noexcept;
  /// Bags per step, averaged over the steps.
  double bags_per_step() const noexcept;
  /// Distinct rows per step, averaged over the steps.
  double distinct_per_step() const noexcept;
};

/// The rows of the outputs of `table`'s features (store/model/table_cost.hpp's feature_rows) at
/// step `b` of `t`, whose features are `table`'s; 0 for a table of one feature.
std::int64_t step_feature_rows(const TableTrace& t, const TableConfig& table, std::int64_t b);

/// The tables and their traces; every table has the same number of steps.
struct TuneInput {
  std::string source;              ///< what was read, for reports ("trace day0.strtrace, 500 steps")
  std::int64_t steps = 0;          ///< batches per table
  double sample_rate = 1.0;        ///< Sampling::effective_rate() of the keys kept; 1: exact
  std::vector<TableTrace> tables;  ///< in workload, trace-header or Criteo column order
};

/// Builds a TuneInput one step at a time (one KeyBatch per step, features in a fixed order).
class InputBuilder {
 public:
  /// Tables `specs` (names unique), keys sampled by `sampling` (rate in (0, 1]). `features[t]`: the
  /// positions in every batch of table t's features, whose keys it takes together (empty: table t
  /// is feature t).
  InputBuilder(const std::vector<TableSpec>& specs, const Sampling& sampling,
               std::vector<std::vector<std::size_t>> features = {});
  /// Adds one step: table t takes the keys of its features (features beyond those of the tables
  /// are an error).
  Status add(const KeyBatch& batch);
  /// The input, with `source` and the steps added.
  TuneInput finish(std::string source) &&;

 private:
  TuneInput in_;
  std::vector<std::vector<std::size_t>> features_;  // per table: its features' positions in a batch
  std::size_t num_features_ = 0;
  Sampling sampling_;
  bool checking_ = false;  // the first steps: exact keys into TableTrace::check too
  std::int64_t checked_ = 0;
  std::vector<std::uint64_t> scratch_;
};

/// Bytes load_workload keeps per step of `spec` at most: 8 per key occurrence
/// (bench::max_batch_keys), and a bag count and an offset per table. Beside them it holds the
/// spec's distinct batches (bench::max_batch_bytes each); the curves need more after. A double, so
/// that a count no machine can hold still has a value.
double workload_step_bytes(const bench::WorkloadSpec& spec);

/// The keys of `spec` (validated) over `steps` training steps (>= 1): the spec's
/// distinct_batches batches (make_batches) cycled, as strata-bench runs them. Every table gets
/// `optimizer`. Errors: an invalid spec, steps < 1.
Result<TuneInput> load_workload(const bench::WorkloadSpec& spec, std::int64_t steps, OptimizerKind optimizer,
                                const Sampling& sampling = {}, const ProgressFn& progress = {});

/// The keys of a file source (bench::BatchSource::open_trace or open_criteo, opened with every
/// batch of the file): one step per batch, in file order, streamed through a cursor. `tables` are
/// the tables of the source's features (bench::map_features), `dims` gives each table's dim, every
/// table gets `optimizer`. An empty source (no keys at all) is an error ("trace X has no keys").
Result<TuneInput> load_source(const bench::BatchSource& source, const std::vector<bench::SourceTable>& tables,
                              const std::vector<int>& dims, OptimizerKind optimizer, const Sampling& sampling = {},
                              const ProgressFn& progress = {});

/// The keys of a STRTRACE file (load_source of open_trace): the tables of its header's features
/// under `mapping` (bench::map_features: each feature its own table where it says nothing; a table
/// of several has the most rows of its features), every one with `dim` (> 0) and `optimizer` (a
/// trace records rows, not dims). The whole file is checked before it is streamed (bad magic,
/// truncation, checksums): errors name the file and the offset; a mapping that does not fit the
/// header names the feature or table.
Result<TuneInput> load_trace(const std::string& path, int dim, OptimizerKind optimizer, const Sampling& sampling = {},
                             const ProgressFn& progress = {}, const std::vector<bench::TableFeatures>& mapping = {});

/// The tables of a Criteo TSV file as strata-bench --criteo builds them: `table_set` in the syntax
/// of bench::apply_table_set ("criteo" meaning "criteo:<criteo_rows>"), 26 tables (C1..C26), every
/// one of `dim` (where the set gives none). Errors: a bad set, a set of other than 26 tables.
Result<std::vector<TableSpec>> criteo_tables(const std::string& table_set, std::int64_t criteo_rows, int dim);

/// The keys of a Criteo TSV file (load_source of open_criteo) for the columns `tables`
/// (criteo_tables) and the tables `mapping` makes of them (bench::map_criteo_columns: a table of
/// several columns has their rows summed and the dim of the first), `batch` samples per step (the
/// last step may be shorter), lines with or without the label.
Result<TuneInput> load_criteo(const std::string& path, const std::vector<TableSpec>& tables, std::int64_t batch,
                              bool has_label, OptimizerKind optimizer, const Sampling& sampling = {},
                              const ProgressFn& progress = {}, const std::vector<bench::TableFeatures>& mapping = {});

}  // namespace strata::tune
