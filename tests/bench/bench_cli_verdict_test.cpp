// strata-bench's verdict (bench/bench_verdict.hpp) on workloads whose answer is known: tables that
// fit HBM easily on a GPU profile get a GPU-resident mode; tables far beyond a profile's HBM, or an
// --hbm-budget that excludes them, never get `gpu`, and the modes that do not fit are marked in the
// console, the JSON and the HTML. Also the workload table of a Criteo file (no nulls, the mean bag
// rounded, samples per step explained) and a Criteo file too short for the steps.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "tests/bench/run_program.hpp"

namespace {

using nlohmann::json;
using strata::testing::read_file;
using strata::testing::run_bench;
using strata::testing::RunOutput;

std::string temp_dir() {
  static const std::string dir = strata::testing::scratch_dir("strata_bench_verdict");
  return dir;
}

// Two 20,000-row dim-64 tables (10 MB of weights), big batches: PCIe-bound unless the rows are in
// HBM, so on h200-pcie5 `gpu` models clearly fastest (about 0.011 ms against cached's 0.015 and
// cpu's 0.045, trainer on the device).
const std::string kFitsHbm =
    " --tables a=20000x64,b=20000x64 --batch 2048 --pooling 4 --dist zipf:1.05 --steps 2 --warmup 1 --threads 1 "
    "--read-probe-mib 1 --no-gather-probe --backend emu --modes cpu,offload,cached,gpu --cache-fraction 0.5 ";

struct BenchOutput {
  RunOutput out;
  json doc;
  std::string html;
};

BenchOutput run(const std::string& args, const std::string& name) {
  BenchOutput r;
  const std::string base = temp_dir() + "/" + name;
  r.out = run_bench(args + " --json " + base + ".json --html " + base + ".html");
  EXPECT_EQ(r.out.exit_code, 0) << args << "\n" << r.out.output;
  if (r.out.exit_code == 0) {
    r.doc = json::parse(read_file(base + ".json"));
    r.html = read_file(base + ".html");
  }
  return r;
}

const json& result(const json& doc, const std::string& mode) {
  for (const json& m : doc["results"])
    if (m["mode"] == mode) return m;
  static const json none = json::object();
  ADD_FAILURE() << "no mode " << mode;
  return none;
}

// The HTML section with `id` ("" when absent).
std::string section(const std::string& html, const std::string& id) {
  const std::size_t b = html.find("id=\"" + id + "\"");
  if (b == std::string::npos) return "";
  return html.substr(b, html.find("</section>", b) - b);
}

TEST(BenchVerdict, TablesThatFitHbmEasilyGetTheGpuModeByTheModelOnEmu) {
  const BenchOutput r = run(kFitsHbm, "fits");
  ASSERT_FALSE(r.doc.empty());
  const json& v = r.doc["verdict"];
  EXPECT_EQ(v["mode"], "gpu") << v.dump(2);
  EXPECT_EQ(v["decided_by"], "modelled");  // emu: the model decides
  EXPECT_EQ(v["device_kind"], "emu");
  EXPECT_EQ(v["profile"], "h200-pcie5");
  EXPECT_DOUBLE_EQ(v["hbm_budget_bytes"].get<double>(), 141e9);  // the profile's
  EXPECT_EQ(v["hbm_budget_from"], "profile");
  EXPECT_TRUE(v["not_fitting"].empty());
  EXPECT_DOUBLE_EQ(v["modelled_step_ms"].get<double>(), result(r.doc, "gpu")["modelled"]["step_ms"].get<double>());
  for (const json& m : r.doc["results"]) {
    SCOPED_TRACE(m["mode"].get<std::string>());
    ASSERT_TRUE(m.contains("memory_fit"));
    EXPECT_TRUE(m["memory_fit"]["fits"].get<bool>());
    EXPECT_LT(v["step_ms"].get<double>(), m["modelled"]["step_ms"].get<double>() + 1e-12);
  }
  // gpu holds every record in HBM: at least the 40,000 x 64 floats.
  EXPECT_GE(result(r.doc, "gpu")["memory_fit"]["hbm_bytes"].get<double>(), 40000.0 * 64 * 4);
  EXPECT_EQ(result(r.doc, "cpu")["memory_fit"]["hbm_bytes"].get<double>(), 0.0);
  // The verdict comes first on the console, before the rates table, and says what is measured.
  const std::string& out = r.out.output;
  const std::size_t verdict = out.find("\nverdict: use gpu on h200-pcie5: the fastest modelled step");
  ASSERT_NE(verdict, std::string::npos) << out;
  EXPECT_LT(verdict, out.find("fwd lookups/s")) << out;
  EXPECT_NE(out.find("step times, which are this CPU running the GPU kernels' logic and rank CPU work only"),
            std::string::npos);
  EXPECT_NE(out.find("modelled on h200-pcie5: each step time from the measured bytes per link"), std::string::npos);
  // The HTML: the verdict section first (before the machine), the chosen row marked.
  ASSERT_NE(r.html.find("id=\"verdict\""), std::string::npos);
  EXPECT_LT(r.html.find("id=\"verdict\""), r.html.find("id=\"machine\""));
  EXPECT_NE(section(r.html, "verdict").find("use gpu on h200-pcie5"), std::string::npos);
  EXPECT_NE(section(r.html, "summary").find("<tr class=\"chosen\"><td>gpu &#10003;</td>"), std::string::npos)
      << section(r.html, "summary");
}

TEST(BenchVerdict, TablesFarBeyondTheProfilesHbmNeverGetGpu) {
  // h200-pcie5 with 4 MB of HBM: the 10 MB of weights cannot be resident.
  json profile = json::parse(read_file(std::string(STRATA_SOURCE_DIR) + "/bench/profiles/h200-pcie5.json"));
  profile["name"] = "tiny-hbm";
  profile["hbm_capacity_gb"]["value"] = 0.004;
  const std::string path = temp_dir() + "/tiny-hbm.json";
  std::ofstream(path) << profile.dump(2);
  const BenchOutput r = run(kFitsHbm + "--profile " + path, "tiny");
  ASSERT_FALSE(r.doc.empty());
  const json& v = r.doc["verdict"];
  ASSERT_TRUE(v["mode"].is_string()) << v.dump(2);
  EXPECT_NE(v["mode"], "gpu");
  EXPECT_TRUE(result(r.doc, v["mode"].get<std::string>())["memory_fit"]["fits"].get<bool>());
  EXPECT_LE(v["hbm_bytes"].get<double>(), 4e6);
  const json& gpu = result(r.doc, "gpu")["memory_fit"];
  EXPECT_FALSE(gpu["fits"].get<bool>());
  EXPECT_FALSE(gpu["fits_hbm"].get<bool>());
  EXPECT_TRUE(gpu["fits_host"].get<bool>());
  EXPECT_EQ(gpu["why"].get<std::string>().rfind("HBM ", 0), 0u) << gpu["why"];
  EXPECT_NE(gpu["why"].get<std::string>().find(" > 4.0 MB"), std::string::npos) << gpu["why"];
  EXPECT_NE(r.out.output.find("does not fit (never chosen): "), std::string::npos) << r.out.output;
}

TEST(BenchVerdict, AnHbmBudgetThatExcludesGpuIsMarkedEverywhere) {
  const BenchOutput r = run(kFitsHbm + "--hbm-budget 2MB", "budget");
  ASSERT_FALSE(r.doc.empty());
  const json& v = r.doc["verdict"];
  EXPECT_NE(v["mode"], "gpu");
  EXPECT_DOUBLE_EQ(v["hbm_budget_bytes"].get<double>(), 2e6);
  EXPECT_EQ(v["hbm_budget_from"], "--hbm-budget");
  EXPECT_EQ(r.doc["settings"]["hbm_budget"], "2MB");
  bool gpu_listed = false;
  for (const json& n : v["not_fitting"]) gpu_listed = gpu_listed || n["mode"] == "gpu";
  EXPECT_TRUE(gpu_listed) << v["not_fitting"].dump();
  // The console marks it in the memory table and beside its modelled step.
  const std::string& out = r.out.output;
  EXPECT_NE(out.find("DOES NOT FIT: HBM "), std::string::npos) << out;
  EXPECT_NE(out.find("[does not fit: HBM "), std::string::npos) << out;
  EXPECT_NE(out.find("against 2.0 MB HBM (--hbm-budget)"), std::string::npos) << out;
  // The HTML greys its row and says why.
  const std::string summary = section(r.html, "summary");
  const std::size_t row = summary.find("<tr class=\"nofit\"><td>gpu</td>");
  ASSERT_NE(row, std::string::npos) << summary;
  EXPECT_NE(summary.find("no: HBM ", row), std::string::npos);
}

TEST(BenchVerdict, NothingFitsATinyHostBudgetAndTheVerdictSaysSo) {
  const BenchOutput r = run(kFitsHbm + "--host-budget 1KB --modes cpu,offload", "nothing");
  ASSERT_FALSE(r.doc.empty());
  const json& v = r.doc["verdict"];
  EXPECT_TRUE(v["mode"].is_null()) << v.dump(2);
  EXPECT_EQ(v["not_fitting"].size(), 2u);
  EXPECT_NE(r.out.output.find("verdict: no placement that ran fits the memory on h200-pcie5"), std::string::npos)
      << r.out.output;
  EXPECT_NE(r.html.find("<section class=\"verdict none\" id=\"verdict\">"), std::string::npos);
}

TEST(BenchVerdict, BadBudgetsAreRefusedNamingTheFlag) {
  for (const char* flag : {"--hbm-budget", "--host-budget"}) {
    const RunOutput r = run_bench(kFitsHbm + flag + " 8XB");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(std::string("strata-bench: ") + flag + " '8XB': expected a size like 80GB"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output;
  }
}

// ---- a Criteo file: the workload table and a file too short for the steps ----

// 1,200 lines; column C(t+1) holds value 16 * line + t, C3 empty on every third line.
std::string criteo_file() {
  const std::string path = temp_dir() + "/day.tsv";
  std::ofstream out(path);
  for (int line = 0; line < 1200; ++line) {
    out << line % 2;
    for (int i = 0; i < 13; ++i) out << "\t" << i;
    for (int t = 0; t < 26; ++t) {
      out << "\t";
      if (!(t == 2 && line % 3 == 0)) out << std::hex << 16 * line + t << std::dec;
    }
    out << "\n";
  }
  return path;
}

const std::string kCriteo =
    " --dim 8 --tables criteo:50000 --threads 1 --read-probe-mib 1 --no-gather-probe "
    "--backend emu --modes cpu,gpu --criteo ";

TEST(BenchVerdict, ACriteoFilesWorkloadTableSaysWhatEachFieldIs) {
  const std::string tsv = criteo_file();
  const BenchOutput r = run(kCriteo + tsv + " --batch 512 --warmup 1 --steps 2", "criteo");
  ASSERT_FALSE(r.doc.empty());
  // The JSON keeps its nulls (consumers read them); it adds the note and the counts.
  const json& w = r.doc["workload"];
  EXPECT_TRUE(w["dist"].is_null());
  EXPECT_EQ(w["source"]["samples"], 1200);
  EXPECT_EQ(w["source"]["min_batch_size"], 176);  // 1200 = 2 x 512 + 176
  ASSERT_TRUE(w["samples_per_step_note"].is_string());
  const std::string table = section(r.html, "workload");
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(table.find("null"), std::string::npos) << table;
  EXPECT_NE(table.find("from the Criteo file (its keys, not generated)"), std::string::npos) << table;
  EXPECT_NE(table.find("none: the keys are the Criteo file&#39;s"), std::string::npos) << table;
  // 1,200 lines, C3 empty on 400 of them: (1200 x 26 - 400) / (1200 x 26) keys per bag.
  EXPECT_NE(table.find("0.99 keys per bag (the mean of the file&#39;s lines)"), std::string::npos) << table;
  EXPECT_NE(table.find("512 lines per batch (--batch)"), std::string::npos) << table;
  EXPECT_NE(table.find("the file&#39;s 1200 lines make 3 batches of --batch 512, the last holding the 176 left over"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("criteo " + tsv + ": 3 batches read (1200 samples)"), std::string::npos) << table;
}

TEST(BenchVerdict, ACriteoFileTooShortForTheDefaultStepsFitsThemWithANote) {
  const std::string tsv = criteo_file();
  // The default --warmup 3 --steps 20 at --batch 512: 3 batches, so 1 warm-up and 2 timed steps.
  const BenchOutput r = run(kCriteo + tsv + " --batch 512", "fitted");
  ASSERT_FALSE(r.doc.empty());
  EXPECT_NE(r.out.output.find("strata-bench: note: criteo " + tsv +
                              " has 3 batches, fewer than --warmup 3 + --steps 20 need: running --warmup 1 --steps 2, "
                              "fitted to the file (for --warmup 3 --steps 20 give a smaller --batch, e.g. --batch 52)"),
            std::string::npos)
      << r.out.output;
  EXPECT_EQ(r.doc["workload"]["steps"], 2);
  EXPECT_EQ(r.doc["workload"]["warmup"], 1);
  EXPECT_TRUE(r.doc["workload"]["steps_note"].is_string());
  EXPECT_EQ(result(r.doc, "cpu")["timed_steps"], 2);
}

TEST(BenchVerdict, ACriteoFileTooShortForGivenStepsNamesTheFlagsToLower) {
  const std::string tsv = criteo_file();
  const RunOutput r = run_bench(kCriteo + tsv + " --batch 512 --warmup 1 --steps 5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("criteo " + tsv + " has 3 batches but --warmup 1 + --steps 5 need at least 6"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cycled): lower --steps to at most 2, or give a smaller --batch: --batch 200 splits its "
                          "1200 lines into at least 6 batches"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output;
}

}  // namespace
