#pragma once
// strata-bench's inputs, read and checked before any long work: --config, --trace and --criteo
// files, the hardware profile, the cache sweep's fractions, and where the outputs go.

#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "store/model/cost_model.hpp"
#include "toolkit/batch_source.hpp"

namespace strata::bench {

/// "0.01,0.1,0.3" -> sorted unique fractions in (0, 1]; an empty item ("0.5,", "0.1,,0.2") is refused.
Result<std::vector<double>> parse_fractions(const std::string& s);

/// Reads a hardware profile file with the input limits (a regular file of at most 4 MiB, JSON
/// nested at most 32 levels), then parses it.
Result<HardwareProfile> load_profile(const std::string& path);

/// Checks, before any work, that an output file can be written at `path`. The outputs are
/// written to a temporary file next to `path` and renamed over it (`replaced`), so a test file is
/// created there and removed, and anything but a regular file at `path` is refused (renaming
/// over /dev/null would replace the device). An output written in place (`replaced` false) only
/// needs a writable directory and no directory at `path`.
Status check_output_path(const std::string& flag, const std::string& path, bool replaced);

/// Reads --config into o.config and sets up its mode, named after the file's stem ("config" when
/// that is empty or a uniform mode's name). Without --tables, --rows, --workload, --trace and
/// --criteo, the workload's tables are the config's.
Status load_config_mode(Options& o);

/// The workload's tables and the config's must be the same set (names), with the same rows and dims, each looked up
/// by the same features: `features` (Options::table_features; a table not in it is its own one feature) and the
/// config's features lists.
Status check_config_tables(const StoreConfig& c, const std::vector<TableShape>& shapes,
                           const std::map<std::string, std::vector<std::string>>& features = {});

/// Opens --trace or --criteo for a run of `world` ranks, reading and checking the batches it uses
/// (2 x (warmup + steps) per rank at most), and sets the workload's tables and shape from it (its
/// features' tables: o.feature_map, else the --config's features lists; o.table_features); a
/// file too short for the steps fits them (fit_steps_to_source) or is refused, naming the flags
/// to lower.
Result<BatchSource> open_file_source(Options& o, std::string& table_set, int world);

/// A file source too short for --warmup + --steps (per rank): fits those of the two that were not
/// given on the command line to it (at most half its batches warm up, the rest are timed) and
/// prints a note on stderr saying so and how to get more steps (a TSV file: a smaller --batch).
/// Changes nothing when the file is long enough, when both were given, or when what was given
/// cannot fit (open_file_source then refuses the run, naming the flags to lower).
void fit_steps_to_source(Options& o, const BatchSource& src, int world);

/// Writes the source's batches (the sequence the run cycles) to --dump-trace.
Status dump_trace(const Options& o, const BatchSource& source);

}  // namespace strata::bench
