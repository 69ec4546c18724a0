// World checkpoints of sharded dynamic tables (format 5, store/io/detail/world_checkpoint.hpp): a world of N thread
// ranks (1: a store without a world, format 4) trains dynamic tables sharded by row ('user') and by table ('ad'),
// evicting and expiring, saves, and loads into M ranks (1: a store without a world). The same layout (N == M) restores
// each rank's shard exactly and continues bit for bit as the uninterrupted world; another (a reshard) gives each rank
// the keys it owns now, with their weights, state, last use and count, ordered by last use, then saving rank, then
// position, on rows 0 to n - 1, at the saved clock, with an empty sketch. A corrupt piece, or a reshard that overflows
// a shard, is refused on every rank naming it, and nothing changes.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/shard_layout.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/detail/world_checkpoint.hpp"
#include "store/io/file_io.hpp"
#include "tests/sanitizers.hpp"
#include "tests/store/dynamic_harness.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using detail::DynamicState;

constexpr int kTimeoutMs = 60000;
constexpr int kTables[] = {0, 2};  // the dynamic tables: user (row sharding), ad (table sharding)
constexpr std::int64_t kTtl = 6;

// user (dynamic, capacity 32: shards of 16, 11 or 10, and 8 rows over 2, 3 and 4 ranks; admit_after 2: a sketch; lfu;
// adagrad), item (dense) and ad (dynamic, capacity 16, admit_after 2, table-sharded: its owner, 2 % world, moves with
// the world size); gpu and hybrid tables on thread ranks (or in a store without a world).
StoreConfig test_config() {
  const Case k{"x", 2, Eviction::kLfu, kTtl, Unseen::kZeros, DType::kF32, OptimizerKind::kAdagrad, false};
  StoreConfig c = thread_rank_config(64 << 20);
  c.tables = config_of(k).tables;
  c.device.emu_max_delay_us = 20;
  c.tables[0].spec.rows = 32;
  c.tables[2].spec.rows = 16;
  c.tables[2].dynamic->admit_after = 2;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    TableConfig& tc = c.tables[t];
    tc.placement = t == 1 ? Placement::kGpu : Placement::kHybrid;
    if (tc.placement == Placement::kHybrid) tc.cache.rows = 3;
  }
  c.tables[0].sharding.type = dispatch::ShardingType::kRow;
  c.tables[2].sharding.type = dispatch::ShardingType::kTable;
  return c;
}

// The rank that owns `key` of dynamic table `t` in a world of `world` ranks (0 or 1: a store without a world, 0).
int owner_of(const StoreConfig& c, int t, int world, Key key) {
  if (world <= 1) return 0;
  TableSpec served = c.tables[static_cast<std::size_t>(t)].spec;
  served.rows += 1;
  auto layout = dispatch::ShardLayout::make(served, c.tables[static_cast<std::size_t>(t)].sharding, world, t);
  EXPECT_TRUE(layout.is_ok()) << layout.status().to_string();
  return layout.value().key_owner(key);
}

// One step's batches and gradients, per rank.
struct Step {
  std::vector<KeyBatch> local;
  std::vector<Buffers> grads;
};

// A feature of `bags` bags of up to `most` keys drawn skewed from `space`.
JaggedKeys feature(std::mt19937_64& rng, const std::string& name, int most, const std::vector<Key>& space) {
  JaggedKeys f;
  f.table = name;
  f.offsets.push_back(0);
  for (int b = 0; b < 3; ++b) {
    const int n = static_cast<int>(rng() % static_cast<std::uint64_t>(most + 1));
    for (int j = 0; j < n; ++j) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      f.keys.push_back(space[static_cast<std::size_t>(u * u * static_cast<double>(space.size()))]);
    }
    f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
  }
  return f;
}

// `steps` steps of `ranks` ranks: `main` steps over 48 keys (every fifth not training; about as many keys a step in
// every world, so that the tables evict in each), then `cool` training steps
// over the 12 keys of `hot` only (so that the rest expire: a reshard into 3 or 4 ranks then fits), then the main kind
// again. Every batch has every feature.
std::vector<Step> make_plan(const StoreConfig& c, int ranks, int main, int cool, int steps, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Key> space = {std::numeric_limits<Key>::min(), std::numeric_limits<Key>::max(), -1, 0};
  while (space.size() < 48) space.push_back(static_cast<Key>(rng()));
  // Hot keys that fit each shard of 3 (10 rows at least) and 4 ranks (8 rows), for both tables.
  std::vector<Key> hot;
  std::vector<int> load3(3), load4(4);
  for (std::size_t i = 0; hot.size() < 12; ++i) {
    const Key k = space[i];
    const int a = owner_of(c, 0, 3, k), b = owner_of(c, 0, 4, k);
    if (load3[static_cast<std::size_t>(a)] >= 7 || load4[static_cast<std::size_t>(b)] >= 6) continue;
    ++load3[static_cast<std::size_t>(a)];
    ++load4[static_cast<std::size_t>(b)];
    hot.push_back(k);
  }
  std::vector<Step> plan(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const bool cooling = s >= main && s < main + cool;
    for (int r = 0; r < ranks; ++r) {
      KeyBatch kb;
      kb.train = cooling || s % 5 != 4;
      kb.features.push_back(feature(rng, "user", cooling ? 3 : std::max(3, 12 / ranks), cooling ? hot : space));
      JaggedKeys item;
      item.table = "item";
      item.offsets = {0, 1, 1, 2};
      item.keys = {static_cast<Key>(rng() % 6), static_cast<Key>(rng() % 6)};
      kb.features.push_back(item);
      kb.features.push_back(feature(rng, "ad", std::max(1, 4 / ranks), cooling ? hot : space));
      plan[static_cast<std::size_t>(s)].grads.push_back(make_buffers(c, kb));
      fill_random(rng, plan[static_cast<std::size_t>(s)].grads.back());
      plan[static_cast<std::size_t>(s)].local.push_back(std::move(kb));
    }
  }
  return plan;
}

// Runs steps [from, to) of `plan` on rank r's store: each submit's code and each forward's floats appended to `out`.
void run_steps(Store& s, int r, const std::vector<Step>& plan, int from, int to, std::vector<float>* out) {
  for (int i = from; i < to; ++i) {
    const Step& st = plan[static_cast<std::size_t>(i)];
    const KeyBatch& kb = st.local[static_cast<std::size_t>(r)];
    const Status x = s.submit(i, kb);
    if (out) out->push_back(static_cast<float>(x.code()));
    if (!x.is_ok()) continue;
    Buffers b = make_buffers(s.config(), kb);
    ASSERT_TRUE(s.forward(i, b.views).is_ok()) << "rank " << r << " batch " << i;
    if (out)
      for (const auto& d : b.data) out->insert(out->end(), d.begin(), d.end());
    if (kb.train)
      ASSERT_TRUE(s.backward(i, st.grads[static_cast<std::size_t>(r)].cviews).is_ok()) << "rank " << r;
    else
      ASSERT_TRUE(s.discard(i).is_ok()) << "rank " << r;
  }
}

// Runs body(rank, store) on `world` thread ranks (1: a store without a world, on this thread).
template <class Body>
void on_world(int world, const StoreConfig& c, Body body) {
  if (world == 1) {
    auto s = Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    body(0, **s);
    return;
  }
  on_ranks(world, kTimeoutMs, [&](int r, const std::shared_ptr<dispatch::Communicator>& comm) {
    auto s = Store::open(c, comm);
    ASSERT_TRUE(s.is_ok()) << "rank " << r << ": " << s.status().to_string();
    body(r, **s);
  });
}

// The dynamic tables' states of a rank (kTables order).
std::vector<DynamicState> states_of(Store& s) {
  std::vector<DynamicState> out(std::size(kTables));
  for (std::size_t i = 0; i < out.size(); ++i)
    EXPECT_TRUE(dynamic_cast<detail::DynamicAccess&>(s).read_dynamic(kTables[i], out[i]).is_ok());
  return out;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// "" when `a` and `b` are the same state bit for bit.
std::string state_difference(const DynamicState& a, const DynamicState& b) {
  if (a.clock != b.clock) return "clock " + std::to_string(a.clock) + " vs " + std::to_string(b.clock);
  if (a.entries != b.entries) return "entries differ";
  if (a.sketch != b.sketch) return "sketch differs";
  if (!same_floats(a.weights, b.weights)) return "weights differ";
  if (!same_floats(a.state, b.state)) return "state differs";
  return "";
}

// What rank `r` of `world` ranks must hold of table kTables[i] after a reshard of the saved shards `saved` (per saving
// rank): the keys it owns, by last use, then saving rank, then position, on rows 0 to n - 1, at their clock.
DynamicState resharded(const StoreConfig& c, std::size_t i, int world, int r, const std::vector<DynamicState>& saved) {
  const TableSpec& spec = c.tables[static_cast<std::size_t>(kTables[i])].spec;
  const auto dim = static_cast<std::size_t>(spec.dim);
  const auto sd = static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim));
  struct Kept {
    KeyIndex::Entry e;
    const float *w, *s;
  };
  std::vector<Kept> kept;
  for (const DynamicState& x : saved)
    for (std::size_t p = 0; p < x.entries.size(); ++p)
      if (owner_of(c, kTables[i], world, x.entries[p].key) == r)
        kept.push_back({x.entries[p], x.weights.data() + p * dim, x.state.data() + p * sd});
  std::stable_sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.e.last_use < b.e.last_use; });
  DynamicState want;
  want.clock = saved.at(0).clock;
  for (std::size_t p = 0; p < kept.size(); ++p) {
    want.entries.push_back({kept[p].e.key, static_cast<std::int64_t>(p), kept[p].e.last_use, kept[p].e.count});
    want.weights.insert(want.weights.end(), kept[p].w, kept[p].w + dim);
    want.state.insert(want.state.end(), kept[p].s, kept[p].s + sd);
  }
  return want;
}

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("strata_dyn_world_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

class DynamicWorldCheckpoint : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(DynamicWorldCheckpoint, ShardsSaveAndLoadIntoAnyWorld) {
  const int n = GetParam().first, m = GetParam().second;
  const StoreConfig c = test_config();
  constexpr int kMain = 16, kCool = 8, kMore = 6;
  const std::vector<Step> plan = make_plan(c, n, kMain, kCool, kMain + kCool + kMore, 0xc0ffee + 7 * n);
  const std::string dir = fresh_dir(std::to_string(n) + "_" + std::to_string(m));
  const auto un = static_cast<std::size_t>(n), um = static_cast<std::size_t>(m);

  // The saving world: trained, saved, and (N == M) trained on.
  std::vector<std::vector<DynamicState>> saved(un), went_on(un);
  std::vector<std::vector<float>> outputs(un);
  std::vector<std::int64_t> evictions(un);
  on_world(n, c, [&](int r, Store& s) {
    run_steps(s, r, plan, 0, kMain + kCool, nullptr);
    saved[static_cast<std::size_t>(r)] = states_of(s);
    evictions[static_cast<std::size_t>(r)] = s.stats().dynamic.at(0).second.evictions;
    const Status st = s.save(dir);
    ASSERT_TRUE(st.is_ok()) << "rank " << r << ": " << st.to_string();
    if (n != m) return;
    run_steps(s, r, plan, kMain + kCool, kMain + kCool + kMore, &outputs[static_cast<std::size_t>(r)]);
    went_on[static_cast<std::size_t>(r)] = states_of(s);
  });
  if (HasFatalFailure()) return;
  std::int64_t evicted = 0;
  for (std::int64_t e : evictions) evicted += e;
  EXPECT_GT(evicted, 0) << "the workload must evict";
  Result<detail::Manifest> manifest = detail::read_manifest(dir);
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  EXPECT_EQ(manifest.value().version, n == 1 ? detail::kDynamicFormatVersion : detail::kWorldDynamicFormatVersion);
  EXPECT_EQ(manifest.value().tables.at(0).pieces.size(), un);

  // The loading world (the saver's config: the keys it admits after the load start as the saver's would).
  std::vector<std::vector<DynamicState>> loaded(um);
  on_world(m, c, [&](int r, Store& s) {
    const Status st = s.load(dir);
    ASSERT_TRUE(st.is_ok()) << "rank " << r << ": " << st.to_string();
    loaded[static_cast<std::size_t>(r)] = states_of(s);
    if (n != m) return;
    std::vector<float> out;
    run_steps(s, r, plan, kMain + kCool, kMain + kCool + kMore, &out);
    EXPECT_TRUE(same_floats(out, outputs[static_cast<std::size_t>(r)])) << "rank " << r << ": outputs differ";
    const std::vector<DynamicState> now = states_of(s);
    for (std::size_t i = 0; i < now.size(); ++i)
      EXPECT_EQ(state_difference(now[i], went_on[static_cast<std::size_t>(r)][i]), "")
          << "rank " << r << " table " << kTables[i] << " after training on";
  });
  if (HasFatalFailure()) return;

  for (std::size_t i = 0; i < std::size(kTables); ++i) {
    std::vector<DynamicState> pieces;
    std::vector<Key> before, after;
    for (const auto& x : saved) {
      pieces.push_back(x[i]);
      for (const auto& e : x[i].entries) before.push_back(e.key);
    }
    for (std::size_t r = 0; r < um; ++r) {
      const DynamicState& got = loaded[r][i];
      for (const auto& e : got.entries) after.push_back(e.key);
      if (n == m) {  // exactly the saver's shard: rows, order, clock, sketch
        EXPECT_EQ(state_difference(got, pieces[r]), "") << "rank " << r << " table " << kTables[i];
        continue;
      }
      DynamicState want = resharded(c, i, m, static_cast<int>(r), pieces);
      want.sketch = got.sketch;
      EXPECT_EQ(state_difference(got, want), "") << "rank " << r << " table " << kTables[i];
      EXPECT_TRUE(std::all_of(got.sketch.begin(), got.sketch.end(), [](std::uint8_t b) { return b == 0; }))
          << "rank " << r << " table " << kTables[i] << ": a reshard starts with an empty sketch";
    }
    // The union of the shards' keys is the saved union (each key once: distinct pieces).
    std::sort(before.begin(), before.end());
    std::sort(after.begin(), after.end());
    EXPECT_EQ(after, before) << "table " << kTables[i];
    EXPECT_FALSE(before.empty()) << "table " << kTables[i];
  }
  fs::remove_all(dir);
}

// (N, M): 1 is a store without a world (format 4 when it saves).
INSTANTIATE_TEST_SUITE_P(Worlds, DynamicWorldCheckpoint,
                         ::testing::Values(std::make_pair(1, 3), std::make_pair(2, 2), std::make_pair(2, 4),
                                           std::make_pair(3, 2), std::make_pair(4, 1)),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& i) {
                           return std::to_string(i.param.first) + "_to_" + std::to_string(i.param.second);
                         });

// This rank's shard of the dense table (item) as fp32: its weights, then its state.
std::vector<float> dense_of(Store& s) {
  const Result<ShardInfo> si = s.shard_info(1);
  EXPECT_TRUE(si.is_ok()) << si.status().to_string();
  if (!si.is_ok()) return {};
  const std::int64_t n = si.value().local_rows, cols = si.value().local_dim;
  const std::int64_t sd = optimizer_state_dim(s.config().tables[1].spec.optimizer.kind, si.value().local_dim);
  std::vector<float> out(static_cast<std::size_t>(n * (cols + sd)));
  if (n > 0) {
    EXPECT_TRUE(s.read_shard(1, 0, n, out.data(), sd ? out.data() + n * cols : nullptr).is_ok());
  }
  return out;
}

// Loads `dir` into `world` ranks trained a few steps first (their rates then set apart from the checkpoint's): every
// rank refused with `code` and a message holding each of `names`, its dynamic tables, dense rows, rates and step as
// they were.
void expect_refused(const std::string& dir, int world, StatusCode code, const std::vector<std::string>& names) {
  const StoreConfig c = test_config();
  const std::vector<Step> plan = make_plan(c, world, 3, 0, 3, 0xbad);
  constexpr float kRate = 0.03125f;
  on_world(world, c, [&](int r, Store& s) {
    run_steps(s, r, plan, 0, 3, nullptr);
    ASSERT_TRUE(s.set_learning_rate(kRate).is_ok()) << "rank " << r;
    const std::vector<DynamicState> before = states_of(s);
    const std::vector<float> dense = dense_of(s);
    const std::int64_t step = s.step();
    const Status st = s.load(dir);
    EXPECT_EQ(st.code(), code) << "rank " << r << ": " << st.to_string();
    for (const std::string& name : names)
      EXPECT_NE(st.message().find(name), std::string::npos) << "rank " << r << ": " << st.to_string();
    EXPECT_NE(st.message().find("nothing changed"), std::string::npos) << "rank " << r << ": " << st.to_string();
    const std::vector<DynamicState> after = states_of(s);
    for (std::size_t i = 0; i < after.size(); ++i)
      EXPECT_EQ(state_difference(after[i], before[i]), "") << "rank " << r << " table " << kTables[i];
    EXPECT_TRUE(same_floats(dense_of(s), dense)) << "rank " << r << ": the dense table's rows changed";
    for (const TableConfig& t : c.tables) {
      const Result<float> rate = s.learning_rate(t.spec.name);
      ASSERT_TRUE(rate.is_ok()) << rate.status().to_string();
      EXPECT_EQ(rate.value(), kRate) << "rank " << r << " table '" << t.spec.name << "'";
    }
    EXPECT_EQ(s.step(), step) << "rank " << r;
  });
}

// A world of 2 trained 10 steps and saved into `dir`.
void save_two_ranks(const std::string& dir) {
  const StoreConfig c = test_config();
  const std::vector<Step> plan = make_plan(c, 2, 10, 0, 10, 0x5eed);
  on_world(2, c, [&](int r, Store& s) {
    run_steps(s, r, plan, 0, 10, nullptr);
    ASSERT_TRUE(s.save(dir).is_ok()) << "rank " << r;
  });
}

// A piece whose byte changed is refused naming it, on every rank, whether it is a rank's own (the same layout) or read
// by every rank (a reshard); nothing changes.
TEST(DynamicWorldCheckpointFiles, ACorruptPieceIsRefusedNamingItAndNothingChanges) {
  const std::string dir = fresh_dir("corrupt");
  save_two_ranks(dir);
  if (HasFatalFailure()) return;
  Result<detail::Manifest> manifest = detail::read_manifest(dir);
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  const std::string file = manifest.value().tables.at(0).pieces.at(1).file;
  {
    std::fstream f(dir + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    const char x = 0x5a;
    f.write(&x, 1);
  }
  expect_refused(dir, 2, StatusCode::kDataLoss, {file, "dynamic table 'user'", "checksum"});
  expect_refused(dir, 3, StatusCode::kDataLoss, {file, "dynamic table 'user'", "checksum"});
  fs::remove_all(dir);
}

// `text` (a manifest) with its JSON edited by `edit` and its checksum line remade.
std::string edited(const std::string& text, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(text.substr(0, text.rfind("\ncrc32c ")));
  edit(j);
  const std::string body = j.dump(2);
  return body + "\ncrc32c " + detail::hex32(detail::crc32c(body.data(), body.size())) + "\n";
}

// A format 5 manifest's dynamic entries are checked as the rest (each refusal naming the table and what is wrong), and
// a clock that the pieces' headers do not hold is refused at load, naming a piece, nothing changed.
TEST(DynamicWorldCheckpointFiles, AFormatFiveManifestIsCheckedAsTheRest) {
  const std::string dir = fresh_dir("manifest");
  save_two_ranks(dir);
  if (HasFatalFailure()) return;
  const std::string path = dir + "/" + detail::kManifest;
  const Result<std::string> text = detail::read_file(path);
  ASSERT_TRUE(text.is_ok());
  ASSERT_TRUE(detail::parse_manifest(path, text.value()).is_ok());
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    const Result<detail::Manifest> m = detail::parse_manifest(path, edited(text.value(), edit));
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << what << ": " << m.status().to_string();
    EXPECT_NE(m.status().message().find(what), std::string::npos) << m.status().to_string();
    EXPECT_NE(m.status().message().find("corrupt"), std::string::npos) << m.status().to_string();
  };
  // user: capacity 32 by row over 2 ranks (16 each); ad: capacity 16 by table, on rank 0.
  const auto user = [](nlohmann::json& j) -> nlohmann::json& { return j["tables"][0]["dynamic"]; };
  refused([&](nlohmann::json& j) { user(j)["pieces"][1]["capacity"] = 17; },
          "dynamic table 'user': piece 1: capacity 17 (expected 16, rank 1's shard of row sharding over 2 ranks");
  refused([&](nlohmann::json& j) { user(j)["pieces"][1]["rank"] = 0; }, "piece 1: rank 0 (expected 1");
  refused([&](nlohmann::json& j) { user(j)["pieces"].erase(1); },
          "dynamic table 'user': 1 pieces (expected one per rank of the world of 2");
  refused([&](nlohmann::json& j) { user(j)["sharding"] = "column"; }, "sharding 'column' (expected row or table");
  refused([&](nlohmann::json& j) { user(j)["clock"] = -1; }, "dynamic table 'user': clock -1 (expected >= 0");
  refused([&](nlohmann::json& j) { user(j)["pieces"][0]["keys"] = 17; },
          "piece 0: keys 17 (expected 0 to its capacity 16");
  refused([&](nlohmann::json& j) { user(j)["pieces"][0]["sketch_bytes"] = 7; }, "piece 0: capacity 16, sketch_bytes 7");
  refused([&](nlohmann::json& j) { j["tables"][2]["dynamic"]["pieces"][1]["capacity"] = 16; },
          "dynamic table 'ad': piece 0: capacity 16 (expected 0");
  // A clock the headers do not hold: the manifest parses, the load is refused naming a piece of 'user'.
  const detail::Manifest m = detail::parse_manifest(path, text.value()).value();
  ASSERT_TRUE(detail::write_file_atomic(
                  path, edited(text.value(), [&](nlohmann::json& j) { user(j)["clock"] = m.tables[0].clock + 1; }))
                  .is_ok());
  expect_refused(dir, 2, StatusCode::kDataLoss,
                 {"dynamic table 'user'", "header has clock " + std::to_string(m.tables[0].clock) + " (expected " +
                                              std::to_string(m.tables[0].clock + 1)});
  fs::remove_all(dir);
}

// A store's keys that one shard of 4 ranks cannot hold (9 keys of rank 0's shard of 8 rows): the reshard is refused on
// every rank naming the table, the rank, the keys and the capacity; nothing changes.
TEST(DynamicWorldCheckpointFiles, AReshardThatOverflowsAShardIsRefused) {
  const StoreConfig c = test_config();
  std::vector<Key> keys;
  for (Key k = 1; keys.size() < 9; ++k)
    if (owner_of(c, 0, 4, k) == 0) keys.push_back(k);
  const std::string dir = fresh_dir("overflow");
  on_world(1, c, [&](int, Store& s) {
    const std::vector<float> w(keys.size() * 8, 0.5f);
    ASSERT_TRUE(s.write_keys(0, keys, w.data(), nullptr).is_ok());
    ASSERT_TRUE(s.save(dir).is_ok());
  });
  if (HasFatalFailure()) return;
  expect_refused(dir, 4, StatusCode::kFailedPrecondition,
                 {"dynamic table 'user'", "rank 0's shard of 8 rows would hold 9", "capacity 8"});
  fs::remove_all(dir);
}

// Rank 0's and rank 1's pieces of 'user' swapped, the manifest patched to match (each entry's size, CRC and keys
// follow its file's contents): every file is whole, but each holds the other rank's keys, which the same layout refuses
// (the check that a rank's own piece holds only its keys), nothing changed.
TEST(DynamicWorldCheckpointFiles, APieceOfAnotherRankIsRefused) {
  const std::string dir = fresh_dir("swapped");
  save_two_ranks(dir);
  if (HasFatalFailure()) return;
  const std::string path = dir + "/" + detail::kManifest;
  const Result<std::string> text = detail::read_file(path);
  ASSERT_TRUE(text.is_ok());
  std::string files[2];
  const std::string patched = edited(text.value(), [&](nlohmann::json& j) {
    nlohmann::json& pieces = j["tables"][0]["dynamic"]["pieces"];
    for (int r = 0; r < 2; ++r) files[r] = pieces[r]["file"].get<std::string>();
    std::swap(pieces[0], pieces[1]);
    for (int r = 0; r < 2; ++r) {
      pieces[r]["file"] = files[r];
      pieces[r]["rank"] = r;
    }
  });
  fs::rename(dir + "/" + files[0], dir + "/swap.tmp");
  fs::rename(dir + "/" + files[1], dir + "/" + files[0]);
  fs::rename(dir + "/swap.tmp", dir + "/" + files[1]);
  ASSERT_TRUE(detail::write_file_atomic(path, patched).is_ok());
  expect_refused(dir, 2, StatusCode::kDataLoss,
                 {files[0], "dynamic table 'user'", "is rank 1's under the table's layout (expected only rank 0's"});
  fs::remove_all(dir);
}

// A piece of a saved world of 2 spoiled: (what, the table, its rank, how) -> the refusal's code and a piece of its
// text.
struct Spoiled {
  const char* name;
  int table, rank;
  std::function<void(const std::string& dir, const std::string& file, nlohmann::json& piece)> spoil;
  StatusCode code;
  std::string says;
};

std::ostream& operator<<(std::ostream& os, const Spoiled& s) { return os << s.name; }

class DynamicWorldSpoiledPiece : public ::testing::TestWithParam<Spoiled> {};

// Each refused on every rank naming the piece, nothing changed.
TEST_P(DynamicWorldSpoiledPiece, IsRefusedNamingItAndNothingChanges) {
  const Spoiled& k = GetParam();
  const std::string dir = fresh_dir(std::string("spoiled_") + k.name);
  save_two_ranks(dir);
  if (HasFatalFailure()) return;
  const std::string path = dir + "/" + detail::kManifest;
  const Result<std::string> text = detail::read_file(path);
  ASSERT_TRUE(text.is_ok());
  std::string file;
  const std::string patched = edited(text.value(), [&](nlohmann::json& j) {
    nlohmann::json& piece = j["tables"][static_cast<std::size_t>(k.table)]["dynamic"]["pieces"][k.rank];
    file = piece["file"].get<std::string>();
    k.spoil(dir, file, piece);
  });
  ASSERT_TRUE(detail::write_file_atomic(path, patched).is_ok());
  const std::string table = k.table == 0 ? "user" : "ad";
  expect_refused(dir, 2, k.code, {file, "dynamic table '" + table + "'", k.says});
  fs::remove_all(dir);
}

// The same piece of another save (a world of 2 trained alike, saved elsewhere), its manifest entry (size, CRC, keys)
// taken along: whole, but not this save's.
void foreign(const std::string& dir, const std::string& file, nlohmann::json& piece) {
  const std::string other = dir + "_other";
  save_two_ranks(other);
  const Result<detail::Manifest> m = detail::read_manifest(other);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const detail::PieceEntry& p = m.value().tables.at(0).pieces.at(1);
  fs::copy_file(other + "/" + p.file, dir + "/" + file, fs::copy_options::overwrite_existing);
  piece["bytes"] = p.bytes;
  piece["crc32c"] = detail::hex32(p.crc);
  piece["keys"] = p.keys;
  fs::remove_all(other);
}

INSTANTIATE_TEST_SUITE_P(
    Pieces, DynamicWorldSpoiledPiece,
    ::testing::Values(Spoiled{"missing", 0, 1,
                              [](const std::string& dir, const std::string& file, nlohmann::json&) {
                                fs::remove(dir + "/" + file);
                              },
                              StatusCode::kNotFound, "cannot open"},
                      Spoiled{"truncated", 0, 1,
                              [](const std::string& dir, const std::string& file, nlohmann::json&) {
                                fs::resize_file(dir + "/" + file, fs::file_size(dir + "/" + file) - 1);
                              },
                              StatusCode::kDataLoss, "truncated or corrupt"},
                      Spoiled{"foreign", 0, 1, foreign, StatusCode::kDataLoss, "header has save id"},
                      // 'ad' is table-sharded onto rank 0: rank 1's piece is its header only.
                      Spoiled{"header_only_corrupt", 2, 1,
                              [](const std::string& dir, const std::string& file, nlohmann::json& piece) {
                                ASSERT_EQ(fs::file_size(dir + "/" + file), 64u);
                                ASSERT_EQ(piece["keys"], 0);
                                std::fstream f(dir + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
                                f.seekp(20);
                                const char x = 0x5a;
                                f.write(&x, 1);
                              },
                              StatusCode::kDataLoss, "checksum"}),
    [](const ::testing::TestParamInfo<Spoiled>& i) { return std::string(i.param.name); });

// The save hook is called at kPieceHalfWritten for a dynamic table's piece as for a dense one: rank 1's first piece is
// user's (table 0), so failing rank 1 there fails the save naming that piece, and the previous checkpoint stays.
TEST(DynamicWorldCheckpointFiles, ASaveFailedHalfwayThroughADynamicPieceCommitsNothing) {
  const std::string dir = fresh_dir("halfway");
  save_two_ranks(dir);
  if (HasFatalFailure()) return;
  const Result<std::string> before = detail::read_file(dir + "/" + detail::kManifest);
  ASSERT_TRUE(before.is_ok());
  detail::set_world_save_hook([](int rank, detail::SavePoint p) {
    return rank == 1 && p == detail::SavePoint::kPieceHalfWritten ? Status::io_error("injected halfway") : Status::ok();
  });
  const StoreConfig c = test_config();
  const std::vector<Step> plan = make_plan(c, 2, 4, 0, 4, 0x4a1f);
  on_world(2, c, [&](int r, Store& s) {
    run_steps(s, r, plan, 0, 4, nullptr);
    const Status st = s.save(dir);
    EXPECT_EQ(st.code(), StatusCode::kIoError) << "rank " << r << ": " << st.to_string();
    for (const std::string& part : {std::string("rank 1"), std::string("piece 'user."), std::string("injected halfway"),
                                    std::string("nothing committed")})
      EXPECT_NE(st.message().find(part), std::string::npos) << "rank " << r << ": " << st.to_string();
  });
  detail::set_world_save_hook(nullptr);
  const Result<std::string> after = detail::read_file(dir + "/" + detail::kManifest);
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after.value(), before.value());
  fs::remove_all(dir);
}

// A communicator whose collectives wait as `inner`'s (kTimeoutMs: a rank slow to come, the machine busy, fails no
// collective) but whose timeout(), what save and load give up on a rank's local work after, is `stall`.
class ShortStall final : public dispatch::Communicator {
 public:
  ShortStall(std::shared_ptr<dispatch::Communicator> inner, std::chrono::milliseconds stall)
      : inner_(std::move(inner)), stall_(stall) {}
  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  const char* kind() const noexcept override { return inner_->kind(); }
  int local_rank() const noexcept override { return inner_->local_rank(); }
  std::chrono::milliseconds timeout() const noexcept override { return stall_; }
  Status all_reduce(void* data, std::int64_t count, dispatch::DataType type, dispatch::ReduceOp op) override {
    return inner_->all_reduce(data, count, type, op);
  }
  Status barrier() override { return inner_->barrier(); }
  void forget_device(const gpu::Device& device) noexcept override { inner_->forget_device(device); }
  dispatch::CommCounters counters() const noexcept override { return inner_->counters(); }
  Status broken() const override { return inner_->broken(); }

 private:
  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const dispatch::BufferSpace& space) override {
    return inner_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, space);
  }
  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const dispatch::BufferSpace& space) override {
    return inner_->all_gather(send, bytes, recv, space);
  }
  Status do_broadcast(void* data, std::int64_t bytes, int root, const dispatch::BufferSpace& space) override {
    return inner_->broadcast(data, bytes, root, space);
  }

  std::shared_ptr<dispatch::Communicator> inner_;
  std::chrono::milliseconds stall_;
};

// A shard whose save and load take far longer than the communicator's timeout (the review's: 2 ranks, a timeout of
// 1000 ms, 900k keys of dim 64 a rank, failed "ranks 0, 1's local I/O made no progress"; here 400k keys and 250 ms):
// its file is written and read chunk by chunk, each chunk progress, and the calls that cannot be split (read_dynamic,
// the probe restore, write_dynamic) count as progress while they run, so the world saves and loads it, bit for bit.
// (Before, its load failed: the piece was read whole, then checked, then probed, some 200 ms without progress for
// 200k keys.)
TEST(DynamicWorldCheckpointFiles, ABigShardSavesAndLoadsUnderAShortTimeout) {
  // Under the sanitizers (several times slower, and CI runs both at once) it runs the path only, with a wide margin.
  const auto kStall = std::chrono::milliseconds(full_or_sanitized(250, 5000));
  const std::int64_t kKeys = full_or_sanitized(400000, 20000);  // a rank
  constexpr std::int32_t kDim = 64;
  StoreConfig c = thread_rank_config(std::int64_t{256} << 20);
  TableConfig t;
  t.spec.name = "big";
  t.spec.rows = 2 * kKeys + 1000;
  t.spec.dim = kDim;
  t.spec.optimizer.kind = OptimizerKind::kSgd;
  t.dynamic = DynamicSpec{1, Eviction::kLru, 0, Unseen::kZeros};
  t.placement = Placement::kGpu;
  t.sharding.type = dispatch::ShardingType::kRow;
  c.tables.push_back(t);
  const std::string dir = fresh_dir("big");
  on_ranks(2, kTimeoutMs, [&](int r, const std::shared_ptr<dispatch::Communicator>& comm) {
    auto s = Store::open(c, std::make_shared<ShortStall>(comm, kStall));
    ASSERT_TRUE(s.is_ok()) << "rank " << r << ": " << s.status().to_string();
    std::vector<Key> keys;
    for (Key k = 1; static_cast<std::int64_t>(keys.size()) < kKeys; ++k)
      if (owner_of(c, 0, 2, k * 7919) == r) keys.push_back(k * 7919);
    std::vector<float> w(keys.size() * kDim);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 1000) / 1000.0f;
    ASSERT_TRUE((*s)->write_keys(0, keys, w.data(), nullptr).is_ok()) << "rank " << r;
    auto& access = dynamic_cast<detail::DynamicAccess&>(**s);
    DynamicState before, after;
    ASSERT_TRUE(access.read_dynamic(0, before).is_ok());
    const Status saved = (*s)->save(dir);
    ASSERT_TRUE(saved.is_ok()) << "rank " << r << ": " << saved.to_string();
    ASSERT_TRUE((*s)->write_keys(0, {}, nullptr, nullptr).is_ok()) << "rank " << r;
    const Status loaded = (*s)->load(dir);
    ASSERT_TRUE(loaded.is_ok()) << "rank " << r << ": " << loaded.to_string();
    ASSERT_TRUE(access.read_dynamic(0, after).is_ok());
    EXPECT_EQ(state_difference(after, before), "") << "rank " << r;
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::testing
