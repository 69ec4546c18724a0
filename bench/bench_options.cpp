#include "bench/bench_options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "dispatch/mpi_communicator.hpp"
#include "gpu/device.hpp"
#include "toolkit/batch_source.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/cli_flags.hpp"
#include "toolkit/machine_info.hpp"

namespace strata::bench {
namespace {

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

}  // namespace

bool sharded(const ModeDescriptor& m) {
  return !m.from_config && (m.placement == Placement::kGpu || m.placement == Placement::kHybrid);
}
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

const std::string& table_of(const Options& o, const std::string& feature) {
  const auto it = o.feature_table.find(feature);
  return it == o.feature_table.end() ? feature : it->second;
}

WorkloadSpec default_workload() {
  WorkloadSpec w;
  w.dim = 64;
  w.batch = 8192;
  w.bag_size = 1;
  w.dist = "zipf:0.9";
  return w;
}

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
  STRATA_ASSIGN_OR_RETURN(const DType dtype, parse_dtype(o.dtype));
  STRATA_ASSIGN_OR_RETURN(const DType state_dtype, parse_dtype(o.state_dtype));
  STRATA_ASSIGN_OR_RETURN(const DType output_dtype, parse_dtype(o.output_dtype));
  for (const TableShape& shape : workload_tables(o.workload)) {
    TableConfig tc;
    tc.spec.name = shape.name;
    tc.spec.rows = shape.rows;
    tc.spec.dim = shape.dim;
    tc.spec.pooling = pooling;
    tc.spec.optimizer.kind = optimizer;
    tc.spec.dtype = dtype;
    tc.spec.state_dtype = state_dtype;
    tc.spec.output_dtype = output_dtype;
    tc.spec.optimizer.learning_rate = 0.01f;
    tc.spec.init.seed = o.workload.seed;
    tc.placement = mode.placement;
    if (o.dynamic) tc.dynamic = DynamicSpec{};
    if (const auto f = o.table_features.find(shape.name); f != o.table_features.end())
      for (const std::string& name : f->second) tc.features.push_back({name, std::nullopt});
    if (caches(mode)) tc.cache.fraction = cache_fraction;
    if (sharded(mode)) {
      STRATA_ASSIGN_OR_RETURN(tc.sharding.type, dispatch::parse_sharding(o.sharding));
      // A dynamic table row-sharded needs a row per rank (dispatch::validate_dynamic_plan): smaller ones go whole to
      // one rank.
      if (o.dynamic && tc.sharding.type == dispatch::ShardingType::kRow && tc.spec.rows < o.ranks)
        tc.sharding.type = dispatch::ShardingType::kTable;
      // Over ranks a hash spreads a batch's keys unevenly over the shards, each of capacity / ranks rows: a table whose
      // batches use most of its rows needs headroom (a quarter more) for its fullest shard.
      if (o.dynamic && o.ranks > 1 && tc.sharding.type == dispatch::ShardingType::kRow)
        tc.spec.rows += (tc.spec.rows + 3) / 4;
    }
    c.tables.push_back(tc);
  }
  STRATA_RETURN_IF_ERROR(validate(c));
  return c;
}

namespace {

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

// The options whose presence (or text) run() reads after parsing.
struct FlagHandles {
  CLI::Option* tables = nullptr;
  CLI::Option* rows = nullptr;
  CLI::Option* dim = nullptr;
  CLI::Option* distinct = nullptr;
  CLI::Option* backend = nullptr;
  CLI::Option* capacity = nullptr;
  CLI::Option* steps = nullptr;
  CLI::Option* warmup = nullptr;
  std::string trainer = "device";
};

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// The workload's flags: tables, batches, keys, optimizer, steps and threads.
void add_workload_flags(CLI::App& app, Options& o, FlagHandles& h) {
  app.add_option(
      "--workload", o.workload_file,
      "workload JSON file (keys: tables, rows, dim, batch, bag_size, bag_dist, dist, seed, distinct_batches); "
      "replaces the workload flags");
  h.tables = app.add_option("--tables", o.table_set,
                            "table set: N (N tables of --rows x --dim), criteo (26 Criteo Kaggle-shaped tables, "
                            "--criteo-rows rows in total, dim --dim), criteo:TOTAL_ROWS, or a list "
                            "[NAME=]ROWS[xDIM],... (e.g. user=1000000x128,item=50000x32); with --trace or --criteo "
                            "also a mapping of the file's features to tables, TABLE=FEATURE[+FEATURE...],... (e.g. "
                            "item=clicked+bought; Criteo's features are its columns C1..C26; features left out are "
                            "tables of their own)")
                 ->capture_default_str();
  app.add_option("--criteo-rows", o.criteo_rows, "total rows of the built-in criteo table set")
      ->capture_default_str()
      ->transform(integer_in(1, kInt64Max, "ROWS >= 1"));
  h.rows = app.add_option("--rows", o.workload.rows, "rows per table for --tables N (given alone: --tables 1)")
               ->capture_default_str()
               ->transform(integer_in(1, kInt64Max, "ROWS >= 1"));
  h.dim =
      app.add_option("--dim", o.workload.dim, "embedding dimension (every table of criteo or N; default of list items)")
          ->capture_default_str();
  app.add_option("--batch", o.workload.batch, "bags (samples) per table per batch")
      ->capture_default_str()
      ->transform(integer_in(1, kInt64Max, "BAGS >= 1"));
  app.add_option("--pooling", o.workload.bag_size, "keys per bag (mean with --bag-dist uniform)")
      ->capture_default_str();
  app.add_option("--bag-dist", o.workload.bag_dist, "bag lengths: fixed | uniform (i.i.d. in [0, 2 x --pooling])")
      ->capture_default_str();
  app.add_option("--pooling-mode", o.pooling_mode, "sum | mean | none")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd | adagrad | rowwise_adagrad | adam")->capture_default_str();
  const auto dtypes = CLI::IsMember({"fp32", "bf16", "fp16"});
  app.add_option("--dtype", o.dtype, "element type of every table's rows: fp32 | bf16 | fp16")
      ->capture_default_str()
      ->check(dtypes);
  app.add_option("--state-dtype", o.state_dtype,
                 "element type of every table's optimizer state: fp32 | bf16 (adagrad and adam only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--output-dtype", o.output_dtype,
                 "element type of every table's outputs and gradients: fp32 | bf16 | fp16")
      ->capture_default_str()
      ->check(dtypes);
  app.add_flag(
      "--dynamic", o.dynamic,
      "dynamic tables (capacity = rows), keys spread over [0, 2^63) with the workload's skew; with --ranks N > 1 "
      "and row sharding, capacity = rows + a quarter (the hash's uneven spread over the shards), and a table "
      "of fewer than N rows is sharded table-wise");
  app.add_option("--dist", o.workload.dist, "uniform | zipf:ALPHA | drift:ALPHA:N (hot set moves every N steps)")
      ->capture_default_str();
  h.distinct = app.add_option("--distinct-batches", o.workload.distinct_batches,
                              "different batches generated (default 2 x (warmup + steps): no batch repeats; fewer "
                              "are cycled)");
  app.add_option("--seed", o.workload.seed, "seed of the keys (an integer in [0, 2^64))")
      ->capture_default_str()
      ->transform(seed_check());
  h.steps = app.add_option("--steps", o.steps,
                           "timed steps per phase (not given: fitted to a --trace or --criteo file too short for it)")
                ->capture_default_str()
                ->check(CLI::Range(1, kMaxSteps));
  h.warmup = app.add_option("--warmup", o.warmup,
                            "untimed steps before each phase (not given: fitted to a file too short for it)")
                 ->capture_default_str()
                 ->check(CLI::Range(0, kMaxSteps));
  app.add_option("--threads", o.threads,
                 "worker threads, at most " + std::to_string(kThreadsPerHardwareThread) +
                     " x the hardware threads; the read-bandwidth probe uses at most the hardware threads")
      ->capture_default_str();
}

// The modes' flags: which modes, their caches, pipeline, trainer, ranks and device.
void add_mode_flags(CLI::App& app, Options& o, FlagHandles& h) {
  app.add_option("--modes", o.modes, "comma-separated modes: " + mode_names(", "))->capture_default_str();
  app.add_option("--cache-fraction", o.cache_fraction, "cached: cache rows as a fraction of each table, in (0, 1]")
      ->capture_default_str()
      ->check(number_in(0, 1, "a fraction in (0, 1]", "FRACTION in (0, 1]"));
  app.add_option("--sweep-cache", o.sweep_cache,
                 "also run the cached mode at each of these cache fractions (e.g. 0.01,0.03,0.1,0.3): hit rate and "
                 "throughput against cache size");
  app.add_option("--policy", o.policy, "cached: lru | lfu | lookahead")->capture_default_str();
  app.add_option(
         "--trainer", h.trainer,
         "where the trainer's dense model lives: device (outputs and gradients in device memory, stream-ordered "
         "calls; cpu mode copies them to and from a device the bench opens) | host (host buffers)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  app.add_option("--lookahead", o.lookahead, "cached: batches the planner sees ahead")->capture_default_str();
  app.add_option("--preview", o.preview,
                 "cached lookahead: batches whose keys the trainer previews beyond those submitted (Store::preview), "
                 "so the planner sees lookahead + preview batches ahead")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxPreview));
  app.add_option("--planner-partitions,--planner-shards", o.planner_partitions,
                 "cached: cores planning each slot pool; its slots are split into this many partitions by key hash, "
                 "planned in parallel (rows ranked within their partition)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxPlannerPartitions));
  app.add_option("--pipeline", o.pipeline, "batches prefetched ahead of forward (beyond the lookahead)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxPipeline));
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
      ->check(number_in(0, kMaxCommTimeoutS, "a number of seconds in (0, 86400]", "SECONDS in (0, 86400]"));
  h.backend = app.add_option("--backend", o.backend, "device backend: auto | cuda | emu (overrides --config's)")
                  ->capture_default_str();
  h.capacity = app.add_option("--device-capacity", o.device_capacity,
                              "bytes of device memory to use (0: emu 4 GiB, cuda all free; overrides --config's)")
                   ->capture_default_str()
                   ->transform(integer_in(0, kInt64Max, "BYTES >= 0"));
}

// The inputs and outputs: files replayed or run as given, reports written, probes and profile.
void add_io_flags(CLI::App& app, Options& o) {
  app.add_option("--json", o.json_out, "write results as JSON to this file");
  app.add_option("--html", o.html_out, "write a self-contained HTML report (SVG charts) to this file");
  app.add_option("--profile", o.profile,
                 "hardware profile for the modelled step time: h200-pcie5 | a100-pcie4 | dgx-a100 | dgx-h100 | FILE")
      ->capture_default_str();
  app.add_option("--hbm-budget", o.hbm_budget,
                 "HBM each mode may use per rank (GPU) for the verdict, e.g. 8MB or 80GB (default: the profile's, of "
                 "one GPU); modes that need more are marked and never chosen");
  app.add_option("--host-budget", o.host_budget,
                 "host memory each mode may use per rank for the verdict (default: the profile's, over min(ranks, "
                 "gpus))");
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
}

// Under mpirun with several processes, each process is a rank of the sharded modes; only rank 0
// prints and writes files. An exit code when the communicator cannot be made.
std::optional<int> join_mpi_world(Options& o) {
  if (!dispatch::launched_by_mpi()) return std::nullopt;
  auto comm = dispatch::make_mpi_communicator(comm_options(o));
  if (!comm) {
    std::cerr << "strata-bench: mpi: " << comm.status().to_string() << "\n";
    return 2;
  }
  if (comm.value()->size() <= 1) return std::nullopt;
  o.mpi = std::shared_ptr<dispatch::Communicator>(std::move(comm).value());
  if (o.mpi->rank() != 0) {
    o.progress = false;
    o.json_out.clear();
    o.html_out.clear();
    o.dump_keys.clear();
    o.dump_trace.clear();
    if (!std::freopen("/dev/null", "w", stdout)) return 2;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"strata-bench: compare Strata placement modes on the same workload (see docs/bench.md)"};
  // A flag given twice takes its last value, so wrappers (strata.sh) can pass defaults first.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  FlagHandles h;
  add_workload_flags(app, o, h);
  add_mode_flags(app, o, h);
  add_io_flags(app, o);
  if (const std::optional<int> code = parse_command_line(app, argc, argv, "strata-bench")) return *code;
  o.dim_given = h.dim->count() > 0;
  o.tables_given = h.tables->count() > 0 || h.rows->count() > 0;
  o.backend_given = h.backend->count() > 0;
  o.trainer = h.trainer == "host" ? Trainer::kHost : Trainer::kDevice;
  o.capacity_given = h.capacity->count() > 0;
  o.steps_given = h.steps->count() > 0;
  o.warmup_given = h.warmup->count() > 0;
  if (const Status s = check_thread_count("--threads", o.threads, 1); !s.is_ok()) {
    std::cerr << "strata-bench: " << s.message() << "\n";
    return 2;
  }
  if (const std::optional<int> code = join_mpi_world(o)) return *code;
  // Every rank trains on its own batches: none repeats within a run.
  const int world = o.mpi ? o.mpi->size() : o.ranks;
  if (h.distinct->count() == 0) o.workload.distinct_batches = 2 * (o.warmup + o.steps) * world;
  // `--rows R` alone keeps its old meaning: one table of R rows.
  if (h.rows->count() > 0 && h.tables->count() == 0) o.table_set = "1";
  if (h.rows->count() > 0 && o.table_set.find_first_not_of("0123456789") != std::string::npos) {
    std::cerr << "strata-bench: --rows applies to --tables N only (got --tables " << o.table_set
              << "; give list items their rows, or use criteo:TOTAL_ROWS)\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace strata::bench
