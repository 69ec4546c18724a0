// strata-tune capacity: read the keys, replay them through the key index at every capacity, report.

#include <cmath>
#include <iostream>
#include <memory>

#include "store/store_config.hpp"
#include "toolkit/cli_flags.hpp"
#include "toolkit/machine_info.hpp"
#include "tune/capacity.hpp"
#include "tune/command_util.hpp"
#include "tune/commands.hpp"
#include "tune/input_args.hpp"

namespace strata::tune {
namespace {

// The options of the arguments, checked (the CLI checks most ranges already; a caller of run_capacity may not).
Result<CapacityOptions> capacity_options(const CapacityArgs& a) {
  CapacityOptions o;
  o.dynamic.admit_after = a.admit_after;
  auto eviction = parse_eviction(a.eviction);
  if (!eviction) return Status::invalid_argument("--eviction '" + a.eviction + "' (expected lru or lfu)");
  o.dynamic.eviction = *eviction;
  o.dynamic.evict_after_steps = a.evict_after_steps;
  if (!a.capacities.empty()) {
    auto caps = bench::parse_integer_list(a.capacities, 1, kMaxDynamicCapacity);
    if (!caps) return Status::invalid_argument("--capacities " + caps.status().message());
    o.capacities = std::move(caps).value();
  }
  o.points = a.points;
  o.refine = a.refine;
  if (!std::isfinite(a.tolerance_points) || a.tolerance_points < 0 || a.tolerance_points > 100) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", a.tolerance_points);
    return Status::invalid_argument(std::string("--tolerance ") + buf + " (expected points in [0, 100])");
  }
  o.tolerance = a.tolerance_points / 100.0;
  o.in_flight = a.in_flight;
  o.spread = a.spread;
  STRATA_RETURN_IF_ERROR(check_capacity_options(o));
  return o;
}

}  // namespace

int run_capacity(const CapacityArgs& a) {
  if (Status s = check_input_args(a.input); !s.is_ok()) return fail(s.message());
  if (a.input.sample != 1.0) return fail("--sample: capacity replays every key (expected no sampling)");
  auto options = capacity_options(a);
  if (!options) return fail(options.status().message());
  for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--out", a.out}, {"--html", a.html}})
    if (!path.empty())
      if (Status s = check_output(path, flag); !s.is_ok()) return fail(s.message());

  const ProgressFn progress = progress_printer(a.progress);
  auto input = open_input_source(a.input, progress);
  if (!input) return fail(input.status().message());
  const bench::BatchSource& source = input->source;
  const std::int64_t steps = input->steps;
  const BatchPass pass = [&](const std::function<Status(const KeyBatch&)>& each) -> Status {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<bench::BatchCursor> cursor, source.cursor(0, 1));
    for (std::int64_t i = 0; i < steps; ++i) {
      STRATA_ASSIGN_OR_RETURN(const KeyBatch b, cursor->next());
      STRATA_RETURN_IF_ERROR(each(b));
    }
    return Status::ok();
  };
  const double usable = bench::usable_memory_bytes(bench::describe_machine());
  auto plan = plan_capacity(input->tables, steps, pass, *options, usable, progress);
  if (!plan) return fail(plan.status().message(), plan.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
  plan->source = input->what;
  std::int64_t uses = 0;
  for (std::size_t t = 0; t < plan->tables.size(); ++t) {
    plan->tables[t].features = bench::feature_names(input->tables[t], source.tables());
    uses += plan->tables[t].uses;
  }
  if (uses == 0) return fail(input->what + " has no keys (expected at least one key to plan for)");

  std::cout << capacity_console(*plan);
  if (!a.out.empty()) {
    if (Status s = write_output(a.out, capacity_json(*plan) + "\n"); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.out << "\n";
  }
  if (!a.html.empty()) {
    if (Status s = write_output(a.html, capacity_html(*plan)); !s.is_ok()) return fail(s.message(), 1);
    std::cout << "wrote " << a.html << "\n";
  }
  return 0;
}

}  // namespace strata::tune
