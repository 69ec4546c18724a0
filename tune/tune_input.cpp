#include "tune/tune_input.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/row_math.hpp"
#include "store/model/table_cost.hpp"
#include "toolkit/criteo_tsv.hpp"

namespace strata::tune {

std::uint64_t Sampling::threshold() const noexcept {
  const double t = std::round(rate * static_cast<double>(kSampleModulus));
  return std::clamp<std::uint64_t>(static_cast<std::uint64_t>(std::max(1.0, t)), 1, kSampleModulus);
}

double Sampling::effective_rate() const noexcept {
  return static_cast<double>(threshold()) / static_cast<double>(kSampleModulus);
}

bool Sampling::keeps(std::uint64_t key) const noexcept {
  return (mix64(key ^ kSampleSalt) & (kSampleModulus - 1)) < threshold();
}

namespace {

double per_step(std::int64_t total, std::int64_t steps) {
  return steps > 0 ? static_cast<double>(total) / static_cast<double>(steps) : 0.0;
}

}  // namespace

double TableTrace::keys_per_step() const noexcept { return per_step(key_count, keys.num_batches()); }
double TableTrace::bags_per_step() const noexcept { return per_step(bags, keys.num_batches()); }
double TableTrace::distinct_per_step() const noexcept { return per_step(distinct_count, keys.num_batches()); }

InputBuilder::InputBuilder(const std::vector<TableSpec>& specs, const Sampling& sampling,
                           std::vector<std::vector<std::size_t>> features)
    : features_(std::move(features)), sampling_(sampling) {
  if (features_.empty())
    for (std::size_t t = 0; t < specs.size(); ++t) features_.push_back({t});
  for (const auto& f : features_)
    for (const std::size_t i : f) num_features_ = std::max(num_features_, i + 1);
  in_.sample_rate = sampling.rate < 1.0 ? sampling.effective_rate() : 1.0;
  checking_ = in_.sample_rate < 1.0 && sampling.check_keys > 0;
  for (const TableSpec& s : specs) {
    TableTrace t;
    t.spec = s;
    t.keys.batch_offsets.push_back(0);
    if (checking_) {
      t.check.batch_offsets.push_back(0);
      t.check_sample.batch_offsets.push_back(0);
    }
    in_.tables.push_back(std::move(t));
  }
}

std::int64_t step_feature_rows(const TableTrace& t, const TableConfig& table, std::int64_t b) {
  if (t.feature_keys.empty()) return 0;
  const auto i = static_cast<std::size_t>(b);
  return feature_rows(table, t.step_bags[i], t.feature_keys[i]);
}

Status InputBuilder::add(const KeyBatch& batch) {
  if (batch.features.size() > num_features_)
    return Status::invalid_argument("step " + std::to_string(in_.steps) + " has " +
                                    std::to_string(batch.features.size()) + " features (expected at most " +
                                    std::to_string(num_features_) + ", those of the tables)");
  const bool sampled = in_.sample_rate < 1.0;
  std::int64_t step_keys = 0;
  for (const JaggedKeys& f : batch.features) step_keys += f.num_keys();
  // The exact keys of the first steps, while they stay within check_keys.
  if (checking_ && checked_ + step_keys > sampling_.check_keys) checking_ = false;
  if (checking_) checked_ += step_keys;
  for (std::size_t t = 0; t < in_.tables.size(); ++t) {
    TableTrace& tt = in_.tables[t];
    // The table's keys this step: those of all its features, which the store dedups together.
    // Its bags: the batch's, once (a table of several features merges them bag by bag).
    std::int64_t keys = 0, bags = 0;
    scratch_.clear();
    std::vector<std::int64_t> feature_keys;
    for (const std::size_t i : features_[t]) {
      if (i >= batch.features.size()) {
        feature_keys.push_back(0);
        continue;
      }
      const JaggedKeys& f = batch.features[i];
      keys += f.num_keys();
      bags = std::max(bags, f.batch_size());
      feature_keys.push_back(f.num_keys());
      scratch_.insert(scratch_.end(), f.keys.begin(), f.keys.end());
      for (const Key k : f.keys) {
        const auto key = static_cast<std::uint64_t>(k);
        const bool kept = !sampled || sampling_.keeps(cache::cache_key(static_cast<int>(t), k));
        if (kept) tt.keys.keys.push_back(key);
        if (checking_) {
          tt.check.keys.push_back(key);
          if (kept) tt.check_sample.keys.push_back(key);
        }
      }
    }
    tt.key_count += keys;
    tt.bags += bags;
    tt.step_bags.push_back(bags);
    if (feature_keys.size() > 1) tt.feature_keys.push_back(std::move(feature_keys));
    tt.max_keys = std::max(tt.max_keys, keys);
    std::sort(scratch_.begin(), scratch_.end());
    const auto distinct = static_cast<std::int64_t>(std::unique(scratch_.begin(), scratch_.end()) - scratch_.begin());
    tt.distinct_count += distinct;
    tt.max_distinct = std::max(tt.max_distinct, distinct);
    tt.keys.batch_offsets.push_back(tt.keys.num_keys());
    if (checking_) {
      tt.check.batch_offsets.push_back(tt.check.num_keys());
      tt.check_sample.batch_offsets.push_back(tt.check_sample.num_keys());
    }
  }
  ++in_.steps;
  return Status::ok();
}

TuneInput InputBuilder::finish(std::string source) && {
  in_.source = std::move(source);
  if (in_.sample_rate < 1.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", keys sampled at %.4g%%", 100.0 * in_.sample_rate);
    in_.source += buf;
  }
  return std::move(in_);
}

namespace {

std::vector<TableSpec> specs_of(const std::vector<bench::SourceTable>& tables, const std::vector<int>& dims,
                                OptimizerKind optimizer) {
  std::vector<TableSpec> specs;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    TableSpec s;
    s.name = tables[t].name;
    s.rows = tables[t].rows;
    s.dim = dims[t];
    s.optimizer.kind = optimizer;
    specs.push_back(s);
  }
  return specs;
}

Status check_dim(int dim) {
  if (dim <= 0 || dim > kMaxDim)
    return Status::invalid_argument("--dim " + std::to_string(dim) + " (expected in [1, " + std::to_string(kMaxDim) +
                                    "])");
  return Status::ok();
}

}  // namespace

double workload_step_bytes(const bench::WorkloadSpec& spec) {
  const auto tables = static_cast<double>(bench::workload_tables(spec).size());
  return 8.0 * bench::max_batch_keys(spec) + 16.0 * tables;
}

Result<TuneInput> load_workload(const bench::WorkloadSpec& spec, std::int64_t steps, OptimizerKind optimizer,
                                const Sampling& sampling, const ProgressFn& progress) {
  STRATA_RETURN_IF_ERROR(bench::validate(spec));
  if (steps < 1) return Status::invalid_argument("--steps " + std::to_string(steps) + " (expected >= 1)");
  std::vector<bench::SourceTable> tables;
  std::vector<int> dims;
  for (const bench::TableShape& s : bench::workload_tables(spec)) {
    tables.push_back({s.name, s.rows, {tables.size()}});
    dims.push_back(s.dim);
  }
  InputBuilder builder(specs_of(tables, dims, optimizer), sampling);
  if (progress) progress("generating " + std::to_string(spec.distinct_batches) + " distinct batches");
  const std::vector<KeyBatch> batches = bench::make_batches(spec);
  for (std::int64_t s = 0; s < steps; ++s)
    STRATA_RETURN_IF_ERROR(builder.add(batches[static_cast<std::size_t>(s) % batches.size()]));
  return std::move(builder).finish("workload " + bench::workload_to_json(spec) + ", " + std::to_string(steps) +
                                   " steps");
}

Result<TuneInput> load_source(const bench::BatchSource& source, const std::vector<bench::SourceTable>& tables,
                              const std::vector<int>& dims, OptimizerKind optimizer, const Sampling& sampling,
                              const ProgressFn& progress) {
  if (dims.size() != tables.size())
    return Status::invalid_argument(std::to_string(dims.size()) + " dims for " + std::to_string(tables.size()) +
                                    " tables");
  if (!(sampling.rate > 0.0 && sampling.rate <= 1.0))
    return Status::invalid_argument("--sample " + std::to_string(sampling.rate) + " (expected a rate in (0, 1])");
  std::vector<std::vector<std::size_t>> features;
  features.reserve(tables.size());
  for (const bench::SourceTable& t : tables) features.push_back(t.features);
  InputBuilder builder(specs_of(tables, dims, optimizer), sampling, std::move(features));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<bench::BatchCursor> cursor, source.cursor(0, 1));
  for (std::int64_t i = 0; i < source.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch b, cursor->next());
    STRATA_RETURN_IF_ERROR(builder.add(b));
    if (progress && (i % 256 == 255 || i + 1 == source.size()))
      progress("read " + std::to_string(i + 1) + " of " + std::to_string(source.size()) + " batches");
  }
  TuneInput in =
      std::move(builder).finish(source.kind() + " " + source.path() + ", " + std::to_string(source.size()) + " steps");
  for (std::size_t t = 0; t < tables.size(); ++t)
    in.tables[t].features = bench::feature_names(tables[t], source.tables());
  std::int64_t keys = 0;
  for (const TableTrace& t : in.tables) keys += t.key_count;
  if (keys == 0)
    return Status::invalid_argument(source.kind() + " '" + source.path() + "' has no keys (" +
                                    std::to_string(in.steps) + " batches; expected at least one key to plan for)");
  return in;
}

namespace {

// BatchSource's progress, as strata-tune's lines.
std::function<void(std::int64_t, std::int64_t)> check_progress(const ProgressFn& progress, const std::string& path) {
  if (!progress) return {};
  return [progress, path](std::int64_t done, std::int64_t total) {
    progress("checking " + path + ": " + std::to_string(done) + (total > 0 ? " of " + std::to_string(total) : "") +
             " batches");
  };
}

}  // namespace

Result<TuneInput> load_trace(const std::string& path, int dim, OptimizerKind optimizer, const Sampling& sampling,
                             const ProgressFn& progress, const std::vector<bench::TableFeatures>& mapping) {
  STRATA_RETURN_IF_ERROR(check_dim(dim));
  {
    STRATA_ASSIGN_OR_RETURN(const bench::TraceReader header, bench::TraceReader::open(path));
    if (header.num_batches() == 0)
      return Status::invalid_argument("trace '" + path +
                                      "' has no keys (0 batches; expected at least one key to plan for)");
  }
  STRATA_ASSIGN_OR_RETURN(
      const bench::BatchSource source,
      bench::BatchSource::open_trace(path, std::numeric_limits<std::int64_t>::max(), check_progress(progress, path)));
  STRATA_ASSIGN_OR_RETURN(
      const std::vector<bench::SourceTable> tables,
      bench::map_features(mapping, source.tables(), "trace '" + path + "'", bench::MappedRows::kMax));
  return load_source(source, tables, std::vector<int>(tables.size(), dim), optimizer, sampling, progress);
}

Result<std::vector<TableSpec>> criteo_tables(const std::string& table_set, std::int64_t criteo_rows, int dim) {
  STRATA_RETURN_IF_ERROR(check_dim(dim));
  bench::WorkloadSpec spec;
  spec.dim = dim;
  const std::string set = table_set == "criteo" ? "criteo:" + std::to_string(criteo_rows) : table_set;
  if (Status s = bench::apply_table_set(spec, set); !s.is_ok())
    return Status::invalid_argument("--tables: " + s.message());
  std::vector<TableSpec> specs;
  for (const bench::TableShape& t : bench::workload_tables(spec)) {
    TableSpec s;
    s.name = t.name;
    s.rows = t.rows;
    s.dim = t.dim;
    specs.push_back(s);
  }
  if (specs.size() != static_cast<std::size_t>(bench::kCriteoSparseFeatures))
    return Status::invalid_argument("--tables " + table_set + ": " + std::to_string(specs.size()) +
                                    " tables (expected 26, one per categorical column C1..C26: criteo, "
                                    "criteo:TOTAL_ROWS or a list of 26)");
  return specs;
}

Result<TuneInput> load_criteo(const std::string& path, const std::vector<TableSpec>& tables, std::int64_t batch,
                              bool has_label, OptimizerKind optimizer, const Sampling& sampling,
                              const ProgressFn& progress, const std::vector<bench::TableFeatures>& mapping) {
  if (batch < 1) return Status::invalid_argument("--batch " + std::to_string(batch) + " (expected >= 1)");
  STRATA_ASSIGN_OR_RETURN(const bench::CriteoColumns columns, bench::map_criteo_columns(mapping, tables));
  bench::CriteoTsvOptions options;
  options.batch_size = batch;
  options.has_label = has_label;
  options.key_columns = columns.key_columns;
  STRATA_ASSIGN_OR_RETURN(
      const bench::BatchSource source,
      bench::BatchSource::open_criteo(path, columns.columns, options, std::numeric_limits<std::int64_t>::max(),
                                      check_progress(progress, path)));
  std::vector<int> dims;
  for (const bench::SourceTable& t : columns.tables) dims.push_back(tables[t.features.front()].dim);
  return load_source(source, columns.tables, dims, optimizer, sampling, progress);
}

}  // namespace strata::tune
