#pragma once
// strata-bench's verdict: the placement to use for the run's workload on the chosen profile, and
// why. Each mode that ran (and each cache-sweep point) is priced by the engine model's memory
// (bench_memory.hpp, mode_memory: store/model/table_cost.hpp) against the memory budgets per rank
// (--hbm-budget, --host-budget; by default the profile's); of those that fit, the fastest is chosen:
// by its measured step where the device is real (cuda) or there is none (every mode on the CPU),
// by its modelled step on the emulated device (emu), whose times are this CPU running the GPU
// kernels' logic and rank CPU work only. A mode that does not fit is never chosen.

#include <string>

#include "bench/bench_memory.hpp"
#include "bench/bench_options.hpp"
#include "store/model/cost_model.hpp"

namespace strata::bench {

/// The memory each mode may use per rank (one GPU's HBM and the host memory of a rank).
struct MemoryBudgets {
  double hbm = 0;           ///< bytes of HBM per rank
  double host = 0;          ///< bytes of host memory per rank
  bool hbm_given = false;   ///< from --hbm-budget (else the profile's)
  bool host_given = false;  ///< from --host-budget (else the profile's)
};

/// The budgets per rank: --hbm-budget and --host-budget when given (sizes as strata-tune plan takes
/// them: "8MB", "80GB", "512MiB", "1e9"), else the profile's, as strata-tune plan budgets: one GPU's
/// HBM, and the host memory over min(ranks, the profile's GPUs). Errors name the flag and the text.
Result<MemoryBudgets> memory_budgets(const Options& o, const HardwareProfile& profile);

/// The JSON's memory_fit of one mode: its memory by the model (per rank) against the budgets:
/// {"hbm_bytes", "host_bytes", "fits_hbm", "fits_host", "fits", "why"} ("why": "" when it fits,
/// else the need against the budget: "HBM 35.2 MB > 8.0 MB").
json memory_fit_json(const ModeMemory& memory, const MemoryBudgets& budgets);

/// The verdict (the JSON's "verdict"; docs/bench.md, "Verdict") from a results document whose
/// results and sweep points that ran carry their memory_fit: the chosen mode (null when none
/// fits), what decided it, its figures, the text lines the console and the HTML show, and which
/// figures are measured on this machine and which are modelled.
json verdict_json(const json& doc, const MemoryBudgets& budgets, const std::string& profile_name);

}  // namespace strata::bench
