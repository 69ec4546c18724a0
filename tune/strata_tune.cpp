// strata-tune: sizes memory tiers. `calibrate` measures this machine into a hardware profile;
// `capacity` replays the keys through a dynamic table's key index at several capacities;
// `plan` turns a workload, a recorded trace or a Criteo TSV file, a profile and memory budgets into
// a placement for every table (a store config), with hit-rate curves and a report; `validate` runs
// a plan with strata-bench on the same keys and sets what it measures against what the plan
// predicted. See tune/commands.hpp and docs/tune.md.

#include <CLI/CLI.hpp>

#include <limits>
#include <optional>
#include <string>

#include "core/dynamic_spec.hpp"
#include "core/table_spec.hpp"
#include "store/store_config.hpp"
#include "toolkit/batch_source.hpp"
#include "toolkit/cli_flags.hpp"
#include "tune/calibrate.hpp"
#include "tune/commands.hpp"
#include "tune/curves.hpp"

namespace {

using strata::bench::integer_in;

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// The key source options `plan`, `validate` and `capacity` share (capacity: no sampling).
void add_input_options(CLI::App* app, strata::tune::InputArgs& in, bool sampling = true) {
  app->add_option("--workload", in.workload, "workload JSON (a file, or inline starting with '{')");
  app->add_option("--trace", in.trace, "recorded trace (STRTRACE, docs/trace-format.md)");
  app->add_option("--criteo", in.criteo,
                  "Criteo TSV file (label, I1..I13, C1..C26 per line), keyed as strata-bench --criteo");
  app->add_option("--tables", in.tables,
                  "criteo: table set, as strata-bench --tables (26 tables); trace or criteo: or a mapping of the "
                  "file's features to tables, TABLE=FEATURE[+FEATURE...],... (e.g. item=clicked+bought; Criteo's "
                  "features are its columns C1..C26; features left out are tables of their own)")
      ->capture_default_str();
  app->add_option("--criteo-rows", in.criteo_rows, "criteo: total rows of the criteo table set")
      ->capture_default_str()
      ->transform(integer_in(1, kInt64Max, "ROWS >= 1"));
  app->add_option("--batch", in.batch, "criteo: samples per step")
      ->capture_default_str()
      ->transform(integer_in(1, kInt64Max, "SAMPLES >= 1"));
  app->add_flag("!--criteo-no-label", in.criteo_label, "criteo: the lines have no label column");
  if (!sampling) return;
  app->add_option("--sample", in.sample,
                  "trace, criteo: keep this fraction of the keys (SHARDS spatial sampling, e.g. 0.01); the curves "
                  "say their error measured against exact on the first lookups")
      ->capture_default_str();
  app->add_option("--sample-check-keys", in.sample_check_keys,
                  "sampled: exact lookups kept from the start to measure the sampling error on")
      ->capture_default_str()
      ->transform(integer_in(0, kInt64Max, "INT >= 0"));
}

}  // namespace

int main(int argc, char** argv) {
  using strata::tune::CalibrateArgs;
  using strata::tune::PlanArgs;
  CLI::App app{"strata-tune: memory-tier tuning (calibrate a profile, plan placements, size dynamic tables)"};
  app.require_subcommand(1);

  CalibrateArgs c;
  CLI::App* cal = app.add_subcommand("calibrate", "measure this machine's host memory into a hardware profile");
  cal->add_option("--out", c.out, "profile file to write (default: print it)");
  cal->add_option("--from", c.from, "profile giving the GPU numbers: a name in bench/profiles or a file");
  cal->add_option("--name", c.name, "name of the new profile (default calibrated-<from>)");
  cal->add_option("--row-bytes", c.row_bytes, "gather row sizes in bytes, comma-separated, ascending")
      ->capture_default_str();
  cal->add_option("--probe-mib", c.probe_mib, "MiB of each probe table (the probes must fit in the memory available)")
      ->capture_default_str()
      ->transform(integer_in(1, kIntMax, "INT >= 1"));
  cal->add_option("--lookups", c.lookups, "rows gathered per timed pass (their keys must fit in the memory available)")
      ->capture_default_str()
      ->transform(integer_in(strata::tune::kCalibrateBagKeys, kInt64Max,
                             "INT >= " + std::to_string(strata::tune::kCalibrateBagKeys)));
  cal->add_option("--threads", c.threads,
                  "threads per NUMA node (0: the node's cores; at most 4 x the hardware threads)")
      ->capture_default_str()
      ->transform(integer_in(0, kIntMax, "INT >= 0"));

  PlanArgs p;
  CLI::App* plan = app.add_subcommand("plan", "place every table within HBM and host memory budgets");
  add_input_options(plan, p.input);
  plan->add_option("--profile", p.profile, "hardware profile: a name in bench/profiles or a file");
  plan->add_option("--trainer", p.trainer,
                   "where the trainer's dense model lives: device (outputs and gradients stay in HBM) | host")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  plan->add_option("--ranks", p.ranks,
                   "ranks (GPUs) to shard over: every table gpu or hybrid, row-wise; budgets per rank (default 1)");
  std::string hbm_budget, host_budget;
  CLI::Option* hbm =
      plan->add_option("--hbm-budget", hbm_budget,
                       "HBM the plan may use per rank (GPU), e.g. 80GB (default: the profile's, of one GPU)");
  CLI::Option* host =
      plan->add_option("--host-budget", host_budget,
                       "host memory the plan may use per rank (default: the profile's, over min(ranks, gpus))");
  plan->add_option(
          "--steps", p.input.steps,
          "workload: steps planned (0: twice its distinct batches; their keys must fit in the memory available)")
      ->capture_default_str()
      ->transform(integer_in(0, kInt64Max, "INT >= 0"));
  plan->add_option("--dim", p.input.dim, "trace, criteo: row width of every table")
      ->capture_default_str()
      ->transform(integer_in(1, strata::kMaxDim));
  plan->add_option("--optimizer", p.optimizer, "optimizer of every table: sgd | adagrad | rowwise_adagrad | adam");
  std::string dtype;
  CLI::Option* dtype_flag = plan->add_option(
      "--dtype", dtype,
      "rows of every table: fp32 | bf16 | fp16, or auto: bf16 for a table that fits only at half size (default: "
      "each table's configured dtype)");
  plan->add_option("--max-in-flight", p.max_in_flight, "batches in flight (staging)")
      ->capture_default_str()
      ->transform(integer_in(1, kIntMax, "INT >= 1"));
  plan->add_option("--threads", p.threads, "store worker threads (0: all cores)")
      ->capture_default_str()
      ->transform(integer_in(0, strata::kMaxThreads));
  plan->add_option("--points", p.points, "curve points per table in the reports")
      ->capture_default_str()
      ->transform(integer_in(2, strata::tune::kMaxCurvePoints));
  plan->add_option("--belady-points", p.belady_points,
                   "curve points per table with Belady's optimum (0: none; each a pass over the keys)")
      ->capture_default_str()
      ->transform(integer_in(0, strata::tune::kMaxCurvePoints));
  plan->add_flag("!--no-progress", p.progress, "no progress lines");
  plan->add_option("--out", p.out, "write the plan as a store config (JSON)");
  plan->add_option("--html", p.html, "write the report as a self-contained HTML page");
  plan->add_option("--json", p.json, "write the report's numbers as JSON");

  strata::tune::ValidateArgs v;
  CLI::App* val = app.add_subcommand(
      "validate", "run a plan with strata-bench on the same keys: predicted against measured, per table");
  val->add_option("plan", v.plan, "the plan (a store config, as plan --out writes it)")->required();
  add_input_options(val, v.input);
  val->add_option("--dim", v.input.dim, "criteo: row width of every table (a trace takes the plan's dims)")
      ->capture_default_str()
      ->transform(integer_in(1, strata::kMaxDim));
  val->add_option("--profile", v.profile, "hardware profile of the predicted step: a name in bench/profiles or a file");
  val->add_option("--steps", v.steps,
                  "timed training steps, at most strata-bench's (0: half the batches, so none repeats; a trace or "
                  "a TSV file must hold steps x ranks batches)")
      ->capture_default_str()
      ->transform(integer_in(0, strata::bench::kMaxSteps));
  val->add_option("--backend", v.backend, "strata-bench --backend: auto | cuda | emu")->capture_default_str();
  val->add_option("--trainer", v.trainer, "strata-bench --trainer: device | host (where the dense model lives)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  val->add_option("--ranks", v.ranks,
                  "thread ranks (strata-bench --ranks) of a plan made with plan --ranks N: every table gpu or "
                  "hybrid; rank 0's counters are compared (default 1)");
  val->add_option("--bench", v.bench, "the strata-bench program (default: the one next to strata-tune)");
  val->add_option("--out", v.out, "write predicted and measured as JSON");
  val->add_option("--html", v.html,
                  "write predicted against measured (per table and per link) as a self-contained HTML page");
  val->add_flag("!--no-progress", v.progress, "no progress lines");

  strata::tune::CapacityArgs k;
  CLI::App* capacity = app.add_subcommand(
      "capacity", "the capacity of dynamic tables: the keys replayed through the key index at several capacities");
  add_input_options(capacity, k.input, false);
  capacity
      ->add_option("--steps", k.input.steps,
                   "workload: steps replayed (0: twice its distinct batches; a file: all its batches)")
      ->capture_default_str()
      ->transform(integer_in(0, kInt64Max, "INT >= 0"));
  capacity->add_option("--admit-after", k.admit_after, "uses before a key gets a row (the table's admit_after)")
      ->capture_default_str()
      ->transform(integer_in(1, strata::kMaxAdmitAfter));
  capacity->add_option("--eviction", k.eviction, "which row a full table evicts: lru | lfu")
      ->check(CLI::IsMember({"lru", "lfu"}))
      ->capture_default_str();
  capacity
      ->add_option("--evict-after-steps", k.evict_after_steps,
                   "TTL: rows unused for this many training steps are freed (0: none)")
      ->capture_default_str()
      ->transform(integer_in(0, (std::int64_t{1} << 62) - 1));
  capacity->add_option("--capacities", k.capacities,
                       "capacities to simulate, comma-separated, each in [1, " +
                           std::to_string(strata::kMaxDynamicCapacity) +
                           "] (default: a geometric sweep from the most distinct keys of a step to the distinct keys "
                           "of the input)");
  capacity->add_option("--points", k.points, "capacities of the default sweep")
      ->capture_default_str()
      ->transform(integer_in(2, strata::tune::kMaxCurvePoints));
  capacity
      ->add_option("--refine", k.refine,
                   "capacities replayed in one more pass between the recommended one and the capacity below it (0: "
                   "none)")
      ->capture_default_str()
      ->transform(integer_in(0, strata::tune::kMaxCurvePoints));
  capacity
      ->add_option("--tolerance", k.tolerance_points,
                   "the recommended capacity is the smallest whose uses that find their row are within this many "
                   "percentage points of the unbounded capacity's")
      ->capture_default_str();
  capacity
      ->add_option("--in-flight", k.in_flight,
                   "training batches in flight: a batch's rows stay pinned until this many - 1 later ones were "
                   "submitted")
      ->capture_default_str()
      ->transform(integer_in(1, 1024));
  capacity->add_flag("--spread", k.spread,
                     "spread the keys over [0, 2^63) first, as strata-bench --dynamic does (row ids of a workload or "
                     "a dense trace)");
  capacity->add_flag("!--no-progress", k.progress, "no progress lines");
  capacity->add_option("--out", k.out, "write the runs and the recommendation as JSON");
  capacity->add_option("--html", k.html, "write the report with the curves as a self-contained HTML page");

  if (const std::optional<int> code = strata::bench::parse_command_line(app, argc, argv, "strata-tune")) return *code;
  // An empty budget is refused as a size (not taken for the default).
  if (hbm->count() > 0) p.hbm_budget = hbm_budget;
  if (host->count() > 0) p.host_budget = host_budget;
  if (dtype_flag->count() > 0) p.dtype = dtype;
  std::string command = "strata-tune";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  if (cal->parsed()) {
    c.command = command;
    return strata::tune::run_calibrate(c);
  }
  if (val->parsed()) return strata::tune::run_validate(v);
  if (capacity->parsed()) return strata::tune::run_capacity(k);
  return strata::tune::run_plan(p);
}
