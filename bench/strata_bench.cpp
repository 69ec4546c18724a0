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
//
// The program in files by job: bench_options (the command line, the modes, each mode's store
// config), bench_inputs (--config, --trace, --criteo, the profile, the outputs' paths),
// bench_memory (the memory guard and the caches' check), bench_probes (the machine's gather limit
// and update floor), bench_modes (running a mode), bench_results (the JSON and the HTML report's
// document), bench_console (the console tables); here the run's phases in order, and main.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_console.hpp"
#include "bench/bench_inputs.hpp"
#include "bench/bench_memory.hpp"
#include "bench/bench_modes.hpp"
#include "bench/bench_options.hpp"
#include "bench/bench_probes.hpp"
#include "bench/bench_results.hpp"
#include "gpu/device.hpp"
#include "store/io/file_io.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/cli_flags.hpp"
#include "toolkit/feature_tables.hpp"
#include "toolkit/machine_info.hpp"
#include "toolkit/profiles.hpp"
#include "toolkit/report_html.hpp"
#include "toolkit/workload.hpp"

namespace strata::bench {
namespace {

int fail(const std::string& message, int code = 2) {
  std::cerr << "strata-bench: " << message << "\n";
  return code;
}

// ---- check everything before any long work starts ----

// The workload (--workload, --tables, --config's tables, or a --trace or --criteo file, opened and
// checked now) and the run's table set.
int read_workload(Options& o, RunRecord& run, std::optional<BatchSource>& source) {
  if (o.ranks < 1 || o.ranks > 64) return fail("--ranks " + std::to_string(o.ranks) + " must be in [1, 64]");
  std::string& table_set = run.table_set;
  table_set = o.table_set;
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
    // A mapping of a file's features to tables: --trace takes no table set, so any NAME=... is one.
    if (o.tables_given &&
        (is_table_mapping(table_set) || (!o.trace_file.empty() && table_set.find('=') != std::string::npos))) {
      if (o.trace_file.empty() && o.criteo_file.empty())
        return fail("--tables " + quote_prefix(table_set) +
                    ": a mapping of features to tables (TABLE=FEATURE[+FEATURE...]) applies to --trace and --criteo "
                    "files (without one, expected a table set: N, criteo, criteo:TOTAL_ROWS or [NAME=]ROWS[xDIM],...)");
      auto mapping = parse_table_mapping(table_set);
      if (!mapping) return fail("--tables: " + mapping.status().message());
      o.feature_map = std::move(mapping).value();
      table_set = "criteo";  // a Criteo file's columns C1..C26, of the criteo set
    }
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
  if (!o.trace_file.empty() || !o.criteo_file.empty()) {
    auto src = open_file_source(o, table_set, world);
    if (!src) return fail(src.status().message());
    source = std::move(src).value();
  }
  if (!o.config_file.empty()) {
    if (Status s = check_config_tables(o.config, workload_tables(o.workload), o.table_features); !s.is_ok())
      return fail("--config " + o.config_file + ": " + s.message());
  }
  return 0;
}

// The modes to run (--modes, and --config's), each mode's config made once to check it, and the
// sweep's fractions.
int choose_modes(const Options& o, bool from_file, std::vector<const ModeDescriptor*>& modes, RunRecord& run) {
  if (auto t = dispatch::parse_sharding(o.sharding); !t) return fail("--sharding: " + t.status().message());
  for (const auto& name : split_list(o.modes)) {
    if (name.empty()) continue;
    auto m = find_mode(name);
    if (!m) return fail("--modes: " + m.status().message());
    if (std::find(modes.begin(), modes.end(), m.value()) == modes.end()) modes.push_back(m.value());
  }
  if (!o.config_file.empty()) modes.push_back(&o.config_mode);
  if (from_file && !o.dump_keys.empty())
    return fail("--dump-keys writes generated batches; with --trace or --criteo use --dump-trace");
  if (o.mpi && from_file) return fail("--trace and --criteo run on one process (not under mpirun)");
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
  if (!o.sweep_cache.empty()) {
    auto f = parse_fractions(o.sweep_cache);
    if (!f) return fail(f.status().message());
    run.sweep = f.value();
  }
  return 0;
}

// Outputs that cannot be written are found now, not after every mode ran; and the profile.
int check_outputs_and_profile(const Options& o, RunRecord& run) {
  for (const auto& [flag, path, replaced] :
       {std::make_tuple("--json", o.json_out, true), std::make_tuple("--html", o.html_out, true),
        std::make_tuple("--dump-keys", o.dump_keys, false), std::make_tuple("--dump-trace", o.dump_trace, false)}) {
    if (path.empty()) continue;
    if (Status s = check_output_path(flag, path, replaced); !s.is_ok()) return fail(s.message());
  }
  // --profile NAME (NAME.json in the profiles folder, toolkit/profiles.hpp) or a file path.
  auto profile = load_profile(profile_path(o.profile));
  if (!profile)
    return fail("--profile " + o.profile + ": " + profile.status().message() +
                " (expected h200-pcie5, a100-pcie4, dgx-a100, dgx-h100 or a profile JSON file)");
  run.profile = std::move(profile).value();
  auto budgets = memory_budgets(o, run.profile);
  if (!budgets) return fail(budgets.status().message());
  run.budgets = budgets.value();
  return 0;
}

// The device the modes need, and the memory guard: the run's estimate against the machine's
// available memory and the emulated device's capacity.
int check_device_and_memory(const Options& o, const std::vector<const ModeDescriptor*>& modes, RunRecord& run) {
  run.machine = describe_machine();
  auto backend = parse_backend(o.backend);
  const Result<int> gpus = gpu::cuda_devices();
  const bool emu = backend.value() == BackendChoice::kEmu ||
                   (backend.value() == BackendChoice::kAuto && gpus.is_ok() && gpus.value() == 0);
  const bool need_device = !run.sweep.empty() || std::any_of(modes.begin(), modes.end(),
                                                             [](const ModeDescriptor* m) { return m->uses_device; });
  if (need_device && backend.value() != BackendChoice::kEmu && !gpus.is_ok())
    return fail("--backend " + o.backend + ": " + gpus.status().message() +
                " (expected a working CUDA setup, or --backend emu, or only --modes cpu)");
  if (need_device && backend.value() == BackendChoice::kCuda && gpus.value() == 0)
    return fail(std::string("--backend cuda: ") +
                (gpu::cuda_backend_built() ? "no CUDA device is visible" : "this build has no CUDA backend") +
                " (expected --backend auto or emu, or only --modes cpu)");
  run.cuda_devices = gpus.is_ok() ? gpus.value() : 0;
  run.cuda_error = gpus.is_ok() ? std::string() : gpus.status().message();
  run.mem = estimate_memory(o, modes, run.sweep, emu);
  const MemoryEstimate& mem = run.mem;
  run.available = static_cast<double>(run.machine.memory_available_bytes);
  const double available = run.available;
  if (available > 0 && mem.total > usable_memory_bytes(run.machine)) {
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
  return 0;
}

// One line on stderr: the tables, the batches, the steps and the memory the run will take.
void print_workload_line(const Options& o, RunRecord& run, const std::optional<BatchSource>& source) {
  const auto shapes = workload_tables(o.workload);
  std::int64_t& total_rows = run.total_rows;
  total_rows = 0;
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
               shapes.size(), run.table_set.c_str(), static_cast<long long>(total_rows),
               static_cast<long long>(min_rows), static_cast<long long>(max_rows), dim_text.c_str(), keys_text, o.steps,
               o.threads, human_bytes(run.mem.total).c_str());
}

// The batches (generated now unless a file gives them; --dump-keys, --dump-trace), and every cache
// checked against a step's rows: a mode's refused, a sweep point's skipped (`sweep_skipped`).
int prepare_batches(const Options& o, const std::vector<const ModeDescriptor*>& modes, const RunRecord& run,
                    std::optional<BatchSource>& source, std::vector<std::string>& sweep_skipped) {
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
  const std::vector<double>& sweep = run.sweep;
  sweep_skipped.assign(sweep.size(), std::string());
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    Result<std::string> why = cached_too_small(o, sweep[i], batches);
    if (!why) return fail(why.status().message(), 1);
    sweep_skipped[i] = *why;
  }
  return 0;
}

// ---- the run ----

// The machine's read bandwidth, gather limit and update floor under the run's first batches.
int measure_machine(const Options& o, const BatchSource& batches, MachineProbes& p) {
  std::fprintf(stderr, "  measuring sequential read bandwidth...\n");
  // More reading threads than hardware threads would measure the scheduler, not the memory.
  p.threads = std::min(o.threads, hardware_threads());
  const int probe_threads = p.threads;
  p.read_gbs = measure_read_bandwidth_gbs(static_cast<std::size_t>(o.read_probe_mib) << 20, probe_threads);
  // The gather limit: a bare gather + sum-pool loop over the run's first batches, on the same
  // threads, before any store exists (its table is freed before the modes run).
  if (o.gather_probe) {
    std::fprintf(stderr, "  measuring the random-row gather limit...\n");
    const auto t0 = Clock::now();
    auto g = measure_gather_limits(o, batches.head(), probe_threads);
    if (!g) return fail(g.status().message(), 1);
    p.gather_limits = std::move(g).value();
    p.gather_s = seconds_since(t0);
    p.step_limits.workload = step_gather_limit(o, p.gather_limits, batches.head().front(), "workload");
    p.step_limits.uniform = step_gather_limit(o, p.gather_limits, batches.head().front(), "uniform");
    std::fprintf(stderr, "  measuring the update floor...\n");
    auto u = measure_update_floors(o, batches.head(), probe_threads);
    if (!u) return fail(u.status().message(), 1);
    p.update_floors = std::move(u).value();
    p.gather_s = seconds_since(t0);
    p.step_limits.floor_s = step_floor_s(o, p.gather_limits, p.update_floors, batches.head().front());
  }
  return 0;
}

// Every mode on the same batches.
int run_modes(const Options& o, const std::vector<const ModeDescriptor*>& modes, const BatchSource& batches,
              RunRecord& run) {
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const std::string label = "[" + std::to_string(i + 1) + "/" + std::to_string(modes.size()) + "] " + modes[i]->name;
    auto r = run_mode(o, *modes[i], modes[i]->from_config ? 0.0 : o.cache_fraction, batches, label);
    if (!r) return fail(std::string("mode ") + modes[i]->name + ": " + r.status().to_string(), 1);
    run.results.push_back(std::move(r).value());
  }
  return 0;
}

// The sweep: the cached mode at each fraction, on the same batches. A point equal to the cached
// run above reuses it; a point whose cache cannot hold a step's rows is reported as skipped
// with the reason.
int run_sweep(const Options& o, const BatchSource& batches, const std::vector<std::string>& sweep_skipped,
              RunRecord& run) {
  const std::vector<double>& sweep = run.sweep;
  const std::vector<ModeResult>& results = run.results;
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    const double f = sweep[i];
    if (!sweep_skipped[i].empty()) {
      run.sweep_points.push_back({f, Status::resource_exhausted(sweep_skipped[i])});
      continue;
    }
    const auto same = std::find_if(results.begin(), results.end(), [&](const ModeResult& r) {
      return r.mode->placement == Placement::kCached && r.cache_fraction == f;
    });
    if (same != results.end()) {
      run.sweep_points.push_back({f, *same});
      continue;
    }
    char label[96];
    std::snprintf(label, sizeof label, "[sweep %zu/%zu] cached %g", i + 1, sweep.size(), f);
    auto r = run_mode(o, *find_mode("cached").value(), f, batches, label);
    // A cache too small for what the planner pins at run time is a result of the sweep; any
    // other failure is a failure of the run.
    if (!r && r.status().code() != StatusCode::kResourceExhausted)
      return fail("sweep point " + std::to_string(f) + ": " + r.status().to_string(), 1);
    run.sweep_points.push_back({f, std::move(r)});
  }

  return 0;
}

// Distinct rows the run touched per slot pool: a sweep point whose every pool holds them has only
// first-use misses (the report says so: a larger cache cannot raise its hit rate).
int count_touched_rows(const Options& o, const BatchSource& batches, RunRecord& run) {
  if (run.sweep_points.empty()) return 0;
  const ModeDescriptor& cached = *find_mode("cached").value();
  auto c = make_config(o, cached, run.sweep_points.front().fraction);
  if (!c) return fail("sweep: " + c.status().to_string(), 1);
  auto t = touched_rows_per_pool(o, c.value(), batches);
  if (!t) return fail("sweep: " + t.status().to_string(), 1);
  const std::vector<std::int64_t> touched = std::move(t).value();
  run.sweep_touched_rows = std::accumulate(touched.begin(), touched.end(), std::int64_t{0});
  for (SweepPoint& point : run.sweep_points) {
    auto pc = make_config(o, cached, point.fraction);
    if (!pc) return fail("sweep: " + pc.status().to_string(), 1);
    const std::vector<SlotPool> pools = slot_pools(pc.value());
    bool holds = pools.size() == touched.size();
    for (std::size_t i = 0; holds && i < pools.size(); ++i) holds = pools[i].rows >= touched[i];
    point.holds_every_touched_row = holds;
  }
  return 0;
}

// Writes --json and --html. Each file is written to a temporary file next to it, every write, the
// fsync and the close checked, then renamed into place: a failed write (a full disk) leaves the
// old file or none.
int write_outputs(const Options& o, const json& j) {
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
  return 0;
}

int run(const Options& o_in) {
  const auto wall0 = Clock::now();
  RunRecord run;
  run.started_at = iso_time_now();
  Options o = o_in;
  std::optional<BatchSource> source;
  std::vector<const ModeDescriptor*> modes;
  if (const int code = read_workload(o, run, source)) return code;
  if (const int code = choose_modes(o, source.has_value(), modes, run)) return code;
  if (const int code = check_outputs_and_profile(o, run)) return code;
  if (const int code = check_device_and_memory(o, modes, run)) return code;
  print_workload_line(o, run, source);
  std::vector<std::string> sweep_skipped;
  if (const int code = prepare_batches(o, modes, run, source, sweep_skipped)) return code;
  const BatchSource& batches = *source;
  if (const int code = measure_machine(o, batches, run.probes)) return code;
  if (const int code = run_modes(o, modes, batches, run)) return code;
  if (const int code = run_sweep(o, batches, sweep_skipped, run)) return code;
  if (const int code = count_touched_rows(o, batches, run)) return code;
  json j = results_document(o, run, batches);
  j["wall_s"] = seconds_since(wall0);
  print_console(o, j, run);
  if (const int code = write_outputs(o, j)) return code;
  std::fprintf(stderr, "strata-bench: done in %.1f s\n", seconds_since(wall0));
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Options o;
  o.workload = strata::bench::default_workload();
  for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
  if (const std::optional<int> code = strata::bench::parse_options(argc, argv, o)) return *code;
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
