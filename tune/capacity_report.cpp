// strata-tune capacity's outputs (tune/capacity.hpp): console, JSON and HTML, pure functions of the plan.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "store/store_config.hpp"
#include "toolkit/report_html.hpp"
#include "tune/capacity.hpp"
#include "tune/text.hpp"

namespace strata::tune {
namespace {

using bench::html_escape;

std::string options_text(const CapacityOptions& o) {
  const DynamicSpec& d = o.dynamic;
  std::string s =
      "admit_after " + std::to_string(d.admit_after) + ", eviction " + to_string(d.eviction) + ", " +
      (d.evict_after_steps > 0 ? "evict_after_steps " + std::to_string(d.evict_after_steps) : std::string("no TTL")) +
      ", " + std::to_string(o.in_flight) + (o.in_flight == 1 ? " batch" : " batches") + " in flight";
  if (o.spread) s += ", keys spread over [0, 2^63) as strata-bench --dynamic";
  return s;
}

// The store config's options of a dynamic table of `capacity` rows under `o` (what a table's JSON says).
std::string config_text(std::int64_t capacity, const CapacityOptions& o) {
  const DynamicSpec& d = o.dynamic;
  std::string s = "\"kind\": \"dynamic\", \"capacity\": " + std::to_string(capacity);
  if (d.admit_after != 1) s += ", \"admit_after\": " + std::to_string(d.admit_after);
  if (d.eviction != Eviction::kLru) s += std::string(", \"eviction\": \"") + to_string(d.eviction) + "\"";
  if (d.evict_after_steps != 0) s += ", \"evict_after_steps\": " + std::to_string(d.evict_after_steps);
  return s;
}

// distinct keys after a fraction of the steps.
std::int64_t distinct_at(const TableCapacity& t, double fraction) {
  const auto n = static_cast<std::int64_t>(t.distinct_by_step.size());
  const std::int64_t s = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(fraction * n)) - 1, 0, n - 1);
  return t.distinct_by_step[static_cast<std::size_t>(s)];
}

std::string growth_text(const TableCapacity& t) {
  std::ostringstream o;
  o << "distinct keys after 10% of the steps " << distinct_at(t, 0.1) << ", 25% " << distinct_at(t, 0.25) << ", 50% "
    << distinct_at(t, 0.5) << ", all " << t.distinct;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", t.late_growth());
  o << "; new keys per step over the last tenth of the steps: " << buf;
  return o.str();
}

std::string recommendation_text(const TableCapacity& t, const CapacityOptions& o) {
  if (t.recommended < 0) return "no keys: nothing to recommend";
  const CapacityRun& r = t.runs[static_cast<std::size_t>(t.recommended)];
  const CapacityRun& u = t.runs[static_cast<std::size_t>(t.unbounded)];
  char tol[32];
  std::snprintf(tol, sizeof tol, "%.3g", 100.0 * o.tolerance);
  return "capacity " + std::to_string(r.capacity) + ": " + percent_text(t.fraction(r.hits)) +
         " of the uses find their row, within " + tol + (o.tolerance == 0.01 ? " point" : " points") +
         " of the unbounded capacity's " + percent_text(t.fraction(u.hits)) + " (" + std::to_string(u.capacity) +
         " rows, every distinct key), the smallest of the capacities simulated that refuses no batch";
}

}  // namespace

std::string capacity_console(const CapacityPlan& p) {
  std::ostringstream o;
  o << "strata-tune capacity: " << p.source << "\n";
  o << "dynamic tables: " << options_text(p.options) << "\n";
  for (const TableCapacity& t : p.tables) {
    o << "\ntable " << t.name;
    if (!t.features.empty()) {
      o << " (features";
      for (const std::string& f : t.features) o << " " << f;
      o << ")";
    }
    o << ": " << t.uses << " key uses, " << t.distinct << " distinct keys, at most " << t.max_step_distinct
      << " in a step\n";
    if (t.runs.empty()) {
      o << "  no keys\n";
      continue;
    }
    o << "  " << growth_text(t) << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %12s %7s %9s %9s %8s %9s %11s %11s %10s\n", "capacity", "hits", "admitted",
                  "not adm.", "refused", "deferred", "evictions", "expirations", "index");
    o << line;
    for (std::size_t i = 0; i < t.runs.size(); ++i) {
      const CapacityRun& r = t.runs[i];
      const std::string cap = std::to_string(r.capacity) + (static_cast<int>(i) == t.recommended ? "*" : " ");
      std::snprintf(line, sizeof line, "  %12s %7s %9s %9s %8s %9lld %11lld %11lld %10s%s\n", cap.c_str(),
                    percent_text(t.fraction(r.hits)).c_str(), percent_text(t.fraction(r.admitted)).c_str(),
                    percent_text(t.fraction(r.not_admitted)).c_str(), percent_text(t.fraction(r.refused)).c_str(),
                    static_cast<long long>(r.deferred_batches), static_cast<long long>(r.counts.evictions),
                    static_cast<long long>(r.counts.expirations),
                    bytes_text(static_cast<double>(r.index_bytes)).c_str(),
                    static_cast<int>(i) == t.unbounded ? "  (unbounded: every distinct key)" : "");
      o << line;
    }
    o << "  recommended (*): " << recommendation_text(t, p.options) << "\n";
    if (t.recommended >= 0)
      o << "  config: {\"name\": \"" << t.name << "\", "
        << config_text(t.runs[static_cast<std::size_t>(t.recommended)].capacity, p.options) << ", ...}\n";
  }
  return o.str();
}

std::string capacity_json(const CapacityPlan& p) {
  using nlohmann::json;
  const DynamicSpec& d = p.options.dynamic;
  json out{{"source", p.source},
           {"steps", p.steps},
           {"options",
            {{"admit_after", d.admit_after},
             {"eviction", to_string(d.eviction)},
             {"evict_after_steps", d.evict_after_steps},
             {"in_flight", p.options.in_flight},
             {"tolerance_points", 100.0 * p.options.tolerance},
             {"spread", p.options.spread}}}};
  json tables = json::array();
  for (const TableCapacity& t : p.tables) {
    json growth = json::array();
    const auto n = static_cast<std::int64_t>(t.distinct_by_step.size());
    const std::int64_t every = std::max<std::int64_t>(1, (n + 99) / 100);
    for (std::int64_t s = 0; s < n; s += every)
      growth.push_back({{"step", s + 1}, {"distinct_keys", t.distinct_by_step[static_cast<std::size_t>(s)]}});
    if (n > 0 && (n - 1) % every != 0) growth.push_back({{"step", n}, {"distinct_keys", t.distinct_by_step.back()}});
    json runs = json::array();
    for (const CapacityRun& r : t.runs)
      runs.push_back({{"capacity", r.capacity},
                      {"hits", r.hits},
                      {"admitted", r.admitted},
                      {"not_admitted", r.not_admitted},
                      {"refused", r.refused},
                      {"hit_fraction", t.fraction(r.hits)},
                      {"admitted_fraction", t.fraction(r.admitted)},
                      {"not_admitted_fraction", t.fraction(r.not_admitted)},
                      {"refused_fraction", t.fraction(r.refused)},
                      {"refused_batches", r.refused_batches},
                      {"deferred_batches", r.deferred_batches},
                      {"admissions", r.counts.admissions},
                      {"evictions", r.counts.evictions},
                      {"expirations", r.counts.expirations},
                      {"rows_in_use", r.rows_in_use},
                      {"index_bytes", r.index_bytes}});
    json j{
        {"name", t.name},
        {"features", t.features},
        {"uses", t.uses},
        {"distinct_keys", t.distinct},
        {"max_step_distinct_keys", t.max_step_distinct},
        {"new_keys_per_step_last_tenth", t.late_growth()},
        {"distinct_keys_by_step", growth},
        {"capacities", runs},
        {"unbounded_capacity", t.unbounded < 0 ? json() : json(t.runs[static_cast<std::size_t>(t.unbounded)].capacity)},
        {"recommended_capacity",
         t.recommended < 0 ? json() : json(t.runs[static_cast<std::size_t>(t.recommended)].capacity)},
        {"recommendation", recommendation_text(t, p.options)}};
    if (t.recommended >= 0) {
      json cfg =
          json::parse("{" + config_text(t.runs[static_cast<std::size_t>(t.recommended)].capacity, p.options) + "}");
      j["config"] = cfg;
    }
    tables.push_back(std::move(j));
  }
  out["tables"] = std::move(tables);
  return out.dump(2);
}

std::string capacity_html(const CapacityPlan& p) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>strata-tune capacity</title>\n"
       "<style>"
    << bench::report_css() << "</style>\n</head>\n<body>\n<header><h1>strata-tune capacity</h1><p class=\"note\">"
    << html_escape(p.source) << "</p><p class=\"note\">dynamic tables: " << html_escape(options_text(p.options))
    << "; each table's batches replayed through the store's key index (host/key_index.hpp) at every capacity</p>"
       "</header>\n";
  for (std::size_t ti = 0; ti < p.tables.size(); ++ti) {
    const TableCapacity& t = p.tables[ti];
    o << "<section class=\"summary\" id=\"table-" << ti << "\"><h2>" << html_escape(t.name) << "</h2><p>" << t.uses
      << " key uses, " << t.distinct << " distinct keys, at most " << t.max_step_distinct << " in a step</p>";
    if (t.runs.empty()) {
      o << "<p>no keys</p></section>\n";
      continue;
    }
    o << "<p>" << html_escape(growth_text(t))
      << "</p><p><b>recommended</b>: " << html_escape(recommendation_text(t, p.options)) << "</p>";
    if (t.recommended >= 0)
      o << "<p class=\"note\">config: <code>{&quot;name&quot;: &quot;" << html_escape(t.name) << "&quot;, "
        << html_escape(config_text(t.runs[static_cast<std::size_t>(t.recommended)].capacity, p.options))
        << ", ...}</code></p>";
    o << "<table><tr><th>capacity</th><th>hits</th><th>admitted</th><th>not admitted</th><th>refused</th>"
         "<th>deferred batches</th><th>evictions</th><th>expirations</th><th>rows in use</th><th>index</th></tr>";
    for (std::size_t i = 0; i < t.runs.size(); ++i) {
      const CapacityRun& r = t.runs[i];
      std::string cap = std::to_string(r.capacity);
      if (static_cast<int>(i) == t.recommended) cap += " (recommended)";
      if (static_cast<int>(i) == t.unbounded) cap += " (unbounded)";
      o << "<tr><td class=\"n\">" << html_escape(cap) << "</td><td class=\"n\">" << percent_text(t.fraction(r.hits))
        << "</td><td class=\"n\">" << percent_text(t.fraction(r.admitted)) << "</td><td class=\"n\">"
        << percent_text(t.fraction(r.not_admitted)) << "</td><td class=\"n\">" << percent_text(t.fraction(r.refused))
        << "</td><td class=\"n\">" << r.deferred_batches << "</td><td class=\"n\">" << r.counts.evictions
        << "</td><td class=\"n\">" << r.counts.expirations << "</td><td class=\"n\">" << r.rows_in_use
        << "</td><td class=\"n\">" << html_escape(bytes_text(static_cast<double>(r.index_bytes))) << "</td></tr>";
    }
    o << "</table></section>\n";

    // The curve: x is the capacity over the distinct keys (1: the unbounded capacity).
    const auto x = [&](const CapacityRun& r) {
      return static_cast<double>(r.capacity) / static_cast<double>(t.distinct);
    };
    bench::HitRateLine hits{"uses that find their row", {}, false};
    bench::HitRateLine found{"found or given a row", {}, false};
    for (const CapacityRun& r : t.runs) {
      hits.points.emplace_back(x(r), t.fraction(r.hits));
      found.points.emplace_back(x(r), t.fraction(r.hits + r.admitted));
    }
    // Uses left without a row (admit_after) or refused: the uses that find or get a row, a line of their own.
    bool all_found = true;
    for (const CapacityRun& r : t.runs) all_found = all_found && r.not_admitted == 0 && r.refused == 0;
    std::vector<bench::HitRateLine> lines{hits};
    if (!all_found) lines.push_back(found);
    if (t.recommended >= 0) {
      const CapacityRun& r = t.runs[static_cast<std::size_t>(t.recommended)];
      lines.push_back({"recommended", {{x(r), t.fraction(r.hits)}}, true});
    }
    o << "<section class=\"chart\" id=\"curve-" << ti << "\"><h2>" << html_escape(t.name)
      << ": uses that find their row against capacity</h2><p class=\"note\">capacity as a fraction of the "
      << t.distinct << " distinct keys; a use of a key admitted by its batch finds a new row at its initial value</p>"
      << bench::hit_rate_chart("uses of " + t.name + " that find their row against capacity", lines,
                               "capacity (fraction of the distinct keys)")
      << "</section>\n";

    // The growth: new distinct keys per step, in at most 10 groups of steps, each named by its last step.
    const auto n = static_cast<std::int64_t>(t.distinct_by_step.size());
    const std::int64_t groups = std::min<std::int64_t>(10, n);
    std::vector<std::string> names;
    bench::BarLine fresh{"new keys per step", {}};
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t first = g * n / groups, last = (g + 1) * n / groups;  // steps [first, last)
      const std::int64_t before = first > 0 ? t.distinct_by_step[static_cast<std::size_t>(first - 1)] : 0;
      const std::int64_t after = t.distinct_by_step[static_cast<std::size_t>(last - 1)];
      names.push_back(std::to_string(last));
      fresh.values.emplace_back(static_cast<double>(after - before) / static_cast<double>(last - first));
    }
    o << "<section class=\"chart\" id=\"growth-" << ti << "\"><h2>" << html_escape(t.name)
      << ": new distinct keys per step</h2><p class=\"note\">each bar a group of steps, named by its last; a table "
         "whose new keys do not fall "
         "towards zero keeps growing: its capacity holds the keys of a window of steps, and evicts or expires the "
         "rest</p>"
      << bench::bar_chart("new distinct keys per step of " + t.name, names, {fresh}, bench::ChartUnit::kCount,
                          "new keys per step")
      << "</section>\n";
  }
  o << "</body>\n</html>\n";
  return o.str();
}

}  // namespace strata::tune
