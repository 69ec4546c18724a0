// Invariant 5: checkpoints round-trip, are atomic (a crash mid-save keeps the previous one) and
// checksummed (corruption and truncation are detected and change nothing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/half.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/file_io.hpp"
#include "store/io/npy.hpp"
#include "tests/store/half_tables.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    std::mt19937_64 rng(11);
    config_ = random_config(rng, 3);
    config_.tables[0].spec.optimizer.kind = OptimizerKind::kAdam;  // state and step matter
  }
  void TearDown() override {
    detail::set_fault_after_bytes(-1);
    detail::set_before_open_hook({});
    fs::remove_all(dir_);
  }
  void train(Store& s, std::uint64_t seed, int steps) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < steps; ++i) {
      const KeyBatch kb = random_batch(rng, config_, 8);
      Buffers out = make_buffers(config_, kb);
      ASSERT_TRUE(s.submit(1000 + i, kb).is_ok());
      ASSERT_TRUE(s.forward(1000 + i, out.views).is_ok());
      fill_random(rng, out);
      ASSERT_TRUE(s.backward(1000 + i, out.cviews).is_ok());
    }
  }
  std::string table_file(int t) {
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind(config_.tables[static_cast<std::size_t>(t)].spec.name + ".", 0) == 0)
        return e.path();
    return {};
  }
  // Overwrites a byte near the end of `file` (its records: only the checksum can tell).
  static void overwrite_near_end(const std::string& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 3));
    f.put('\x5a');
  }
  // Replaces `from` by `to` in the manifest's JSON text and writes it back with a checksum that
  // matches: a manifest that is well-formed but says something wrong.
  void edit_manifest(const std::string& from, const std::string& to) {
    std::ifstream in(dir_ / "MANIFEST", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string body = text.substr(0, text.rfind("\ncrc32c "));
    const std::size_t at = body.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in " << body;
    body.replace(at, from.size(), to);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", detail::crc32c(body.data(), body.size()));
    std::ofstream(dir_ / "MANIFEST", std::ios::binary | std::ios::trunc) << body << "\ncrc32c " << crc << "\n";
  }
  // Parses the manifest's JSON, lets `edit` change it, and writes it back with a matching checksum.
  void rewrite_manifest(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_ / "MANIFEST", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text.substr(0, text.rfind("\ncrc32c ")));
    edit(j);
    const std::string body = j.dump(2);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", detail::crc32c(body.data(), body.size()));
    std::ofstream(dir_ / "MANIFEST", std::ios::binary | std::ios::trunc) << body << "\ncrc32c " << crc << "\n";
  }
  fs::path dir_;
  StoreConfig config_;
};

TEST_F(Checkpoint, RoundTripThenTrainingContinuesIdentically) {
  auto a = Store::open(config_);
  ASSERT_TRUE(a.is_ok());
  train(**a, 1, 5);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(config_);
  ASSERT_TRUE(b.is_ok());
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_EQ((*b)->step(), 5);
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  // Adam's step counter came back too: further training stays identical.
  train(**a, 2, 3);
  train(**b, 2, 3);
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  // The reference loads the same checkpoint (one format for every implementation).
  auto r = open_reference_store(config_);
  ASSERT_TRUE((*r)->load(dir_).is_ok());
  EXPECT_EQ((*r)->step(), 5);
}

// The learning rates in force (Store::set_learning_rate) are saved, and load restores them.
// The longest table name Store::open accepts names checkpoint files that fit a file name (a name
// of 300 characters opened, trained, then failed to save with "File name too long"; issue 29).
TEST_F(Checkpoint, TheLongestTableNameSavesAndLoads) {
  config_.tables[1].spec.name = std::string(kMaxTableNameBytes, 'n');
  auto a = Store::open(config_);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  train(**a, 1, 3);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  ASSERT_TRUE((*a)->save(dir_).is_ok());  // a second generation replaces the first
  auto b = Store::open(config_);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const Status loaded = (*b)->load(dir_);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  EXPECT_EQ((*b)->step(), 3);
}

TEST_F(Checkpoint, LearningRatesRoundTrip) {
  auto a = Store::open(config_);
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE((*a)->set_learning_rate(config_.tables[0].spec.name, 0.2f).is_ok());
  ASSERT_TRUE((*a)->set_learning_rate(config_.tables[1].spec.name, 0.0123f).is_ok());
  ASSERT_TRUE((*a)->set_learning_rate(config_.tables[2].spec.name, 0.0f).is_ok());  // a rate, not "unrecorded"
  train(**a, 1, 3);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(config_);  // at the config's rates
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  for (const auto& t : config_.tables)
    EXPECT_EQ((*b)->learning_rate(t.spec.name).value(), (*a)->learning_rate(t.spec.name).value()) << t.spec.name;
  EXPECT_EQ((*b)->learning_rate(config_.tables[1].spec.name).value(), 0.0123f);
  EXPECT_EQ((*b)->learning_rate(config_.tables[2].spec.name).value(), 0.0f);
  train(**a, 2, 3);
  train(**b, 2, 3);
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  auto r = open_reference_store(config_);
  ASSERT_TRUE((*r)->load(dir_).is_ok());
  EXPECT_EQ((*r)->learning_rate(config_.tables[0].spec.name).value(), 0.2f);
}

// A checkpoint written before learning rates were recorded (no "learning_rate" entries) still
// loads, and the store keeps its own rates.
TEST_F(Checkpoint, CheckpointWithoutLearningRatesKeepsTheStoresRates) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  rewrite_manifest([](nlohmann::json& j) {
    for (auto& t : j.at("tables")) t.erase("learning_rate");
  });
  auto b = Store::open(config_);
  ASSERT_TRUE((*b)->set_learning_rate(0.3f).is_ok());
  const Status s = (*b)->load(dir_);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ((*b)->step(), 2);
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  for (const auto& t : config_.tables) EXPECT_EQ((*b)->learning_rate(t.spec.name).value(), 0.3f);
}

// A recorded rate that no store could have (< 0, not finite, not a number) is corruption: load
// refuses it naming the table and the value, and changes nothing (rows, step, rates).
TEST_F(Checkpoint, BadLearningRateInTheManifestIsRefusedAndChangesNothing) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  const fs::path saved = dir_.string() + "_manifest";
  fs::copy_file(dir_ / "MANIFEST", saved, fs::copy_options::overwrite_existing);
  auto b = Store::open(config_);
  const Snapshot fresh = snapshot(**b);
  const std::string name = config_.tables[1].spec.name;
  for (const nlohmann::json& bad :
       {nlohmann::json(-1.5), nlohmann::json(-1e-30), nlohmann::json(1e39), nlohmann::json("fast")}) {
    fs::copy_file(saved, dir_ / "MANIFEST", fs::copy_options::overwrite_existing);
    rewrite_manifest([&](nlohmann::json& j) { j.at("tables")[1]["learning_rate"] = bad; });
    const Status s = (*b)->load(dir_);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << bad << ": " << s.to_string();
    if (bad.is_number()) {
      EXPECT_NE(s.message().find("table '" + name + "': learning_rate " + bad.dump() +
                                 " (expected a finite number >= 0; corrupt)"),
                std::string::npos)
          << s.message();
    }
    EXPECT_TRUE(same_state(fresh, snapshot(**b)));
    EXPECT_EQ((*b)->step(), 0);
    for (const auto& t : config_.tables) EXPECT_EQ((*b)->learning_rate(t.spec.name).value(), 0.05f);
  }
  fs::remove(saved);
}

// A store reopened from its checkpoint alone (Store::open_checkpoint: the config the manifest
// recorded), in every placement, reads bit for bit as the store that saved it (rows, optimizer
// state, step, rates, config) and then trains as that store, which kept running: same outputs and
// same rows after every step. Threads and cache sizes are overridden, as they may be.
TEST_F(Checkpoint, ReopenedFromTheCheckpointAloneReadsAndTrainsAsTheStoreThatKeptRunning) {
  const StoreConfig base = config_;
  for (Placement p : {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu, Placement::kHybrid}) {
    SCOPED_TRACE(to_string(p));
    fs::remove_all(dir_);
    config_ = base;
    config_.device.backend = BackendChoice::kEmu;
    for (auto& t : config_.tables) {
      t.placement = p;
      if (p == Placement::kCached || p == Placement::kHybrid) t.cache.rows = std::min<std::int64_t>(t.spec.rows, 48);
    }
    auto a = Store::open(config_);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    train(**a, 1, 3);
    ASSERT_TRUE((*a)->set_learning_rate(config_.tables[1].spec.name, 0.2f).is_ok());
    train(**a, 2, 1);
    ASSERT_TRUE((*a)->save(dir_).is_ok());
    auto b = Store::open_checkpoint(dir_.string(), [](StoreConfig& c) {
      c.threads = 1;
      for (auto& t : c.tables)
        if (t.cache.rows > 0) t.cache.rows = std::min<std::int64_t>(t.spec.rows, 40);
    });
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    Store& r = **b;
    EXPECT_EQ(r.config().threads, 1);
    StoreConfig want = (*a)->config();  // rates in force included
    want.threads = 1;
    for (std::size_t t = 0; t < want.tables.size(); ++t) want.tables[t].cache = r.config().tables[t].cache;
    EXPECT_EQ(to_json(r.config()), to_json(want));
    EXPECT_EQ(r.step(), 4);
    EXPECT_EQ(r.learning_rate(config_.tables[1].spec.name).value(), 0.2f);
    EXPECT_TRUE(same_state(snapshot(**a), snapshot(r)));
    std::mt19937_64 rng(3);
    for (int i = 0; i < 3; ++i) {
      const KeyBatch kb = random_batch(rng, config_, 8);
      Buffers out_a = make_buffers(config_, kb), out_r = make_buffers(config_, kb);
      for (Store* s : {a.value().get(), &r}) {
        Buffers& out = s == &r ? out_r : out_a;
        ASSERT_TRUE(s->submit(i, kb).is_ok());
        ASSERT_TRUE(s->forward(i, out.views).is_ok());
      }
      EXPECT_TRUE(same_outputs(out_a, out_r)) << "step " << i;
      fill_random(rng, out_a);
      ASSERT_TRUE((*a)->backward(i, out_a.cviews).is_ok());
      ASSERT_TRUE(r.backward(i, out_a.cviews).is_ok());
      EXPECT_TRUE(same_state(snapshot(**a), snapshot(r))) << "step " << i;
    }
  }
}

// What open_checkpoint refuses, opening nothing: a checkpoint saved before manifests recorded the
// config (which still loads into an open store), and an override of a field that changes results.
TEST_F(Checkpoint, ReopenRefusesAnOldCheckpointAndOverridesThatChangeResults) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  const auto rows = [](StoreConfig& c) { c.tables[1].spec.rows += 1; };
  const Status changed = Store::open_checkpoint(dir_.string(), rows).status();
  EXPECT_EQ(changed.code(), StatusCode::kInvalidArgument) << changed.to_string();
  EXPECT_NE(changed.message().find("open_checkpoint '" + dir_.string() + "': table '" + config_.tables[1].spec.name +
                                   "' rows " + std::to_string(config_.tables[1].spec.rows + 1) +
                                   " differs from the checkpoint's " + std::to_string(config_.tables[1].spec.rows)),
            std::string::npos)
      << changed.message();
  // What may be overridden is what may differ per rank, listed from the one list (config_agreement.cpp).
  EXPECT_NE(changed.message().find("(overrides may change only what may differ per rank and never changes results: "
                                   "threads, numa, numa_node, huge_pages, fake_numa_nodes, device, offload_gather, "
                                   "cache.policy, cache.lookahead, cache.planner_partitions, cache.transfer, each "
                                   "table's cache; set learning rates after opening)"),
            std::string::npos)
      << changed.message();
  const auto placement = [](StoreConfig& c) { c.tables[0].placement = Placement::kOffload; };
  EXPECT_NE(Store::open_checkpoint(dir_.string(), placement).status().message().find("placement 'offload' differs"),
            std::string::npos);

  rewrite_manifest([](nlohmann::json& j) { j.erase("config"); });
  const Status old = Store::open_checkpoint(dir_.string()).status();
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition) << old.to_string();
  EXPECT_NE(old.message().find("the manifest holds no store config, so the checkpoint cannot be reopened alone"),
            std::string::npos)
      << old.message();
  auto b = Store::open(config_);
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
}

// A save of another config that replaces the checkpoint while open_checkpoint reads it: the store
// opens with the new manifest's config and rows, never one manifest's config with another's rows.
TEST_F(Checkpoint, ReopenWhileASaveOfAnotherConfigReplacesTheCheckpointTakesOneManifestWhole) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  StoreConfig other = config_;
  other.tables[0].spec.dim += 1;
  other.tables[0].spec.optimizer.weight_decay = 0.5f;
  auto c = Store::open(other);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  int opens = 0;
  detail::set_before_open_hook([&](const std::string&) {
    if (opens++ == 0) {
      ASSERT_TRUE((*c)->save(dir_).is_ok());
    }
  });
  auto r = Store::open_checkpoint(dir_.string());
  detail::set_before_open_hook({});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(to_json((*r)->config()), to_json(other));
  EXPECT_TRUE(same_state(snapshot(**c), snapshot(**r)));
}

// read_rows/write_rows by table name, as the other calls take it.
TEST_F(Checkpoint, RowsByTableName) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  const TableSpec& spec = config_.tables[0].spec;  // adam: state 2 * dim per row
  const std::size_t sd = static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim));
  std::vector<float> w(static_cast<std::size_t>(spec.dim) * 2), st(sd * 2), w0(w.size()), st0(st.size());
  ASSERT_TRUE((*a)->read_rows(spec.name, 1, 2, w.data(), st.data()).is_ok());
  ASSERT_TRUE((*a)->read_rows(0, 1, 2, w0.data(), st0.data()).is_ok());
  EXPECT_EQ(w, w0);
  EXPECT_EQ(st, st0);
  for (float& x : w) x += 1.0f;
  ASSERT_TRUE((*a)->write_rows(spec.name, 1, 2, w.data(), nullptr).is_ok());
  ASSERT_TRUE((*a)->read_rows(0, 1, 2, w0.data(), nullptr).is_ok());
  EXPECT_EQ(w, w0);
  const Status unknown = (*a)->read_rows("nope", 0, 1, w.data(), nullptr);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("read_rows: unknown table 'nope'"), std::string::npos) << unknown.message();
  EXPECT_EQ((*a)->write_rows("nope", 0, 1, w.data(), nullptr).code(), StatusCode::kNotFound);
}

TEST_F(Checkpoint, SecondSaveReplacesTheFirstAndRemovesOldFiles) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  train(**a, 2, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1 + 3);  // MANIFEST + one file per table
  auto b = Store::open(config_);
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
}

// A manifest that exists but cannot be read (corrupt here; a newer format or an I/O error alike)
// names files a save would otherwise delete as stale: the save is refused and touches nothing.
// (From a review: save used to start over at generation 1 and remove every other table file.)
TEST_F(Checkpoint, SaveOverAManifestItCannotReadIsRefusedAndTouchesNothing) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  train(**a, 2, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());  // generation 2: files *.2.tbl
  {
    std::fstream f(dir_ / "MANIFEST", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(3);
    f << "#";  // a flipped byte: the checksum no longer matches
  }
  std::map<std::string, std::uintmax_t> before;
  for (const auto& e : fs::directory_iterator(dir_)) before[e.path().filename().string()] = fs::file_size(e.path());
  const Status st = (*a)->save(dir_);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("manifest cannot be read"), std::string::npos) << st.to_string();
  std::map<std::string, std::uintmax_t> after;
  for (const auto& e : fs::directory_iterator(dir_)) after[e.path().filename().string()] = fs::file_size(e.path());
  EXPECT_EQ(before, after);
  fs::remove(dir_ / "MANIFEST");  // the user moved it away: saving works again
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  // Bytes after the checksum line are corruption too.
  { std::ofstream(dir_ / "MANIFEST", std::ios::binary | std::ios::app) << "garbage"; }
  EXPECT_EQ((*a)->load(dir_).code(), StatusCode::kDataLoss);
  EXPECT_FALSE((*a)->save(dir_).is_ok());
}

TEST_F(Checkpoint, CrashMidSaveLeavesThePreviousCheckpointIntact) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  const Snapshot saved = snapshot(**a);
  train(**a, 2, 2);
  for (std::int64_t budget : {0, 10, 100, 5000}) {
    detail::set_fault_after_bytes(budget);
    Status s = (*a)->save(dir_);
    detail::set_fault_after_bytes(-1);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << budget;
    auto b = Store::open(config_);
    ASSERT_TRUE((*b)->load(dir_).is_ok()) << "after a fault at byte " << budget;
    EXPECT_TRUE(same_state(saved, snapshot(**b)));
    EXPECT_EQ((*b)->step(), 2);
  }
}

TEST_F(Checkpoint, CorruptionIsDetectedAndChangesNothing) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(config_);
  const Snapshot fresh = snapshot(**b);
  const std::string victim = table_file(2);
  overwrite_near_end(victim);
  Status s = (*b)->load(dir_);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**b)));  // the earlier tables were not loaded either
  EXPECT_EQ((*b)->step(), 0);
}

TEST_F(Checkpoint, TruncatedTableFileAndManifest) {
  auto a = Store::open(config_);
  train(**a, 1, 1);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(config_);
  const Snapshot fresh = snapshot(**b);
  fs::resize_file(table_file(1), fs::file_size(table_file(1)) - 8);
  Status s = (*b)->load(dir_);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**b)));
  fs::resize_file(dir_ / "MANIFEST", fs::file_size(dir_ / "MANIFEST") / 2);
  EXPECT_EQ((*b)->load(dir_).code(), StatusCode::kDataLoss);
  EXPECT_EQ((*b)->load(dir_ / "missing").code(), StatusCode::kNotFound);
}

TEST_F(Checkpoint, CheckpointFromAnotherConfigIsRejected) {
  auto a = Store::open(config_);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  StoreConfig other = config_;
  other.tables[1].spec.rows += 1;
  auto b = Store::open(other);
  Status s = (*b)->load(dir_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table '" + other.tables[1].spec.name + "': rows"), std::string::npos) << s.message();
  other = config_;
  other.tables[0].spec.optimizer.kind = OptimizerKind::kSgd;
  EXPECT_NE((*Store::open(other))->load(dir_).message().find("optimizer adam in the checkpoint (expected sgd"),
            std::string::npos);
  other = config_;
  other.tables.pop_back();
  EXPECT_NE((*Store::open(other))->load(dir_).message().find("that the store config does not define"),
            std::string::npos);
}

// A table's optimizer state element type is recorded (only when it is not fp32, so manifests of fp32
// state read and write as before): bf16 state round-trips bit for bit, and a checkpoint whose state
// is of another element type than the store's is refused, naming both, with nothing changed (it
// loaded, rounding or widening the state without a word).
TEST_F(Checkpoint, HalfStateRoundTripsAndAnotherStateDtypeIsRefused) {
  StoreConfig half = config_;
  for (TableConfig& t : half.tables) t.placement = Placement::kCpu;
  const std::string name = half.tables[0].spec.name;  // adam
  half.tables[0].spec.dtype = DType::kBF16;
  half.tables[0].spec.state_dtype = DType::kBF16;
  StoreConfig fp32_state = half;
  fp32_state.tables[0].spec.state_dtype = DType::kF32;
  auto a = Store::open(half);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  train(**a, 1, 3);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(half);
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_TRUE(same_state(snapshot(**a), snapshot(**b)));
  for (const bool saved_half : {true, false}) {
    SCOPED_TRACE(saved_half ? "bf16 state into fp32" : "fp32 state into bf16");
    if (!saved_half) {
      auto f = Store::open(fp32_state);
      ASSERT_TRUE(f.is_ok());
      train(**f, 1, 3);
      ASSERT_TRUE((*f)->save(dir_).is_ok());
    }
    auto c = Store::open(saved_half ? fp32_state : half);
    ASSERT_TRUE(c.is_ok());
    const Snapshot before = snapshot(**c);
    const Status st = (*c)->load(dir_);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(
        st.message().find(
            "table '" + name + "': state_dtype " + (saved_half ? "bf16" : "fp32") + " in the checkpoint (expected " +
            (saved_half ? "fp32" : "bf16") +
            " from the store config; load_converting_dtypes (Python: load(dir, convert_dtypes=True)) converts it)"),
        std::string::npos)
        << st.message();
    EXPECT_TRUE(same_state(before, snapshot(**c)));
    EXPECT_EQ((*c)->step(), 0);
  }
}

// load_converting_dtypes: a checkpoint of half-size rows and state loads into fp32 tables widened
// (exactly), and one of fp32 tables into half-size ones rounded to nearest (the values write_rows
// stores for the same floats); the step and rates come along as with load.
TEST_F(Checkpoint, LoadConvertingDtypesWidensOrRoundsToNearest) {
  StoreConfig half = config_, wide = config_;
  for (StoreConfig* c : {&half, &wide})
    for (TableConfig& t : c->tables) t.placement = Placement::kCpu;
  half.tables[0].spec.dtype = DType::kBF16;  // adam: bf16 state too
  half.tables[0].spec.state_dtype = DType::kBF16;
  half.tables[1].spec.dtype = DType::kF16;
  for (const bool from_half : {true, false}) {
    SCOPED_TRACE(from_half ? "half into fp32" : "fp32 into half");
    const StoreConfig& saved_config = from_half ? half : wide;
    const StoreConfig& load_config = from_half ? wide : half;
    auto a = Store::open(saved_config);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    train(**a, 1, 3);
    fs::remove_all(dir_);
    ASSERT_TRUE((*a)->save(dir_).is_ok());
    // What the loaded store must hold: the saved rows written through write_rows.
    auto want = Store::open(load_config);
    ASSERT_TRUE(want.is_ok());
    const Snapshot saved = snapshot(**a);
    for (int t = 0; t < static_cast<int>(saved.weights.size()); ++t)
      ASSERT_TRUE((*want)
                      ->write_rows(t, 0, load_config.tables[static_cast<std::size_t>(t)].spec.rows,
                                   saved.weights[static_cast<std::size_t>(t)].data(),
                                   saved.state[static_cast<std::size_t>(t)].empty()
                                       ? nullptr
                                       : saved.state[static_cast<std::size_t>(t)].data())
                      .is_ok());
    auto b = Store::open(load_config);
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ((*b)->load(dir_).code(), StatusCode::kInvalidArgument);  // not without asking
    const Status loaded = (*b)->load_converting_dtypes(dir_);
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
    EXPECT_TRUE(same_state(snapshot(**want), snapshot(**b)));
    if (from_half) {
      EXPECT_TRUE(same_state(saved, snapshot(**b)));  // widening is exact
    }
    EXPECT_EQ((*b)->step(), (*a)->step());
  }
  // An fp32 value that fp16 cannot hold (it would round to an infinity) refuses the converting load before any row
  // changes, naming the piece, the record and the value.
  auto a = Store::open(wide);
  ASSERT_TRUE(a.is_ok());
  const TableSpec& f16 = half.tables[1].spec;
  std::vector<float> row(static_cast<std::size_t>(f16.dim), 0.25f);
  row[1] = 1e5f;
  ASSERT_TRUE((*a)->write_rows(1, 3, 1, row.data(), nullptr).is_ok());
  fs::remove_all(dir_);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(half);
  ASSERT_TRUE(b.is_ok());
  const Snapshot before = snapshot(**b);
  const Status st = (*b)->load_converting_dtypes(dir_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("table '" + f16.name + "', rows 0-" + std::to_string(f16.rows - 1)), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("record 3, weight column 1 is 100000, which fp16 cannot hold"), std::string::npos)
      << st.message();
  EXPECT_TRUE(same_state(before, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 0);
}

// config_ on `cpu` with a bf16 table of bf16 adam state, an fp16 table of rowwise_adagrad (its one state element a row
// is fp32) and an fp32 table.
StoreConfig half_tables(StoreConfig c) {
  for (TableConfig& t : c.tables) t.placement = Placement::kCpu;
  c.tables[0].spec.dtype = DType::kBF16;  // adam
  c.tables[0].spec.state_dtype = DType::kBF16;
  c.tables[1].spec.dtype = DType::kF16;
  c.tables[1].spec.optimizer.kind = OptimizerKind::kRowwiseAdagrad;
  return c;
}

// Format 3: a store with half-size tables saves each element at its own size, a table file of rows x (dim x 2 + its
// state's bytes) and a 64-byte header (an fp32 table's as in format 1), and loads back bit for bit, NaN payloads and
// signed zeros included, and reopens alone; converted into fp32 tables, saved (format 1: fp32 only) and converted back
// it is the same. A corrupt or missing piece is refused naming it, nothing changed.
TEST_F(Checkpoint, HalfTablesSaveAtTheirOwnSizeAndLoadBitForBit) {
  const StoreConfig half = half_tables(config_);
  StoreConfig wide = half;
  for (TableConfig& t : wide.tables) t.spec.dtype = t.spec.state_dtype = DType::kF32;
  const Snapshot values = typed_values(half);
  auto a = Store::open(half);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  write_snapshot(**a, values);
  ASSERT_TRUE((*a)->set_step(9).is_ok());
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  const auto version = [&] {
    Result<detail::Manifest> m = detail::read_manifest(dir_.string());
    return m ? m.value().version : 0u;
  };
  EXPECT_EQ(version(), detail::kTypedFormatVersion);
  for (int t = 0; t < 3; ++t) {
    const TableSpec& spec = half.tables[static_cast<std::size_t>(t)].spec;
    const std::int64_t state_bytes =
        std::int64_t{optimizer_state_dim(spec.optimizer.kind, spec.dim)} * element_bytes(spec.state_dtype);
    EXPECT_EQ(fs::file_size(table_file(t)),
              static_cast<std::uintmax_t>(64 + spec.rows * (spec.dim * element_bytes(spec.dtype) + state_bytes)))
        << spec.name << " (" << to_string(spec.dtype) << ", state " << to_string(spec.state_dtype) << ")";
  }
  auto b = Store::open(half);
  ASSERT_TRUE(b.is_ok());
  ASSERT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_TRUE(same_state(values, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 9);
  auto reopened = Store::open_checkpoint(dir_.string());
  ASSERT_TRUE(reopened.is_ok()) << reopened.status().to_string();
  EXPECT_TRUE(same_state(values, snapshot(**reopened)));

  // Into fp32 and back.
  auto w = Store::open(wide);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->load_converting_dtypes(dir_).is_ok());
  EXPECT_TRUE(same_state(values, snapshot(**w)));  // widened: exact
  ASSERT_TRUE((*w)->save(dir_).is_ok());
  EXPECT_EQ(version(), detail::kFormatVersion);
  auto c = Store::open(half);
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE((*c)->load_converting_dtypes(dir_).is_ok());
  EXPECT_TRUE(same_state(values, snapshot(**c)));
  ASSERT_TRUE((*c)->save(dir_).is_ok());

  // A byte changed, a piece gone.
  auto d = Store::open(half);
  ASSERT_TRUE(d.is_ok());
  const Snapshot fresh = snapshot(**d);
  const std::string victim = table_file(0);
  overwrite_near_end(victim);
  Status st = (*d)->load(dir_);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
  EXPECT_NE(st.message().find(victim + " (table 't0'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.message();
  const std::string gone = table_file(1);
  fs::remove(gone);
  st = (*d)->load(dir_);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(gone), std::string::npos) << st.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**d)));
  EXPECT_EQ((*d)->step(), 0);
}

// A converting load of a format 3 checkpoint whose bf16 rows hold a value fp16 cannot (99840, bf16's nearest to 1e5;
// fp16's largest is 65504) into a store whose table is fp16 is refused naming the piece, the record, the column and the
// value, before any table changes (t0, converted bf16 to fp32 first, included): rows, state, step and rates as before.
// The same checkpoint into fp32 tables is widened bit for bit.
TEST_F(Checkpoint, ConvertingAHalfCheckpointIntoAnElementTypeThatCannotHoldItIsRefusedAndChangesNothing) {
  StoreConfig half = half_tables(config_);
  half.tables[2].spec.dtype = DType::kBF16;
  StoreConfig narrow = half, wide = half;
  narrow.tables[0].spec.dtype = DType::kF32;
  narrow.tables[2].spec.dtype = DType::kF16;
  for (TableConfig& t : wide.tables) t.spec.dtype = t.spec.state_dtype = DType::kF32;
  const TableSpec& spec = half.tables[2].spec;
  Snapshot values = typed_values(half);
  for (float& x : values.weights[2])  // t2's others fp16 holds: those past its largest scaled by 2^-128 (exact)
    if (std::fabs(x) > 65504.0f && !std::isnan(x)) x = std::ldexp(x, -128);
  const std::int64_t row = spec.rows - 1, col = spec.dim - 1;
  values.weights[2][static_cast<std::size_t>(row * spec.dim + col)] = 99840.0f;
  auto a = Store::open(half);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  write_snapshot(**a, values);
  ASSERT_TRUE((*a)->set_step(9).is_ok());
  ASSERT_TRUE((*a)->set_learning_rate(half.tables[0].spec.name, 0.125f).is_ok());
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  Result<detail::Manifest> m = detail::read_manifest(dir_.string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m.value().version, detail::kTypedFormatVersion);

  auto b = Store::open(narrow);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const Snapshot before = snapshot(**b);
  const Status st = (*b)->load_converting_dtypes(dir_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  for (const std::string& part :
       {table_file(2) + " (table '" + spec.name + "'", "record " + std::to_string(row) + ", weight column " +
                                                           std::to_string(col) + " is 99840, which fp16 cannot hold"})
    EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
  EXPECT_TRUE(same_state(before, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 0);
  EXPECT_EQ((*b)->learning_rate(half.tables[0].spec.name).value(), half.tables[0].spec.optimizer.learning_rate);

  auto w = Store::open(wide);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->load_converting_dtypes(dir_).is_ok());
  EXPECT_TRUE(same_state(values, snapshot(**w)));
  EXPECT_EQ((*w)->step(), 9);
  EXPECT_EQ((*w)->learning_rate(half.tables[0].spec.name).value(), 0.125f);
}

// Before format 3 a checkpoint held every element as fp32, half-size tables' too: format 1 (a store) and format 2 (a
// world's pieces). Both still load bit for bit. Written here by hand as those builds wrote them: the header, the fp32
// records, the manifest's CRC over both.
TEST_F(Checkpoint, HalfTablesOfFormatsOneAndTwoStillLoadBitForBit) {
  const StoreConfig half = half_tables(config_);
  const Snapshot values = typed_values(half);
  for (const std::uint32_t version : {detail::kFormatVersion, detail::kWorldFormatVersion}) {
    SCOPED_TRACE("format " + std::to_string(version));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    detail::Manifest m;
    m.version = version;
    m.generation = 4;
    m.step = 9;
    m.save_id = version == detail::kFormatVersion ? 0 : 0x5eedull;
    m.config = to_json(half);
    for (std::size_t t = 0; t < half.tables.size(); ++t) {
      const TableSpec& spec = half.tables[t].spec;
      const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
      detail::PieceHeader h{};  // format 1's TableHeader has the same first fields
      std::memcpy(h.magic, detail::kTableMagic, sizeof h.magic);
      h.version = version;
      h.dtype = static_cast<std::uint32_t>(spec.dtype);
      h.rows = spec.rows;
      h.cols = spec.dim;
      h.state_dim = sd;
      h.optimizer = static_cast<std::uint32_t>(spec.optimizer.kind);
      detail::ManifestTable mt = detail::manifest_entry(spec);
      std::string file = spec.name + ".4.tbl";
      if (version == detail::kWorldFormatVersion) {
        h.row_step = 1;
        h.table_dim = spec.dim;
        h.save_id = m.save_id;
        mt.sharding = "table";
        file = detail::piece_file_name(spec.name, 4, m.save_id, 0);
      }
      std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
      for (std::int64_t r = 0; r < spec.rows; ++r) {
        bytes.append(reinterpret_cast<const char*>(&values.weights[t][static_cast<std::size_t>(r * spec.dim)]),
                     sizeof(float) * static_cast<std::size_t>(spec.dim));
        bytes.append(reinterpret_cast<const char*>(values.state[t].data() + r * sd),
                     sizeof(float) * static_cast<std::size_t>(sd));
      }
      std::ofstream(dir_ / file, std::ios::binary) << bytes;
      mt.pieces.push_back(
          {file, 0, detail::whole_box(spec.rows, spec.dim), bytes.size(), detail::crc32c(bytes.data(), bytes.size())});
      m.tables.push_back(mt);
    }
    std::ofstream(dir_ / "MANIFEST", std::ios::binary) << detail::manifest_text(m);
    auto b = Store::open(half);
    ASSERT_TRUE(b.is_ok());
    const Status loaded = (*b)->load(dir_);
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
    EXPECT_TRUE(same_state(values, snapshot(**b)));
    EXPECT_EQ((*b)->step(), 9);
  }
}

TEST_F(Checkpoint, LoadRefusedWithBatchesInFlight) {
  auto a = Store::open(config_);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  std::mt19937_64 rng(3);
  ASSERT_TRUE((*a)->submit(1, random_batch(rng, config_, 4)).is_ok());
  EXPECT_EQ((*a)->load(dir_).code(), StatusCode::kFailedPrecondition);
}

// A save that commits between load reading the manifest and opening the files it names removes
// those files: load starts over with the new manifest and applies that checkpoint, whole.
TEST_F(Checkpoint, LoadStartsOverWhenASaveReplacesTheCheckpointMidway) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  train(**a, 2, 2);
  const Snapshot second = snapshot(**a);
  auto b = Store::open(config_);
  int opens = 0;
  detail::set_before_open_hook([&](const std::string&) {
    if (opens++ == 0) {
      ASSERT_TRUE((*a)->save(dir_).is_ok());
    }
  });
  const Status s = (*b)->load(dir_);
  detail::set_before_open_hook({});
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(same_state(second, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 4);
}

// When saves keep replacing the checkpoint faster than load can open it, load gives up with an
// error that says so, having changed nothing.
TEST_F(Checkpoint, LoadGivesUpWhenSavesKeepReplacingTheCheckpoint) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  auto b = Store::open(config_);
  const Snapshot fresh = snapshot(**b);
  detail::set_before_open_hook([&](const std::string&) { ASSERT_TRUE((*a)->save(dir_).is_ok()); });
  const Status s = (*b)->load(dir_);
  detail::set_before_open_hook({});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_NE(s.message().find("the checkpoint was replaced 10 times while load read it"), std::string::npos)
      << s.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 0);
  EXPECT_TRUE((*b)->load(dir_).is_ok());  // once the saves stop
}

// A manifest's `file` entries name files of the checkpoint directory: one with path components
// (which load used to follow outside the directory) is refused, naming the table and the value,
// and so is a negative step. Nothing changes.
TEST_F(Checkpoint, ManifestWithAPathOrANegativeStepIsRefused) {
  auto a = Store::open(config_);
  train(**a, 1, 2);
  ASSERT_TRUE((*a)->save(dir_).is_ok());
  const std::string name = config_.tables[1].spec.name;
  const std::string file = fs::path(table_file(1)).filename().string();
  // Valid copies of the table file where each edited entry points, so only the name is wrong.
  const fs::path outside = dir_.string() + "_outside";
  fs::create_directories(outside);
  fs::create_directories(dir_ / "sub");
  fs::copy_file(table_file(1), outside / file, fs::copy_options::overwrite_existing);
  fs::copy_file(table_file(1), dir_ / "sub" / file, fs::copy_options::overwrite_existing);
  const fs::path manifest = dir_ / "MANIFEST";
  const fs::path saved = dir_.string() + "_manifest";
  fs::copy_file(manifest, saved, fs::copy_options::overwrite_existing);
  auto b = Store::open(config_);
  const Snapshot fresh = snapshot(**b);
  for (const std::string& bad : {"../" + outside.filename().string() + "/" + file, "sub/" + file,
                                 fs::absolute(table_file(1)).string(), std::string(".."), std::string("")}) {
    fs::copy_file(saved, manifest, fs::copy_options::overwrite_existing);
    edit_manifest("\"file\": \"" + file + "\"", "\"file\": \"" + bad + "\"");
    const Status s = (*b)->load(dir_);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << bad << ": " << s.to_string();
    EXPECT_NE(
        s.message().find("table '" + name + "': file '" + bad + "' is not a file name inside the checkpoint directory"),
        std::string::npos)
        << s.message();
    EXPECT_TRUE(same_state(fresh, snapshot(**b))) << bad;
    EXPECT_EQ((*b)->step(), 0) << bad;
  }
  fs::copy_file(saved, manifest, fs::copy_options::overwrite_existing);
  edit_manifest("\"step\": 2", "\"step\": -2");
  const Status s = (*b)->load(dir_);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  EXPECT_NE(s.message().find("step -2 (expected a step count from 0 to 9223372036854775806; corrupt)"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 0);
  // A step whose next backward (step + 1) would overflow.
  fs::copy_file(saved, manifest, fs::copy_options::overwrite_existing);
  edit_manifest("\"step\": 2", "\"step\": 9223372036854775807");
  const Status max = (*b)->load(dir_);
  EXPECT_EQ(max.code(), StatusCode::kDataLoss) << max.to_string();
  EXPECT_NE(max.message().find("step 9223372036854775807 (expected a step count from 0 to 9223372036854775806"),
            std::string::npos)
      << max.message();
  EXPECT_TRUE(same_state(fresh, snapshot(**b)));
  EXPECT_EQ((*b)->step(), 0);
  // The untouched manifest still loads.
  fs::copy_file(saved, manifest, fs::copy_options::overwrite_existing);
  EXPECT_TRUE((*b)->load(dir_).is_ok());
  EXPECT_EQ((*b)->step(), 2);
  fs::remove_all(outside);
  fs::remove(saved);
}

TEST_F(Checkpoint, NpyExportImport) {
  auto a = Store::open(config_);
  train(**a, 1, 3);
  fs::create_directories(dir_);
  const std::string name = config_.tables[1].spec.name;
  const std::string path = dir_ / "t.npy";
  ASSERT_TRUE((*a)->export_npy(name, path).is_ok());
  auto b = Store::open(config_);
  ASSERT_TRUE((*b)->import_npy(name, path).is_ok());
  EXPECT_EQ(snapshot(**a).weights[1], snapshot(**b).weights[1]);
  // Wrong table shape: clear error naming the table, nothing changes.
  const Snapshot before = snapshot(**b);
  Status s = (*b)->import_npy(config_.tables[0].spec.name, path);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("table '" + config_.tables[0].spec.name + "'"), std::string::npos) << s.message();
  EXPECT_TRUE(same_state(before, snapshot(**b)));
  EXPECT_EQ((*b)->export_npy("nope", path).code(), StatusCode::kNotFound);
}

// export_npy of half-size tables: fp16 rows as '<f2' (NumPy's float16), bf16 rows widened to '<f4'
// (NumPy has no bf16), each exactly; import_npy takes either and rounds to nearest into the table's
// dtype: a bf16 table imports its own export bit for bit, and an fp32 file's values rounded.
TEST_F(Checkpoint, NpyOfHalfTablesKeepsTheirValuesAndImportRoundsToNearest) {
  StoreConfig half = config_;
  for (TableConfig& t : half.tables) t.placement = Placement::kCpu;
  half.tables[0].spec.dtype = DType::kF16;
  half.tables[1].spec.dtype = DType::kBF16;
  auto a = Store::open(half);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  train(**a, 1, 3);
  fs::create_directories(dir_);
  auto b = Store::open(half);
  ASSERT_TRUE(b.is_ok());
  for (int t = 0; t < 2; ++t) {
    const TableSpec& spec = half.tables[static_cast<std::size_t>(t)].spec;
    const std::string path = dir_ / (spec.name + ".npy");
    ASSERT_TRUE((*a)->export_npy(spec.name, path).is_ok());
    std::ifstream in(path, std::ios::binary);
    std::string head(128, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    const auto header = parse_npy_header(head);
    ASSERT_TRUE(header.is_ok()) << header.status().to_string();
    EXPECT_EQ(header->descr, spec.dtype == DType::kF16 ? "<f2" : "<f4") << spec.name;
    ASSERT_TRUE((*b)->import_npy(spec.name, path).is_ok());
    const std::vector<float> saved = snapshot(**a).weights[static_cast<std::size_t>(t)];
    const std::vector<float> back = snapshot(**b).weights[static_cast<std::size_t>(t)];
    ASSERT_EQ(saved.size(), back.size());
    EXPECT_EQ(std::memcmp(saved.data(), back.data(), 4 * saved.size()), 0) << spec.name;
  }
  // fp32 values that bf16 does not hold: rounded to nearest even, the state left as it was.
  const TableSpec& spec = half.tables[1].spec;
  std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + static_cast<float>(i % 97) * 0.0001f;
  const std::string path = dir_ / "wide.npy";
  ASSERT_TRUE(write_npy(path, w.data(), spec.rows, spec.dim).is_ok());
  const Snapshot before = snapshot(**b);
  ASSERT_TRUE((*b)->import_npy(spec.name, path).is_ok());
  const Snapshot after = snapshot(**b);
  for (std::size_t i = 0; i < w.size(); ++i)
    ASSERT_EQ(float_bits(after.weights[1][i]), float_bits(widen_bf16(narrow_bf16_rne(w[i])))) << "element " << i;
  ASSERT_EQ(after.state[1].size(), before.state[1].size());
  EXPECT_EQ(std::memcmp(after.state[1].data(), before.state[1].data(), 4 * before.state[1].size()), 0);
  // A value the table's dtype cannot hold (it would round to an infinity) is refused, naming it, in
  // import_npy and write_rows of the store and of the reference: nothing changes.
  const TableSpec& f16 = half.tables[0].spec;
  std::vector<float> big(static_cast<std::size_t>(f16.rows * f16.dim), 1.0f);
  big[static_cast<std::size_t>(f16.dim) + 2] = 65520.0f;  // fp16's largest is 65504; from 65520 it rounds to inf
  ASSERT_TRUE(write_npy(path, big.data(), f16.rows, f16.dim).is_ok());
  auto ref = open_reference_store(half);
  ASSERT_TRUE(ref.is_ok());
  for (Store* s : {b->get(), ref->get()}) {
    const Snapshot held = snapshot(*s);
    for (const bool npy : {true, false}) {
      const Status st = npy ? s->import_npy(f16.name, path) : s->write_rows(0, 0, f16.rows, big.data(), nullptr);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(st.message().find("table '" + f16.name +
                                  "': write_rows weight of row 1, column 2 is 65520, which fp16 "
                                  "cannot hold (expected a magnitude below 65520"),
                std::string::npos)
          << st.message();
      EXPECT_TRUE(same_state(held, snapshot(*s)));
    }
  }
  big[static_cast<std::size_t>(f16.dim) + 2] = 65519.0f;  // rounds to 65504
  EXPECT_TRUE((*b)->write_rows(0, 0, f16.rows, big.data(), nullptr).is_ok());
}

}  // namespace
}  // namespace strata
