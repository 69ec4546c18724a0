// strata-tune validate: check the plan against the keys, run it with strata-bench (the program,
// so the run is exactly strata-bench's: the same store calls, counters and checks), predict the
// same run from the keys (tune/validate.hpp), and set one against the other.

#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "toolkit/batch_source.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/profiles.hpp"
#include "tune/command_util.hpp"
#include "tune/commands.hpp"
#include "tune/input_args.hpp"
#include "tune/text.hpp"
#include "tune/validate.hpp"

namespace strata::tune {
namespace {

using json = nlohmann::json;

// The strata-bench next to this program (installed: the same bin/), or in the build tree's
// bench/ beside this program's tune/ (tune/strata-tune and bench/strata-bench).
std::string sibling_bench() {
  const std::string dir = bench::program_dir();
  if (dir.empty()) return "strata-bench";
  if (::access((dir + "strata-bench").c_str(), X_OK) == 0) return dir + "strata-bench";
  return dir + "../bench/strata-bench";
}

// Runs `argv` with stdout and stderr into `log`; its exit code (-1 when it could not start).
int run_child(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The last non-empty line of `text`.
std::string last_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// RAII temporary directory (removed with its files).
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/strata-tune-validate-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    if (path.empty()) return;
    for (const char* f : {"/bench.json", "/bench.log", "/workload.json"}) ::unlink((path + f).c_str());
    ::rmdir(path.c_str());
  }
};

// The bytes the device layer counts: host_read and host_write without the CPU kernels' part.
json bytes_json(const StepBytes& b) {
  return {{"hbm_read", b.hbm_read},
          {"hbm_write", b.hbm_write},
          {"h2d", b.h2d},
          {"d2h", b.d2h},
          {"host_read", b.host_read - b.host_cpu_read},
          {"host_write", b.host_write - b.host_cpu_write}};
}

const char* const kLinks[] = {"hbm_read", "hbm_write", "h2d", "d2h", "host_read", "host_write"};

std::string rate_text(double r) { return r < 0 ? "-" : percent_text(r); }

// Percentage points between two rates, "-" when either is missing.
std::string points_text(double predicted, double measured) {
  if (predicted < 0 || measured < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f", 100.0 * (measured - predicted));
  return buf;
}

// measured - predicted per step, from the whole bytes over the run's `steps` (per-step values are
// byte totals over the steps, summed in different orders: their last bits may differ).
double byte_difference(double measured, double predicted, std::int64_t steps) {
  const double s = static_cast<double>(steps);
  return static_cast<double>(std::llround(measured * s) - std::llround(predicted * s)) / s;
}

// One validation: the plan and profile, the keys and their prediction, strata-bench's run.
struct Validation {
  std::string profile_path;  ///< --profile resolved (strata-bench is given the same file)
  HardwareProfile profile;
  StoreConfig plan;
  int ranks = 1;
  std::string bench;           ///< the strata-bench program
  std::optional<TempDir> tmp;  ///< strata-bench's JSON and log (and --workload's file), made after the checks
  std::string workload_file;   ///< --workload, written for strata-bench ("" for a file input)
  ProgressFn progress;
  TuneInput input;
  std::int64_t steps = 0;  ///< training steps of the run (after as many forward steps)
  RunPrediction predicted;
  json result;  ///< strata-bench's results[0]
};

// Everything that needs no keys, first: the inputs, the profile, the output, the plan and its
// tables against the input's, the ranks and strata-bench.
int check_arguments(const ValidateArgs& a, Validation& v) {
  if (Status s = check_input_args(a.input); !s.is_ok()) return fail(s.message());
  if (a.input.sample < 1.0) return fail("--sample: validate compares exact predictions (give every key)");
  v.profile_path = bench::profile_path(a.profile);
  auto profile = load_profile_file(v.profile_path);
  if (!profile) return fail("--profile " + a.profile + ": " + profile.status().message());
  v.profile = std::move(profile).value();
  if (!a.out.empty())
    if (Status s = check_output(a.out, "--out"); !s.is_ok()) return fail(s.message());
  auto text = bench::read_input_file(a.plan, "plan file");
  if (!text) return fail("plan " + a.plan + ": " + text.status().message());
  if (auto j = bench::parse_json_limited(*text, "plan " + a.plan); !j) return fail(j.status().message());
  auto plan = parse_store_config(*text);
  if (!plan) return fail("plan " + a.plan + ": " + plan.status().message());
  v.plan = std::move(plan).value();
  // strata-bench runs at most 64 thread ranks.
  const auto ranks = parse_ranks(a.ranks, 64);
  if (!ranks) return fail(ranks.status().message());
  v.ranks = *ranks;
  for (const TableConfig& t : v.plan.tables) {
    if (*ranks == 1 && t.placement == Placement::kHybrid)
      return fail("plan " + a.plan + ": table '" + t.spec.name +
                  "' is hybrid (a plan made with plan --ranks N: validate it with --ranks N)");
    if (*ranks > 1 && t.placement != Placement::kGpu && t.placement != Placement::kHybrid)
      return fail("plan " + a.plan + ": table '" + t.spec.name + "' is " + to_string(t.placement) + ": a world of " +
                  std::to_string(*ranks) + " ranks takes gpu or hybrid tables (a plan made with plan --ranks " +
                  std::to_string(*ranks) + ")");
  }
  auto shapes = input_tables(a.input);
  if (!shapes) return fail(shapes.status().message());
  const std::string what = !a.input.trace.empty() ? "trace" : !a.input.criteo.empty() ? "criteo table set" : "workload";
  std::vector<std::string> names;
  std::vector<std::int64_t> rows;
  std::vector<int> dims;
  for (const bench::TableShape& s : *shapes) {
    names.push_back(s.name);
    rows.push_back(s.rows);
    dims.push_back(s.dim);
  }
  if (!a.input.trace.empty()) dims.clear();  // a trace records no dims: the plan's are used
  if (Status s = check_plan_tables(v.plan, names, rows, dims, what); !s.is_ok())
    return fail("plan " + a.plan + " does not match the " + what + ": " + s.message());
  v.bench = a.bench.empty() ? sibling_bench() : a.bench;
  if (::access(v.bench.c_str(), X_OK) != 0)
    return fail("--bench " + v.bench + ": not an executable program (expected strata-bench)");
  return 0;
}

// The keys (a --workload is written to a file strata-bench reads) and the run's prediction.
int predict(const ValidateArgs& a, Validation& v) {
  v.progress = progress_printer(a.progress);
  const ProgressFn& progress = v.progress;
  InputArgs in = a.input;
  if (!a.input.workload.empty()) {
    auto spec = workload_of(a.input.workload);
    if (!spec) return fail("--workload: " + spec.status().message());
    in.steps = spec->distinct_batches;  // the source: its distinct batches, cycled by the run
    v.workload_file = v.tmp->path + "/workload.json";
    if (Status s = write_output(v.workload_file, bench::workload_to_json(*spec)); !s.is_ok())
      return fail(s.message(), 1);
  }
  auto input = load_input(in, OptimizerKind::kSgd, progress);
  if (!input) return fail(input.status().message());
  v.input = std::move(input).value();
  // Each rank runs 2 x steps batches of the source (forward, then training): by default none
  // repeats, within strata-bench's most steps.
  v.steps = a.steps > 0 ? a.steps
                        : std::clamp<std::int64_t>(v.input.steps / (2 * v.ranks), 1, std::int64_t{bench::kMaxSteps});
  // A file must hold the steps strata-bench runs: its own check, before the prediction (which
  // takes as long as the steps).
  if (!a.input.trace.empty() || !a.input.criteo.empty()) {
    const bool trace = !a.input.trace.empty();
    if (Status s = bench::check_source_holds_phase(trace ? "trace" : "criteo", trace ? a.input.trace : a.input.criteo,
                                                   v.input.steps, 0, v.steps, v.ranks);
        !s.is_ok())
      return fail(s.message());
  }
  if (progress) progress("predicting " + std::to_string(v.steps) + " training steps");
  auto predicted = predict_run(v.input, v.plan, v.steps, kValidatePipeline, v.profile, a.trainer != "host", v.ranks);
  if (!predicted) return fail(predicted.status().message());
  v.predicted = std::move(predicted).value();

  return 0;
}

// strata-bench on the plan: the same keys and steps, no warm-up, the pipeline the prediction assumed.
int run_bench(const ValidateArgs& a, Validation& v) {
  const std::string bench_json = v.tmp->path + "/bench.json", log = v.tmp->path + "/bench.log";
  std::vector<std::string> argv{v.bench,
                                "--modes",
                                "",
                                "--config",
                                a.plan,
                                "--warmup",
                                "0",
                                "--steps",
                                std::to_string(v.steps),
                                "--pipeline",
                                std::to_string(kValidatePipeline),
                                "--lookahead",
                                "0",
                                "--no-progress",
                                "--no-gather-probe",
                                "--read-probe-mib",
                                "1",
                                "--backend",
                                a.backend,
                                "--trainer",
                                a.trainer,
                                "--ranks",
                                std::to_string(v.ranks),
                                "--profile",
                                v.profile_path,
                                "--json",
                                bench_json};
  if (!a.input.trace.empty()) {
    argv.insert(argv.end(), {"--trace", a.input.trace});
  } else if (!a.input.criteo.empty()) {
    argv.insert(argv.end(), {"--criteo", a.input.criteo, "--tables", a.input.tables, "--criteo-rows",
                             std::to_string(a.input.criteo_rows), "--batch", std::to_string(a.input.batch), "--dim",
                             std::to_string(a.input.dim)});
    if (!a.input.criteo_label) argv.emplace_back("--criteo-no-label");
  } else {
    argv.insert(argv.end(), {"--workload", v.workload_file});
  }
  if (v.progress) v.progress("running " + v.bench + " --config " + a.plan + " (" + std::to_string(v.steps) + " steps)");
  const int code = run_child(argv, log);
  const auto log_read = bench::read_input_file(log, "strata-bench output");
  const std::string log_text = log_read ? *log_read : std::string();
  if (code != 0)
    return fail("strata-bench failed (exit " + std::to_string(code) + "): " + last_line(log_text), code == 2 ? 2 : 1);
  auto bench_text = bench::read_input_file(bench_json, "strata-bench JSON");
  if (!bench_text) return fail(bench_text.status().message(), 1);
  v.result = json::parse(*bench_text)["results"][0];

  return 0;
}

// Each table's hit rate, predicted (LRU) against measured, and the plans that waited.
void compare_hit_rates(const Validation& v, std::ostream& o, json& out) {
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %-9s %11s %12s %12s %9s\n", "table", "placement", "cache rows",
                "LRU predicted", "measured", "points");
  o << line;
  json tables = json::array();
  const json& cache = v.result.contains("cache") ? v.result["cache"] : json::object();
  for (const TablePrediction& p : v.predicted.tables) {
    double measured = -1;
    json mt;
    if (cache.contains("tables"))
      for (const json& t : cache["tables"])
        if (t["name"] == p.name) mt = t;
    if (!mt.is_null() && mt["accesses"].get<double>() > 0)
      measured = mt["hits"].get<double>() / mt["accesses"].get<double>();
    const bool cached = p.placement == Placement::kCached || p.placement == Placement::kHybrid;
    std::snprintf(line, sizeof line, "%-16s %-9s %11s %12s %12s %9s\n", p.name.c_str(), to_string(p.placement),
                  cached ? std::to_string(p.cache_rows).c_str() : "-", rate_text(p.hit_rate()).c_str(),
                  rate_text(measured).c_str(), points_text(p.hit_rate(), measured).c_str());
    o << line;
    json jt = {
        {"name", p.name}, {"placement", to_string(p.placement)}, {"predicted_bytes_per_step", bytes_json(p.bytes)}};
    if (cached) {
      jt["cache_rows"] = p.cache_rows;
      jt["predicted"] = {{"accesses", p.accesses}, {"hits", p.hits}, {"hit_rate", p.hit_rate()}};
      jt["measured"] = mt.is_null() ? json(nullptr)
                                    : json{{"accesses", mt["accesses"]}, {"hits", mt["hits"]}, {"hit_rate", measured}};
    }
    tables.push_back(jt);
  }
  out["tables"] = tables;
  const double overall_measured = v.result["hit_rate"].is_null() ? -1.0 : v.result["hit_rate"].get<double>();
  std::snprintf(line, sizeof line, "%-16s %-9s %11s %12s %12s %9s\n", "overall", "", "",
                rate_text(v.predicted.hit_rate()).c_str(), rate_text(overall_measured).c_str(),
                points_text(v.predicted.hit_rate(), overall_measured).c_str());
  o << line;
  out["hit_rate"] = {{"predicted", v.predicted.hit_rate() < 0 ? json(nullptr) : json(v.predicted.hit_rate())},
                     {"measured", v.result["hit_rate"]}};
  // Plans that did not fit beside the rows the batches in flight pin waited for them to retire: a
  // cache that holds a step but not strata-bench's pipeline. Hits and bytes are the same; the
  // prefetch overlapped less.
  const std::int64_t deferred = cache.value("deferred", std::int64_t{0});
  out["deferred_plans"] = deferred;
  if (deferred > 0)
    o << deferred << " table plans waited for the batches in flight to retire (the plan's caches hold a step, "
      << "not the " << kValidatePipeline << " batches strata-bench keeps in flight)\n";
}

// The bytes per training step on each link, predicted against measured (and the all-to-all and
// the CPU kernels' host bytes where they count).
void compare_bytes(const ValidateArgs& a, const Validation& v, std::ostream& o, json& out) {
  char line[256];
  o << "\nbytes per training step (every table; trainer on the " << a.trainer
    << "; as the device layer counts them, CPU kernels apart):\n";
  std::snprintf(line, sizeof line, "  %-11s %16s %16s %12s\n", "link", "predicted", "measured", "difference");
  o << line;
  const json& mb = v.result["bytes_per_step"];
  const json pb = bytes_json(v.predicted.bytes);
  json measured_bytes = json::object();
  for (const char* l : kLinks) {
    const double p = pb[l].get<double>(), m = mb[l].get<double>();
    measured_bytes[l] = m;
    std::snprintf(line, sizeof line, "  %-11s %16.1f %16.1f %12.1f\n", l, p, m, byte_difference(m, p, v.steps));
    o << line;
  }
  out["bytes_per_step"] = {{"predicted", pb}, {"measured", measured_bytes}};
  if (v.ranks > 1) {
    // Keys, rows and gradients rank 0 exchanged with the other ranks (DispatchStats: not the counts
    // of the keys, 8 bytes per table and peer, which the model's all-to-all includes).
    const double m = v.result["bytes_per_step"]["all_to_all"].get<double>(), p = v.predicted.exchange_bytes;
    std::snprintf(line, sizeof line,
                  "  %-11s %16.1f %16.1f %12.1f  (keys, rows and gradients to and from the other ranks)\n",
                  "all_to_all", p, m, byte_difference(m, p, v.steps));
    o << line;
    out["bytes_per_step"]["predicted"]["all_to_all"] = p;
    out["bytes_per_step"]["measured"]["all_to_all"] = m;
  }
  // CPU kernels' host bytes: no device counts them; strata-bench counts them from the keys.
  const json pc = {{"host_read", v.predicted.bytes.host_cpu_read}, {"host_write", v.predicted.bytes.host_cpu_write}};
  const json mc =
      v.result.contains("cpu_kernel_bytes_per_step") ? v.result["cpu_kernel_bytes_per_step"] : json(nullptr);
  out["cpu_kernel_bytes_per_step"] = {{"predicted", pc}, {"counted_by_bench", mc}};
  if (pc["host_read"].get<double>() > 0 || pc["host_write"].get<double>() > 0) {
    for (const char* l : {"host_read", "host_write"}) {
      const double p = pc[l].get<double>(), m = mc.is_null() ? 0.0 : mc[l].get<double>();
      std::snprintf(line, sizeof line, "  %-11s %16.1f %16.1f %12.1f  (CPU kernels, counted from the keys)\n", l, p, m,
                    byte_difference(m, p, v.steps));
      o << line;
    }
  }
  out["trainer"] = a.trainer;
}

// The step time: predicted, modelled from the measured bytes, and measured on this machine.
void compare_step_time(const Validation& v, std::ostream& o, json& out) {
  const double predicted_ms = v.predicted.step.step_s * 1e3;
  const double modelled_ms = v.result["modelled"]["step_ms"].get<double>();
  const double measured_ms = v.result["train_step_ms_p50"].get<double>();
  o << "\nstep time:\n  predicted on profile " << v.profile.name << ": " << ms_text(v.predicted.step.step_s) << " ("
    << v.predicted.step.bottleneck
    << ")\n  modelled from the measured bytes on the same profile: " << ms_text(modelled_ms / 1e3)
    << "\n  measured on this machine (" << v.result["device"].get<std::string>()
    << ", median of the training steps): " << ms_text(measured_ms / 1e3) << "\n";
  if (v.result["device"] == "emu")
    o << "  (the emulated device runs on the CPU: its step time is not the profile's GPU; the bytes and hit rates "
         "are the comparison that holds)\n";
  out["step_ms"] = {{"predicted", predicted_ms},
                    {"modelled_from_measured_bytes", modelled_ms},
                    {"measured_p50", measured_ms},
                    {"bottleneck", v.predicted.step.bottleneck}};
}

}  // namespace

int run_validate(const ValidateArgs& a) {
  Validation v;
  if (const int code = check_arguments(a, v)) return code;
  v.tmp.emplace();
  if (v.tmp->path.empty()) return fail("cannot create a temporary directory in /tmp", 1);
  if (const int code = predict(a, v)) return code;
  if (const int code = run_bench(a, v)) return code;
  // Predicted against measured.
  json out;
  out["plan"] = a.plan;
  out["source"] = v.input.source;
  out["steps"] = v.steps;
  out["ranks"] = v.ranks;
  out["profile"] = v.profile.name;
  out["device"] = v.result["device"];
  std::ostringstream o;
  o << "strata-tune validate: " << a.plan << " on " << v.input.source << "; strata-bench ran " << v.steps
    << " training steps (after " << v.steps << " forward steps) on " << v.result["device"].get<std::string>();
  if (v.ranks > 1) o << ", " << v.ranks << " thread ranks (rank 0's counters and cache)";
  o << "\n\n";
  compare_hit_rates(v, o, out);
  compare_bytes(a, v, o, out);
  compare_step_time(v, o, out);
  std::cout << o.str();
  if (!a.out.empty()) {
    if (Status s = write_output(a.out, out.dump(2) + "\n"); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.out << "\n";
  }
  return 0;
}

}  // namespace strata::tune
