// World checkpoints (store/io/detail/world_checkpoint.hpp): a world's save writes each row once into one shared
// directory and commits the manifest after every rank's pieces are durable; load reads it into a world of any size
// and sharding (or a store without a world), with rows, optimizer state, step and learning rates; a corrupt or
// missing piece is refused on every rank with the same message naming it, nothing changed; a rank that stops or dies
// during a save leaves the previous checkpoint whole. Ranks are threads (tests/store/thread_ranks.hpp); the killed
// saves run in a child process (posix_spawn of /proc/self/exe, as checkpoint_concurrency_test.cpp).

#include "store/io/detail/world_checkpoint.hpp"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/file_io.hpp"
#include "store/store.hpp"
#include "tests/store/half_tables.hpp"
#include "tests/store/thread_ranks.hpp"

extern char** environ;

namespace strata {
namespace {

using namespace strata::testing;
namespace fs = std::filesystem;
using dispatch::ShardingType;

constexpr int kTimeoutMs = 20000;
// The timeout of tests whose ranks stall (kStall) or wait past it: wide margins, for loaded machines and sanitizers.
constexpr int kShortTimeoutMs = 3000;
constexpr auto kStall = std::chrono::milliseconds(5000);
// Slow local work that keeps making progress: kSlowSteps pauses of kSlowStep each, longer than kShortTimeoutMs in all.
constexpr auto kSlowStep = std::chrono::milliseconds(1200);
constexpr int kSlowSteps = 4;

// The tables every test saves: each sharding type on `gpu` and `hybrid` (a cache of 4 rows), every optimizer
// (rowwise Adagrad never by column), dims 5 and 8, rows 3 (fewer than ranks), 37 and 100.
struct TableShape {
  const char* name;
  ShardingType type;
  Placement placement;
  OptimizerKind opt;
  int dim;
  std::int64_t rows;
};
constexpr TableShape kTables[] = {
    {"t0", ShardingType::kReplicated, Placement::kGpu, OptimizerKind::kAdagrad, 5, 37},
    {"t1", ShardingType::kTable, Placement::kHybrid, OptimizerKind::kAdam, 8, 100},
    {"t2", ShardingType::kRow, Placement::kGpu, OptimizerKind::kRowwiseAdagrad, 8, 3},
    {"t3", ShardingType::kColumn, Placement::kHybrid, OptimizerKind::kSgd, 5, 37},
    {"t4", ShardingType::kRow, Placement::kHybrid, OptimizerKind::kAdam, 5, 100},
    {"t5", ShardingType::kColumn, Placement::kGpu, OptimizerKind::kAdagrad, 8, 3},
    {"t6", ShardingType::kTable, Placement::kGpu, OptimizerKind::kRowwiseAdagrad, 5, 37},
    {"t7", ShardingType::kReplicated, Placement::kHybrid, OptimizerKind::kSgd, 8, 3},
};
constexpr int kNumTables = static_cast<int>(sizeof kTables / sizeof kTables[0]);

// The next sharding type of the rotation row -> column -> table -> replicated -> row (rowwise: never column).
ShardingType rotated(ShardingType t, OptimizerKind opt) {
  ShardingType next = t == ShardingType::kRow      ? ShardingType::kColumn
                      : t == ShardingType::kColumn ? ShardingType::kTable
                      : t == ShardingType::kTable  ? ShardingType::kReplicated
                                                   : ShardingType::kRow;
  return next == ShardingType::kColumn && opt == OptimizerKind::kRowwiseAdagrad ? rotated(next, opt) : next;
}

// `world` 0: a store without a world (`cpu` tables). `rotate`: each table's sharding rotated once. `seed`: the init.
StoreConfig world_config(int world, bool rotate, std::uint64_t seed) {
  StoreConfig c = thread_rank_config(64 << 20);
  for (const TableShape& s : kTables) {
    TableConfig tc;
    tc.spec.name = s.name;
    tc.spec.rows = s.rows;
    tc.spec.dim = s.dim;
    tc.spec.optimizer.kind = s.opt;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.spec.init.bound = 0.5f;
    tc.spec.init.seed = seed;
    if (world == 0) {
      tc.placement = Placement::kCpu;
    } else {
      tc.placement = s.placement;
      if (s.placement == Placement::kHybrid) tc.cache.rows = 4;
      tc.sharding.type = rotate ? rotated(s.type, s.opt) : s.type;
    }
    c.tables.push_back(tc);
  }
  return c;
}

// The value a test writes at (table, row, column) of the weights (block -1) or of state block b, for tag `tag`.
float value(int tag, int t, std::int64_t row, std::int64_t col, int block) {
  return static_cast<float>(tag * 100000 + t * 10000 + row * 64 + col * 4 + block + 1) / 1024.0f;
}

float rate_of(int tag, int t) { return 0.01f * static_cast<float>(tag) + 0.001f * static_cast<float>(t); }

std::int32_t state_dim(const TableShape& s) { return optimizer_state_dim(s.opt, s.dim); }

// Tags every row of every table (write_rows: on a world, every rank gives the same rows), the step and the rates.
void write_tagged(Store& store, int tag, std::int64_t step) {
  for (int t = 0; t < kNumTables; ++t) {
    const TableShape& s = kTables[t];
    const std::int32_t sd = state_dim(s);
    std::vector<float> w(static_cast<std::size_t>(s.rows * s.dim)), st(static_cast<std::size_t>(s.rows * sd));
    for (std::int64_t r = 0; r < s.rows; ++r) {
      for (int j = 0; j < s.dim; ++j) w[static_cast<std::size_t>(r * s.dim + j)] = value(tag, t, r, j, -1);
      for (int j = 0; j < sd; ++j) st[static_cast<std::size_t>(r * sd + j)] = value(tag, t, r, j, 0);
    }
    ASSERT_TRUE(store.write_rows(t, 0, s.rows, w.data(), sd ? st.data() : nullptr).is_ok());
    ASSERT_TRUE(store.set_learning_rate(s.name, rate_of(tag, t)).is_ok());
  }
  ASSERT_TRUE(store.set_step(step).is_ok());
}

// "" when every table holds tag `tag`'s rows (read_rows: collective on a world), at `step`, with its rates.
std::string check_tagged(Store& store, int tag, std::int64_t step) {
  std::ostringstream err;
  for (int t = 0; t < kNumTables; ++t) {
    const TableShape& s = kTables[t];
    const std::int32_t sd = state_dim(s);
    std::vector<float> w(static_cast<std::size_t>(s.rows * s.dim)), st(static_cast<std::size_t>(s.rows * sd));
    const Status read = store.read_rows(t, 0, s.rows, w.data(), sd ? st.data() : nullptr);
    if (!read.is_ok()) return "read_rows " + std::string(s.name) + ": " + read.to_string();
    int bad = 0;
    for (std::int64_t r = 0; r < s.rows && bad < 3; ++r) {
      for (int j = 0; j < s.dim && bad < 3; ++j)
        if (w[static_cast<std::size_t>(r * s.dim + j)] != value(tag, t, r, j, -1)) {
          err << s.name << " weight (" << r << ", " << j << ") = " << w[static_cast<std::size_t>(r * s.dim + j)]
              << ", expected " << value(tag, t, r, j, -1) << "; ";
          ++bad;
        }
      for (int j = 0; j < sd && bad < 3; ++j)
        if (st[static_cast<std::size_t>(r * sd + j)] != value(tag, t, r, j, 0)) {
          err << s.name << " state (" << r << ", " << j << ") = " << st[static_cast<std::size_t>(r * sd + j)]
              << ", expected " << value(tag, t, r, j, 0) << "; ";
          ++bad;
        }
    }
    const Result<float> rate = store.learning_rate(s.name);
    if (!rate || rate.value() != rate_of(tag, t))
      err << s.name << " learning rate " << (rate ? rate.value() : -1.0f) << ", expected " << rate_of(tag, t) << "; ";
  }
  if (store.step() != step) err << "step " << store.step() << ", expected " << step;
  return err.str();
}

// Runs body(rank, store) on a world of `world` thread ranks (0: one store without a world, on this thread) opened
// with `config`, collectives timing out after `timeout_ms`.
template <class Body>
void on_world(int world, const StoreConfig& config, Body body, int timeout_ms = kTimeoutMs) {
  if (world == 0) {
    auto s = Store::open(config);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    body(0, *s.value());
    return;
  }
  on_ranks(world, timeout_ms, [&](int rank, std::shared_ptr<dispatch::Communicator> comm) {
    auto s = Store::open(config, comm);
    ASSERT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.status().to_string();
    body(rank, *s.value());
  });
}

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("strata_world_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The files of `dir` (names).
std::set<std::string> files_of(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The files of `dir` that its manifest does not name (but LOCK), space-separated.
std::string leftovers(const std::string& dir) {
  const std::string manifest = slurp(dir + "/MANIFEST");
  std::string out;
  for (const std::string& f : files_of(dir))
    if (f != "MANIFEST" && f != "LOCK" && manifest.find("\"" + f + "\"") == std::string::npos) out += f + " ";
  return out;
}

// The checkpoints of saved(), by world size; removed when the tests end (SavedCheckpoints).
std::map<int, std::string>& saved_dirs() {
  static std::map<int, std::string> dirs;
  return dirs;
}

class SavedCheckpoints : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : saved_dirs()) fs::remove_all(d.second);
  }
};
::testing::Environment* const kSavedCheckpoints = ::testing::AddGlobalTestEnvironment(new SavedCheckpoints);

// A checkpoint of a world of `world` ranks (0: a store without a world), tag 1 at step 3; saved once per size.
const std::string& saved(int world) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = saved_dirs().find(world);
  if (it != saved_dirs().end()) return it->second;
  const std::string dir = fresh_dir("saved_n" + std::to_string(world));
  on_world(world, world_config(world, false, 7), [&](int rank, Store& store) {
    write_tagged(store, 1, 3);
    const Status s = store.save(dir);
    EXPECT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
  });
  return saved_dirs().emplace(world, dir).first->second;
}

class WorldCheckpointTest : public ::testing::Test {
 protected:
  void TearDown() override {
    detail::set_world_save_hook({});
    detail::set_world_load_hook({});
  }
};

class NToM : public ::testing::TestWithParam<std::pair<int, int>> {};

// N to M: a checkpoint of N ranks (0: a store without a world) loads into M ranks with every table's sharding rotated
// and another init: rows, state, step and rates equal on every rank.
TEST_P(NToM, LoadsRowsStateStepAndRates) {
  const int n = GetParam().first, m = GetParam().second;
  const std::string& dir = saved(n);
  ASSERT_TRUE(fs::exists(dir + "/MANIFEST"));
  on_world(m, world_config(m, true, 99), [&](int rank, Store& store) {
    const Status s = store.load(dir);
    ASSERT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
    const std::string err = check_tagged(store, 1, 3);
    EXPECT_EQ(err, "") << "rank " << rank;
  });
}

std::vector<std::pair<int, int>> n_to_m() {
  std::vector<std::pair<int, int>> out;
  for (int n = 0; n <= 4; ++n)
    for (int m = 0; m <= 4; ++m)
      if (n || m) out.emplace_back(n, m);
  return out;
}

INSTANTIATE_TEST_SUITE_P(WorldCheckpoint, NToM, ::testing::ValuesIn(n_to_m()),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& i) {
                           return "n" + std::to_string(i.param.first) + "_m" + std::to_string(i.param.second);
                         });

// world_config with rows bf16, fp16 or fp32 (by turns) and bf16 state where the optimizer allows it: every record has
// half elements but t2's (rowwise_adagrad, fp32), among them t5's fp32 rows with bf16 state and t6's bf16 rows with one
// fp32 state element.
StoreConfig half_world_config(int world, bool rotate) {
  StoreConfig c = world_config(world, rotate, 7);
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    TableSpec& s = c.tables[t].spec;
    s.dtype = t % 3 == 0 ? DType::kBF16 : t % 3 == 1 ? DType::kF16 : DType::kF32;
    if (s.optimizer.kind == OptimizerKind::kAdagrad || s.optimizer.kind == OptimizerKind::kAdam)
      s.state_dtype = DType::kBF16;
  }
  return c;
}

// `values` written (write_snapshot) into a world of 2 opened with `config` at step 5 and saved into `dir`; its
// manifest.
Result<detail::Manifest> save_on_two_ranks(const std::string& dir, const StoreConfig& config, const Snapshot& values) {
  on_world(2, config, [&](int rank, Store& store) {
    write_snapshot(store, values);
    ASSERT_TRUE(store.set_step(5).is_ok());
    const Status s = store.save(dir);
    ASSERT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
  });
  return detail::read_manifest(dir);
}

// `dir` (save_on_two_ranks') loads into a world of 3 and into a store without a world, opened with config_of(world):
// `values` bit for bit at step 5 on every rank.
void expect_loads_bit_for_bit(const std::string& dir, const Snapshot& values,
                              const std::function<StoreConfig(int)>& config_of) {
  for (const int world : {3, 0})
    on_world(world, config_of(world), [&](int rank, Store& store) {
      const Status s = store.load(dir);
      ASSERT_TRUE(s.is_ok()) << "world " << world << ", rank " << rank << ": " << s.to_string();
      EXPECT_TRUE(same_state(values, snapshot(store))) << "world " << world << ", rank " << rank;
      EXPECT_EQ(store.step(), 5);
    });
}

// Half-size elements in tables of every sharding and optimizer (format 3): a world of 2 saves each element at its own
// size and the checkpoint loads into a world of 3 with every sharding rotated, and into a store without a world, bit
// for bit (NaN payloads and signed zeros included).
TEST_F(WorldCheckpointTest, HalfTablesSaveAtTheirOwnSizeAndReshardBitForBit) {
  const std::string dir = fresh_dir("half");
  const Snapshot values = typed_values(half_world_config(2, false));
  const Result<detail::Manifest> m = save_on_two_ranks(dir, half_world_config(2, false), values);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m.value().version, detail::kTypedFormatVersion);
  std::uint64_t got = 0, want = 0;
  for (const detail::ManifestTable& t : m.value().tables)
    for (const detail::PieceEntry& p : t.pieces) got += fs::file_size(dir + "/" + p.file) - 64;
  for (const TableConfig& t : half_world_config(2, false).tables)
    want += static_cast<std::uint64_t>(
        t.spec.rows * (t.spec.dim * element_bytes(t.spec.dtype) +
                       optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim) * element_bytes(t.spec.state_dtype)));
  EXPECT_EQ(got, want);  // the records, each element at its size
  expect_loads_bit_for_bit(dir, values, [](int world) { return half_world_config(world, true); });
  fs::remove_all(dir);
}

// Tables of dim 5 (world_config's t4 and t0 shapes) of `type` on a world of `world` (0: a store without a world): fp32
// rows with bf16 adam state, bf16 rows with fp32 adam state, bf16 rows with bf16 adagrad state.
StoreConfig odd_half_config(int world, ShardingType type) {
  const StoreConfig all = world_config(world, false, 7);
  StoreConfig c = all;
  c.tables.clear();
  const struct {
    int base;
    DType dtype, state_dtype;
  } tables[] = {{4, DType::kF32, DType::kBF16}, {4, DType::kBF16, DType::kF32}, {0, DType::kBF16, DType::kBF16}};
  for (const auto& t : tables) {
    TableConfig tc = all.tables[static_cast<std::size_t>(t.base)];
    tc.spec.name = "odd" + std::to_string(c.tables.size());
    tc.spec.dtype = t.dtype;
    tc.spec.state_dtype = t.state_dtype;
    if (world > 0) tc.sharding.type = type;
    c.tables.push_back(tc);
  }
  return c;
}

// Format 3 pieces of a part of the columns of an odd dim (5 over 2 ranks: records of 3 and 2 columns and their share of
// the state, half elements among them) reshard into 3 row-sharded ranks and into a store without a world bit for bit.
TEST_F(WorldCheckpointTest, HalfRecordsSplitByColumnOfAnOddDimReshardIntoRowsBitForBit) {
  const std::string dir = fresh_dir("odd_half");
  const Snapshot values = typed_values(odd_half_config(2, ShardingType::kColumn));
  const Result<detail::Manifest> m = save_on_two_ranks(dir, odd_half_config(2, ShardingType::kColumn), values);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m.value().version, detail::kTypedFormatVersion);
  for (const detail::ManifestTable& t : m.value().tables) {
    std::multiset<std::int32_t> cols;
    for (const detail::PieceEntry& p : t.pieces) cols.insert(p.box.cols);
    EXPECT_EQ(cols, (std::multiset<std::int32_t>{2, 3})) << t.name;
  }
  expect_loads_bit_for_bit(dir, values, [](int world) { return odd_half_config(world, ShardingType::kRow); });
  fs::remove_all(dir);
}

// 4 ranks write each row once: the directory holds the tables' bytes, a 64-byte header per piece and the manifest;
// row and column tables one piece per rank holding rows, table and replicated tables one piece.
TEST_F(WorldCheckpointTest, EachRowIsWrittenOnce) {
  const std::string& dir = saved(4);
  std::uint64_t want = 0, got = 0;
  std::map<std::string, int> pieces;
  for (const std::string& f : files_of(dir)) {
    got += fs::file_size(dir + "/" + f);
    if (f == "MANIFEST" || f == "LOCK") continue;
    ASSERT_EQ(f.substr(f.size() - 4), ".tbl") << f;
    ++pieces[f.substr(0, f.find('.'))];
  }
  for (int t = 0; t < kNumTables; ++t) {
    const TableShape& s = kTables[t];
    want += static_cast<std::uint64_t>(s.rows * (s.dim + state_dim(s))) * 4u;
    const int expected = s.type == ShardingType::kRow      ? static_cast<int>(std::min<std::int64_t>(s.rows, 4))
                         : s.type == ShardingType::kColumn ? 4
                                                           : 1;
    EXPECT_EQ(pieces[s.name], expected) << s.name;
    want += 64u * static_cast<std::uint64_t>(expected);
  }
  want += fs::file_size(dir + "/MANIFEST");
  if (fs::exists(dir + "/LOCK")) want += fs::file_size(dir + "/LOCK");
  EXPECT_EQ(got, want);
  // A replicated table is written by replicas[t % 4]: t0 by rank 0, t7 by rank 3.
  bool t0_r0 = false, t7_r3 = false;
  for (const std::string& f : files_of(dir)) {
    t0_r0 = t0_r0 || (f.rfind("t0.", 0) == 0 && f.find(".r0.tbl") != std::string::npos);
    t7_r3 = t7_r3 || (f.rfind("t7.", 0) == 0 && f.find(".r3.tbl") != std::string::npos);
  }
  EXPECT_TRUE(t0_r0 && t7_r3);
}

// A copy of `from` in a fresh directory `name`.
std::string copy_of(const std::string& from, const std::string& name) {
  const std::string dir = fresh_dir(name);
  fs::copy(from, dir);
  return dir;
}

// The piece of table `table` saved by rank `rank` in `dir`.
std::string piece_of(const std::string& dir, const std::string& table, int rank) {
  for (const std::string& f : files_of(dir))
    if (f.rfind(table + ".", 0) == 0 && f.find(".r" + std::to_string(rank) + ".tbl") != std::string::npos) return f;
  return "";
}

// Loads `dir` into a 2-rank world tagged 2 at step 1: every rank gets the same error naming `file`, with `code`, and
// keeps its rows, state, step and rates.
void expect_refused(const std::string& dir, const std::string& names, StatusCode code) {
  std::vector<std::string> messages(2);
  on_world(2, world_config(2, true, 5), [&](int rank, Store& store) {
    write_tagged(store, 2, 1);
    const Status s = store.load(dir);
    EXPECT_EQ(s.code(), code) << "rank " << rank << ": " << s.to_string();
    messages[static_cast<std::size_t>(rank)] = s.message();
    EXPECT_EQ(check_tagged(store, 2, 1), "") << "rank " << rank << " changed";
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find(names), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("nothing changed"), std::string::npos) << messages[0];
}

TEST_F(WorldCheckpointTest, ACorruptOrMissingPieceIsRefusedNamingItAndNothingChanges) {
  {
    const std::string dir = copy_of(saved(3), "corrupt");
    const std::string file = piece_of(dir, "t4", 2);
    ASSERT_NE(file, "");
    std::fstream f(dir + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
    f.close();
    expect_refused(dir, file, StatusCode::kDataLoss);
    fs::remove_all(dir);
  }
  {
    const std::string dir = copy_of(saved(3), "missing");
    const std::string file = piece_of(dir, "t5", 1);
    ASSERT_NE(file, "");
    fs::remove(dir + "/" + file);
    expect_refused(dir, file, StatusCode::kNotFound);
    fs::remove_all(dir);
  }
  {  // a manifest, checksummed again, whose table t4 lost its last piece
    const std::string dir = copy_of(saved(3), "dropped");
    const std::string text = slurp(dir + "/MANIFEST");
    nlohmann::json j = nlohmann::json::parse(text.substr(0, text.rfind("\ncrc32c ")));
    for (auto& t : j.at("tables"))
      if (t.at("name") == "t4") t.at("pieces").erase(t.at("pieces").size() - 1);
    const std::string body = j.dump(2);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", detail::crc32c(body.data(), body.size()));
    std::ofstream(dir + "/MANIFEST", std::ios::binary | std::ios::trunc) << body << "\ncrc32c " << crc << "\n";
    expect_refused(dir, "'t4'", StatusCode::kDataLoss);
    fs::remove_all(dir);
  }
}

// Ranks at different steps: refused on every rank naming both, nothing written. (Two stores without a world joined
// by a 2-rank communicator for the save: the step of one rank of a world cannot be made to differ deterministically.)
TEST_F(WorldCheckpointTest, RanksAtDifferentStepsAreRefusedAndNothingIsWritten) {
  const std::string dir = copy_of(saved(2), "steps");
  const std::string manifest = slurp(dir + "/MANIFEST");
  const std::set<std::string> before = files_of(dir);
  std::vector<std::string> messages(2);
  on_ranks(2, kTimeoutMs, [&](int rank, std::shared_ptr<dispatch::Communicator> comm) {
    auto s = Store::open(world_config(0, false, 7));
    ASSERT_TRUE(s.is_ok());
    ASSERT_TRUE(s.value()->set_step(rank == 0 ? 5 : 4).is_ok());
    const Status saved = detail::save_world(*s.value(), *comm, dir);
    EXPECT_EQ(saved.code(), StatusCode::kFailedPrecondition) << saved.to_string();
    messages[static_cast<std::size_t>(rank)] = saved.message();
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("rank 0 at 5, rank 1 at 4"), std::string::npos) << messages[0];
  EXPECT_EQ(slurp(dir + "/MANIFEST"), manifest);
  EXPECT_EQ(files_of(dir), before);
  fs::remove_all(dir);
}

// Each rank's Status of a save of tag `tag` at `step` into `dir` by `world` thread ranks, rank 1 stalling kStall (past
// the timeout, kShortTimeoutMs) at `point`.
std::vector<Status> save_with_rank_1_stalled(int world, detail::SavePoint point, const std::string& dir, int tag,
                                             std::int64_t step) {
  detail::set_world_save_hook([point](int rank, detail::SavePoint p) {
    if (rank == 1 && p == point) std::this_thread::sleep_for(kStall);
    return Status::ok();
  });
  std::vector<Status> got(static_cast<std::size_t>(world));
  on_world(
      world, world_config(world, false, 7),
      [&](int rank, Store& store) {
        write_tagged(store, tag, step);
        got[static_cast<std::size_t>(rank)] = store.save(dir);
      },
      kShortTimeoutMs);
  detail::set_world_save_hook({});
  return got;
}

// A 2-rank world with the short timeout writes tagged rows and saves them into `dir`; every rank's save must succeed.
void save_tagged_on_two_ranks(const std::string& dir) {
  on_world(
      2, world_config(2, false, 7),
      [&](int rank, Store& store) {
        write_tagged(store, 1, 3);
        const Status s = store.save(dir);
        EXPECT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
      },
      kShortTimeoutMs);
}

// A store without a world loads `dir` and holds the tagged rows.
void expect_tagged_in_one_store(const std::string& dir) {
  on_world(0, world_config(0, false, 5), [&](int, Store& store) {
    ASSERT_TRUE(store.load(dir).is_ok());
    EXPECT_EQ(check_tagged(store, 1, 3), "");
  });
}

// A rank that stops during a save (past the others' timeout): the others fail naming it, the manifest stays, the
// previous checkpoint loads whole into another world and into a store without one, and the next save cleans up.
TEST_F(WorldCheckpointTest, ARankThatStopsDuringASaveFailsEveryRankAndCommitsNothing) {
  const std::string dir = copy_of(saved(3), "stops");
  const std::string manifest = slurp(dir + "/MANIFEST");
  const std::vector<Status> got = save_with_rank_1_stalled(3, detail::SavePoint::kPiecesCommitted, dir, 2, 4);
  for (int r : {0, 2}) {
    const Status& s = got[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("save '" + dir + "': ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("nothing committed; the previous checkpoint stays"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(got[1].is_ok());
  EXPECT_EQ(slurp(dir + "/MANIFEST"), manifest);
  on_world(2, world_config(2, true, 5), [&](int rank, Store& store) {
    ASSERT_TRUE(store.load(dir).is_ok());
    EXPECT_EQ(check_tagged(store, 1, 3), "") << "rank " << rank;
  });
  expect_tagged_in_one_store(dir);
  // The next save leaves only its own pieces and the manifest.
  on_world(2, world_config(2, false, 5), [&](int rank, Store& store) {
    write_tagged(store, 3, 5);
    const Status s = store.save(dir);
    EXPECT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
  });
  EXPECT_EQ(leftovers(dir), "");
  fs::remove_all(dir);
}

// A rank that stops once rank 0 committed the manifest: rank 0 says the checkpoint is saved, the rank that stopped
// that it may be; the checkpoint is whole.
TEST_F(WorldCheckpointTest, ARankThatStopsAfterTheCommitIsToldWhatTheDirectoryHolds) {
  const std::string dir = fresh_dir("stops_after");
  const std::vector<Status> got = save_with_rank_1_stalled(2, detail::SavePoint::kCommitted, dir, 1, 3);
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
    EXPECT_EQ(s.message().rfind("save '" + dir + "': ", 0), 0u) << s.message();
  }
  EXPECT_NE(got[0].message().find("the manifest was committed: the checkpoint is saved"), std::string::npos)
      << got[0].message();
  EXPECT_NE(got[1].message().find("the checkpoint may have been committed"), std::string::npos) << got[1].message();
  EXPECT_NE(got[1].message().find("this rank could not learn from rank 0 whether it renamed the manifest"),
            std::string::npos)
      << got[1].message();
  expect_tagged_in_one_store(dir);
  fs::remove_all(dir);
}

constexpr char kKillEnv[] = "STRATA_WORLD_CHECKPOINT_KILL";

// Where each killed save dies: (rank, point).
constexpr std::pair<int, detail::SavePoint> kKills[] = {{1, detail::SavePoint::kPieceHalfWritten},
                                                        {2, detail::SavePoint::kPiecesCommitted},
                                                        {0, detail::SavePoint::kManifestWritten},
                                                        {0, detail::SavePoint::kManifestRenamed}};

// The child process of ARankKilledDuringASave...: STRATA_WORLD_CHECKPOINT_KILL="<dir>;<case>". A 3-rank world saves
// tag 1 at step 3, then tag 2 at step 4 with a hook that raises SIGKILL at kKills[case]. Skipped without the variable.
TEST(WorldCheckpointChild, SavesAndIsKilled) {
  const char* env = std::getenv(kKillEnv);
  if (!env) GTEST_SKIP() << "runs only as the child process of ARankKilledDuringASaveLeavesThePreviousCheckpointWhole";
  const std::string arg = env;
  const std::string dir = arg.substr(0, arg.find(';'));
  const auto kill = kKills[std::stoi(arg.substr(arg.find(';') + 1))];
  on_world(3, world_config(3, false, 7), [&](int, Store& store) {
    write_tagged(store, 1, 3);
    ASSERT_TRUE(store.save(dir).is_ok());
  });
  detail::set_world_save_hook([kill](int rank, detail::SavePoint p) {
    if (rank == kill.first && p == kill.second) ::raise(SIGKILL);
    return Status::ok();
  });
  on_world(3, world_config(3, false, 7), [&](int, Store& store) {
    write_tagged(store, 2, 4);
    (void)store.save(dir);
  });
}

// A rank killed during a save (the whole process: thread ranks) at each point: the directory holds the previous
// checkpoint whole until the manifest's rename, the new one after; either loads into 1 and 2 ranks, and the next
// save removes every leftover.
TEST_F(WorldCheckpointTest, ARankKilledDuringASaveLeavesThePreviousCheckpointWhole) {
  std::vector<std::string> dirs;
  std::vector<pid_t> pids;
  for (std::size_t c = 0; c < sizeof kKills / sizeof kKills[0]; ++c) {
    dirs.push_back(fresh_dir("killed" + std::to_string(c)));
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (kv.rfind("GTEST_", 0) != 0 && kv.rfind(std::string(kKillEnv) + "=", 0) != 0) env_store.push_back(kv);
    }
    env_store.push_back(std::string(kKillEnv) + "=" + dirs.back() + ";" + std::to_string(c));
    std::vector<char*> envp;
    for (auto& kv : env_store) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::string arg0 = "world_checkpoint_child", filter = "--gtest_filter=WorldCheckpointChild.SavesAndIsKilled";
    char* argv[] = {arg0.data(), filter.data(), nullptr};
    pid_t pid = -1;
    ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  for (std::size_t c = 0; c < pids.size(); ++c) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[c], &status, 0), pids[c]);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "case " << c << ": status " << status;
    const bool committed = kKills[c].second == detail::SavePoint::kManifestRenamed;
    const int tag = committed ? 2 : 1;
    const std::int64_t step = committed ? 4 : 3;
    on_world(0, world_config(0, false, 5), [&](int, Store& store) {
      ASSERT_TRUE(store.load(dirs[c]).is_ok());
      EXPECT_EQ(check_tagged(store, tag, step), "") << "case " << c;
    });
    on_world(2, world_config(2, true, 5), [&](int rank, Store& store) {
      const Status s = store.load(dirs[c]);
      ASSERT_TRUE(s.is_ok()) << "case " << c << ", rank " << rank << ": " << s.to_string();
      EXPECT_EQ(check_tagged(store, tag, step), "") << "case " << c << ", rank " << rank;
      write_tagged(store, 3, 5);
      EXPECT_TRUE(store.save(dirs[c]).is_ok());
    });
    EXPECT_EQ(leftovers(dirs[c]), "") << "case " << c;
    fs::remove_all(dirs[c]);
  }
}

// Rank 0 waits for another saver's lock longer than the world's timeout: the others are not timed out.
TEST_F(WorldCheckpointTest, AWorldWaitsForAnotherSaverLongerThanItsTimeout) {
  const std::string dir = fresh_dir("waits");
  fs::create_directories(dir);
  auto held = detail::DirLock::acquire(dir, "LOCK");
  ASSERT_TRUE(held.is_ok());
  std::thread release([&] {
    std::this_thread::sleep_for(2 * std::chrono::milliseconds(kShortTimeoutMs));
    held.value() = detail::DirLock();
  });
  save_tagged_on_two_ranks(dir);
  release.join();
  expect_tagged_in_one_store(dir);
  fs::remove_all(dir);
}

// Ranks saving into directories of their own (what a world did before its checkpoints were shared): refused on every
// rank before anything is committed, naming the piece rank 0 cannot see.
TEST_F(WorldCheckpointTest, RanksSavingIntoDifferentDirectoriesAreRefused) {
  const std::vector<std::string> dirs = {fresh_dir("own_r0"), fresh_dir("own_r1")};
  on_world(2, world_config(2, false, 7), [&](int rank, Store& store) {
    const Status s = store.save(dirs[static_cast<std::size_t>(rank)]);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << "rank " << rank << ": " << s.to_string();
    EXPECT_NE(s.message().find("rank 1's piece"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("as rank 0 sees it"), std::string::npos) << s.message();
  });
  for (const std::string& d : dirs) {
    EXPECT_FALSE(fs::exists(d + "/MANIFEST")) << d;
    fs::remove_all(d);
  }
}

// Local work longer than the communicator's timeout (a whole table written or verified by one rank, a table copied
// without an exchange) does not time out the ranks waiting for it: they keep meeting in short rounds. Rank 1 pauses
// kSlowStep at each of its first kSlowSteps calls at `point` (longer than the timeout in all; it makes progress between
// them: a single pause past the timeout is a rank whose I/O is stuck, ARankWhoseLocalIoIsStuckFailsItsPeers).
template <class Point>
std::function<Status(int, Point)> slow_rank_1(Point point, std::atomic<int>& pauses) {
  return [point, &pauses](int rank, Point p) {
    if (rank == 1 && p == point && pauses.fetch_add(1) < kSlowSteps) std::this_thread::sleep_for(kSlowStep);
    return Status::ok();
  };
}

TEST_F(WorldCheckpointTest, ASlowWriterDoesNotTimeOutTheOtherRanks) {
  const std::string dir = fresh_dir("slow_writer");
  std::atomic<int> pauses{0};
  detail::set_world_save_hook(slow_rank_1(detail::SavePoint::kPieceHalfWritten, pauses));
  save_tagged_on_two_ranks(dir);
  detail::set_world_save_hook({});
  EXPECT_GE(pauses, kSlowSteps);
  expect_tagged_in_one_store(dir);
  fs::remove_all(dir);
}

TEST_F(WorldCheckpointTest, ASlowReaderDoesNotTimeOutTheOtherRanks) {
  const std::string& dir = saved(2);
  for (const detail::LoadPoint point : {detail::LoadPoint::kPieceVerified, detail::LoadPoint::kSpanWritten}) {
    std::atomic<int> pauses{0};
    detail::set_world_load_hook(slow_rank_1(point, pauses));
    // The sharding saved: each rank reads its own pieces, and row, column and table shards cross no rank.
    on_world(
        2, world_config(2, false, 5),
        [&](int rank, Store& store) {
          const Status s = store.load(dir);
          EXPECT_TRUE(s.is_ok()) << "rank " << rank << ": " << s.to_string();
          EXPECT_EQ(check_tagged(store, 1, 3), "") << "rank " << rank;
        },
        kShortTimeoutMs);
    detail::set_world_load_hook({});
    EXPECT_GE(pauses, kSlowSteps);
  }
}

// A hook blocking rank 1 at its first call at `point` until `released` is ready (at most 20 s: the watchdog);
// `by_rank_0`: it was released in time.
template <class Point>
std::function<Status(int, Point)> stuck_rank_1(Point point, std::shared_future<void> released,
                                               std::atomic<bool>& blocked, std::atomic<bool>& by_rank_0) {
  return [point, released, &blocked, &by_rank_0](int rank, Point p) {
    if (rank == 1 && p == point && !blocked.exchange(true))
      by_rank_0 = released.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    return Status::ok();
  };
}

// A rank whose local I/O makes no progress (blocked while it writes a piece, or copies rows, until rank 0's save or
// load returned; at most 20 s): every other rank fails after one timeout naming it, instead of waiting for it for ever;
// the rank itself returns the same error once its I/O returns. A save commits nothing.
TEST_F(WorldCheckpointTest, ARankWhoseLocalIoIsStuckFailsItsPeersAfterOneTimeout) {
  const std::string dir = fresh_dir("stuck_io");
  const std::string stuck = "rank 1's local I/O made no progress for " + std::to_string(kShortTimeoutMs) + " ms";
  for (const bool load : {false, true}) {
    std::promise<void> rank_0_returned;
    std::atomic<bool> blocked{false}, by_rank_0{false};
    if (load)
      detail::set_world_load_hook(
          stuck_rank_1(detail::LoadPoint::kSpanRead, rank_0_returned.get_future().share(), blocked, by_rank_0));
    else
      detail::set_world_save_hook(
          stuck_rank_1(detail::SavePoint::kPieceHalfWritten, rank_0_returned.get_future().share(), blocked, by_rank_0));
    std::vector<Status> got(2);
    on_world(
        2, world_config(2, false, 7),
        [&](int rank, Store& store) {
          write_tagged(store, 1, 3);
          got[static_cast<std::size_t>(rank)] = load ? store.load(saved(2)) : store.save(dir);
          if (rank == 0) rank_0_returned.set_value();
        },
        kShortTimeoutMs);
    detail::set_world_save_hook({});
    detail::set_world_load_hook({});
    EXPECT_TRUE(blocked);
    EXPECT_TRUE(by_rank_0) << "rank 0 waited for rank 1's stuck I/O (load " << load << ")";
    for (const Status& s : got) {
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
      if (load) {
        EXPECT_EQ(s.message().rfind("load '" + saved(2) + "': load failed while copying rows into table '", 0), 0u)
            << s.message();
        EXPECT_NE(s.message().find("': " + stuck + " (the tables may now hold a mix"), std::string::npos)
            << s.message();
      } else {
        EXPECT_EQ(s.message(), "save '" + dir + "': " + stuck + " (nothing committed; the previous checkpoint stays)");
      }
    }
    if (!load) {
      EXPECT_FALSE(fs::exists(dir + "/MANIFEST"));
    }
  }
  fs::remove_all(dir);
}

// "" when every row of every table of `store` holds tag `a`'s or tag `b`'s weights and state (a mix of rows of
// both: a load that failed while copying), else the first rows that hold neither.
std::string rows_of_either(Store& store, int a, int b) {
  std::ostringstream err;
  for (int t = 0; t < kNumTables; ++t) {
    const TableShape& s = kTables[t];
    const std::int32_t sd = state_dim(s);
    std::vector<float> w(static_cast<std::size_t>(s.rows * s.dim)), st(static_cast<std::size_t>(s.rows * sd));
    const Status read = store.read_rows(t, 0, s.rows, w.data(), sd ? st.data() : nullptr);
    if (!read.is_ok()) return "read_rows " + std::string(s.name) + ": " + read.to_string();
    for (std::int64_t r = 0; r < s.rows; ++r) {
      bool is[2] = {true, true};
      for (int k = 0; k < 2; ++k) {
        const int tag = k ? b : a;
        for (int j = 0; j < s.dim; ++j)
          is[k] = is[k] && w[static_cast<std::size_t>(r * s.dim + j)] == value(tag, t, r, j, -1);
        for (int j = 0; j < sd; ++j)
          is[k] = is[k] && st[static_cast<std::size_t>(r * sd + j)] == value(tag, t, r, j, 0);
      }
      if (!is[0] && !is[1] && err.tellp() < 300)
        err << s.name << " row " << r << " (weight 0: " << w[static_cast<std::size_t>(r * s.dim)] << "); ";
    }
  }
  return err.str();
}

// A reader whose read fails during the copy: no rank writes rows that are neither its own nor the checkpoint's (the
// span the reader could not read is written nowhere), and every rank reports the same error.
TEST_F(WorldCheckpointTest, AReadFailingDuringTheCopyWritesOnlyRowsOfTheStoreOrOfTheCheckpoint) {
  const std::string& dir = saved(1);
  detail::set_world_load_hook([](int rank, detail::LoadPoint p) {
    return rank == 0 && p == detail::LoadPoint::kSpanRead ? Status::io_error("injected read error") : Status::ok();
  });
  std::vector<std::string> messages(2);
  // One rank's checkpoint: rank 0 reads t0 (and every even table) and sends its rows to rank 1.
  on_world(2, world_config(2, false, 5), [&](int rank, Store& store) {
    write_tagged(store, 2, 1);
    const Status s = store.load(dir);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << "rank " << rank << ": " << s.to_string();
    messages[static_cast<std::size_t>(rank)] = s.message();
    EXPECT_EQ(rows_of_either(store, 2, 1), "") << "rank " << rank;
    EXPECT_EQ(store.step(), 1);
  });
  detail::set_world_load_hook({});
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("load failed while copying rows"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("injected read error"), std::string::npos) << messages[0];
}

// A communicator that passes every call on, except where armed: fail_next_exchange(): its next all_to_all_v moves the
// data and then fails on this rank only (as a device-staged exchange can when the device fails during the copies),
// leaving the communicator usable; throw_at_next_gather() (from any thread): its next all_gather throws, reaching no
// peer.
class FaultyComm final : public dispatch::Communicator {
 public:
  explicit FaultyComm(std::shared_ptr<dispatch::Communicator> inner) : inner_(std::move(inner)) {}
  void fail_next_exchange() { fail_exchange_ = true; }
  void throw_at_next_gather() { throw_gather_ = true; }
  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  const char* kind() const noexcept override { return inner_->kind(); }
  int local_rank() const noexcept override { return inner_->local_rank(); }
  std::chrono::milliseconds timeout() const noexcept override { return inner_->timeout(); }
  Status all_reduce(void* data, std::int64_t count, dispatch::DataType type, dispatch::ReduceOp op) override {
    return inner_->all_reduce(data, count, type, op);
  }
  Status barrier() override { return inner_->barrier(); }
  void forget_device(const gpu::Device& device) noexcept override { inner_->forget_device(device); }
  dispatch::CommCounters counters() const noexcept override { return inner_->counters(); }

 private:
  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const dispatch::BufferSpace& space) override {
    Status s = inner_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, space);
    if (!s.is_ok() || !fail_exchange_) return s;
    fail_exchange_ = false;
    return Status::internal("injected failure of this rank's exchange");
  }
  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const dispatch::BufferSpace& space) override {
    if (throw_gather_.exchange(false)) throw std::runtime_error("injected throw of this rank's all_gather");
    return inner_->all_gather(send, bytes, recv, space);
  }
  Status do_broadcast(void* data, std::int64_t bytes, int root, const dispatch::BufferSpace& space) override {
    return inner_->broadcast(data, bytes, root, space);
  }

  std::shared_ptr<dispatch::Communicator> inner_;
  bool fail_exchange_ = false;
  std::atomic<bool> throw_gather_{false};
};

// Runs body(rank, store, comm) on `world` thread ranks, each store on a FaultyComm over a `local` world (collectives
// timing out after `timeout_ms`); `comms` (filled before any rank starts) holds every rank's.
template <class Body>
void on_faulty_world(int world, int timeout_ms, std::vector<std::shared_ptr<FaultyComm>>& comms, Body body) {
  const std::vector<std::shared_ptr<dispatch::Communicator>> inner = thread_comms(world, timeout_ms);
  comms.clear();
  for (const auto& c : inner) comms.push_back(std::make_shared<FaultyComm>(c));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto s = Store::open(world_config(world, false, 5), comms[static_cast<std::size_t>(r)]);
      ASSERT_TRUE(s.is_ok()) << "rank " << r << ": " << s.status().to_string();
      body(r, *s.value(), *comms[static_cast<std::size_t>(r)]);
    });
  for (auto& t : ranks) t.join();
}

// An exchange of the copy that fails on one rank only: that rank writes nothing of the span, every rank stops copying
// there (the tables after it keep their rows) and reports the same error, without waiting for a timeout.
TEST_F(WorldCheckpointTest, AnExchangeFailingOnOneRankStopsEveryRanksCopy) {
  const std::string& dir = saved(1);  // whole pieces: rank 0 reads t0 (replicated) and sends it to rank 1
  std::vector<std::string> messages(2);
  std::vector<std::shared_ptr<FaultyComm>> comms;
  on_faulty_world(2, kTimeoutMs, comms, [&](int r, Store& store, FaultyComm& comm) {
    write_tagged(store, 2, 1);
    if (r == 1) comm.fail_next_exchange();
    const Status loaded = store.load(dir);
    EXPECT_EQ(loaded.code(), StatusCode::kInternal) << "rank " << r << ": " << loaded.to_string();
    messages[static_cast<std::size_t>(r)] = loaded.message();
    EXPECT_EQ(rows_of_either(store, 2, 1), "") << "rank " << r;
    for (int t = 1; t < kNumTables; ++t) {
      const TableShape& sh = kTables[t];
      std::vector<float> w(static_cast<std::size_t>(sh.rows * sh.dim));
      std::vector<float> st(static_cast<std::size_t>(sh.rows * state_dim(sh)));
      ASSERT_TRUE(store.read_rows(t, 0, sh.rows, w.data(), state_dim(sh) ? st.data() : nullptr).is_ok());
      EXPECT_EQ(w.back(), value(2, t, sh.rows - 1, sh.dim - 1, -1)) << sh.name << " was copied after t0 failed";
    }
    EXPECT_EQ(store.step(), 1);
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("rank 1: "), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("injected failure of this rank's exchange"), std::string::npos) << messages[0];
}

// A communicator whose all_gather throws on rank 1 while its pieces are written (the poll's rounds): rank 1's save
// returns an error (its worker joined, no std::terminate), and rank 0 fails naming rank 1 once it times out.
TEST_F(WorldCheckpointTest, ACommunicatorThatThrowsDuringAPolledSaveFailsTheSaveWithoutAborting) {
  const std::string dir = fresh_dir("comm_throws");
  std::vector<std::shared_ptr<FaultyComm>> comms;
  std::atomic<bool> armed{false};
  detail::set_world_save_hook([&](int rank, detail::SavePoint p) {
    if (rank == 1 && p == detail::SavePoint::kPieceHalfWritten && !armed.exchange(true))
      comms[1]->throw_at_next_gather();
    return Status::ok();
  });
  std::vector<Status> got(2);
  on_faulty_world(2, kShortTimeoutMs, comms, [&](int r, Store& store, FaultyComm&) {
    write_tagged(store, 1, 3);
    got[static_cast<std::size_t>(r)] = store.save(dir);
  });
  detail::set_world_save_hook({});
  EXPECT_TRUE(armed);
  EXPECT_EQ(got[1].code(), StatusCode::kInternal) << got[1].to_string();
  EXPECT_NE(got[1].message().find("injected throw of this rank's all_gather"), std::string::npos) << got[1].message();
  EXPECT_NE(got[1].message().find("nothing committed"), std::string::npos) << got[1].message();
  EXPECT_EQ(got[0].code(), StatusCode::kUnavailable) << got[0].to_string();
  EXPECT_NE(got[0].message().find("rank 1"), std::string::npos) << got[0].message();
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST"));
  fs::remove_all(dir);
}

// A job that throws something other than a std::exception (here the hook, on rank 1's writer thread) fails the save on
// every rank with the same error naming rank 1, instead of std::terminate.
TEST_F(WorldCheckpointTest, AJobThrowingANonStandardExceptionFailsEveryRank) {
  const std::string dir = fresh_dir("job_throws");
  detail::set_world_save_hook([](int rank, detail::SavePoint p) {
    if (rank == 1 && p == detail::SavePoint::kPieceHalfWritten) throw 42;
    return Status::ok();
  });
  std::vector<Status> got(2);
  on_world(2, world_config(2, false, 7), [&](int rank, Store& store) {
    write_tagged(store, 1, 3);
    got[static_cast<std::size_t>(rank)] = store.save(dir);
  });
  detail::set_world_save_hook({});
  EXPECT_EQ(got[0].message(), got[1].message());
  EXPECT_EQ(got[0].code(), StatusCode::kInternal) << got[0].to_string();
  EXPECT_NE(got[0].message().find("rank 1: "), std::string::npos) << got[0].message();
  EXPECT_NE(got[0].message().find("not a std::exception"), std::string::npos) << got[0].message();
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST"));
  fs::remove_all(dir);
}

// A rank that never comes to a load: the other's load fails at its first collective (after the timeout), saying which
// load and that nothing changed.
TEST_F(WorldCheckpointTest, ALoadWhosePeerNeverComesSaysWhichLoadAndThatNothingChanged) {
  const std::string& dir = saved(2);
  Status got;
  on_world(
      2, world_config(2, false, 5),
      [&](int rank, Store& store) {
        if (rank == 1) return;
        got = store.load(dir);
        EXPECT_EQ(store.step(), 0);
      },
      kShortTimeoutMs);
  EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got.to_string();
  EXPECT_EQ(got.message().rfind("load '" + dir + "': ", 0), 0u) << got.message();
  EXPECT_NE(got.message().find("rank 1"), std::string::npos) << got.message();
  EXPECT_EQ(got.message().substr(got.message().size() - std::string(" (nothing changed)").size()), " (nothing changed)")
      << got.message();
}

// A store without a world stops at the first table whose copy fails: the tables after it keep their rows.
TEST_F(WorldCheckpointTest, AStoreWithoutAWorldStopsCopyingAtTheFirstFailingTable) {
  const std::string& dir = saved(2);
  detail::set_world_load_hook([](int, detail::LoadPoint p) {
    return p == detail::LoadPoint::kSpanWritten ? Status::io_error("injected write error") : Status::ok();
  });
  on_world(0, world_config(0, false, 5), [&](int, Store& store) {
    write_tagged(store, 2, 1);
    const Status s = store.load(dir);
    detail::set_world_load_hook({});
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.to_string();
    EXPECT_NE(s.message().find("into table 't0'"), std::string::npos) << s.message();
    // t0 holds the checkpoint's rows (its one span was written), every later table its own.
    std::string err = rows_of_either(store, 2, 1);
    EXPECT_EQ(err, "");
    std::vector<float> w(static_cast<std::size_t>(kTables[1].rows * kTables[1].dim));
    std::vector<float> st(static_cast<std::size_t>(kTables[1].rows * state_dim(kTables[1])));
    for (int t = 1; t < kNumTables; ++t) {
      const TableShape& sh = kTables[t];
      w.resize(static_cast<std::size_t>(sh.rows * sh.dim));
      st.resize(static_cast<std::size_t>(sh.rows * state_dim(sh)));
      ASSERT_TRUE(store.read_rows(t, 0, sh.rows, w.data(), state_dim(sh) ? st.data() : nullptr).is_ok());
      EXPECT_EQ(w[0], value(2, t, 0, 0, -1)) << sh.name << " was copied after t0 failed";
      EXPECT_EQ(w.back(), value(2, t, sh.rows - 1, sh.dim - 1, -1)) << sh.name << " was copied after t0 failed";
    }
    EXPECT_EQ(store.step(), 1);
  });
}

// A piece whose size rank 0 sees differ from what its saver wrote: refused on every rank with both sizes.
TEST_F(WorldCheckpointTest, APieceOfAnotherSizeAsRank0SeesItIsRefusedWithBothSizes) {
  const std::string dir = fresh_dir("resized");
  detail::set_world_save_hook([&](int rank, detail::SavePoint p) {
    if (rank == 1 && p == detail::SavePoint::kPiecesCommitted)
      for (const std::string& f : files_of(dir))
        if (f.find(".r1.tbl") != std::string::npos && f.find(".tmp") == std::string::npos)
          std::ofstream(dir + "/" + f, std::ios::binary | std::ios::app) << 'x';
    return Status::ok();
  });
  on_world(2, world_config(2, false, 7), [&](int rank, Store& store) {
    const Status s = store.save(dir);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << "rank " << rank << ": " << s.to_string();
    EXPECT_NE(s.message().find("rank 1's piece"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("bytes as rank 0 sees it (expected "), std::string::npos) << s.message();
  });
  detail::set_world_save_hook({});
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST"));
  fs::remove_all(dir);
}

// open_checkpoint reopens a world's checkpoint as one store (the recorded config, tables whole).
TEST_F(WorldCheckpointTest, OpenCheckpointReopensAWorldCheckpointAsOneStore) {
  auto s = Store::open_checkpoint(saved(3));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(check_tagged(*s.value(), 1, 3), "");
}

}  // namespace
}  // namespace strata
