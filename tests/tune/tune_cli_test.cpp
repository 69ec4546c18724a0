// Runs the built strata-tune as a user would: bad input gives one clear line on stderr and a
// non-zero exit before the long work; calibrate's output parses and validates; plan writes a
// store config and a report.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/model/cost_model.hpp"
#include "store/store.hpp"
#include "store/store_config.hpp"
#include "tests/bench/run_program.hpp"
#include "toolkit/trace.hpp"
#include "toolkit/workload.hpp"

namespace strata {
namespace {

using testing::read_file;
using testing::run_program;

const std::string kBin = STRATA_TUNE_BIN;
const std::string kWorkload =
    "'{\"tables\":\"a=20000x16,b=3000x16,c=500x8\",\"batch\":64,\"bag_size\":4,\"dist\":\"zipf:1.05\","
    "\"distinct_batches\":4}'";

std::string temp_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tune_cli_XXXXXX";
    return std::string(::mkdtemp(tmpl));
  }();
  return dir;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// One line "strata-tune: ..." containing `needle`, exit code 2.
void expect_one_line_error(const std::string& args, const std::string& needle) {
  const auto r = run_program(kBin + " " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("strata-tune: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "expected one line:\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

// Runs `plan ARGS --host-budget 1GB --out <temp>/NAME` and parses the store config it writes.
StoreConfig written_plan(const std::string& args, const std::string& name) {
  const std::string path = temp_dir() + "/" + name;
  const auto r = run_program(kBin + " plan " + args + " --host-budget 1GB --out " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto config = parse_store_config(read_file(path));
  EXPECT_TRUE(config.is_ok()) << config.status().to_string();
  return config.is_ok() ? *config : StoreConfig{};
}

// A small valid trace at `path`.
void write_trace(const std::string& path, int batches) {
  std::vector<bench::TraceTable> tables{{"a", 1000}, {"b", 50}};
  std::vector<KeyBatch> bs;
  for (int i = 0; i < batches; ++i) {
    KeyBatch b;
    b.features.push_back({"a", {0, 2, 3}, {i % 1000, (7 * i) % 1000, 5}, {}});
    b.features.push_back({"b", {0, 1, 2}, {i % 50, 3}, {}});
    bs.push_back(std::move(b));
  }
  ASSERT_TRUE(bench::write_trace(path, tables, bs).is_ok());
}

TEST(TuneCli, PlanWritesAStoreConfigAndAReport) {
  const std::string plan = temp_dir() + "/plan.json", html = temp_dir() + "/report.html";
  const auto r = run_program(kBin + " plan --workload " + kWorkload + " --hbm-budget 1MB --host-budget 1GB --out " +
                             plan + " --html " + html);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("why: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("uniform modes:"), std::string::npos) << r.output;
  auto config = parse_store_config(read_file(plan));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->tables.size(), 3u);
  EXPECT_NE(read_file(html).find("<svg"), std::string::npos);
  // Deterministic: the same run gives the same files.
  const std::string before = read_file(plan) + read_file(html);
  ASSERT_EQ(run_program(kBin + " plan --workload " + kWorkload + " --hbm-budget 1MB --host-budget 1GB --out " + plan +
                        " --html " + html)
                .exit_code,
            0);
  EXPECT_EQ(read_file(plan) + read_file(html), before);
}

// plan --dtype auto: bf16 for the table that fits in HBM only at half size (b: 30000 x 32, 4.1 MB
// as gpu at fp32, 2.18 MB at bf16, in a 3 MB budget), fp32 for the others, its why saying so; the
// config opens in a store. --dtype bf16 makes every table bf16; a bad value is refused naming it.
TEST(TuneCli, PlanDtypeAutoTakesBf16ForATableThatFitsOnlyAtHalfSize) {
  const std::string w =
      "--workload '{\"tables\":\"a=100000x32,b=30000x32,c=2000x16\",\"batch\":128,\"bag_size\":4,"
      "\"dist\":\"zipf:1.05\",\"distinct_batches\":8}' --hbm-budget 3MB --host-budget 1GB --threads 1";
  const std::string plan = temp_dir() + "/auto_plan.json", report = temp_dir() + "/auto_report.json",
                    html = temp_dir() + "/auto_report.html";
  const auto fp32 = run_program(kBin + " plan " + w + " --out " + plan);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_EQ(read_file(plan).find("bf16"), std::string::npos) << "the default keeps fp32";
  const auto r =
      run_program(kBin + " plan " + w + " --dtype auto --out " + plan + " --json " + report + " --html " + html);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto config = parse_store_config(read_file(plan));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  ASSERT_EQ(config->tables.size(), 3u);
  EXPECT_EQ(config->tables[0].spec.dtype, DType::kF32);
  EXPECT_EQ(config->tables[1].spec.dtype, DType::kBF16);
  EXPECT_EQ(config->tables[1].placement, Placement::kGpu);
  EXPECT_EQ(config->tables[2].spec.dtype, DType::kF32);
  EXPECT_NE(r.output.find("bf16 (--dtype auto): at fp32 the plan makes it cpu; as gpu it needs 4.1"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("fp32 (--dtype auto): at bf16 it would be cpu"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read_file(report));
  EXPECT_EQ(j["tables"][1]["dtype"], "bf16");
  EXPECT_NE(read_file(html).find("<th>dtype</th>"), std::string::npos);
  EXPECT_NE(r.output.find(" dim dtype placement "), std::string::npos) << r.output;
  EXPECT_TRUE(Store::open(*config).is_ok());
  const auto every = run_program(kBin + " plan " + w + " --dtype bf16 --out " + plan);
  ASSERT_EQ(every.exit_code, 0) << every.output;
  auto all = parse_store_config(read_file(plan));
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  for (const TableConfig& t : all->tables) EXPECT_EQ(t.spec.dtype, DType::kBF16) << t.spec.name;
  expect_one_line_error("plan " + w + " --dtype fp64",
                        "--dtype: 'fp64' is not a dtype (expected auto, fp32, bf16 or fp16)");
  expect_one_line_error("plan " + w + " --dtype ''", "--dtype: '' is not a dtype");
}

TEST(TuneCli, PlanReadsATrace) {
  const std::string trace = temp_dir() + "/ok.strtrace";
  write_trace(trace, 20);
  const auto r = run_program(kBin + " plan --trace " + trace + " --dim 8 --hbm-budget 10KB --host-budget 1GB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trace " + trace + ", 20 steps"), std::string::npos) << r.output;
}

TEST(TuneCli, BudgetTooSmallSaysTheSmallestFeasible) {
  expect_one_line_error("plan --workload " + kWorkload + " --hbm-budget 1KB --host-budget 1KB",
                        "smallest feasible: --host-budget ");
}

TEST(TuneCli, BadTraces) {
  const std::string empty = temp_dir() + "/empty.strtrace";
  write_trace(empty, 0);
  expect_one_line_error("plan --trace " + empty, "has no keys");

  const std::string good = temp_dir() + "/good.strtrace";
  write_trace(good, 10);
  const std::string text = read_file(good);
  const std::string truncated = temp_dir() + "/truncated.strtrace";
  write(truncated, text.substr(0, text.size() - 7));
  expect_one_line_error("plan --trace " + truncated, truncated);

  std::string flipped = text;
  flipped[flipped.size() / 2] ^= 0x40;
  const std::string corrupt = temp_dir() + "/corrupt.strtrace";
  write(corrupt, flipped);
  expect_one_line_error("plan --trace " + corrupt, corrupt);

  const std::string junk = temp_dir() + "/junk.strtrace";
  write(junk, "not a trace at all");
  expect_one_line_error("plan --trace " + junk, junk);
  expect_one_line_error("plan --trace " + temp_dir() + "/missing.strtrace", "missing.strtrace");
}

TEST(TuneCli, BadProfiles) {
  const std::string base = read_file(std::string(STRATA_SOURCE_DIR) + "/bench/profiles/h200-pcie5.json");
  ASSERT_FALSE(base.empty());
  const std::string missing = temp_dir() + "/missing_field.json";
  std::string m = base;
  m.replace(m.find("\"hbm_gbs\""), 9, "\"hbm_gbz\"");
  write(missing, m);
  expect_one_line_error("plan --workload " + kWorkload + " --profile " + missing, "unknown field 'hbm_gbz'");

  const std::string text_value = temp_dir() + "/text_value.json";
  std::string t = base;
  t.replace(t.find("\"value\": 4300"), 13, "\"value\": \"fast\"");
  write(text_value, t);
  expect_one_line_error("plan --workload " + kWorkload + " --profile " + text_value,
                        "hbm_gbs.value must be a number (got string \"fast\")");
  expect_one_line_error("plan --workload " + kWorkload + " --profile no-such-profile", "no-such-profile");
}

// Issue 34: the plan's numa auto puts each rank's host tier on its GPU's node, and the report says
// which node's figures priced each rank's host traffic (dgx-h100: GPUs 0-3 on node 0 by default).
TEST(TuneCli, PlanSaysWhichNodePricesEachRanksHostTraffic) {
  const std::string json = temp_dir() + "/numa_report.json";
  const auto r = run_program(kBin + " plan --workload " + kWorkload + " --profile dgx-h100 --ranks 2 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nhost DRAM: each rank's on its GPU's NUMA node (numa auto): node 0 for GPUs 0-1 (240 GB/s "
                          "local, shared by 2 ranks) (the profile has no gpu_numa_nodes: GPUs assumed spread over the "
                          "nodes in order)\n"),
            std::string::npos)
      << r.output;
  const auto report = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(report["step"]["host_node"], 0);
  EXPECT_EQ(report["step"]["host_pricing"].get<std::string>().rfind("each rank's on its GPU's NUMA node", 0), 0u);
}

TEST(TuneCli, BadArguments) {
  expect_one_line_error("plan --workload " + kWorkload + " --hbm-budget 80XB", "--hbm-budget '80XB'");
  expect_one_line_error("plan", "give exactly one of --workload, --trace and --criteo");
  expect_one_line_error("plan --workload '{\"rows\": 0}'", "--workload: ");
  expect_one_line_error("plan --workload " + kWorkload + " --out /", "--out /");
}

TEST(TuneCli, PlanOverRanksWritesAShardedStoreConfigAndPerRankNumbers) {
  const std::string plan = temp_dir() + "/ranks_plan.json", json = temp_dir() + "/ranks_report.json";
  // Room for every table sharded: every table gpu, sharded row-wise.
  auto r = run_program(kBin + " plan --workload " + kWorkload + " --ranks 4 --out " + plan + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("over 4 ranks, every table sharded row-wise; budgets and memory per rank"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all-to-all: "), std::string::npos) << r.output;
  auto config = parse_store_config(read_file(plan));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  for (const TableConfig& t : config->tables) {
    EXPECT_EQ(t.placement, Placement::kGpu) << t.spec.name;
    EXPECT_EQ(t.sharding.type, dispatch::ShardingType::kRow);
  }
  auto report = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(report["ranks"], 4);
  EXPECT_GT(report["exchange_bytes_per_step"].get<double>(), 0);
  EXPECT_GT(report["comm_buffer_bytes"].get<double>(), 0);
  EXPECT_LE(report["hbm_bytes"].get<double>(), report["hbm_budget_bytes"].get<double>());
  // With two batches in flight (strata-bench's pipeline), a per-rank HBM budget below every table
  // sharded (about 748 KB: the shards, the staging of the served keys and the engine's device
  // scratch) but above the smallest feasible (532 KB): some tables hybrid, within the budget.
  r = run_program(kBin + " plan --workload " + kWorkload +
                  " --ranks 4 --max-in-flight 2 --hbm-budget 650KB --host-budget 1GB --out " + plan + " --json " +
                  json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  config = parse_store_config(read_file(plan));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  bool hybrid = false;
  for (const TableConfig& t : config->tables) hybrid = hybrid || t.placement == Placement::kHybrid;
  EXPECT_TRUE(hybrid) << read_file(plan);
  report = nlohmann::json::parse(read_file(json));
  EXPECT_LE(report["hbm_bytes"].get<double>(), 650e3);
}

TEST(TuneCli, BadRanks) {
  // Refused before the keys are read (a billion steps would take long).
  const std::string many = "plan --workload " + kWorkload + " --steps 1000000000";
  expect_one_line_error(many + " --ranks 0", "--ranks '0' (expected an integer in [1, 4096])");
  expect_one_line_error(many + " --ranks four", "--ranks 'four' (expected an integer in [1, 4096])");
  expect_one_line_error(many + " --ranks 2.5", "--ranks '2.5'");
  expect_one_line_error(many + " --ranks -1", "--ranks '-1'");
  expect_one_line_error("plan --workload " + kWorkload + " --ranks 4 --hbm-budget 1KB --host-budget 1GB",
                        "over 4 ranks (gpu or hybrid, coldest off the GPU first); smallest feasible per rank: ");
}

// A Criteo TSV file of `lines` samples: label, 13 integers, 26 hex values (a few per column).
void write_criteo(const std::string& path, int lines) {
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    out << (i % 2);
    for (int d = 0; d < 13; ++d) out << '\t' << i % 7;
    for (int c = 0; c < 26; ++c) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>((i * 2654435761u + c) % (50 + 10 * c)));
      out << '\t' << (i % 11 == c % 11 ? "" : hex);  // some values missing
    }
    out << '\n';
  }
}

TEST(TuneCli, PlanReadsACriteoTsvWithStrataBenchsTables) {
  const std::string tsv = temp_dir() + "/day.tsv";
  write_criteo(tsv, 2000);
  const auto r = run_program(kBin + " plan --criteo " + tsv +
                             " --tables criteo:100000 --batch 256 --dim 16 --hbm-budget 2MB --host-budget 1GB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("criteo " + tsv + ", 8 steps"), std::string::npos) << r.output;
  // The 26 tables of the criteo set, as strata-bench --criteo names them.
  auto tables = bench::criteo_default_tables(100000, 16);
  ASSERT_TRUE(tables.is_ok());
  for (const TableSpec& t : *tables) EXPECT_NE(r.output.find("\n" + t.name + " "), std::string::npos) << t.name;
  // Columns mapped to one table: its rows are theirs summed, its features list is the columns.
  const StoreConfig config = written_plan(
      "--criteo " + tsv + " --tables pair=C3+C1 --criteo-rows 100000 --batch 256 --dim 16 --hbm-budget 2MB",
      "criteo_pair_plan.json");
  ASSERT_EQ(config.tables.size(), 25u);
  EXPECT_EQ(config.tables[0].spec.name, "pair");
  EXPECT_EQ(config.tables[0].spec.rows, (*tables)[0].rows + (*tables)[2].rows);
  ASSERT_EQ(config.tables[0].features.size(), 2u);
  EXPECT_EQ(config.tables[0].features[0].name, "C3");
}

TEST(TuneCli, PlanSamplesATraceAndSaysTheMeasuredError) {
  const std::string trace = temp_dir() + "/sampled.strtrace";
  write_trace(trace, 400);
  const auto r =
      run_program(kBin + " plan --trace " + trace + " --dim 8 --hbm-budget 10KB --host-budget 1GB --sample 0.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("keys sampled at 50%"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("curve: sampled at 50%, error <= "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(measured against exact on the first "), std::string::npos) << r.output;
}

TEST(TuneCli, BadCriteoFilesAndSampling) {
  const std::string empty = temp_dir() + "/empty.tsv";
  write(empty, "");
  expect_one_line_error("plan --criteo " + empty + " --tables criteo:100000", "has no samples");
  const std::string good = temp_dir() + "/good.tsv";
  write_criteo(good, 10);
  std::string text = read_file(good);
  const std::string truncated = temp_dir() + "/truncated.tsv";
  write(truncated, text.substr(0, text.size() - 40));  // the last line loses fields
  expect_one_line_error("plan --criteo " + truncated + " --tables criteo:100000", "line 10");
  const std::string corrupt = temp_dir() + "/corrupt.tsv";
  text[text.find('\n') - 3] = 'z';  // not hexadecimal
  write(corrupt, text);
  expect_one_line_error("plan --criteo " + corrupt + " --tables criteo:100000", "line 1");
  expect_one_line_error("plan --criteo " + good + " --tables a=10,b=20", "expected 26");
  expect_one_line_error("plan --criteo " + good + " --sample 0", "--sample 0 (expected a rate in (0, 1]");
  expect_one_line_error("plan --criteo " + good + " --sample 1.5", "--sample 1.5 (expected a rate in (0, 1]");
  expect_one_line_error("plan --workload " + kWorkload + " --sample 0.1", "--sample applies to --trace and --criteo");
}

// A plan with two capped caches and a gpu table for kWorkload's tables.
const char* const kCachedPlan =
    R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "cached", "cache": {"rows": 2000, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "cached", "cache": {"rows": 700, "cap": true}},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"}]})";

// The workload the validate tests run: 40 distinct batches of three tables.
const std::string kExactWorkload =
    "--workload '{\"tables\":\"a=20000x16,b=3000x16,c=500x8\",\"batch\":64,\"bag_size\":4,"
    "\"dist\":\"zipf:1.05\",\"distinct_batches\":40}'";

TEST(TuneCli, ValidatePredictsTheLruHitRatesStrataBenchMeasures) {
  const std::string plan = temp_dir() + "/cached_plan.json", out = temp_dir() + "/validate.json";
  write(plan, kCachedPlan);
  const std::string w =
      "'{\"tables\":\"a=20000x16,b=3000x16,c=500x8\",\"batch\":64,\"bag_size\":4,"
      "\"dist\":\"zipf:1.05\",\"distinct_batches\":40}'";
  const auto r = run_program(kBin + " validate " + plan + " --workload " + w + " --backend emu --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_file(out));
  EXPECT_EQ(j["device"], "emu");
  EXPECT_EQ(j["steps"], 20);
  int cached = 0;
  for (const auto& t : j["tables"]) {
    if (t["placement"] != "cached") continue;
    ++cached;
    // The accesses are the same distinct (batch, row) pairs; the hit rates within half a point.
    EXPECT_EQ(t["predicted"]["accesses"], t["measured"]["accesses"]) << t.dump();
    EXPECT_NEAR(t["predicted"]["hit_rate"].get<double>(), t["measured"]["hit_rate"].get<double>(), 0.005) << t.dump();
  }
  EXPECT_EQ(cached, 2);
  EXPECT_NEAR(j["hit_rate"]["predicted"].get<double>(), j["hit_rate"]["measured"].get<double>(), 0.005);
  for (const char* link : {"hbm_read", "hbm_write", "h2d", "d2h", "host_read", "host_write"}) {
    EXPECT_TRUE(j["bytes_per_step"]["predicted"].contains(link));
    EXPECT_TRUE(j["bytes_per_step"]["measured"].contains(link));
  }
  EXPECT_GT(j["step_ms"]["measured_p50"].get<double>(), 0);
  EXPECT_NE(r.output.find("LRU predicted"), std::string::npos) << r.output;
}

// validate's predicted bytes per link equal strata-bench's emu counters exactly (as whole bytes over
// the run: per-step values are these over the steps), and its CPU kernels' host bytes the ones
// strata-bench counts from the keys. Returns the validate JSON.
nlohmann::json expect_exact_bytes(const std::string& plan_text, const std::string& name, const std::string& input,
                                  const std::string& trainer, const std::string& more = "") {
  const std::string plan = temp_dir() + "/" + name + ".json", out = temp_dir() + "/" + name + "-" + trainer + ".json";
  write(plan, plan_text);
  const auto r = run_program(kBin + " validate " + plan + " " + input + " --backend emu --trainer " + trainer +
                             " --out " + out + (more.empty() ? "" : " " + more));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return nullptr;
  const auto j = nlohmann::json::parse(read_file(out));
  const double steps = j["steps"].get<double>();
  const auto whole = [&](const nlohmann::json& v) { return std::llround(v.get<double>() * steps); };
  for (const char* link : {"hbm_read", "hbm_write", "h2d", "d2h", "host_read", "host_write"})
    EXPECT_EQ(whole(j["bytes_per_step"]["predicted"][link]), whole(j["bytes_per_step"]["measured"][link]))
        << name << ", trainer " << trainer << ", " << link << ": " << j["bytes_per_step"].dump();
  const auto& cpu = j["cpu_kernel_bytes_per_step"];
  for (const char* link : {"host_read", "host_write"})
    EXPECT_EQ(whole(cpu["predicted"][link]), whole(cpu["counted_by_bench"][link]))
        << name << ", trainer " << trainer << ", CPU kernels " << link << ": " << cpu.dump();
  EXPECT_EQ(j["trainer"], trainer);
  // One model, one answer: equal bytes give the predicted step.
  const double predicted_ms = j["step_ms"]["predicted"].get<double>();
  EXPECT_NEAR(j["step_ms"]["modelled_from_measured_bytes"].get<double>(), predicted_ms, 1e-9 * predicted_ms)
      << name << ", trainer " << trainer << ": " << j["step_ms"].dump();
  EXPECT_EQ(j["step_ms"]["bottleneck_from_measured_bytes"], j["step_ms"]["bottleneck"]) << name;
  if (j["ranks"].get<int>() > 1) {
    // Rank 0's keys, rows and gradients exchanged with the other ranks, and its shard caches' hits.
    EXPECT_EQ(whole(j["bytes_per_step"]["predicted"]["all_to_all"]),
              whole(j["bytes_per_step"]["measured"]["all_to_all"]))
        << name << ", trainer " << trainer << ": " << j["bytes_per_step"].dump();
    for (const auto& t : j["tables"]) {
      if (t["placement"] != "hybrid") continue;
      EXPECT_EQ(t["predicted"]["accesses"], t["measured"]["accesses"]) << name << ": " << t.dump();
      EXPECT_EQ(t["predicted"]["hits"], t["measured"]["hits"]) << name << ": " << t.dump();
    }
  }
  return j;
}

TEST(TuneCli, ValidatePredictsTheBytesPerLinkExactlyOnEmu) {
  const std::string& w = kExactWorkload;
  const char* const host_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "offload"},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "offload"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "cpu"}]})";
  const char* const offload_cpu_plan = R"({"threads": 1, "offload_gather": "cpu", "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "offload"},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "offload"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"}]})";
  const char* const cpu_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "cpu"},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "cpu"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "cpu"}]})";
  const char* const gpu_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "gpu"},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "gpu"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"}]})";
  for (const std::string trainer : {"device", "host"}) {
    const auto cached = expect_exact_bytes(kCachedPlan, "exact-cached", w, trainer);
    // The caches evict rows the training phase updated: write-backs are part of what matches.
    if (!cached.is_null()) {
      EXPECT_GT(cached["bytes_per_step"]["measured"]["host_write"].get<double>(), 0);
    }
    expect_exact_bytes(gpu_plan, "exact-gpu", w, trainer);
    expect_exact_bytes(host_plan, "exact-offload", w, trainer);
    expect_exact_bytes(offload_cpu_plan, "exact-offload-cpu", w, trainer);
    const auto cpu = expect_exact_bytes(cpu_plan, "exact-cpu", w, trainer);
    // A trainer on the device pays PCIe for a cpu store's outputs and gradients (the bench's device).
    if (!cpu.is_null()) {
      EXPECT_EQ(cpu["bytes_per_step"]["measured"]["h2d"].get<double>() > 0, trainer == "device") << cpu.dump();
    }
  }
  // A trace: bags of several sizes, a cache of 8 rows that evicts.
  const std::string trace = temp_dir() + "/exact.strtrace";
  write_trace(trace, 30);
  const char* const trace_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 1000, "dim": 8, "placement": "cached", "cache": {"rows": 8, "cap": true}},
 {"name": "b", "rows": 50, "dim": 8, "placement": "gpu"}]})";
  for (const std::string trainer : {"device", "host"}) {
    const auto j = expect_exact_bytes(trace_plan, "exact-trace", "--trace " + trace, trainer);
    if (!j.is_null()) {
      EXPECT_GT(j["bytes_per_step"]["measured"]["host_write"].get<double>(), 0);
    }
  }
}

// A trace of three features: clicked and bought (400 and 300 rows, keys below 24, most of them used
// by both in each batch, so a table of the two dedups them together) and user (50 rows).
void write_feature_trace(const std::string& path, int batches) {
  std::vector<bench::TraceTable> features{{"clicked", 400}, {"bought", 300}, {"user", 50}};
  std::vector<KeyBatch> bs;
  for (int i = 0; i < batches; ++i) {
    const Key a = (13 * i) % 24, b = (7 * i + 1) % 24, c = (5 * i) % 16;
    KeyBatch kb;
    kb.features.push_back({"clicked", {0, 2, 3}, {a, b, c}, {}});
    kb.features.push_back({"bought", {0, 1, 3}, {b, a, (a + 1) % 24}, {}});
    kb.features.push_back({"user", {0, 1, 2}, {i % 50, 3}, {}});
    bs.push_back(std::move(kb));
  }
  ASSERT_TRUE(bench::write_trace(path, features, bs).is_ok());
}

// Two features on one table share its rows: the plan's curves, the validate prediction and the
// bytes count the table's keys over both (a row both use in a batch is one access), and equal
// what strata-bench measures on the store. Counted per feature, the accesses would be more.
TEST(TuneCli, TwoFeaturesOfOneTableCountTheTablesKeys) {
  const std::string trace = temp_dir() + "/features.strtrace", plan = temp_dir() + "/features_plan.json";
  write_feature_trace(trace, 30);
  const StoreConfig written = written_plan(
      "--trace " + trace + " --tables item=clicked+bought --dim 8 --hbm-budget 10KB", "features_plan.json");
  ASSERT_EQ(written.tables.size(), 2u);
  EXPECT_EQ(written.tables[0].spec.name, "item");
  EXPECT_EQ(written.tables[0].spec.rows, 400);  // the most rows of its features
  ASSERT_EQ(written.tables[0].features.size(), 2u);
  EXPECT_EQ(written.tables[0].features[1].name, "bought");
  EXPECT_TRUE(written.tables[1].features.empty());
  // A cache of 8 rows that evicts; the features come from the plan.
  const char* const cached_plan = R"({"threads": 1, "tables": [
 {"name": "item", "rows": 400, "dim": 8, "features": ["clicked", "bought"], "placement": "cached",
  "cache": {"rows": 8, "cap": true}},
 {"name": "user", "rows": 50, "dim": 8, "placement": "gpu"}]})";
  // The bytes per link too (the store serves the table unpooled: ValidatePricesTablesOfSeveralFeaturesExactlyOnEmu).
  const auto j = expect_exact_bytes(cached_plan, "features_validate", "--trace " + trace, "device");
  ASSERT_FALSE(j.is_null());
  bool seen = false;
  for (const auto& t : j["tables"]) {
    if (t["name"] != "item") continue;
    seen = true;
    EXPECT_EQ(t["predicted"]["accesses"], t["measured"]["accesses"]) << t.dump();
    EXPECT_EQ(t["predicted"]["hits"], t["measured"]["hits"]) << t.dump();
    EXPECT_GT(t["measured"]["hits"].get<int>(), 0) << t.dump();
  }
  EXPECT_TRUE(seen) << j.dump();
  // Bad mappings: one line naming the value, exit 2, before any work.
  const std::string p = "plan --trace " + trace + " --dim 8 --tables ";
  expect_one_line_error(p + "item=clicked,item=bought", "--tables: item 2 'item=bought': table 'item' is listed twice");
  expect_one_line_error(p + "item=clicked+bought,x=bought",
                        "feature 'bought' is mapped to table 'item' and to table 'x'");
  expect_one_line_error(p + "item=clicked+nope", "table 'item': feature 'nope' is not in trace '" + trace +
                                                     "' (its features: clicked, bought, user)");
  expect_one_line_error(p + "user=clicked", "table 'user' is listed twice: in the mapping and as feature 'user'");
  expect_one_line_error(p + "criteo:100", "with --trace, --tables maps the trace's features to tables");
  expect_one_line_error("plan --workload " + kWorkload + " --tables item=a+b",
                        "a mapping of features to tables applies to --trace and --criteo files");
  expect_one_line_error("validate " + plan + " --trace " + trace + " --tables item=clicked",
                        "table 'item' is looked up by features clicked, bought in the plan but by features clicked in "
                        "the trace");
}

// A trace of four tables of two features each (features tN_a and tN_b of 400 and 300 rows, bags of
// several sizes, keys below 24 shared by both) and one table u of its own.
void write_paired_trace(const std::string& path, int batches) {
  std::vector<bench::TraceTable> features;
  for (int t = 0; t < 4; ++t) {
    features.push_back({"t" + std::to_string(t) + "_a", 400});
    features.push_back({"t" + std::to_string(t) + "_b", 300});
  }
  features.push_back({"u", 50});
  std::vector<KeyBatch> bs;
  for (int i = 0; i < batches; ++i) {
    KeyBatch kb;
    for (int t = 0; t < 4; ++t) {
      const Key a = (13 * i + t) % 24, b = (7 * i + 1) % 24, c = (5 * i + 3 * t) % 16;
      kb.features.push_back({"t" + std::to_string(t) + "_a", {0, 2, 3}, {a, b, c}, {}});
      kb.features.push_back({"t" + std::to_string(t) + "_b", {0, (i + t) % 4, 3}, {b, a, (a + 1) % 24}, {}});
    }
    kb.features.push_back({"u", {0, 1, 2}, {i % 50, 3}, {}});
    bs.push_back(std::move(kb));
  }
  ASSERT_TRUE(bench::write_trace(path, features, bs).is_ok());
}

// The store serves a table of several features unpooled in fp32 into host buffers and pools each
// feature on the host, its device views through the host bounce: validate's model prices that to
// the byte, per link, in every placement and over ranks, a feature unpooled (bags of its keys'
// rows) among them.
TEST(TuneCli, ValidatePricesTablesOfSeveralFeaturesExactlyOnEmu) {
  const std::string trace = temp_dir() + "/paired.strtrace";
  write_paired_trace(trace, 24);
  const auto table = [](int t, const std::string& placement, const std::string& more = "") {
    const std::string n = "t" + std::to_string(t);
    return R"({"name": ")" + n + R"(", "rows": 400, "dim": 8, "features": [")" + n + R"(_a", {"name": ")" + n +
           R"(_b", "pooling": "none"}], "placement": ")" + placement + "\"" + more + "},\n";
  };
  const std::string cache = R"(, "cache": {"rows": 6, "cap": true})", u = R"({"name": "u", "rows": 50, "dim": 8, )";
  const std::string mixed = R"({"threads": 1, "tables": [)" + table(0, "cached", cache) + table(1, "gpu") +
                            table(2, "offload") + table(3, "cpu") + u + R"("placement": "gpu"}]})";
  const std::string offload_cpu = R"({"threads": 1, "offload_gather": "cpu", "tables": [)" + table(0, "offload") +
                                  table(1, "offload") + table(2, "cpu") + table(3, "gpu") + u +
                                  R"("placement": "cpu"}]})";
  const std::string sharded = R"({"threads": 1, "tables": [)" + table(0, "hybrid", cache) + table(1, "gpu") +
                              table(2, "hybrid", cache) + table(3, "gpu") + u + R"("placement": "gpu"}]})";
  const std::string in = "--trace " + trace;
  expect_exact_bytes(offload_cpu, "features-offload-cpu", in, "device");
  for (const std::string trainer : {"device", "host"}) {
    expect_exact_bytes(mixed, "features-mixed", in, trainer);
    expect_exact_bytes(sharded, "features-sharded", in + " --ranks 2", trainer);
  }
}

// The default profile (h200-pcie5) with random-row gather rates, slow enough that host DRAM is the
// bottleneck of a host-heavy plan: the rates price rows, which strata-bench's counters do not see.
std::string profile_with_gather_rates() {
  const std::string path = temp_dir() + "/gather_rates.json";
  auto p = load_hardware_profile(std::string(STRATA_SOURCE_DIR) + "/bench/profiles/h200-pcie5.json");
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  for (NumaNodeProfile& node : p->numa_nodes)
    node.gather = {{64, {2e6, "test"}, {1e6, "test"}}, {256, {1e6, "test"}, {5e5, "test"}}};
  write(path, hardware_profile_to_json(*p));
  return path;
}

// The predicted step and the step modelled from the measured bytes are one computation: with a
// profile whose gather rates price the host's random rows (which strata-bench's counters count as
// bytes), they are equal when the bytes are, and validate --html sets predicted against measured
// per table and per link.
TEST(TuneCli, ValidateModelsThePredictedAndTheMeasuredBytesAlike) {
  const std::string profile = profile_with_gather_rates();
  const std::string& w = kExactWorkload;
  const char* const mixed_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "cached", "cache": {"rows": 2000, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "offload"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "cpu"}]})";
  const std::string html = temp_dir() + "/validate.html";
  const auto j = expect_exact_bytes(mixed_plan, "one-model", w, "device", "--profile " + profile + " --html " + html);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["step_ms"]["bottleneck"], "host_dram") << j["step_ms"].dump();
  EXPECT_GT(j["step_ms"]["gather_rows_per_step"].get<double>(), 0);
  for (const auto& [link, ms] : j["step_ms"]["link_ms"].items())
    EXPECT_NEAR(ms["modelled_from_measured_bytes"].get<double>(), ms["predicted"].get<double>(),
                1e-9 * std::max(1e-9, ms["predicted"].get<double>()))
        << link;
  // strata-bench prices every host byte at the sequential bandwidth (it cannot tell rows apart):
  // its own number is kept apart, not set against the prediction.
  EXPECT_GT(std::abs(j["step_ms"]["bench_modelled"].get<double>() - j["step_ms"]["predicted"].get<double>()), 1e-6);
  const std::string page = read_file(html);
  for (const char* id : {"id=\"tables\"", "id=\"hit-rates\"", "id=\"links\"", "id=\"bytes\"", "id=\"link-time\""})
    EXPECT_NE(page.find(id), std::string::npos) << id;
  std::size_t svgs = 0;
  for (std::size_t at = page.find("<svg"); at != std::string::npos; at = page.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 3u) << "hit rates, bytes and link times";
  EXPECT_NE(page.find("LRU predicted"), std::string::npos);
  EXPECT_NE(page.find("modelled from the measured bytes"), std::string::npos);
}

// plan warns when the input is too short for a hit-rate curve and when the host budget is more
// than this machine's memory (the default is the profile's host memory).
TEST(TuneCli, PlanWarnsOfAShortInputAndABudgetAboveThisMachine) {
  const std::string tsv = temp_dir() + "/short.tsv";
  {
    std::ofstream f(tsv);
    for (int i = 0; i < 300; ++i) {
      f << (i % 2);
      for (int c = 0; c < 13; ++c) f << '\t' << (i * 7 + c) % 50;
      for (int c = 0; c < 26; ++c) f << '\t' << std::hex << (i * 31 + c * 7) % (3 + c * 11) << std::dec;
      f << '\n';
    }
  }
  const auto short_run =
      run_program(kBin + " plan --criteo " + tsv + " --batch 100 --dim 16 --hbm-budget 1MB " + "--host-budget 1000TB");
  ASSERT_EQ(short_run.exit_code, 0) << short_run.output;
  EXPECT_NE(short_run.output.find("warning: the input has 3 steps"), std::string::npos) << short_run.output;
  EXPECT_NE(short_run.output.find("lower --batch (100 samples per step; 30 or fewer"), std::string::npos)
      << short_run.output;
  EXPECT_NE(short_run.output.find("warning: --host-budget 1 PB is more than this machine's memory"), std::string::npos)
      << short_run.output;
  const auto ok_run =
      run_program(kBin + " plan --criteo " + tsv + " --batch 10 --dim 16 --hbm-budget 1MB " + "--host-budget 1GB");
  ASSERT_EQ(ok_run.exit_code, 0) << ok_run.output;
  EXPECT_EQ(ok_run.output.find("warning:"), std::string::npos) << ok_run.output;
}

// A plan over several ranks (plan --ranks N: every table gpu or hybrid, sharded row-wise) runs as
// strata-bench --config plan.json --ranks N runs it, on N thread ranks: rank 0's counters equal
// validate's prediction to the byte, per link and over the all-to-all, and its shard caches' hits
// equal those of the simulation of its inner cache.
TEST(TuneCli, ValidatePredictsShardedRunsExactlyOnEmu) {
  const std::string& w = kExactWorkload;
  // Two hybrid tables in one slot pool (each capped at its rows per rank), evicting; a gpu table.
  const char* const hybrid_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "hybrid", "cache": {"rows": 400, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "hybrid", "cache": {"rows": 250, "cap": true}},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"}]})";
  const char* const gpu_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "gpu"},
 {"name": "b", "rows": 3000, "dim": 16, "placement": "gpu"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"}]})";
  for (const int ranks : {2, 4})
    for (const std::string trainer : {"device", "host"}) {
      const std::string in = w + " --ranks " + std::to_string(ranks);
      const auto j = expect_exact_bytes(hybrid_plan, "sharded-hybrid-" + std::to_string(ranks), in, trainer);
      if (!j.is_null()) {
        EXPECT_EQ(j["ranks"], ranks);
        EXPECT_GT(j["bytes_per_step"]["measured"]["host_write"].get<double>(), 0);  // dirty rows written back
        EXPECT_GT(j["bytes_per_step"]["measured"]["all_to_all"].get<double>(), 0);
      }
      expect_exact_bytes(gpu_plan, "sharded-gpu-" + std::to_string(ranks), in, trainer);
    }
  // A trace (bags of several sizes) over an odd world.
  const std::string trace = temp_dir() + "/sharded.strtrace";
  write_trace(trace, 60);
  const char* const trace_plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 1000, "dim": 8, "placement": "hybrid", "cache": {"rows": 12, "cap": true}},
 {"name": "b", "rows": 50, "dim": 8, "placement": "gpu"}]})";
  for (const std::string trainer : {"device", "host"})
    expect_exact_bytes(trace_plan, "sharded-trace", "--trace " + trace + " --ranks 3", trainer);
  // A plan strata-tune made for 2 ranks, some tables hybrid.
  const std::string made = temp_dir() + "/made_ranks_plan.json";
  const auto r = run_program(kBin + " plan " + w + " --ranks 2 --hbm-budget 1.2MB --host-budget 1GB --out " + made);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(made);
  EXPECT_NE(text.find("\"hybrid\""), std::string::npos) << text;
  expect_exact_bytes(text, "sharded-made", w + " --ranks 2", "device");
}

// Slot pools and the offload engine's row groups are keyed by the record's element types as well
// as its dim (the store's shapes): an fp32 and a bf16 table of one dim are two pools (two lists of
// fills and write-backs each step) and two offload groups (two lists of distinct rows). validate
// predicted one of each, merged by (dim, state), before: 51 bytes a step short of the H2D
// strata-bench measured (a and b cached, d and e offload, in one run).
TEST(TuneCli, ValidatePredictsTablesOfOneDimAndTwoDtypesExactly) {
  const std::string w =
      "--workload '{\"tables\":\"a=20000x16,b=3000x16,c=500x8,d=8000x16,e=4000x16\",\"batch\":64,"
      "\"bag_size\":4,\"dist\":\"zipf:1.05\",\"distinct_batches\":40}'";
  const char* const plan = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "placement": "cached", "cache": {"rows": 2000, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "dtype": "bf16", "placement": "cached", "cache": {"rows": 700, "cap": true}},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"},
 {"name": "d", "rows": 8000, "dim": 16, "placement": "offload"},
 {"name": "e", "rows": 4000, "dim": 16, "dtype": "bf16", "placement": "offload"}]})";
  expect_exact_bytes(plan, "dtypes", w, "device");
  // Over ranks, rows move between them (and through the exchange's buffers) as the inner engines'
  // fp32 lookups and gradient sums, whatever the table's dtype: validate counted bf16 rows at half
  // size there (all-to-all 19471 bytes a step predicted, 23964 measured).
  const char* const sharded = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "dtype": "bf16", "placement": "hybrid", "cache": {"rows": 400, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "dtype": "bf16", "placement": "gpu"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"},
 {"name": "d", "rows": 8000, "dim": 16, "placement": "hybrid", "cache": {"rows": 400, "cap": true}},
 {"name": "e", "rows": 4000, "dim": 16, "dtype": "bf16", "placement": "hybrid", "cache": {"rows": 300, "cap": true}}]})";
  expect_exact_bytes(sharded, "dtypes-sharded", w + " --ranks 2", "device");
  // Half-size outputs (issue 31): written at their size, while the gradients are updated (`gpu`,
  // `cached`) or summed (sharded) as fp32, widened on the host: a host trainer's gradients go H2D at
  // 4 bytes an element, a device trainer's half ones D2H at their size and back H2D widened.
  const char* const outputs = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "output_dtype": "bf16", "placement": "cached", "cache": {"rows": 2000, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "dtype": "bf16", "output_dtype": "fp16", "placement": "gpu"},
 {"name": "c", "rows": 500, "dim": 8, "output_dtype": "bf16", "placement": "gpu"},
 {"name": "d", "rows": 8000, "dim": 16, "output_dtype": "bf16", "placement": "offload"},
 {"name": "e", "rows": 4000, "dim": 16, "dtype": "bf16", "output_dtype": "fp16", "placement": "offload"}]})";
  const char* const sharded_outputs = R"({"threads": 1, "tables": [
 {"name": "a", "rows": 20000, "dim": 16, "output_dtype": "bf16", "placement": "hybrid", "cache": {"rows": 400, "cap": true}},
 {"name": "b", "rows": 3000, "dim": 16, "dtype": "bf16", "output_dtype": "fp16", "placement": "gpu"},
 {"name": "c", "rows": 500, "dim": 8, "placement": "gpu"},
 {"name": "d", "rows": 8000, "dim": 16, "placement": "hybrid", "cache": {"rows": 400, "cap": true}},
 {"name": "e", "rows": 4000, "dim": 16, "output_dtype": "bf16", "placement": "gpu"}]})";
  for (const std::string trainer : {"device", "host"}) {
    expect_exact_bytes(outputs, "half-outputs", w, trainer);
    expect_exact_bytes(sharded_outputs, "half-outputs-sharded", w + " --ranks 2", trainer);
  }
}

// A plan at the smallest feasible budget gives its hybrid tables the planner's smallest cache, one
// world step of the fullest shard's rows: fewer than the two batches strata-bench keeps in flight
// pin, so the later plans wait for them (deferred), and the run still matches the prediction. (It
// used to be refused before the run: "the batches in flight need 284 unique rows", for 165.)
TEST(TuneCli, ValidateRunsAPlanAtTheSmallestFeasibleBudget) {
  const std::string w =
      "--workload '{\"tables\":\"a=20000x16,b=3000x16,c=500x8\",\"batch\":64,\"bag_size\":4,"
      "\"dist\":\"zipf:1.05\",\"distinct_batches\":40}' --ranks 2";
  const std::string plan = temp_dir() + "/smallest_plan.json";
  auto r = run_program(kBin + " plan " + w + " --hbm-budget 1KB --host-budget 1GB --out " + plan);
  ASSERT_EQ(r.exit_code, 2) << r.output;
  const std::string key = "or --hbm-budget ", tail = " with this host budget";
  const std::size_t at = r.output.find(key), end = r.output.find(tail);
  ASSERT_TRUE(at != std::string::npos && end != std::string::npos && end > at) << r.output;
  const std::string budget = r.output.substr(at + key.size(), end - at - key.size());  // "1.14 MB"
  r = run_program(kBin + " plan " + w + " --hbm-budget '" + budget + "' --host-budget 1GB --out " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(plan);
  EXPECT_NE(text.find("\"hybrid\""), std::string::npos) << text;
  const auto j = expect_exact_bytes(text, "smallest", w, "device");
  if (j.is_null()) return;
  EXPECT_GT(j["deferred_plans"].get<std::int64_t>(), 0) << j.dump();
}

TEST(TuneCli, ValidateRefusesAPlanThatDoesNotMatchBeforeTheRun) {
  const std::string plan = temp_dir() + "/other_plan.json";
  std::string p = kCachedPlan;
  p.replace(p.find("\"rows\": 3000"), 12, "\"rows\": 3001");
  write(plan, p);
  expect_one_line_error("validate " + plan + " --workload " + kWorkload + " --backend emu",
                        "does not match the workload: table 'b' has 3001 rows in the plan but 3000 in the workload");
  const std::string trace = temp_dir() + "/ab.strtrace";
  write_trace(trace, 10);
  expect_one_line_error("validate " + plan + " --trace " + trace, "table 'a' has 20000 rows in the plan but 1000");
  const std::string notjson = temp_dir() + "/notjson_plan.json";
  write(notjson, "{\"tables\": [");
  expect_one_line_error("validate " + notjson + " --trace " + trace, "notjson_plan.json");
  expect_one_line_error("validate " + temp_dir() + "/no_plan.json --trace " + trace, "no_plan.json");
  // Several ranks take gpu and hybrid tables; a hybrid plan needs its ranks.
  write(plan, kCachedPlan);
  expect_one_line_error("validate " + plan + " --workload " + kWorkload + " --ranks 2",
                        "table 'a' is cached: a world of 2 ranks takes gpu or hybrid tables");
  std::string h = kCachedPlan;
  for (std::size_t at; (at = h.find("\"cached\"")) != std::string::npos;) h.replace(at, 8, "\"hybrid\"");
  write(plan, h);
  expect_one_line_error("validate " + plan + " --workload " + kWorkload, "is hybrid (a plan made with plan --ranks N");
  expect_one_line_error("validate " + plan + " --workload " + kWorkload + " --ranks 65",
                        "--ranks '65' (expected an integer in [1, 64])");
}

TEST(TuneCli, CalibrateOutputParsesAndValidates) {
  const std::string out = temp_dir() + "/calibrated.json";
  const auto r = run_program(kBin + " calibrate --out " + out +
                             " --probe-mib 4 --row-bytes 64,128,1024 --lookups 8192 --threads 1 --name here");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto p = load_hardware_profile(out);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->name, "here");
  EXPECT_TRUE(has_gather_rates(*p));
  EXPECT_EQ(p->numa_nodes[0].gather.size(), 3u);
  EXPECT_NE(p->numa_nodes[0].local_gbs.source.find("by `strata-tune calibrate --out "), std::string::npos);
  EXPECT_EQ(p->hbm_gbs.source.rfind("from profile 'h200-pcie5' (", 0), 0u) << p->hbm_gbs.source;
  // The calibrated profile plans.
  EXPECT_EQ(run_program(kBin + " plan --workload " + kWorkload + " --profile " + out).exit_code, 0);
  expect_one_line_error("calibrate --row-bytes 64,63", "--row-bytes: 63");
}

// ---- issue 29: every count bounded, every usage error exit 2 ----

// Virtual memory limit (KiB) for cases that used to allocate without bound: a regression fails
// fast (std::bad_alloc) instead of eating the machine's memory.
const std::string kMemoryLimit = "ulimit -v 4000000; ";

// One line "strata-tune: ..." with every one of `needles`, exit code 2, run under kMemoryLimit.
void expect_bounded(const std::string& args, const std::vector<std::string>& needles) {
  const auto r = run_program(kMemoryLimit + kBin + " " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("strata-tune: ", 0), 0u) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << args << ": expected one line:\n" << r.output;
  for (const std::string& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << args << "\n" << r.output;
}

const std::string kMachineThreads = std::to_string(std::max(1u, std::thread::hardware_concurrency()));

TEST(TuneCli, CountsAreBoundedBeforeAnythingIsAllocated) {
  // These aborted (std::bad_alloc, std::system_error) after seconds of work.
  expect_bounded("plan --workload " + kWorkload + " --steps 99999999999999999999",
                 {"--steps: '99999999999999999999' is not an integer in [0, 9223372036854775807]"});
  expect_bounded("plan --workload " + kWorkload + " --steps 100000000",
                 {"--steps 100000000: the keys of 100000000 steps take up to ", "this machine can use",
                  "steps of this workload fit"});
  expect_bounded("calibrate --probe-mib 1 --lookups 99999999999999999999",
                 {"--lookups: '99999999999999999999' is not an integer in [16, 9223372036854775807]"});
  expect_bounded("calibrate --probe-mib 1 --lookups 1000000000000",
                 {"--probe-mib 1 --lookups 1000000000000: the probes hold up to ", "this machine can use"});
  expect_bounded("calibrate --threads 1000000",
                 {"--threads 1000000 is more than 4 x the " + kMachineThreads + " hardware threads of this machine"});
  expect_bounded("calibrate --threads -1", {"--threads: '-1' is not an integer in [0, 2147483647]"});
  // The counts of plan's curves, and a budget or a count out of range.
  expect_bounded("plan --workload " + kWorkload + " --points 1000000000", {"--points: '1000000000'", "[2, 1024]"});
  expect_bounded("plan --workload " + kWorkload + " --belady-points 1000000000", {"--belady-points", "[0, 1024]"});
  expect_bounded("plan --workload " + kWorkload + " --threads 5000", {"--threads: '5000'", "[0, 1024]"});
  expect_bounded("plan --criteo x.tsv --batch 99999999999999999999", {"--batch: '99999999999999999999'"});
  expect_bounded("plan --criteo x.tsv --criteo-rows 99999999999999999999", {"--criteo-rows: '99999999999999999999'"});
  // A workload whose own distinct batches cannot be held.
  expect_bounded("plan --workload '{\"tables\": 4, \"rows\": 1000, \"batch\": 100000000000, \"bag_size\": 4}'",
                 {"--workload: its 8 distinct batches take up to ", "this machine can use"});
}

TEST(TuneCli, RefusesWhatItUsedToTakeSilently) {
  // --steps -1 was the default, an empty budget the profile's, an empty --row-bytes item dropped.
  expect_bounded("plan --workload " + kWorkload + " --steps -1", {"--steps: '-1' is not an integer in [0, "});
  expect_bounded("plan --workload " + kWorkload + " --hbm-budget ''",
                 {"--hbm-budget '': expected a size like 80GB, 512MiB or 1e9"});
  expect_bounded("plan --workload " + kWorkload + " --host-budget ''",
                 {"--host-budget '': expected a size like 80GB, 512MiB or 1e9"});
  // (Small probes, so that a regression ends soon.)
  const std::string probe = "calibrate --probe-mib 1 --lookups 1024 --threads 1 --row-bytes ";
  expect_bounded(probe + "64,,128", {"--row-bytes '64,,128': item 2 '' is not an integer in [1, 4194304]"});
  expect_bounded(probe + "64,128,", {"--row-bytes '64,128,': item 3 '' is not an integer"});
  expect_bounded(probe + ",64", {"--row-bytes ',64': item 1 ''"});
  expect_bounded(probe + "''", {"--row-bytes '': no items"});
  expect_bounded(probe + "64,0x80", {"--row-bytes '64,0x80': item 2 '0x80' is not an integer"});
}

TEST(TuneCli, EveryUsageErrorExitsTwo) {
  // CLI11's own codes (104 to 114) used to be the exit codes.
  for (const std::string args : {"", "nosuch", "plan --no-such-flag", "plan --steps", "plan --steps abc",
                                 "plan --steps 010x", "plan --trainer gpu", "plan --workload a --workload", "validate",
                                 "validate a b c", "calibrate --lookups 1e6", "calibrate --row-bytes"}) {
    const auto r = run_program(kBin + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("strata-tune: ", 0), 0u) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << args << ": expected one line:\n" << r.output;
  }
  for (const std::string args : {"--help", "plan --help", "validate --help", "calibrate --help", "capacity --help"})
    EXPECT_EQ(run_program(kBin + " " + args).exit_code, 0) << args;
}

// capacity: raw 64-bit keys in a trace (header rows 2^63 - 1), two features of one table, JSON and HTML out; the
// library's replay is checked against an independent LRU in tune_capacity_test.cpp.
TEST(TuneCli, CapacityOfATraceOfRawKeys) {
  const std::string trace = temp_dir() + "/raw.strtrace", out = temp_dir() + "/capacity.json",
                    html = temp_dir() + "/capacity.html";
  constexpr Key kMax = std::numeric_limits<Key>::max();
  std::vector<KeyBatch> bs;
  for (int i = 0; i < 30; ++i) {
    KeyBatch b;
    // x: a hot key and a new one each step; y: keys shared with x, the largest key and a cold one.
    b.features.push_back(
        {"x", {0, 2, 3}, {bench::spread_key(1), bench::spread_key(100 + i), bench::spread_key(2)}, {}});
    b.features.push_back({"y", {0, 1, 3}, {kMax - 1, bench::spread_key(2), bench::spread_key(i % 5)}, {}});
    bs.push_back(std::move(b));
  }
  ASSERT_TRUE(bench::write_trace(trace, {{"x", kMax}, {"y", kMax}}, bs).is_ok());
  const auto r = run_program(kBin + " capacity --trace " + trace +
                             " --tables xy=x+y --capacities 5,20 --refine 0 --out " + out + " --html " + html);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_file(out));
  ASSERT_EQ(j["tables"].size(), 1u);
  const auto& t = j["tables"][0];
  EXPECT_EQ(t["name"], "xy");
  EXPECT_EQ(t["uses"], 30 * 6);
  EXPECT_EQ(t["distinct_keys"], 30 + 2 + 1 + 3);  // x's new keys, keys 1 and 2, kMax - 1, keys 0, 3 and 4
  EXPECT_EQ(t["unbounded_capacity"], 36);
  ASSERT_EQ(t["capacities"].size(), 3u);
  for (const auto& c : t["capacities"]) {
    EXPECT_EQ(c["hits"].get<std::int64_t>() + c["admitted"].get<std::int64_t>() + c["refused"].get<std::int64_t>(),
              180);
    EXPECT_EQ(c["refused_batches"], 0);
  }
  // Unbounded: each distinct key admitted once (its first step's uses), every later use a hit.
  EXPECT_EQ(t["capacities"][2]["admissions"], 36);
  EXPECT_EQ(t["capacities"][2]["evictions"], 0);
  EXPECT_EQ(t["config"]["kind"], "dynamic");
  EXPECT_NE(read_file(html).find("<svg"), std::string::npos);
}

TEST(TuneCli, CapacityBadInput) {
  const std::string w = "capacity --workload " + kWorkload;
  expect_one_line_error(w + " --capacities 0", "--capacities '0': item 1 '0' is not an integer in [1, 2147483646]");
  expect_one_line_error(w + " --capacities 10,2147483647", "is not an integer in [1, 2147483646]");
  expect_one_line_error(w + " --capacities 10,", "item 2 '' is not an integer");
  expect_one_line_error(w + " --admit-after 0", "--admit-after: '0' is not an integer in [1, 65535]");
  expect_one_line_error(w + " --admit-after 65536", "--admit-after: '65536' is not an integer in [1, 65535]");
  expect_one_line_error(w + " --evict-after-steps -1", "--evict-after-steps: '-1' is not an integer in [0, ");
  expect_one_line_error(w + " --eviction fifo", "--eviction");
  expect_one_line_error(w + " --tolerance 101", "--tolerance 101 (expected points in [0, 100])");
  expect_one_line_error(w + " --sample 0.5", "--sample");
  expect_one_line_error("capacity --trace /nonexistent.strtrace", "/nonexistent.strtrace");
}

TEST(TuneCli, ValidateChecksItsStepsBeforeItPredictsOrRuns) {
  const std::string trace = temp_dir() + "/forty.strtrace", plan = temp_dir() + "/forty_plan.json";
  write_trace(trace, 40);
  write(plan, R"({"threads": 1, "tables": [
 {"name": "a", "rows": 1000, "dim": 8, "placement": "cached", "cache": {"rows": 8, "cap": true}},
 {"name": "b", "rows": 50, "dim": 8, "placement": "gpu"}]})");
  const std::string args = "validate " + plan + " --trace " + trace + " --backend emu --no-progress";
  // Beyond strata-bench's steps: refused as strata-bench refuses it, with the reason (it used to
  // say only "strata-bench failed (exit 2): Run with --help for more information").
  expect_bounded(args + " --steps 99999999999999999999",
                 {"--steps: '99999999999999999999' is not an integer in [0, 1000000]"});
  // Within them, but more than the trace holds: strata-bench's own check, before the prediction
  // (which took minutes for a billion steps) and without running strata-bench.
  const auto r = run_program("timeout 60 " + kBin + " " + args + " --steps 1000000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("trace " + trace + " has 40 batches but --warmup 0 + --steps 1000000 need at least 1000000"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("strata-bench failed"), std::string::npos) << r.output;
  // Over ranks (a plan of gpu tables), even with a program that is not strata-bench.
  const std::string gpu_plan = temp_dir() + "/forty_gpu_plan.json";
  write(gpu_plan, R"({"threads": 1, "tables": [
 {"name": "a", "rows": 1000, "dim": 8, "placement": "gpu"},
 {"name": "b", "rows": 50, "dim": 8, "placement": "gpu"}]})");
  expect_bounded("validate " + gpu_plan + " --trace " + trace + " --steps 25 --ranks 2 --bench /bin/false",
                 {"trace " + trace + " has 40 batches but --warmup 0 + --steps 25 on 2 ranks need at least 50"});
}

}  // namespace
}  // namespace strata
