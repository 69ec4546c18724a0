// strata-bench: runs the same sequence of batches through each placement mode and reports
// throughput, latency percentiles and the gather's bandwidth next to the machine's sequential read
// bandwidth measured in the same run, the bytes each mode moves per step over every link (device
// layer counters), the cache hit rate, peak host and device memory, and a modelled step time on a
// hardware profile. `--sweep-cache` reruns the cached mode at several cache sizes. The built-in
// workload is shaped like the 26 Criteo Kaggle features (docs/bench.md, "Default workload").
//
// Modes are rows of kModes below. `gpu` and `hybrid` (and a --config of gpu and hybrid tables) with
// --ranks N > 1 run N thread ranks (one store and one emulated device each, the local communicator
// between them); each rank trains on its own batches, so a step moves N batches and the report adds
// the all-to-all traffic (with and without dedup) and the time spent in dispatch against the time
// in the shards' lookups.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "dispatch/local_communicator.hpp"
#include "dispatch/mpi_communicator.hpp"

#include "bench/batch_source.hpp"
#include "bench/bounded_input.hpp"
#include "bench/cli_flags.hpp"
#include "bench/criteo_tsv.hpp"
#include "bench/gather_probe.hpp"
#include "bench/machine_info.hpp"
#include "bench/report_html.hpp"
#include "bench/workload.hpp"
#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "store/io/file_io.hpp"
#include "store/model/cost_model.hpp"
#include "store/store.hpp"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

/// Timed steps a 99th percentile needs before it is shown as one: with fewer, the step at p99 is
/// the slowest or next to it, so the console and the HTML show (and name) the maximum instead.
constexpr std::size_t kStepsForP99 = 100;

/// Whether a device name from the results ("emu", "cuda <name>", "none") is the emulated device.
bool emulated(const json& device) { return device.is_string() && device.get<std::string>() == "emu"; }

// ---- modes ----

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

constexpr ModeDescriptor kModes[] = {
    {"cpu", "host rows, CPU kernels", Placement::kCpu, OffloadGather::kDevice, false},
    {"offload", "pinned host rows read by the device zero-copy; CPU optimizer", Placement::kOffload,
     OffloadGather::kDevice, true},
    {"offload-cpu", "pinned host rows pooled by CPU threads; pooled outputs go H2D to a device trainer",
     Placement::kOffload, OffloadGather::kCpu, true},
    {"cached", "pinned host rows + HBM row cache fed by the prefetcher", Placement::kCached, OffloadGather::kDevice,
     true},
    {"gpu", "every row in HBM; sharded over the ranks' devices (--ranks, --sharding)", Placement::kGpu,
     OffloadGather::kDevice, true},
    {"hybrid", "each rank's shard in its host memory + its own HBM cache; all-to-all between ranks", Placement::kHybrid,
     OffloadGather::kDevice, true},
};

// The thread-rank modes (gpu and hybrid; --config runs one store as given).
bool sharded(const ModeDescriptor& m) {
  return !m.from_config && (m.placement == Placement::kGpu || m.placement == Placement::kHybrid);
}
// The modes --ranks N runs on N thread ranks: gpu and hybrid, and --config's store config (every
// table of it gpu or hybrid, as strata-tune plan --ranks N writes them; Store::open says so).
bool runs_on_ranks(const ModeDescriptor& m) { return sharded(m) || m.from_config; }
bool caches(const ModeDescriptor& m) { return m.placement == Placement::kCached || m.placement == Placement::kHybrid; }

std::string mode_names(const char* sep) {
  std::string s;
  for (const auto& m : kModes) s += (s.empty() ? "" : sep) + std::string(m.name);
  return s;
}

Result<const ModeDescriptor*> find_mode(const std::string& name) {
  for (const auto& m : kModes)
    if (name == m.name) return &m;
  return Status::invalid_argument("unknown mode '" + name + "' (expected one of " + mode_names(", ") + ")");
}

// ---- progress ----

// A one-line progress bar on stderr (hidden with --no-progress).
class Progress {
 public:
  Progress(std::string label, int total, bool enabled) : label_(std::move(label)), total_(total), enabled_(enabled) {}
  void tick(int done) {
    if (!enabled_) return;
    const int width = 30;
    const int filled = total_ ? done * width / total_ : width;
    std::fprintf(stderr, "\r  %-34s [%s%s] %d/%d", label_.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total_);
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int total_;
  bool enabled_;
};

// ---- options ----

/// Most batches prefetched ahead of forward (--pipeline).
constexpr int kMaxPipeline = 1024;
/// Default --comm-timeout: a collective that waits this long for a rank fails the run. Two
/// minutes: far beyond a slow first step (store opening, first cache fill) on a busy machine,
/// short enough that a stopped or crashed rank ends the job soon.
constexpr double kDefaultCommTimeoutS = 120;
/// Largest --comm-timeout (a day).
constexpr double kMaxCommTimeoutS = 86400;

// Where the trainer's dense model lives (--trainer): its activations and gradients are there.
enum class Trainer { kDevice, kHost };

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
  int steps = 20;
  int warmup = 3;
  int threads = 2;
  int read_probe_mib = 1024;
  bool gather_probe = true;                      ///< measure the gather limit (--no-gather-probe skips it)
  double comm_timeout_s = kDefaultCommTimeoutS;  ///< collectives of the sharded modes (--comm-timeout)
  std::string json_out;
  std::string html_out;
  std::string profile = "h200-pcie5";
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
  bool progress = ::isatty(STDERR_FILENO) != 0;  // progress only on a terminal (--no-progress hides it there too)
  std::vector<std::string> argv;
};

// The built-in workload: Criteo Kaggle-shaped tables (set by table_set = "criteo"), one common
// dim, one-hot bags as in the data set, Zipf keys (docs/bench.md, "Default workload").
WorkloadSpec default_workload() {
  WorkloadSpec w;
  w.dim = 64;
  w.batch = 8192;
  w.bag_size = 1;
  w.dist = "zipf:0.9";
  return w;
}

// ---- store configuration ----

// The communicator options of every rank strata-bench starts (thread ranks or mpirun processes).
dispatch::CommOptions comm_options(const Options& o) {
  dispatch::CommOptions co;
  co.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(o.comm_timeout_s * 1000)));
  return co;
}

const char* trainer_name(Trainer t) { return t == Trainer::kDevice ? "device" : "host"; }

Result<StoreConfig> make_config(const Options& o, const ModeDescriptor& mode, double cache_fraction) {
  if (mode.from_config) {
    // As given; only --backend and --device-capacity, when given, choose the device.
    StoreConfig c = o.config;
    if (o.backend_given) {
      STRATA_ASSIGN_OR_RETURN(c.device.backend, parse_backend(o.backend));
    }
    if (o.capacity_given) c.device.capacity = o.device_capacity;
    STRATA_RETURN_IF_ERROR(validate(c));
    return c;
  }
  StoreConfig c;
  c.threads = o.threads;
  STRATA_ASSIGN_OR_RETURN(c.device.backend, parse_backend(o.backend));
  c.device.capacity = o.device_capacity;
  // The emulated device's default 1 GiB is a test size; emulate a GPU-sized memory (host RAM is
  // only used as far as it is allocated). Real GPUs keep all of their free memory.
  const Result<int> gpus = gpu::cuda_devices();  // an error: the store refuses `auto` (run() stopped earlier)
  const bool emu = c.device.backend == BackendChoice::kEmu ||
                   (c.device.backend == BackendChoice::kAuto && gpus.is_ok() && gpus.value() == 0);
  if (c.device.capacity == 0 && emu) c.device.capacity = std::int64_t{4} << 30;
  c.offload_gather = mode.offload_gather;
  STRATA_ASSIGN_OR_RETURN(c.cache.policy, cache::parse_policy(o.policy));
  c.cache.lookahead = o.lookahead;
  c.cache.max_in_flight = std::max(8, o.lookahead + o.pipeline + 1);
  c.cache.preview = o.preview;
  c.cache.planner_partitions = o.planner_partitions;
  STRATA_ASSIGN_OR_RETURN(Pooling pooling, parse_pooling(o.pooling_mode));
  STRATA_ASSIGN_OR_RETURN(OptimizerKind optimizer, parse_optimizer(o.optimizer));
  for (const TableShape& shape : workload_tables(o.workload)) {
    TableConfig tc;
    tc.spec.name = shape.name;
    tc.spec.rows = shape.rows;
    tc.spec.dim = shape.dim;
    tc.spec.pooling = pooling;
    tc.spec.optimizer.kind = optimizer;
    tc.spec.optimizer.learning_rate = 0.01f;
    tc.spec.init.seed = o.workload.seed;
    tc.placement = mode.placement;
    if (caches(mode)) tc.cache.fraction = cache_fraction;
    if (sharded(mode)) {
      STRATA_ASSIGN_OR_RETURN(tc.sharding.type, dispatch::parse_sharding(o.sharding));
    }
    c.tables.push_back(tc);
  }
  STRATA_RETURN_IF_ERROR(validate(c));
  return c;
}

// Bytes of one table record (weights and optimizer state) on the host.
double record_bytes(const TableSpec& s) {
  return 4.0 * static_cast<double>(s.dim + optimizer_state_dim(s.optimizer.kind, s.dim));
}

// Host bytes of the store's tables: rows x (dim + optimizer state) x 4 (every mode keeps them).
double host_table_bytes(const StoreConfig& c) {
  double b = 0;
  for (const auto& t : c.tables) b += static_cast<double>(t.spec.rows) * record_bytes(t.spec);
  return b;
}

// Slot pools of a cached config: rows and bytes per (dim, state) shape, as the store sizes them.
struct PoolSize {
  int dim = 0;
  std::int32_t state = 0;
  std::int64_t rows = 0;
  double bytes = 0;
  std::vector<std::size_t> tables;  // indices into config.tables
};
std::vector<PoolSize> slot_pools(const StoreConfig& c) {
  std::vector<PoolSize> pools;
  for (std::size_t i = 0; i < c.tables.size(); ++i) {
    const TableConfig& t = c.tables[i];
    if (t.placement != Placement::kCached && t.placement != Placement::kHybrid) continue;
    const std::int32_t state = optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim);
    auto it = std::find_if(pools.begin(), pools.end(),
                           [&](const PoolSize& p) { return p.dim == t.spec.dim && p.state == state; });
    if (it == pools.end()) it = pools.insert(pools.end(), PoolSize{t.spec.dim, state, 0, 0, {}});
    it->rows += cache_rows(t);
    it->bytes += static_cast<double>(cache_rows(t)) * record_bytes(t.spec);
    it->tables.push_back(i);
  }
  return pools;
}

// ---- the gather limit (bench/gather_probe.hpp) ----

/// Largest gather-probe table: a workload's tables of one dim beyond this are folded into it (row
/// indices taken modulo its rows). 2 GiB is far beyond any last-level cache, and filling it takes
/// about half a second on two cores.
constexpr std::int64_t kMaxGatherProbeBytes = std::int64_t{2} << 30;
/// Timed passes of the gather probe per prefetch distance, one batch each (the first ones of the
/// run, distinct); odd, so that the median is one pass.
constexpr int kGatherProbePasses = 9;

/// The gather probe's table for one dim: the workload's tables of that dim end to end (the store
/// keeps each in its own arena), records as wide as the store's (record_stride).
struct GatherProbePlan {
  std::int32_t dim = 0;
  std::int32_t record_floats = 0;            // row and optimizer state: what an update reads and writes
  std::int64_t stride = 0;                   // floats per record
  std::int64_t rows = 0;                     // rows of the probe table
  std::map<std::string, std::int64_t> base;  // first probe row of each table of this dim
  bool folded = false;                       // more rows than kMaxGatherProbeBytes holds: indices wrap
};

std::vector<GatherProbePlan> gather_probe_plans(const Options& o) {
  const auto kind = parse_optimizer(o.optimizer);
  std::vector<GatherProbePlan> plans;
  for (const TableShape& t : workload_tables(o.workload)) {
    auto it = std::find_if(plans.begin(), plans.end(), [&](const GatherProbePlan& p) { return p.dim == t.dim; });
    if (it == plans.end()) {
      GatherProbePlan p;
      p.dim = t.dim;
      const std::int32_t state = kind ? optimizer_state_dim(kind.value(), t.dim) : 0;
      p.record_floats = t.dim + state;
      p.stride = record_stride(t.dim, state);
      it = plans.insert(plans.end(), p);
    }
    it->base[t.name] = it->rows;
    it->rows += t.rows;
  }
  for (GatherProbePlan& p : plans) {
    const std::int64_t most = std::max<std::int64_t>(1, kMaxGatherProbeBytes / (p.stride * 4));
    if (p.rows > most) {
      p.rows = most;
      p.folded = true;
    }
  }
  return plans;
}

/// One measured gather limit: for the workload's own keys, or (for a skewed workload) for uniform
/// random rows with the same bags.
struct GatherLimit {
  GatherProbeResult probe;
  std::string keys;  // "workload" or "uniform"
  bool folded = false;
};

// The bags of `batch` over the tables of `plan`'s dim, as rows of the probe table.
GatherProbeBatch probe_rows(const GatherProbePlan& plan, const KeyBatch& batch) {
  GatherProbeBatch pb;
  pb.offsets.push_back(0);
  for (const JaggedKeys& f : batch.features) {
    const auto base = plan.base.find(f.table);
    if (base == plan.base.end()) continue;
    for (std::size_t i = 1; i < f.offsets.size(); ++i)
      pb.offsets.push_back(static_cast<std::int64_t>(pb.rows.size()) + f.offsets[i]);
    for (const Key k : f.keys) pb.rows.push_back(plan.folded ? (base->second + k) % plan.rows : base->second + k);
  }
  return pb;
}

// Runs the gather probe for every dim of the workload on the first batches of the run.
Result<std::vector<GatherLimit>> measure_gather_limits(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads) {
  std::vector<GatherLimit> limits;
  const bool uniform = o.workload.dist == "uniform" && o.trace_file.empty() && o.criteo_file.empty();
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    std::vector<GatherProbeBatch> own, rnd;
    STRATA_ASSIGN_OR_RETURN(KeySampler sampler, KeySampler::create("uniform", plan.rows, o.workload.seed ^ 0x5eedull));
    const std::size_t n = std::min<std::size_t>(batches.size(), kGatherProbePasses);
    for (std::size_t b = 0; b < n; ++b) {
      GatherProbeBatch pb = probe_rows(plan, batches[b]);
      if (!uniform) {
        GatherProbeBatch u{pb.offsets, std::vector<std::int64_t>(pb.rows.size())};
        sampler.fill(u.rows.data(), static_cast<std::int64_t>(u.rows.size()));
        rnd.push_back(std::move(u));
      }
      own.push_back(std::move(pb));
    }
    const GatherProbeSpec spec{plan.dim, plan.stride, plan.rows, threads};
    STRATA_ASSIGN_OR_RETURN(GatherProbeResult r, measure_gather_limit(spec, own, kGatherProbePasses));
    limits.push_back({r, "workload", plan.folded});
    if (!uniform) {
      STRATA_ASSIGN_OR_RETURN(GatherProbeResult u, measure_gather_limit(spec, rnd, kGatherProbePasses));
      limits.push_back({u, "uniform", plan.folded});
    }
  }
  return limits;
}

/// One measured update floor: the records of a dim's tables updated per second when each distinct
/// row of a batch is read and written once, and how many distinct rows a batch has (the mean over
/// the probe's batches).
struct UpdateFloor {
  UpdateProbeResult probe;
  std::int32_t dim = 0;
  double distinct_rows_per_batch = 0;
};

// Runs the update probe for every dim of the workload on the distinct rows of the run's first
// batches, in the order of their first use (the order the backward visits them).
Result<std::vector<UpdateFloor>> measure_update_floors(const Options& o, const std::vector<KeyBatch>& batches,
                                                       int threads) {
  std::vector<UpdateFloor> floors;
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    std::vector<std::vector<std::int64_t>> passes;
    double distinct = 0;
    const std::size_t n = std::min<std::size_t>(batches.size(), kGatherProbePasses);
    for (std::size_t b = 0; b < n; ++b) {
      const GatherProbeBatch pb = probe_rows(plan, batches[b]);
      std::unordered_set<std::int64_t> seen(pb.rows.size());
      std::vector<std::int64_t> rows;
      for (const std::int64_t r : pb.rows)
        if (seen.insert(r).second) rows.push_back(r);
      distinct += static_cast<double>(rows.size());
      if (!rows.empty()) passes.push_back(std::move(rows));
    }
    if (passes.empty()) continue;
    const UpdateProbeSpec spec{plan.record_floats, plan.stride, plan.rows, threads};
    STRATA_ASSIGN_OR_RETURN(UpdateProbeResult r, measure_update_limit(spec, passes, kGatherProbePasses));
    floors.push_back({r, plan.dim, distinct / static_cast<double>(n)});
  }
  return floors;
}

json update_floors_json(const std::vector<UpdateFloor>& floors) {
  json a = json::array();
  for (const UpdateFloor& u : floors)
    a.push_back({{"dim", u.dim},
                 {"record_bytes", u.probe.record_bytes},
                 {"table_rows", u.probe.table_rows},
                 {"table_bytes", u.probe.table_bytes},
                 {"threads", u.probe.threads},
                 {"passes", u.probe.repetitions},
                 {"statistic", "median"},
                 {"prefetch_distance", u.probe.prefetch_distance},
                 {"distinct_rows_per_batch", u.distinct_rows_per_batch},
                 {"rows_per_s", u.probe.rows_per_s},
                 {"gb_per_s", u.probe.gb_per_s},
                 {"best_rows_per_s", u.probe.best_rows_per_s}});
  return a;
}

// The forward rate, in lookups/s, of a step that reads each key's row at the probe's rate for its
// dim: keys / sum over dims of (keys of that dim / limit of that dim), on the first batch (every
// batch has the same shape). 0 when a dim has no limit of kind `keys`.
double step_gather_limit(const Options& o, const std::vector<GatherLimit>& limits, const KeyBatch& batch,
                         const std::string& keys) {
  std::map<std::string, int> dim_of;
  for (const TableShape& t : workload_tables(o.workload)) dim_of[t.name] = t.dim;
  double total = 0, seconds = 0;
  for (const JaggedKeys& f : batch.features) {
    const int dim = dim_of[f.table];
    const auto l = std::find_if(limits.begin(), limits.end(),
                                [&](const GatherLimit& g) { return g.probe.dim == dim && g.keys == keys; });
    if (l == limits.end() || l->probe.lookups_per_s <= 0) return 0;
    total += static_cast<double>(f.keys.size());
    seconds += static_cast<double>(f.keys.size()) / l->probe.lookups_per_s;
  }
  return seconds > 0 ? total / seconds : 0;
}

// The floor of a training step in seconds: every key's row gathered at its dim's gather limit
// (keys "workload", on the first batch) plus every distinct row of a batch updated once at its
// dim's update floor. 0 when a dim has no measurement.
double step_floor_s(const Options& o, const std::vector<GatherLimit>& limits, const std::vector<UpdateFloor>& floors,
                    const KeyBatch& batch) {
  const double lookups = static_cast<double>(batch.total_keys());
  const double gather = step_gather_limit(o, limits, batch, "workload");
  if (gather <= 0 || floors.empty()) return 0;
  double seconds = lookups / gather;
  for (const GatherProbePlan& plan : gather_probe_plans(o)) {
    const auto f = std::find_if(floors.begin(), floors.end(), [&](const UpdateFloor& u) { return u.dim == plan.dim; });
    if (f == floors.end() || f->probe.rows_per_s <= 0) return 0;
    seconds += f->distinct_rows_per_batch / f->probe.rows_per_s;
  }
  return seconds;
}

json gather_limits_json(const std::vector<GatherLimit>& limits) {
  json a = json::array();
  for (const GatherLimit& g : limits)
    a.push_back({{"dim", g.probe.dim},
                 {"row_bytes", g.probe.row_bytes},
                 {"keys", g.keys},
                 {"table_rows", g.probe.table_rows},
                 {"table_bytes", g.probe.table_bytes},
                 {"folded", g.folded},
                 {"threads", g.probe.threads},
                 {"passes", g.probe.repetitions},
                 {"statistic", "median"},
                 {"prefetch_distance", g.probe.prefetch_distance},
                 {"lookups_per_s", g.probe.lookups_per_s},
                 {"gb_per_s", g.probe.gb_per_s},
                 {"best_lookups_per_s", g.probe.best_lookups_per_s}});
  return a;
}

// ---- memory estimate (before anything large is allocated) ----

// Calibrated against measured peak RSS on the default workload (it overestimates a little):
// host(mode) = tables + pinned staging + (emu: device) + output/gradient buffers, and the batches
// and the read probe beside.
struct MemoryEstimate {
  double tables = 0;       // host tables (all modes)
  double device = 0;       // device allocation of the worst mode (emu: host memory too)
  double batches = 0;      // generated batches plus the store's copies of the batches in flight
  double buffers = 0;      // output and gradient buffers
  double probe = 0;        // the larger of the read-bandwidth and gather probes (freed before the modes run)
  double total = 0;        // peak estimate
  std::string worst_mode;  // the mode with the largest estimate
};

MemoryEstimate estimate_memory(const Options& o, const std::vector<const ModeDescriptor*>& modes,
                               const std::vector<double>& sweep, bool emu) {
  MemoryEstimate e;
  const auto shapes = workload_tables(o.workload);
  const double keys_per_bag = o.workload.bag_dist == "uniform" ? 2.0 * o.workload.bag_size : o.workload.bag_size;
  const double keys = max_batch_keys(o.workload);
  double out_floats = 0;
  for (const auto& t : shapes)
    out_floats += static_cast<double>(o.workload.batch) * (o.pooling_mode == "none" ? keys_per_bag : 1.0) * t.dim;
  // Keys and offsets (8 bytes each) of every distinct batch, plus the store's validated and
  // deduplicated copies of the batches in flight (about three more copies of each).
  const double in_flight = std::max(8, o.lookahead + o.pipeline + 1);
  e.batches = max_batch_bytes(o.workload) * (o.workload.distinct_batches + 3.0 * in_flight);
  // One step's outputs and gradients. The loop keeps them in host memory; with the trainer on the
  // device also in device buffers (emu: host memory) and, in cpu mode, in the pinned buffers the
  // trainer's copies go through.
  const bool device_trainer = o.trainer == Trainer::kDevice;
  const double activations = out_floats * 4.0 * 2.0;
  e.buffers = activations * (device_trainer ? 3.0 : 1.0);
  e.probe = static_cast<double>(o.read_probe_mib) * 1024.0 * 1024.0;
  if (o.gather_probe)
    for (const GatherProbePlan& p : gather_probe_plans(o))
      e.probe = std::max(e.probe, static_cast<double>(p.rows) * static_cast<double>(p.stride) * 4.0);
  double worst = 0;
  std::vector<const ModeDescriptor*> runs = modes;  // the sweep runs the cached mode too
  if (!sweep.empty()) runs.push_back(find_mode("cached").value());
  for (const ModeDescriptor* m : runs) {
    std::vector<double> fractions = {o.cache_fraction};
    if (m->placement == Placement::kCached && !sweep.empty())
      fractions.push_back(*std::max_element(sweep.begin(), sweep.end()));
    for (const double f : fractions) {
      auto c = make_config(o, *m, f);
      if (!c) continue;
      // Host tables as the store maps them (store/cost_model.hpp): padded records, tables of 1 MiB
      // and more in arenas of their own rounded up to 2 MiB, smaller ones packed into shared 2 MiB
      // arenas, and the CPU optimizer's scratch of cpu/offload tables; per rank (thread ranks each
      // open a store in this process; under mpirun this process is one rank). Counting rows x
      // record alone missed 2 MiB of arena and 1 MB of scratch per small table: 1,000 one-row
      // tables reached 3.09 GB of RSS while the estimate said 1.7 MB.
      double tables = 0;
      const int world = o.mpi ? o.mpi->size() : runs_on_ranks(*m) && o.ranks > 1 ? o.ranks : 0;
      const int first = o.mpi ? o.mpi->rank() : 0;
      const int last = o.mpi ? first + 1 : std::max(1, world);
      for (int r = first; r < last; ++r) {
        auto mem = host_table_memory(c.value(), 0, world, r);
        if (!mem) break;  // the run reports the sharding error
        tables += mem->mapped_bytes + mem->scratch_bytes;
      }
      double device = 0, staging = 0;
      if (m->uses_device) {
        double record = 0;  // the widest record of a cached table
        double row = 0;     // the widest row of an offload table (its device gather reads rows)
        // Device rows are padded like host records (record_stride: a multiple of 16 floats, or a
        // power of two below 16).
        const auto padded = [](double floats) {
          double stride = 1;
          while (stride < floats) stride *= 2;
          return floats >= 16 ? std::ceil(floats / 16.0) * 16.0 : stride;
        };
        for (const auto& p : slot_pools(c.value())) {
          device += static_cast<double>(p.rows) * padded(p.dim + p.state) * 4.0;
          record = std::max(record, 4.0 * (p.dim + p.state));
        }
        for (const auto& t : c.value().tables) {
          if (t.placement == Placement::kGpu)
            device += static_cast<double>(t.spec.rows) *
                      padded(t.spec.dim + optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim)) * 4.0;
          if (t.placement == Placement::kOffload && c.value().offload_gather == OffloadGather::kDevice)
            row = std::max(row, 4.0 * t.spec.dim);
        }
        // Keys and slots of the batches in flight, and the store's activation staging (grown to
        // twice a step's): with host views the outputs and gradients on both sides of the copies;
        // with device views none, but offload's pinned gradients for its CPU optimizer.
        // offload-cpu uploads no keys and pools a host trainer's outputs in place.
        const bool offload = m->placement == Placement::kOffload;
        const bool cpu_pools = offload && m->offload_gather == OffloadGather::kCpu;
        if (!cpu_pools) device += in_flight * keys * 8.0 * 2.0;
        if (!device_trainer && !cpu_pools) device += 2.0 * activations;
        staging = device_trainer ? (offload ? activations : 0.0) : 2.0 * activations;
        // offload's device gather reads a batch's distinct rows (at worst every key) into device
        // memory, for each of the batches the loop keeps in flight.
        device += (o.lookahead + o.pipeline + 1) * keys * row;
        // Staging of (cached) the missing rows of the batches in flight, at worst every key a
        // miss: pinned, and again on the device where the fills land before they are unpacked.
        staging += in_flight * keys * record;
        device += in_flight * keys * record;
      }
      const double host = tables + staging + (emu ? device : 0.0);
      if (host > worst) {
        worst = host;
        e.tables = tables;
        // The device also holds the trainer's outputs and gradients (in e.buffers for the host).
        e.device = device + (device_trainer ? activations : 0.0);
        e.worst_mode = m->name;
      }
    }
  }
  e.total = std::max(worst + e.buffers, e.probe) + e.batches;
  return e;
}

// ---- one mode ----

struct ModeResult {
  const ModeDescriptor* mode = nullptr;
  int ranks = 1;                  ///< thread ranks (sharded modes); counters and step bytes are rank 0's
  double duplication_factor = 1;  ///< keys / unique keys (per table and batch) of rank 0's timed training batches
  double cache_fraction = 0;
  std::vector<double> forward_s, train_s;
  std::vector<double> submit_s, lookup_s, backward_s;  // phases of the training step
  double keys_per_step = 0, samples_per_step = 0, bytes_per_lookup = 0;
  // Sums over rank 0's timed training batches (drive), and their count.
  double timed_keys = 0, timed_samples = 0, timed_key_bytes = 0;
  double timed_host_gather_bytes = 0, timed_host_optimizer_bytes = 0;  // rows read by CPU kernels
  int timed_batches = 0;
  double host_gather_bytes_per_step = 0, host_optimizer_bytes_per_step = 0;
  double setup_s = 0;
  StoreStats train_stats;           // counters over the timed training steps only
  std::string trainer_device;       // --trainer device: the trainer's device ("" with --trainer host)
  bool trainer_device_own = false;  // opened by the bench (the store has no device: cpu mode)
  std::string device;
  std::size_t device_peak_bytes = 0;
  std::uint64_t rss_start_bytes = 0;  // process RSS when the mode started
  std::uint64_t peak_rss_bytes = 0;   // process peak RSS while the mode ran
  bool peak_rss_per_mode = false;     // whether the peak was reset at the start of the mode
  double host_table_bytes = 0;
  std::int64_t cache_rows = 0;
  double cache_bytes = 0;
};

StoreStats stats_delta(const StoreStats& after, const StoreStats& before) {
  StoreStats d = after;
  d.links = after.links - before.links;
  for (std::size_t i = 0; i < d.cache.size() && i < before.cache.size(); ++i)
    d.cache[i].second -= before.cache[i].second;
  DispatchStats& x = d.dispatch;
  const DispatchStats& y = before.dispatch;
  x.batches -= y.batches;
  x.key_bytes -= y.key_bytes;
  x.row_bytes -= y.row_bytes;
  x.grad_bytes -= y.grad_bytes;
  x.bytes_no_dedup -= y.bytes_no_dedup;
  x.exchange_seconds -= y.exchange_seconds;
  x.lookup_seconds -= y.lookup_seconds;
  x.local_seconds -= y.local_seconds;
  return d;
}

// The batches of one rank's run in order (run index i is batch i * ranks + rank of the source),
// read from a cursor as the steps ask for them and dropped once used: at most the batches in
// flight and previewed are held.
class BatchWindow {
 public:
  explicit BatchWindow(std::unique_ptr<BatchCursor> cursor) : cursor_(std::move(cursor)) {}
  // Run batch i (i >= the last drop_before); valid until drop_before passes it.
  Result<const KeyBatch*> at(std::int64_t i) {
    while (base_ + static_cast<std::int64_t>(held_.size()) <= i) {
      STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor_->next());
      held_.push_back(std::move(b));
    }
    return &held_[static_cast<std::size_t>(i - base_)];
  }
  // Forgets the batches before run index i.
  void drop_before(std::int64_t i) {
    for (; base_ < i && !held_.empty(); ++base_) held_.pop_front();
    base_ = std::max(base_, i);
  }

 private:
  std::unique_ptr<BatchCursor> cursor_;
  std::deque<KeyBatch> held_;
  std::int64_t base_ = 0;
};

// The device of a `--trainer device` run whose store has none (`cpu` mode): the trainer's GPU,
// opened by the bench as --backend chooses (cuda when one is visible, else emu). The pooled outputs
// go to it H2D and the gradients come back D2H every step, as they do for a trainer whose dense
// model is on a GPU while its tables are in host memory; the copies are real and counted by this
// device's counters, which the bench adds to the store's (there are none in a cpu-only store).
Result<std::unique_ptr<gpu::Device>> open_trainer_device(const StoreConfig& c) {
  const Result<int> gpus = gpu::cuda_devices();
  const bool cuda = c.device.backend == BackendChoice::kCuda ||
                    (c.device.backend == BackendChoice::kAuto && gpus.is_ok() && gpus.value() > 0);
  if (cuda) return gpu::make_cuda_device(0);
  return gpu::make_emu_device();
}

// Rows of each feature's output (forward) and gradient (backward), shaped for each batch: batches
// of a trace need not have one shape. With the trainer on the device they are device buffers:
// the store's device (Store::device()) when it has one, else the trainer's own (open_trainer_device),
// and the calls are stream-ordered on the trainer's stream.
class StepBuffers {
 public:
  StepBuffers(Store& store, int rank, Trainer trainer) : store_(store), rng_(7 + static_cast<unsigned>(rank)) {
    if (trainer == Trainer::kDevice) dev_ = store.device();
    trainer_ = trainer;
  }
  // Opens the trainer's device where the store has none; creates the trainer's stream.
  Status init() {
    if (trainer_ != Trainer::kDevice) return Status::ok();
    if (dev_ == nullptr) {
      STRATA_ASSIGN_OR_RETURN(own_, open_trainer_device(store_.config()));
      dev_ = own_.get();
    }
    STRATA_ASSIGN_OR_RETURN(stream_, dev_->create_stream());
    return Status::ok();
  }
  Status shape(const KeyBatch& batch) {
    out_views.clear();
    grad_views.clear();
    dev_out_views.clear();
    dev_grad_views.clear();
    out_.resize(batch.features.size());
    grad_.resize(batch.features.size());
    if (dev_) {
      dout_.resize(batch.features.size());
      dgrad_.resize(batch.features.size());
      pout_.resize(batch.features.size());
      pgrad_.resize(batch.features.size());
    }
    for (std::size_t i = 0; i < batch.features.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(const int t, store_.table_index(batch.features[i].table));
      const TableSpec& spec = store_.config().tables[static_cast<std::size_t>(t)].spec;
      const std::int64_t rows = output_rows(batch.features[i], spec.pooling);
      const auto size = static_cast<std::size_t>(rows * spec.dim);
      if (out_[i].size() < size) {
        out_[i].resize(size);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const std::size_t old = grad_[i].size();
        grad_[i].resize(size);
        for (std::size_t k = old; k < size; ++k) grad_[i][k] = u(rng_);
      }
      if (dev_ && dout_[i].bytes() < size * sizeof(float)) {
        // The dense model's gradients: the same values as a host trainer's, written once (the
        // bench's own copy, not store traffic: setup_bytes says how much, drive subtracts it).
        STRATA_ASSIGN_OR_RETURN(dout_[i], dev_->allocate(grad_[i].size() * sizeof(float)));
        STRATA_ASSIGN_OR_RETURN(dgrad_[i], dev_->allocate(grad_[i].size() * sizeof(float)));
        STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer init, dev_->allocate_pinned(grad_[i].size() * sizeof(float)));
        std::memcpy(init.data(), grad_[i].data(), grad_[i].size() * sizeof(float));
        dev_->copy_h2d(stream_.view(), dgrad_[i].data(), init.data(), grad_[i].size() * sizeof(float));
        STRATA_RETURN_IF_ERROR(dev_->synchronize(stream_.view()));
        setup_bytes += grad_[i].size() * sizeof(float);
      }
      float* out = out_[i].data();
      float* grad = grad_[i].data();
      if (own_) {
        // The trainer's copies go through pinned memory, as a trainer's would (and strict emu requires).
        if (pout_[i].bytes() < size * sizeof(float)) {
          STRATA_ASSIGN_OR_RETURN(pout_[i], own_->allocate_pinned(grad_[i].size() * sizeof(float)));
          STRATA_ASSIGN_OR_RETURN(pgrad_[i], own_->allocate_pinned(grad_[i].size() * sizeof(float)));
        }
        out = pout_[i].as<float>();
        grad = pgrad_[i].as<float>();
      }
      out_views.push_back({out, rows, spec.dim});
      grad_views.push_back({grad, rows, spec.dim});
      if (dev_) {
        dev_out_views.push_back({dout_[i].as<float>(), rows, spec.dim, MemorySpace::kDevice});
        dev_grad_views.push_back({dgrad_[i].as<float>(), rows, spec.dim, MemorySpace::kDevice});
      }
    }
    return Status::ok();
  }
  // Forward into the trainer's buffers: host views (--trainer host); device views, stream-ordered
  // (the store's device); or host views, then the outputs H2D on the trainer's device (cpu mode).
  Status forward(std::int64_t id) {
    if (!dev_) return store_.forward(id, out_views);
    if (!own_) return store_.forward(id, dev_out_views, stream_.view());
    STRATA_RETURN_IF_ERROR(store_.forward(id, out_views));
    for (std::size_t i = 0; i < out_views.size(); ++i)
      if (const std::size_t b = view_bytes(out_views[i]))
        dev_->copy_h2d(stream_.view(), dout_[i].data(), out_views[i].data, b);
    return dev_->synchronize(stream_.view());
  }
  // Backward from the trainer's gradients (as forward; cpu mode: D2H first), and the trainer's
  // stream drained, so that a step's time holds all of its work.
  Status backward(std::int64_t id) {
    if (!dev_) return store_.backward(id, grad_views);
    if (!own_) {
      STRATA_RETURN_IF_ERROR(store_.backward(id, dev_grad_views, stream_.view()));
      return dev_->synchronize(stream_.view());
    }
    for (std::size_t i = 0; i < grad_views.size(); ++i)
      if (const std::size_t b = view_bytes(grad_views[i]))
        dev_->copy_d2h(stream_.view(), const_cast<float*>(grad_views[i].data), dgrad_[i].data(), b);
    STRATA_RETURN_IF_ERROR(dev_->synchronize(stream_.view()));
    return store_.backward(id, grad_views);
  }
  // The trainer's device when the bench opened it (its counters hold the trainer's copies), else null.
  gpu::Device* own_device() const noexcept { return own_.get(); }
  // The trainer's device (null: --trainer host).
  const gpu::Device* device() const noexcept { return dev_; }
  std::vector<MatrixView> out_views, dev_out_views;
  std::vector<ConstMatrixView> grad_views, dev_grad_views;
  std::uint64_t setup_bytes = 0;  // H2D bytes of the gradients' first upload (not store traffic)

 private:
  template <class View>
  static std::size_t view_bytes(const View& v) {
    return static_cast<std::size_t>(v.rows * v.cols) * sizeof(float);
  }
  Store& store_;
  Trainer trainer_ = Trainer::kHost;
  gpu::Device* dev_ = nullptr;
  std::unique_ptr<gpu::Device> own_;
  gpu::Stream stream_;
  std::mt19937 rng_;
  std::vector<std::vector<float>> out_, grad_;
  std::vector<gpu::DeviceBuffer> dout_, dgrad_;
  std::vector<gpu::PinnedBuffer> pout_, pgrad_;  // cpu mode: the host side of the trainer's copies
};

// Adds one timed training batch to r's sums: keys, samples, the bytes of their rows, and the host
// bytes of the CPU kernels, which no device counts: the rows the CPU gather reads (cpu tables,
// offload tables pooled on the CPU; every key's row) and the records the CPU optimizer reads and
// writes (cpu and offload tables; each distinct row of the batch once, as host/repeats.hpp sums
// its gradients).
Status count_timed_batch(const Store& store, const KeyBatch& b, ModeResult& r) {
  const StoreConfig& c = store.config();
  r.timed_keys += static_cast<double>(b.total_keys());
  r.timed_samples += static_cast<double>(b.batch_size());
  std::vector<Key> sorted;
  for (const JaggedKeys& f : b.features) {
    STRATA_ASSIGN_OR_RETURN(const int t, store.table_index(f.table));
    const TableConfig& tc = c.tables[static_cast<std::size_t>(t)];
    const double bytes = static_cast<double>(f.num_keys()) * tc.spec.dim * 4.0;
    r.timed_key_bytes += bytes;
    const bool cpu = tc.placement == Placement::kCpu, offload = tc.placement == Placement::kOffload;
    if (cpu || (offload && c.offload_gather == OffloadGather::kCpu)) r.timed_host_gather_bytes += bytes;
    if (cpu || offload) {
      sorted.assign(f.keys.begin(), f.keys.end());
      std::sort(sorted.begin(), sorted.end());
      const auto distinct = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
      r.timed_host_optimizer_bytes += static_cast<double>(distinct) * record_bytes(tc.spec);
    }
  }
  ++r.timed_batches;
  return Status::ok();
}

// Runs the forward phase and the training phase of one rank's store. Rank r of `ranks` uses every
// ranks-th batch starting at r, so the ranks train on different batches of the same sequence.
// With `r` (rank 0) it records step times, the counters over the timed training steps and the
// sums of count_timed_batch.
Status drive(const Options& o, Store& store, const BatchSource& source, int rank, int ranks, const std::string& label,
             ModeResult* r) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(rank, ranks));
  BatchWindow window(std::move(cursor));
  StepBuffers buffers(store, rank, o.trainer);
  STRATA_RETURN_IF_ERROR(buffers.init());
  const bool show = r != nullptr && o.progress;
  std::int64_t id = 0;
  const int total = o.warmup + o.steps;
  Progress fwd(label + " forward", total, show);
  // A trainer's data loader builds a fresh batch each step and moves it into the store; each
  // step's copy (read from the file for a trace) is made before its clock starts and moved in.
  for (int s = 0; s < total; ++s) {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, window.at(s));
    KeyBatch fresh = *b;
    window.drop_before(s + 1);
    STRATA_RETURN_IF_ERROR(buffers.shape(fresh));
    const auto t = Clock::now();
    STRATA_RETURN_IF_ERROR(store.submit(id, std::move(fresh)));
    STRATA_RETURN_IF_ERROR(buffers.forward(id));
    STRATA_RETURN_IF_ERROR(store.discard(id));
    if (r && s >= o.warmup) r->forward_s.push_back(seconds_since(t));
    ++id;
    fwd.tick(s + 1);
  }
  // Training keeps `depth` batches submitted ahead of the one being computed (the lookahead window
  // plus the prefetch pipeline), as a trainer would; the step time is submit(i + depth) + forward(i)
  // + backward(i).
  const int depth = o.lookahead + o.pipeline;
  // Training continues with the batches after the forward phase's, so a cache warmed by the
  // forward phase does not see the same batches again (unless the source has fewer than
  // 2 x (warmup + steps) batches and they cycle).
  const std::int64_t first = total;
  auto batch_of = [&](int s) { return window.at(first + s); };
  const std::int64_t base = id;
  // The keys of the timed training batches: duplication (dedup is per table and batch) and sums.
  double dup_keys = 0, dup_unique = 0;
  std::vector<Key> sorted;
  const auto count_submitted = [&](int s, const KeyBatch& b) -> Status {
    if (!r || s < o.warmup) return Status::ok();
    STRATA_RETURN_IF_ERROR(count_timed_batch(store, b, *r));
    if (ranks > 1)
      for (const auto& f : b.features) {
        sorted.assign(f.keys.begin(), f.keys.end());
        std::sort(sorted.begin(), sorted.end());
        dup_keys += static_cast<double>(sorted.size());
        dup_unique += static_cast<double>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
      }
    return Status::ok();
  };
  const auto submit = [&](int s) -> Status {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(s));
    STRATA_RETURN_IF_ERROR(count_submitted(s, *b));
    return store.submit(base + s, *b);
  };
  // With --preview W the trainer announces the keys of the W batches after those submitted, as a
  // data loader that reads ahead would (keys only; the lookahead policy plans with them).
  int previewed = 0;  // batches [0, previewed) of the training phase have been previewed
  const auto preview_upto = [&](int end) -> Status {
    for (end = std::min(end, total); o.preview > 0 && previewed < end; ++previewed) {
      STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(previewed));
      STRATA_RETURN_IF_ERROR(store.preview(base + previewed, *b));
    }
    return Status::ok();
  };
  STRATA_RETURN_IF_ERROR(preview_upto(o.preview));
  for (int s = 0; s < std::min(depth - 1, total); ++s) {
    STRATA_RETURN_IF_ERROR(submit(s));
    STRATA_RETURN_IF_ERROR(preview_upto(s + 1 + o.preview));
  }
  Progress train(label + " train", total, show);
  // The counters of the timed steps: the store's, the trainer's own device's (cpu mode: its
  // copies of outputs and gradients), less the bench's first upload of the trainer's gradients.
  const auto snapshot = [&] {
    StoreStats st = store.stats();
    if (gpu::Device* own = buffers.own_device()) {
      st.links += own->counters().snapshot();
    }
    st.links.h2d -= buffers.setup_bytes;
    st.links.hbm_write -= buffers.setup_bytes;
    return st;
  };
  StoreStats before;
  for (int s = 0; s < total; ++s) {
    if (s == o.warmup) before = snapshot();
    KeyBatch fresh;
    const bool ahead = s + depth - 1 < total;
    if (ahead) {
      STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(s + depth - 1));
      STRATA_RETURN_IF_ERROR(count_submitted(s + depth - 1, *b));
      fresh = *b;
      // Read what the previews of this step need before the clock starts.
      if (o.preview > 0) STRATA_RETURN_IF_ERROR(batch_of(std::min(total, s + depth + o.preview) - 1).status());
    }
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* current, batch_of(s));
    STRATA_RETURN_IF_ERROR(buffers.shape(*current));
    const auto t = Clock::now();
    if (ahead) {
      STRATA_RETURN_IF_ERROR(store.submit(base + s + depth - 1, std::move(fresh)));
      STRATA_RETURN_IF_ERROR(preview_upto(s + depth + o.preview));
    }
    const auto t1 = Clock::now();
    STRATA_RETURN_IF_ERROR(buffers.forward(base + s));
    const auto t2 = Clock::now();
    STRATA_RETURN_IF_ERROR(buffers.backward(base + s));
    if (r && s >= o.warmup) {
      r->train_s.push_back(seconds_since(t));
      r->submit_s.push_back(std::chrono::duration<double>(t1 - t).count());
      r->lookup_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      r->backward_s.push_back(seconds_since(t2));
    }
    // Batch s is done; the later ones are submitted, previewed or still to come.
    window.drop_before(first + s + 1);
    train.tick(s + 1);
  }
  if (r) {
    r->train_stats = stats_delta(snapshot(), before);
    if (const gpu::Device* d = buffers.device())
      r->trainer_device = d->info().backend == gpu::Backend::kCuda ? "cuda " + d->info().name : "emu";
    r->trainer_device_own = buffers.own_device() != nullptr;
  }
  // The duplication factor of the keys the timed training steps dispatched, to set against the
  // cut in bytes exchanged.
  if (r && ranks > 1) r->duplication_factor = dup_unique > 0 ? dup_keys / dup_unique : 1.0;
  return store.flush();
}

Result<ModeResult> run_mode(const Options& o, const ModeDescriptor& mode, double cache_fraction,
                            const BatchSource& batches, const std::string& label) {
  STRATA_ASSIGN_OR_RETURN(StoreConfig config, make_config(o, mode, cache_fraction));
  const int ranks = o.mpi ? o.mpi->size() : runs_on_ranks(mode) ? o.ranks : 1;
  ModeResult r;
  r.mode = &mode;
  r.ranks = ranks;
  r.cache_fraction = cache_fraction;
  r.host_table_bytes = host_table_bytes(config);
  for (const auto& p : slot_pools(config)) {
    r.cache_rows += p.rows;
    r.cache_bytes += p.bytes;
  }
  r.peak_rss_per_mode = reset_peak_rss();
  r.rss_start_bytes = process_rss_bytes();
  const auto t0 = Clock::now();
  if (o.mpi) {
    // This process is one rank; rank 0 records.
    const int me = o.mpi->rank();
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(config, o.mpi));
    r.setup_s = seconds_since(t0);
    STRATA_RETURN_IF_ERROR(drive(o, *store, batches, me, ranks, label, me == 0 ? &r : nullptr));
  } else if (ranks == 1) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(config));
    r.setup_s = seconds_since(t0);
    STRATA_RETURN_IF_ERROR(drive(o, *store, batches, 0, 1, label, &r));
  } else {
    // One thread per rank: opening, every step and read_rows are collectives.
    STRATA_ASSIGN_OR_RETURN(auto group, dispatch::make_local_group(ranks, comm_options(o)));
    std::vector<Status> status(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int q = 0; q < ranks; ++q)
      threads.emplace_back([&, q] {
        auto store =
            Store::open(config, std::shared_ptr<dispatch::Communicator>(std::move(group[static_cast<std::size_t>(q)])));
        if (q == 0) r.setup_s = seconds_since(t0);
        status[static_cast<std::size_t>(q)] =
            store ? drive(o, **store, batches, q, ranks, label, q == 0 ? &r : nullptr) : store.status();
      });
    for (auto& t : threads) t.join();
    for (int q = 0; q < ranks; ++q)
      if (!status[static_cast<std::size_t>(q)].is_ok())
        return status[static_cast<std::size_t>(q)].with_context("rank " + std::to_string(q));
  }
  // A step is one batch on every rank: rank 0's timed training batches, averaged.
  const double n = std::max(1, r.timed_batches);
  r.keys_per_step = r.timed_keys / n * ranks;
  r.samples_per_step = r.timed_samples / n * ranks;
  r.bytes_per_lookup = r.timed_keys > 0 ? r.timed_key_bytes / r.timed_keys : 0;
  r.host_gather_bytes_per_step = r.timed_host_gather_bytes / n * ranks;
  r.host_optimizer_bytes_per_step = r.timed_host_optimizer_bytes / n * ranks;
  r.device = r.train_stats.device;
  r.device_peak_bytes = r.train_stats.device_peak_bytes;
  r.peak_rss_bytes = process_peak_rss_bytes();
  return r;
}

// The distinct rows each slot pool (cache_pools' order) holds among the batches a run submits:
// drive reads run batches [0, 2 x (warmup + steps)) of rank 0's cursor (the forward phase, then
// training). A sweep point whose pools hold that many rows can keep every row the run touches, so
// its misses are first uses only and a larger cache cannot raise its hit rate.
Result<std::vector<std::int64_t>> touched_rows_per_pool(const Options& o, const StoreConfig& config,
                                                        const BatchSource& source) {
  const std::vector<PoolSize> pools = slot_pools(config);
  std::map<std::string, std::size_t> pool_of;  // table name -> index into pools
  for (std::size_t p = 0; p < pools.size(); ++p)
    for (const std::size_t t : pools[p].tables) pool_of[config.tables[t].spec.name] = p;
  std::map<std::string, std::vector<Key>> keys;  // table -> its distinct keys so far (sorted after compact)
  const auto compact = [](std::vector<Key>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  BatchWindow window(std::move(cursor));
  const std::int64_t n = 2 * std::int64_t{o.warmup + o.steps};
  for (std::int64_t i = 0; i < n; ++i) {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, window.at(i));
    for (const auto& f : b->features) {
      if (pool_of.count(f.table) == 0) continue;
      std::vector<Key>& v = keys[f.table];
      v.insert(v.end(), f.keys.begin(), f.keys.end());
      if (v.size() > (std::size_t{1} << 22)) compact(v);  // bounded memory for long runs
    }
    window.drop_before(i + 1);
  }
  std::vector<std::int64_t> touched(pools.size(), 0);
  for (auto& [table, v] : keys) {
    compact(v);
    touched[pool_of[table]] += static_cast<std::int64_t>(v.size());
  }
  return touched;
}

// ---- reporting ----

cache::CacheStats total_cache_stats(const ModeResult& r) {
  cache::CacheStats cs;
  for (const auto& [name, st] : r.train_stats.cache) cs += st;
  return cs;
}

StepBytes step_bytes(const ModeResult& r) {
  const double steps = static_cast<double>(std::max<std::size_t>(1, r.train_s.size()));
  const gpu::LinkBytes& lb = r.train_stats.links;
  StepBytes sb;
  sb.hbm_read = static_cast<double>(lb.hbm_read) / steps;
  sb.hbm_write = static_cast<double>(lb.hbm_write) / steps;
  sb.h2d = static_cast<double>(lb.h2d) / steps;
  sb.d2h = static_cast<double>(lb.d2h) / steps;
  sb.host_read = static_cast<double>(lb.host_read_total()) / steps;
  sb.host_write = static_cast<double>(lb.host_write_total()) / steps;
  sb.all_to_all = static_cast<double>(r.train_stats.dispatch.bytes()) / steps;
  // Host-side kernels (the CPU gather of cpu and CPU-pooled offload tables, the CPU optimizer of
  // cpu and offload tables) have no counters: add their row traffic (count_timed_batch).
  sb.host_read += r.host_gather_bytes_per_step + r.host_optimizer_bytes_per_step;
  sb.host_write += r.host_optimizer_bytes_per_step;
  return sb;
}

json per_node(const std::vector<std::uint64_t>& v, double steps) {
  json a = json::array();
  for (const auto x : v) a.push_back(static_cast<double>(x) / steps);
  return a;
}

// A step's gather limit in lookups/s (step_gather_limit) for the workload's keys and for uniform
// random rows; 0 where not measured.
struct StepLimits {
  double workload = 0;
  double uniform = 0;
  double floor_s = 0;  // step_floor_s: a training step's gather and update floors
};

// Everything measured for one run of a mode (also used for sweep points).
json result_json(const Options& o, const ModeResult& r, double read_gbs, const StepLimits& limits,
                 const HardwareProfile& profile, bool with_samples) {
  const double f50 = percentile(r.forward_s, 0.5), t50 = percentile(r.train_s, 0.5);
  const double gather_gbs = r.keys_per_step * r.bytes_per_lookup / f50 / 1e9;
  json m;
  m["mode"] = r.mode->name;
  m["description"] = r.mode->summary;
  m["forward_lookups_per_s"] = r.keys_per_step / f50;
  m["forward_samples_per_s"] = r.samples_per_step / f50;
  m["train_lookups_per_s"] = r.keys_per_step / t50;
  m["samples_per_s"] = r.samples_per_step / t50;
  m["forward_step_ms_p50"] = f50 * 1e3;
  m["forward_step_ms_p99"] = percentile(r.forward_s, 0.99) * 1e3;
  m["train_step_ms_p50"] = t50 * 1e3;
  m["train_step_ms_p99"] = percentile(r.train_s, 0.99) * 1e3;
  // p99 is a nearest-rank percentile: with fewer than kStepsForP99 timed steps it is the maximum
  // or next to it, and the console and HTML show the maximum, so named.
  m["timed_steps"] = r.train_s.size();
  m["forward_step_ms_max"] =
      r.forward_s.empty() ? 0.0 : *std::max_element(r.forward_s.begin(), r.forward_s.end()) * 1e3;
  m["train_step_ms_max"] = r.train_s.empty() ? 0.0 : *std::max_element(r.train_s.begin(), r.train_s.end()) * 1e3;
  m["gather_gbs"] = gather_gbs;
  m["gather_fraction_of_read_bandwidth"] = read_gbs > 0 ? gather_gbs / read_gbs : 0.0;
  // The probe ran one rank's threads: with several thread ranks a step is several ranks' work.
  const double fwd = r.keys_per_step / f50;
  const bool one_rank = r.ranks == 1;
  m["gather_limit_lookups_per_s"] = one_rank && limits.workload > 0 ? json(limits.workload) : json(nullptr);
  m["forward_fraction_of_gather_limit"] = one_rank && limits.workload > 0 ? json(fwd / limits.workload) : json(nullptr);
  if (limits.uniform > 0)
    m["forward_fraction_of_uniform_gather_limit"] = one_rank ? json(fwd / limits.uniform) : json(nullptr);
  m["train_step_floor_ms"] = one_rank && limits.floor_s > 0 ? json(limits.floor_s * 1e3) : json(nullptr);
  m["train_fraction_of_step_floor"] = one_rank && limits.floor_s > 0 ? json(limits.floor_s / t50) : json(nullptr);
  m["setup_s"] = r.setup_s;
  m["train_phase_ms_p50"] = {{"submit", percentile(r.submit_s, 0.5) * 1e3},
                             {"forward", percentile(r.lookup_s, 0.5) * 1e3},
                             {"backward", percentile(r.backward_s, 0.5) * 1e3}};
  const double steps = static_cast<double>(std::max<std::size_t>(1, r.train_s.size()));
  const gpu::LinkBytes& lb = r.train_stats.links;
  // Host bytes of the CPU kernels (no device counts them): counted from the keys (count_timed_batch).
  m["cpu_kernel_bytes_per_step"] = {{"host_read", r.host_gather_bytes_per_step + r.host_optimizer_bytes_per_step},
                                    {"host_write", r.host_optimizer_bytes_per_step}};
  m["bytes_per_step"] = {{"hbm_read", static_cast<double>(lb.hbm_read) / steps},
                         {"hbm_write", static_cast<double>(lb.hbm_write) / steps},
                         {"h2d", static_cast<double>(lb.h2d) / steps},
                         {"d2h", static_cast<double>(lb.d2h) / steps},
                         {"host_read", static_cast<double>(lb.host_read_total()) / steps},
                         {"host_write", static_cast<double>(lb.host_write_total()) / steps},
                         {"host_read_per_node", per_node(lb.host_read, steps)},
                         {"host_write_per_node", per_node(lb.host_write, steps)},
                         {"all_to_all", static_cast<double>(r.train_stats.dispatch.bytes()) / steps}};
  if (r.ranks > 1) {
    // Rank 0's share: what it exchanged with the other ranks per step, and where its time went.
    const DispatchStats& d = r.train_stats.dispatch;
    m["dispatch"] = {
        {"ranks", r.ranks},
        {"sharding", o.sharding},
        {"bytes_per_step",
         {{"keys", static_cast<double>(d.key_bytes) / steps},
          {"rows", static_cast<double>(d.row_bytes) / steps},
          {"grads", static_cast<double>(d.grad_bytes) / steps},
          {"total", static_cast<double>(d.bytes()) / steps},
          {"total_without_dedup", static_cast<double>(d.bytes_no_dedup) / steps}}},
        {"dedup_factor", d.bytes() > 0 ? static_cast<double>(d.bytes_no_dedup) / static_cast<double>(d.bytes()) : 1.0},
        {"batch_duplication_factor", r.duplication_factor},
        {"ms_per_step",
         {{"exchange", d.exchange_seconds / steps * 1e3},
          {"lookup", d.lookup_seconds / steps * 1e3},
          {"source", d.local_seconds / steps * 1e3}}}};
  }
  if (r.mode->from_config) {
    json tables = json::array();
    for (const TableConfig& t : o.config.tables) {
      json jt = {{"name", t.spec.name}, {"placement", to_string(t.placement)}};
      if (t.placement == Placement::kCached || t.placement == Placement::kHybrid) jt["cache_rows"] = cache_rows(t);
      tables.push_back(jt);
    }
    m["config"] = {{"file", o.config_file}, {"threads", o.config.threads}, {"tables", tables}};
  }
  if (caches(*r.mode)) {
    const cache::CacheStats cs = total_cache_stats(r);
    const CacheConfig& cc = r.mode->from_config ? o.config.cache : CacheConfig{};
    m["hit_rate"] = cs.hit_rate();
    m["cache"] = {{"accesses", cs.accesses},
                  {"hits", cs.hits},
                  {"misses", cs.misses},
                  {"evictions", cs.evictions},
                  {"writebacks", cs.writebacks},
                  {"deferred", cs.deferred},
                  {"bypassed", cs.bypassed},
                  {"policy", r.mode->from_config ? std::string(cache::to_string(cc.policy)) : o.policy},
                  {"lookahead", r.mode->from_config ? cc.lookahead : o.lookahead},
                  {"preview", r.mode->from_config ? cc.preview : o.preview},
                  {"planner_partitions", r.mode->from_config ? cc.planner_partitions : o.planner_partitions},
                  {"cache_fraction", r.mode->from_config ? json(nullptr) : json(r.cache_fraction)},
                  {"cache_rows", r.cache_rows},
                  {"cache_bytes", r.cache_bytes}};
    // Per cached table (strata-tune validate sets each against its predicted LRU hit rate).
    json per_table = json::array();
    for (const auto& [name, st] : r.train_stats.cache)
      per_table.push_back({{"name", name}, {"accesses", st.accesses}, {"hits", st.hits}, {"misses", st.misses}});
    m["cache"]["tables"] = per_table;
  } else {
    m["hit_rate"] = nullptr;
  }
  m["device"] = r.device.empty() ? "none" : r.device;
  // Where the outputs and gradients lived: the trainer's placement and device (cpu mode with the
  // trainer on the device: a device the bench opened, whose copies count in bytes_per_step).
  m["trainer"] = {{"placement", trainer_name(o.trainer)},
                  {"device", r.trainer_device.empty() ? json(nullptr) : json(r.trainer_device)},
                  {"device_opened_by_bench", r.trainer_device_own}};
  m["device_peak_bytes"] = r.device_peak_bytes;
  m["peak_host_bytes"] = r.peak_rss_bytes;
  m["peak_host_scope"] = r.peak_rss_per_mode ? "mode" : "process";
  m["host_rss_start_bytes"] = r.rss_start_bytes;
  m["host_table_bytes"] = r.host_table_bytes;
  const ModelledStep ms = model_step(profile, step_bytes(r));
  json links = json::object();
  for (int l = 0; l < kNumLinks; ++l)
    links[link_name(static_cast<Link>(l))] = ms.links[static_cast<std::size_t>(l)].seconds * 1e3;
  m["modelled"] = {{"profile", profile.name}, {"step_ms", ms.step_s * 1e3},  {"serial_ms", ms.serial_s * 1e3},
                   {"link_ms", links},        {"bottleneck", ms.bottleneck}, {"explanation", ms.explanation}};
  if (with_samples) {
    m["forward_step_s"] = r.forward_s;
    m["train_step_s"] = r.train_s;
  }
  return m;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  } else if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else if (b >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

// The HTML report's document (bench/report_html.hpp) from the JSON results.
json report_document(const json& j) {
  json report;
  std::string modes;
  for (const auto& m : j["results"]) modes += (modes.empty() ? "" : ", ") + m["mode"].get<std::string>();
  report["title"] = "strata-bench: " + modes;
  // Machine and workload as people read them: sizes in GB, lists as text.
  json machine = j["machine"];
  for (const char* k : {"memory_total_bytes", "memory_available_bytes"})
    if (machine[k].is_number()) machine[k] = human_bytes(machine[k].get<double>());
  std::string gpus;
  for (const auto& g : machine["gpus"]) gpus += (gpus.empty() ? "" : ", ") + g.get<std::string>();
  machine["gpus"] = gpus.empty() ? "none" : gpus;
  // The gather limit as one line per probe ("dim 128, 512-byte rows, workload keys: 3.20e+07
  // lookups/s, 16.4 GB/s"); absent when the probe did not run.
  std::string limits;
  for (const auto& g : machine["gather_limit"]) {
    char line[200];
    std::snprintf(line, sizeof line, "dim %d, %lld-byte rows, %s keys: %.3g lookups/s, %.2f GB/s", g["dim"].get<int>(),
                  static_cast<long long>(g["row_bytes"].get<std::int64_t>()), g["keys"].get<std::string>().c_str(),
                  g["lookups_per_s"].get<double>(), g["gb_per_s"].get<double>());
    limits += (limits.empty() ? "" : "; ") + std::string(line);
  }
  if (limits.empty()) {
    machine.erase("gather_limit");
  } else {
    machine["gather_limit"] = limits;
  }
  std::string floors;  // the same for the update floor ("dim 128, 512-byte records: 1.2e+07 rows/s, ...")
  for (const auto& u : machine["update_floor"]) {
    char line[200];
    std::snprintf(line, sizeof line, "dim %d, %lld-byte records: %.3g rows/s, %.2f GB/s read and written",
                  u["dim"].get<int>(), static_cast<long long>(u["record_bytes"].get<std::int64_t>()),
                  u["rows_per_s"].get<double>(), u["gb_per_s"].get<double>());
    floors += (floors.empty() ? "" : "; ") + std::string(line);
  }
  if (floors.empty()) {
    machine.erase("update_floor");
  } else {
    machine["update_floor"] = floors;
  }
  report["machine"] = machine;
  // Where the trainer's outputs and gradients live, which the bytes chart's note names.
  report["settings"] = {{"trainer", j["settings"]["trainer"]}};
  // The workload section shows the table list separately (a 26-entry array does not fit a cell).
  json w = j["workload"];
  report["tables"] = w["tables"];
  const auto shapes = w["tables"];
  if (shapes.is_array()) w["tables"] = std::to_string(shapes.size()) + " (listed under Tables)";
  for (const char* k : {"keys_per_step", "samples_per_step"})
    if (w[k].is_number()) w[k] = static_cast<std::int64_t>(w[k].get<double>());
  report["workload"] = w;
  report["modes"] = json::array();
  for (const auto& m : j["results"]) {
    json rm = {{"mode", m["mode"]},
               {"forward_lookups_per_s", m["forward_lookups_per_s"]},
               {"train_lookups_per_s", m["train_lookups_per_s"]},
               {"forward_fraction_of_gather_limit", m["forward_fraction_of_gather_limit"]},
               {"train_fraction_of_step_floor", m["train_fraction_of_step_floor"]},
               {"samples_per_s", m["samples_per_s"]},
               {"step_ms_p50", m["train_step_ms_p50"]},
               {"step_ms_max", m["train_step_ms_max"]},
               {"device", m["device"]},
               {"peak_host_bytes", m["peak_host_bytes"]},
               {"host_table_bytes", m["host_table_bytes"]},
               {"bytes_per_step", m["bytes_per_step"]},
               {"modelled", m["modelled"]}};
    if (m["device"] != "none") rm["peak_device_bytes"] = m["device_peak_bytes"];
    // A 99th percentile only where enough steps back it (else the report shows the maximum alone).
    if (m["timed_steps"].get<std::size_t>() >= kStepsForP99) rm["step_ms_p99"] = m["train_step_ms_p99"];
    if (m["trainer"]["device"].is_string()) rm["trainer_device"] = m["trainer"]["device"];
    if (m["hit_rate"].is_number()) rm["hit_rate"] = m["hit_rate"];
    // Per-node splits are in the JSON; the chart shows totals. A link nothing crossed (all-to-all
    // before dispatch) would only add an empty legend entry.
    rm["bytes_per_step"].erase("host_read_per_node");
    rm["bytes_per_step"].erase("host_write_per_node");
    if (rm["bytes_per_step"]["all_to_all"] == 0.0) rm["bytes_per_step"].erase("all_to_all");
    report["modes"].push_back(rm);
  }
  report["sweep"] = json::array();
  if (j.contains("sweep_touched_rows")) report["sweep_touched_rows"] = j["sweep_touched_rows"];
  for (const auto& p : j["sweep"]) {
    json rp = {{"mode", "cached"}, {"policy", j["settings"]["policy"]}, {"cache_fraction", p["cache_fraction"]}};
    for (const char* k : {"hit_rate", "forward_lookups_per_s", "train_lookups_per_s", "cache_bytes", "skipped",
                          "holds_every_touched_row"})
      if (p.contains(k) && !p[k].is_null()) rp[k] = p[k];
    report["sweep"].push_back(rp);
  }
  return report;
}

std::string iso_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "0.01,0.1,0.3" -> sorted unique fractions in (0, 1]; an empty item ("0.5,", "0.1,,0.2") is refused.
Result<std::vector<double>> parse_fractions(const std::string& s) {
  std::vector<double> out;
  for (const auto& item : split_list(s)) {
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(f > 0.0 && f <= 1.0))
      return Status::invalid_argument("--sweep-cache: '" + item +
                                      "' is not a cache fraction in (0, 1] (expected e.g. 0.01,0.1,0.3)");
    out.push_back(f);
  }
  if (out.empty()) return Status::invalid_argument("--sweep-cache is empty (expected e.g. 0.01,0.1,0.3)");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Rows each slot pool must hold at once: the most unique rows of one step of the run (a batch;
// over several ranks a world step, one batch per rank), in the forward phase or in training. That
// is all the store needs: a plan that does not fit beside the rows pinned by the batches in flight
// waits for them to retire (CacheStats::deferred, printed per mode), and the training loop retires
// batch i before it asks for batch i + 1's rows. A cache smaller than one step fails at its first
// such step, so it is refused before the run. Reads the run's batches once through a cursor.
Result<std::vector<std::int64_t>> rows_needed_per_pool(const Options& o, const StoreConfig& c,
                                                       const std::vector<PoolSize>& pools, const BatchSource& source,
                                                       int ranks) {
  // Keys of a world step in pool p on `rank`, as (table index, key) pairs: a pool is a rank's,
  // holding its shards' rows (row sharding: key k on rank k % ranks, local row k / ranks).
  using Row = std::pair<std::size_t, Key>;
  std::vector<Row> rows;
  const auto count_rows = [&](const std::vector<KeyBatch>& step, const PoolSize& pool, int rank) {
    rows.clear();
    for (const KeyBatch& batch : step)
      for (const std::size_t t : pool.tables)
        for (const auto& f : batch.features)
          if (f.table == c.tables[t].spec.name)
            for (const Key k : f.keys)
              if (ranks == 1 || static_cast<int>(k % static_cast<Key>(ranks)) == rank)
                rows.emplace_back(t, k / static_cast<Key>(ranks));
    std::sort(rows.begin(), rows.end());
    return static_cast<std::int64_t>(std::unique(rows.begin(), rows.end()) - rows.begin());
  };
  std::vector<std::int64_t> need(pools.size(), 0);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  // The world steps of both phases: world step i is source batches i ranks .. i ranks + ranks - 1
  // (each rank's batch r, r + ranks, ...), mod the source's batches.
  const int steps = 2 * (o.warmup + o.steps);
  std::vector<KeyBatch> step;
  for (int s = 0; s < steps; ++s) {
    step.clear();
    for (int r = 0; r < ranks; ++r) {
      STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor->next());
      step.push_back(std::move(b));
    }
    for (int rank = 0; rank < ranks; ++rank)
      for (std::size_t p = 0; p < pools.size(); ++p) need[p] = std::max(need[p], count_rows(step, pools[p], rank));
  }
  return need;
}

// "" when the slot pools of `c` can hold a step's rows, else why not; `what` says where
// the cache's size came from ("cache fraction 0.1", "the config").
Result<std::string> cache_too_small(const Options& o, const StoreConfig& c, const std::string& what,
                                    const BatchSource& source, int ranks = 1) {
  const auto pools = slot_pools(c);
  if (pools.empty()) return std::string();
  STRATA_ASSIGN_OR_RETURN(const auto need, rows_needed_per_pool(o, c, pools, source, ranks));
  for (std::size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].rows >= need[p]) continue;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s gives the dim-%d slot pool %lld rows, but one step needs %lld unique rows in it",
                  what.c_str(), pools[p].dim, static_cast<long long>(pools[p].rows), static_cast<long long>(need[p]));
    return std::string(buf);
  }
  return std::string();
}

// cache_too_small for the cached mode at cache fraction `fraction`.
Result<std::string> cached_too_small(const Options& o, double fraction, const BatchSource& source) {
  auto c = make_config(o, *find_mode("cached").value(), fraction);
  if (!c) return c.status().message();
  char what[64];
  std::snprintf(what, sizeof what, "cache fraction %g", fraction);
  return cache_too_small(o, c.value(), what, source);
}

int fail(const std::string& message, int code = 2) {
  std::cerr << "strata-bench: " << message << "\n";
  return code;
}

// Reads a hardware profile file with the input limits (a regular file of at most 4 MiB, JSON
// nested at most 32 levels), then parses it.
Result<HardwareProfile> load_profile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_input_file(path, "profile file"));
  STRATA_RETURN_IF_ERROR(parse_json_limited(text, "profile '" + path + "'").status());
  return parse_hardware_profile(text, path);
}

// Checks, before any work, that an output file can be written at `path`. The outputs are
// written to a temporary file next to `path` and renamed over it (`replaced`), so a test file is
// created there and removed, and anything but a regular file at `path` is refused (renaming
// over /dev/null would replace the device). An output written in place (`replaced` false) only
// needs a writable directory and no directory at `path`.
Status check_output_path(const std::string& flag, const std::string& path, bool replaced) {
  const std::string who = flag + " " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::invalid_argument(who + ": is a directory (expected a file path)");
    if (!S_ISREG(st.st_mode)) {
      if (!replaced) return Status::ok();
      return Status::invalid_argument(who + ": is " +
                                      (S_ISCHR(st.st_mode) ? "a character device" : "not a regular file") +
                                      " (expected a file path; the file is written next to it and renamed into place)");
    }
  }
  auto probe = detail::AtomicFileWriter::create(path);  // its temporary file is removed when `probe` goes
  if (!probe) return Status::invalid_argument(who + ": cannot write there (" + probe.status().message() + ")");
  return Status::ok();
}

// ---- --config, --trace, --criteo ----

// Reads --config into o.config and sets up its mode, named after the file's stem ("config" when
// that is empty or a uniform mode's name). Without --tables, --rows, --workload, --trace and
// --criteo, the workload's tables are the config's.
Status load_config_mode(Options& o) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_input_file(o.config_file, "config file"));
  STRATA_RETURN_IF_ERROR(parse_json_limited(text, "config").status());
  STRATA_ASSIGN_OR_RETURN(o.config, parse_store_config(text));
  std::string stem = o.config_file.substr(o.config_file.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find_last_of('.'));
  o.config_name = stem.empty() || find_mode(stem) ? "config" : stem;
  o.config_summary = "store config " + o.config_file + " as given (its placements, caches, optimizers, threads)";
  const auto& tables = o.config.tables;
  const bool cached = std::any_of(tables.begin(), tables.end(), [](const TableConfig& t) {
    return t.placement == Placement::kCached || t.placement == Placement::kHybrid;
  });
  const bool device =
      std::any_of(tables.begin(), tables.end(), [](const TableConfig& t) { return t.placement != Placement::kCpu; });
  o.config_mode = ModeDescriptor{o.config_name.c_str(),
                                 o.config_summary.c_str(),
                                 cached ? Placement::kCached : tables.front().placement,
                                 o.config.offload_gather,
                                 device,
                                 true};
  if (!o.tables_given && o.workload_file.empty() && o.trace_file.empty() && o.criteo_file.empty()) {
    o.workload.table_list.clear();
    for (const TableConfig& t : tables) o.workload.table_list.push_back({t.spec.name, t.spec.rows, t.spec.dim});
  }
  return Status::ok();
}

// The names of `names`' first few entries, for messages ("a, b, c" or "a, b, c, ... (40 tables)").
template <typename T, typename Name>
std::string some_names(const std::vector<T>& items, Name name) {
  std::string s;
  for (std::size_t i = 0; i < items.size() && i < 8; ++i) s += (i ? ", " : "") + name(items[i]);
  if (items.size() > 8) s += ", ... (" + std::to_string(items.size()) + " tables)";
  return s;
}

// The workload's tables and the config's must be the same set (names), with the same rows and dims.
Status check_config_tables(const StoreConfig& c, const std::vector<TableShape>& shapes) {
  const auto config_names = [&] { return some_names(c.tables, [](const TableConfig& t) { return t.spec.name; }); };
  const auto workload_names = [&] { return some_names(shapes, [](const TableShape& t) { return t.name; }); };
  for (const TableShape& w : shapes) {
    const auto t =
        std::find_if(c.tables.begin(), c.tables.end(), [&](const TableConfig& tc) { return tc.spec.name == w.name; });
    if (t == c.tables.end())
      return Status::invalid_argument("table '" + w.name +
                                      "' of the workload is not in the config (its tables: " + config_names() + ")");
    if (t->spec.rows != w.rows)
      return Status::invalid_argument("table '" + w.name + "' has " + std::to_string(t->spec.rows) +
                                      " rows in the config but " + std::to_string(w.rows) + " in the workload");
    if (t->spec.dim != w.dim)
      return Status::invalid_argument("table '" + w.name + "' has dim " + std::to_string(t->spec.dim) +
                                      " in the config but " + std::to_string(w.dim) + " in the workload");
  }
  for (const TableConfig& t : c.tables)
    if (std::none_of(shapes.begin(), shapes.end(), [&](const TableShape& w) { return w.name == t.spec.name; }))
      return Status::invalid_argument("table '" + t.spec.name +
                                      "' of the config is not in the workload (its tables: " + workload_names() + ")");
  return Status::ok();
}

// Opens --trace or --criteo for a run of `world` ranks, reading and checking the batches it uses
// (2 x (warmup + steps) per rank at most), and sets the workload's tables and shape from it.
Result<BatchSource> open_file_source(Options& o, std::string& table_set, int world) {
  if (!o.trace_file.empty() && !o.criteo_file.empty())
    return Status::invalid_argument("give --trace or --criteo, not both");
  if (!o.trace_file.empty() && (o.tables_given || !o.workload_file.empty()))
    return Status::invalid_argument("--trace " + o.trace_file +
                                    ": the tables are the trace's (its header); --tables, --rows and --workload do "
                                    "not apply (--dim sets their dim)");
  const std::int64_t per_phase = static_cast<std::int64_t>(o.warmup + o.steps) * world;
  const std::string& path = o.trace_file.empty() ? o.criteo_file : o.trace_file;
  const auto progress = [&](std::int64_t done, std::int64_t total) {
    if (!o.progress) return;
    std::fprintf(stderr, "\r  reading %s: %lld%s batches", path.c_str(), static_cast<long long>(done),
                 total > 0 ? (" of " + std::to_string(total)).c_str() : "");
    std::fflush(stderr);
  };
  Result<BatchSource> src = Status::invalid_argument("no source");
  if (!o.trace_file.empty()) {
    src = BatchSource::open_trace(path, 2 * per_phase, progress);
  } else {
    std::vector<TableSpec> specs;
    for (const TableShape& t : workload_tables(o.workload)) {
      TableSpec spec;
      spec.name = t.name;
      spec.rows = t.rows;
      spec.dim = t.dim;
      specs.push_back(spec);
    }
    if (specs.size() != static_cast<std::size_t>(kCriteoSparseFeatures))
      return Status::invalid_argument("--criteo " + path + ": the table set has " + std::to_string(specs.size()) +
                                      " tables (expected 26, one per categorical column C1..C26: --tables criteo, "
                                      "criteo:TOTAL_ROWS or a list of 26)");
    src = BatchSource::open_criteo(path, specs, o.workload.batch, o.criteo_label, 2 * per_phase, progress);
  }
  if (o.progress) std::fprintf(stderr, "\n");
  if (!src) return src.status();
  STRATA_RETURN_IF_ERROR(check_source_holds_phase(src->kind(), path, src->size(), o.warmup, o.steps, world));
  if (!o.trace_file.empty()) {
    o.workload.table_list.clear();
    for (const TraceTable& t : src->tables()) {
      int dim = o.workload.dim;
      const auto c = std::find_if(o.config.tables.begin(), o.config.tables.end(),
                                  [&](const TableConfig& tc) { return tc.spec.name == t.name; });
      if (!o.config_file.empty() && !o.dim_given && c != o.config.tables.end()) dim = c->spec.dim;
      o.workload.table_list.push_back({t.name, t.rows, dim});
    }
  }
  // The shape the memory estimate reads: the widest batch, the mean bag, the batches held.
  o.workload.batch = src->summary().max_batch_size;
  o.workload.bag_size = static_cast<int>(std::ceil(src->summary().mean_keys_per_bag));
  o.workload.bag_dist = "fixed";
  o.workload.distinct_batches = static_cast<int>(std::min<std::int64_t>(src->size(), kSourceHeadBatches));
  table_set = src->kind() + " " + path;
  if (src->size() < 2 * per_phase)
    std::fprintf(stderr, "strata-bench: %s %s has %lld batches, fewer than the %lld the run uses: they are cycled\n",
                 src->kind().c_str(), path.c_str(), static_cast<long long>(src->size()),
                 static_cast<long long>(2 * per_phase));
  return src;
}

// Writes the source's batches (the sequence the run cycles) to --dump-trace.
Status dump_trace(const Options& o, const BatchSource& source) {
  std::vector<TraceTable> tables;
  for (const TableShape& t : workload_tables(o.workload)) tables.push_back({t.name, t.rows});
  STRATA_ASSIGN_OR_RETURN(TraceWriter writer, TraceWriter::create(o.dump_trace, tables));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  for (std::int64_t i = 0; i < source.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor->next());
    STRATA_RETURN_IF_ERROR(writer.append(b));
  }
  return writer.close();
}

int run(const Options& o_in) {
  const auto wall0 = Clock::now();
  const std::string started_at = iso_time_now();
  Options o = o_in;
  // ---- check everything before any long work starts ----
  if (o.ranks < 1 || o.ranks > 64) return fail("--ranks " + std::to_string(o.ranks) + " must be in [1, 64]");
  std::string table_set = o.table_set;
  if (!o.workload_file.empty()) {
    auto text = read_input_file(o.workload_file, "workload file");
    if (!text) return fail(text.status().message());
    auto w = parse_workload_json(text.value());
    if (!w) return fail(o.workload_file + ": " + w.status().message());
    o.workload = w.value();
    table_set = "file " + o.workload_file;
    if (!parse_json_limited(text.value(), o.workload_file).value().contains("distinct_batches"))
      o.workload.distinct_batches = 2 * (o.warmup + o.steps) * (o.mpi ? o.mpi->size() : o.ranks);
  } else {
    if (table_set == "criteo") table_set = "criteo:" + std::to_string(o.criteo_rows);
    if (Status s = apply_table_set(o.workload, table_set); !s.is_ok()) return fail("--tables: " + s.message());
  }
  if (!o.config_file.empty()) {
    if (Status s = load_config_mode(o); !s.is_ok()) return fail("--config " + o.config_file + ": " + s.message());
    if (!o.tables_given && o.workload_file.empty() && o.trace_file.empty() && o.criteo_file.empty())
      table_set = "config " + o.config_file;
  }
  if (Status s = validate(o.workload); !s.is_ok()) return fail(s.message());
  const int world = o.mpi ? o.mpi->size() : o.ranks;
  // A trace or a TSV file: read and check the part the run uses now, before any long work.
  std::optional<BatchSource> source;
  if (!o.trace_file.empty() || !o.criteo_file.empty()) {
    auto src = open_file_source(o, table_set, world);
    if (!src) return fail(src.status().message());
    source = std::move(src).value();
  }
  if (!o.config_file.empty()) {
    if (Status s = check_config_tables(o.config, workload_tables(o.workload)); !s.is_ok())
      return fail("--config " + o.config_file + ": " + s.message());
  }
  if (auto t = dispatch::parse_sharding(o.sharding); !t) return fail("--sharding: " + t.status().message());
  std::vector<const ModeDescriptor*> modes;
  for (const auto& name : split_list(o.modes)) {
    if (name.empty()) continue;
    auto m = find_mode(name);
    if (!m) return fail("--modes: " + m.status().message());
    if (std::find(modes.begin(), modes.end(), m.value()) == modes.end()) modes.push_back(m.value());
  }
  if (!o.config_file.empty()) modes.push_back(&o.config_mode);
  if (source && !o.dump_keys.empty())
    return fail("--dump-keys writes generated batches; with --trace or --criteo use --dump-trace");
  if (o.mpi && source) return fail("--trace and --criteo run on one process (not under mpirun)");
  if (modes.empty()) return fail("--modes is empty (expected a comma-separated list of " + mode_names(", ") + ")");
  if (o.mpi) {
    for (const ModeDescriptor* m : modes)
      if (!sharded(*m))
        return fail("--modes " + std::string(m->name) +
                    ": under mpirun every process is one rank of the sharded modes; use --modes gpu,hybrid");
    if (o.ranks != 1)
      return fail("--ranks " + std::to_string(o.ranks) + " under mpirun: the processes are the ranks (use --ranks 1)");
    if (!o.sweep_cache.empty())
      return fail("--sweep-cache runs the cached mode, which is single-rank: not under mpirun");
  }
  for (const ModeDescriptor* m : modes)
    if (auto c = make_config(o, *m, o.cache_fraction); !c) return fail(c.status().message());
  std::vector<double> sweep;
  if (!o.sweep_cache.empty()) {
    auto f = parse_fractions(o.sweep_cache);
    if (!f) return fail(f.status().message());
    sweep = f.value();
  }
  // Outputs that cannot be written are found now, not after every mode ran.
  for (const auto& [flag, path, replaced] :
       {std::make_tuple("--json", o.json_out, true), std::make_tuple("--html", o.html_out, true),
        std::make_tuple("--dump-keys", o.dump_keys, false), std::make_tuple("--dump-trace", o.dump_trace, false)}) {
    if (path.empty()) continue;
    if (Status s = check_output_path(flag, path, replaced); !s.is_ok()) return fail(s.message());
  }
  // --profile NAME (bench/profiles/NAME.json) or a file path (anything at that path).
  struct stat profile_stat {};
  const std::string profile_path = ::stat(o.profile.c_str(), &profile_stat) == 0
                                       ? o.profile
                                       : std::string(STRATA_PROFILE_DIR) + "/" + o.profile + ".json";
  auto profile = load_profile(profile_path);
  if (!profile)
    return fail("--profile " + o.profile + ": " + profile.status().message() +
                " (expected h200-pcie5, a100-pcie4, dgx-a100, dgx-h100 or a profile JSON file)");
  const MachineInfo machine = describe_machine();
  auto backend = parse_backend(o.backend);
  const Result<int> gpus = gpu::cuda_devices();
  const bool emu = backend.value() == BackendChoice::kEmu ||
                   (backend.value() == BackendChoice::kAuto && gpus.is_ok() && gpus.value() == 0);
  const bool need_device =
      !sweep.empty() || std::any_of(modes.begin(), modes.end(), [](const ModeDescriptor* m) { return m->uses_device; });
  if (need_device && backend.value() != BackendChoice::kEmu && !gpus.is_ok())
    return fail("--backend " + o.backend + ": " + gpus.status().message() +
                " (expected a working CUDA setup, or --backend emu, or only --modes cpu)");
  if (need_device && backend.value() == BackendChoice::kCuda && gpus.value() == 0)
    return fail(std::string("--backend cuda: ") +
                (gpu::cuda_backend_built() ? "no CUDA device is visible" : "this build has no CUDA backend") +
                " (expected --backend auto or emu, or only --modes cpu)");
  const MemoryEstimate mem = estimate_memory(o, modes, sweep, emu);
  const double available = static_cast<double>(machine.memory_available_bytes);
  if (available > 0 && mem.total > usable_memory_bytes(machine)) {
    return fail("the workload needs about " + human_bytes(mem.total) + " of host memory (mode " + mem.worst_mode +
                ": tables " + human_bytes(mem.tables) + (emu ? ", emulated device " : ", device ") +
                human_bytes(mem.device) + "; batches " + human_bytes(mem.batches) + ") but only " +
                human_bytes(available) + " is available (" + usable_memory_note() +
                "); use fewer or smaller tables (--tables, --rows, --dim, criteo:TOTAL_ROWS), a smaller --batch or "
                "--cache-fraction");
  }
  if (emu) {
    const double capacity = static_cast<double>(o.device_capacity > 0 ? o.device_capacity : std::int64_t{4} << 30);
    if (mem.device > capacity)
      return fail("mode " + mem.worst_mode + " needs about " + human_bytes(mem.device) +
                  " of device memory but the emulated device has " + human_bytes(capacity) +
                  " (--device-capacity); lower --cache-fraction (or the largest --sweep-cache fraction)");
  }

  const auto shapes = workload_tables(o.workload);
  std::int64_t total_rows = 0;
  std::int64_t min_rows = shapes.front().rows, max_rows = 0;
  std::set<int> dims;
  for (const auto& t : shapes) {
    total_rows += t.rows;
    min_rows = std::min(min_rows, t.rows);
    max_rows = std::max(max_rows, t.rows);
    dims.insert(t.dim);
  }
  std::string dim_text;
  for (const int d : dims) dim_text += (dim_text.empty() ? "" : "/") + std::to_string(d);
  char keys_text[160];  // the batch's shape and its keys: generated, or the file's
  if (source) {
    std::snprintf(keys_text, sizeof keys_text, "batches of up to %lld bags, %.2f keys per bag (the file's keys)",
                  static_cast<long long>(o.workload.batch), source->summary().mean_keys_per_bag);
  } else {
    std::snprintf(keys_text, sizeof keys_text, "batch %lld x %d keys (%s), %s",
                  static_cast<long long>(o.workload.batch), o.workload.bag_size, o.workload.bag_dist.c_str(),
                  o.workload.dist.c_str());
  }
  std::fprintf(stderr,
               "strata-bench: %zu table(s) (%s; %lld rows in total, %lld..%lld per table, dim %s), %s, %d steps, %d "
               "threads, about %s of host memory at peak\n",
               shapes.size(), table_set.c_str(), static_cast<long long>(total_rows), static_cast<long long>(min_rows),
               static_cast<long long>(max_rows), dim_text.c_str(), keys_text, o.steps, o.threads,
               human_bytes(mem.total).c_str());
  if (!source) {
    std::vector<KeyBatch> generated = make_batches(o.workload, o.threads);
    if (!o.dump_keys.empty()) {
      if (Status s = write_batches_raw(o.dump_keys, generated); !s.is_ok()) return fail(s.message(), 1);
    }
    source = BatchSource::generated(std::move(generated));
  }
  const BatchSource& batches = *source;
  if (!o.dump_trace.empty()) {
    if (Status s = dump_trace(o, batches); !s.is_ok()) return fail("--dump-trace: " + s.message(), 1);
  }
  // A cache that cannot hold one step's rows fails at that step: refuse it now (a sweep point is
  // skipped with the reason instead). One that holds a step but not the batches in flight runs,
  // its later plans deferred.
  for (const ModeDescriptor* m : modes) {
    if (m->placement != Placement::kCached) continue;
    Result<std::string> why =
        m->from_config ? cache_too_small(o, o.config, "the config", batches, o.mpi ? 1 : std::max(1, o.ranks))
                       : cached_too_small(o, o.cache_fraction, batches);
    if (!why) return fail(why.status().message(), 1);
    if (!why->empty())
      return fail("mode " + std::string(m->name) + ": " + *why +
                  (m->from_config ? "; give its cached tables more cache rows" : "; raise --cache-fraction"));
  }
  std::vector<std::string> sweep_skipped(sweep.size());
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    Result<std::string> why = cached_too_small(o, sweep[i], batches);
    if (!why) return fail(why.status().message(), 1);
    sweep_skipped[i] = *why;
  }

  std::fprintf(stderr, "  measuring sequential read bandwidth...\n");
  // More reading threads than hardware threads would measure the scheduler, not the memory.
  const int probe_threads = std::min(o.threads, hardware_threads());
  const double read_gbs = measure_read_bandwidth_gbs(static_cast<std::size_t>(o.read_probe_mib) << 20, probe_threads);
  // The gather limit: a bare gather + sum-pool loop over the run's first batches, on the same
  // threads, before any store exists (its table is freed before the modes run).
  std::vector<GatherLimit> gather_limits;
  std::vector<UpdateFloor> update_floors;
  StepLimits step_limits;
  double gather_probe_s = 0;
  if (o.gather_probe) {
    std::fprintf(stderr, "  measuring the random-row gather limit...\n");
    const auto t0 = Clock::now();
    auto g = measure_gather_limits(o, batches.head(), probe_threads);
    if (!g) return fail(g.status().message(), 1);
    gather_limits = std::move(g).value();
    gather_probe_s = seconds_since(t0);
    step_limits.workload = step_gather_limit(o, gather_limits, batches.head().front(), "workload");
    step_limits.uniform = step_gather_limit(o, gather_limits, batches.head().front(), "uniform");
    std::fprintf(stderr, "  measuring the update floor...\n");
    auto u = measure_update_floors(o, batches.head(), probe_threads);
    if (!u) return fail(u.status().message(), 1);
    update_floors = std::move(u).value();
    gather_probe_s = seconds_since(t0);
    step_limits.floor_s = step_floor_s(o, gather_limits, update_floors, batches.head().front());
  }

  std::vector<ModeResult> results;
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const std::string label = "[" + std::to_string(i + 1) + "/" + std::to_string(modes.size()) + "] " + modes[i]->name;
    auto r = run_mode(o, *modes[i], modes[i]->from_config ? 0.0 : o.cache_fraction, batches, label);
    if (!r) return fail(std::string("mode ") + modes[i]->name + ": " + r.status().to_string(), 1);
    results.push_back(std::move(r).value());
  }
  // The sweep: the cached mode at each fraction, on the same batches. A point equal to the cached
  // run above reuses it; a point whose cache cannot hold a step's rows is reported as skipped
  // with the reason.
  std::vector<std::pair<double, Result<ModeResult>>> sweep_results;
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    const double f = sweep[i];
    if (!sweep_skipped[i].empty()) {
      sweep_results.emplace_back(f, Status::resource_exhausted(sweep_skipped[i]));
      continue;
    }
    const auto same = std::find_if(results.begin(), results.end(), [&](const ModeResult& r) {
      return r.mode->placement == Placement::kCached && r.cache_fraction == f;
    });
    if (same != results.end()) {
      sweep_results.emplace_back(f, *same);
      continue;
    }
    char label[96];
    std::snprintf(label, sizeof label, "[sweep %zu/%zu] cached %g", i + 1, sweep.size(), f);
    auto r = run_mode(o, *find_mode("cached").value(), f, batches, label);
    // A cache too small for what the planner pins at run time is a result of the sweep; any
    // other failure is a failure of the run.
    if (!r && r.status().code() != StatusCode::kResourceExhausted)
      return fail("sweep point " + std::to_string(f) + ": " + r.status().to_string(), 1);
    sweep_results.emplace_back(f, std::move(r));
  }

  // ---- the results document ----
  json j;
  j["tool"] = "strata-bench";
  j["version"] = STRATA_VERSION;
  j["command"] = o.argv;
  j["started_at"] = started_at;
  j["workload"] = json::parse(workload_to_json(o.workload));
  j["workload"]["table_set"] = table_set;
  j["workload"]["total_rows"] = total_rows;
  j["workload"]["pooling_mode"] = o.pooling_mode;
  j["workload"]["optimizer"] = o.optimizer;
  j["workload"]["steps"] = o.steps;
  j["workload"]["warmup"] = o.warmup;
  j["workload"]["keys_per_step"] = results.front().keys_per_step;
  j["workload"]["source"] = {{"kind", batches.kind()},
                             {"path", batches.from_file() ? json(batches.path()) : json(nullptr)},
                             {"batches", batches.size()},
                             {"mean_keys_per_bag", batches.summary().mean_keys_per_bag},
                             {"max_batch_size", batches.summary().max_batch_size}};
  if (batches.from_file()) {
    // The keys are the file's: the generator's fields say nothing.
    for (const char* k : {"dist", "seed", "bag_dist"}) j["workload"][k] = nullptr;
    j["workload"]["distinct_batches"] = batches.size();
    j["workload"]["bag_size"] = batches.summary().mean_keys_per_bag;
  }
  j["workload"]["samples_per_step"] = results.front().samples_per_step;
  if (!j["workload"]["tables"].is_array()) {  // list every table, also for N identical ones
    j["workload"]["tables"] = json::array();
    for (const auto& t : shapes)
      j["workload"]["tables"].push_back({{"name", t.name}, {"rows", t.rows}, {"dim", t.dim}});
  }
  j["threads"] = o.threads;
  j["read_probe_threads"] = probe_threads;
  j["settings"] = {{"modes", o.modes},
                   {"config", o.config_file.empty() ? json(nullptr) : json(o.config_file)},
                   {"threads", o.threads},
                   {"policy", o.policy},
                   {"trainer", trainer_name(o.trainer)},
                   {"lookahead", o.lookahead},
                   {"preview", o.preview},
                   {"pipeline", o.pipeline},
                   {"planner_partitions", o.planner_partitions},
                   {"cache_fraction", o.cache_fraction},
                   {"sweep_cache", sweep},
                   {"backend", o.backend},
                   {"device_capacity", o.device_capacity},
                   {"profile", o.profile}};
  j["settings"]["comm_timeout_s"] = o.comm_timeout_s;
  j["machine"] = to_json(machine);
  // cuda_devices stays an integer (0 when CUDA is broken); cuda_error says why ("" when it works).
  j["machine"]["cuda_devices"] = gpus.is_ok() ? gpus.value() : 0;
  j["machine"]["cuda_error"] = gpus.is_ok() ? std::string() : gpus.status().message();
  j["machine"]["cuda_backend_built"] = gpu::cuda_backend_built();
  j["read_bandwidth_gbs"] = read_gbs;
  // The gather limit per dim (empty with --no-gather-probe), and the probe's method.
  j["machine"]["gather_limit"] = gather_limits_json(gather_limits);
  j["gather_probe"] = {
      {"ran", o.gather_probe},
      {"seconds", gather_probe_s},
      {"threads", probe_threads},
      {"method",
       "bare gather + sum-pool loop over the run's first batches (keys 'workload') and, for a "
       "skewed workload, uniform random rows in the same bags (keys 'uniform'); table as large as "
       "the workload's tables of that dim (at most 2 GiB), huge pages, accumulators in registers, "
       "rows prefetched into L2 24/48/96 keys ahead (the best kept); median of the timed passes, "
       "the statistic of the modes' forward step"},
      {"step_limit_lookups_per_s", step_limits.workload > 0 ? json(step_limits.workload) : json(nullptr)},
      {"step_uniform_limit_lookups_per_s", step_limits.uniform > 0 ? json(step_limits.uniform) : json(nullptr)},
      {"update_method",
       "each distinct row of the run's first batches read and written once (row and optimizer state), in the "
       "order of first use, on the same threads; prefetched into L2 24/48/96 rows ahead and for writing 8 ahead "
       "(the best kept); median of the timed passes"},
      {"step_floor_ms", step_limits.floor_s > 0 ? json(step_limits.floor_s * 1e3) : json(nullptr)}};
  j["machine"]["update_floor"] = update_floors_json(update_floors);
  j["memory_estimate"] = {{"host_bytes", mem.total},      {"tables_bytes", mem.tables},
                          {"device_bytes", mem.device},   {"batches_bytes", mem.batches},
                          {"available_bytes", available}, {"worst_mode", mem.worst_mode}};
  j["profile"] = json::parse(hardware_profile_to_json(profile.value()));
  j["results"] = json::array();
  for (const auto& r : results) j["results"].push_back(result_json(o, r, read_gbs, step_limits, profile.value(), true));
  j["sweep"] = json::array();
  // Distinct rows the run touched per slot pool: a point whose every pool holds them has only
  // first-use misses (say so: a larger cache cannot raise its hit rate).
  std::vector<std::int64_t> touched;
  if (!sweep_results.empty()) {
    const ModeDescriptor& cached = *find_mode("cached").value();
    auto c = make_config(o, cached, sweep_results.front().first);
    if (!c) return fail("sweep: " + c.status().to_string(), 1);
    auto t = touched_rows_per_pool(o, c.value(), batches);
    if (!t) return fail("sweep: " + t.status().to_string(), 1);
    touched = std::move(t).value();
    j["sweep_touched_rows"] = std::accumulate(touched.begin(), touched.end(), std::int64_t{0});
  }
  for (const auto& [f, r] : sweep_results) {
    json p;
    if (r.is_ok()) {
      p = result_json(o, r.value(), read_gbs, step_limits, profile.value(), false);
      p["cache_rows"] = r.value().cache_rows;
      p["cache_bytes"] = r.value().cache_bytes;
      p["skipped"] = nullptr;
    } else {
      p["mode"] = "cached";
      p["hit_rate"] = nullptr;
      p["skipped"] = r.status().message();
    }
    p["cache_fraction"] = f;
    auto c = make_config(o, *find_mode("cached").value(), f);
    if (!c) return fail("sweep: " + c.status().to_string(), 1);
    const std::vector<PoolSize> pools = slot_pools(c.value());
    bool holds = pools.size() == touched.size();
    for (std::size_t i = 0; holds && i < pools.size(); ++i) holds = pools[i].rows >= touched[i];
    p["holds_every_touched_row"] = holds;
    j["sweep"].push_back(p);
  }
  j["wall_s"] = seconds_since(wall0);

  // ---- console ----
  // The tail column is p99 only when enough timed steps back it; otherwise the maximum, so named.
  const bool p99 = static_cast<std::size_t>(o.steps) >= kStepsForP99;
  const char* tail = p99 ? "p99" : "max";
  const std::string fwd_tail = std::string("fwd ") + tail + " ms", trn_tail = std::string("trn ") + tail + " ms";
  std::printf("\n%-12s %14s %15s %12s %10s %10s %10s %10s %11s\n", "mode", "fwd lookups/s", "train lookups/s",
              "samples/s", "fwd p50 ms", fwd_tail.c_str(), "trn p50 ms", trn_tail.c_str(), "gather GB/s");
  for (const auto& m : j["results"])
    std::printf("%-12s %14.3e %15.3e %12.3e %10.2f %10.2f %10.2f %10.2f %11.2f\n", m["mode"].get<std::string>().c_str(),
                m["forward_lookups_per_s"].get<double>(), m["train_lookups_per_s"].get<double>(),
                m["samples_per_s"].get<double>(), m["forward_step_ms_p50"].get<double>(),
                m[p99 ? "forward_step_ms_p99" : "forward_step_ms_max"].get<double>(),
                m["train_step_ms_p50"].get<double>(), m[p99 ? "train_step_ms_p99" : "train_step_ms_max"].get<double>(),
                m["gather_gbs"].get<double>());
  if (!p99)
    std::printf("(%d timed steps: too few for a 99th percentile, so the slowest step is shown as max)\n", o.steps);
  const auto& res = j["results"];
  if (std::any_of(res.begin(), res.end(), [](const json& m) { return emulated(m["device"]); }))
    std::printf(
        "device modes ran on the EMULATED device (emu, no GPU): their times are this CPU running the GPU kernels' "
        "logic, not a GPU's; compare modes by their bytes per link and the modelled step times below\n");
  for (const auto& m : j["results"]) {
    const json& ph = m["train_phase_ms_p50"];
    std::printf("%-12s training step p50 by phase: submit %.2f ms, forward %.2f ms, backward+optimizer %.2f ms\n",
                m["mode"].get<std::string>().c_str(), ph["submit"].get<double>(), ph["forward"].get<double>(),
                ph["backward"].get<double>());
  }
  for (const auto& m : j["results"]) {
    if (!m.contains("dispatch")) continue;
    const json& d = m["dispatch"];
    std::printf(
        "%-12s all-to-all, rank 0 of %d (%s sharding), per step: %.2f MB sent and received (keys %.2f, rows %.2f, "
        "gradients %.2f), %.2f MB without dedup: dedup cuts %.2fx (batch duplication factor %.2fx); time: exchange "
        "%.2f ms, shard lookups %.2f ms, pooling and gradient sums at the source %.2f ms\n",
        m["mode"].get<std::string>().c_str(), d["ranks"].get<int>(), d["sharding"].get<std::string>().c_str(),
        d["bytes_per_step"]["total"].get<double>() / 1e6, d["bytes_per_step"]["keys"].get<double>() / 1e6,
        d["bytes_per_step"]["rows"].get<double>() / 1e6, d["bytes_per_step"]["grads"].get<double>() / 1e6,
        d["bytes_per_step"]["total_without_dedup"].get<double>() / 1e6, d["dedup_factor"].get<double>(),
        d["batch_duplication_factor"].get<double>(), d["ms_per_step"]["exchange"].get<double>(),
        d["ms_per_step"]["lookup"].get<double>(), d["ms_per_step"]["source"].get<double>());
  }
  std::printf("\n%-12s %8s %10s %10s %10s %10s %10s %10s  (MB per training step; trainer on the %s)\n", "mode",
              "hit rate", "H2D", "D2H", "HBM read", "HBM write", "host read", "host write", trainer_name(o.trainer));
  for (const auto& m : j["results"]) {
    const json& b = m["bytes_per_step"];
    char hit[16] = "-";
    if (m["hit_rate"].is_number()) std::snprintf(hit, sizeof hit, "%.1f%%", m["hit_rate"].get<double>() * 100);
    const std::string device = m["device"].get<std::string>();
    std::printf("%-12s %8s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f  %s\n", m["mode"].get<std::string>().c_str(), hit,
                b["h2d"].get<double>() / 1e6, b["d2h"].get<double>() / 1e6, b["hbm_read"].get<double>() / 1e6,
                b["hbm_write"].get<double>() / 1e6, b["host_read"].get<double>() / 1e6,
                b["host_write"].get<double>() / 1e6, device == "none" ? "" : ("device " + device).c_str());
  }
  for (const auto& m : j["results"]) {
    // Plans that did not fit beside the rows pinned by batches in flight wait for them to retire:
    // the run is right, but its prefetch overlapped less than the pipeline allows.
    const json* c = m.contains("cache") ? &m["cache"] : nullptr;
    if (c && c->contains("deferred") && (*c)["deferred"].get<std::int64_t>() > 0)
      std::printf(
          "%-12s %lld table plans waited for batches in flight to retire (the cache is small for --pipeline %d)\n",
          m["mode"].get<std::string>().c_str(), static_cast<long long>((*c)["deferred"].get<std::int64_t>()),
          o.pipeline);
    // Rows that did not fit the cache were read and updated outside it (CacheStats::bypassed).
    if (c && c->contains("bypassed") && (*c)["bypassed"].get<std::int64_t>() > 0)
      std::printf("%-12s %lld (batch, row) lookups bypassed the cache (it is small for the batches)\n",
                  m["mode"].get<std::string>().c_str(), static_cast<long long>((*c)["bypassed"].get<std::int64_t>()));
  }
  std::printf("sequential read bandwidth (same run, %d threads): %.2f GB/s\n", probe_threads, read_gbs);
  for (const GatherLimit& g : gather_limits)
    std::printf(
        "gather limit, dim %d (%lld-byte rows, %s keys, table of %lld rows%s, %d threads): %.3e lookups/s, %.2f GB/s "
        "(median of %d passes, prefetch %d ahead)\n",
        g.probe.dim, static_cast<long long>(g.probe.row_bytes), g.keys.c_str(),
        static_cast<long long>(g.probe.table_rows), g.folded ? ", workload tables folded in" : "", g.probe.threads,
        g.probe.lookups_per_s, g.probe.gb_per_s, g.probe.repetitions, g.probe.prefetch_distance);
  for (const auto& m : j["results"]) {
    if (!m["forward_fraction_of_gather_limit"].is_number()) continue;
    std::printf("%-12s forward at %.0f%% of the gather limit (%.3e lookups/s)", m["mode"].get<std::string>().c_str(),
                100 * m["forward_fraction_of_gather_limit"].get<double>(),
                m["gather_limit_lookups_per_s"].get<double>());
    if (m.contains("forward_fraction_of_uniform_gather_limit") &&
        m["forward_fraction_of_uniform_gather_limit"].is_number())
      std::printf(", %.0f%% of the uniform-random-row limit",
                  100 * m["forward_fraction_of_uniform_gather_limit"].get<double>());
    std::printf("\n");
  }
  for (const UpdateFloor& u : update_floors)
    std::printf(
        "update floor, dim %d (%lld-byte records, %.0f distinct rows per batch, %d threads): %.3e rows/s, %.2f GB/s "
        "read and written (median of %d passes, prefetch %d ahead)\n",
        u.dim, static_cast<long long>(u.probe.record_bytes), u.distinct_rows_per_batch, u.probe.threads,
        u.probe.rows_per_s, u.probe.gb_per_s, u.probe.repetitions, u.probe.prefetch_distance);
  for (const auto& m : j["results"]) {
    if (!m["train_fraction_of_step_floor"].is_number()) continue;
    std::printf("%-12s training step at %.0f%% of the step floor (gather + update floors %.2f ms, step p50 %.2f ms)\n",
                m["mode"].get<std::string>().c_str(), 100 * m["train_fraction_of_step_floor"].get<double>(),
                m["train_step_floor_ms"].get<double>(), m["train_step_ms_p50"].get<double>());
  }
  std::printf("\n%-12s %12s %12s %12s %12s  (memory)\n", "mode", "peak RSS", "RSS at start", "host tables",
              "peak device");
  for (const auto& m : j["results"]) {
    const bool dev = m["device"].get<std::string>() != "none";
    std::printf("%-12s %12s %12s %12s %12s\n", m["mode"].get<std::string>().c_str(),
                human_bytes(m["peak_host_bytes"].get<double>()).c_str(),
                human_bytes(m["host_rss_start_bytes"].get<double>()).c_str(),
                human_bytes(m["host_table_bytes"].get<double>()).c_str(),
                dev ? human_bytes(m["device_peak_bytes"].get<double>()).c_str() : "-");
  }
  std::printf(
      "peak RSS: process peak resident memory while the mode ran%s; the emulated device's memory is host "
      "memory and counts in it\n",
      results.front().peak_rss_per_mode ? "" : " (not resettable here: peak since the process started)");
  std::printf("\nmodelled on %s (byte counts of this run; see docs/bench.md):\n", profile.value().name.c_str());
  for (const auto& m : j["results"])
    std::printf("%-12s %8.2f ms  %s\n", m["mode"].get<std::string>().c_str(), m["modelled"]["step_ms"].get<double>(),
                m["modelled"]["explanation"].get<std::string>().c_str());
  if (!sweep.empty()) {
    std::printf("\ncache sweep: cached mode, policy %s, same batches (hit rate and throughput against cache size)\n",
                o.policy.c_str());
    std::printf("%9s %12s %10s %8s %14s %15s %10s %10s\n", "fraction", "cache rows", "cache MB", "hit rate",
                "fwd lookups/s", "train lookups/s", "trn p50 ms", "H2D MB");
    for (const auto& p : j["sweep"]) {
      if (!p["skipped"].is_null()) {
        std::printf("%9g  skipped: %s\n", p["cache_fraction"].get<double>(), p["skipped"].get<std::string>().c_str());
        continue;
      }
      std::printf("%9g %12lld %10.1f %7.1f%% %14.3e %15.3e %10.2f %10.2f%s\n", p["cache_fraction"].get<double>(),
                  static_cast<long long>(p["cache_rows"].get<std::int64_t>()), p["cache_bytes"].get<double>() / 1e6,
                  p["hit_rate"].get<double>() * 100, p["forward_lookups_per_s"].get<double>(),
                  p["train_lookups_per_s"].get<double>(), p["train_step_ms_p50"].get<double>(),
                  p["bytes_per_step"]["h2d"].get<double>() / 1e6,
                  p["holds_every_touched_row"].get<bool>() ? "  *" : "");
    }
    const auto& pts = j["sweep"];
    if (std::any_of(pts.begin(), pts.end(), [](const json& p) { return p["holds_every_touched_row"].get<bool>(); }))
      std::printf(
          "* the cache holds every one of the %lld distinct rows the run touched: its misses are first uses only, so "
          "a larger cache cannot raise the hit rate (run more --steps, or a workload with more distinct rows, to "
          "compare such sizes)\n",
          static_cast<long long>(j["sweep_touched_rows"].get<std::int64_t>()));
  }
  // Each file is written to a temporary file next to it, every write, the fsync and the close
  // checked, then renamed into place: a failed write (a full disk) leaves the old file or none.
  if (!o.json_out.empty()) {
    if (Status st = detail::write_file_atomic(o.json_out, j.dump(2) + "\n"); !st.is_ok())
      return fail("--json " + o.json_out + ": " + st.message(), 1);
    std::printf("wrote %s\n", o.json_out.c_str());
  }
  if (!o.html_out.empty()) {
    if (Status st = detail::write_file_atomic(o.html_out, render_html_report(report_document(j))); !st.is_ok())
      return fail("--html " + o.html_out + ": " + st.message(), 1);
    std::printf("wrote %s\n", o.html_out.c_str());
  }
  std::fprintf(stderr, "strata-bench: done in %.1f s\n", seconds_since(wall0));
  return 0;
}

// ---- flag checks (run while the command line is parsed: a usage error, exit 2) ----

// A decimal integer in [0, 2^64): the seed as written, never saturated, rewritten canonical (a
// transform: CLI11 alone would read "010" as octal).
CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const Result<std::uint64_t> v = parse_unsigned(text, std::numeric_limits<std::uint64_t>::max());
        if (!v) return v.status().message();
        text = std::to_string(*v);
        return "";
      },
      "UINT64");
}

// A number in (lo, hi] (never nan or infinite), quoted as written when refused; `desc` names it
// in --help.
CLI::Validator number_in(double lo, double hi, const std::string& what, const std::string& desc) {
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !(v > lo && v <= hi))
          return "'" + quote_prefix(text) + "' is not " + what;
        return "";
      },
      desc);
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
  using strata::bench::Options;
  using strata::bench::Trainer;
  Options o;
  o.workload = strata::bench::default_workload();
  for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
  CLI::App app{"strata-bench: compare Strata placement modes on the same workload (see docs/bench.md)"};
  // A flag given twice takes its last value, so wrappers (strata.sh) can pass defaults first.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option(
      "--workload", o.workload_file,
      "workload JSON file (keys: tables, rows, dim, batch, bag_size, bag_dist, dist, seed, distinct_batches); "
      "replaces the workload flags");
  auto* tables = app.add_option("--tables", o.table_set,
                                "table set: N (N tables of --rows x --dim), criteo (26 Criteo Kaggle-shaped tables, "
                                "--criteo-rows rows in total, dim --dim), criteo:TOTAL_ROWS, or a list "
                                "[NAME=]ROWS[xDIM],... (e.g. user=1000000x128,item=50000x32)")
                     ->capture_default_str();
  app.add_option("--criteo-rows", o.criteo_rows, "total rows of the built-in criteo table set")
      ->capture_default_str()
      ->transform(strata::bench::integer_in(1, kInt64Max, "ROWS >= 1"));
  auto* rows = app.add_option("--rows", o.workload.rows, "rows per table for --tables N (given alone: --tables 1)")
                   ->capture_default_str()
                   ->transform(strata::bench::integer_in(1, kInt64Max, "ROWS >= 1"));
  auto* dim =
      app.add_option("--dim", o.workload.dim, "embedding dimension (every table of criteo or N; default of list items)")
          ->capture_default_str();
  app.add_option("--batch", o.workload.batch, "bags (samples) per table per batch")
      ->capture_default_str()
      ->transform(strata::bench::integer_in(1, kInt64Max, "BAGS >= 1"));
  app.add_option("--pooling", o.workload.bag_size, "keys per bag (mean with --bag-dist uniform)")
      ->capture_default_str();
  app.add_option("--bag-dist", o.workload.bag_dist, "bag lengths: fixed | uniform (i.i.d. in [0, 2 x --pooling])")
      ->capture_default_str();
  app.add_option("--pooling-mode", o.pooling_mode, "sum | mean | none")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd | adagrad | rowwise_adagrad | adam")->capture_default_str();
  app.add_option("--dist", o.workload.dist, "uniform | zipf:ALPHA | drift:ALPHA:N (hot set moves every N steps)")
      ->capture_default_str();
  auto* distinct = app.add_option("--distinct-batches", o.workload.distinct_batches,
                                  "different batches generated (default 2 x (warmup + steps): no batch repeats; fewer "
                                  "are cycled)");
  app.add_option("--seed", o.workload.seed, "seed of the keys (an integer in [0, 2^64))")
      ->capture_default_str()
      ->transform(strata::bench::seed_check());
  app.add_option("--steps", o.steps, "timed steps per phase")
      ->capture_default_str()
      ->check(CLI::Range(1, strata::bench::kMaxSteps));
  app.add_option("--warmup", o.warmup, "untimed steps before each phase")
      ->capture_default_str()
      ->check(CLI::Range(0, strata::bench::kMaxSteps));
  app.add_option("--threads", o.threads,
                 "worker threads, at most " + std::to_string(strata::bench::kThreadsPerHardwareThread) +
                     " x the hardware threads; the read-bandwidth probe uses at most the hardware threads")
      ->capture_default_str();
  app.add_option("--modes", o.modes, "comma-separated modes: " + strata::bench::mode_names(", "))
      ->capture_default_str();
  app.add_option("--cache-fraction", o.cache_fraction, "cached: cache rows as a fraction of each table, in (0, 1]")
      ->capture_default_str()
      ->check(strata::bench::number_in(0, 1, "a fraction in (0, 1]", "FRACTION in (0, 1]"));
  app.add_option("--sweep-cache", o.sweep_cache,
                 "also run the cached mode at each of these cache fractions (e.g. 0.01,0.03,0.1,0.3): hit rate and "
                 "throughput against cache size");
  app.add_option("--policy", o.policy, "cached: lru | lfu | lookahead")->capture_default_str();
  std::string trainer = "device";
  app.add_option(
         "--trainer", trainer,
         "where the trainer's dense model lives: device (outputs and gradients in device memory, stream-ordered "
         "calls; cpu mode copies them to and from a device the bench opens) | host (host buffers)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  app.add_option("--lookahead", o.lookahead, "cached: batches the planner sees ahead")->capture_default_str();
  app.add_option("--preview", o.preview,
                 "cached lookahead: batches whose keys the trainer previews beyond those submitted (Store::preview), "
                 "so the planner sees lookahead + preview batches ahead")
      ->capture_default_str()
      ->check(CLI::Range(0, strata::kMaxPreview));
  app.add_option("--planner-partitions,--planner-shards", o.planner_partitions,
                 "cached: cores planning each slot pool; its slots are split into this many partitions by key hash, "
                 "planned in parallel (rows ranked within their partition)")
      ->capture_default_str()
      ->check(CLI::Range(1, strata::kMaxPlannerPartitions));
  app.add_option("--pipeline", o.pipeline, "batches prefetched ahead of forward (beyond the lookahead)")
      ->capture_default_str()
      ->check(CLI::Range(1, strata::bench::kMaxPipeline));
  app.add_option("--ranks", o.ranks,
                 "gpu/hybrid and --config (a config of gpu and hybrid tables, as strata-tune plan --ranks writes): "
                 "thread ranks, one store and device each, all-to-all between them")
      ->capture_default_str();
  app.add_option("--sharding", o.sharding, "gpu/hybrid: row | table | column | replicated")->capture_default_str();
  app.add_option("--comm-timeout", o.comm_timeout_s,
                 "gpu/hybrid with --ranks N > 1 or under mpirun: seconds a collective waits for the other ranks "
                 "before the run fails (a stopped or crashed rank ends the job instead of hanging it); the default, "
                 "two minutes, is far beyond a slow first step")
      ->capture_default_str()
      ->check(strata::bench::number_in(0, strata::bench::kMaxCommTimeoutS, "a number of seconds in (0, 86400]",
                                       "SECONDS in (0, 86400]"));
  auto* backend = app.add_option("--backend", o.backend, "device backend: auto | cuda | emu (overrides --config's)")
                      ->capture_default_str();
  auto* capacity = app.add_option("--device-capacity", o.device_capacity,
                                  "bytes of device memory to use (0: emu 4 GiB, cuda all free; overrides --config's)")
                       ->capture_default_str()
                       ->transform(strata::bench::integer_in(0, kInt64Max, "BYTES >= 0"));
  app.add_option("--json", o.json_out, "write results as JSON to this file");
  app.add_option("--html", o.html_out, "write a self-contained HTML report (SVG charts) to this file");
  app.add_option("--profile", o.profile,
                 "hardware profile for the modelled step time: h200-pcie5 | a100-pcie4 | dgx-a100 | dgx-h100 | FILE")
      ->capture_default_str();
  app.add_option("--read-probe-mib", o.read_probe_mib, "MiB read by the sequential read-bandwidth probe")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("!--no-gather-probe", o.gather_probe,
               "skip the random-row gather probe (a bare gather + sum-pool loop per dim, about 1 s per dim) and the "
               "forward's fraction of its limit");
  app.add_option("--dump-keys", o.dump_keys,
                 "write the generated batches in the raw STRKEYS1 format (for bench/peers; not with --trace/--criteo)");
  app.add_option("--dump-trace", o.dump_trace,
                 "write the run's batches as a STRTRACE file (docs/trace-format.md) that --trace replays");
  app.add_option("--trace", o.trace_file,
                 "replay this STRTRACE file's batches in every mode instead of generated keys; tables from its header, "
                 "dim --dim (or the --config's); read as the steps need them");
  app.add_option("--criteo", o.criteo_file,
                 "replay this Criteo TSV file (label, I1..I13, C1..C26 per line) in every mode: --batch samples per "
                 "batch, value v of column Ct keyed into table t's rows (docs/bench.md); tables: --tables (26)");
  app.add_flag("!--criteo-no-label", o.criteo_label, "--criteo: the lines have no label column (Kaggle's test.txt)");
  app.add_option("--config", o.config_file,
                 "also run this store config JSON as given (mixed placements, per-table caches, its own optimizer, "
                 "threads and cache settings) as a mode named after the file's stem; --modes may then be empty");
  app.add_flag("!--no-progress", o.progress, "hide the progress bars");
  if (const std::optional<int> code = strata::bench::parse_command_line(app, argc, argv, "strata-bench")) return *code;
  o.dim_given = dim->count() > 0;
  o.tables_given = tables->count() > 0 || rows->count() > 0;
  o.backend_given = backend->count() > 0;
  o.trainer = trainer == "host" ? Trainer::kHost : Trainer::kDevice;
  o.capacity_given = capacity->count() > 0;
  if (const strata::Status s = strata::bench::check_thread_count("--threads", o.threads, 1); !s.is_ok()) {
    std::cerr << "strata-bench: " << s.message() << "\n";
    return 2;
  }
  // Under mpirun with several processes, each process is a rank of the sharded modes; only rank 0
  // prints and writes files.
  if (strata::dispatch::launched_by_mpi()) {
    auto comm = strata::dispatch::make_mpi_communicator(strata::bench::comm_options(o));
    if (!comm) {
      std::cerr << "strata-bench: mpi: " << comm.status().to_string() << "\n";
      return 2;
    }
    if (comm.value()->size() > 1) {
      o.mpi = std::shared_ptr<strata::dispatch::Communicator>(std::move(comm).value());
      if (o.mpi->rank() != 0) {
        o.progress = false;
        o.json_out.clear();
        o.html_out.clear();
        o.dump_keys.clear();
        o.dump_trace.clear();
        if (!std::freopen("/dev/null", "w", stdout)) return 2;
      }
    }
  }
  // Every rank trains on its own batches: none repeats within a run.
  const int world = o.mpi ? o.mpi->size() : o.ranks;
  if (distinct->count() == 0) o.workload.distinct_batches = 2 * (o.warmup + o.steps) * world;
  // `--rows R` alone keeps its old meaning: one table of R rows.
  if (rows->count() > 0 && tables->count() == 0) o.table_set = "1";
  if (rows->count() > 0 && o.table_set.find_first_not_of("0123456789") != std::string::npos) {
    std::cerr << "strata-bench: --rows applies to --tables N only (got --tables " << o.table_set
              << "; give list items their rows, or use criteo:TOTAL_ROWS)\n";
    return 2;
  }
  const int code = strata::bench::run(o);
  if (o.mpi && code == 1) {
    // A run that failed (a collective timed out: a rank stopped or died) must end the job. A
    // normal exit would wait in MPI_Finalize for every rank, the stopped one too; ending without
    // it makes mpirun stop the whole job.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}
