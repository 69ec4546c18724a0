#pragma once
// One self-contained HTML report of a strata-bench run: inline CSS and inline SVG charts, no
// JavaScript, no network access, so it opens offline in any browser.
//
// Input: the report document below, which strata-bench derives from its --json results
// (report_document in bench/bench_results.cpp). Every field is optional; a section whose data is
// missing is left out, and a value of the wrong type, or a number that is not finite, counts as
// missing. Unknown fields are ignored.
//
//   {
//     "title":    string,                      page title (default "Strata benchmark report")
//     "verdict": { "headline": string,         the placement to use and why (strata-bench's
//                  "lines": [string],          bench/bench_verdict.hpp), shown first; "mode" null or
//                  "mode": string or null,     absent: no placement fits (shown in red)
//                  "decided_by": string },
//     "machine":  object,                      shown as a key/value table (nested values as JSON)
//     "workload": object,                      likewise
//     "tables": [ { "name": string, "rows": number, "dim": number } ],   the table list
//     "modes": [                               one entry per placement mode, in display order
//       { "mode": string,                      required for the entry to be shown
//         "forward_lookups_per_s": number,     keys looked up per second, forward only
//         "train_lookups_per_s": number,       keys per second over the full training step
//         "forward_fraction_of_gather_limit": number,  forward lookups/s over the machine's gather
//                                              limit for the workload (strata-bench's gather probe)
//         "samples_per_s": number,             samples (bags per table) per second, training step
//         "step_ms_p50": number,               measured training step latency, median (ms)
//         "step_ms_p99": number,               measured training step latency, 99th percentile (ms);
//                                              strata-bench gives it only with 100 timed steps or more
//         "step_ms_max": number,               measured training step latency, slowest step (ms)
//         "device": string,                    the store's device: "emu", "cuda <name>" or "none"
//         "trainer_device": string,            the device the trainer's outputs and gradients were on
//                                              (either being "emu" puts a warning at the top: the
//                                              measured device times are the emulator's)
//         "hit_rate": number,                  cache hit rate in [0, 1]
//         "peak_host_bytes": number,           peak host memory of the mode (bytes)
//         "host_table_bytes": number,          the store's host tables (bytes)
//         "peak_device_bytes": number,         peak device memory of the mode (bytes)
//         "bytes_per_step": {                  bytes per training step on each link
//           "hbm_read", "hbm_write", "h2d", "d2h", "host_read", "host_write", "all_to_all": number },
//         "modelled": {                        the cost model's view (store/model/cost_model.hpp)
//           "profile": string, "step_ms": number, "serial_ms": number,
//           "bottleneck": string, "explanation": string },
//         "memory_fit": {                      the engine model's memory per rank against the budgets:
//           "hbm_bytes": number, "host_bytes": number, "fits": bool, "why": string },  a mode
//                                              that does not fit is greyed in the summary
//         "chosen": bool } ],                  the verdict's choice (marked in the summary)
//     "sweep": [                               hit rate and throughput against cache size (--sweep-cache)
//       { "mode": string, "policy": string, "cache_fraction": number in [0, 1], "hit_rate": number,
//         "forward_lookups_per_s": number, "train_lookups_per_s": number, "cache_bytes": number,
//         "skipped": string (why the point did not run; it then has no hit rate),
//         "holds_every_touched_row": bool (the cache holds every distinct row the run touched: only
//                                    first-use misses; marked in the table and said under the chart),
//         "memory_fit": object (as a mode's; the table's "fits" column) } ],
//     "sweep_touched_rows": number             distinct rows the sweep's run touched
//   }
//
// Output sections, in order (ids are stable for tests and links):
//   <p class="warn" id="emulated">             in the header, when a mode's device was the emulator
//   <section class="verdict" id="verdict">      the verdict's headline and lines (no chart)
//   <section class="info" id="machine">, id="workload"   key/value tables
//   <section class="info" id="tables">                   the table list (collapsed <details>)
//   <section class="summary" id="summary">               one row per mode
//   <section class="chart" id="throughput">   forward and training lookups/s per mode (bars)
//   <section class="chart" id="bytes">        bytes per step per link per mode (grouped bars)
//   <section class="chart" id="step-time">    measured p50, p99 (when given) and max step time per
//                                             mode (bars)
//   <section class="chart" id="modelled-step">  modelled step time per mode (bars, its own axis), with
//                                             each mode's model explanation below
//   <section class="chart" id="memory">       peak host, host tables and peak device bytes per mode
//   <section class="chart" id="hit-rate">     hit rate against cache fraction, one line per
//                                             (mode, policy) (only with "sweep" points)
//   <section class="chart" id="sweep-throughput">  forward and training lookups/s against cache
//                                             fraction (only with sweep points that have them)
//   <section class="summary" id="sweep-table">  every sweep point, skipped ones with the reason
// Each chart section holds exactly one <svg>; no other section holds one. Every string from the
// document is HTML-escaped.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.hpp"

namespace strata::bench {

/// Options of the report.
struct HtmlReportOptions {
  std::string title;  ///< page title; empty: the document's "title", else "Strata benchmark report"
};

/// Renders the report for `results` (schema above). Never fails: missing or malformed parts only
/// drop their section. Pure function.
std::string render_html_report(const nlohmann::json& results, const HtmlReportOptions& options = {});

/// Renders the report and writes it to `path` (through a temporary file renamed into place).
/// Errors: io_error naming the path and the OS reason.
Status write_html_report(const std::string& path, const nlohmann::json& results, const HtmlReportOptions& options = {});

/// `s` with &, <, >, " and ' replaced by character references; safe in HTML text, attribute values
/// and SVG text.
std::string html_escape(const std::string& s);

/// One line of a hit-rate chart: (cache size as a fraction of the rows, hit rate) points, sorted
/// by the fraction, both in [0, 1].
struct HitRateLine {
  std::string name;                               ///< legend entry
  std::vector<std::pair<double, double>> points;  ///< (fraction, hit rate)
  bool markers_only = false;  ///< the points alone, not joined (values known only there, e.g. Belady's optimum)
};

/// The report's hit-rate chart (the "hit-rate" section's) for other pages: one inline <svg>,
/// hit rate against cache fraction, one line per entry. `aria` labels the image.
std::string hit_rate_chart(const std::string& aria, const std::vector<HitRateLine>& lines, const std::string& x_label);

/// What the values of a bar chart are: counts (SI prefixes), bytes, milliseconds or fractions (%).
enum class ChartUnit { kCount, kBytes, kMs, kFraction };

/// One series of a bar chart: a value per group (none: no bar).
struct BarLine {
  std::string name;                           ///< legend entry
  std::vector<std::optional<double>> values;  ///< one per group
};

/// The report's grouped bar chart for other pages: one inline <svg>, one group of bars per entry of
/// `groups`, one bar per series in each; `aria` labels the image, `y_label` the axis.
std::string bar_chart(const std::string& aria, const std::vector<std::string>& groups,
                      const std::vector<BarLine>& series, ChartUnit unit, const std::string& y_label);

/// The report's stylesheet, for other pages that embed its charts.
const char* report_css() noexcept;

}  // namespace strata::bench
