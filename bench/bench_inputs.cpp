#include "bench/bench_inputs.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "store/io/file_io.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/cli_flags.hpp"
#include "toolkit/criteo_tsv.hpp"
#include "toolkit/feature_tables.hpp"
#include "toolkit/trace.hpp"

namespace strata::bench {
namespace {

// The names of `names`' first few entries, for messages ("a, b, c" or "a, b, c, ... (40 tables)").
template <typename T, typename Name>
std::string some_names(const std::vector<T>& items, Name name) {
  std::string s;
  for (std::size_t i = 0; i < items.size() && i < 8; ++i) s += (i ? ", " : "") + name(items[i]);
  if (items.size() > 8) s += ", ... (" + std::to_string(items.size()) + " tables)";
  return s;
}

}  // namespace

Result<std::vector<double>> parse_fractions(const std::string& s) {
  std::vector<double> out;
  for (const auto& item : split_list(s)) {
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(f > 0.0 && f <= 1.0))
      return Status::invalid_argument("--sweep-cache: '" + item +
                                      "' is not a cache fraction in (0, 1] (expected e.g. 0.01,0.1,0.3)");
    out.push_back(f);
  }
  if (out.empty()) return Status::invalid_argument("--sweep-cache is empty (expected e.g. 0.01,0.1,0.3)");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<HardwareProfile> load_profile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_input_file(path, "profile file"));
  STRATA_RETURN_IF_ERROR(parse_json_limited(text, "profile '" + path + "'").status());
  return parse_hardware_profile(text, path);
}

Status check_output_path(const std::string& flag, const std::string& path, bool replaced) {
  const std::string who = flag + " " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::invalid_argument(who + ": is a directory (expected a file path)");
    if (!S_ISREG(st.st_mode)) {
      if (!replaced) return Status::ok();
      return Status::invalid_argument(who + ": is " +
                                      (S_ISCHR(st.st_mode) ? "a character device" : "not a regular file") +
                                      " (expected a file path; the file is written next to it and renamed into place)");
    }
  }
  auto probe = detail::AtomicFileWriter::create(path);  // its temporary file is removed when `probe` goes
  if (!probe) return Status::invalid_argument(who + ": cannot write there (" + probe.status().message() + ")");
  return Status::ok();
}

Status load_config_mode(Options& o) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_input_file(o.config_file, "config file"));
  STRATA_RETURN_IF_ERROR(parse_json_limited(text, "config").status());
  STRATA_ASSIGN_OR_RETURN(o.config, parse_store_config(text));
  std::string stem = o.config_file.substr(o.config_file.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find_last_of('.'));
  o.config_name = stem.empty() || find_mode(stem) ? "config" : stem;
  o.config_summary = "store config " + o.config_file + " as given (its placements, caches, optimizers, threads)";
  const auto& tables = o.config.tables;
  const bool cached = std::any_of(tables.begin(), tables.end(), [](const TableConfig& t) {
    return t.placement == Placement::kCached || t.placement == Placement::kHybrid;
  });
  const bool device =
      std::any_of(tables.begin(), tables.end(), [](const TableConfig& t) { return t.placement != Placement::kCpu; });
  o.config_mode = ModeDescriptor{o.config_name.c_str(),
                                 o.config_summary.c_str(),
                                 cached ? Placement::kCached : tables.front().placement,
                                 o.config.offload_gather,
                                 device,
                                 true};
  if (!o.tables_given && o.workload_file.empty() && o.trace_file.empty() && o.criteo_file.empty()) {
    o.workload.table_list.clear();
    for (const TableConfig& t : tables) o.workload.table_list.push_back({t.spec.name, t.spec.rows, t.spec.dim});
  }
  return Status::ok();
}

Status check_config_tables(const StoreConfig& c, const std::vector<TableShape>& shapes,
                           const std::map<std::string, std::vector<std::string>>& features) {
  const auto config_names = [&] { return some_names(c.tables, [](const TableConfig& t) { return t.spec.name; }); };
  const auto workload_names = [&] { return some_names(shapes, [](const TableShape& t) { return t.name; }); };
  for (const TableShape& w : shapes) {
    const auto t =
        std::find_if(c.tables.begin(), c.tables.end(), [&](const TableConfig& tc) { return tc.spec.name == w.name; });
    if (t == c.tables.end())
      return Status::invalid_argument("table '" + w.name +
                                      "' of the workload is not in the config (its tables: " + config_names() + ")");
    if (t->spec.rows != w.rows)
      return Status::invalid_argument("table '" + w.name + "' has " + std::to_string(t->spec.rows) +
                                      " rows in the config but " + std::to_string(w.rows) + " in the workload");
    if (t->spec.dim != w.dim)
      return Status::invalid_argument("table '" + w.name + "' has dim " + std::to_string(t->spec.dim) +
                                      " in the config but " + std::to_string(w.dim) + " in the workload");
    std::vector<std::string> listed;
    for (const FeatureConfig& f : t->features) listed.push_back(f.name);
    const auto it = features.find(w.name);
    const std::vector<std::string> used = it == features.end() ? std::vector<std::string>{} : it->second;
    if (Status s = check_same_features(w.name, listed, "config", used, "workload"); !s.is_ok())
      return Status::invalid_argument(s.message() +
                                      " (a generated workload has one feature per table: give a --trace or --criteo "
                                      "file and, for other features than the config's, --tables TABLE=FEATURE+...)");
  }
  for (const TableConfig& t : c.tables)
    if (std::none_of(shapes.begin(), shapes.end(), [&](const TableShape& w) { return w.name == t.spec.name; }))
      return Status::invalid_argument("table '" + t.spec.name +
                                      "' of the config is not in the workload (its tables: " + workload_names() + ")");
  return Status::ok();
}

namespace {

// The largest --batch that splits a TSV source's lines (all of them: it is shorter than the run)
// into at least `batches` batches (0 when none does).
std::int64_t smaller_batch(const BatchSource& src, std::int64_t batches) {
  return batches > 0 ? src.summary().samples / batches : 0;
}

}  // namespace

void fit_steps_to_source(Options& o, const BatchSource& src, int world) {
  const std::int64_t per_rank = src.size() / std::max(1, world);
  if (o.warmup + o.steps <= per_rank || per_rank < 1 || (o.warmup_given && o.steps_given)) return;
  const int warmup = o.warmup, steps = o.steps;
  // Half the file's batches warm up at most, the rest are timed.
  if (!o.warmup_given) o.warmup = static_cast<int>(std::min<std::int64_t>(o.warmup, per_rank / 2));
  if (!o.steps_given) o.steps = static_cast<int>(std::min<std::int64_t>(o.steps, per_rank - o.warmup));
  if (o.steps < 1 || o.warmup + o.steps > per_rank) {  // what was given does not fit: refused with the flags to lower
    o.warmup = warmup;
    o.steps = steps;
    return;
  }
  std::string more = "record a longer trace for more steps";
  if (!o.criteo_file.empty()) {
    const std::int64_t batch = smaller_batch(src, static_cast<std::int64_t>(warmup + steps) * world);
    more = batch >= 1 ? "for --warmup " + std::to_string(warmup) + " --steps " + std::to_string(steps) +
                            " give a smaller --batch, e.g. --batch " + std::to_string(batch)
                      : "use a longer file for more steps";
  }
  char note[512];
  std::snprintf(note, sizeof note,
                "%s %s has %lld batch%s, fewer than --warmup %d + --steps %d%s need: running --warmup %d --steps %d, "
                "fitted to the file (%s)",
                src.kind().c_str(), (o.trace_file.empty() ? o.criteo_file : o.trace_file).c_str(),
                static_cast<long long>(src.size()), src.size() == 1 ? "" : "es", warmup, steps,
                world > 1 ? (" on " + std::to_string(world) + " ranks").c_str() : "", o.warmup, o.steps, more.c_str());
  o.steps_note = note;
  std::fprintf(stderr, "strata-bench: note: %s\n", note);
}

namespace {

// The mapping of the file's features to tables: --tables TABLE=FEATURE+..., else the --config's features lists.
std::vector<TableFeatures> feature_map_of(const Options& o) {
  if (!o.feature_map.empty() || o.config_file.empty()) return o.feature_map;
  std::vector<TableFeatures> m;
  for (const TableConfig& t : o.config.tables) {
    if (t.features.empty()) continue;
    m.push_back({t.spec.name, {}});
    for (const FeatureConfig& f : t.features) m.back().features.push_back(f.name);
  }
  return m;
}

// Sets the workload's tables (and which features look them up) to the file's: `tables` of its
// `features`, each of dim `dims[its first feature]` (the --config's dim of the table with
// `config_dims` and no --dim).
void set_file_tables(Options& o, const std::vector<SourceTable>& tables, const std::vector<TraceTable>& features,
                     const std::vector<int>& dims, bool config_dims) {
  o.workload.table_list.clear();
  o.table_features.clear();
  o.feature_table.clear();
  for (const SourceTable& t : tables) {
    int dim = dims[t.features.front()];
    const auto c = std::find_if(o.config.tables.begin(), o.config.tables.end(),
                                [&](const TableConfig& tc) { return tc.spec.name == t.name; });
    if (config_dims && !o.config_file.empty() && !o.dim_given && c != o.config.tables.end()) dim = c->spec.dim;
    o.workload.table_list.push_back({t.name, t.rows, dim});
    const std::vector<std::string> names = feature_names(t, features);
    if (names.empty()) continue;
    o.table_features[t.name] = names;
    for (const std::string& f : names) o.feature_table[f] = t.name;
  }
}

// Opens the --criteo file: the 26 columns of the table set (a mapping: of criteo:--criteo-rows), their tables.
Result<BatchSource> open_criteo_source(Options& o, std::int64_t needed,
                                       const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const std::string& path = o.criteo_file;
  const std::vector<TableFeatures> mapping = feature_map_of(o);
  std::vector<TableSpec> set;
  for (const TableShape& t : workload_tables(o.workload)) {
    TableSpec spec;
    spec.name = t.name;
    spec.rows = t.rows;
    spec.dim = t.dim;
    set.push_back(spec);
  }
  if (set.size() != static_cast<std::size_t>(kCriteoSparseFeatures))
    return Status::invalid_argument("--criteo " + path + ": the table set has " + std::to_string(set.size()) +
                                    " tables (expected 26, one per categorical column C1..C26: --tables criteo, "
                                    "criteo:TOTAL_ROWS or a list of 26)");
  auto columns = map_criteo_columns(mapping, set);
  if (!columns) return Status::invalid_argument("--criteo " + path + ": " + columns.status().message());
  CriteoTsvOptions options;
  options.batch_size = o.workload.batch;
  options.has_label = o.criteo_label;
  options.key_columns = columns->key_columns;
  STRATA_ASSIGN_OR_RETURN(BatchSource src, BatchSource::open_criteo(path, columns->columns, options, needed, progress));
  std::vector<int> dims;
  dims.reserve(set.size());
  for (const TableSpec& t : set) dims.push_back(mapping.empty() ? t.dim : o.workload.dim);
  set_file_tables(o, columns->tables, src.tables(), dims, !mapping.empty());
  return src;
}

}  // namespace

Result<BatchSource> open_file_source(Options& o, std::string& table_set, int world) {
  if (!o.trace_file.empty() && !o.criteo_file.empty())
    return Status::invalid_argument("give --trace or --criteo, not both");
  if (!o.trace_file.empty() && ((o.tables_given && o.feature_map.empty()) || !o.workload_file.empty()))
    return Status::invalid_argument("--trace " + o.trace_file +
                                    ": the tables are the trace's features (its header), or the tables a mapping "
                                    "--tables TABLE=FEATURE[+FEATURE...],... makes of them; other --tables, --rows "
                                    "and --workload do not apply (--dim sets their dim)");
  std::int64_t per_phase = static_cast<std::int64_t>(o.warmup + o.steps) * world;
  const std::string& path = o.trace_file.empty() ? o.criteo_file : o.trace_file;
  const auto progress = [&](std::int64_t done, std::int64_t total) {
    if (!o.progress) return;
    std::fprintf(stderr, "\r  reading %s: %lld%s batches", path.c_str(), static_cast<long long>(done),
                 total > 0 ? (" of " + std::to_string(total)).c_str() : "");
    std::fflush(stderr);
  };
  Result<BatchSource> src = Status::invalid_argument("no source");
  if (!o.trace_file.empty()) {
    src = BatchSource::open_trace(path, 2 * per_phase, progress);
    if (src) {
      auto tables = map_features(feature_map_of(o), src->tables(), "trace " + path, MappedRows::kMax);
      if (!tables) return Status::invalid_argument("--trace " + path + ": " + tables.status().message());
      set_file_tables(o, *tables, src->tables(), std::vector<int>(src->tables().size(), o.workload.dim), true);
    }
  } else {
    src = open_criteo_source(o, 2 * per_phase, progress);
  }
  if (o.progress) std::fprintf(stderr, "\n");
  if (!src) return src.status();
  fit_steps_to_source(o, *src, world);
  per_phase = static_cast<std::int64_t>(o.warmup + o.steps) * world;
  if (Status s = check_source_holds_phase(src->kind(), path, src->size(), o.warmup, o.steps, world); !s.is_ok()) {
    // A TSV file makes more batches of fewer lines.
    const std::int64_t batch = smaller_batch(*src, static_cast<std::int64_t>(o.warmup + o.steps) * world);
    if (o.criteo_file.empty() || batch < 1) return s;
    return Status::invalid_argument(s.message() + ", or give a smaller --batch: --batch " + std::to_string(batch) +
                                    " splits its " + std::to_string(src->summary().samples) + " lines into at least " +
                                    std::to_string((o.warmup + o.steps) * world) + " batches");
  }
  // The shape the memory estimate reads: the widest batch, the mean bag, the batches held.
  o.workload.batch = src->summary().max_batch_size;
  o.workload.bag_size = static_cast<int>(std::ceil(src->summary().mean_keys_per_bag));
  o.workload.bag_dist = "fixed";
  o.workload.distinct_batches = static_cast<int>(std::min<std::int64_t>(src->size(), kSourceHeadBatches));
  table_set = src->kind() + " " + path;
  if (src->size() < 2 * per_phase)
    std::fprintf(stderr, "strata-bench: %s %s has %lld batches, fewer than the %lld the run uses: they are cycled\n",
                 src->kind().c_str(), path.c_str(), static_cast<long long>(src->size()),
                 2 * static_cast<long long>(per_phase));
  return src;
}

// Writes the source's batches (the sequence the run cycles) to --dump-trace.
Status dump_trace(const Options& o, const BatchSource& source) {
  // The header names the features, each with its table's rows (a file's features may have fewer: its keys are below).
  std::map<std::string, std::int64_t> rows;
  for (const TableShape& t : workload_tables(o.workload)) rows[t.name] = t.rows;
  std::vector<TraceTable> tables;
  for (const TraceTable& f : source.tables()) tables.push_back({f.name, rows.at(table_of(o, f.name))});
  STRATA_ASSIGN_OR_RETURN(TraceWriter writer, TraceWriter::create(o.dump_trace, tables));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  for (std::int64_t i = 0; i < source.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor->next());
    STRATA_RETURN_IF_ERROR(writer.append(b));
  }
  return writer.close();
}

}  // namespace strata::bench
