#pragma once
// The keys `strata-tune plan` and `validate` read, from their command-line arguments
// (commands.hpp's InputArgs): a workload, a STRTRACE trace or a Criteo TSV file.

#include <map>
#include <string>
#include <vector>

#include "toolkit/batch_source.hpp"
#include "toolkit/workload.hpp"
#include "tune/commands.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Checks the arguments alone (exactly one source, a rate in (0, 1], ...); reads nothing.
Status check_input_args(const InputArgs& args);

/// The workload of --workload (a file, or inline JSON starting with '{'), validated.
Result<bench::WorkloadSpec> workload_of(const std::string& text_or_path);

/// Whether --tables is a mapping of a file's features to tables (TABLE=FEATURE+...) rather than a
/// table set: with --trace, any value holding '=' (a trace takes no table set).
bool tables_map_features(const InputArgs& args);

/// The tables of the source (names, rows, dims) from what is cheap to read: the trace's header,
/// the Criteo table set, the workload; a file's features mapped to tables (--tables
/// TABLE=FEATURE+..., else args.features). `features`, when given, gets each table's features
/// when other than itself (table -> features). For checks before the long work.
Result<std::vector<bench::TableShape>> input_tables(
    const InputArgs& args, std::map<std::string, std::vector<std::string>>* features = nullptr);

/// The batches of the source, for commands that stream them (capacity): a workload's distinct batches generated
/// (`steps` of them run: --steps, else twice its distinct batches), a file's checked (BatchSource::open_*), and the
/// tables of its features (--tables TABLE=FEATURE+..., else args.features; a table's `rows` unused).
struct InputSource {
  bench::BatchSource source;
  std::vector<bench::SourceTable> tables;
  std::int64_t steps = 0;  ///< batches to read, in order (a workload's cycled)
  std::string what;        ///< for reports: "trace day0.strtrace, 100 steps"
};
Result<InputSource> open_input_source(const InputArgs& args, const ProgressFn& progress);

/// Reads the keys (tune_input.hpp), every table with `optimizer`.
Result<TuneInput> load_input(const InputArgs& args, OptimizerKind optimizer, const ProgressFn& progress);

}  // namespace strata::tune
