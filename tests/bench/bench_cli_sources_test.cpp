// Runs the built strata-bench on real data: a recorded trace (--trace, written by --dump-trace),
// a Criteo TSV file (--criteo) and a store config (--config, including a plan written by
// strata-tune plan); and bad input for each, which must fail in one line before any long work.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "tests/bench/run_program.hpp"
#include "toolkit/criteo_tsv.hpp"
#include "toolkit/trace.hpp"

namespace {

using nlohmann::json;
using strata::testing::read_file;
using strata::testing::RunOutput;

RunOutput run_bench(const std::string& args) {
  return strata::testing::run_program(std::string(STRATA_BENCH_BIN) + " --no-progress " + args);
}

std::string temp_dir() {
  static const std::string dir = strata::testing::scratch_dir("strata_bench_sources");
  return dir;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Small runs: one thread, no probes worth waiting for.
const std::string kQuick = " --steps 2 --warmup 1 --threads 1 --read-probe-mib 1 --no-gather-probe --backend emu ";

// Fails with a non-zero exit and one line "strata-bench: ..." holding `needle`, before the first
// long work (the read-bandwidth probe).
void expect_refused(const std::string& args, const std::string& needle) {
  SCOPED_TRACE(args);
  const RunOutput r = run_bench(args);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "killed by a signal: " << r.output;
  EXPECT_EQ(r.output.rfind("strata-bench: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "expected one line:\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
  EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output;
}

json run_json(const std::string& args, const std::string& name) {
  const std::string out = temp_dir() + "/" + name + ".result.json";
  const RunOutput r = run_bench(args + " --json " + out);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  if (r.exit_code != 0) return json::object();
  return json::parse(read_file(out));
}

const json& mode(const json& j, const std::string& name) {
  for (const json& m : j["results"])
    if (m["mode"] == name) return m;
  static const json none;
  ADD_FAILURE() << "no mode " << name << " in " << j["results"].dump().substr(0, 400);
  return none;
}

// ---- a trace written by --dump-trace replays as the generated run ----

TEST(BenchSources, ADumpedTraceReplaysWithTheSameHitRatesAndBytes) {
  const std::string trace = temp_dir() + "/roundtrip.strtrace";
  const std::string common =
      kQuick + "--batch 32 --dim 16 --cache-fraction 0.5 --modes cpu,offload,offload-cpu,cached,gpu,hybrid";
  const json generated =
      run_json(common + " --tables a=3000,b=500 --pooling 2 --dist zipf:1.05 --dump-trace " + trace, "generated");
  const json replayed = run_json(common + " --trace " + trace, "replayed");
  ASSERT_FALSE(generated.empty());
  ASSERT_FALSE(replayed.empty());
  EXPECT_EQ(generated["workload"]["source"]["kind"], "generated");
  EXPECT_EQ(replayed["workload"]["source"]["kind"], "trace");
  EXPECT_EQ(replayed["workload"]["source"]["path"], trace);
  EXPECT_EQ(replayed["workload"]["source"]["batches"], generated["workload"]["distinct_batches"]);
  EXPECT_EQ(replayed["workload"]["tables"], generated["workload"]["tables"]);
  ASSERT_EQ(replayed["results"].size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    const json& g = generated["results"][i];
    const json& t = replayed["results"][i];
    SCOPED_TRACE(g["mode"].get<std::string>());
    EXPECT_EQ(t["mode"], g["mode"]);
    EXPECT_EQ(t["hit_rate"], g["hit_rate"]);
    EXPECT_EQ(t["bytes_per_step"], g["bytes_per_step"]);
    EXPECT_EQ(t["modelled"]["link_ms"], g["modelled"]["link_ms"]);
    EXPECT_EQ(t["forward_step_s"].size(), g["forward_step_s"].size());
    if (g.contains("cache")) {
      for (const char* k : {"accesses", "hits", "misses", "evictions"}) EXPECT_EQ(t["cache"][k], g["cache"][k]) << k;
    }
  }
  EXPECT_GT(mode(replayed, "cached")["hit_rate"].get<double>(), 0.0);
}

TEST(BenchSources, AShortTraceIsCycledAndSaysSo) {
  std::vector<strata::KeyBatch> batches;
  for (int i = 0; i < 4; ++i) {
    strata::KeyBatch b;
    b.features.push_back({"b", {0, 1, 1}, {i}, {}});  // record order differs from the header's
    b.features.push_back({"a", {0, 2, 3}, {i, 7, 9}, {}});
    batches.push_back(b);
  }
  const std::string trace = temp_dir() + "/four.strtrace";
  ASSERT_TRUE(strata::bench::write_trace(trace, {{"a", 100}, {"b", 10}, {"c", 5}}, batches).is_ok());
  const RunOutput r = run_bench(kQuick + "--dim 8 --modes cpu,cached --cache-fraction 1 --trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("has 4 batches, fewer than the 6 the run uses: they are cycled"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3 table(s) (trace " + trace), std::string::npos) << r.output;
}

// ---- a Criteo TSV file: each value keyed into its table's rows ----

TEST(BenchSources, CriteoTsvReplaysWithTheDocumentedKeyMapping) {
  // 100 lines; column C(t+1) holds value 16 * line + t, and C3 is empty on every other line.
  std::string text;
  for (int line = 0; line < 100; ++line) {
    text += std::to_string(line % 2);
    for (int i = 0; i < 13; ++i) text += "\t" + std::to_string(i);
    for (int t = 0; t < 26; ++t) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%x", 16 * line + t);
      text += "\t" + (t == 2 && line % 2 ? std::string() : std::string(hex));
    }
    text += "\n";
  }
  const std::string tsv = write_temp("day.tsv", text);
  const std::string trace = temp_dir() + "/criteo.strtrace";
  const json j = run_json(kQuick +
                              "--dim 8 --tables criteo:50000 --batch 10 --modes cpu,cached --cache-fraction 1 "
                              "--criteo " +
                              tsv + " --dump-trace " + trace,
                          "criteo");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["workload"]["source"]["kind"], "criteo");
  EXPECT_EQ(j["workload"]["source"]["batches"], 6);  // 2 x (warmup + steps) of the 10 in the file
  EXPECT_DOUBLE_EQ(j["workload"]["samples_per_step"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["workload"]["keys_per_step"].get<double>(), 10.0 * 26 - 5);
  EXPECT_TRUE(mode(j, "cached")["hit_rate"].is_number());
  // The batches the run used, as a trace: every key is criteo_key of its value.
  auto read = strata::bench::read_trace(trace);
  ASSERT_TRUE(read.is_ok()) << read.status().to_string();
  ASSERT_EQ(read->batches.size(), 6u);
  ASSERT_EQ(read->tables.size(), 26u);
  for (std::size_t b = 0; b < 6; ++b)
    for (int t = 0; t < 26; ++t) {
      const strata::JaggedKeys& f = read->batches[b].features[static_cast<std::size_t>(t)];
      ASSERT_EQ(f.table, "C" + std::to_string(t + 1));
      std::size_t k = 0;
      for (int s = 0; s < 10; ++s) {
        const int line = static_cast<int>(b) * 10 + s;
        if (t == 2 && line % 2) continue;
        ASSERT_LT(k, f.keys.size());
        EXPECT_EQ(f.keys[k++], strata::bench::criteo_key(static_cast<std::uint32_t>(16 * line + t), t,
                                                         read->tables[static_cast<std::size_t>(t)].rows));
      }
      EXPECT_EQ(k, f.keys.size());
    }
}

// ---- --config: a store config as given, next to the uniform modes ----

const std::string kMixed = R"({"threads": 1, "cache": {"policy": "lfu"},
 "tables": [{"name": "a", "rows": 20000, "dim": 16, "placement": "cached", "cache": {"rows": 3000},
             "optimizer": {"kind": "adagrad"}},
            {"name": "b", "rows": 3000, "dim": 16, "placement": "gpu"},
            {"name": "c", "rows": 500, "dim": 8, "placement": "cpu"}]})";
const std::string kMixedTables = " --tables a=20000x16,b=3000x16,c=500x8 --batch 64 --pooling 4 --dist zipf:1.05 ";

TEST(BenchSources, AMixedConfigRunsAsGivenNextToTheUniformModes) {
  const std::string config = write_temp("mixed.json", kMixed);
  const json j =
      run_json(kQuick + kMixedTables + "--modes cpu,cached --cache-fraction 0.5 --config " + config, "mixed");
  ASSERT_FALSE(j.empty());
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["settings"]["config"], config);
  const json& m = mode(j, "mixed");
  EXPECT_EQ(m["config"]["file"], config);
  ASSERT_EQ(m["config"]["tables"].size(), 3u);
  EXPECT_EQ(m["config"]["tables"][0]["placement"], "cached");
  EXPECT_EQ(m["config"]["tables"][0]["cache_rows"], 3000);
  EXPECT_EQ(m["config"]["tables"][1]["placement"], "gpu");
  EXPECT_EQ(m["config"]["tables"][2]["placement"], "cpu");
  EXPECT_EQ(m["cache"]["policy"], "lfu");  // the config's, not --policy's
  EXPECT_EQ(m["cache"]["cache_rows"], 3000);
  EXPECT_TRUE(m["cache"]["cache_fraction"].is_null());
  EXPECT_TRUE(m["hit_rate"].is_number());
  EXPECT_GT(m["cache"]["accesses"].get<double>(), 0);
  // Only the uniform cached mode's cache holds every table.
  EXPECT_LT(m["cache"]["accesses"].get<double>(), mode(j, "cached")["cache"]["accesses"].get<double>());
  // Adagrad state in the cached table's records: 16 + 16 floats.
  EXPECT_DOUBLE_EQ(m["cache"]["cache_bytes"].get<double>(), 3000.0 * 32 * 4);

  // --modes '' runs the config alone; without table flags the workload's tables are the config's.
  const json alone = run_json(kQuick + "--batch 64 --pooling 4 --modes '' --config " + config, "alone");
  ASSERT_EQ(alone["results"].size(), 1u);
  EXPECT_EQ(alone["results"][0]["mode"], "mixed");
  EXPECT_EQ(alone["workload"]["table_set"], "config " + config);
  EXPECT_EQ(alone["workload"]["tables"].size(), 3u);
}

TEST(BenchSources, APlanWrittenByStrataTuneRunsAsAConfig) {
  const std::string plan = temp_dir() + "/plan.json";
  const RunOutput t = strata::testing::run_program(
      std::string(STRATA_TUNE_BIN) +
      " plan --workload '{\"tables\":\"a=20000x16,b=3000x16,c=500x8\",\"batch\":64,\"bag_size\":4,"
      "\"dist\":\"zipf:1.05\",\"distinct_batches\":4}' --hbm-budget 1MB --host-budget 1GB --out " +
      plan);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const json j = run_json(kQuick + kMixedTables + "--modes '' --config " + plan, "plan");
  ASSERT_FALSE(j.empty());
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0]["mode"], "plan");
  EXPECT_EQ(j["results"][0]["config"]["tables"].size(), 3u);
  EXPECT_GT(j["results"][0]["train_lookups_per_s"].get<double>(), 0);
}

// ---- several features per table: --tables TABLE=FEATURE+..., or a config's features lists ----

// Features clicked and bought (used by one table in the runs below) with keys both use in a batch,
// and user; `merged`: the same keys with clicked's and bought's bags joined in one feature "item".
std::string write_feature_trace(const std::string& name, bool merged) {
  std::vector<strata::KeyBatch> batches;
  for (int i = 0; i < 12; ++i) {
    const strata::Key a = (13 * i) % 24, b = (7 * i + 1) % 24, c = (5 * i) % 16;
    strata::KeyBatch kb;
    if (merged) {
      kb.features.push_back({"item", {0, 3, 6}, {a, b, b, c, a, (a + 1) % 24}, {}});
    } else {
      kb.features.push_back({"clicked", {0, 2, 3}, {a, b, c}, {}});
      kb.features.push_back({"bought", {0, 1, 3}, {b, a, (a + 1) % 24}, {}});
    }
    kb.features.push_back({"user", {0, 1, 2}, {i % 50, 3}, {}});
    batches.push_back(std::move(kb));
  }
  const std::string path = temp_dir() + "/" + name;
  const std::vector<strata::bench::TraceTable> features =
      merged ? std::vector<strata::bench::TraceTable>{{"item", 400}, {"user", 50}}
             : std::vector<strata::bench::TraceTable>{{"clicked", 400}, {"bought", 300}, {"user", 50}};
  EXPECT_TRUE(strata::bench::write_trace(path, features, batches).is_ok());
  return path;
}

// Two features on one table are one table to the store and to strata-bench's counts: the cache sees
// the rows of both, deduplicated per batch, exactly as one feature holding both bags.
TEST(BenchSources, TwoFeaturesOfATableShareItsRowsAndCache) {
  const std::string two = write_feature_trace("two_features.strtrace", false);
  const std::string one = write_feature_trace("one_feature.strtrace", true);
  const std::string common = kQuick + "--dim 8 --modes cpu,cached --cache-fraction 0.02 ";
  const json j = run_json(common + "--trace " + two + " --tables item=clicked+bought", "two_features");
  const json k = run_json(common + "--trace " + one, "one_feature");
  ASSERT_FALSE(j.empty());
  ASSERT_FALSE(k.empty());
  EXPECT_EQ(j["workload"]["tables"], k["workload"]["tables"]);  // item (400 rows, the most of its features), user
  for (const char* c : {"accesses", "hits", "misses", "evictions"})
    EXPECT_EQ(mode(j, "cached")["cache"][c], mode(k, "cached")["cache"][c]) << c;
  EXPECT_GT(mode(j, "cached")["cache"]["hits"].get<double>(), 0);
  // The cpu optimizer updates each row of the table once a batch, over both features; the host
  // pools the two features from the table's unpooled rows: every key's fp32 row (6 keys of dim 8).
  const json& two_cpu = mode(j, "cpu")["cpu_kernel_bytes_per_step"];
  const json& one_cpu = mode(k, "cpu")["cpu_kernel_bytes_per_step"];
  EXPECT_EQ(two_cpu["host_write"], one_cpu["host_write"]);
  EXPECT_EQ(two_cpu["host_read"].get<double>(), one_cpu["host_read"].get<double>() + 6 * 8 * 4.0);
  // A config's features lists are the mapping; the mapping must be the config's.
  const std::string config = write_temp("features.json", R"({"threads": 1, "tables": [
 {"name": "item", "rows": 400, "dim": 8, "features": ["clicked", "bought"], "placement": "cached",
  "cache": {"rows": 8}},
 {"name": "user", "rows": 50, "dim": 8, "placement": "cpu"}]})");
  const json c = run_json(kQuick + "--modes '' --trace " + two + " --config " + config, "features_config");
  ASSERT_FALSE(c.empty());
  EXPECT_GT(c["results"][0]["cache"]["accesses"].get<double>(), 0);
  expect_refused(kQuick + "--modes '' --trace " + two + " --tables item=clicked,bought=bought --config " + config,
                 "table 'item' is looked up by features clicked, bought in the config but by features clicked");
  expect_refused(kQuick + "--modes '' --tables item=400x8,user=50x8 --config " + config,
                 "table 'item' is looked up by features clicked, bought in the config but by its own name");
}

TEST(BenchSources, CriteoColumnsMappedToOneTableKeyAValueToOneRow) {
  // 20 lines; C1 and C2 hold the same value on each line.
  std::string text;
  for (int line = 0; line < 20; ++line) {
    text += "1";
    for (int i = 0; i < 13; ++i) text += "\t" + std::to_string(i);
    for (int t = 0; t < 26; ++t) text += "\t" + std::to_string(100 + (t < 2 ? 0 : t) + 7 * line);
    text += "\n";
  }
  const std::string tsv = write_temp("pair.tsv", text), trace = temp_dir() + "/pair.strtrace";
  const json j = run_json(kQuick + "--dim 8 --tables pair=C2+C1 --criteo-rows 50000 --batch 5 --modes cpu --criteo " +
                              tsv + " --dump-trace " + trace,
                          "criteo_pair");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["workload"]["tables"].size(), 25u);
  auto read = strata::bench::read_trace(trace);
  ASSERT_TRUE(read.is_ok()) << read.status().to_string();
  ASSERT_EQ(read->tables.size(), 26u);  // the features, each with its table's rows
  EXPECT_EQ(read->tables[0].rows, read->tables[1].rows);
  for (const strata::KeyBatch& b : read->batches) EXPECT_EQ(b.features[0].keys, b.features[1].keys);
  expect_refused(kQuick + "--tables pair=C2+C27 --batch 5 --modes cpu --criteo " + tsv,
                 "table 'pair': feature 'C27' is not in a Criteo file (its columns: C1..C26");
}

TEST(BenchSources, BadFeatureMappingsAreRefused) {
  const std::string two = write_feature_trace("bad_features.strtrace", false);
  const std::string base = kQuick + "--dim 8 --modes cpu --trace " + two + " --tables ";
  expect_refused(base + "item=clicked,item=bought", "--tables: item 2 'item=bought': table 'item' is listed twice");
  expect_refused(base + "item=clicked+bought,x=bought",
                 "feature 'bought' is mapped to table 'item' and to table 'x' (expected one table per feature)");
  expect_refused(base + "item=clicked+boughtt",
                 "table 'item': feature 'boughtt' is not in trace " + two + " (its features: clicked, bought, user)");
  expect_refused(base + "user=clicked", "table 'user' is listed twice: in the mapping and as feature 'user'");
  expect_refused(base + "3", "other --tables, --rows and --workload do not apply");
  expect_refused(kQuick + "--modes cpu --tables item=clicked+bought",
                 "a mapping of features to tables (TABLE=FEATURE[+FEATURE...]) applies to --trace and --criteo");
}

// ---- bad input: one line, non-zero exit, before the long work ----

TEST(BenchSources, ConfigsThatDoNotMatchTheWorkloadAreRefused) {
  const std::string config = write_temp("match.json", kMixed);
  const std::string base = kQuick + "--batch 64 --modes cpu --config " + config;
  expect_refused(base + " --tables a=20000x16,b=3000x16,c=500x16",
                 "--config " + config + ": table 'c' has dim 8 in the config but 16 in the workload");
  expect_refused(base + " --tables a=2000x16,b=3000x16,c=500x8",
                 "table 'a' has 20000 rows in the config but 2000 in the workload");
  expect_refused(base + " --tables a=20000x16,b=3000x16",
                 "table 'c' of the config is not in the workload (its tables: a, b)");
  expect_refused(base + " --tables a=20000x16,b=3000x16,c=500x8,d=5",
                 "table 'd' of the workload is not in the config (its tables: a, b, c)");
  expect_refused(kQuick + "--modes cpu --config " + write_temp("notjson.json", "{\"tables\": ["),
                 "--config " + temp_dir() + "/notjson.json: ");
  expect_refused(kQuick + "--modes cpu --config " + write_temp("typo.json", R"({"tables": [], "thread": 2})"),
                 "thread");
  expect_refused(kQuick + "--modes cpu --config " + temp_dir() + "/missing.json", "missing.json");
  expect_refused(kQuick + "--modes '' --tables 3", "--modes is empty");
}

TEST(BenchSources, BadTracesAreRefused) {
  std::vector<strata::KeyBatch> batches(10);
  for (int i = 0; i < 10; ++i) batches[static_cast<std::size_t>(i)].features.push_back({"a", {0, 2}, {i, 3}, {}});
  const std::string good = temp_dir() + "/good.strtrace";
  ASSERT_TRUE(strata::bench::write_trace(good, {{"a", 100}}, batches).is_ok());
  const std::string text = read_file(good);
  const std::string args = kQuick + "--dim 8 --modes cpu --trace ";

  const std::string empty = temp_dir() + "/empty.strtrace";
  ASSERT_TRUE(strata::bench::write_trace(empty, {{"a", 100}}, {}).is_ok());
  expect_refused(args + empty, "trace " + empty + " has no batches");
  const std::string truncated = write_temp("truncated.strtrace", text.substr(0, text.size() - 7));
  expect_refused(args + truncated, truncated);
  std::string flipped = text;
  flipped[flipped.size() / 2] ^= 0x40;
  const std::string corrupt = write_temp("corrupt.strtrace", flipped);
  expect_refused(args + corrupt, corrupt);
  expect_refused(args + write_temp("junk.strtrace", "not a trace at all"), "junk.strtrace");
  expect_refused(args + temp_dir() + "/missing.strtrace", "missing.strtrace");
  const std::string no_keys = temp_dir() + "/nokeys.strtrace";
  std::vector<strata::KeyBatch> empty_bags(4);
  for (auto& b : empty_bags) b.features.push_back({"a", {0, 0, 0}, {}, {}});
  ASSERT_TRUE(strata::bench::write_trace(no_keys, {{"a", 100}}, empty_bags).is_ok());
  expect_refused(args + no_keys, "trace " + no_keys + " has no keys in its first 4 batches");
  // Shorter than one phase (warmup + steps): refused; up to two phases: cycled (above).
  expect_refused(kQuick + "--dim 8 --modes cpu --steps 9 --warmup 2 --trace " + good,
                 "trace " + good + " has 10 batches but --warmup 2 + --steps 9 need at least 11");
  expect_refused(args + good + " --tables 3", "--tables, --rows and --workload do not apply");
  expect_refused(args + good + " --dump-keys " + temp_dir() + "/k.bin", "with --trace or --criteo use --dump-trace");
  expect_refused(args + good + " --criteo " + good, "give --trace or --criteo, not both");
}

TEST(BenchSources, BadCriteoFilesAreRefused) {
  std::string line = "1";
  for (int i = 0; i < 13; ++i) line += "\t5";
  for (int t = 0; t < 26; ++t) line += "\tab12";
  std::string text;
  for (int i = 0; i < 30; ++i) text += line + "\n";
  const std::string args = kQuick + "--batch 4 --modes cpu --tables criteo:50000 --criteo ";
  expect_refused(args + write_temp("empty.tsv", ""), "has no samples");
  const std::string short_line = write_temp("short.tsv", line + "\n1\t2\t3\n" + text);
  expect_refused(args + short_line, "line 2: 3 tab-separated fields (expected 40");
  std::string bad = text;
  bad.replace(bad.find("ab12"), 4, "xyz!");
  expect_refused(args + write_temp("badhex.tsv", bad), "xyz!");
  expect_refused(args + temp_dir() + "/missing.tsv", "missing.tsv");
  expect_refused(kQuick + "--batch 4 --modes cpu --tables 3 --criteo " + write_temp("ok.tsv", text),
                 "the table set has 3 tables (expected 26");
  expect_refused(kQuick + "--batch 20 --modes cpu --tables criteo:50000 --criteo " + temp_dir() + "/ok.tsv",
                 "has 2 batches but --warmup 1 + --steps 2 need at least 3");
}

}  // namespace
