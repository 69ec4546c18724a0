#pragma once
// strata-tune plan's outputs: the plain console summary and the self-contained HTML page (the
// plan, the modelled step of the plan and of each uniform mode, memory per tier, and every
// table's and pool's hit-rate curve as inline SVG; no JavaScript, no network). Both are pure
// functions of their input, so the same plan gives the same bytes.

#include <string>
#include <vector>

#include "bench/tune/curves.hpp"
#include "bench/tune/planner.hpp"
#include "store/cost_model.hpp"

namespace strata::tune {

/// What a report shows besides the plan.
struct ReportContext {
  std::string source;  ///< TuneInput::source
  const HardwareProfile* profile = nullptr;
  PlanOptions options;           ///< the budgets
  std::vector<HitCurve> tables;  ///< per table, in plan order
  std::vector<HitCurve> pools;   ///< shared pools (may be empty)
};

/// The console summary: source, profile and how it prices gathers, budgets, one line per table
/// (placement, cache, hit rates, memory, why), the plan's step and memory, the uniform modes and
/// the pools' curves at a few sizes.
std::string console_summary(const Plan& plan, const ReportContext& context);

/// The HTML page.
std::string html_report(const Plan& plan, const ReportContext& context);

}  // namespace strata::tune
