#include "toolkit/report_html.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

using nlohmann::json;

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Checks that every element is closed in order (void elements and self-closing tags aside) and
// that no raw '<' or '>' appears outside tags. Returns "" when well-formed, else what is wrong.
std::string check_well_formed(const std::string& html) {
  static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "input", "link", "!DOCTYPE"};
  std::vector<std::string> stack;
  std::size_t i = 0;
  while (i < html.size()) {
    if (html[i] == '>') return "stray '>' at " + std::to_string(i);
    if (html[i] != '<') {
      ++i;
      continue;
    }
    const std::size_t end = html.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    const std::string tag = html.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    const bool closing = tag[0] == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \t\n/"));
    if (closing) {
      if (stack.empty() || stack.back() != name)
        return "</" + name + "> closes <" + (stack.empty() ? std::string("nothing") : stack.back()) + ">";
      stack.pop_back();
      if (name == "style") continue;
    } else if (tag.back() == '/' || kVoid.count(name)) {
      continue;
    } else {
      stack.push_back(name);
      if (name == "style") {  // CSS may hold '>' selectors; skip to </style>
        const std::size_t close = html.find("</style>", i);
        if (close == std::string::npos) return "unclosed <style>";
        i = close;
      }
    }
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return "";
}

// The text of the section with `id` ("" when absent).
std::string section(const std::string& html, const std::string& id) {
  const std::size_t at = html.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const std::size_t begin = html.rfind("<section", at);
  const std::size_t end = html.find("</section>", at);
  return html.substr(begin, end + 10 - begin);
}

json full_document() {
  return json::parse(R"({
    "title": "Run & <compare>",
    "machine": {"cpu": "Xeon <fake>", "cores": 2, "numa_nodes": [0, 1]},
    "workload": {"tables": 26, "dist": "zipf:1.05"},
    "modes": [
      {"mode": "cpu", "forward_lookups_per_s": 1.5e8, "train_lookups_per_s": 6.0e7, "samples_per_s": 2.0e6,
       "step_ms_p50": 4.1, "step_ms_p99": 5.9, "hit_rate": 1.0, "peak_host_bytes": 3.2e9,
       "bytes_per_step": {"host_read": 3.4e8, "host_write": 1.2e8},
       "modelled": {"profile": "h200-pcie5", "step_ms": 2.9, "bottleneck": "host_dram",
                    "explanation": "host DRAM-bound: 460 MB per step at 150 GB/s"}},
      {"mode": "cached<'x'>", "forward_lookups_per_s": 4.0e8, "train_lookups_per_s": 2.1e8,
       "step_ms_p50": 1.2, "step_ms_p99": 1.9, "hit_rate": 0.83,
       "bytes_per_step": {"hbm_read": 2.0e9, "hbm_write": 1.0e9, "h2d": 3.1e8, "d2h": 1.0e8},
       "modelled": {"profile": "h200-pcie5", "step_ms": 1.1, "bottleneck": "pcie_h2d",
                    "explanation": "PCIe H2D-bound: 310 MB per step at 55 GB/s <5.6 ms>"}}
    ],
    "sweep": [
      {"mode": "cached", "policy": "lru", "cache_fraction": 0.1, "hit_rate": 0.55},
      {"mode": "cached", "policy": "lru", "cache_fraction": 0.01, "hit_rate": 0.31},
      {"mode": "cached", "policy": "lru", "cache_fraction": 0.5, "hit_rate": 0.9},
      {"mode": "cached", "policy": "belady", "cache_fraction": 0.1, "hit_rate": 0.62},
      {"mode": "cached", "policy": "belady", "cache_fraction": 0.5, "hit_rate": 0.94}
    ]
  })");
}

TEST(HtmlReport, OneChartPerSectionAndWellFormed) {
  const std::string html = render_html_report(full_document());
  EXPECT_EQ(check_well_formed(html), "");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  const std::vector<std::string> charts = {"throughput", "bytes", "step-time", "modelled-step", "memory", "hit-rate"};
  EXPECT_EQ(count(html, "<section class=\"chart\""), charts.size());
  EXPECT_EQ(count(html, "<svg"), charts.size());
  EXPECT_EQ(count(html, "</svg>"), charts.size());
  EXPECT_EQ(count(html, "<section"), count(html, "</section>"));
  for (const auto& id : charts) {
    const std::string s = section(html, id);
    ASSERT_FALSE(s.empty()) << id;
    EXPECT_EQ(s.rfind("<section class=\"chart\" id=\"" + id + "\">", 0), 0u) << id;
    EXPECT_EQ(count(s, "<svg"), 1u) << id;
    EXPECT_EQ(count(s, "</svg>"), 1u) << id;
  }
  EXPECT_FALSE(section(html, "summary").empty());
  EXPECT_FALSE(section(html, "machine").empty());
  EXPECT_FALSE(section(html, "workload").empty());
  // Self-contained: no scripts, no external resources.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(count(html, "http"), count(html, "http://www.w3.org/2000/svg"));
}

TEST(HtmlReport, ChartsHoldTheirData) {
  const std::string html = render_html_report(full_document());
  const std::string bytes = section(html, "bytes");
  EXPECT_NE(bytes.find("PCIe H2D"), std::string::npos);
  EXPECT_NE(bytes.find("310 MB"), std::string::npos);  // a bar's tooltip
  EXPECT_EQ(bytes.find("all-to-all"), std::string::npos) << "a link no mode reports is left out";
  const std::string hit = section(html, "hit-rate");
  EXPECT_EQ(count(hit, "<polyline"), 2u);  // lru and belady
  EXPECT_EQ(count(hit, "<circle"), 5u);
  EXPECT_NE(hit.find("cached / lru"), std::string::npos);
  const std::string modelled = section(html, "modelled-step");
  EXPECT_NE(modelled.find("h200-pcie5"), std::string::npos);
  EXPECT_NE(modelled.find("PCIe H2D-bound: 310 MB per step at 55 GB/s &lt;5.6 ms&gt;"), std::string::npos);
  EXPECT_NE(modelled.find("1.1 ms"), std::string::npos);  // cached's modelled bar
  const std::string step = section(html, "step-time");
  EXPECT_NE(step.find("5.9 ms"), std::string::npos);  // cpu's p99 bar
  EXPECT_EQ(step.find("modelled"), std::string::npos) << "modelled times have a chart (and axis) of their own";
  const std::string summary = section(html, "summary");
  EXPECT_NE(summary.find("150 M"), std::string::npos);  // forward lookups/s of cpu
  EXPECT_NE(summary.find("83%"), std::string::npos);    // hit rate of cached
  EXPECT_NE(summary.find("pcie_h2d"), std::string::npos);
}

TEST(HtmlReport, EscapesStrings) {
  const std::string html = render_html_report(full_document());
  EXPECT_EQ(html.find("cached<'x'>"), std::string::npos);
  EXPECT_NE(html.find("cached&lt;&#39;x&#39;&gt;"), std::string::npos);
  EXPECT_EQ(html.find("Xeon <fake>"), std::string::npos);
  EXPECT_NE(html.find("Xeon &lt;fake&gt;"), std::string::npos);
  EXPECT_NE(html.find("<title>Run &amp; &lt;compare&gt;</title>"), std::string::npos);
  EXPECT_EQ(html_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");

  json doc = full_document();
  doc["modes"][0]["mode"] = "</section><svg><script>alert(1)</script>";
  const std::string evil = render_html_report(doc);
  EXPECT_EQ(check_well_formed(evil), "");
  EXPECT_EQ(evil.find("<script"), std::string::npos);
  EXPECT_EQ(count(evil, "<svg"), 6u);
}

TEST(HtmlReport, NoSweepNoHitRateSection) {
  json doc = full_document();
  doc.erase("sweep");
  const std::string html = render_html_report(doc);
  EXPECT_EQ(check_well_formed(html), "");
  EXPECT_EQ(html.find("id=\"hit-rate\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"sweep-throughput\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"sweep-table\""), std::string::npos);
  EXPECT_EQ(count(html, "<section class=\"chart\""), 5u);
  EXPECT_EQ(count(html, "<svg"), 5u);

  doc["sweep"] = json::array();  // present but empty
  EXPECT_EQ(render_html_report(doc).find("id=\"hit-rate\""), std::string::npos);
  doc["sweep"] = json::array({json{{"mode", "cached"}, {"hit_rate", 0.5}}});  // no cache_fraction
  EXPECT_EQ(render_html_report(doc).find("id=\"hit-rate\""), std::string::npos);
}

TEST(HtmlReport, MissingFieldsDropChartsWithoutCrashing) {
  // Nothing at all.
  for (const json& doc : {json::object(), json(nullptr), json::array(), json("text"), json(3)}) {
    const std::string html = render_html_report(doc);
    EXPECT_EQ(check_well_formed(html), "") << doc.dump();
    EXPECT_EQ(count(html, "<svg"), 0u) << doc.dump();
    EXPECT_NE(html.find("<title>Strata benchmark report</title>"), std::string::npos);
  }
  // Modes with only names: a summary table and no charts.
  json names = json::parse(R"({"modes": [{"mode": "cpu"}, {"mode": "gpu"}, {"no_mode": 1}, 7]})");
  std::string html = render_html_report(names);
  EXPECT_EQ(check_well_formed(html), "");
  EXPECT_EQ(count(html, "<svg"), 0u);
  EXPECT_NE(section(html, "summary").find("gpu"), std::string::npos);

  // Wrong types and non-finite numbers count as missing.
  json wrong = json::parse(R"({"modes": [{"mode": "cpu", "train_lookups_per_s": "fast",
                                           "bytes_per_step": [1, 2], "modelled": "yes", "hit_rate": null}],
                               "machine": "not an object", "sweep": {"not": "an array"}})");
  wrong["modes"][0]["forward_lookups_per_s"] = std::numeric_limits<double>::infinity();
  wrong["modes"][0]["step_ms_p50"] = std::nan("");
  html = render_html_report(wrong);
  EXPECT_EQ(check_well_formed(html), "");
  EXPECT_EQ(count(html, "<svg"), 0u);

  // One chart's data only.
  json one = json::parse(R"({"modes": [{"mode": "cpu", "step_ms_p50": 3.0}]})");
  html = render_html_report(one);
  EXPECT_EQ(check_well_formed(html), "");
  EXPECT_EQ(count(html, "<section class=\"chart\""), 1u);
  EXPECT_FALSE(section(html, "step-time").empty());
  EXPECT_EQ(count(html, "<svg"), 1u);

  // A zero everywhere still draws (no division by zero in the axis).
  json zeros = json::parse(R"({"modes": [{"mode": "cpu", "train_lookups_per_s": 0}]})");
  html = render_html_report(zeros);
  for (const char* bad : {"\"nan", "\"-nan", "\"inf", ">nan", ">inf"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  EXPECT_EQ(count(html, "<svg"), 1u);
}

TEST(HtmlReport, MemoryChartPerMode) {
  json doc = full_document();
  doc["modes"][0]["host_table_bytes"] = 1.0e9;
  doc["modes"][1]["peak_host_bytes"] = 2.5e9;
  doc["modes"][1]["peak_device_bytes"] = 7.0e8;
  const std::string mem = section(render_html_report(doc), "memory");
  ASSERT_FALSE(mem.empty());
  EXPECT_EQ(count(mem, "<svg"), 1u);
  EXPECT_NE(mem.find("peak host (process RSS)"), std::string::npos);
  EXPECT_NE(mem.find("cpu / host tables: 1 GB"), std::string::npos);
  EXPECT_NE(mem.find("peak device: 700 MB"), std::string::npos);
  EXPECT_EQ(count(mem, "<rect x="), 3u /* legend */ + 4u /* bars */);
  // No memory numbers: no section.
  for (auto& m : doc["modes"]) {
    m.erase("peak_host_bytes");
    m.erase("host_table_bytes");
    m.erase("peak_device_bytes");
  }
  EXPECT_TRUE(section(render_html_report(doc), "memory").empty());
}

TEST(HtmlReport, SweepThroughputChartAndTable) {
  json doc = full_document();
  doc["sweep"] = json::parse(R"([
    {"mode": "cached", "policy": "lru", "cache_fraction": 0.2, "hit_rate": 0.7, "forward_lookups_per_s": 5e6,
     "train_lookups_per_s": 3e6, "cache_bytes": 1e8},
    {"mode": "cached", "policy": "lru", "cache_fraction": 0.05, "hit_rate": 0.4, "forward_lookups_per_s": 4e6,
     "train_lookups_per_s": 2e6, "cache_bytes": 2.5e7},
    {"mode": "cached", "policy": "lru", "cache_fraction": 0.01, "skipped": "cache <too> small"}
  ])");
  const std::string html = render_html_report(doc);
  EXPECT_EQ(check_well_formed(html), "");
  const std::string hit = section(html, "hit-rate");
  EXPECT_EQ(count(hit, "<circle"), 2u) << "the skipped point has no hit rate";
  // Points up to 20%: the x axis ends at 20%, not 100%.
  EXPECT_NE(hit.find(">20%</text>"), std::string::npos);
  EXPECT_EQ(count(hit, ">100%</text>"), 1u) << "only the hit-rate axis reaches 100%";
  const std::string tput = section(html, "sweep-throughput");
  ASSERT_FALSE(tput.empty());
  EXPECT_EQ(count(tput, "<svg"), 1u);
  EXPECT_EQ(count(tput, "<polyline"), 2u);  // forward and training
  EXPECT_NE(tput.find("forward lookups/s: cache 5%, lookups/s 4 M"), std::string::npos);
  const std::string table = section(html, "sweep-table");
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(count(table, "<svg"), 0u);
  EXPECT_EQ(count(table, "<tr>"), 4u);
  EXPECT_NE(table.find("skipped: cache &lt;too&gt; small"), std::string::npos);
  EXPECT_NE(table.find("100 MB"), std::string::npos);
  EXPECT_EQ(count(html, "<section class=\"chart\""), 7u);  // the modelled step time has its own chart
  EXPECT_EQ(count(html, "<svg"), 7u);
}

TEST(HtmlReport, TableList) {
  json doc = full_document();
  doc["tables"] = json::parse(R"([{"name": "C1", "rows": 1000, "dim": 64}, {"name": "C<2>", "rows": 10, "dim": 16},
                                  {"name": "bad", "rows": "many"}])");
  const std::string html = render_html_report(doc);
  EXPECT_EQ(check_well_formed(html), "");
  const std::string tables = section(html, "tables");
  ASSERT_FALSE(tables.empty());
  EXPECT_NE(tables.find("<details><summary>2 tables, 1.01 k rows, 257 KB of fp32 weights</summary>"),
            std::string::npos);
  EXPECT_NE(tables.find("C&lt;2&gt;"), std::string::npos);
  EXPECT_EQ(tables.find("bad"), std::string::npos);
  EXPECT_EQ(count(tables, "<svg"), 0u);
  doc.erase("tables");
  EXPECT_TRUE(section(render_html_report(doc), "tables").empty());
}

TEST(HtmlReport, TitleOption) {
  HtmlReportOptions o;
  o.title = "Mine";
  EXPECT_NE(render_html_report(full_document(), o).find("<title>Mine</title>"), std::string::npos);
}

TEST(HtmlReport, WritesFile) {
  const std::string path = ::testing::TempDir() + "/strata_report_" + std::to_string(::getpid()) + ".html";
  ASSERT_TRUE(write_html_report(path, full_document()).is_ok());
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, render_html_report(full_document()));
  EXPECT_EQ(write_html_report("/nonexistent-dir/r.html", full_document()).code(), StatusCode::kIoError);
}

// Measured device times from the emulator are flagged at the top, before any number.
TEST(HtmlReport, EmulatedDeviceTimesAreFlaggedAtTheTop) {
  json doc = full_document();
  std::string html = render_html_report(doc);
  EXPECT_EQ(html.find("id=\"emulated\""), std::string::npos) << "no mode says it ran on emu";
  doc["modes"][1]["device"] = "cuda NVIDIA H100";
  EXPECT_EQ(render_html_report(doc).find("id=\"emulated\""), std::string::npos);
  for (const char* field : {"device", "trainer_device"}) {
    json d = full_document();
    d["modes"][0][field] = "emu";
    html = render_html_report(d);
    EXPECT_EQ(check_well_formed(html), "") << field;
    const std::size_t warn = html.find("<p class=\"warn\" id=\"emulated\">");
    ASSERT_NE(warn, std::string::npos) << field;
    EXPECT_LT(warn, html.find("</header>")) << field;
    EXPECT_LT(warn, html.find("<section")) << field;
    EXPECT_NE(html.find("emulated device"), std::string::npos);
  }
}

// A percentile is shown only when the run gave one; the slowest step is named as such.
TEST(HtmlReport, StepTailIsAPercentileOnlyWhenGivenElseTheMaximum) {
  json doc = full_document();
  for (auto& m : doc["modes"]) {
    m.erase("step_ms_p99");
    m["step_ms_max"] = 7.25;
  }
  const std::string html = render_html_report(doc);
  EXPECT_EQ(check_well_formed(html), "");
  const std::string summary = section(html, "summary");
  EXPECT_EQ(summary.find("p99"), std::string::npos);
  EXPECT_NE(summary.find("step max"), std::string::npos);
  EXPECT_NE(summary.find("7.25 ms"), std::string::npos);
  const std::string step = section(html, "step-time");
  EXPECT_EQ(step.find("p99"), std::string::npos);
  EXPECT_NE(step.find("measured max"), std::string::npos);
  EXPECT_NE(step.find("too few timed steps"), std::string::npos);

  doc["modes"][0]["step_ms_p99"] = 6.5;  // a run with enough steps gives both
  const std::string both = section(render_html_report(doc), "step-time");
  EXPECT_NE(both.find("measured p99"), std::string::npos);
  EXPECT_NE(both.find("measured max"), std::string::npos);
  EXPECT_EQ(both.find("too few timed steps"), std::string::npos);
}

// A sweep point whose cache holds every row the run touched is marked, and the chart says why its
// hit rate cannot rise with the cache size.
TEST(HtmlReport, SweepPointsThatHoldEveryTouchedRowAreMarked) {
  json doc = full_document();
  std::string html = render_html_report(doc);
  EXPECT_EQ(section(html, "hit-rate").find("first uses only"), std::string::npos);
  doc["sweep_touched_rows"] = 12345;
  doc["sweep"][2]["holds_every_touched_row"] = true;  // lru at 50%
  doc["sweep"][4]["holds_every_touched_row"] = true;  // belady at 50%
  doc["sweep"][0]["holds_every_touched_row"] = false;
  html = render_html_report(doc);
  EXPECT_EQ(check_well_formed(html), "");
  const std::string hit = section(html, "hit-rate");
  EXPECT_NE(hit.find("From 50% on"), std::string::npos);
  EXPECT_NE(hit.find("12345 distinct rows"), std::string::npos);
  EXPECT_NE(hit.find("first uses only"), std::string::npos);
  const std::string table = section(html, "sweep-table");
  EXPECT_EQ(count(table, "50% *"), 2u);
  EXPECT_EQ(count(table, " *<"), 2u);
}

}  // namespace
}  // namespace strata::bench
