#pragma once
// strata-tune plan's outputs: the plain console summary and the self-contained HTML page (the
// plan, the modelled step of the plan and of each uniform mode, memory per tier, and every
// table's and pool's hit-rate curve as inline SVG; no JavaScript, no network). Both are pure
// functions of their input, so the same plan gives the same bytes.

#include <string>
#include <vector>

#include "store/model/cost_model.hpp"
#include "toolkit/report_html.hpp"
#include "tune/curves.hpp"
#include "tune/planner.hpp"

namespace strata::tune {

/// What a report shows besides the plan.
struct ReportContext {
  std::string source;  ///< TuneInput::source
  const HardwareProfile* profile = nullptr;
  PlanOptions options;           ///< the budgets
  std::vector<HitCurve> tables;  ///< per table, in plan order
  std::vector<HitCurve> pools;   ///< shared pools (may be empty)
  std::vector<std::string>
      warnings;  ///< said first in every output (an input too short for a curve, a budget above this machine's memory)
};

/// The lines of a curve's chart: LRU at the curve's points (exact at every size, joined), and
/// Belady's optimum where it was computed, as markers only (it is known at those sizes alone: a
/// line between them would read as values it does not have, and dip under LRU between them).
std::vector<bench::HitRateLine> curve_lines(const HitCurve& curve);

/// The console summary: source, profile and how it prices gathers, budgets, one line per table
/// (placement, cache, hit rates, memory, why), the plan's step and memory, the uniform modes and
/// the pools' curves at a few sizes. Several ranks: budgets and memory per rank, and per table and
/// for the plan the all-to-all bytes per step and the communication buffers.
std::string console_summary(const Plan& plan, const ReportContext& context);

/// The HTML page: the plan, the uniform modes, a chart per table a cache smaller than it can hold
/// (HitCurve::cacheable) and per pool; the tables too small to cache are named on one line.
std::string html_report(const Plan& plan, const ReportContext& context);

/// The report's numbers as JSON (plan --json): source, profile, ranks, the budgets, the plan's
/// memory (per rank when ranks > 1, with the communication buffers), the all-to-all bytes one rank
/// sends per step, the modelled step and its links, every table (placement, cache rows, hit rates,
/// memory, why; several ranks: sharding, exchange bytes and communication buffers) and the uniform
/// modes. Bytes in bytes, times in seconds, hit rates as fractions (-1: none).
std::string plan_json(const Plan& plan, const ReportContext& context);

}  // namespace strata::tune
