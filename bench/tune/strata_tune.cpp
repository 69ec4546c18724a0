// strata-tune: sizes memory tiers. `calibrate` measures this machine into a hardware profile;
// `plan` turns a workload or a recorded trace, a profile and memory budgets into a placement for
// every table (a store config), with hit-rate curves and a report. See bench/tune/commands.hpp.

#include <CLI/CLI.hpp>

#include <string>

#include "bench/tune/commands.hpp"

int main(int argc, char** argv) {
  using strata::tune::CalibrateArgs;
  using strata::tune::PlanArgs;
  CLI::App app{"strata-tune: memory-tier tuning (calibrate a profile, plan placements)"};
  app.require_subcommand(1);

  CalibrateArgs c;
  CLI::App* cal = app.add_subcommand("calibrate", "measure this machine's host memory into a hardware profile");
  cal->add_option("--out", c.out, "profile file to write (default: print it)");
  cal->add_option("--from", c.from, "profile giving the GPU numbers: a name in bench/profiles or a file");
  cal->add_option("--name", c.name, "name of the new profile (default calibrated-<from>)");
  cal->add_option("--row-bytes", c.row_bytes, "gather row sizes in bytes")->delimiter(',');
  cal->add_option("--probe-mib", c.probe_mib, "MiB of each probe table");
  cal->add_option("--lookups", c.lookups, "rows gathered per timed pass");
  cal->add_option("--threads", c.threads, "threads per NUMA node (0: the node's cores)");

  PlanArgs p;
  CLI::App* plan = app.add_subcommand("plan", "place every table within HBM and host memory budgets");
  plan->add_option("--workload", p.workload, "workload JSON (a file, or inline starting with '{')");
  plan->add_option("--trace", p.trace, "recorded trace (STRTRACE, docs/trace-format.md)");
  plan->add_option("--profile", p.profile, "hardware profile: a name in bench/profiles or a file");
  plan->add_option("--hbm-budget", p.hbm_budget, "HBM the plan may use, e.g. 80GB (default: the profile's)");
  plan->add_option("--host-budget", p.host_budget, "host memory the plan may use (default: the profile's)");
  plan->add_option("--steps", p.steps, "workload: steps planned (default twice its distinct batches)");
  plan->add_option("--dim", p.dim, "trace: row width of every table");
  plan->add_option("--optimizer", p.optimizer, "optimizer of every table: sgd | adagrad | rowwise_adagrad | adam");
  plan->add_option("--max-in-flight", p.max_in_flight, "batches in flight (staging)");
  plan->add_option("--threads", p.threads, "store worker threads (0: all cores)");
  plan->add_option("--points", p.points, "curve points per table in the reports");
  plan->add_option("--belady-points", p.belady_points,
                   "curve points per table with Belady's optimum (0: none; each a pass over the keys)");
  plan->add_flag("!--no-progress", p.progress, "no progress lines");
  plan->add_option("--out", p.out, "write the plan as a store config (JSON)");
  plan->add_option("--html", p.html, "write the report as a self-contained HTML page");

  CLI11_PARSE(app, argc, argv);
  std::string command = "strata-tune";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  if (cal->parsed()) {
    c.command = command;
    return strata::tune::run_calibrate(c);
  }
  return strata::tune::run_plan(p);
}
