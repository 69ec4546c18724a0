#include "toolkit/report_html.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <unistd.h>

namespace strata::bench {
namespace {

using nlohmann::json;
using Opt = std::optional<double>;

// Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
constexpr const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                   "#CC79A7", "#56B4E9", "#8C6D1F", "#000000"};
constexpr int kNumColors = 8;

// ---- reading the document defensively ----

Opt number_at(const json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<std::string> string_at(const json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

const json& object_at(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_object() ? *it : kNull;
}

// ---- number formatting ----

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// 3 significant digits, no exponent, trailing zeros removed.
std::string sig3(double v) {
  const double a = std::fabs(v);
  std::string s = fmt(a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3g", v);
  if (s.find('.') != std::string::npos && s.find('e') == std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

// v in steps of 1000, with the suffix of its step: 3 significant digits.
std::string decimal_scaled(double v, const char* const (&suffix)[6]) {
  int p = 0;
  while (p < 5 && std::fabs(v) >= 1000.0) {
    v /= 1000.0;
    ++p;
  }
  return sig3(v) + suffix[p];
}

// 1234567 -> "1.23 M" (decimal SI prefixes).
std::string si(double v) {
  static const char* const kPrefix[] = {"", " k", " M", " G", " T", " P"};
  return decimal_scaled(v, kPrefix);
}

std::string bytes_str(double v) {
  static const char* const kUnit[] = {" B", " KB", " MB", " GB", " TB", " PB"};
  return decimal_scaled(v, kUnit);
}

std::string ms_str(double v) { return sig3(v) + " ms"; }
std::string percent_str(double v) { return sig3(v * 100.0) + "%"; }

using Unit = ChartUnit;

std::string format_value(double v, Unit u) {
  switch (u) {
    case Unit::kCount:
      return si(v);
    case Unit::kBytes:
      return bytes_str(v);
    case Unit::kMs:
      return ms_str(v);
    case Unit::kFraction:
      return percent_str(v);
  }
  return sig3(v);
}

// A "nice" upper bound and tick step for [0, max]: step in {1, 2, 2.5, 5} x 10^k, about 5 ticks.
std::pair<double, double> nice_axis(double max) {
  if (!(max > 0)) return {1.0, 0.2};
  const double raw = max / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  return {std::ceil(max / step - 1e-9) * step, step};
}

std::string num(double v) { return fmt("%.1f", v); }  // SVG coordinates

// ---- SVG charts ----

constexpr double kWidth = 760, kHeight = 380;
constexpr double kLeft = 84, kRight = 16, kTop = 44, kBottom = 64;

using BarSeries = BarLine;

void legend(std::ostringstream& o, const std::vector<std::string>& names) {
  double x = kLeft;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string label = html_escape(names[i]);
    o << "<rect x=\"" << num(x) << "\" y=\"12\" width=\"12\" height=\"12\" fill=\"" << kColors[i % kNumColors]
      << "\"/><text x=\"" << num(x + 16) << "\" y=\"22\" class=\"legend\">" << label << "</text>";
    // Approximate text width (7 px per character) to place the next entry.
    x += 16 + 7.0 * static_cast<double>(std::min<std::size_t>(names[i].size(), 40)) + 18;
  }
}

void y_axis(std::ostringstream& o, double y_max, double step, Unit unit, const std::string& y_label) {
  const double plot_h = kHeight - kTop - kBottom;
  for (double t = 0; t <= y_max + step * 1e-6; t += step) {
    const double y = kTop + plot_h * (1.0 - t / y_max);
    o << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(y) << "\" y2=\""
      << num(y) << "\" class=\"grid\"/>";
    o << "<text x=\"" << num(kLeft - 6) << "\" y=\"" << num(y + 4) << "\" class=\"tick\" text-anchor=\"end\">"
      << html_escape(format_value(t, unit)) << "</text>";
  }
  o << "<text transform=\"translate(14," << num(kTop + plot_h / 2) << ") rotate(-90)\" class=\"axis\" "
    << "text-anchor=\"middle\">" << html_escape(y_label) << "</text>";
  o << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kLeft) << "\" y1=\"" << num(kTop) << "\" y2=\""
    << num(kTop + plot_h) << "\" class=\"axisline\"/>";
}

// Grouped bars: one group per entry of `groups`, one bar per series within a group.
std::string grouped_bars(const std::string& aria, const std::vector<std::string>& groups,
                         const std::vector<BarSeries>& series, Unit unit, const std::string& y_label) {
  double max = 0;
  for (const auto& s : series)
    for (const auto& v : s.values)
      if (v) max = std::max(max, *v);
  const auto [y_max, step] = nice_axis(max);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const double group_w = plot_w / static_cast<double>(std::max<std::size_t>(groups.size(), 1));
  const double bar_w = group_w * 0.8 / static_cast<double>(std::max<std::size_t>(series.size(), 1));

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << num(kWidth) << " " << num(kHeight)
    << "\" role=\"img\" aria-label=\"" << html_escape(aria) << "\">";
  std::vector<std::string> names;
  for (const auto& s : series) names.push_back(s.name);
  legend(o, names);
  y_axis(o, y_max, step, unit, y_label);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double gx = kLeft + group_w * static_cast<double>(g) + group_w * 0.1;
    for (std::size_t s = 0; s < series.size(); ++s) {
      const Opt v = g < series[s].values.size() ? series[s].values[g] : std::nullopt;
      if (!v) continue;
      const double h = std::max(0.0, plot_h * (*v / y_max));
      const double x = gx + bar_w * static_cast<double>(s);
      o << "<rect x=\"" << num(x) << "\" y=\"" << num(kTop + plot_h - h) << "\" width=\"" << num(bar_w * 0.92)
        << "\" height=\"" << num(h) << "\" fill=\"" << kColors[s % kNumColors] << "\"><title>"
        << html_escape(groups[g] + " / " + series[s].name + ": " + format_value(*v, unit)) << "</title></rect>";
    }
    std::string label = groups[g];
    if (label.size() > 24) label = label.substr(0, 23) + "\u2026";
    o << "<text x=\"" << num(kLeft + group_w * (static_cast<double>(g) + 0.5)) << "\" y=\"" << num(kTop + plot_h + 18)
      << "\" class=\"group\" text-anchor=\"middle\">" << html_escape(label) << "</text>";
  }
  o << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kTop + plot_h)
    << "\" y2=\"" << num(kTop + plot_h) << "\" class=\"axisline\"/>";
  o << "</svg>";
  return o.str();
}

struct LineSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
  bool markers_only = false;                      // the points alone, no line joining them
};

// Lines over x in [0, 1] (fractions, shown as percentages) with y in `y_unit`; fractions on y run
// over [0, 1] unless the data go beyond. `y_name` names y in the tooltips.
std::string line_chart(const std::string& aria, const std::vector<LineSeries>& series, const std::string& x_label,
                       const std::string& y_label, Unit y_unit = Unit::kFraction,
                       const std::string& y_name = "hit rate") {
  double x_max = 0, y_max_data = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_max_data = std::max(y_max_data, y);
    }
  // x runs from 0 to a round value just above the largest point (a sweep up to 40% gets 0..40%,
  // not 0..100%); fractions on y run over [0, 1] unless the data go beyond.
  const auto [x_top, x_step] = nice_axis(x_max);
  const auto [y_top, y_step] =
      nice_axis(y_unit == Unit::kFraction ? std::max(y_max_data, y_max_data <= 1.0 ? 1.0 : 0.0) : y_max_data);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const auto px = [&, x_top = x_top](double x) { return kLeft + plot_w * (x / x_top); };
  const auto py = [&, y_top = y_top](double y) { return kTop + plot_h * (1.0 - y / y_top); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << num(kWidth) << " " << num(kHeight)
    << "\" role=\"img\" aria-label=\"" << html_escape(aria) << "\">";
  std::vector<std::string> names;
  for (const auto& s : series) names.push_back(s.name);
  legend(o, names);
  y_axis(o, y_top, y_step, y_unit, y_label);
  for (double t = 0; t <= x_top + x_step * 1e-6; t += x_step) {
    o << "<text x=\"" << num(px(t)) << "\" y=\"" << num(kTop + plot_h + 18) << "\" class=\"tick\" "
      << "text-anchor=\"middle\">" << html_escape(percent_str(t)) << "</text>";
  }
  o << "<text x=\"" << num(kLeft + plot_w / 2) << "\" y=\"" << num(kHeight - 16) << "\" class=\"axis\" "
    << "text-anchor=\"middle\">" << html_escape(x_label) << "</text>";
  o << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kTop + plot_h)
    << "\" y2=\"" << num(kTop + plot_h) << "\" class=\"axisline\"/>";
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* color = kColors[s % kNumColors];
    if (!series[s].markers_only) {
      o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
      for (std::size_t i = 0; i < series[s].points.size(); ++i)
        o << (i ? " " : "") << num(px(series[s].points[i].first)) << "," << num(py(series[s].points[i].second));
      o << "\"/>";
    }
    for (const auto& [x, y] : series[s].points) {
      o << "<circle cx=\"" << num(px(x)) << "\" cy=\"" << num(py(y)) << "\" r=\"3.5\" fill=\"" << color << "\"><title>"
        << html_escape(series[s].name + ": cache " + percent_str(x) + ", " + y_name + " " + format_value(y, y_unit))
        << "</title></circle>";
    }
  }
  o << "</svg>";
  return o.str();
}

// ---- page pieces ----

constexpr const char* kCss = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:66rem;color:#1a1a1a;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin:1.8rem 0 .4rem;border-bottom:1px solid #ddd}
p.note{color:#555;margin:.2rem 0 .8rem}
p.warn{background:#fff4d6;border-left:4px solid #d89b00;padding:.4rem .6rem;margin:.4rem 0 .8rem}
table{border-collapse:collapse;font-size:.9rem;margin:.4rem 0}
th,td{border:1px solid #ddd;padding:.25rem .55rem;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}th{background:#f4f4f4}
section.summary td:first-child{white-space:nowrap}
section.info{display:inline-block;vertical-align:top;margin-right:2rem}
svg{width:100%;height:auto;max-width:760px;display:block;background:#fff}
svg text{font-family:inherit;fill:#222}svg .tick{font-size:11px;fill:#555}svg .group{font-size:12px}
svg .legend{font-size:12px}svg .axis{font-size:12px;fill:#333}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axisline{stroke:#888;stroke-width:1}
ul.explain{font-size:.9rem}
details summary{cursor:pointer;color:#333;margin:.3rem 0}
table.tables td{padding:.1rem .5rem}
section.verdict{background:#eef6ee;border-left:4px solid #009E73;padding:.3rem .9rem .5rem;margin:.8rem 0}
section.verdict h2{border:none;margin:.3rem 0}section.verdict p.headline{font-size:1.05rem;margin:.2rem 0 .4rem}
section.verdict.none{background:#fdecea;border-left-color:#D55E00}
tr.chosen td{background:#eef6ee;font-weight:600}tr.nofit td{color:#8a8a8a}tr.nofit td.fit{color:#b3261e}
td.fit{white-space:nowrap}div.wide{overflow-x:auto}
)";

std::string value_cell(const json& v) {
  if (v.is_string()) return html_escape(v.get<std::string>());
  return html_escape(v.dump());
}

void info_section(std::ostringstream& o, const char* id, const char* title, const json& obj) {
  if (!obj.is_object() || obj.empty()) return;
  o << "<section class=\"info\" id=\"" << id << "\"><h2>" << title << "</h2><table>";
  for (const auto& [k, v] : obj.items())
    o << "<tr><th>" << html_escape(k) << "</th><td>" << value_cell(v) << "</td></tr>";
  o << "</table></section>\n";
}

struct ModeRow {
  std::string mode;
  const json* doc;
};

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// The trainer placement of a run (settings.trainer; runs before --trainer kept their dense model on the host).
std::string trainer_of(const json& doc) {
  const auto s = doc.find("settings");
  if (s != doc.end() && s->is_object()) {
    const auto t = s->find("trainer");
    if (t != s->end() && t->is_string()) return t->get<std::string>();
  }
  return "host";
}

namespace {

// What every section of the report reads: the results document, its modes (those with a name),
// their names, and whether a device mode ran on the emulated device.
struct ReportInput {
  const json& doc;
  std::vector<ModeRow> modes;
  std::vector<std::string> mode_names;
  bool emu = false;
};

// The table list (collapsed: a Criteo-shaped set has 26 entries).
void tables_section(std::ostream& o, const ReportInput& in) {
  const json& doc = in.doc;
  if (doc.contains("tables") && doc["tables"].is_array() && !doc["tables"].empty()) {
    std::ostringstream rows;
    double total_rows = 0, total_bytes = 0;
    int n = 0;
    for (const json& t : doc["tables"]) {
      const Opt r = number_at(t, "rows");
      const Opt d = number_at(t, "dim");
      if (!r || !d) continue;
      ++n;
      // Rows of the table's dtype (bf16 and fp16: 2 bytes an element; none given: fp32).
      const std::optional<std::string> dtype = string_at(t, "dtype");
      const double bytes = *r * *d * (dtype && (*dtype == "bf16" || *dtype == "fp16") ? 2.0 : 4.0);
      total_rows += *r;
      total_bytes += bytes;
      rows << "<tr><td>" << html_escape(string_at(t, "name").value_or("")) << "</td><td class=\"n\">"
           << html_escape(fmt("%.0f", *r)) << "</td><td class=\"n\">" << html_escape(fmt("%.0f", *d))
           << "</td><td class=\"n\">" << html_escape(bytes_str(bytes)) << "</td></tr>";
    }
    if (n > 0) {
      o << "<section class=\"info\" id=\"tables\"><h2>Tables</h2><details><summary>" << n << " table"
        << (n == 1 ? "" : "s") << ", " << html_escape(si(total_rows)) << " rows, "
        << html_escape(bytes_str(total_bytes)) << " of fp32 weights</summary><table class=\"tables\">"
        << "<tr><th>name</th><th>rows</th><th>dim</th><th>weights</th></tr>" << rows.str()
        << "</table></details></section>\n";
    }
  }
}

// Whether a mode (or sweep point) fits the memory budgets: true unless its memory_fit says not.
bool fits(const json& m) {
  const json& f = object_at(m, "memory_fit");
  const auto it = f.is_object() ? f.find("fits") : f.end();
  return !(f.is_object() && it != f.end() && it->is_boolean() && !it->get<bool>());
}

// "yes", or "no: HBM 35.2 MB > 8.0 MB budget"; none without a memory_fit.
std::optional<std::string> fit_text(const json& m) {
  const json& f = object_at(m, "memory_fit");
  if (!f.is_object() || !f.contains("fits") || !f["fits"].is_boolean()) return std::nullopt;
  if (fits(m)) return std::string("yes");
  return "no: " + string_at(f, "why").value_or("over the budget");
}

// The verdict: the placement to use and why, and which figures are measured and which modelled.
void verdict_section(std::ostream& o, const ReportInput& in) {
  const json& v = object_at(in.doc, "verdict");
  const auto headline = string_at(v, "headline");
  if (!headline) return;
  const bool none = !string_at(v, "mode");  // no placement fits
  o << "<section class=\"verdict" << (none ? " none" : "")
    << "\" id=\"verdict\"><h2>Verdict</h2><p class=\"headline\"><b>" << html_escape(*headline) << "</b></p>";
  if (v.contains("lines") && v["lines"].is_array()) {
    o << "<ul class=\"explain\">";
    for (const json& l : v["lines"])
      if (l.is_string()) o << "<li>" << html_escape(l.get<std::string>()) << "</li>";
    o << "</ul>";
  }
  o << "</section>\n";
}

// The summary table: only the columns some mode has.
void summary_section(std::ostream& o, const ReportInput& in) {
  const std::vector<ModeRow>& modes = in.modes;
  if (!modes.empty()) {
    struct Column {
      const char* header;
      std::function<std::optional<std::string>(const json&)> cell;
      bool numeric;
    };
    const auto numeric = [](const char* key, Unit unit) {
      return [key, unit](const json& m) -> std::optional<std::string> {
        const Opt v = number_at(m, key);
        if (!v) return std::nullopt;
        return format_value(*v, unit);
      };
    };
    // A number of an object of the mode ("modelled", "memory_fit").
    const auto nested = [](const char* object, const char* key, Unit unit) {
      return [object, key, unit](const json& m) -> std::optional<std::string> {
        const Opt v = number_at(object_at(m, object), key);
        if (!v) return std::nullopt;
        return format_value(*v, unit);
      };
    };
    // The verdict's figures first (fit, modelled step, the model's memory), then what was measured.
    const std::vector<Column> columns = {
        {"fits", [](const json& m) { return fit_text(m); }, false},
        {"modelled step", nested("modelled", "step_ms", Unit::kMs), true},
        {"bottleneck", [](const json& m) { return string_at(object_at(m, "modelled"), "bottleneck"); }, false},
        {"model HBM", nested("memory_fit", "hbm_bytes", Unit::kBytes), true},
        {"model host", nested("memory_fit", "host_bytes", Unit::kBytes), true},
        {"samples/s", numeric("samples_per_s", Unit::kCount), true},
        {"forward lookups/s", numeric("forward_lookups_per_s", Unit::kCount), true},
        {"train lookups/s", numeric("train_lookups_per_s", Unit::kCount), true},
        {"forward / gather limit", numeric("forward_fraction_of_gather_limit", Unit::kFraction), true},
        {"step floor / step", numeric("train_fraction_of_step_floor", Unit::kFraction), true},
        {"step p50", numeric("step_ms_p50", Unit::kMs), true},
        {"step p99", numeric("step_ms_p99", Unit::kMs), true},
        {"step max", numeric("step_ms_max", Unit::kMs), true},
        {"hit rate", numeric("hit_rate", Unit::kFraction), true},
        {"deferred plans",  // table plans that waited for batches in flight to retire (cache small for the pipeline)
         [](const json& m) -> std::optional<std::string> {
           const Opt v = number_at(object_at(m, "cache"), "deferred");
           if (!v) return std::nullopt;
           return format_value(*v, Unit::kCount);
         },
         true},
        {"peak host", numeric("peak_host_bytes", Unit::kBytes), true},
        {"peak device", numeric("peak_device_bytes", Unit::kBytes), true},
    };
    std::vector<const Column*> shown;
    for (const auto& c : columns)
      if (std::any_of(modes.begin(), modes.end(), [&](const ModeRow& m) { return c.cell(*m.doc).has_value(); }))
        shown.push_back(&c);
    o << "<section class=\"summary\" id=\"summary\"><h2>Summary</h2><div class=\"wide\"><table><tr><th>mode</th>";
    for (const Column* c : shown) o << "<th>" << html_escape(c->header) << "</th>";
    o << "</tr>";
    for (const auto& m : modes) {
      const auto chosen = m.doc->find("chosen");
      const bool is_chosen = chosen != m.doc->end() && chosen->is_boolean() && chosen->get<bool>();
      o << "<tr"
        << (is_chosen       ? " class=\"chosen\""
            : !fits(*m.doc) ? " class=\"nofit\""
                            : "")
        << "><td>" << html_escape(m.mode) << (is_chosen ? " &#10003;" : "") << "</td>";
      for (const Column* c : shown) {
        const auto v = c->cell(*m.doc);
        o << "<td"
          << (c->numeric                         ? " class=\"n\""
              : std::string(c->header) == "fits" ? " class=\"fit\""
                                                 : "")
          << ">" << (v ? html_escape(*v) : "&ndash;") << "</td>";
      }
      o << "</tr>";
    }
    o << "</table></div>";
    if (std::any_of(modes.begin(), modes.end(), [](const ModeRow& m) {
          return number_at(object_at(*m.doc, "memory_fit"), "hbm_bytes").has_value();
        }))
      o << "<p class=\"note\">model HBM and model host: what one rank of the mode's store takes by the engine "
        << "model (every table's largest step); a mode that does not fit the memory budgets is greyed and never "
        << "chosen. &#10003; marks the verdict's choice.</p>";
    o << "</section>\n";
  }
}

// Throughput per mode.
void throughput_section(std::ostream& o, const ReportInput& in) {
  const std::vector<ModeRow>& modes = in.modes;
  const std::vector<std::string>& mode_names = in.mode_names;
  BarSeries fwd{"forward lookups/s", {}}, train{"training-step lookups/s", {}};
  bool any = false;
  for (const auto& m : modes) {
    fwd.values.push_back(number_at(*m.doc, "forward_lookups_per_s"));
    train.values.push_back(number_at(*m.doc, "train_lookups_per_s"));
    any = any || fwd.values.back() || train.values.back();
  }
  if (any) {
    o << "<section class=\"chart\" id=\"throughput\"><h2>Throughput per mode</h2>"
      << "<p class=\"note\">Embedding lookups (keys) per second; higher is better."
      << (in.emu ? " Measured on the emulated device: these rates rank CPU work only (the CPU running the GPU "
                   "kernels' logic), not the placements on a GPU; the verdict above uses the modelled step."
                 : "")
      << "</p>" << grouped_bars("lookups per second per mode", mode_names, {fwd, train}, Unit::kCount, "lookups/s")
      << "</section>\n";
  }
}

// Bytes per step per link.
void bytes_section(std::ostream& o, const ReportInput& in) {
  const json& doc = in.doc;
  const std::vector<ModeRow>& modes = in.modes;
  const std::vector<std::string>& mode_names = in.mode_names;
  static const std::pair<const char*, const char*> kLinks[] = {
      {"hbm_read", "HBM read"},   {"hbm_write", "HBM write"},   {"h2d", "PCIe H2D"},         {"d2h", "PCIe D2H"},
      {"host_read", "host read"}, {"host_write", "host write"}, {"all_to_all", "all-to-all"}};
  std::vector<BarSeries> series;
  for (const auto& [key, label] : kLinks) {
    BarSeries s{label, {}};
    bool any = false;
    for (const auto& m : modes) {
      s.values.push_back(number_at(object_at(*m.doc, "bytes_per_step"), key));
      any = any || s.values.back().has_value();
    }
    if (any) series.push_back(std::move(s));
  }
  if (!series.empty()) {
    o << "<section class=\"chart\" id=\"bytes\"><h2>Bytes per step per link</h2>"
      << "<p class=\"note\">Bytes one training step moves over each link, as counted by the device layer, "
      << "with the trainer's dense model on the " << html_escape(trainer_of(doc)) << " (strata-bench --trainer). "
      << "Host-side CPU kernels (the CPU gather and the CPU optimizer) have no counters and are not shown; the "
      << "modelled step time adds their row traffic.</p>"
      << grouped_bars("bytes per training step on each link, per mode", mode_names, series, Unit::kBytes, "bytes/step")
      << "</section>\n";
  }
}

// Measured step time. The modelled times get a chart of their own: beside emulated or CPU times
// tens to thousands of times larger they would be bars too short to read.
void step_time_section(std::ostream& o, const ReportInput& in) {
  const std::vector<ModeRow>& modes = in.modes;
  const std::vector<std::string>& mode_names = in.mode_names;
  const bool emu = in.emu;
  BarSeries p50{"measured p50", {}}, p99{"measured p99", {}}, max{"measured max", {}};
  for (const auto& m : modes) {
    p50.values.push_back(number_at(*m.doc, "step_ms_p50"));
    p99.values.push_back(number_at(*m.doc, "step_ms_p99"));
    max.values.push_back(number_at(*m.doc, "step_ms_max"));
  }
  std::vector<BarSeries> series;
  for (auto* s : {&p50, &p99, &max})
    if (std::any_of(s->values.begin(), s->values.end(), [](const Opt& v) { return v.has_value(); }))
      series.push_back(*s);
  if (!series.empty()) {
    const bool tail = std::any_of(p99.values.begin(), p99.values.end(), [](const Opt& v) { return v.has_value(); });
    o << "<section class=\"chart\" id=\"step-time\"><h2>Measured step time</h2>"
      << "<p class=\"note\">Training step latency measured on this machine"
      << (emu ? " (device modes on the emulated device)" : "") << ": median" << (tail ? ", 99th percentile" : "")
      << " and slowest step" << (tail ? "" : " (too few timed steps for a 99th percentile)") << ".</p>"
      << grouped_bars("measured step time per mode", mode_names, series, Unit::kMs, "ms per step") << "</section>\n";
  }
}

// Modelled step time, on its own axis.
void modelled_section(std::ostream& o, const ReportInput& in) {
  const std::vector<ModeRow>& modes = in.modes;
  const std::vector<std::string>& mode_names = in.mode_names;
  BarSeries model{"modelled", {}};
  std::vector<std::pair<std::string, std::string>> explanations;
  std::string profile;
  for (const auto& m : modes) {
    const json& mod = object_at(*m.doc, "modelled");
    model.values.push_back(number_at(mod, "step_ms"));
    if (const auto e = string_at(mod, "explanation")) explanations.emplace_back(m.mode, *e);
    if (const auto pr = string_at(mod, "profile"); pr && profile.empty()) profile = *pr;
  }
  if (std::any_of(model.values.begin(), model.values.end(), [](const Opt& v) { return v.has_value(); })) {
    o << "<section class=\"chart\" id=\"modelled-step\"><h2>Modelled step time</h2>"
      << "<p class=\"note\">The cost model's step time"
      << (profile.empty() ? std::string() : " on profile " + html_escape(profile))
      << ", from this run's bytes per link (links overlap: the slowest link plus kernel launches).</p>"
      << grouped_bars("modelled step time per mode", mode_names, {model}, Unit::kMs, "ms per step");
    if (!explanations.empty()) {
      o << "<ul class=\"explain\">";
      for (const auto& [mode, e] : explanations)
        o << "<li><b>" << html_escape(mode) << "</b>: " << html_escape(e) << "</li>";
      o << "</ul>";
    }
    o << "</section>\n";
  }
}

// Peak memory per mode.
void memory_section(std::ostream& o, const ReportInput& in) {
  const std::vector<ModeRow>& modes = in.modes;
  const std::vector<std::string>& mode_names = in.mode_names;
  static const std::pair<const char*, const char*> kMemory[] = {{"peak_host_bytes", "peak host (process RSS)"},
                                                                {"host_table_bytes", "host tables"},
                                                                {"peak_device_bytes", "peak device"}};
  std::vector<BarSeries> series;
  for (const auto& [key, label] : kMemory) {
    BarSeries s{label, {}};
    bool any = false;
    for (const auto& m : modes) {
      s.values.push_back(number_at(*m.doc, key));
      any = any || s.values.back().has_value();
    }
    if (any) series.push_back(std::move(s));
  }
  if (!series.empty()) {
    o << "<section class=\"chart\" id=\"memory\"><h2>Peak memory per mode</h2>"
      << "<p class=\"note\">Peak resident memory of the process while the mode ran (an emulated device's memory is "
      << "host memory and counts in it), the store's host tables, and the device's high-water mark of allocated "
      << "bytes.</p>" << grouped_bars("peak host and device memory per mode", mode_names, series, Unit::kBytes, "bytes")
      << "</section>\n";
  }
}

// Hit rate against cache size.
void sweep_hit_rate_section(std::ostream& o, const ReportInput& in) {
  const json& doc = in.doc;
  if (!(doc.contains("sweep") && doc["sweep"].is_array())) return;
  // Sizes that hold every row the run touched have first-use misses only.
  Opt smallest_full;  // the smallest cache size that holds every row the run touched
  for (const json& p : doc["sweep"]) {
    const auto h = p.find("holds_every_touched_row");
    const Opt x = number_at(p, "cache_fraction");
    if (h == p.end() || !h->is_boolean() || !h->get<bool>() || !x || !number_at(p, "hit_rate")) continue;
    if (!smallest_full || *x < *smallest_full) smallest_full = x;
  }
  std::string saturated;
  if (smallest_full) {
    const Opt touched = number_at(doc, "sweep_touched_rows");
    saturated = " From " + html_escape(percent_str(*smallest_full)) + " on, the cache holds every one of the " +
                (touched ? html_escape(fmt("%.0f", *touched)) + " " : std::string()) +
                "distinct rows the run touched (marked * in the table): its misses are first uses only, so a "
                "larger cache cannot raise the hit rate; a longer run or more distinct rows would compare them.";
  }
  std::map<std::pair<std::string, std::string>, LineSeries> by_key;
  std::vector<std::pair<std::string, std::string>> order;
  for (const json& p : doc["sweep"]) {
    const Opt x = number_at(p, "cache_fraction");
    const Opt y = number_at(p, "hit_rate");
    if (!x || !y || *x < 0 || *y < 0) continue;
    const std::string mode = string_at(p, "mode").value_or("");
    const std::string policy = string_at(p, "policy").value_or("");
    const auto key = std::make_pair(mode, policy);
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      std::string name = mode;
      if (!policy.empty()) name += name.empty() ? policy : " / " + policy;
      if (name.empty()) name = "hit rate";
      it = by_key.emplace(key, LineSeries{name, {}}).first;
      order.push_back(key);
    }
    it->second.points.emplace_back(*x, *y);
  }
  if (!order.empty()) {
    std::vector<LineSeries> series;
    for (const auto& k : order) {
      LineSeries s = by_key[k];
      std::sort(s.points.begin(), s.points.end());
      series.push_back(std::move(s));
    }
    o << "<section class=\"chart\" id=\"hit-rate\"><h2>Hit rate against cache size</h2>"
      << "<p class=\"note\">Cache hit rate for each cache size, as a fraction of the table rows." << saturated << "</p>"
      << line_chart("hit rate against cache size", series, "cache size (fraction of rows)", "hit rate")
      << "</section>\n";
  }
}

// Throughput against cache size (the sweep points that have it).
void sweep_throughput_section(std::ostream& o, const ReportInput& in) {
  const json& doc = in.doc;
  if (!(doc.contains("sweep") && doc["sweep"].is_array())) return;
  LineSeries fwd{"forward lookups/s", {}}, train{"training-step lookups/s", {}};
  for (const json& p : doc["sweep"]) {
    const Opt x = number_at(p, "cache_fraction");
    if (!x || *x < 0) continue;
    if (const Opt y = number_at(p, "forward_lookups_per_s"); y && *y >= 0) fwd.points.emplace_back(*x, *y);
    if (const Opt y = number_at(p, "train_lookups_per_s"); y && *y >= 0) train.points.emplace_back(*x, *y);
  }
  std::vector<LineSeries> tput;
  for (auto* s : {&fwd, &train}) {
    if (s->points.empty()) continue;
    std::sort(s->points.begin(), s->points.end());
    tput.push_back(*s);
  }
  if (!tput.empty()) {
    o << "<section class=\"chart\" id=\"sweep-throughput\"><h2>Throughput against cache size</h2>"
      << "<p class=\"note\">Lookups per second of the cached mode at each cache size (same batches).</p>"
      << line_chart("lookups per second against cache size", tput, "cache size (fraction of rows)", "lookups/s",
                    Unit::kCount, "lookups/s")
      << "</section>\n";
  }
}

// The cache sweep: every point, including those skipped.
void sweep_table_section(std::ostream& o, const ReportInput& in) {
  const json& doc = in.doc;
  if (!(doc.contains("sweep") && doc["sweep"].is_array())) return;
  std::ostringstream rows;
  int n = 0;
  for (const json& p : doc["sweep"]) {
    const Opt x = number_at(p, "cache_fraction");
    if (!x) continue;
    const auto cell = [&](const char* key, Unit unit) {
      const Opt v = number_at(p, key);
      return v ? html_escape(format_value(*v, unit)) : std::string("&ndash;");
    };
    ++n;
    const auto h = p.find("holds_every_touched_row");
    const bool holds = h != p.end() && h->is_boolean() && h->get<bool>();
    rows << "<tr><td class=\"n\">" << html_escape(percent_str(*x)) << (holds ? " *" : "") << "</td><td>"
         << html_escape(string_at(p, "policy").value_or("")) << "</td>";
    if (const auto skipped = string_at(p, "skipped")) {
      rows << "<td colspan=\"5\">skipped: " << html_escape(*skipped) << "</td></tr>";
      continue;
    }
    rows << "<td class=\"n\">" << cell("cache_bytes", Unit::kBytes) << "</td><td class=\"n\">"
         << cell("hit_rate", Unit::kFraction) << "</td><td class=\"n\">" << cell("forward_lookups_per_s", Unit::kCount)
         << "</td><td class=\"n\">" << cell("train_lookups_per_s", Unit::kCount) << "</td><td>"
         << html_escape(fit_text(p).value_or("")) << "</td></tr>";
  }
  if (n > 0) {
    o << "<section class=\"summary\" id=\"sweep-table\"><h2>Cache sweep</h2><table><tr><th>cache size</th>"
      << "<th>policy</th><th>cache bytes</th><th>hit rate</th><th>forward lookups/s</th><th>train "
         "lookups/s</th><th>fits</th></tr>"
      << rows.str() << "</table></section>\n";
  }
}

}  // namespace

std::string render_html_report(const json& results, const HtmlReportOptions& options) {
  const json& doc = results.is_object() ? results : json::object();
  std::string title = options.title;
  if (title.empty()) title = string_at(doc, "title").value_or("Strata benchmark report");

  ReportInput in{doc, {}, {}, false};
  std::vector<ModeRow>& modes = in.modes;
  if (doc.contains("modes") && doc["modes"].is_array()) {
    for (const json& m : doc["modes"]) {
      const auto name = string_at(m, "mode");
      if (name) modes.push_back({*name, &m});
    }
  }
  for (const auto& m : modes) in.mode_names.push_back(m.mode);

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" << html_escape(title)
    << "</title>\n<style>" << kCss << "</style>\n</head>\n<body>\n<header><h1>" << html_escape(title) << "</h1>";
  o << "<p class=\"note\">Every mode ran the same sequence of batches. Hover over a bar or point for its value.</p>";
  // Measured device times from the emulator say nothing about a GPU: say so before any number.
  in.emu = std::any_of(modes.begin(), modes.end(), [](const ModeRow& m) {
    return string_at(*m.doc, "device") == std::string("emu") ||
           string_at(*m.doc, "trainer_device") == std::string("emu");
  });
  if (in.emu)
    o << "<p class=\"warn\" id=\"emulated\">No GPU: the device modes ran on the <b>emulated device</b> (emu), "
      << "which runs the GPU kernels' logic on this machine's CPU. Their measured throughput and step times are "
      << "the emulation's, not a GPU's; compare the modes by their bytes per link and modelled step times.</p>";
  o << "</header>\n";

  verdict_section(o, in);
  info_section(o, "machine", "Machine", object_at(doc, "machine"));
  info_section(o, "workload", "Workload", object_at(doc, "workload"));

  tables_section(o, in);
  summary_section(o, in);
  throughput_section(o, in);
  bytes_section(o, in);
  step_time_section(o, in);
  modelled_section(o, in);
  memory_section(o, in);
  sweep_hit_rate_section(o, in);
  sweep_throughput_section(o, in);
  sweep_table_section(o, in);
  if (modes.empty() && !(doc.contains("sweep") && doc["sweep"].is_array() && !doc["sweep"].empty()))
    o << "<p class=\"note\">The results document holds no modes.</p>\n";
  o << "</body>\n</html>\n";
  return o.str();
}

std::string hit_rate_chart(const std::string& aria, const std::vector<HitRateLine>& lines, const std::string& x_label) {
  std::vector<LineSeries> series;
  series.reserve(lines.size());
  for (const HitRateLine& l : lines) series.push_back({l.name, l.points, l.markers_only});
  return line_chart(aria, series, x_label, "hit rate");
}

std::string bar_chart(const std::string& aria, const std::vector<std::string>& groups,
                      const std::vector<BarLine>& series, ChartUnit unit, const std::string& y_label) {
  return grouped_bars(aria, groups, series, unit, y_label);
}

const char* report_css() noexcept { return kCss; }

Status write_html_report(const std::string& path, const json& results, const HtmlReportOptions& options) {
  const std::string html = render_html_report(results, options);
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::io_error("cannot create report '" + temp + "': " + std::strerror(errno));
    out.write(html.data(), static_cast<std::streamsize>(html.size()));
    out.flush();
    if (!out) {
      const Status st = Status::io_error("cannot write report '" + temp + "': " + std::strerror(errno));
      std::remove(temp.c_str());
      return st;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const Status st = Status::io_error("cannot rename '" + temp + "' to '" + path + "': " + std::strerror(errno));
    std::remove(temp.c_str());
    return st;
  }
  return Status::ok();
}

}  // namespace strata::bench
