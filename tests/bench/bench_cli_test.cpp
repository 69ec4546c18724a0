// Runs the built strata-bench (STRATA_BENCH_BIN) as a user would: a tiny heterogeneous workload
// through every mode with a cache sweep, whose --json output is checked against a schema (required
// keys and their types) and whose --html report must hold exactly one chart per chart section;
// and bad input, which must fail with a clear message and a non-zero exit before any long work
// (the read-bandwidth probe, the first long step, has not started).

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "tests/bench/run_program.hpp"

namespace {

using nlohmann::json;

using strata::testing::read_file;
using strata::testing::RunOutput;

RunOutput run_bench(const std::string& args) {
  return strata::testing::run_program(std::string(STRATA_BENCH_BIN) + " --no-progress " + args);
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

std::string temp_dir() {
  static const std::string dir = strata::testing::scratch_dir("strata_bench_cli");
  return dir;
}

// ---- a hand-written schema: required keys and their types ----

enum class Type { kString, kNumber, kInteger, kBool, kObject, kArray, kNumberOrNull, kStringOrNull };

const char* type_name(Type t) {
  switch (t) {
    case Type::kString:
      return "string";
    case Type::kNumber:
      return "number";
    case Type::kInteger:
      return "integer";
    case Type::kBool:
      return "boolean";
    case Type::kObject:
      return "object";
    case Type::kArray:
      return "array";
    case Type::kNumberOrNull:
      return "number or null";
    case Type::kStringOrNull:
      return "string or null";
  }
  return "?";
}

bool has_type(const json& v, Type t) {
  switch (t) {
    case Type::kString:
      return v.is_string();
    case Type::kNumber:
      return v.is_number();
    case Type::kInteger:
      return v.is_number_integer();
    case Type::kBool:
      return v.is_boolean();
    case Type::kObject:
      return v.is_object();
    case Type::kArray:
      return v.is_array();
    case Type::kNumberOrNull:
      return v.is_number() || v.is_null();
    case Type::kStringOrNull:
      return v.is_string() || v.is_null();
  }
  return false;
}

struct Field {
  const char* pointer;  // JSON pointer relative to the checked object
  Type type;
};

// Every field of `schema` present in `doc` with its type; returns what is wrong ("" if nothing).
std::string check(const json& doc, const std::vector<Field>& schema, const std::string& where) {
  std::string errors;
  for (const Field& f : schema) {
    const json::json_pointer ptr(f.pointer);
    if (!doc.contains(ptr)) {
      errors += where + f.pointer + ": missing\n";
    } else if (!has_type(doc.at(ptr), f.type)) {
      errors += where + f.pointer + ": expected " + type_name(f.type) + ", got " + doc.at(ptr).dump() + "\n";
    }
  }
  return errors;
}

const std::vector<Field> kTopLevel = {
    {"/tool", Type::kString},
    {"/version", Type::kString},
    {"/command", Type::kArray},
    {"/started_at", Type::kString},
    {"/wall_s", Type::kNumber},
    {"/threads", Type::kInteger},
    {"/workload", Type::kObject},
    {"/settings", Type::kObject},
    {"/machine", Type::kObject},
    {"/read_bandwidth_gbs", Type::kNumber},
    {"/memory_estimate", Type::kObject},
    {"/profile", Type::kObject},
    {"/results", Type::kArray},
    {"/sweep", Type::kArray},
};

const std::vector<Field> kWorkload = {
    {"/tables", Type::kArray},          {"/tables/0/name", Type::kString}, {"/tables/0/rows", Type::kInteger},
    {"/tables/0/dim", Type::kInteger},  {"/table_set", Type::kString},     {"/total_rows", Type::kInteger},
    {"/batch", Type::kInteger},         {"/bag_size", Type::kInteger},     {"/bag_dist", Type::kString},
    {"/dist", Type::kString},           {"/seed", Type::kInteger},         {"/distinct_batches", Type::kInteger},
    {"/pooling_mode", Type::kString},   {"/optimizer", Type::kString},     {"/steps", Type::kInteger},
    {"/warmup", Type::kInteger},        {"/keys_per_step", Type::kNumber}, {"/samples_per_step", Type::kNumber},
    {"/dtype", Type::kString},          {"/state_dtype", Type::kString},   {"/output_dtype", Type::kString},
    {"/tables/0/dtype", Type::kString},
};

const std::vector<Field> kSettings = {
    {"/modes", Type::kString},
    {"/policy", Type::kString},
    {"/lookahead", Type::kInteger},
    {"/preview", Type::kInteger},
    {"/pipeline", Type::kInteger},
    {"/cache_fraction", Type::kNumber},
    {"/planner_partitions", Type::kInteger},
    {"/sweep_cache", Type::kArray},
    {"/backend", Type::kString},
    {"/device_capacity", Type::kInteger},
    {"/profile", Type::kString},
};

const std::vector<Field> kMachine = {
    {"/cpu_model", Type::kString},
    {"/cores", Type::kInteger},
    {"/memory_total_bytes", Type::kInteger},
    {"/memory_available_bytes", Type::kInteger},
    {"/numa_nodes", Type::kInteger},
    {"/gpus", Type::kArray},
    {"/topology", Type::kString},
    {"/os", Type::kString},
    {"/kernel", Type::kString},
    {"/compiler", Type::kString},
    {"/versions", Type::kString},
    {"/cuda_devices", Type::kInteger},
    {"/cuda_backend_built", Type::kBool},
    {"/gather_limit", Type::kArray},
    {"/update_floor", Type::kArray},
};

// Every entry of machine.gather_limit.
const std::vector<Field> kGatherLimit = {
    {"/dim", Type::kInteger},
    {"/row_bytes", Type::kInteger},
    {"/keys", Type::kString},
    {"/table_rows", Type::kInteger},
    {"/table_bytes", Type::kInteger},
    {"/folded", Type::kBool},
    {"/threads", Type::kInteger},
    {"/passes", Type::kInteger},
    {"/statistic", Type::kString},
    {"/prefetch_distance", Type::kInteger},
    {"/lookups_per_s", Type::kNumber},
    {"/gb_per_s", Type::kNumber},
    {"/best_lookups_per_s", Type::kNumber},
};

// Every entry of machine.update_floor.
const std::vector<Field> kUpdateFloor = {
    {"/dim", Type::kInteger},
    {"/record_bytes", Type::kInteger},
    {"/table_rows", Type::kInteger},
    {"/table_bytes", Type::kInteger},
    {"/threads", Type::kInteger},
    {"/passes", Type::kInteger},
    {"/statistic", Type::kString},
    {"/prefetch_distance", Type::kInteger},
    {"/distinct_rows_per_batch", Type::kNumber},
    {"/rows_per_s", Type::kNumber},
    {"/gb_per_s", Type::kNumber},
    {"/best_rows_per_s", Type::kNumber},
};

const std::vector<Field> kMemoryEstimate = {
    {"/host_bytes", Type::kNumber},    {"/tables_bytes", Type::kNumber},    {"/device_bytes", Type::kNumber},
    {"/batches_bytes", Type::kNumber}, {"/available_bytes", Type::kNumber}, {"/worst_mode", Type::kString},
};

// Fields of every mode result and of every sweep point that ran.
const std::vector<Field> kResult = {
    {"/mode", Type::kString},
    {"/description", Type::kString},
    {"/forward_lookups_per_s", Type::kNumber},
    {"/forward_samples_per_s", Type::kNumber},
    {"/train_lookups_per_s", Type::kNumber},
    {"/samples_per_s", Type::kNumber},
    {"/forward_step_ms_p50", Type::kNumber},
    {"/forward_step_ms_p99", Type::kNumber},
    {"/train_step_ms_p50", Type::kNumber},
    {"/train_step_ms_p99", Type::kNumber},
    {"/timed_steps", Type::kInteger},
    {"/forward_step_ms_max", Type::kNumber},
    {"/train_step_ms_max", Type::kNumber},
    {"/gather_gbs", Type::kNumber},
    {"/gather_fraction_of_read_bandwidth", Type::kNumber},
    {"/gather_limit_lookups_per_s", Type::kNumberOrNull},
    {"/forward_fraction_of_gather_limit", Type::kNumberOrNull},
    {"/train_step_floor_ms", Type::kNumberOrNull},
    {"/train_fraction_of_step_floor", Type::kNumberOrNull},
    {"/setup_s", Type::kNumber},
    {"/train_phase_ms_p50/submit", Type::kNumber},
    {"/train_phase_ms_p50/forward", Type::kNumber},
    {"/train_phase_ms_p50/backward", Type::kNumber},
    {"/bytes_per_step/hbm_read", Type::kNumber},
    {"/bytes_per_step/hbm_write", Type::kNumber},
    {"/bytes_per_step/h2d", Type::kNumber},
    {"/bytes_per_step/d2h", Type::kNumber},
    {"/bytes_per_step/host_read", Type::kNumber},
    {"/bytes_per_step/host_write", Type::kNumber},
    {"/bytes_per_step/host_read_per_node", Type::kArray},
    {"/bytes_per_step/host_write_per_node", Type::kArray},
    {"/bytes_per_step/all_to_all", Type::kNumber},
    {"/hit_rate", Type::kNumberOrNull},
    {"/device", Type::kString},
    {"/device_peak_bytes", Type::kInteger},
    {"/numa/memory_node", Type::kInteger},
    {"/numa/thread_node", Type::kInteger},
    {"/numa/pinned_node", Type::kInteger},
    {"/numa/note", Type::kString},
    {"/numa_engines", Type::kArray},
    {"/numa_tables", Type::kArray},
    {"/peak_host_bytes", Type::kInteger},
    {"/peak_host_scope", Type::kString},
    {"/host_rss_start_bytes", Type::kInteger},
    {"/host_table_bytes", Type::kNumber},
    {"/modelled/profile", Type::kString},
    {"/modelled/step_ms", Type::kNumber},
    {"/modelled/serial_ms", Type::kNumber},
    {"/modelled/link_ms/hbm", Type::kNumber},
    {"/modelled/link_ms/pcie_h2d", Type::kNumber},
    {"/modelled/link_ms/pcie_d2h", Type::kNumber},
    {"/modelled/link_ms/host_dram", Type::kNumber},
    {"/modelled/link_ms/all_to_all", Type::kNumber},
    {"/modelled/bottleneck", Type::kString},
    {"/modelled/explanation", Type::kString},
};

// Each entry of a result's numa_engines and numa_tables.
const std::vector<Field> kNumaEngine = {
    {"/engine", Type::kString},       {"/memory_node", Type::kInteger}, {"/thread_node", Type::kInteger},
    {"/pinned_node", Type::kInteger}, {"/note", Type::kString},
};
const std::vector<Field> kNumaTable = {
    {"/table", Type::kString},
    {"/placement", Type::kString},
    {"/engine", Type::kString},
    {"/memory_node", Type::kInteger},
    {"/thread_node", Type::kInteger},
    {"/pages/sampled", Type::kInteger},
    {"/pages/unfaulted", Type::kInteger},
    {"/pages/nodes", Type::kArray},
    {"/pages/note", Type::kString},
};

// A result's numa_engines (their names) and numa_tables ("table placement engine" of each), checked against
// the schema, and each table's sampled pages all on node 0 (this machine's one node) where the kernel told.
std::pair<std::vector<std::string>, std::vector<std::string>> numa_of(const json& r, const std::string& where) {
  std::vector<std::string> engines, tables;
  for (const json& e : r["numa_engines"]) {
    EXPECT_EQ(check(e, kNumaEngine, where + "/numa_engines/" + std::to_string(engines.size())), "");
    engines.push_back(e.value("engine", "?"));
  }
  for (const json& t : r["numa_tables"]) {
    EXPECT_EQ(check(t, kNumaTable, where + "/numa_tables/" + std::to_string(tables.size())), "");
    tables.push_back(t.value("table", "?") + " " + t.value("placement", "?") + " " + t.value("engine", "?"));
    const json& p = t["pages"];
    if (!p.value("note", "").empty()) continue;  // no NUMA support in this kernel or container
    EXPECT_GT(p.value("sampled", 0), 0) << t.dump();
    EXPECT_EQ(p.value("unfaulted", -1), 0) << t.dump();
    EXPECT_EQ(p["nodes"], json::array({{{"node", 0}, {"pages", p.value("sampled", 0)}}})) << t.dump();
  }
  return {engines, tables};
}

const std::vector<Field> kCache = {
    {"/accesses", Type::kInteger},           {"/hits", Type::kInteger},       {"/misses", Type::kInteger},
    {"/evictions", Type::kInteger},          {"/writebacks", Type::kInteger}, {"/policy", Type::kString},
    {"/lookahead", Type::kInteger},          {"/preview", Type::kInteger},    {"/cache_fraction", Type::kNumber},
    {"/planner_partitions", Type::kInteger}, {"/cache_rows", Type::kInteger}, {"/cache_bytes", Type::kNumber},
};

// A tiny heterogeneous workload (two dims: two slot pools) through every mode, with a sweep whose
// smallest point cannot hold a batch (skipped) and whose 0.5 point is the cached run itself.
constexpr const char* kTinyArgs =
    "--tables a=2000x8,b=3000x16,c=1x8 --batch 64 --pooling 2 --dist zipf:0.9 --steps 3 --warmup 1 --threads 2 "
    "--read-probe-mib 8 --backend emu --cache-fraction 0.5 --sweep-cache 0.001,0.5,1";

class BenchRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = temp_dir();
    run_ =
        new RunOutput(run_bench(std::string(kTinyArgs) + " --json " + dir + "/out.json --html " + dir + "/out.html"));
    json_text_ = new std::string(read_file(dir + "/out.json"));
    html_ = new std::string(read_file(dir + "/out.html"));
  }
  static void TearDownTestSuite() {
    delete run_;
    delete json_text_;
    delete html_;
  }
  static RunOutput* run_;
  static std::string* json_text_;
  static std::string* html_;
};
RunOutput* BenchRun::run_ = nullptr;
std::string* BenchRun::json_text_ = nullptr;
std::string* BenchRun::html_ = nullptr;

TEST_F(BenchRun, Succeeds) {
  ASSERT_EQ(run_->exit_code, 0) << run_->output;
  // The console has every table and the sweep.
  for (const char* mode : {"cpu", "offload", "offload-cpu", "cached"})
    EXPECT_NE(run_->output.find(std::string("\n") + mode + " "), std::string::npos) << mode;
  EXPECT_NE(run_->output.find("peak RSS"), std::string::npos);
  EXPECT_NE(run_->output.find("cache sweep"), std::string::npos);
  EXPECT_NE(run_->output.find("skipped: cache fraction 0.001"), std::string::npos);
  EXPECT_NE(run_->output.find("gather limit, dim 8 (32-byte rows, workload keys, table of 2001 rows"),
            std::string::npos);
  EXPECT_NE(run_->output.find("gather limit, dim 16 (64-byte rows, uniform keys"), std::string::npos);
  EXPECT_NE(run_->output.find("\ncpu          forward at "), std::string::npos) << run_->output;
  EXPECT_NE(run_->output.find("% of the gather limit ("), std::string::npos);
  EXPECT_NE(run_->output.find("% of the uniform-random-row limit"), std::string::npos);
}

TEST_F(BenchRun, JsonMatchesTheSchema) {
  ASSERT_EQ(run_->exit_code, 0) << run_->output;
  const json j = json::parse(*json_text_, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << json_text_->substr(0, 200);
  EXPECT_EQ(check(j, kTopLevel, ""), "");
  EXPECT_EQ(check(j["workload"], kWorkload, "/workload"), "");
  EXPECT_EQ(check(j["settings"], kSettings, "/settings"), "");
  EXPECT_EQ(check(j["machine"], kMachine, "/machine"), "");
  EXPECT_EQ(check(j["memory_estimate"], kMemoryEstimate, "/memory_estimate"), "");
  EXPECT_EQ(check(j["profile"], {{"/name", Type::kString}}, "/profile"), "");
  EXPECT_EQ(j["tool"], "strata-bench");

  // The gather limit: for each dim (8: tables a and c end to end, 16: table b) the workload's
  // keys and, the workload being skewed, uniform random rows; each a positive rate.
  const json& limits = j["machine"]["gather_limit"];
  ASSERT_EQ(limits.size(), 4u) << limits.dump();
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const json& g = limits[i];
    EXPECT_EQ(check(g, kGatherLimit, "/machine/gather_limit/" + std::to_string(i)), "");
    const int dim = i < 2 ? 8 : 16;
    EXPECT_EQ(g["dim"], dim);
    EXPECT_EQ(g["row_bytes"], 4 * dim);
    EXPECT_EQ(g["keys"], i % 2 == 0 ? "workload" : "uniform");
    EXPECT_EQ(g["table_rows"], dim == 8 ? 2001 : 3000);
    EXPECT_EQ(g["threads"], 2);
    EXPECT_EQ(g["statistic"], "median");
    EXPECT_GT(g["lookups_per_s"].get<double>(), 0.0);
    EXPECT_NEAR(g["gb_per_s"].get<double>(), g["lookups_per_s"].get<double>() * 4 * dim / 1e9,
                1e-9 * g["gb_per_s"].get<double>());
  }
  EXPECT_EQ(j["gather_probe"]["ran"], true);
  EXPECT_GT(j["gather_probe"]["step_limit_lookups_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["gather_probe"]["step_uniform_limit_lookups_per_s"].get<double>(), 0.0);

  // The update floor: for each dim the distinct rows of the workload's batches, each record (sgd:
  // the row alone) read and written once; the step floor adds the gather and update times.
  const json& floors = j["machine"]["update_floor"];
  ASSERT_EQ(floors.size(), 2u) << floors.dump();
  double floor_s = 0;
  for (std::size_t i = 0; i < floors.size(); ++i) {
    const json& u = floors[i];
    EXPECT_EQ(check(u, kUpdateFloor, "/machine/update_floor/" + std::to_string(i)), "");
    const int dim = i == 0 ? 8 : 16;
    EXPECT_EQ(u["dim"], dim);
    EXPECT_EQ(u["record_bytes"], 4 * dim);
    EXPECT_EQ(u["table_rows"], dim == 8 ? 2001 : 3000);
    // Bags of 2 keys, 64 samples: tables a and c (dim 8) give at most 2 x 64 x 2 distinct rows.
    EXPECT_GT(u["distinct_rows_per_batch"].get<double>(), 0.0);
    EXPECT_LE(u["distinct_rows_per_batch"].get<double>(), dim == 8 ? 256.0 : 128.0);
    EXPECT_GT(u["rows_per_s"].get<double>(), 0.0);
    EXPECT_GE(u["best_rows_per_s"].get<double>(), u["rows_per_s"].get<double>());
    floor_s += u["distinct_rows_per_batch"].get<double>() / u["rows_per_s"].get<double>();
  }
  floor_s += 3 * 64 * 2 / j["gather_probe"]["step_limit_lookups_per_s"].get<double>();
  ASSERT_TRUE(j["gather_probe"]["step_floor_ms"].is_number());
  EXPECT_NEAR(j["gather_probe"]["step_floor_ms"].get<double>(), floor_s * 1e3, 1e-9 * floor_s * 1e3);

  // The workload as given: three tables of their own rows and dims.
  const json& tables = j["workload"]["tables"];
  ASSERT_EQ(tables.size(), 3u);
  EXPECT_EQ(tables[1], json({{"name", "b"}, {"rows", 3000}, {"dim", 16}, {"dtype", "fp32"}}));
  EXPECT_EQ(j["workload"]["total_rows"], 5001);
  EXPECT_EQ(j["workload"]["keys_per_step"], 3 * 64 * 2);

  // One result per mode, in order, each with every field.
  ASSERT_EQ(j["results"].size(), 6u);
  const std::vector<std::string> modes = {"cpu", "offload", "offload-cpu", "cached", "gpu", "hybrid"};
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const json& r = j["results"][i];
    EXPECT_EQ(r["mode"], modes[i]);
    EXPECT_EQ(check(r, kResult, "/results/" + std::to_string(i)), "");
    EXPECT_EQ(check(r, {{"/forward_step_s", Type::kArray}, {"/train_step_s", Type::kArray}}, "/results/" + modes[i]),
              "");
    EXPECT_EQ(r["train_step_s"].size(), 3u);
    // Forward as a fraction of the step's gather limit (one rank: every mode has one).
    ASSERT_TRUE(r["forward_fraction_of_gather_limit"].is_number()) << r.dump();
    EXPECT_GT(r["forward_fraction_of_gather_limit"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(r["gather_limit_lookups_per_s"].get<double>(),
                     j["gather_probe"]["step_limit_lookups_per_s"].get<double>());
    EXPECT_NEAR(r["forward_fraction_of_gather_limit"].get<double>(),
                r["forward_lookups_per_s"].get<double>() / r["gather_limit_lookups_per_s"].get<double>(), 1e-9);
    ASSERT_TRUE(r["train_fraction_of_step_floor"].is_number()) << r.dump();
    EXPECT_DOUBLE_EQ(r["train_step_floor_ms"].get<double>(), j["gather_probe"]["step_floor_ms"].get<double>());
    EXPECT_NEAR(r["train_fraction_of_step_floor"].get<double>(),
                r["train_step_floor_ms"].get<double>() / r["train_step_ms_p50"].get<double>(), 1e-9);
    ASSERT_TRUE(r["forward_fraction_of_uniform_gather_limit"].is_number());
    EXPECT_GT(r["forward_fraction_of_uniform_gather_limit"].get<double>(), 0.0);
    EXPECT_GT(r["peak_host_bytes"].get<double>(), 0);
    // Rows of every table, 4-byte floats, sgd (no state): 2000*8 + 3000*16 + 1*8 floats.
    EXPECT_EQ(r["host_table_bytes"].get<double>(), 4.0 * (2000 * 8 + 3000 * 16 + 8));
    // One engine per mode (hybrid on one rank: cached), and the tables whose rows it holds in host memory.
    const std::string engine = modes[i] == "offload-cpu" ? "offload" : modes[i] == "hybrid" ? "cached" : modes[i];
    const std::string placement = modes[i] == "offload-cpu" ? "offload" : modes[i];
    const auto [engines, host_tables] = numa_of(r, "/results/" + modes[i]);
    EXPECT_EQ(engines, std::vector<std::string>{engine});
    if (modes[i] == "gpu") {
      EXPECT_TRUE(host_tables.empty()) << r["numa_tables"].dump();  // rows in device memory
    } else {
      EXPECT_EQ(host_tables, (std::vector<std::string>{"a " + placement + " " + engine, "b " + placement + " " + engine,
                                                       "c " + placement + " " + engine}));
    }
    if (modes[i] == "cpu") {
      EXPECT_EQ(r["device"], "none");
      EXPECT_EQ(r["device_peak_bytes"], 0);
    } else {
      EXPECT_EQ(r["device"], "emu");
      EXPECT_GT(r["device_peak_bytes"].get<double>(), 0);
    }
    if (modes[i] == "cached" || modes[i] == "hybrid") {
      ASSERT_TRUE(r["hit_rate"].is_number());
      EXPECT_GE(r["hit_rate"].get<double>(), 0.0);
      EXPECT_LE(r["hit_rate"].get<double>(), 1.0);
      EXPECT_EQ(check(r["cache"], kCache, "/results/cached/cache"), "");
      // The slot pools (dim 8: a and c, dim 16: b) hold their tables' shares: at least the pool
      // of b (1500 rows x 16 floats x 4 bytes) is on the device.
      EXPECT_GE(r["device_peak_bytes"].get<double>(), 1500.0 * 16 * 4);
    } else {
      EXPECT_TRUE(r["hit_rate"].is_null());
    }
  }

  // The sweep: every fraction, sorted; the smallest skipped with the reason.
  const json& sweep = j["sweep"];
  ASSERT_EQ(sweep.size(), 3u);
  EXPECT_EQ(sweep[0]["cache_fraction"], 0.001);
  EXPECT_TRUE(sweep[0]["skipped"].is_string());
  EXPECT_TRUE(sweep[0]["hit_rate"].is_null());
  for (std::size_t i = 1; i < 3; ++i) {
    const json& p = sweep[i];
    EXPECT_TRUE(p["skipped"].is_null()) << p.dump();
    EXPECT_EQ(check(p, kResult, "/sweep/" + std::to_string(i)), "");
    EXPECT_EQ(
        check(p, {{"/cache_fraction", Type::kNumber}, {"/cache_rows", Type::kInteger}, {"/cache_bytes", Type::kNumber}},
              "/sweep/" + std::to_string(i)),
        "");
    EXPECT_TRUE(p["hit_rate"].is_number());
  }
  EXPECT_EQ(sweep[1]["cache_fraction"], 0.5);
  EXPECT_EQ(sweep[2]["cache_fraction"], 1.0);
  // A cache as large as the tables holds more than half of them.
  EXPECT_GT(sweep[2]["cache_rows"].get<std::int64_t>(), sweep[1]["cache_rows"].get<std::int64_t>());
  // Distinct rows the run touched: 8 batches (2 x (warmup + steps)) of 64 bags of 2 keys per table,
  // so at most 1024 per table plus the one row of c; a cache of every row holds them, 0.1% does not.
  ASSERT_TRUE(j["sweep_touched_rows"].is_number_integer()) << j.dump().substr(0, 300);
  EXPECT_GT(j["sweep_touched_rows"].get<std::int64_t>(), 2);
  EXPECT_LE(j["sweep_touched_rows"].get<std::int64_t>(), 2 * 1024 + 1);
  EXPECT_EQ(sweep[0]["holds_every_touched_row"], false);
  EXPECT_EQ(sweep[2]["holds_every_touched_row"], true);
  EXPECT_TRUE(sweep[1]["holds_every_touched_row"].is_boolean());
  // 3 timed steps: p50 <= p99 <= max, and the tail is the maximum.
  for (const auto& r : j["results"]) {
    EXPECT_EQ(r["timed_steps"], 3) << r["mode"];
    EXPECT_LE(r["train_step_ms_p50"].get<double>(), r["train_step_ms_max"].get<double>()) << r["mode"];
    EXPECT_EQ(r["train_step_ms_p99"], r["train_step_ms_max"]) << r["mode"];
    EXPECT_EQ(r["forward_step_ms_p99"], r["forward_step_ms_max"]) << r["mode"];
  }
}

// What the console must not let a reader take for what it is not: emulated device times, a
// "percentile" of 3 steps, and a cache size that holds every row the run touched.
TEST_F(BenchRun, ConsoleSaysWhatItsNumbersAre) {
  ASSERT_EQ(run_->exit_code, 0) << run_->output;
  const std::string& out = run_->output;
  EXPECT_NE(out.find("EMULATED device"), std::string::npos) << out;
  EXPECT_NE(out.find("fwd max ms"), std::string::npos);
  EXPECT_NE(out.find("trn max ms"), std::string::npos);
  EXPECT_EQ(out.find("p99"), std::string::npos) << "3 timed steps give no 99th percentile";
  EXPECT_NE(out.find("(3 timed steps: too few for a 99th percentile"), std::string::npos);
  EXPECT_NE(out.find("* the cache holds every one of the "), std::string::npos);
  EXPECT_NE(out.find("  *\n"), std::string::npos) << "the full-size point is marked";
}

TEST_F(BenchRun, HtmlHasOneChartPerSectionAndTheSweepChart) {
  ASSERT_EQ(run_->exit_code, 0) << run_->output;
  const std::string& html = *html_;
  const std::vector<std::string> charts = {"throughput", "bytes",    "step-time",       "modelled-step",
                                           "memory",     "hit-rate", "sweep-throughput"};
  EXPECT_EQ(count(html, "<section class=\"chart\""), charts.size());
  EXPECT_EQ(count(html, "<svg"), charts.size());
  for (const auto& id : charts) {
    const std::size_t at = html.find("<section class=\"chart\" id=\"" + id + "\">");
    ASSERT_NE(at, std::string::npos) << id;
    const std::string section = html.substr(at, html.find("</section>", at) - at);
    EXPECT_EQ(count(section, "<svg"), 1u) << id;
    EXPECT_EQ(count(section, "</svg>"), 1u) << id;
  }
  // The hit-rate chart has a point for each sweep fraction that ran.
  const std::size_t hit = html.find("id=\"hit-rate\"");
  EXPECT_EQ(count(html.substr(hit, html.find("</section>", hit) - hit), "<circle"), 2u);
  EXPECT_NE(html.find("id=\"sweep-table\""), std::string::npos);
  EXPECT_NE(html.find("id=\"tables\""), std::string::npos);
  EXPECT_NE(html.find("<p class=\"warn\" id=\"emulated\">"), std::string::npos) << "the device modes ran on emu";
  EXPECT_NE(html.find("first uses only"), std::string::npos) << "the 100% point holds every row touched";
  EXPECT_NE(html.find("with the trainer's dense model on the device (strata-bench --trainer)"), std::string::npos)
      << "the default trainer placement, named under the bytes chart";
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // The summary shows forward against the gather limit; the machine section lists the limits.
  const std::size_t summary = html.find("id=\"summary\"");
  ASSERT_NE(summary, std::string::npos);
  EXPECT_NE(html.substr(summary, html.find("</section>", summary) - summary).find("forward / gather limit"),
            std::string::npos);
  EXPECT_NE(html.find("dim 16, 64-byte rows, workload keys: "), std::string::npos);
}

// ---- the gather probe: uniform keys measure one limit per dim; --no-gather-probe skips it ----

TEST(BenchCli, UniformKeysMeasureOneGatherLimitPerDim) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--tables a=4000x32,b=1000x32 --batch 32 --pooling 4 --dist uniform --steps 2 --warmup 1 --threads 1 "
      "--read-probe-mib 1 --modes cpu --json " +
      dir + "/gather.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir + "/gather.json"));
  const json& limits = j["machine"]["gather_limit"];
  ASSERT_EQ(limits.size(), 1u) << limits.dump();
  EXPECT_EQ(limits[0]["keys"], "workload");
  EXPECT_EQ(limits[0]["table_rows"], 5000);  // both tables of dim 32, end to end
  EXPECT_EQ(limits[0]["threads"], 1);
  const json& m = j["results"][0];
  EXPECT_GT(m["forward_fraction_of_gather_limit"].get<double>(), 0.0);
  // One kind of key: the limit of a step is the probe's limit for its dim.
  EXPECT_DOUBLE_EQ(m["gather_limit_lookups_per_s"].get<double>(), limits[0]["lookups_per_s"].get<double>());
  EXPECT_FALSE(m.contains("forward_fraction_of_uniform_gather_limit"));
  EXPECT_TRUE(j["gather_probe"]["step_uniform_limit_lookups_per_s"].is_null());
}

// --dtype, --output-dtype (issue 31): the JSON records them, and the byte counts take each
// element's size: a bf16 row of dim 32 is 64 bytes (the gather limit's rows, the CPU gather's
// bytes), a record of it with rowwise adagrad's fp32 state 68 bytes (the update floor's records,
// the CPU optimizer's bytes), against 128 and 132 for fp32 on the same keys.
TEST(BenchCli, DtypesAreRecordedAndTheBytesCountTheirElementSizes) {
  const std::string dir = temp_dir();
  json runs[2];
  for (const int half : {0, 1}) {
    const std::string path = dir + "/dtype" + std::to_string(half) + ".json";
    const RunOutput r = run_bench(
        "--tables a=4000x32 --batch 32 --pooling 4 --dist uniform --steps 2 --warmup 1 --threads 1 "
        "--read-probe-mib 1 --modes cpu --optimizer rowwise_adagrad --json " +
        path + (half ? " --dtype bf16 --output-dtype bf16" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs[half] = json::parse(read_file(path));
  }
  const double row[2] = {32 * 4, 32 * 2}, record[2] = {33 * 4, 17 * 4};
  for (const int half : {0, 1}) {
    SCOPED_TRACE(half ? "bf16" : "fp32");
    const json& j = runs[half];
    EXPECT_EQ(j["workload"]["dtype"], half ? "bf16" : "fp32");
    EXPECT_EQ(j["workload"]["output_dtype"], half ? "bf16" : "fp32");
    EXPECT_EQ(j["workload"]["state_dtype"], "fp32");
    EXPECT_EQ(j["workload"]["tables"][0]["dtype"], half ? "bf16" : "fp32");
    EXPECT_EQ(j["machine"]["gather_limit"][0]["dim"], 32);
    EXPECT_EQ(j["machine"]["gather_limit"][0]["row_bytes"], row[half]);
    EXPECT_EQ(j["machine"]["update_floor"][0]["record_bytes"], record[half]);
    // The CPU kernels' bytes: every key's row gathered (128 keys a step), each distinct row's
    // record read and written.
    const json& bytes = j["results"][0]["cpu_kernel_bytes_per_step"];
    const double write = bytes["host_write"].get<double>();
    EXPECT_DOUBLE_EQ(bytes["host_read"].get<double>() - write, 128 * row[half]);
    EXPECT_DOUBLE_EQ(write / record[half],
                     runs[0]["results"][0]["cpu_kernel_bytes_per_step"]["host_write"].get<double>() / record[0]);
  }
}

TEST(BenchCli, NoGatherProbeSkipsTheLimit) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--rows 500 --dim 16 --batch 16 --pooling 2 --steps 1 --warmup 0 --threads 1 --read-probe-mib 1 --modes cpu "
      "--no-gather-probe --json " +
      dir + "/noprobe.json --html " + dir + "/noprobe.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("measuring the random-row gather limit"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("of the gather limit"), std::string::npos) << r.output;
  const json j = json::parse(read_file(dir + "/noprobe.json"));
  EXPECT_TRUE(j["machine"]["gather_limit"].empty());
  EXPECT_EQ(j["gather_probe"]["ran"], false);
  EXPECT_TRUE(j["results"][0]["forward_fraction_of_gather_limit"].is_null());
  EXPECT_TRUE(j["results"][0]["gather_limit_lookups_per_s"].is_null());
  EXPECT_TRUE(j["machine"]["update_floor"].empty());
  EXPECT_TRUE(j["results"][0]["train_fraction_of_step_floor"].is_null());
  EXPECT_EQ(r.output.find("of the step floor"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(dir + "/noprobe.html").find("gather limit"), std::string::npos);
  EXPECT_EQ(read_file(dir + "/noprobe.html").find("step floor"), std::string::npos);
}

// ---- without a sweep there is no sweep chart; --rows alone is one table ----

TEST(BenchCli, NoSweepNoSweepChartAndRowsAloneIsOneTable) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--rows 500 --dim 4 --batch 16 --pooling 2 --steps 1 --warmup 0 --threads 1 "
      "--read-probe-mib 1 --modes cpu,cached --backend emu --cache-fraction 1 --json " +
      dir + "/plain.json --html " + dir + "/plain.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir + "/plain.json"));
  ASSERT_EQ(j["workload"]["tables"].size(), 1u);
  EXPECT_EQ(j["workload"]["tables"][0]["rows"], 500);
  EXPECT_EQ(j["workload"]["tables"][0]["dim"], 4);
  EXPECT_TRUE(j["sweep"].empty());
  const std::string html = read_file(dir + "/plain.html");
  EXPECT_EQ(html.find("id=\"hit-rate\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"sweep-throughput\""), std::string::npos);
  EXPECT_EQ(count(html, "<section class=\"chart\""), count(html, "<svg"));
}

// ---- --preview: the trainer loop previews batches ahead; recorded in the JSON ----

TEST(BenchCli, PreviewRunsTheLookaheadPolicyWithPreviewedBatches) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--rows 2000 --dim 4 --batch 16 --pooling 2 --steps 12 --warmup 2 --threads 1 --dist zipf:1.05 "
      "--read-probe-mib 1 --modes cached --backend emu --cache-fraction 0.1 --policy lookahead --lookahead 1 "
      "--preview 8 --no-progress --json " +
      dir + "/preview.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir + "/preview.json"));
  EXPECT_EQ(j["settings"]["preview"], 8);
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0]["cache"]["preview"], 8);
  EXPECT_GT(j["results"][0]["cache"]["accesses"].get<std::int64_t>(), 0);
  const RunOutput bad = run_bench("--modes cached --preview -1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--preview"), std::string::npos) << bad.output;
}

// ---- --planner-partitions: each slot pool planned in partitions; recorded in the JSON ----

TEST(BenchCli, PlannerPartitionsPlanTheCacheInPartitions) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--rows 4000 --dim 4 --batch 16 --pooling 2 --steps 6 --warmup 1 --threads 2 --dist zipf:1.05 "
      "--read-probe-mib 1 --modes cached --backend emu --cache-fraction 0.2 --policy lfu --planner-partitions 3 "
      "--no-progress --json " +
      dir + "/shards.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir + "/shards.json"));
  EXPECT_EQ(j["settings"]["planner_partitions"], 3);
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0]["cache"]["planner_partitions"], 3);
  EXPECT_GT(j["results"][0]["cache"]["accesses"].get<std::int64_t>(), 0);
  const RunOutput bad = run_bench("--modes cached --planner-partitions 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--planner-partitions"), std::string::npos) << bad.output;
}

// ---- sharded modes over thread ranks report the all-to-all ----

TEST(BenchCli, ShardedModesOverRanksReportTheAllToAll) {
  const std::string dir = temp_dir();
  const RunOutput r = run_bench(
      "--tables a=3000x8,b=500x16 --batch 64 --pooling 4 --dist zipf:1.05 --steps 2 --warmup 1 --threads 1 "
      "--read-probe-mib 1 --modes gpu,hybrid --ranks 3 --sharding row --backend emu --cache-fraction 0.9 --json " +
      dir + "/ranks.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all-to-all, rank 0 of 3 (row sharding)"), std::string::npos) << r.output;
  const json j = json::parse(read_file(dir + "/ranks.json"));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& m : j["results"]) {
    const json& d = m["dispatch"];
    EXPECT_EQ(d["ranks"], 3);
    const json& b = d["bytes_per_step"];
    EXPECT_GT(b["total"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(b["total"].get<double>(),
                     b["keys"].get<double>() + b["rows"].get<double>() + b["grads"].get<double>());
    EXPECT_GE(b["total_without_dedup"].get<double>(), b["total"].get<double>());
    EXPECT_DOUBLE_EQ(m["bytes_per_step"]["all_to_all"].get<double>(), b["total"].get<double>());
    for (const char* k : {"exchange", "lookup", "source"}) EXPECT_GE(d["ms_per_step"][k].get<double>(), 0.0) << k;
    EXPECT_GE(d["batch_duplication_factor"].get<double>(), 1.0);
    // The probe ran one rank's threads: no fraction for a step of three ranks.
    EXPECT_TRUE(m["forward_fraction_of_gather_limit"].is_null());
  }
  EXPECT_TRUE(j["results"][1]["hit_rate"].is_number());
  // Over ranks, the sharded engine; rank 0's shards of the hybrid tables in its host memory.
  EXPECT_EQ(numa_of(j["results"][0], "/results/gpu").first, std::vector<std::string>{"sharded"});
  const auto [engines, host_tables] = numa_of(j["results"][1], "/results/hybrid");
  EXPECT_EQ(engines, std::vector<std::string>{"sharded"});
  EXPECT_EQ(host_tables, (std::vector<std::string>{"a hybrid sharded", "b hybrid sharded"}));
}

// ---- --trainer: where the outputs and gradients live, and what crosses PCIe for them ----

TEST(BenchCli, TrainerOnTheDeviceMovesOnlyMetadataForGpuTables) {
  const std::string dir = temp_dir();
  // 3 tables of dim 8, 64 bags of 1 key: outputs and gradients of 3 x 64 x 8 x 4 bytes per step.
  const double outputs = 3.0 * 64 * 8 * 4;
  json run[2];
  for (int t = 0; t < 2; ++t) {
    const std::string trainer = t == 0 ? "device" : "host";
    const std::string args =
        "--tables 3 --rows 4000 --dim 8 --batch 64 --steps 6 --warmup 0 --threads 1 --read-probe-mib 1 "
        "--no-gather-probe --modes cpu,offload,cached,gpu --backend emu --cache-fraction 0.05 --json " +
        dir + "/trainer_" + trainer + ".json" + (t == 0 ? std::string() : " --trainer host");  // device: the default
    const RunOutput r = run_bench(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("trainer on the " + trainer), std::string::npos) << r.output;
    run[t] = json::parse(read_file(dir + "/trainer_" + trainer + ".json"));
    EXPECT_EQ(run[t]["settings"]["trainer"], trainer);
  }
  const auto mode = [&](int t, const char* name) -> const json& {
    for (const json& m : run[t]["results"])
      if (m["mode"] == name) return m;
    static const json none;
    ADD_FAILURE() << name;
    return none;
  };
  const auto bytes = [&](int t, const char* name, const char* link) {
    return mode(t, name)["bytes_per_step"][link].get<double>();
  };
  for (const char* m : {"cpu", "offload", "cached", "gpu"}) {
    EXPECT_EQ(mode(0, m)["trainer"]["placement"], "device") << m;
    EXPECT_EQ(mode(1, m)["trainer"]["placement"], "host") << m;
    EXPECT_TRUE(mode(1, m)["trainer"]["device"].is_null()) << m;
  }
  // gpu: the device trainer's PCIe is the metadata H2D and the 8-byte NaN/Inf count of each
  // gradient view D2H; the host trainer's adds the outputs D2H and the gradients H2D.
  EXPECT_EQ(bytes(0, "gpu", "d2h"), 3 * 8.0);
  EXPECT_EQ(bytes(1, "gpu", "d2h"), outputs);
  EXPECT_NEAR(bytes(1, "gpu", "h2d") - bytes(0, "gpu", "h2d"), outputs, 1e-6);  // per-step means of whole bytes
  EXPECT_GT(bytes(0, "gpu", "h2d"), 0);
  // cached: D2H is the dirty write-backs (records of 8 floats) and the counts, nothing else.
  const json& cache = mode(0, "cached")["cache"];
  const double steps = static_cast<double>(mode(0, "cached")["train_step_s"].size());
  EXPECT_GT(cache["writebacks"].get<double>(), 0) << cache.dump();
  EXPECT_NEAR(bytes(0, "cached", "d2h") * steps, cache["writebacks"].get<double>() * 8 * 4 + 3 * 8.0 * steps, 1e-6);
  // cpu: no device in the store; the trainer's device the bench opens takes the outputs H2D and
  // gives the gradients D2H; the store's own device stays "none".
  EXPECT_EQ(bytes(0, "cpu", "h2d"), outputs);
  EXPECT_EQ(bytes(0, "cpu", "d2h"), outputs);
  EXPECT_EQ(bytes(1, "cpu", "h2d"), 0);
  EXPECT_EQ(mode(0, "cpu")["device"], "none");
  EXPECT_EQ(mode(0, "cpu")["trainer"]["device"], "emu");
  EXPECT_EQ(mode(0, "cpu")["trainer"]["device_opened_by_bench"], true);
  // offload: the device gather writes the device trainer's outputs in place, which the host
  // trainer's get D2H; the device trainer's gradients come D2H once instead (with the counts).
  EXPECT_NEAR(bytes(0, "offload", "h2d"), bytes(1, "offload", "h2d"), 1e-6);
  EXPECT_NEAR(bytes(1, "offload", "d2h"), outputs, 1e-6);
  EXPECT_NEAR(bytes(0, "offload", "d2h"), outputs + 3 * 8.0, 1e-6);
  // The CPU kernels' host bytes, counted from the keys: the same for both trainers.
  EXPECT_GT(mode(0, "cpu")["cpu_kernel_bytes_per_step"]["host_read"].get<double>(), 0);
  EXPECT_EQ(mode(0, "cpu")["cpu_kernel_bytes_per_step"], mode(1, "cpu")["cpu_kernel_bytes_per_step"]);
  // Where the trainer is changes the modelled step of the device modes.
  EXPECT_LT(mode(0, "gpu")["modelled"]["step_ms"].get<double>(), mode(1, "gpu")["modelled"]["step_ms"].get<double>());
}

TEST(BenchCli, HelpListsModesAndFlags) {
  const RunOutput r = run_bench("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"cpu, offload, offload-cpu, cached, gpu, hybrid", "--sweep-cache", "--tables", "criteo",
                        "--criteo-rows", "--ranks", "--sharding", "--no-gather-probe", "--trainer"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
}

TEST(BenchCli, CudaBackendRunsOrFailsEarly) {
  // With a GPU (and the CUDA backend built) this runs; without, it must stop before any work.
  const RunOutput r = run_bench(
      "--backend cuda --modes cpu,offload --tables 100x4 --batch 8 --steps 1 --warmup 0 "
      "--read-probe-mib 1");
  if (r.exit_code == 0) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--backend cuda: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output;
}

// ---- bad input: a clear message, a non-zero exit, nothing long started ----

struct BadInput {
  const char* name;
  std::string args;
  std::string message;        // a part of the expected message
  std::string workload = "";  // non-empty: written to a file passed as --workload
};

// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

class BenchBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(BenchBadInput, FailsClearlyBeforeLongWork) {
  const BadInput& c = GetParam();
  std::string args = c.args;
  if (!c.workload.empty()) {
    const std::string path = temp_dir() + "/" + c.name + ".json";
    std::ofstream(path) << c.workload;
    args += " --workload " + path;
  }
  const RunOutput r = run_bench(args + " --read-probe-mib 1 --steps 1 --warmup 0");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "killed by a signal: " << r.output;
  EXPECT_NE(r.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << r.output;
  EXPECT_EQ(r.output.find("measuring sequential read bandwidth"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Assertion"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BenchBadInput,
    ::testing::Values(
        BadInput{"UnknownMode", "--modes cpu,gpux",
                 "unknown mode 'gpux' (expected one of cpu, offload, offload-cpu, cached, gpu, hybrid)"},
        BadInput{"EmptyModes", "--modes ,", "--modes is empty"},
        BadInput{"ZeroRanks", "--modes gpu --ranks 0", "--ranks 0 must be in [1, 64]"},
        BadInput{"UnknownSharding", "--modes gpu --sharding diagonal",
                 "--sharding: unknown sharding 'diagonal' (expected replicated, table, row or column)"},
        BadInput{"UnknownProfile", "--profile nosuch", "--profile nosuch: "},
        BadInput{"UnknownDistribution", "--dist pareto:1",
                 "unknown distribution 'pareto:1' (expected uniform, zipf:ALPHA or drift:ALPHA:N)"},
        BadInput{"BadZipfAlpha", "--dist zipf:-1", "unknown distribution 'zipf:-1'"},
        BadInput{"UnknownPolicy", "--policy nosuch", "nosuch"},
        BadInput{"UnknownOptimizer", "--optimizer nosuch", "nosuch"},
        BadInput{"UnknownBackend", "--backend nosuch", "nosuch"},
        BadInput{"UnknownTrainer", "--trainer gpu", "--trainer: gpu not in {device,host}"},
        BadInput{"UnknownDtype", "--dtype fp8", "--dtype: fp8 not in {fp32,bf16,fp16}"},
        BadInput{"StateDtypeOfSgd", "--state-dtype bf16 --modes cpu",
                 "state_dtype bf16 with optimizer sgd (expected fp32: bf16 state is for adagrad and adam"},
        BadInput{"UnknownBagDist", "--bag-dist poisson", "unknown bag length distribution 'poisson'"},
        BadInput{"MalformedTableList", "--tables 100,x64",
                 "--tables: table list item 1 'x64': rows '' is not a positive integer"},
        BadInput{"MalformedTableDim", "--tables user=100xabc", "dim 'abc' is not a positive integer"},
        BadInput{"DuplicateTableName", "--tables a=10,a=20", "table name 'a' used twice"},
        BadInput{"BadCriteoTotal", "--tables criteo:5", "below one row for each of the 26 tables"},
        BadInput{"RowsWithList", "--tables a=10 --rows 5", "--rows applies to --tables N only"},
        BadInput{"BadSweepFraction", "--sweep-cache 0.1,2", "--sweep-cache: '2' is not a cache fraction in (0, 1]"},
        BadInput{"EmptySweepItem", "--sweep-cache 0.1,,0.2", "--sweep-cache: '' is not a cache fraction"},
        BadInput{"TooLargeForMemory", "--tables big=10000000000x1024 --modes cpu", "of host memory"},
        BadInput{"TooLargeRowsAlone", "--rows 1000000000000 --modes cpu", "but only"},
        BadInput{"TooLargeForTheDevice",
                 "--tables 100000x64 --modes cached --cache-fraction 1 --device-capacity 1000000 --backend emu",
                 "of device memory but the emulated device has"},
        BadInput{"CacheTooSmallForABatch",
                 "--tables 100000x8 --batch 4096 --dist uniform --modes cached --cache-fraction 0.0001 --backend emu",
                 "raise --cache-fraction"},
        BadInput{"MissingWorkloadFile", "--workload /nonexistent/w.json",
                 "cannot open workload file '/nonexistent/w.json'"},
        BadInput{"BadWorkloadFile", "", "table 0 't0': rows 0 must be > 0", R"({"tables": [{"rows": 0}]})"},
        BadInput{"WorkloadFileUnknownKey", "", "unknown workload key 'tabels'", R"({"tabels": 3})"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return std::string(info.param.name); });

}  // namespace
