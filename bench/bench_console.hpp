#pragma once
// strata-bench's console report: the tables and lines it prints once every mode has run.

#include "bench/bench_options.hpp"
#include "bench/bench_results.hpp"

namespace strata::bench {

/// Prints the run's results (`j`: results_document) to stdout: the verdict first (bench_verdict.hpp),
/// then rates and step times, the phases of a step, the all-to-all, bytes per link, the machine's
/// limits and each mode's fraction of them, memory (measured, and by the engine model against the
/// budgets), the modelled step times and the cache sweep; modes that do not fit are marked.
void print_console(const Options& o, const json& j, const RunRecord& run);

}  // namespace strata::bench
