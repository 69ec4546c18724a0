#pragma once
// The subcommands of strata-tune, as functions of their parsed arguments (the main program only
// parses the command line: every integer flag a plain decimal in its range, toolkit/cli_flags.hpp).
// Each returns the process exit code: 0 on success, 2 for bad input (one line on stderr, before any
// long work and before any count is allocated), 1 when the work itself fails.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::tune {

/// Arguments of `strata-tune calibrate`.
struct CalibrateArgs {
  std::string out;                                ///< profile file to write; empty: stdout
  std::string from = "h200-pcie5";                ///< profile (name in bench/profiles or a file) giving the GPU numbers
  std::string name;                               ///< the new profile's name; empty: "calibrated-<from's name>"
  std::string row_bytes = "64,128,256,512,1024";  ///< gather row sizes, a comma-separated list (every item given)
  int probe_mib = 512;                            ///< MiB of each probe table (the probes within usable memory)
  std::int64_t lookups = std::int64_t{1} << 20;   ///< rows gathered per timed pass (within usable memory)
  int threads = 0;      ///< per NUMA node, in [0, 4 x the hardware threads] (0: the node's cores)
  std::string command;  ///< the command line as typed, for the sources
};

/// The keys of `plan` and `validate`: exactly one of workload, trace and criteo.
struct InputArgs {
  std::string workload;  ///< workload JSON file, or inline JSON starting with '{'
  std::string trace;     ///< STRTRACE file
  std::string criteo;    ///< Criteo TSV file
  /// criteo: the table set (as strata-bench --tables); trace or criteo: or a mapping of the file's features to tables,
  /// TABLE=FEATURE[+FEATURE...],... (toolkit/feature_tables.hpp)
  std::string tables = "criteo";
  /// trace or criteo without a mapping in `tables`: which features look up which table (validate: the plan's
  /// features lists); empty: each feature its own table
  std::vector<std::pair<std::string, std::vector<std::string>>> features;
  std::int64_t criteo_rows = 1953125;  ///< criteo: total rows of the "criteo" set (bench::kCriteoDefaultMaxRows)
  std::int64_t batch = 8192;           ///< criteo: samples per step (strata-bench's default --batch)
  bool criteo_label = true;            ///< criteo: lines start with the label
  int dim = 64;                        ///< trace, criteo: dim of every table
  std::int64_t steps = 0;  ///< workload: steps (0: twice its distinct batches); their keys within usable memory
  double sample = 1.0;     ///< spatial sampling rate of the keys (1: exact curves)
  std::int64_t sample_check_keys = std::int64_t{1} << 22;  ///< sampled: exact keys the error is measured on
};

/// Arguments of `strata-tune plan`.
struct PlanArgs {
  InputArgs input;
  std::string profile = "h200-pcie5";
  std::string ranks = "1";  ///< ranks (GPUs) of the world, an integer >= 1 (> 1: every table gpu or hybrid, sharded)
  std::optional<std::string> hbm_budget;   ///< per rank; none: the profile's HBM capacity (of one GPU)
  std::optional<std::string> host_budget;  ///< per rank; none: the profile's host memory over the ranks sharing it
  std::string optimizer = "sgd";
  std::optional<std::string> dtype;  ///< auto | fp32 | bf16 | fp16; none: each table's configured dtype (fp32)
  int max_in_flight = 8;             ///< >= 1
  int threads = 0;                   ///< store worker threads, in [0, kMaxThreads] (0: all cores)
  int points = 16;                   ///< curve points per table, in [2, kMaxCurvePoints]
  int belady_points = 4;           ///< curve points per table with Belady's optimum, in [0, kMaxCurvePoints] (0: none)
  std::string trainer = "device";  ///< where the trainer's dense model lives: device | host
  std::string out;                 ///< plan.json
  std::string html;                ///< report.html
  std::string json;                ///< report.json (the plan's numbers; plan.json is the store config)
  bool progress = true;            ///< progress lines on stderr when it is a terminal
};

/// Arguments of `strata-tune validate`.
struct ValidateArgs {
  std::string plan;  ///< the plan (a store config, as `plan --out` writes it)
  InputArgs input;   ///< the keys (dims, optimizers and threads are the plan's)
  std::string profile = "h200-pcie5";
  std::int64_t steps =
      0;  ///< timed training steps, in [0, bench::kMaxSteps] (0: half the source's batches, at least 1)
  std::string backend = "auto";    ///< strata-bench --backend
  std::string trainer = "device";  ///< strata-bench --trainer: device | host
  std::string ranks = "1";         ///< strata-bench --ranks: thread ranks of a plan made with plan --ranks
  std::string bench;               ///< the strata-bench program (empty: the one next to strata-tune)
  std::string out;                 ///< JSON output
  std::string html;                ///< HTML page: predicted against measured, per table and per link
  bool progress = true;
};

/// Arguments of `strata-tune capacity` (tune/capacity.hpp): the capacity of dynamic tables.
struct CapacityArgs {
  InputArgs input;                     ///< the keys (no sampling: every key is replayed)
  std::int64_t admit_after = 1;        ///< in [1, kMaxAdmitAfter]
  std::string eviction = "lru";        ///< lru | lfu
  std::int64_t evict_after_steps = 0;  ///< TTL in steps, in [0, 2^62) (0: none)
  std::string capacities;         ///< comma-separated capacities, each in [1, kMaxDynamicCapacity]; empty: the sweep
  int points = 12;                ///< the default sweep's capacities, in [2, kMaxCurvePoints]
  int refine = 8;                 ///< capacities of the refining pass, in [0, kMaxCurvePoints]
  double tolerance_points = 1.0;  ///< the recommendation's tolerance in percentage points, in [0, 100]
  int in_flight = 1;              ///< training batches in flight (their rows pinned), in [1, 1024]
  bool spread = false;            ///< keys spread over [0, 2^63) as strata-bench --dynamic spreads them
  std::string out;                ///< JSON output
  std::string html;               ///< HTML page
  bool progress = true;
};

int run_calibrate(const CalibrateArgs& args);
int run_capacity(const CapacityArgs& args);
int run_plan(const PlanArgs& args);
int run_validate(const ValidateArgs& args);

}  // namespace strata::tune
