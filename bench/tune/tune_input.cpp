#include "bench/tune/tune_input.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "bench/trace.hpp"

namespace strata::tune {
namespace {

TableTrace empty_table(const std::string& name, std::int64_t rows, int dim, OptimizerKind optimizer) {
  TableTrace t;
  t.spec.name = name;
  t.spec.rows = rows;
  t.spec.dim = dim;
  t.spec.optimizer.kind = optimizer;
  t.keys.batch_offsets.push_back(0);
  return t;
}

// Appends one step of `batch` to the tables (a table missing from the batch gets an empty step).
void append_step(const KeyBatch& batch, const std::unordered_map<std::string, std::size_t>& index,
                 std::vector<TableTrace>& tables) {
  for (const JaggedKeys& f : batch.features) {
    TableTrace& t = tables[index.at(f.table)];
    for (const Key k : f.keys) t.keys.keys.push_back(static_cast<std::uint64_t>(k));
    t.bags += f.batch_size();
  }
  for (TableTrace& t : tables) t.keys.batch_offsets.push_back(t.keys.num_keys());
}

std::unordered_map<std::string, std::size_t> index_of(const std::vector<TableTrace>& tables) {
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < tables.size(); ++i) index.emplace(tables[i].spec.name, i);
  return index;
}

}  // namespace

double TableTrace::keys_per_step() const noexcept {
  const auto steps = keys.num_batches();
  return steps > 0 ? static_cast<double>(keys.num_keys()) / static_cast<double>(steps) : 0.0;
}

double TableTrace::bags_per_step() const noexcept {
  const auto steps = keys.num_batches();
  return steps > 0 ? static_cast<double>(bags) / static_cast<double>(steps) : 0.0;
}

std::int64_t TableTrace::max_keys_per_step() const noexcept {
  std::int64_t most = 0;
  for (std::int64_t b = 0; b < keys.num_batches(); ++b)
    most = std::max(most, keys.batch_offsets[b + 1] - keys.batch_offsets[b]);
  return most;
}

Result<TuneInput> load_workload(const bench::WorkloadSpec& spec, std::int64_t steps, OptimizerKind optimizer,
                                const ProgressFn& progress) {
  STRATA_RETURN_IF_ERROR(bench::validate(spec));
  if (steps < 1) return Status::invalid_argument("--steps " + std::to_string(steps) + " (expected >= 1)");
  TuneInput in;
  for (const bench::TableShape& s : bench::workload_tables(spec))
    in.tables.push_back(empty_table(s.name, s.rows, s.dim, optimizer));
  if (progress) progress("generating " + std::to_string(spec.distinct_batches) + " distinct batches");
  const std::vector<KeyBatch> batches = bench::make_batches(spec);
  const auto index = index_of(in.tables);
  for (std::int64_t s = 0; s < steps; ++s)
    append_step(batches[static_cast<std::size_t>(s) % batches.size()], index, in.tables);
  in.steps = steps;
  in.source = "workload " + bench::workload_to_json(spec) + ", " + std::to_string(steps) + " steps";
  return in;
}

Result<TuneInput> load_trace(const std::string& path, int dim, OptimizerKind optimizer, const ProgressFn& progress) {
  if (dim <= 0 || dim > kMaxDim)
    return Status::invalid_argument("--dim " + std::to_string(dim) + " (expected in [1, " + std::to_string(kMaxDim) +
                                    "])");
  STRATA_ASSIGN_OR_RETURN(bench::TraceReader reader, bench::TraceReader::open(path));
  TuneInput in;
  for (const bench::TraceTable& t : reader.tables()) in.tables.push_back(empty_table(t.name, t.rows, dim, optimizer));
  const auto index = index_of(in.tables);
  KeyBatch batch;
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(const bool more, reader.next(batch));
    if (!more) break;
    append_step(batch, index, in.tables);
    if (progress && reader.batches_read() % 64 == 0)
      progress("read " + std::to_string(reader.batches_read()) + " of " + std::to_string(reader.num_batches()) +
               " batches");
  }
  in.steps = static_cast<std::int64_t>(reader.batches_read());
  std::int64_t keys = 0;
  for (const TableTrace& t : in.tables) keys += t.keys.num_keys();
  if (in.steps == 0 || keys == 0)
    return Status::invalid_argument("trace '" + path + "' has no keys (" + std::to_string(in.steps) +
                                    " batches; expected at least one key to plan for)");
  in.source = "trace " + path + ", " + std::to_string(in.steps) + " steps";
  return in;
}

}  // namespace strata::tune
