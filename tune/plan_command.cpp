// strata-tune plan: read the keys, check the budgets, compute the curves, plan, report.

#include <algorithm>
#include <iostream>

#include "toolkit/cli_flags.hpp"
#include "toolkit/machine_info.hpp"
#include "toolkit/profiles.hpp"
#include "toolkit/workload.hpp"
#include "tune/command_util.hpp"
#include "tune/commands.hpp"
#include "tune/curves.hpp"
#include "tune/input_args.hpp"
#include "tune/plan_report.hpp"
#include "tune/planner.hpp"
#include "tune/shard_traces.hpp"
#include "tune/text.hpp"

namespace strata::tune {
namespace {

// Upper bound of --ranks: far above any world this store targets, low enough to refuse a typo.
constexpr int kMaxRanks = 4096;

// A budget flag's size, or `fallback_bytes` when the flag was not given (given empty, it is refused).
Result<double> budget(const std::string& flag, const std::optional<std::string>& text, double fallback_bytes) {
  if (!text) return fallback_bytes;
  return bench::parse_byte_size(*text, flag);
}

// The curves of every rank's shard of every table (an empty curve for a rank that holds none).
Result<std::vector<std::vector<HitCurve>>> shard_curves(const ShardInputs& shards, int points, double sample_rate,
                                                        const ProgressFn& progress) {
  std::vector<std::vector<HitCurve>> out;
  for (const std::vector<TableTrace>& table : shards.traces) {
    out.emplace_back();
    for (const TableTrace& s : table) {
      if (progress) progress("curves of table " + s.spec.name + "'s shards");
      if (s.spec.rows == 0) {
        out.back().emplace_back();
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(HitCurve c, table_curve(s, points, 0, sample_rate));
      out.back().push_back(std::move(c));
    }
  }
  return out;
}

// Steps below which a hit-rate curve is mostly the first use of each row (cold misses): plan warns.
constexpr std::int64_t kMinCurveSteps = 10;

// What the plan should say before its numbers: an input too short for a curve, and a host budget
// (per rank, times the ranks sharing a host) above this machine's memory.
std::vector<std::string> plan_warnings(const PlanArgs& a, const TuneInput& input, const PlanOptions& po,
                                       double ranks_per_host, const HardwareProfile& profile) {
  std::vector<std::string> w;
  if (input.steps < kMinCurveSteps) {
    std::string fix = "give a longer input";
    if (!a.input.criteo.empty()) {
      // Every sample is one bag of each table: the file's samples.
      const std::int64_t samples = input.tables.empty() ? 0 : input.tables.front().bags;
      const std::int64_t batch = std::max<std::int64_t>(1, samples / kMinCurveSteps);
      fix = "lower --batch (" + std::to_string(a.input.batch) + " samples per step; " + std::to_string(batch) +
            " or fewer give " + std::to_string(kMinCurveSteps) + " steps or more) or give a longer file";
    } else if (!a.input.trace.empty()) {
      fix = "record a longer trace";
    } else {
      fix = "give --steps " + std::to_string(kMinCurveSteps) + " or more";
    }
    w.push_back("the input has " + std::to_string(input.steps) + " steps: over fewer than " +
                std::to_string(kMinCurveSteps) +
                " a hit-rate curve is mostly the first use of each row, so the caches' hit rates and the plan say "
                "little; " +
                fix);
  }
  const double total = static_cast<double>(bench::describe_machine().memory_total_bytes);
  const double host = po.host_budget_bytes * ranks_per_host;
  if (total > 0 && host > total)
    w.push_back("--host-budget " + bytes_text(po.host_budget_bytes) +
                (a.host_budget ? std::string() : " (the profile " + profile.name + "'s host_memory_gb)") +
                (ranks_per_host > 1 ? " per rank, " + bytes_text(host) + " for the ranks sharing a host," : "") +
                " is more than this machine's memory (" + bytes_text(total) +
                ", MemTotal in /proc/meminfo): the plan is for the profile's machine, and a store opened here "
                "with it may not fit (give --host-budget)");
  return w;
}

}  // namespace

int run_plan(const PlanArgs& a) {
  // Everything that can be checked without the keys, first.
  if (Status s = check_input_args(a.input); !s.is_ok()) return fail(s.message());
  const std::string ppath = bench::profile_path(a.profile);
  auto profile = load_profile_file(ppath);
  if (!profile) return fail("--profile " + a.profile + ": " + profile.status().message());
  PlanOptions po;
  auto ranks = parse_ranks(a.ranks, kMaxRanks);
  if (!ranks) return fail(ranks.status().message());
  po.cost.ranks = *ranks;
  // Budgets are per rank: one GPU's HBM, and the host memory of the ranks sharing a host.
  const double ranks_per_host = std::max(1.0, std::min<double>(*ranks, profile->gpus.value));
  auto hbm = budget("--hbm-budget", a.hbm_budget, profile->hbm_capacity_gb.value * 1e9);
  if (!hbm) return fail(hbm.status().message());
  auto host = budget("--host-budget", a.host_budget, profile->host_memory_gb.value * 1e9 / ranks_per_host);
  if (!host) return fail(host.status().message());
  po.hbm_budget_bytes = *hbm;
  po.host_budget_bytes = *host;
  po.cost.max_in_flight = a.max_in_flight;
  po.cost.trainer_on_device = a.trainer != "host";
  po.cost.threads = a.threads;
  po.cost.numa_nodes = static_cast<int>(profile->numa_nodes.size());
  po.cost.l2_bytes = static_cast<std::uint64_t>(profile->l2_cache_bytes.value);
  auto optimizer = parse_optimizer(a.optimizer);
  if (!optimizer) return fail("--optimizer: " + optimizer.status().message());
  if (a.dtype)
    if (Status s = set_plan_dtype(*a.dtype, po); !s.is_ok()) return fail(s.message());
  for (const auto& [flag, path] :
       {std::pair<std::string, std::string>{"--out", a.out}, {"--html", a.html}, {"--json", a.json}})
    if (!path.empty())
      if (Status s = check_output(path, flag); !s.is_ok()) return fail(s.message());

  const ProgressFn progress = progress_printer(a.progress);
  const Result<TuneInput> input = load_input(a.input, *optimizer, progress);
  if (!input) return fail(input.status().message());
  ShardInputs shards;
  if (po.cost.ranks > 1) shards.traces = shard_traces(*input, po.cost.ranks);
  if (Status s = check_budgets(*input, po, shards); !s.is_ok()) return fail(s.message());

  ReportContext ctx;
  ctx.source = input->source;
  ctx.profile = &profile.value();
  ctx.options = po;
  ctx.warnings = plan_warnings(a, *input, po, ranks_per_host, *profile);
  for (const TableTrace& t : input->tables) {
    if (progress) progress("curves of table " + t.spec.name);
    auto c = table_curve(t, a.points, a.belady_points, input->sample_rate);
    if (!c) return fail(c.status().message(), 1);
    ctx.tables.push_back(std::move(c).value());
  }
  if (po.cost.ranks > 1) {
    auto sc = shard_curves(shards, a.points, input->sample_rate, progress);
    if (!sc) return fail(sc.status().message(), 1);
    shards.curves = std::move(sc).value();
  }
  auto plan = make_plan(*input, ctx.tables, *profile, po, shards);
  if (!plan) return fail(plan.status().message());
  // The pools of the tables' record shapes as planned (their dtypes).
  if (progress) progress("curves of the shared pools");
  std::vector<TableSpec> specs;
  for (const TableConfig& tc : plan->config.tables) specs.push_back(tc.spec);
  auto pools = pool_curves(*input, a.points, specs);
  if (!pools) return fail(pools.status().message(), 1);
  ctx.pools = std::move(pools).value();

  std::cout << console_summary(*plan, ctx);
  if (!a.out.empty()) {
    if (Status s = write_output(a.out, to_json(plan->config) + "\n"); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.out << " (a store config: Store::open accepts it as is)\n";
  }
  if (!a.html.empty()) {
    if (Status s = write_output(a.html, html_report(*plan, ctx)); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.html << "\n";
  }
  if (!a.json.empty()) {
    if (Status s = write_output(a.json, plan_json(*plan, ctx) + "\n"); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.json << "\n";
  }
  return 0;
}

}  // namespace strata::tune
