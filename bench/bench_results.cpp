#include "bench/bench_results.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "gpu/device.hpp"
#include "toolkit/workload.hpp"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

namespace strata::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
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

std::string iso_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

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

// A NumaPlacement: nodes of the host tables, the threads and the pinned staging (-1: not bound), and why it is less
// than asked.
json placement_json(const NumaPlacement& p) {
  return {
      {"memory_node", p.memory_node}, {"thread_node", p.thread_node}, {"pinned_node", p.pinned_node}, {"note", p.note}};
}

// Each engine's placement and each table of host rows with where a sample of its pages lies (StoreStats::numa_engines
// and numa_tables).
json numa_engines_json(const StoreStats& s) {
  json engines = json::array();
  for (const auto& [name, p] : s.numa_engines) {
    json e = {{"engine", name}};
    e.update(placement_json(p));
    engines.push_back(e);
  }
  return engines;
}
json numa_tables_json(const StoreStats& s) {
  json tables = json::array();
  for (const TableNuma& t : s.numa_tables) {
    json nodes = json::array();
    for (const auto& [node, pages] : t.pages.nodes) nodes.push_back({{"node", node}, {"pages", pages}});
    tables.push_back(
        {{"table", t.table},
         {"placement", t.placement},
         {"engine", t.engine},
         {"memory_node", t.memory_node},
         {"thread_node", t.thread_node},
         {"pages",
          {{"sampled", t.pages.sampled}, {"unfaulted", t.pages.unfaulted}, {"nodes", nodes}, {"note", t.pages.note}}}});
  }
  return tables;
}

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
          {"total_without_dedup", static_cast<double>(d.bytes_no_dedup) / steps},
          {"dynamic_admission", static_cast<double>(d.admission_bytes) / steps}}},
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
    json counters;
    cache::CacheStats::for_each_counter(
        [&](const char* key, std::int64_t cache::CacheStats::*n) { counters[key] = cs.*n; });
    m["cache"] = counters;
    m["cache"].update(json{{"policy", r.mode->from_config ? std::string(cache::to_string(cc.policy)) : o.policy},
                           {"lookahead", r.mode->from_config ? cc.lookahead : o.lookahead},
                           {"preview", r.mode->from_config ? cc.preview : o.preview},
                           {"planner_partitions", r.mode->from_config ? cc.planner_partitions : o.planner_partitions},
                           {"cache_fraction", r.mode->from_config ? json(nullptr) : json(r.cache_fraction)},
                           {"cache_rows", r.cache_rows},
                           {"cache_bytes", r.cache_bytes}});
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
  // Where the store's host tier lived (config `numa`, StoreStats::numa; one for all its engines):
  // nodes of its host tables, its threads and its pinned staging, -1 when not bound. Then per engine
  // and per table of host rows, with the nodes its sampled pages were on (this rank's, the first).
  m["numa"] = placement_json(r.train_stats.numa);
  m["numa_engines"] = numa_engines_json(r.train_stats);
  m["numa_tables"] = numa_tables_json(r.train_stats);
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

// Why a step's samples (the first mode's mean over its timed steps) differ from --batch, in words;
// null when they do not.
json samples_note(const ModeResult& r, const BatchSource& batches) {
  const SourceSummary& s = batches.summary();
  const std::string ranks =
      r.ranks > 1 ? " x " + std::to_string(r.ranks) + " ranks (each trains on its own batch)" : "";
  const bool uneven = batches.from_file() && s.min_batch_size < s.max_batch_size;
  if (!uneven) return r.ranks > 1 ? json("batch" + ranks) : json(nullptr);
  char buf[400];
  if (batches.kind() == "criteo") {
    std::snprintf(buf, sizeof buf,
                  "the mean over the timed steps%s: the file's %lld lines make %lld batches of --batch %lld, the last "
                  "holding the %lld left over, and the steps cycle through them",
                  ranks.c_str(), static_cast<long long>(s.samples), static_cast<long long>(batches.size()),
                  static_cast<long long>(s.max_batch_size), static_cast<long long>(s.min_batch_size));
  } else {
    std::snprintf(buf, sizeof buf,
                  "the mean over the timed steps%s: the trace's %lld batches hold %lld to %lld samples each",
                  ranks.c_str(), static_cast<long long>(batches.size()), static_cast<long long>(s.min_batch_size),
                  static_cast<long long>(s.max_batch_size));
  }
  return std::string(buf);
}

// The document's workload: its shape, where the batches came from, every table.
json workload_json(const Options& o, const RunRecord& run, const BatchSource& batches) {
  const std::vector<ModeResult>& results = run.results;
  json w = json::parse(workload_to_json(o.workload));
  w["table_set"] = run.table_set;
  w["total_rows"] = run.total_rows;
  w["pooling_mode"] = o.pooling_mode;
  w["optimizer"] = o.optimizer;
  w["dtype"] = o.dtype;
  w["state_dtype"] = o.state_dtype;
  w["output_dtype"] = o.output_dtype;
  w["dynamic"] = o.dynamic;
  w["steps"] = o.steps;
  w["warmup"] = o.warmup;
  w["steps_note"] = o.steps_note.empty() ? json(nullptr) : json(o.steps_note);
  w["keys_per_step"] = results.front().keys_per_step;
  w["source"] = {{"kind", batches.kind()},
                 {"path", batches.from_file() ? json(batches.path()) : json(nullptr)},
                 {"batches", batches.size()},
                 {"mean_keys_per_bag", batches.summary().mean_keys_per_bag},
                 {"max_batch_size", batches.summary().max_batch_size},
                 {"min_batch_size", batches.summary().min_batch_size},
                 {"samples", batches.summary().samples}};
  if (batches.from_file()) {
    // The keys are the file's: the generator's fields say nothing.
    for (const char* k : {"dist", "seed", "bag_dist"}) w[k] = nullptr;
    w["distinct_batches"] = batches.size();
    w["bag_size"] = batches.summary().mean_keys_per_bag;
  }
  w["samples_per_step"] = results.front().samples_per_step;
  w["samples_per_step_note"] = samples_note(results.front(), batches);
  if (!w["tables"].is_array()) {  // list every table, also for N identical ones
    w["tables"] = json::array();
    for (const auto& t : workload_tables(o.workload))
      w["tables"].push_back({{"name", t.name}, {"rows", t.rows}, {"dim", t.dim}});
  }
  for (json& t : w["tables"]) t["dtype"] = o.dtype;  // the report's table bytes count it
  return w;
}

// The document's settings: the flags that shape the run.
json settings_json(const Options& o, const RunRecord& run) {
  const std::vector<double>& sweep = run.sweep;
  json s = {{"modes", o.modes},
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
  s["comm_timeout_s"] = o.comm_timeout_s;
  s["hbm_budget"] = o.hbm_budget.empty() ? json(nullptr) : json(o.hbm_budget);
  s["host_budget"] = o.host_budget.empty() ? json(nullptr) : json(o.host_budget);
  return s;
}

// The document's machine, with what its probes measured, and the probes' method.
void add_machine(json& j, const Options& o, const RunRecord& run) {
  const MachineProbes& p = run.probes;
  j["read_probe_threads"] = p.threads;
  j["machine"] = to_json(run.machine);
  // cuda_devices stays an integer (0 when CUDA is broken); cuda_error says why ("" when it works).
  j["machine"]["cuda_devices"] = run.cuda_devices;
  j["machine"]["cuda_error"] = run.cuda_error;
  j["machine"]["cuda_backend_built"] = gpu::cuda_backend_built();
  j["read_bandwidth_gbs"] = p.read_gbs;
  // The gather limit per dim (empty with --no-gather-probe), and the probe's method.
  j["machine"]["gather_limit"] = gather_limits_json(p.gather_limits);
  j["gather_probe"] = {
      {"ran", o.gather_probe},
      {"seconds", p.gather_s},
      {"threads", p.threads},
      {"method",
       "bare gather + sum-pool loop over the run's first batches (keys 'workload') and, for a "
       "skewed workload, uniform random rows in the same bags (keys 'uniform'); table as large as "
       "the workload's tables of that dim (at most 2 GiB), huge pages, accumulators in registers, "
       "rows prefetched into L2 24/48/96 keys ahead (the best kept); median of the timed passes, "
       "the statistic of the modes' forward step"},
      {"step_limit_lookups_per_s", p.step_limits.workload > 0 ? json(p.step_limits.workload) : json(nullptr)},
      {"step_uniform_limit_lookups_per_s", p.step_limits.uniform > 0 ? json(p.step_limits.uniform) : json(nullptr)},
      {"update_method",
       "each distinct row of the run's first batches read and written once (row and optimizer state), in the "
       "order of first use, on the same threads; prefetched into L2 24/48/96 rows ahead and for writing 8 ahead "
       "(the best kept); median of the timed passes"},
      {"step_floor_ms", p.step_limits.floor_s > 0 ? json(p.step_limits.floor_s * 1e3) : json(nullptr)}};
  j["machine"]["update_floor"] = update_floors_json(p.update_floors);
}

// The mode's memory by the engine model against the budgets (absent when the model cannot price it).
void add_memory_fit(json& m, const Options& o, const ModeResult& r, const MemoryBudgets& budgets) {
  const Result<ModeMemory> mm = mode_memory(o, *r.mode, r.cache_fraction);
  if (mm) m["memory_fit"] = memory_fit_json(mm.value(), budgets);
}

// The sweep's points: each one's results (or why it was skipped) and whether it holds every row
// the run touched.
json sweep_json(const Options& o, const RunRecord& run) {
  json a = json::array();
  for (const SweepPoint& point : run.sweep_points) {
    const Result<ModeResult>& r = point.result;
    json p;
    if (r.is_ok()) {
      p = result_json(o, r.value(), run.probes.read_gbs, run.probes.step_limits, run.profile, false);
      add_memory_fit(p, o, r.value(), run.budgets);
      p["cache_rows"] = r.value().cache_rows;
      p["cache_bytes"] = r.value().cache_bytes;
      p["skipped"] = nullptr;
    } else {
      p["mode"] = "cached";
      p["hit_rate"] = nullptr;
      p["skipped"] = r.status().message();
    }
    p["cache_fraction"] = point.fraction;
    p["holds_every_touched_row"] = point.holds_every_touched_row;
    a.push_back(p);
  }
  return a;
}

// The workload table as people read it: what the generator's fields are for a file's keys (the
// JSON keeps them null), the mean bag rounded, and why a step's samples differ from --batch.
json readable_workload(json w) {
  const json src = w["source"];
  const std::string kind = src.is_object() && src["kind"].is_string() ? src["kind"].get<std::string>() : "";
  if (src.is_object() && src["batches"].is_number()) {  // one line, not a JSON object
    const std::string n = std::to_string(src["batches"].get<std::int64_t>());
    w["source"] = kind == "generated" ? "generated: " + n + " distinct batches"
                                      : kind + " " + src["path"].get<std::string>() + ": " + n + " batches read (" +
                                            std::to_string(src["samples"].get<std::int64_t>()) + " samples)";
  }
  if (kind == "criteo" || kind == "trace") {
    const std::string file = kind == "criteo" ? "the Criteo file" : "the trace";
    w["dist"] = "from " + file + " (its keys, not generated)";
    w["seed"] = "none: the keys are " + file + "'s";
    w["bag_dist"] = "from " + file + " (each bag as long as it is there)";
    if (w["bag_size"].is_number()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.2f keys per bag (the mean of %s)", w["bag_size"].get<double>(),
                    kind == "criteo" ? "the file's lines" : "the trace's bags");
      w["bag_size"] = buf;
    }
    if (w["batch"].is_number())
      w["batch"] = std::to_string(w["batch"].get<std::int64_t>()) +
                   (kind == "criteo" ? " lines per batch (--batch)" : " samples at most (the trace's largest batch)");
  }
  if (w["samples_per_step_note"].is_string() && w["samples_per_step"].is_number())
    w["samples_per_step"] = std::to_string(w["samples_per_step"].get<std::int64_t>()) + ": " +
                            w["samples_per_step_note"].get<std::string>();
  w.erase("samples_per_step_note");
  if (w["steps_note"].is_string()) {
    w["steps"] = std::to_string(w["steps"].get<int>()) + " (" + w["steps_note"].get<std::string>() + ")";
  }
  w.erase("steps_note");
  return w;
}

}  // namespace

json results_document(const Options& o, const RunRecord& run, const BatchSource& batches) {
  json j;
  j["tool"] = "strata-bench";
  j["version"] = STRATA_VERSION;
  j["command"] = o.argv;
  j["started_at"] = run.started_at;
  j["workload"] = workload_json(o, run, batches);
  j["threads"] = o.threads;
  j["settings"] = settings_json(o, run);
  add_machine(j, o, run);
  const MemoryEstimate& mem = run.mem;
  j["memory_estimate"] = {{"host_bytes", mem.total},          {"tables_bytes", mem.tables},
                          {"device_bytes", mem.device},       {"batches_bytes", mem.batches},
                          {"available_bytes", run.available}, {"worst_mode", mem.worst_mode}};
  j["profile"] = json::parse(hardware_profile_to_json(run.profile));
  j["results"] = json::array();
  for (const auto& r : run.results) {
    j["results"].push_back(result_json(o, r, run.probes.read_gbs, run.probes.step_limits, run.profile, true));
    add_memory_fit(j["results"].back(), o, r, run.budgets);
  }
  // Distinct rows the run touched per slot pool: a point whose every pool holds them has only
  // first-use misses (say so: a larger cache cannot raise its hit rate).
  if (!run.sweep_points.empty()) j["sweep_touched_rows"] = run.sweep_touched_rows;
  j["sweep"] = sweep_json(o, run);
  j["verdict"] = verdict_json(j, run.budgets, run.profile.name);
  return j;
}

// The HTML report's document (toolkit/report_html.hpp) from the JSON results.
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
    if (w[k].is_number()) w[k] = static_cast<std::int64_t>(std::llround(w[k].get<double>()));
  report["workload"] = readable_workload(w);
  // The verdict's text (bench_verdict.hpp), shown first.
  const json& v = j["verdict"];
  report["verdict"] = {
      {"headline", v["headline"]}, {"lines", v["lines"]}, {"decided_by", v["decided_by"]}, {"mode", v["mode"]}};
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
    // The model's memory against the budgets, and whether the verdict chose this run.
    if (m.contains("memory_fit")) rm["memory_fit"] = m["memory_fit"];
    const json& v = j["verdict"];
    const json fraction = m.contains("cache") ? m["cache"]["cache_fraction"] : json(nullptr);
    rm["chosen"] = v["mode"] == m["mode"] && v["cache_fraction"] == fraction;
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
                          "holds_every_touched_row", "memory_fit"})
      if (p.contains(k) && !p[k].is_null()) rp[k] = p[k];
    report["sweep"].push_back(rp);
  }
  return report;
}

}  // namespace strata::bench
