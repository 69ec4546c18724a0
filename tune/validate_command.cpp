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
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "toolkit/batch_source.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/profiles.hpp"
#include "toolkit/report_html.hpp"
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
  json result;                 ///< strata-bench's results[0]
  ModelledStep measured_step;  ///< the model on the measured bytes (measured_step_bytes)
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
  for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--out", a.out}, {"--html", a.html}})
    if (!path.empty())
      if (Status s = check_output(path, flag); !s.is_ok()) return fail(s.message());
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
  InputArgs in = a.input;
  if (!tables_map_features(in)) in.features = plan_features(v.plan);
  std::map<std::string, std::vector<std::string>> features;
  auto shapes = input_tables(in, &features);
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
  if (Status s = check_plan_tables(v.plan, names, rows, dims, what, features); !s.is_ok())
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
  if (!tables_map_features(in)) in.features = plan_features(v.plan);
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

// What strata-bench counted per training step (validate.hpp: measured_step_bytes), from its JSON.
StepBytes counted_bytes(const json& result) {
  const json& mb = result["bytes_per_step"];
  const json& mc = result.contains("cpu_kernel_bytes_per_step") ? result["cpu_kernel_bytes_per_step"] : json(nullptr);
  const auto at = [](const json& j, const char* k) {
    return j.is_object() && j.contains(k) ? j[k].get<double>() : 0.0;
  };
  StepBytes b;
  b.hbm_read = at(mb, "hbm_read");
  b.hbm_write = at(mb, "hbm_write");
  b.h2d = at(mb, "h2d");
  b.d2h = at(mb, "d2h");
  b.host_cpu_read = at(mc, "host_read");
  b.host_cpu_write = at(mc, "host_write");
  b.host_read = at(mb, "host_read") + b.host_cpu_read;
  b.host_write = at(mb, "host_write") + b.host_cpu_write;
  b.all_to_all = at(mb, "all_to_all");
  return b;
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
    if (tables_map_features(a.input)) argv.insert(argv.end(), {"--tables", a.input.tables});
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
  v.measured_step = model_step(v.profile, measured_step_bytes(counted_bytes(v.result), v.predicted), v.predicted.model);

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

// Random-row gathers per step of `b`, in rows.
double gather_rows(const StepBytes& b) {
  double rows = 0;
  for (const RowGather& g : b.host_gathers) rows += g.rows;
  return rows;
}

// The step time: predicted, modelled from the measured bytes (one computation: model_step on the
// counted bytes, validate.hpp's measured_step_bytes), and measured on this machine. strata-bench's
// own modelled step is shown apart when it differs: its counters cannot tell random-row gathers
// from sequential bytes, so it prices every host byte at the sequential bandwidth.
void compare_step_time(const Validation& v, std::ostream& o, json& out) {
  const ModelledStep& predicted = v.predicted.step;
  const ModelledStep& modelled = v.measured_step;
  const double bench_ms = v.result["modelled"]["step_ms"].get<double>();
  const double measured_ms = v.result["train_step_ms_p50"].get<double>();
  const double rows = gather_rows(v.predicted.bytes);
  o << "\nstep time:\n  predicted on profile " << v.profile.name << ": " << ms_text(predicted.step_s) << " ("
    << predicted.bottleneck << ")\n  modelled from the measured bytes on the same profile: " << ms_text(modelled.step_s)
    << " (" << modelled.bottleneck << ")\n";
  if (rows > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g", rows);
    o << "    (the bytes per link as strata-bench counted them; which host bytes are random-row gathers, " << buf
      << " rows per step, "
      << (has_gather_rates(v.profile) ? "priced at the profile's gather rates"
                                      : "priced at sequential bandwidth (the profile has no gather rates)")
      << ", comes from the keys: a counter sees bytes, not rows)\n";
  }
  o << "  host DRAM: " << predicted.host_pricing << "\n";
  const bool bench_differs = std::abs(bench_ms - modelled.step_s * 1e3) > 1e-6 * std::max(1e-9, bench_ms);
  if (bench_differs)
    o << "  strata-bench's own modelled step (its JSON's modelled.step_ms): " << ms_text(bench_ms / 1e3)
      << " (every host byte at the sequential bandwidth: its counters do not say which are random rows)\n";
  o << "  measured on this machine (" << v.result["device"].get<std::string>()
    << ", median of the training steps): " << ms_text(measured_ms / 1e3) << "\n";
  if (v.result["device"] == "emu")
    o << "  (the emulated device runs on the CPU: its step time is not the profile's GPU; the bytes and hit rates "
         "are the comparison that holds)\n";
  json links = json::object();
  for (int l = 0; l < kNumLinks; ++l)
    links[link_name(static_cast<Link>(l))] = {
        {"predicted", predicted.links[static_cast<std::size_t>(l)].seconds * 1e3},
        {"modelled_from_measured_bytes", modelled.links[static_cast<std::size_t>(l)].seconds * 1e3}};
  out["step_ms"] = {{"predicted", predicted.step_s * 1e3}, {"modelled_from_measured_bytes", modelled.step_s * 1e3},
                    {"bench_modelled", bench_ms},          {"measured_p50", measured_ms},
                    {"bottleneck", predicted.bottleneck},  {"bottleneck_from_measured_bytes", modelled.bottleneck},
                    {"gather_rows_per_step", rows},        {"link_ms", links},
                    {"host_node", predicted.host_node},    {"host_pricing", predicted.host_pricing}};
}

// A number of the JSON, or none when it is missing or null.
std::optional<double> number(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

// The page: predicted against measured per table (hit rates), per link (bytes per step and the
// modelled time of each link) and for the step, from validate's JSON (`out`) and console text.
std::string validate_html(const json& out, const std::string& text) {
  using bench::html_escape;
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>strata-tune "
       "validate</title>\n<style>"
    << bench::report_css() << "</style>\n</head>\n<body>\n<header><h1>strata-tune validate</h1><p class=\"note\">"
    << html_escape(out["plan"].get<std::string>() + " on " + out["source"].get<std::string>() + "; " +
                   std::to_string(out["steps"].get<std::int64_t>()) + " training steps on " +
                   out["device"].get<std::string>() + ", profile " + out["profile"].get<std::string>())
    << "</p>";
  if (out["device"] == "emu")
    o << "<p class=\"warn\">the emulated device runs on the CPU: its measured step time is not the profile's GPU; "
         "the bytes and hit rates are the comparison that holds</p>";
  o << "</header>\n";

  // Per table: the hit rates of the caches.
  std::vector<std::string> cached;
  bench::BarLine hp{"LRU predicted", {}}, hm{"measured", {}};
  o << "<section class=\"summary\" id=\"tables\"><h2>Per table</h2><table><tr><th>table</th><th>placement</th>"
    << "<th>cache rows</th><th>LRU predicted</th><th>measured</th><th>points</th>"
    << "<th>predicted bytes per step (HBM, H2D, D2H, host)</th></tr>";
  for (const json& t : out["tables"]) {
    const std::optional<double> p = t.contains("predicted") ? number(t["predicted"], "hit_rate") : std::nullopt;
    const std::optional<double> m = t.contains("measured") ? number(t["measured"], "hit_rate") : std::nullopt;
    const json& b = t["predicted_bytes_per_step"];
    o << "<tr><td>" << html_escape(t["name"].get<std::string>()) << "</td><td>"
      << html_escape(t["placement"].get<std::string>()) << "</td><td class=\"n\">"
      << (t.contains("cache_rows") ? std::to_string(t["cache_rows"].get<std::int64_t>()) : "-")
      << "</td><td class=\"n\">" << rate_text(p.value_or(-1)) << "</td><td class=\"n\">" << rate_text(m.value_or(-1))
      << "</td><td class=\"n\">" << points_text(p.value_or(-1), m.value_or(-1)) << "</td><td class=\"n\">"
      << html_escape(bytes_text(b["hbm_read"].get<double>() + b["hbm_write"].get<double>()) + ", " +
                     bytes_text(b["h2d"].get<double>()) + ", " + bytes_text(b["d2h"].get<double>()) + ", " +
                     bytes_text(b["host_read"].get<double>() + b["host_write"].get<double>()))
      << "</td></tr>";
    if (p) {
      cached.push_back(t["name"].get<std::string>());
      hp.values.push_back(p);
      hm.values.push_back(m);
    }
  }
  o << "</table><p class=\"note\">strata-bench counts bytes per device, not per table: the per-table bytes are "
       "predicted only; their sum is set against the measurement per link below.</p></section>\n";
  if (!cached.empty())
    o << "<section class=\"chart\" id=\"hit-rates\"><h2>Hit rate per cached table</h2>"
      << bench::bar_chart("LRU hit rate per cached table, predicted against measured", cached, {hp, hm},
                          bench::ChartUnit::kFraction, "hit rate")
      << "</section>\n";

  // Per link: bytes per step and the modelled time of each link.
  const json& pb = out["bytes_per_step"]["predicted"];
  const json& mb = out["bytes_per_step"]["measured"];
  std::vector<std::string> links;
  bench::BarLine bp{"predicted", {}}, bm{"measured", {}};
  o << "<section class=\"summary\" id=\"links\"><h2>Per link</h2><table><tr><th>link</th><th>predicted bytes per "
       "step</th><th>measured</th><th>difference</th></tr>";
  for (const char* link : {"hbm_read", "hbm_write", "h2d", "d2h", "host_read", "host_write", "all_to_all"}) {
    if (!pb.contains(link)) continue;
    const double p = pb[link].get<double>(), m = mb.contains(link) ? mb[link].get<double>() : 0.0;
    links.emplace_back(link);
    bp.values.emplace_back(p);
    bm.values.emplace_back(m);
    char row[256];
    std::snprintf(row, sizeof row,
                  "<tr><td>%s</td><td class=\"n\">%.1f</td><td class=\"n\">%.1f</td><td class=\"n\">%.1f</td></tr>",
                  link, p, m, byte_difference(m, p, out["steps"].get<std::int64_t>()));
    o << row;
  }
  o << "</table><p class=\"note\">host_read and host_write as the device layer counts them; the CPU kernels' host "
       "bytes (counted from the keys by both) are in the JSON (cpu_kernel_bytes_per_step).</p></section>\n"
    << "<section class=\"chart\" id=\"bytes\"><h2>Bytes per training step, per link</h2>"
    << bench::bar_chart("bytes per training step on each link, predicted against measured", links, {bp, bm},
                        bench::ChartUnit::kBytes, "bytes/step")
    << "</section>\n";
  const json& step = out["step_ms"];
  std::vector<std::string> model_links;
  bench::BarLine tp{"predicted", {}}, tm{"modelled from the measured bytes", {}};
  for (int l = 0; l < kNumLinks; ++l) {
    const char* link = link_name(static_cast<Link>(l));
    model_links.emplace_back(link);
    tp.values.emplace_back(step["link_ms"][link]["predicted"].get<double>());
    tm.values.emplace_back(step["link_ms"][link]["modelled_from_measured_bytes"].get<double>());
  }
  o << "<section class=\"chart\" id=\"link-time\"><h2>Modelled time per link</h2><p>step: predicted "
    << html_escape(ms_text(step["predicted"].get<double>() / 1e3) + " (" + step["bottleneck"].get<std::string>() +
                   "), modelled from the measured bytes " +
                   ms_text(step["modelled_from_measured_bytes"].get<double>() / 1e3) + " (" +
                   step["bottleneck_from_measured_bytes"].get<std::string>() + "), measured on this machine " +
                   ms_text(step["measured_p50"].get<double>() / 1e3))
    << "</p>"
    << bench::bar_chart("modelled time of each link per step, predicted against from the measured bytes", model_links,
                        {tp, tm}, bench::ChartUnit::kMs, "ms per step")
    << "</section>\n<section class=\"summary\" id=\"console\"><h2>Console</h2><pre style=\"white-space:pre-wrap\">"
    << html_escape(text) << "</pre></section>\n</body>\n</html>\n";
  return o.str();
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
  if (!a.html.empty()) {
    if (Status s = write_output(a.html, validate_html(out, o.str())); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.html << "\n";
  }
  return 0;
}

}  // namespace strata::tune
