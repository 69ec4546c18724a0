#pragma once
// strata-tune capacity: the capacity of a dynamic table (TableConfig::dynamic) from the keys it will be trained on.
// Each table's training batches are replayed through the store's own key index (host/key_index.hpp, the rules at the
// top of store/detail/dynamic_keys.hpp) once per candidate capacity, under the table's admission and eviction
// options, and every key use is counted by what it found: its row (a hit), a row made for it by its batch (admitted
// now), no row (not admitted: admit_after), or a batch refused because its new keys did not fit beside the rows
// pinned (KeyIndex::train's ResourceExhausted).
//
// As the store does it: a batch is one training submit (each table's clock advances by one, with or without keys); a
// table's keys of a batch are its features merged bag by bag (bag b: each feature's bag b in the table's feature
// order, each in key order: store/detail/features.hpp's merge), and their distinct keys in first-use order with their
// uses (host/dedup.hpp, DedupOrder::kFirstUse) are what KeyIndex::train takes. With `in_flight` > 1 a batch's rows
// stay pinned until in_flight - 1 later batches were submitted; a batch refused while earlier ones are pinned is
// submitted again after they retire, oldest first (counted as deferred), and refused only when it does not fit
// with none in flight. Tables are replayed independently: where the store refuses a batch, it refuses it for every
// table (a capacity that refuses batches is never recommended).
//
// The unbounded capacity is the table's distinct keys over the whole input: no row is ever evicted (the TTL still
// expires rows). The recommended capacity is the smallest candidate that refuses no batch and whose hit fraction is
// at least the unbounded one's minus `tolerance`; one more pass then replays `refine` capacities evenly between it
// and the candidate below it, and the rule picks again among all the runs.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dynamic_spec.hpp"
#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "host/key_index.hpp"
#include "toolkit/feature_tables.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Options of a capacity plan.
struct CapacityOptions {
  DynamicSpec dynamic;                   ///< admit_after, eviction and evict_after_steps of every table
  std::vector<std::int64_t> capacities;  ///< candidates, each in [1, kMaxDynamicCapacity]; empty: the default sweep
  int points = 12;                       ///< the default sweep's candidates, in [2, kMaxCurvePoints]
  int refine = 8;                        ///< capacities of the refining pass, in [0, kMaxCurvePoints] (0: none)
  double tolerance = 0.01;               ///< the recommendation's, as a fraction of the uses, in [0, 1]
  int in_flight = 1;                     ///< training batches in flight (their rows pinned), >= 1
  bool spread = false;                   ///< keys spread over [0, 2^63) first (spread_key, as strata-bench --dynamic)
};

/// Checks the options alone (ranges as the store's config takes them): InvalidArgument naming the option, the
/// value and the range.
Status check_capacity_options(const CapacityOptions& options);

/// One table's replay at one capacity. Uses are key occurrences in training batches.
struct CapacityRun {
  std::int64_t capacity = 0;
  std::int64_t hits = 0;          ///< uses of keys that had a row when their batch came
  std::int64_t admitted = 0;      ///< uses of keys given a row by their batch (their row starts at its initial value)
  std::int64_t not_admitted = 0;  ///< uses of keys left without a row (admit_after)
  std::int64_t refused = 0;       ///< uses of the batches refused
  std::int64_t refused_batches = 0;   ///< batches whose new keys did not fit beside their own rows (none in flight)
  std::int64_t deferred_batches = 0;  ///< batches that fit only once the batches before them retired
  KeyIndex::Counts counts;            ///< the index's admissions, evictions and expirations
  std::int64_t rows_in_use = 0;       ///< rows in use at the end
  std::int64_t index_bytes = 0;       ///< host memory of the key index (KeyIndex::bytes)
};

/// One table's plan.
struct TableCapacity {
  std::string name;
  std::vector<std::string> features;           ///< its features, when other than itself
  std::int64_t uses = 0;                       ///< key uses over all batches
  std::int64_t distinct = 0;                   ///< distinct keys over all batches
  std::int64_t max_step_distinct = 0;          ///< the most distinct keys of one batch
  std::vector<std::int64_t> distinct_by_step;  ///< [s]: distinct keys of batches 0..s
  std::vector<CapacityRun> runs;               ///< ascending capacity; empty for a table without keys
  int unbounded = -1;                          ///< the run at `distinct` (min(distinct, kMaxDynamicCapacity)); -1: none
  int recommended = -1;                        ///< recommend()'s run; -1: none

  /// A run's uses of each kind as a fraction of `uses` (0 without uses).
  double fraction(std::int64_t part) const noexcept;
  /// New distinct keys per batch over the last tenth of the batches (at least the last one).
  double late_growth() const noexcept;
};

/// The plan of every table of an input.
struct CapacityPlan {
  std::string source;  ///< what was read ("trace day0.strtrace, 100 steps")
  std::int64_t steps = 0;
  CapacityOptions options;
  std::vector<TableCapacity> tables;
};

/// The default sweep: `points` capacities spaced geometrically from max(1, min(max_step_distinct, distinct)) (a
/// smaller table cannot hold a batch's keys at admit_after 1) to `distinct` (rounded, distinct, ascending; each at
/// most kMaxDynamicCapacity). Empty when distinct is 0.
std::vector<std::int64_t> default_capacities(std::int64_t max_step_distinct, std::int64_t distinct, int points);

/// The recommendation rule (see the header): the smallest run with no refused batch and hits / uses >= the
/// unbounded run's - tolerance; -1 when there is no unbounded run.
int recommend(const TableCapacity& table, double tolerance);

/// The capacities of the refining pass: up to `points` capacities evenly spaced strictly between the recommended
/// run's and the run's below it (none when the recommended run is the smallest or there is none).
std::vector<std::int64_t> refinement(const TableCapacity& table, int points);

/// Calls `each` with the input's batches in order (one feature per source feature, as bench::BatchSource gives
/// them); called twice (a file is streamed again). Stops at the first error and returns it.
using BatchPass = std::function<Status(const std::function<Status(const KeyBatch&)>& each)>;

/// The capacity plan of `tables` (their `features` index the batches' features) over the batches of `pass`
/// (`steps` of them, for progress): a first pass counts each table's distinct keys, a second replays the batches
/// through a KeyIndex per (table, capacity), the runs of a batch in parallel (oneTBB), and a third the refinement.
/// `memory_limit` > 0: the indexes' memory (KeyIndex::bytes, estimated from a small index of the same options) above it
/// is refused before they are made (InvalidArgument saying how much and how many runs). Errors: the options'
/// (check_capacity_options), the pass's.
Result<CapacityPlan> plan_capacity(const std::vector<bench::SourceTable>& tables, std::int64_t steps,
                                   const BatchPass& pass, const CapacityOptions& options, double memory_limit = 0,
                                   const ProgressFn& progress = {});

/// The plan as JSON (capacity --out): the options, and per table its counts, its distinct keys by step (at most 101
/// points), every run (uses of each kind and their fractions, admissions, evictions, expirations, rows in use, index
/// bytes), the unbounded and the recommended capacity (null when none) and a store config's dynamic options for it.
std::string capacity_json(const CapacityPlan& plan);

/// The console summary: per table its growth and a line per run, the recommendation and its config options.
std::string capacity_console(const CapacityPlan& plan);

/// The HTML page: per table the growth of its distinct keys (bars) and the uses that find their row against the
/// capacity (inline SVG), and the runs' table.
std::string capacity_html(const CapacityPlan& plan);

}  // namespace strata::tune
