#pragma once
// The machine's floors under the run's own keys, measured before any store exists
// (toolkit/gather_probe.hpp): the gather limit (a bare gather-and-pool loop) and the update floor
// (each distinct row of a batch read and written once), per dim of the workload.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "core/key_batch.hpp"
#include "toolkit/gather_probe.hpp"

namespace strata::bench {

/// The gather probe's table for one dim: the workload's tables of that dim end to end (the store
/// keeps each in its own arena), records as wide as the store's (record_words of the tables'
/// dtype, state and state_dtype). The probe reads and writes whole 32-bit words: a row of
/// half-size elements is probed as the fp32 words that hold it, so the limits count its bytes.
struct GatherProbePlan {
  std::int32_t dim = 0;
  std::int32_t row_floats = 0;               // words of a row (row_words): what a gather reads
  std::int32_t record_floats = 0;            // words of the row and optimizer state: what an update reads and writes
  std::int64_t stride = 0;                   // words per record (record_words)
  std::int64_t rows = 0;                     // rows of the probe table
  std::map<std::string, std::int64_t> base;  // first probe row of each table of this dim
  bool folded = false;                       // more rows than kMaxGatherProbeBytes holds: indices wrap
};

/// The gather probe's table of each dim of the workload (its tables end to end, folded past 2 GiB).
std::vector<GatherProbePlan> gather_probe_plans(const Options& o);

/// One measured gather limit: for the workload's own keys, or (for a skewed workload) for uniform
/// random rows with the same bags.
struct GatherLimit {
  GatherProbeResult probe;
  std::int32_t dim = 0;  // the tables' dim (probe.dim counts the words read per row)
  std::string keys;      // "workload" or "uniform"
  bool folded = false;
};

/// Runs the gather probe for every dim of the workload on the first batches of the run.
Result<std::vector<GatherLimit>> measure_gather_limits(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads);

/// One measured update floor: the records of a dim's tables updated per second when each distinct
/// row of a batch is read and written once, and how many distinct rows a batch has (the mean over
/// the probe's batches).
struct UpdateFloor {
  UpdateProbeResult probe;
  std::int32_t dim = 0;
  double distinct_rows_per_batch = 0;
};

/// Runs the update probe for every dim of the workload on the distinct rows of the run's first
/// batches, in the order of their first use (the order the backward visits them).
Result<std::vector<UpdateFloor>> measure_update_floors(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads);

/// The update floors as the JSON's machine.update_floor array.
json update_floors_json(const std::vector<UpdateFloor>& floors);

/// The forward rate, in lookups/s, of a step that reads each key's row at the probe's rate for its
/// dim: keys / sum over dims of (keys of that dim / limit of that dim), on the first batch (every
/// batch has the same shape). 0 when a dim has no limit of kind `keys`.
double step_gather_limit(const Options& o, const std::vector<GatherLimit>& limits, const KeyBatch& batch,
                         const std::string& keys);

/// The floor of a training step in seconds: every key's row gathered at its dim's gather limit
/// (keys "workload", on the first batch) plus every distinct row of a batch updated once at its
/// dim's update floor. 0 when a dim has no measurement.
double step_floor_s(const Options& o, const std::vector<GatherLimit>& limits, const std::vector<UpdateFloor>& floors,
                    const KeyBatch& batch);

/// The gather limits as the JSON's machine.gather_limit array.
json gather_limits_json(const std::vector<GatherLimit>& limits);

/// A step's gather limit in lookups/s (step_gather_limit) for the workload's keys and for uniform
/// random rows; 0 where not measured.
struct StepLimits {
  double workload = 0;
  double uniform = 0;
  double floor_s = 0;  // step_floor_s: a training step's gather and update floors
};

}  // namespace strata::bench
