#include "bench/tune/input_args.hpp"

#include <cstdio>

#include "bench/bounded_input.hpp"
#include "bench/trace.hpp"

namespace strata::tune {

Status check_input_args(const InputArgs& a) {
  const int given = !a.workload.empty() + !a.trace.empty() + !a.criteo.empty();
  if (given != 1) return Status::invalid_argument("give exactly one of --workload, --trace and --criteo");
  if (!(a.sample > 0.0 && a.sample <= 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", a.sample);
    return Status::invalid_argument(std::string("--sample ") + buf + " (expected a rate in (0, 1], e.g. 0.01)");
  }
  if (a.sample_check_keys < 0)
    return Status::invalid_argument("--sample-check-keys " + std::to_string(a.sample_check_keys) + " (expected >= 0)");
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
    return load_workload(*spec, a.steps > 0 ? a.steps : 2 * spec->distinct_batches, optimizer, sampling, progress);
  }
  if (!a.trace.empty()) return load_trace(a.trace, a.dim, optimizer, sampling, progress);
  STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_tables(a.tables, a.criteo_rows, a.dim));
  return load_criteo(a.criteo, specs, a.batch, a.criteo_label, optimizer, sampling, progress);
}

}  // namespace strata::tune
