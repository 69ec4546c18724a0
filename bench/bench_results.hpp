#pragma once
// strata-bench's results: the JSON document of a run (docs/bench.md, "JSON"), each mode's entry in
// it, and the HTML report's document made from it (toolkit/report_html.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_memory.hpp"
#include "bench/bench_modes.hpp"
#include "bench/bench_options.hpp"
#include "bench/bench_probes.hpp"
#include "bench/bench_verdict.hpp"
#include "store/model/cost_model.hpp"
#include "toolkit/batch_source.hpp"
#include "toolkit/machine_info.hpp"

namespace strata::bench {

/// Timed steps a 99th percentile needs before it is shown as one: with fewer, the step at p99 is
/// the slowest or next to it, so the console and the HTML show (and name) the maximum instead.
constexpr std::size_t kStepsForP99 = 100;

/// The nearest-rank percentile `p` (in [0, 1]) of `v` (0 when empty).
double percentile(std::vector<double> v, double p);

/// "1.50 GB", "12.3 MB", "512 B": bytes as people read them.
std::string human_bytes(double b);

/// The current time, UTC, as 2026-01-31T12:00:00Z.
std::string iso_time_now();

/// What the machine probes measured before the modes ran (bench_probes.hpp).
struct MachineProbes {
  int threads = 1;         ///< threads of the read-bandwidth and gather probes
  double read_gbs = 0;     ///< sequential read bandwidth
  double gather_s = 0;     ///< seconds the gather and update probes took
  StepLimits step_limits;  ///< a step's gather limits and floor
  std::vector<GatherLimit> gather_limits;
  std::vector<UpdateFloor> update_floors;
};

/// One point of the cache sweep: its cache fraction, and its run or why it was skipped.
struct SweepPoint {
  double fraction = 0;
  Result<ModeResult> result;
  /// Every slot pool holds all the distinct rows the run touched (its misses are first uses only).
  bool holds_every_touched_row = false;
};

/// Everything a run of strata-bench has found out by the time it reports.
struct RunRecord {
  std::string started_at;  ///< iso_time_now() when the run began
  std::string table_set;   ///< where the tables came from ("criteo:1953125", "trace FILE", ...)
  std::int64_t total_rows = 0;
  std::vector<double> sweep;  ///< --sweep-cache's fractions, sorted
  MachineInfo machine;
  int cuda_devices = 0;     ///< CUDA devices visible (0 when CUDA is broken)
  std::string cuda_error;   ///< why CUDA is broken ("" when it works)
  MemoryEstimate mem;       ///< the memory guard's estimate
  double available = 0;     ///< host memory available when the run began
  HardwareProfile profile;  ///< --profile
  MemoryBudgets budgets;    ///< the memory per rank each mode must fit (--hbm-budget, --host-budget, or the profile's)
  MachineProbes probes;
  std::vector<ModeResult> results;  ///< one per mode, in --modes order (then --config's)
  std::vector<SweepPoint> sweep_points;
  std::int64_t sweep_touched_rows = 0;  ///< distinct rows the run touched in the sweep's slot pools
};

/// The results document of a run on `batches` (--json; docs/bench.md), but its wall_s.
json results_document(const Options& o, const RunRecord& run, const BatchSource& batches);

/// The HTML report's document (toolkit/report_html.hpp) from the results document.
json report_document(const json& j);

}  // namespace strata::bench
