#include "tune/plan_report.hpp"

#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "toolkit/report_html.hpp"
#include "tune/text.hpp"

namespace strata::tune {
namespace {

using bench::html_escape;

std::string gather_note(const HardwareProfile& p) {
  return has_gather_rates(p) ? "random-row gathers at the profile's measured rates"
                             : "the profile has no gather rates: random-row gathers priced at sequential bandwidth "
                               "(overstates their speed; run strata-tune calibrate)";
}

std::string cache_cell(const TablePlan& t) {
  return t.placement == Placement::kCached || t.placement == Placement::kHybrid ? std::to_string(t.cache_rows) : "-";
}

std::string mode_line(const UniformMode& m) {
  return m.mode + ": " + (m.fits ? "step " + ms_text(m.step.step_s) + ", " + m.step.bottleneck : "does not fit") +
         " (" + m.note + (m.note.empty() ? "" : "; ") + "HBM " + bytes_text(m.hbm_bytes) + ", host " +
         bytes_text(m.host_bytes) + ")";
}

// "" for one rank, else " per rank".
std::string per(const Plan& p) { return p.ranks > 1 ? " per rank" : ""; }

double comm_bytes(const Plan& p) {
  double c = 0;
  for (const TablePlan& t : p.tables) c += t.cost.comm_bytes;
  return c;
}

// Several ranks: the budgets' and the exchange's lines.
std::string ranks_note(const Plan& p) {
  return "over " + std::to_string(p.ranks) + " ranks, every table sharded row-wise; budgets and memory per rank";
}

std::string exchange_line(const Plan& p) {
  const LinkTime& a = p.step.links[static_cast<int>(Link::kAllToAll)];
  return "all-to-all: " + bytes_text(p.exchange_bytes) + " per step per rank (keys, rows and gradients), " +
         ms_text(a.seconds) + " at " + bytes_text(a.gbs * 1e9) + "/s";
}

std::string memory_line(const Plan& p, const ReportContext& c) {
  std::string s = "HBM " + bytes_text(p.hbm_bytes) + " of " + bytes_text(c.options.hbm_budget_bytes) + per(p) +
                  ", host " + bytes_text(p.host_bytes) + " of " + bytes_text(c.options.host_budget_bytes) + per(p);
  if (p.ranks > 1) s += " (communication buffers " + bytes_text(comm_bytes(p)) + ")";
  return s;
}

// Whether some table's rows are not fp32: the table's lines then say each one's dtype.
bool any_half(const Plan& p) {
  for (const TableConfig& t : p.config.tables)
    if (t.spec.dtype != DType::kF32) return true;
  return false;
}

// Which node's figures priced each rank's host traffic.
std::string host_line(const Plan& p) { return "host DRAM: " + p.step.host_pricing; }

}  // namespace

std::vector<bench::HitRateLine> curve_lines(const HitCurve& c) {
  bench::HitRateLine lru{"LRU", {}}, belady{"Belady (optimal), where computed", {}, true};
  for (const CurvePoint& p : c.points) {
    const double f = c.rows > 0 ? static_cast<double>(p.rows) / static_cast<double>(c.rows) : 0.0;
    lru.points.emplace_back(f, p.lru);
    if (p.belady >= 0) belady.points.emplace_back(f, p.belady);
  }
  std::vector<bench::HitRateLine> lines{lru};
  if (!belady.points.empty()) lines.push_back(belady);
  return lines;
}

std::string console_summary(const Plan& plan, const ReportContext& c) {
  std::ostringstream o;
  o << "strata-tune plan: " << c.source << "\n";
  if (c.profile) o << "profile " << c.profile->name << ": " << gather_note(*c.profile) << "\n";
  if (plan.ranks > 1) o << ranks_note(plan) << "\n";
  o << "budgets: HBM " << bytes_text(c.options.hbm_budget_bytes) << per(plan) << ", host "
    << bytes_text(c.options.host_budget_bytes) << per(plan) << "\n";
  for (const std::string& w : c.warnings) o << "warning: " << w << "\n";
  o << "\n";
  char line[256];
  // A dtype column where some table is not fp32 (the reports of fp32 plans are as they were).
  const bool dtypes = any_half(plan);
  const char* const dtype_format = dtypes ? " %-5s" : "%.0s";
  const std::string header = std::string("%-16s %12s %5s") + dtype_format + " %-9s %11s %7s %7s %10s %10s\n";
  const std::string row = std::string("%-16s %12lld %5d") + dtype_format + " %-9s %11s %7s %7s %10s %10s\n";
  std::snprintf(line, sizeof line, header.c_str(), "table", "rows", "dim", "dtype", "placement", "cache rows", "LRU",
                "Belady", "HBM", "host");
  o << line;
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    const TablePlan& p = plan.tables[t];
    const TableSpec& s = plan.config.tables[t].spec;
    std::snprintf(line, sizeof line, row.c_str(), p.name.c_str(), static_cast<long long>(s.rows), s.dim,
                  to_string(s.dtype), to_string(p.placement), cache_cell(p).c_str(), percent_text(p.hit_rate).c_str(),
                  percent_text(p.belady).c_str(), bytes_text(p.cost.hbm_bytes).c_str(),
                  bytes_text(p.cost.host_bytes).c_str());
    o << line << "  why: " << p.why << "\n";
    if (plan.ranks > 1)
      o << "  per rank: all-to-all " << bytes_text(p.cost.bytes.all_to_all) << " per step, communication buffers "
        << bytes_text(p.cost.comm_bytes) << "\n";
    if (t < c.tables.size() && c.tables[t].sample_rate < 1.0) o << "  curve: " << c.tables[t].sampling_note() << "\n";
  }
  o << "\nplan: step " << ms_text(plan.step.step_s) << " (" << plan.step.explanation << ")\n";
  o << host_line(plan) << "\n";
  o << "memory" << per(plan) << ": " << memory_line(plan, c) << "\n";
  if (plan.ranks > 1) o << exchange_line(plan) << "\n";
  o << "uniform modes:\n";
  for (const UniformMode& m : plan.uniform) o << "  " << mode_line(m) << "\n";
  for (const HitCurve& pool : c.pools) {
    o << pool.name << " (" << pool.tables.size() << " tables) LRU:";
    for (const CurvePoint& p : pool.points) o << " " << p.rows << " rows " << percent_text(p.lru) << ";";
    o << "\n";
    if (pool.sample_rate < 1.0) o << "  curve: " << pool.sampling_note() << "\n";
  }
  return o.str();
}

std::string html_report(const Plan& plan, const ReportContext& c) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>strata-tune plan</title>\n<style>"
    << bench::report_css() << "</style>\n</head>\n<body>\n<header><h1>strata-tune plan</h1><p class=\"note\">"
    << html_escape(c.source) << "</p>";
  if (c.profile)
    o << "<p class=\"note\">profile " << html_escape(c.profile->name) << ": " << html_escape(gather_note(*c.profile))
      << "</p>";
  if (plan.ranks > 1) o << "<p class=\"note\">" << html_escape(ranks_note(plan)) << "</p>";
  for (const std::string& w : c.warnings) o << "<p class=\"warn\">warning: " << html_escape(w) << "</p>";
  o << "</header>\n";

  o << "<section class=\"summary\" id=\"plan\"><h2>Plan</h2><p>modelled step " << html_escape(ms_text(plan.step.step_s))
    << ": " << html_escape(plan.step.explanation) << "</p><p>memory" << per(plan) << ": "
    << html_escape(memory_line(plan, c)) << "</p><p>" << html_escape(host_line(plan)) << "</p>";
  if (plan.ranks > 1) o << "<p>" << html_escape(exchange_line(plan)) << "</p>";
  const bool dtypes = any_half(plan);
  o << "<table><tr><th>table</th><th>rows</th><th>dim</th>" << (dtypes ? "<th>dtype</th>" : "")
    << "<th>placement</th><th>cache rows</th><th>LRU hit</th><th>Belady</th><th>HBM</th><th>host</th>"
    << (plan.ranks > 1 ? "<th>all-to-all per step</th>" : "") << "<th>why</th></tr>";
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    const TablePlan& p = plan.tables[t];
    const TableSpec& s = plan.config.tables[t].spec;
    o << "<tr><td>" << html_escape(p.name) << "</td><td class=\"n\">" << s.rows << "</td><td class=\"n\">" << s.dim
      << "</td>" << (dtypes ? std::string("<td>") + to_string(s.dtype) + "</td>" : std::string()) << "<td>"
      << to_string(p.placement) << "</td><td class=\"n\">" << html_escape(cache_cell(p)) << "</td><td class=\"n\">"
      << html_escape(percent_text(p.hit_rate)) << "</td><td class=\"n\">" << html_escape(percent_text(p.belady))
      << "</td><td class=\"n\">" << html_escape(bytes_text(p.cost.hbm_bytes)) << "</td><td class=\"n\">"
      << html_escape(bytes_text(p.cost.host_bytes)) << "</td>";
    if (plan.ranks > 1) o << "<td class=\"n\">" << html_escape(bytes_text(p.cost.bytes.all_to_all)) << "</td>";
    o << "<td>" << html_escape(p.why) << "</td></tr>";
  }
  o << "</table></section>\n<section class=\"summary\" id=\"modes\"><h2>Uniform modes</h2><ul>";
  for (const UniformMode& m : plan.uniform) o << "<li>" << html_escape(mode_line(m)) << "</li>";
  o << "</ul></section>\n";

  const auto chart = [&](const HitCurve& curve, const std::string& id) {
    o << "<section class=\"chart\" id=\"" << html_escape(id) << "\"><h2>" << html_escape(curve.name)
      << "</h2><p class=\"note\">" << curve.rows << " rows; a step needs at least " << curve.min_rows
      << " rows; every row cached: " << html_escape(percent_text(curve.hit_rate(curve.rows)))
      << (curve.sample_rate < 1.0 ? "; " + html_escape(curve.sampling_note()) : std::string()) << "</p>"
      << bench::hit_rate_chart("hit rate of " + curve.name + " against cache size", curve_lines(curve),
                               "cache size (fraction of the rows)")
      << "</section>\n";
  };
  // Tables no cache smaller than themselves holds: one line, not a chart of one point each.
  std::string small;
  for (const HitCurve& curve : c.tables)
    if (!curve.cacheable())
      small += (small.empty() ? "" : ", ") + curve.name + " (" + std::to_string(curve.rows) +
               (curve.rows == 1 ? " row)" : " rows)");
  if (!small.empty())
    o << "<section class=\"summary\" id=\"too-small-to-cache\"><h2>Tables too small to cache</h2><p>"
      << html_escape(small)
      << ": a step touches every row of each, so no cache smaller than the table holds a step (each is gpu, "
         "offload or cpu whole); no curve is drawn.</p></section>\n";
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    if (c.tables[t].cacheable()) chart(c.tables[t], "curve-table-" + std::to_string(t));
  for (std::size_t p = 0; p < c.pools.size(); ++p) chart(c.pools[p], "curve-pool-" + std::to_string(p));
  o << "</body>\n</html>\n";
  return o.str();
}

std::string plan_json(const Plan& plan, const ReportContext& c) {
  using nlohmann::json;
  const auto step = [](const ModelledStep& m) {
    json links = json::object();
    for (int l = 0; l < kNumLinks; ++l)
      links[link_name(static_cast<Link>(l))] = {{"bytes", m.links[static_cast<std::size_t>(l)].bytes},
                                                {"seconds", m.links[static_cast<std::size_t>(l)].seconds}};
    return json{{"seconds", m.step_s},
                {"serial_seconds", m.serial_s},
                {"bottleneck", m.bottleneck},
                {"explanation", m.explanation},
                {"host_node", m.host_node},
                {"host_pricing", m.host_pricing},
                {"links", links}};
  };
  json tables = json::array();
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    const TablePlan& p = plan.tables[t];
    const TableConfig& tc = plan.config.tables[t];
    json j{{"name", p.name},
           {"rows", tc.spec.rows},
           {"dim", tc.spec.dim},
           {"dtype", to_string(tc.spec.dtype)},
           {"placement", to_string(p.placement)},
           {"cache_rows", p.cache_rows},
           {"lru_hit_rate", p.hit_rate},
           {"belady_hit_rate", p.belady},
           {"hbm_bytes", p.cost.hbm_bytes},
           {"host_bytes", p.cost.host_bytes},
           {"why", p.why}};
    if (plan.ranks > 1) {
      j["sharding"] = dispatch::to_string(tc.sharding.type);
      j["exchange_bytes_per_step"] = p.cost.bytes.all_to_all;
      j["comm_buffer_bytes"] = p.cost.comm_bytes;
    }
    tables.push_back(std::move(j));
  }
  json uniform = json::array();
  for (const UniformMode& m : plan.uniform)
    uniform.push_back({{"mode", m.mode},
                       {"fits", m.fits},
                       {"note", m.note},
                       {"hbm_bytes", m.hbm_bytes},
                       {"host_bytes", m.host_bytes},
                       {"step", step(m.step)}});
  json out{{"source", c.source},
           {"warnings", c.warnings},
           {"profile", c.profile ? c.profile->name : std::string()},
           {"ranks", plan.ranks},
           {"per_rank", plan.ranks > 1},
           {"hbm_budget_bytes", c.options.hbm_budget_bytes},
           {"host_budget_bytes", c.options.host_budget_bytes},
           {"hbm_bytes", plan.hbm_bytes},
           {"host_bytes", plan.host_bytes},
           {"comm_buffer_bytes", comm_bytes(plan)},
           {"exchange_bytes_per_step", plan.exchange_bytes},
           {"step", step(plan.step)},
           {"tables", tables},
           {"uniform", uniform}};
  return out.dump(2);
}

}  // namespace strata::tune
