#include "tune/input_args.hpp"

#include <cstdio>
#include <functional>
#include <limits>

#include "toolkit/bounded_input.hpp"
#include "toolkit/feature_tables.hpp"
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

// The mapping of a file's features to tables: --tables TABLE=FEATURE+..., else args.features.
Result<std::vector<bench::TableFeatures>> feature_map(const InputArgs& a) {
  if (!tables_map_features(a)) {
    std::vector<bench::TableFeatures> m;
    for (const auto& [table, features] : a.features) m.push_back({table, features});
    return m;
  }
  auto m = bench::parse_table_mapping(a.tables);
  if (!m) return Status::invalid_argument("--tables: " + m.status().message());
  return m;
}

// The tables of the file: a trace's header, or the Criteo table set's 26 columns (a mapping's: the criteo set's).
Result<std::vector<TableSpec>> criteo_set(const InputArgs& a) {
  return criteo_tables(tables_map_features(a) ? "criteo" : a.tables, a.criteo_rows, a.dim);
}

}  // namespace

bool tables_map_features(const InputArgs& a) {
  if (!a.trace.empty()) return a.tables.find('=') != std::string::npos;
  return !a.criteo.empty() && bench::is_table_mapping(a.tables);
}

Status check_input_args(const InputArgs& a) {
  const int given = !a.workload.empty() + !a.trace.empty() + !a.criteo.empty();
  if (given != 1) return Status::invalid_argument("give exactly one of --workload, --trace and --criteo");
  if (!(a.sample > 0.0 && a.sample <= 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", a.sample);
    return Status::invalid_argument(std::string("--sample ") + buf + " (expected a rate in (0, 1], e.g. 0.01)");
  }
  if (!a.trace.empty() && a.tables != "criteo" && !tables_map_features(a))
    return Status::invalid_argument("--tables " + bench::quote_prefix(a.tables) +
                                    ": with --trace, --tables maps the trace's features to tables, "
                                    "TABLE=FEATURE[+FEATURE...],... (the tables are the trace's)");
  if (!a.workload.empty() && bench::is_table_mapping(a.tables))
    return Status::invalid_argument("--tables " + bench::quote_prefix(a.tables) +
                                    ": a mapping of features to tables applies to --trace and --criteo files");
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

Result<std::vector<bench::TableShape>> input_tables(const InputArgs& a,
                                                    std::map<std::string, std::vector<std::string>>* features) {
  if (!a.workload.empty()) {
    auto spec = workload_of(a.workload);
    if (!spec) return Status::invalid_argument("--workload: " + spec.status().message());
    return bench::workload_tables(*spec);
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<bench::TableFeatures> mapping, feature_map(a));
  std::vector<bench::TableShape> shapes;
  std::vector<bench::SourceTable> tables;
  std::vector<bench::TraceTable> names;  // the file's features
  if (!a.trace.empty()) {
    STRATA_ASSIGN_OR_RETURN(const bench::TraceReader reader, bench::TraceReader::open(a.trace));
    names = reader.tables();
    STRATA_ASSIGN_OR_RETURN(tables,
                            bench::map_features(mapping, names, "trace '" + a.trace + "'", bench::MappedRows::kMax));
    for (const bench::SourceTable& t : tables) shapes.push_back({t.name, t.rows, a.dim});
  } else {
    STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_set(a));
    STRATA_ASSIGN_OR_RETURN(const bench::CriteoColumns columns, bench::map_criteo_columns(mapping, specs));
    tables = columns.tables;
    for (const TableSpec& s : specs) names.push_back({s.name, s.rows});
    for (const bench::SourceTable& t : tables) shapes.push_back({t.name, t.rows, specs[t.features.front()].dim});
  }
  if (features)
    for (const bench::SourceTable& t : tables)
      if (auto f = bench::feature_names(t, names); !f.empty()) (*features)[t.name] = std::move(f);
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
  STRATA_ASSIGN_OR_RETURN(const std::vector<bench::TableFeatures> mapping, feature_map(a));
  if (!a.trace.empty()) return load_trace(a.trace, a.dim, optimizer, sampling, progress, mapping);
  STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_set(a));
  return load_criteo(a.criteo, specs, a.batch, a.criteo_label, optimizer, sampling, progress, mapping);
}

Result<InputSource> open_input_source(const InputArgs& a, const ProgressFn& progress) {
  InputSource in;
  if (!a.workload.empty()) {
    auto spec = workload_of(a.workload);
    if (!spec) return Status::invalid_argument("--workload: " + spec.status().message());
    in.steps = a.steps > 0 ? a.steps : 2 * std::int64_t{spec->distinct_batches};
    STRATA_RETURN_IF_ERROR(check_workload_memory(*spec, 0, a.steps > 0));  // its distinct batches (streamed after)
    if (progress) progress("generating " + std::to_string(spec->distinct_batches) + " distinct batches");
    in.source = bench::BatchSource::generated(bench::make_batches(*spec));
    for (const bench::TableShape& t : bench::workload_tables(*spec))
      in.tables.push_back({t.name, t.rows, {in.tables.size()}});
    in.what = "workload " + bench::workload_to_json(*spec) + ", " + std::to_string(in.steps) + " steps";
    return in;
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<bench::TableFeatures> mapping, feature_map(a));
  std::function<void(std::int64_t, std::int64_t)> checked;
  const std::string path = a.trace.empty() ? a.criteo : a.trace;
  if (progress)
    checked = [progress, path](std::int64_t done, std::int64_t total) {
      progress("checking " + path + ": " + std::to_string(done) + (total > 0 ? " of " + std::to_string(total) : "") +
               " batches");
    };
  constexpr std::int64_t kAll = std::numeric_limits<std::int64_t>::max();
  if (!a.trace.empty()) {
    STRATA_ASSIGN_OR_RETURN(in.source, bench::BatchSource::open_trace(a.trace, kAll, checked));
    STRATA_ASSIGN_OR_RETURN(in.tables, bench::map_features(mapping, in.source.tables(), "trace '" + a.trace + "'",
                                                           bench::MappedRows::kMax));
  } else {
    if (a.batch < 1) return Status::invalid_argument("--batch " + std::to_string(a.batch) + " (expected >= 1)");
    STRATA_ASSIGN_OR_RETURN(const std::vector<TableSpec> specs, criteo_set(a));
    STRATA_ASSIGN_OR_RETURN(const bench::CriteoColumns columns, bench::map_criteo_columns(mapping, specs));
    bench::CriteoTsvOptions options;
    options.batch_size = a.batch;
    options.has_label = a.criteo_label;
    options.key_columns = columns.key_columns;
    STRATA_ASSIGN_OR_RETURN(in.source,
                            bench::BatchSource::open_criteo(a.criteo, columns.columns, options, kAll, checked));
    in.tables = columns.tables;
  }
  in.steps = in.source.size();
  in.what = in.source.kind() + " " + path + ", " + std::to_string(in.steps) + " steps";
  return in;
}

}  // namespace strata::tune
