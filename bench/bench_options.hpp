#pragma once
// strata-bench's options (its command line: docs/bench.md) and its modes: what a run was asked to
// do, and the store config each mode opens.

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/communicator.hpp"
#include "store/store_config.hpp"
#include "toolkit/feature_tables.hpp"
#include "toolkit/workload.hpp"

namespace strata::bench {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

/// Seconds since `t0`.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Most batches prefetched ahead of forward (--pipeline).
constexpr int kMaxPipeline = 1024;
/// Default --comm-timeout: a collective that waits this long for a rank fails the run. Two
/// minutes: far beyond a slow first step (store opening, first cache fill) on a busy machine,
/// short enough that a stopped or crashed rank ends the job soon.
constexpr double kDefaultCommTimeoutS = 120;
/// Largest --comm-timeout (a day).
constexpr double kMaxCommTimeoutS = 86400;

/// One placement mode strata-bench can run. Every mode runs the same batches through a Store whose
/// tables all have `placement`, except the --config mode (`from_config`), which opens the config's
/// store as given; its `placement` is `cached` when a table caches (its hit rate is reported), else
/// its first table's.
struct ModeDescriptor {
  const char* name;              ///< --modes name
  const char* summary;           ///< one line for --help, the JSON and the report
  Placement placement;           ///< placement of every table
  OffloadGather offload_gather;  ///< lookups of offload tables
  bool uses_device;              ///< opens a device (emu or cuda)
  bool from_config = false;      ///< the --config mode: the tables' own placements (Options::config)
};

/// The thread-rank modes (gpu and hybrid; --config runs one store as given).
bool sharded(const ModeDescriptor& m);
/// The modes --ranks N runs on N thread ranks: gpu and hybrid, and --config's store config (every
/// table of it gpu or hybrid, as strata-tune plan --ranks N writes them; Store::open says so).
bool runs_on_ranks(const ModeDescriptor& m);
/// Whether the mode's tables cache rows (cached, hybrid).
bool caches(const ModeDescriptor& m);
/// The names of the uniform modes, joined by `sep`.
std::string mode_names(const char* sep);
/// The uniform mode called `name` (kInvalidArgument naming the modes when there is none).
Result<const ModeDescriptor*> find_mode(const std::string& name);

/// Where the trainer's dense model lives (--trainer): its activations and gradients are there.
enum class Trainer { kDevice, kHost };

/// "device" or "host".
const char* trainer_name(Trainer t);

/// Everything the command line sets (and what run() derives from it before the modes run).
struct Options {
  WorkloadSpec workload;
  std::string table_set = "criteo";
  std::int64_t criteo_rows = kCriteoDefaultMaxRows;
  std::string workload_file;
  std::string modes = "cpu,offload,offload-cpu,cached,gpu,hybrid";
  double cache_fraction = 0.1;
  std::string sweep_cache;
  std::string policy = "lru";
  /// --trainer: where the trainer's dense model lives (device: outputs and gradients in device memory).
  Trainer trainer = Trainer::kDevice;
  int lookahead = 0;
  int preview = 0;             // training: batches previewed (Store::preview) beyond those submitted
  int planner_partitions = 1;  // cached: cores planning each slot pool (CacheConfig::planner_partitions)
  int pipeline = 2;
  int ranks = 1;
  std::string sharding = "row";
  /// Under `mpirun -np N` (N > 1): this process's rank of the world; each process is one rank.
  std::shared_ptr<dispatch::Communicator> mpi;
  std::string backend = "auto";
  std::int64_t device_capacity = 0;
  std::string pooling_mode = "sum";
  std::string optimizer = "sgd";
  /// --dtype, --state-dtype, --output-dtype: the element types of every table of the workload
  /// (TableSpec::dtype, state_dtype, output_dtype; fp32, bf16 or fp16). The --config mode keeps
  /// its tables' own.
  std::string dtype = "fp32", state_dtype = "fp32", output_dtype = "fp32";
  /// --dynamic: every table of the workload dynamic (TableConfig::dynamic, capacity = its rows), its keys spread over
  /// [0, 2^63) (toolkit/workload.hpp's spread_key: one-to-one, so the workload's skew is kept). Other modes fail at
  /// open (cpu only, so far).
  bool dynamic = false;
  int steps = 20;
  int warmup = 3;
  int threads = 2;
  int read_probe_mib = 1024;
  bool gather_probe = true;                      ///< measure the gather limit (--no-gather-probe skips it)
  double comm_timeout_s = kDefaultCommTimeoutS;  ///< collectives of the sharded modes (--comm-timeout)
  std::string json_out;
  std::string html_out;
  std::string profile = "h200-pcie5";
  /// --hbm-budget, --host-budget: the memory per rank each mode must fit for the verdict (sizes as
  /// strata-tune plan takes them, "8MB"); empty: the profile's (one GPU's HBM; its host memory over
  /// the ranks sharing it).
  std::string hbm_budget, host_budget;
  std::string dump_keys;
  std::string dump_trace;                        ///< --dump-trace: the run's batches as a STRTRACE file
  std::string trace_file;                        ///< --trace: replay this STRTRACE file
  std::string criteo_file;                       ///< --criteo: replay this Criteo TSV file
  bool criteo_label = true;                      ///< --criteo-no-label clears it (Kaggle's test.txt)
  std::string config_file;                       ///< --config: also run this store config as given
  StoreConfig config;                            ///< the parsed --config
  ModeDescriptor config_mode{};                  ///< the --config mode (name: config_name)
  std::string config_name;                       ///< the --config mode's name: the file's stem
  std::string config_summary;                    ///< the --config mode's description
  bool dim_given = false;                        ///< --dim was on the command line
  bool tables_given = false;                     ///< --tables or --rows was on the command line
  bool backend_given = false;                    ///< --backend was on the command line (overrides the config's)
  bool capacity_given = false;                   ///< --device-capacity was on the command line (overrides the config's)
  bool steps_given = false;                      ///< --steps was on the command line (else fitted to a short file)
  bool warmup_given = false;                     ///< --warmup was on the command line (else fitted to a short file)
  std::string steps_note;                        ///< why --warmup and --steps were fitted to a short file ("": not)
  bool progress = ::isatty(STDERR_FILENO) != 0;  // progress only on a terminal (--no-progress hides it there too)
  std::vector<std::string> argv;
  /// --tables in its mapping form (TABLE=FEATURE[+FEATURE...],...; toolkit/feature_tables.hpp): which features of a
  /// --trace or --criteo file look up which table. Empty: none given.
  std::vector<TableFeatures> feature_map;
  /// The tables of the file looked up by features other than themselves (from feature_map, or the --config's
  /// features lists): table -> its features, in order. Every mode's config lists them (TableConfig::features).
  std::map<std::string, std::vector<std::string>> table_features;
  std::map<std::string, std::string> feature_table;  ///< feature -> table, for the features of table_features
};

/// The table that feature `feature` of a batch looks up (Options::feature_table; else the feature's own name).
const std::string& table_of(const Options& o, const std::string& feature);

/// The built-in workload: Criteo Kaggle-shaped tables (set by table_set = "criteo"), one common
/// dim, one-hot bags as in the data set, Zipf keys (docs/bench.md, "Default workload").
WorkloadSpec default_workload();

/// Parses the command line into `o` (its defaults as set); a usage error or --help prints and
/// gives the exit code (std::nullopt: run). Under mpirun with several processes it also makes the
/// world's communicator (o.mpi), and the ranks but 0 print and write nothing.
std::optional<int> parse_options(int argc, char** argv, Options& o);

/// The communicator options of every rank strata-bench starts (thread ranks or mpirun processes).
dispatch::CommOptions comm_options(const Options& o);

/// The store config of `mode` at `cache_fraction` (cached and hybrid tables), validated.
Result<StoreConfig> make_config(const Options& o, const ModeDescriptor& mode, double cache_fraction);

}  // namespace strata::bench
