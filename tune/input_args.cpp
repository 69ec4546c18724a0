#include "tune/input_args.hpp"

#include <cstdio>

#include "toolkit/bounded_input.hpp"
#include "toolkit/machine_info.hpp"
#include "toolkit/trace.hpp"
#include "tune/text.hpp"

namespace strata::tune {
namespace {

// Refuses, before anything is generated, a workload whose distinct batches, or whose keys over
// `steps` steps (`steps_given`: --steps, else the default), are more than this machine can use.
// The keys alone are the bound: the curves need more memory after, so a plan that passes may still
// be large, but a count that fails here could never be planned.
Status check_workload_memory(const bench::WorkloadSpec& spec, std::int64_t steps, bool steps_given) {
  const double usable = bench::usable_memory_bytes(bench::describe_machine());
  if (usable <= 0) return Status::ok();  // unknown: nothing to check against
  const std::string over =
      " of memory, more than the " + bytes_text(usable) + " this machine can use (" + bench::usable_memory_note() + ")";
  const double batches = bench::max_batch_bytes(spec) * spec.distinct_batches;
  if (batches > usable)
    return Status::invalid_argument("--workload: its " + std::to_string(spec.distinct_batches) +
                                    " distinct batches take up to " + bytes_text(batches) + over +
                                    " (expected a smaller batch, bag_size, distinct_batches or fewer tables)");
  const double per_step = workload_step_bytes(spec);
  if (static_cast<double>(steps) * per_step <= usable - batches) return Status::ok();
  const auto fit = static_cast<std::int64_t>((usable - batches) / per_step);
  const std::string what =
      steps_given ? "--steps " + std::to_string(steps)
                  : "--workload: the default " + std::to_string(steps) + " steps (twice its distinct batches)";
  return Status::invalid_argument(what + ": the keys of " + std::to_string(steps) + " steps take up to " +
                                  bytes_text(static_cast<double>(steps) * per_step) + over + "; at most " +
                                  std::to_string(fit) + " steps of this workload fit");
}

}  // namespace

Status check_input_args(const InputArgs& a) {
  const int given = !a.workload.empty() + !a.trace.empty() + !a.criteo.empty();
  if (given != 1) return Status::invalid_argument("give exactly one of --workload, --trace and --criteo");
  if (!(a.sample > 0.0 && a.sample <= 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", a.sample);
    return Status::invalid_argument(std::string("--sample ") + buf + " (expected a rate in (0, 1], e.g. 0.01)");
  }
  if (!a.workload.empty() && a.sample < 1.0)
    return Status::invalid_argument("--sample applies to --trace and --criteo (a workload is generated in memory)");
  return Status::ok();
}

Result<bench::WorkloadSpec> workload_of(const std::string& w) {
  std::string text = w;
  if (w.empty() || w.front() != '{') {
    STRATA_ASSIGN_OR_RETURN(text, bench::read_input_file(w, "workload file"));
  }
  STRATA_RETURN_IF_ERROR(bench::parse_json_limited(text, "workload").status());
  STRATA_ASSIGN_OR_RETURN(bench::WorkloadSpec spec, bench::parse_workload_json(text));
  STRATA_RETURN_IF_ERROR(bench::validate(spec));
  return spec;
}

Result<std::vector<bench::TableShape>> input_tables(const InputArgs& a) {
  if (!a.workload.empty()) {
    auto spec = workload_of(a.workload);
    if (!spec) return Status::invalid_argument("--workload: " + spec.status().message());
    return bench::workload_tables(*spec);
  }
  std::vector<bench::TableShape> shapes;
  if (!a.trace.empty()) {
    STRATA_ASSIGN_OR_RETURN(const bench::TraceReader reader, bench::TraceReader::open(a.trace));
    for (const bench::TraceTable& t : reader.tables()) shapes.push_back({t.name, t.rows, a.dim});
    return shapes;
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_tables(a.tables, a.criteo_rows, a.dim));
  for (const TableSpec& s : specs) shapes.push_back({s.name, s.rows, s.dim});
  return shapes;
}

Result<TuneInput> load_input(const InputArgs& a, OptimizerKind optimizer, const ProgressFn& progress) {
  Sampling sampling;
  sampling.rate = a.sample;
  sampling.check_keys = a.sample_check_keys;
  if (!a.workload.empty()) {
    auto spec = workload_of(a.workload);
    if (!spec) return Status::invalid_argument("--workload: " + spec.status().message());
    const std::int64_t steps = a.steps > 0 ? a.steps : 2 * std::int64_t{spec->distinct_batches};
    STRATA_RETURN_IF_ERROR(check_workload_memory(*spec, steps, a.steps > 0));
    return load_workload(*spec, steps, optimizer, sampling, progress);
  }
  if (!a.trace.empty()) return load_trace(a.trace, a.dim, optimizer, sampling, progress);
  STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_tables(a.tables, a.criteo_rows, a.dim));
  return load_criteo(a.criteo, specs, a.batch, a.criteo_label, optimizer, sampling, progress);
}

}  // namespace strata::tune
