// Benchmark of world checkpoints (issue 34): a world of N thread ranks (the `local` communicator) saves its tables into
// one directory and loads them back, for each N of --ranks, interleaved (round r runs every N once, then round r + 1),
// so that a drift of the machine's load touches every N alike. Per N it reports the median save and load times, their
// ratio to the first N's (N = 1 by default), and the bytes the save wrote (the files of the checkpoint: pieces,
// MANIFEST and any other) against the tables' bytes (rows x (dim weights of --dtype + optimizer state of
// --state-dtype), what a checkpoint holds of each element). The targets of issue 34:
// bytes written = the tables' bytes plus the manifest (ratio 1.0 + a little), not N times; a 4-rank save and load of
// row-sharded tables at most 0.4x the time of one rank's (which needs at least 4 cores: ranks are threads here).
//
// Tables: `gpu` or `hybrid` on the emu device (every rank's device is host memory), every rank's rows set once
// (write_shard) to values that differ per table, row and column, optimizer state too, and step 1. Each save goes into
// a fresh directory (removed after its load); the load reads what the page cache holds of the files just written.
// --warmup rounds run first and are not counted (the first save and load of a process pay one-time costs).
//
//   strata-micro-checkpoint --json out.json

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.hpp"
#include "dispatch/local_communicator.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t rows = 65536;  // per table
  int dim = 64;
  int tables = 4;
  std::string optimizer = "adagrad";
  std::string dtype = "fp32";        // of the rows
  std::string state_dtype = "fp32";  // of the optimizer state
  std::string placement = "hybrid";
  std::vector<std::string> shardings = {"row", "table"};
  std::vector<int> ranks = {1, 2, 4};
  int rounds = 3;
  int warmup = 1;   // rounds run first and not counted
  int threads = 1;  // kernel threads of each rank's store
  std::string dir;  // scratch directory (empty: one under the system's temporary directory)
  std::string json_out;
  bool progress = ::isatty(STDERR_FILENO) != 0;
};

// What one world of one case measured.
struct Sample {
  std::vector<double> save_s, load_s;
  std::int64_t written = 0, manifest = 0, pieces = 0;  // bytes of the last save: all files, MANIFEST, *.tbl
  int files = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// A value that differs per (table, row, column, block) and is exact in every dtype (8 significant bits): what rows and
// state hold.
float value_at(std::int64_t t, std::int64_t row, std::int64_t col, std::int64_t block) {
  return static_cast<float>((row * 131 + col * 7 + t * 17 + block * 3) % 251) / 64.0f;
}

Result<StoreConfig> make_config(const Options& o, dispatch::ShardingType type) {
  StoreConfig c;
  c.threads = o.threads;
  c.fake_numa_nodes = 1;  // thread ranks share one machine: no binding per rank
  c.device.backend = BackendChoice::kEmu;
  STRATA_ASSIGN_OR_RETURN(const Placement placement, parse_placement(o.placement));
  STRATA_ASSIGN_OR_RETURN(const OptimizerKind kind, parse_optimizer(o.optimizer));
  STRATA_ASSIGN_OR_RETURN(const DType dtype, parse_dtype(o.dtype));
  STRATA_ASSIGN_OR_RETURN(const DType state_dtype, parse_dtype(o.state_dtype));
  std::int64_t bytes = 0;  // as fp32: at least what the emu device holds of the records
  for (int t = 0; t < o.tables; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = o.rows;
    tc.spec.dim = o.dim;
    tc.spec.optimizer.kind = kind;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.spec.dtype = dtype;
    tc.spec.state_dtype = state_dtype;
    tc.placement = placement;
    if (placement == Placement::kHybrid) tc.cache.rows = 1024;
    tc.sharding.type = type;
    bytes += o.rows * (o.dim + optimizer_state_dim(kind, o.dim)) * static_cast<std::int64_t>(sizeof(float));
    c.tables.push_back(tc);
  }
  // Emu memory of a rank: every row for `gpu` (a replicated table's too), with room for its buffers.
  c.device.capacity = bytes + (std::int64_t{256} << 20);
  return c;
}

// A world of `n` thread ranks, each holding its store on its own thread for the world's lifetime; run() gives every
// rank the same job and returns when all did.
class World {
 public:
  using Job = std::function<Status(int rank, Store& store)>;

  static Result<std::unique_ptr<World>> open(int n, const StoreConfig& config) {
    dispatch::CommOptions co;
    co.timeout = std::chrono::minutes(2);
    STRATA_ASSIGN_OR_RETURN(auto comms, dispatch::make_local_group(n, co));
    std::unique_ptr<World> w(new World(n));
    for (int r = 0; r < n; ++r) {
      w->threads_.emplace_back([w = w.get(), r, &config,
                                comm = std::shared_ptr<dispatch::Communicator>(
                                    std::move(comms[static_cast<std::size_t>(r)]))] { w->rank_main(r, config, comm); });
    }
    STRATA_RETURN_IF_ERROR(w->run([](int, Store&) { return Status::ok(); }));  // every store opened
    return w;
  }

  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      ++posted_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs `job` on every rank; the first rank's error (by rank), else OK.
  Status run(Job job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = std::move(job);
    done_ = 0;
    ++posted_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ == n_; });
    for (int r = 0; r < n_; ++r) {
      if (!status_[static_cast<std::size_t>(r)].is_ok())
        return Status::from_code(status_[static_cast<std::size_t>(r)].code(),
                                 "rank " + std::to_string(r) + ": " + status_[static_cast<std::size_t>(r)].to_string());
    }
    return Status::ok();
  }

 private:
  explicit World(int n) : n_(n), status_(static_cast<std::size_t>(n)) {}

  void rank_main(int r, const StoreConfig& config, const std::shared_ptr<dispatch::Communicator>& comm) {
    Result<std::unique_ptr<Store>> opened = Store::open(config, comm);
    std::uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return posted_ != seen; });
      seen = posted_;
      if (quit_) return;
      Job job = job_;
      lock.unlock();
      Status s = opened ? job(r, *opened.value()) : opened.status();
      lock.lock();
      status_[static_cast<std::size_t>(r)] = std::move(s);
      if (++done_ == n_) cv_.notify_all();
    }
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t posted_ = 0;
  bool quit_ = false;
  Job job_;
  int done_ = 0;
  std::vector<Status> status_;
  std::vector<std::thread> threads_;
};

// Sets every row this rank holds (weights and state, value_at) and the step: local writes, then set_step.
Status fill_rows(int tables, Store& store) {
  constexpr std::int64_t kChunk = 8192;
  for (int t = 0; t < tables; ++t) {
    STRATA_ASSIGN_OR_RETURN(const ShardInfo info, store.shard_info(t));
    if (info.local_rows == 0 || info.local_dim == 0) continue;
    const std::int32_t sd =
        optimizer_state_dim(store.config().tables[static_cast<std::size_t>(t)].spec.optimizer.kind, info.local_dim);
    // State block b of a local column j is global state column b * dim + col_offset + j (store.hpp, read_shard).
    const std::int32_t blocks = sd / info.local_dim;
    std::vector<float> w, st;
    for (std::int64_t r0 = 0; r0 < info.local_rows; r0 += kChunk) {
      const std::int64_t n = std::min(kChunk, info.local_rows - r0);
      w.assign(static_cast<std::size_t>(n * info.local_dim), 0);
      st.assign(static_cast<std::size_t>(n * sd), 0);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t row = info.row_start + (r0 + i) * info.row_step;
        for (std::int32_t j = 0; j < info.local_dim; ++j)
          w[static_cast<std::size_t>(i * info.local_dim + j)] = value_at(t, row, info.col_offset + j, -1);
        for (std::int32_t j = 0; j < sd; ++j) {
          const int block = blocks > 0 ? j / info.local_dim : 0;
          st[static_cast<std::size_t>(i * sd + j)] = value_at(t, row, info.col_offset + j % info.local_dim, block);
        }
      }
      STRATA_RETURN_IF_ERROR(store.write_shard(t, r0, n, w.data(), sd ? st.data() : nullptr));
    }
  }
  return store.set_step(1);
}

// The first rows of each table this rank holds equal value_at after a load (a sample, not every row).
Status check_rows(int tables, Store& store) {
  for (int t = 0; t < tables; ++t) {
    STRATA_ASSIGN_OR_RETURN(const ShardInfo info, store.shard_info(t));
    if (info.local_rows == 0 || info.local_dim == 0) continue;
    const std::int64_t n = std::min<std::int64_t>(256, info.local_rows);
    std::vector<float> w(static_cast<std::size_t>(n * info.local_dim));
    STRATA_RETURN_IF_ERROR(store.read_shard(t, 0, n, w.data(), nullptr));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = info.row_start + i * info.row_step;
      for (std::int32_t j = 0; j < info.local_dim; ++j)
        if (w[static_cast<std::size_t>(i * info.local_dim + j)] != value_at(t, row, info.col_offset + j, -1))
          return Status::internal("table " + std::to_string(t) + " row " + std::to_string(row) + " differs after load");
    }
  }
  return store.step() == 1 ? Status::ok() : Status::internal("step " + std::to_string(store.step()) + " after load");
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sizes of the files of `dir` into `s`.
void count_files(const std::string& dir, Sample& s) {
  s.written = s.manifest = s.pieces = 0;
  s.files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto size = static_cast<std::int64_t>(e.file_size());
    const std::string name = e.path().filename().string();
    s.written += size;
    ++s.files;
    if (name == "MANIFEST") s.manifest += size;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tbl") == 0) s.pieces += size;
  }
}

struct CaseResult {
  std::string sharding;
  std::int64_t table_bytes = 0;
  std::vector<int> ranks;
  std::vector<Sample> samples;  // per ranks[i]
};

void progress(const Options& o, const std::string& what) {
  if (o.progress) std::fprintf(stderr, "\r%-60s", what.c_str());
}

Result<CaseResult> run_case(const Options& o, const std::string& sharding, const std::string& scratch) {
  STRATA_ASSIGN_OR_RETURN(const dispatch::ShardingType type, dispatch::parse_sharding(sharding));
  CaseResult out;
  out.sharding = sharding;
  out.ranks = o.ranks;
  std::vector<std::unique_ptr<World>> worlds;
  std::vector<StoreConfig> configs;  // outlive the worlds' opening
  configs.reserve(o.ranks.size());
  for (int n : o.ranks) {
    progress(o, sharding + ": opening and filling a world of " + std::to_string(n));
    STRATA_ASSIGN_OR_RETURN(StoreConfig config, make_config(o, type));
    configs.push_back(std::move(config));
    STRATA_ASSIGN_OR_RETURN(auto w, World::open(n, configs.back()));
    STRATA_RETURN_IF_ERROR(w->run([&](int, Store& s) { return fill_rows(o.tables, s); }));
    worlds.push_back(std::move(w));
  }
  for (const TableConfig& tc : configs.front().tables)
    out.table_bytes +=
        tc.spec.rows * (tc.spec.dim * element_bytes(tc.spec.dtype) +
                        optimizer_state_dim(tc.spec.optimizer.kind, tc.spec.dim) * element_bytes(tc.spec.state_dtype));
  out.samples.resize(o.ranks.size());
  for (int round = -o.warmup; round < o.rounds; ++round) {
    for (std::size_t i = 0; i < o.ranks.size(); ++i) {
      const std::string dir = scratch + "/" + sharding + "-n" + std::to_string(o.ranks[i]);
      fs::remove_all(dir);
      fs::create_directories(dir);
      const std::string label = sharding + (round < 0 ? " warm-up" : " round " + std::to_string(round + 1)) + "/" +
                                std::to_string(o.rounds) + ", " + std::to_string(o.ranks[i]) + " ranks: ";
      progress(o, label + "save");
      auto t0 = Clock::now();
      STRATA_RETURN_IF_ERROR(worlds[i]->run([&](int, Store& s) { return s.save(dir); }));
      const double save_s = seconds_since(t0);
      count_files(dir, out.samples[i]);
      progress(o, label + "load");
      t0 = Clock::now();
      STRATA_RETURN_IF_ERROR(worlds[i]->run([&](int, Store& s) { return s.load(dir); }));
      const double load_s = seconds_since(t0);
      if (round >= 0) {
        out.samples[i].save_s.push_back(save_s);
        out.samples[i].load_s.push_back(load_s);
      }
      if (round == o.rounds - 1)
        STRATA_RETURN_IF_ERROR(worlds[i]->run([&](int, Store& s) { return check_rows(o.tables, s); }));
      fs::remove_all(dir);
    }
  }
  progress(o, "");
  if (o.progress) std::fprintf(stderr, "\r");
  return out;
}

void print_case(const CaseResult& c) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("\n%s-sharded tables: %.1f MiB (rows x element bytes, optimizer state included)\n", c.sharding.c_str(),
              static_cast<double>(c.table_bytes) / kMiB);
  std::printf("%5s %12s %10s %10s %13s %11s %10s %10s %10s %10s\n", "ranks", "written MiB", "files", "manifest",
              "bytes/tables", "save p50 s", "x first", "load p50 s", "x first", "GiB/s s/l");
  const double save0 = median(c.samples.front().save_s), load0 = median(c.samples.front().load_s);
  for (std::size_t i = 0; i < c.ranks.size(); ++i) {
    const Sample& s = c.samples[i];
    const double save = median(s.save_s), load = median(s.load_s);
    const double gib = static_cast<double>(c.table_bytes) / (kMiB * 1024.0);
    std::printf("%5d %12.1f %10d %10lld %13.5f %11.3f %10.2f %10.3f %10.2f %4.2f/%4.2f\n", c.ranks[i],
                static_cast<double>(s.written) / kMiB, s.files, static_cast<long long>(s.manifest),
                static_cast<double>(s.written) / static_cast<double>(c.table_bytes), save, save / save0, load,
                load / load0, gib / save, gib / load);
  }
}

nlohmann::json to_json(const Options& o, const std::vector<CaseResult>& cases) {
  nlohmann::json j;
  j["tool"] = "strata-micro-checkpoint";
  j["options"] = {
      {"rows", o.rows},           {"dim", o.dim},     {"tables", o.tables},          {"optimizer", o.optimizer},
      {"placement", o.placement}, {"ranks", o.ranks}, {"rounds", o.rounds},          {"warmup", o.warmup},
      {"threads", o.threads},     {"dtype", o.dtype}, {"state_dtype", o.state_dtype}};
  j["cores"] = std::thread::hardware_concurrency();
  for (const CaseResult& c : cases) {
    nlohmann::json jc;
    jc["sharding"] = c.sharding;
    jc["table_bytes"] = c.table_bytes;
    const double save0 = median(c.samples.front().save_s), load0 = median(c.samples.front().load_s);
    for (std::size_t i = 0; i < c.ranks.size(); ++i) {
      const Sample& s = c.samples[i];
      jc["worlds"].push_back({{"ranks", c.ranks[i]},
                              {"bytes_written", s.written},
                              {"files", s.files},
                              {"manifest_bytes", s.manifest},
                              {"piece_bytes", s.pieces},
                              {"bytes_ratio", static_cast<double>(s.written) / static_cast<double>(c.table_bytes)},
                              {"save_s", s.save_s},
                              {"load_s", s.load_s},
                              {"save_median_s", median(s.save_s)},
                              {"load_median_s", median(s.load_s)},
                              {"save_ratio", median(s.save_s) / save0},
                              {"load_ratio", median(s.load_s) / load0}});
    }
    j["cases"].push_back(jc);
  }
  return j;
}

// Runs every case, prints each, writes --json; 0, or 1 after the first case that failed (named on stderr).
int run(const Options& o) {
  namespace fs = std::filesystem;
  const bool own_dir = o.dir.empty();
  const std::string scratch =
      own_dir ? (fs::temp_directory_path() / ("strata-micro-checkpoint-" + std::to_string(::getpid()))).string()
              : o.dir;
  fs::create_directories(scratch);
  std::printf("strata-micro-checkpoint: %d tables x %lld rows x dim %d (%s rows, %s %s state, %s on emu), ranks",
              o.tables, static_cast<long long>(o.rows), o.dim, o.dtype.c_str(), o.optimizer.c_str(),
              o.state_dtype.c_str(), o.placement.c_str());
  for (int n : o.ranks) std::printf(" %d", n);
  std::printf(", %d rounds interleaved after %d warm-up, %u cores, scratch %s\n", o.rounds, o.warmup,
              std::thread::hardware_concurrency(), scratch.c_str());
  std::vector<CaseResult> cases;
  int rc = 0;
  for (const std::string& sharding : o.shardings) {
    Result<CaseResult> c = run_case(o, sharding, scratch);
    if (!c) {
      std::fprintf(stderr, "strata-micro-checkpoint: %s: %s\n", sharding.c_str(), c.status().to_string().c_str());
      rc = 1;
      break;
    }
    print_case(c.value());
    cases.push_back(std::move(c).value());
  }
  if (own_dir) fs::remove_all(scratch);
  if (!o.json_out.empty() && !cases.empty()) {
    std::ofstream(o.json_out) << to_json(o, cases).dump(2) << "\n";
  }
  return rc;
}

}  // namespace
}  // namespace strata

namespace {

// Parses the options and runs; exceptions (CLI11's setup, the scratch directory's filesystem_error, bad_alloc) escape.
int parse_and_run(int argc, char** argv) {
  using namespace strata;
  Options o;
  CLI::App app{"World checkpoints: save and load time and bytes written per world size (thread ranks, emu device)"};
  app.add_option("--rows", o.rows, "rows of each table")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dim", o.dim, "dim of each table")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--tables", o.tables, "tables")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "sgd, adagrad, rowwise_adagrad or adam")->capture_default_str();
  app.add_option("--dtype", o.dtype, "element type of the rows: fp32, bf16 or fp16")->capture_default_str();
  app.add_option("--state-dtype", o.state_dtype, "element type of the optimizer state: fp32 or bf16 (adagrad, adam)")
      ->capture_default_str();
  app.add_option("--placement", o.placement, "gpu or hybrid (emu device)")->capture_default_str();
  app.add_option("--sharding", o.shardings, "cases: row, column, table, replicated")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--ranks", o.ranks, "world sizes; the first is the baseline of the ratios")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", o.rounds, "save+load of every world size per round")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "rounds run first, not counted")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "kernel threads of each rank's store (0: all cores)")->capture_default_str();
  app.add_option("--dir", o.dir, "scratch directory (default: a new one under the temporary directory, removed)");
  app.add_option("--json", o.json_out, "write the results as JSON to this file");
  app.add_flag("!--no-progress", o.progress, "no progress on stderr");
  CLI11_PARSE(app, argc, argv);
  return run(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return parse_and_run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-micro-checkpoint: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "strata-micro-checkpoint: unknown exception\n");
  }
  return 1;
}
