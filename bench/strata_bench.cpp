// strata-bench: runs the same sequence of batches through each placement mode and reports
// throughput, latency percentiles and the gather's bandwidth next to the machine's sequential read
// bandwidth measured in the same run, plus the bytes each mode moves per step over every link
// (device layer counters) and the cache hit rate. Modes: cpu, offload (device reads host rows
// zero-copy), offload-cpu (CPU pools, outputs go H2D), cached; gpu/hybrid come with dispatch.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "bench/machine_info.hpp"
#include "bench/report_html.hpp"
#include "gpu/device.hpp"
#include "bench/workload.hpp"
#include "store/cost_model.hpp"
#include "store/store.hpp"

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

// A one-line progress bar on stderr (only when stderr is a terminal, or always with --progress).
class Progress {
 public:
  Progress(std::string label, int total, bool enabled) : label_(std::move(label)), total_(total), enabled_(enabled) {}
  void tick(int done) {
    if (!enabled_) return;
    const int width = 30;
    const int filled = total_ ? done * width / total_ : width;
    std::fprintf(stderr, "\r  %-22s [%s%s] %d/%d", label_.c_str(), std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total_);
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int total_;
  bool enabled_;
};

struct Options {
  WorkloadSpec workload;
  std::string workload_file;
  std::string modes = "cpu,offload,offload-cpu,cached";
  double cache_fraction = 0.3;  // the default uniform workload pins ~2 x 245k rows of 2M in flight
  std::string policy = "lru";
  int lookahead = 0;
  int pipeline = 2;
  std::string backend = "auto";
  std::int64_t device_capacity = 0;
  std::string pooling_mode = "sum";
  std::string optimizer = "sgd";
  int steps = 20;
  int warmup = 3;
  int threads = 2;
  std::string json_out;
  std::string html_out;
  std::string profile = "h200-pcie5";
  std::string dump_keys;
  bool progress = true;
};

struct ModeResult {
  std::string mode;
  std::vector<double> forward_s, train_s;
  std::vector<double> submit_s, lookup_s, backward_s;  // phases of the training step
  double keys_per_step = 0, samples_per_step = 0;
  double setup_s = 0;
  StoreStats train_stats;  // counters over the timed training steps only
  std::string device;
  std::size_t device_peak_bytes = 0;
};

// "offload-cpu" is the offload placement with CPU gathering; every other mode is a placement.
Result<Placement> mode_placement(const std::string& mode) {
  return mode == "offload-cpu" ? Result<Placement>(Placement::kOffload) : parse_placement(mode);
}

StoreStats stats_delta(const StoreStats& after, const StoreStats& before) {
  StoreStats d = after;
  d.links = after.links - before.links;
  for (std::size_t i = 0; i < d.cache.size() && i < before.cache.size(); ++i) d.cache[i].second -= before.cache[i].second;
  return d;
}

Result<StoreConfig> make_config(const Options& o, const std::string& mode) {
  STRATA_ASSIGN_OR_RETURN(Placement placement, mode_placement(mode));
  StoreConfig c;
  c.threads = o.threads;
  STRATA_ASSIGN_OR_RETURN(c.device.backend, parse_backend(o.backend));
  c.device.capacity = o.device_capacity;
  // The emulated device's default 1 GiB is a test size; emulate a GPU-sized memory (host RAM is
  // only used as far as it is allocated). Real GPUs keep all of their free memory.
  const bool emu = c.device.backend == BackendChoice::kEmu || (c.device.backend == BackendChoice::kAuto && gpu::cuda_device_count() == 0);
  if (c.device.capacity == 0 && emu) c.device.capacity = std::int64_t{4} << 30;
  c.offload_gather = mode == "offload-cpu" ? OffloadGather::kCpu : OffloadGather::kDevice;
  STRATA_ASSIGN_OR_RETURN(c.cache.policy, cache::parse_policy(o.policy));
  c.cache.lookahead = o.lookahead;
  c.cache.max_in_flight = std::max(8, o.lookahead + o.pipeline + 1);
  for (int t = 0; t < o.workload.tables; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = o.workload.rows;
    tc.spec.dim = o.workload.dim;
    STRATA_ASSIGN_OR_RETURN(tc.spec.pooling, parse_pooling(o.pooling_mode));
    STRATA_ASSIGN_OR_RETURN(tc.spec.optimizer.kind, parse_optimizer(o.optimizer));
    tc.spec.optimizer.learning_rate = 0.01f;
    tc.spec.init.seed = o.workload.seed;
    tc.placement = placement;
    if (placement == Placement::kCached) tc.cache.fraction = o.cache_fraction;
    c.tables.push_back(tc);
  }
  STRATA_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<ModeResult> run_mode(const Options& o, const std::string& mode, const std::vector<KeyBatch>& batches) {
  STRATA_ASSIGN_OR_RETURN(StoreConfig config, make_config(o, mode));
  ModeResult r;
  r.mode = mode;
  const auto t0 = Clock::now();
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(config));
  r.setup_s = seconds_since(t0);

  // Output and gradient buffers shaped like the first batch (every batch has the same shape).
  std::vector<std::vector<float>> out(batches.front().features.size()), grad(out.size());
  std::vector<MatrixView> out_views;
  std::vector<ConstMatrixView> grad_views;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& spec = config.tables[i].spec;
    const std::int64_t rows = output_rows(batches.front().features[i], spec.pooling);
    out[i].resize(static_cast<std::size_t>(rows * spec.dim));
    grad[i].resize(out[i].size());
    for (auto& g : grad[i]) g = u(rng);
    out_views.push_back({out[i].data(), rows, spec.dim});
    grad_views.push_back({grad[i].data(), rows, spec.dim});
  }
  r.keys_per_step = static_cast<double>(batches.front().total_keys());
  r.samples_per_step = static_cast<double>(batches.front().batch_size());

  std::int64_t id = 0;
  Progress fwd(mode + " forward", o.warmup + o.steps, o.progress);
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const KeyBatch& kb = batches[static_cast<std::size_t>(s) % batches.size()];
    const auto t = Clock::now();
    STRATA_RETURN_IF_ERROR(store->submit(id, kb));
    STRATA_RETURN_IF_ERROR(store->forward(id, out_views));
    STRATA_RETURN_IF_ERROR(store->discard(id));
    if (s >= o.warmup) r.forward_s.push_back(seconds_since(t));
    ++id;
    fwd.tick(s + 1);
  }
  // Training keeps `depth` batches submitted ahead of the one being computed (the lookahead window
  // plus the prefetch pipeline), as a trainer would; the step time is submit(i + depth) + forward(i)
  // + backward(i).
  const int depth = o.lookahead + o.pipeline;
  const int total = o.warmup + o.steps;
  auto batch_of = [&](int s) -> const KeyBatch& { return batches[static_cast<std::size_t>(s) % batches.size()]; };
  const std::int64_t base = id;
  for (int s = 0; s < std::min(depth - 1, total); ++s) STRATA_RETURN_IF_ERROR(store->submit(base + s, batch_of(s)));
  Progress train(mode + " train", total, o.progress);
  StoreStats before;
  for (int s = 0; s < total; ++s) {
    if (s == o.warmup) before = store->stats();
    const auto t = Clock::now();
    if (s + depth - 1 < total) STRATA_RETURN_IF_ERROR(store->submit(base + s + depth - 1, batch_of(s + depth - 1)));
    const auto t1 = Clock::now();
    STRATA_RETURN_IF_ERROR(store->forward(base + s, out_views));
    const auto t2 = Clock::now();
    STRATA_RETURN_IF_ERROR(store->backward(base + s, grad_views));
    if (s >= o.warmup) {
      r.train_s.push_back(seconds_since(t));
      r.submit_s.push_back(std::chrono::duration<double>(t1 - t).count());
      r.lookup_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      r.backward_s.push_back(seconds_since(t2));
    }
    train.tick(s + 1);
  }
  r.train_stats = stats_delta(store->stats(), before);
  r.device = r.train_stats.device;
  r.device_peak_bytes = r.train_stats.device_peak_bytes;
  STRATA_RETURN_IF_ERROR(store->flush());
  return r;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);)
    if (!p.empty()) parts.push_back(p);
  return parts;
}

int run(const Options& o_in) {
  Options o = o_in;
  if (!o.workload_file.empty()) {
    std::ifstream in(o.workload_file);
    if (!in) {
      std::cerr << "strata-bench: cannot open workload file '" << o.workload_file << "'\n";
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    auto w = parse_workload_json(ss.str());
    if (!w) {
      std::cerr << "strata-bench: " << o.workload_file << ": " << w.status().message() << "\n";
      return 2;
    }
    o.workload = w.value();
  }
  // Check everything before any long work starts.
  if (Status s = validate(o.workload); !s.is_ok()) {
    std::cerr << "strata-bench: " << s.message() << "\n";
    return 2;
  }
  const auto modes = split(o.modes, ',');
  if (modes.empty()) {
    std::cerr << "strata-bench: --modes is empty (expected e.g. cpu)\n";
    return 2;
  }
  for (const auto& m : modes) {
    if (auto p = mode_placement(m); !p) {
      std::cerr << "strata-bench: " << p.status().message() << "\n";
      return 2;
    }
  }
  if (auto c = make_config(o, modes.front()); !c) {
    std::cerr << "strata-bench: " << c.status().message() << "\n";
    return 2;
  }
  // --profile NAME (bench/profiles/NAME.json) or a file path.
  const std::string profile_path = std::ifstream(o.profile).good() ? o.profile : std::string(STRATA_PROFILE_DIR) + "/" + o.profile + ".json";
  auto profile = load_hardware_profile(profile_path);
  if (!profile) {
    std::cerr << "strata-bench: --profile " << o.profile << ": " << profile.status().message()
              << " (expected h200-pcie5, a100-pcie4, dgx-a100, dgx-h100 or a profile JSON file)\n";
    return 2;
  }
  const MachineInfo machine = describe_machine();
  const double table_bytes = static_cast<double>(o.workload.tables) * static_cast<double>(o.workload.rows) *
                             static_cast<double>(o.workload.dim) * 4.0 * (o.optimizer == "adam" ? 3 : o.optimizer == "adagrad" ? 2 : 1);
  if (table_bytes > 0.8 * static_cast<double>(machine.memory_available_bytes)) {
    std::fprintf(stderr, "strata-bench: the tables need %.1f GiB but only %.1f GiB of memory is available\n",
                 table_bytes / (1 << 30), static_cast<double>(machine.memory_available_bytes) / (1 << 30));
    return 2;
  }

  std::vector<std::string> names;
  for (int t = 0; t < o.workload.tables; ++t) names.push_back("t" + std::to_string(t));
  std::fprintf(stderr, "strata-bench: %d table(s) x %lld rows x dim %d, batch %lld x %d keys, %s, %d steps, %d threads\n",
               o.workload.tables, static_cast<long long>(o.workload.rows), o.workload.dim,
               static_cast<long long>(o.workload.batch), o.workload.bag_size, o.workload.dist.c_str(), o.steps, o.threads);
  const auto batches = make_batches(o.workload, names, o.threads);
  if (!o.dump_keys.empty()) {
    if (Status s = write_batches_raw(o.dump_keys, batches); !s.is_ok()) {
      std::cerr << "strata-bench: " << s.message() << "\n";
      return 1;
    }
  }
  std::fprintf(stderr, "  measuring sequential read bandwidth...\n");
  const double read_gbs = measure_read_bandwidth_gbs(std::size_t{1} << 30, o.threads);

  std::vector<ModeResult> results;
  for (const auto& m : modes) {
    auto r = run_mode(o, m, batches);
    if (!r) {
      std::cerr << "strata-bench: mode " << m << ": " << r.status().to_string() << "\n";
      return 1;
    }
    results.push_back(std::move(r).value());
  }

  json j;
  j["tool"] = "strata-bench";
  j["workload"] = json::parse(workload_to_json(o.workload));
  j["workload"]["pooling_mode"] = o.pooling_mode;
  j["workload"]["optimizer"] = o.optimizer;
  j["workload"]["steps"] = o.steps;
  j["workload"]["warmup"] = o.warmup;
  j["threads"] = o.threads;
  j["machine"] = to_json(machine);
  j["read_bandwidth_gbs"] = read_gbs;
  j["results"] = json::array();
  j["profile"] = json::parse(hardware_profile_to_json(profile.value()));
  json report;  // the HTML report's schema (bench/report_html.hpp)
  report["title"] = "strata-bench: " + o.modes;
  report["machine"] = to_json(machine);
  report["workload"] = j["workload"];
  report["modes"] = json::array();
  std::printf("\n%-12s %14s %14s %12s %10s %10s %10s %10s %11s\n", "mode", "fwd lookups/s", "train lookups/s", "samples/s",
              "fwd p50 ms", "fwd p99 ms", "trn p50 ms", "trn p99 ms", "gather GB/s");
  for (const auto& r : results) {
    const double f50 = percentile(r.forward_s, 0.5), t50 = percentile(r.train_s, 0.5);
    const double gather_gbs = r.keys_per_step * o.workload.dim * 4.0 / f50 / 1e9;
    json m;
    m["mode"] = r.mode;
    m["forward_lookups_per_s"] = r.keys_per_step / f50;
    m["train_lookups_per_s"] = r.keys_per_step / t50;
    m["samples_per_s"] = r.samples_per_step / t50;
    m["forward_step_ms_p50"] = f50 * 1e3;
    m["forward_step_ms_p99"] = percentile(r.forward_s, 0.99) * 1e3;
    m["train_step_ms_p50"] = t50 * 1e3;
    m["train_step_ms_p99"] = percentile(r.train_s, 0.99) * 1e3;
    m["gather_gbs"] = gather_gbs;
    m["gather_fraction_of_read_bandwidth"] = gather_gbs / read_gbs;
    m["setup_s"] = r.setup_s;
    m["train_phase_ms_p50"] = {{"submit", percentile(r.submit_s, 0.5) * 1e3},
                               {"forward", percentile(r.lookup_s, 0.5) * 1e3},
                               {"backward", percentile(r.backward_s, 0.5) * 1e3}};
    const double steps = static_cast<double>(std::max<std::size_t>(1, r.train_s.size()));
    const gpu::LinkBytes& lb = r.train_stats.links;
    m["bytes_per_step"] = {{"hbm_read", static_cast<double>(lb.hbm_read) / steps},
                           {"hbm_write", static_cast<double>(lb.hbm_write) / steps},
                           {"h2d", static_cast<double>(lb.h2d) / steps},
                           {"d2h", static_cast<double>(lb.d2h) / steps},
                           {"host_read", static_cast<double>(lb.host_read_total()) / steps},
                           {"host_write", static_cast<double>(lb.host_write_total()) / steps}};
    cache::CacheStats cs;
    for (const auto& [name, st] : r.train_stats.cache) cs += st;
    if (!r.train_stats.cache.empty()) {
      m["hit_rate"] = cs.hit_rate();
      m["cache"] = {{"accesses", cs.accesses}, {"hits", cs.hits}, {"misses", cs.misses}, {"evictions", cs.evictions},
                    {"writebacks", cs.writebacks}, {"policy", o.policy}, {"lookahead", o.lookahead},
                    {"cache_fraction", o.cache_fraction}};
    }
    m["device"] = r.device;
    m["device_peak_bytes"] = r.device_peak_bytes;
    StepBytes sb;
    sb.hbm_read = static_cast<double>(lb.hbm_read) / steps;
    sb.hbm_write = static_cast<double>(lb.hbm_write) / steps;
    sb.h2d = static_cast<double>(lb.h2d) / steps;
    sb.d2h = static_cast<double>(lb.d2h) / steps;
    sb.host_read = static_cast<double>(lb.host_read_total()) / steps;
    sb.host_write = static_cast<double>(lb.host_write_total()) / steps;
    // Host-side kernels (the CPU gather of cpu/offload-cpu, the CPU optimizer of cpu/offload/
    // offload-cpu) have no counters: add their row traffic (an upper bound: every key's row once).
    const double row_bytes = r.keys_per_step * o.workload.dim * 4.0;
    if (r.mode == "cpu" || r.mode == "offload-cpu") sb.host_read += row_bytes;
    if (r.mode == "cpu" || r.mode == "offload" || r.mode == "offload-cpu") {
      sb.host_read += row_bytes;
      sb.host_write += row_bytes;
    }
    const ModelledStep ms = model_step(profile.value(), sb);
    m["modelled"] = {{"profile", profile.value().name}, {"step_ms", ms.step_s * 1e3}, {"serial_ms", ms.serial_s * 1e3},
                     {"bottleneck", ms.bottleneck}, {"explanation", ms.explanation}};
    json rm = {{"mode", r.mode},
               {"forward_lookups_per_s", r.keys_per_step / f50},
               {"train_lookups_per_s", r.keys_per_step / t50},
               {"samples_per_s", r.samples_per_step / t50},
               {"step_ms_p50", t50 * 1e3},
               {"step_ms_p99", percentile(r.train_s, 0.99) * 1e3},
               {"peak_device_bytes", r.device_peak_bytes},
               {"bytes_per_step", m["bytes_per_step"]},
               {"modelled", m["modelled"]}};
    if (m.contains("hit_rate")) rm["hit_rate"] = m["hit_rate"];
    report["modes"].push_back(rm);
    m["forward_step_s"] = r.forward_s;
    m["train_step_s"] = r.train_s;
    j["results"].push_back(m);
    std::printf("%-12s %14.3e %14.3e %12.3e %10.2f %10.2f %10.2f %10.2f %11.2f\n", r.mode.c_str(), r.keys_per_step / f50,
                r.keys_per_step / t50, r.samples_per_step / t50, f50 * 1e3, percentile(r.forward_s, 0.99) * 1e3, t50 * 1e3,
                percentile(r.train_s, 0.99) * 1e3, gather_gbs);
  }
  for (const auto& r : results)
    std::printf("%-12s training step p50 by phase: submit %.2f ms, forward %.2f ms, backward+optimizer %.2f ms\n",
                r.mode.c_str(), percentile(r.submit_s, 0.5) * 1e3, percentile(r.lookup_s, 0.5) * 1e3,
                percentile(r.backward_s, 0.5) * 1e3);
  std::printf("\n%-12s %8s %12s %12s %12s %12s %12s %12s  (MB per training step)\n", "mode", "hit rate", "H2D", "D2H",
              "HBM read", "HBM write", "host read", "host write");
  for (const auto& r : results) {
    const double steps = static_cast<double>(std::max<std::size_t>(1, r.train_s.size()));
    const gpu::LinkBytes& lb = r.train_stats.links;
    cache::CacheStats cs;
    for (const auto& [name, st] : r.train_stats.cache) cs += st;
    char hit[16] = "-";
    if (!r.train_stats.cache.empty()) std::snprintf(hit, sizeof hit, "%.1f%%", cs.hit_rate() * 100);
    auto mb = [&](std::uint64_t b) { return static_cast<double>(b) / steps / 1e6; };
    std::printf("%-12s %8s %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f  %s\n", r.mode.c_str(), hit, mb(lb.h2d), mb(lb.d2h),
                mb(lb.hbm_read), mb(lb.hbm_write), mb(lb.host_read_total()), mb(lb.host_write_total()),
                r.device.empty() ? "" : ("device " + r.device).c_str());
  }
  std::printf("sequential read bandwidth (same run, %d threads): %.2f GB/s\n", o.threads, read_gbs);
  std::printf("\nmodelled on %s (byte counts of this run; see docs/bench.md):\n", profile.value().name.c_str());
  for (const auto& m : j["results"])
    std::printf("%-12s %8.2f ms  %s\n", m["mode"].get<std::string>().c_str(), m["modelled"]["step_ms"].get<double>(),
                m["modelled"]["explanation"].get<std::string>().c_str());
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    f << j.dump(2) << "\n";
    if (!f) {
      std::cerr << "strata-bench: cannot write " << o.json_out << "\n";
      return 1;
    }
    std::printf("wrote %s\n", o.json_out.c_str());
  }
  if (!o.html_out.empty()) {
    if (Status st = write_html_report(o.html_out, report); !st.is_ok()) {
      std::cerr << "strata-bench: " << st.message() << "\n";
      return 1;
    }
    std::printf("wrote %s\n", o.html_out.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using strata::bench::Options;
  Options o;
  CLI::App app{"strata-bench: compare Strata placement modes on the same workload"};
  app.add_option("--workload", o.workload_file, "workload JSON file (keys: tables, rows, dim, batch, bag_size, dist, seed, distinct_batches)");
  app.add_option("--tables", o.workload.tables, "number of tables")->capture_default_str();
  app.add_option("--rows", o.workload.rows, "rows per table")->capture_default_str();
  app.add_option("--dim", o.workload.dim, "embedding dimension")->capture_default_str();
  app.add_option("--batch", o.workload.batch, "bags per table per batch")->capture_default_str();
  app.add_option("--pooling", o.workload.bag_size, "keys per bag")->capture_default_str();
  app.add_option("--pooling-mode", o.pooling_mode, "sum | mean | none")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd | adagrad | rowwise_adagrad | adam")->capture_default_str();
  app.add_option("--dist", o.workload.dist, "uniform | zipf:ALPHA")->capture_default_str();
  app.add_option("--distinct-batches", o.workload.distinct_batches, "different batches generated (steps cycle them)")->capture_default_str();
  app.add_option("--seed", o.workload.seed, "seed of the keys")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per phase")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps before each phase")->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads")->capture_default_str();
  app.add_option("--modes", o.modes, "comma-separated modes: cpu, offload, offload-cpu, cached")->capture_default_str();
  app.add_option("--cache-fraction", o.cache_fraction, "cached: cache rows as a fraction of each table")->capture_default_str();
  app.add_option("--policy", o.policy, "cached: lru | lfu | lookahead")->capture_default_str();
  app.add_option("--lookahead", o.lookahead, "cached: batches the planner sees ahead")->capture_default_str();
  app.add_option("--pipeline", o.pipeline, "batches prefetched ahead of forward (beyond the lookahead)")->capture_default_str();
  app.add_option("--backend", o.backend, "device backend: auto | cuda | emu")->capture_default_str();
  app.add_option("--device-capacity", o.device_capacity, "bytes of device memory to use (0: emu 4 GiB, cuda all free)")->capture_default_str();
  app.add_option("--json", o.json_out, "write results as JSON to this file");
  app.add_option("--html", o.html_out, "write a self-contained HTML report (SVG charts) to this file");
  app.add_option("--profile", o.profile, "hardware profile for the modelled step time: h200-pcie5 | a100-pcie4 | dgx-a100 | dgx-h100 | FILE")
      ->capture_default_str();
  app.add_option("--dump-keys", o.dump_keys, "write the batches in the raw trace format (for bench/peers)");
  app.add_flag("!--no-progress", o.progress, "hide the progress bars");
  CLI11_PARSE(app, argc, argv);
  if (o.steps < 1 || o.warmup < 0 || o.threads < 1) {
    std::cerr << "strata-bench: --steps must be >= 1, --warmup >= 0, --threads >= 1\n";
    return 2;
  }
  return strata::bench::run(o);
}
