// Dynamic tables in checkpoints, write_keys and .npy files: a save mid-run continues bit for bit after a load (the
// production store from the reference's checkpoint and the reference from the production store's, beside the stores
// that saved them) under lru, lfu, admission thresholds and TTL; write_keys' semantics (rows, state kept or initial,
// tie order) and refusals in both stores; loads refused for a dense/dynamic mismatch, another capacity or a corrupt
// file, naming them and changing nothing; export_npy/import_npy of a dynamic table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/row_math.hpp"
#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/crc32c.hpp"
#include "store/io/detail/dynamic_piece.hpp"
#include "store/io/file_io.hpp"
#include "store/io/npy.hpp"
#include "tests/store/dynamic_harness.hpp"

namespace strata {
namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

using Opener = std::function<Result<std::unique_ptr<Store>>(const StoreConfig&)>;

Result<std::unique_ptr<Store>> open_production(const StoreConfig& c) { return Store::open(c); }

// A fresh directory under the test's temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = (fs::temp_directory_path() / ("strata_dynckpt_" + name + "_" + std::to_string(std::random_device{}())))
                .string();
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Submits, forwards and (training) backwards `kb` as batch `id` on every store, the outputs bit for bit the same; or
// every store refuses it (new keys that cannot fit).
void step_all(const std::vector<Store*>& stores, std::int64_t id, const KeyBatch& kb, std::mt19937_64& rng) {
  const StoreConfig& c = stores[0]->config();
  Buffers first = make_buffers(c, kb);
  const Status submitted = stores[0]->submit(id, kb);
  for (std::size_t i = 1; i < stores.size(); ++i)
    ASSERT_EQ(stores[i]->submit(id, kb).code(), submitted.code()) << "store " << i << ", batch " << id;
  if (!submitted.is_ok()) {
    ASSERT_EQ(submitted.code(), StatusCode::kResourceExhausted) << submitted.to_string();
    return;
  }
  for (std::size_t i = 0; i < stores.size(); ++i) {
    Store& s = *stores[i];
    Buffers b = make_buffers(c, kb);
    ASSERT_TRUE(s.forward(id, b.views).is_ok());
    if (i == 0)
      first = b;
    else
      ASSERT_TRUE(same_outputs(first, b)) << "store " << i << ", batch " << id;
  }
  fill_random(rng, first);  // the gradients
  for (Store* s : stores) {
    if (!kb.train) {
      ASSERT_TRUE(s->discard(id).is_ok());
      continue;
    }
    Buffers g = first;
    for (std::size_t i = 0; i < g.data.size(); ++i) g.cviews[i].data = g.data[i].data();
    ASSERT_TRUE(s->backward(id, g.cviews).is_ok());
  }
}

class DynamicCheckpoint : public ::testing::TestWithParam<std::tuple<Case, Placement>> {};

// Save mid-run, then continue the savers and a store loaded from each other's checkpoint on the same batches (a case a
// placement: the production stores save and load through its engine).
TEST_P(DynamicCheckpoint, LoadedStoresContinueBitForBit) {
  const auto [k, placement] = GetParam();
  const StoreConfig c = config_of(k, placement);
  auto prod = Store::open(c);
  auto ref = open_reference_store(c);
  ASSERT_TRUE(prod.is_ok() && ref.is_ok()) << prod.status().to_string();
  std::mt19937_64 rng(0xc4ec + static_cast<std::uint64_t>(k.admit_after));
  const std::vector<Key> space = key_space(rng);
  std::int64_t id = 0;
  for (; id < 25; ++id) {
    KeyBatch kb = random_batch(rng, c, space);
    kb.train = id % 5 != 4;
    step_all({prod->get(), ref->get()}, id, kb, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
  TempDir dir;
  ASSERT_TRUE((*prod)->save(dir / "prod").is_ok());
  ASSERT_TRUE((*ref)->save(dir / "ref").is_ok());
  Result<detail::Manifest> manifest = detail::read_manifest(dir / "prod");
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  EXPECT_EQ(manifest.value().version, detail::kDynamicFormatVersion);
  // The production store reopened from the reference's checkpoint; the reference loading the production store's.
  auto prod2 = Store::open_checkpoint(dir / "ref");
  ASSERT_TRUE(prod2.is_ok()) << prod2.status().to_string();
  auto ref2 = open_reference_store(c);
  ASSERT_TRUE(ref2.is_ok());
  ASSERT_TRUE((*ref2)->load(dir / "prod").is_ok());
  EXPECT_EQ((*prod2)->step(), (*prod)->step());
  for (Store* s : {prod2->get(), ref2->get()}) {
    EXPECT_TRUE(same_table(**prod, *s, 0, false));
    EXPECT_TRUE(same_table(**prod, *s, 2, false));
  }
  for (; id < 50; ++id) {
    KeyBatch kb = random_batch(rng, c, space);
    kb.train = id % 5 != 4;
    step_all({prod->get(), ref->get(), prod2->get(), ref2->get()}, id, kb, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (Store* s : {ref->get(), prod2->get(), ref2->get()}) {
    EXPECT_TRUE(same_table(**prod, *s, 0, false));
    EXPECT_TRUE(same_table(**prod, *s, 2, false));
    EXPECT_EQ(s->stats().dynamic.at(0).second.rows, (*prod)->stats().dynamic.at(0).second.rows);
  }
  const DynamicStats st = (*prod)->stats().dynamic.at(0).second;
  EXPECT_GT(st.evictions + st.expirations, 0) << "the workload must evict";
}

INSTANTIATE_TEST_SUITE_P(Cases, DynamicCheckpoint,
                         ::testing::Values(std::make_tuple(Case{"lru", 1, Eviction::kLru, 0, Unseen::kInitial,
                                                                DType::kF32, OptimizerKind::kAdagrad, false},
                                                           Placement::kCached),
                                           std::make_tuple(Case{"lfu", 1, Eviction::kLfu, 0, Unseen::kInitial,
                                                                DType::kF32, OptimizerKind::kAdam, false},
                                                           Placement::kGpu),
                                           std::make_tuple(Case{"lru_admit3", 3, Eviction::kLru, 0, Unseen::kInitial,
                                                                DType::kF32, OptimizerKind::kSgd, false},
                                                           Placement::kOffload),
                                           std::make_tuple(Case{"lfu_admit2_ttl", 2, Eviction::kLfu, 3, Unseen::kZeros,
                                                                DType::kF32, OptimizerKind::kRowwiseAdagrad, false},
                                                           Placement::kHybrid),
                                           std::make_tuple(Case{"lru_ttl_bf16", 1, Eviction::kLru, 2, Unseen::kInitial,
                                                                DType::kBF16, OptimizerKind::kAdagrad, false},
                                                           Placement::kCpu)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Placement>>& i) {
                           return std::string(std::get<0>(i.param).name) + "_" + to_string(std::get<1>(i.param));
                         });

class DynamicLoadIntoTrained : public ::testing::TestWithParam<Placement> {};

// A store trained on other keys (rows resident and dirty in a cache) loads a checkpoint and continues as its saver, bit
// for bit; then write_keys of the saver's rows, after more training on other keys, holds exactly them.
TEST_P(DynamicLoadIntoTrained, ContinuesAsTheSaverBitForBit) {
  const StoreConfig c = config_of(
      {"lru", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kAdagrad, false}, GetParam());
  auto a = Store::open(c);
  auto b = Store::open(c);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string();
  std::mt19937_64 rng(7), other_rng(99);
  const std::vector<Key> space = key_space(rng), other = key_space(other_rng);
  std::int64_t id = 0;
  const auto train_b_on_others = [&](std::int64_t until) {
    for (; id < until && !::testing::Test::HasFatalFailure(); ++id)
      step_all({b->get()}, id, random_batch(other_rng, c, other), other_rng);
  };
  for (; id < 20 && !HasFatalFailure(); ++id) {
    step_all({a->get()}, id, random_batch(rng, c, space), rng);
    step_all({b->get()}, id, random_batch(other_rng, c, other), other_rng);
  }
  TempDir dir;
  ASSERT_TRUE((*a)->save(dir / "a").is_ok());
  const Status loaded = (*b)->load(dir / "a");
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  for (; id < 40 && !HasFatalFailure(); ++id) {
    KeyBatch kb = random_batch(rng, c, space);
    kb.train = id % 5 != 4;
    step_all({a->get(), b->get()}, id, kb, rng);
  }
  EXPECT_TRUE(same_table(**a, **b, 0, false));
  EXPECT_TRUE(same_table(**a, **b, 2, false));
  train_b_on_others(50);
  const std::vector<Key> keys = (*a)->keys_held(0).value();
  std::vector<float> w(keys.size() * 8), st(keys.size() * 8), w2(w.size()), st2(st.size());
  ASSERT_TRUE((*a)->read_keys(0, keys, w.data(), st.data()).is_ok());
  ASSERT_TRUE((*b)->write_keys(0, keys, w.data(), st.data()).is_ok());
  ASSERT_TRUE((*b)->read_keys(0, keys, w2.data(), st2.data()).is_ok());
  EXPECT_EQ(w, w2);
  EXPECT_EQ(st, st2);
}

INSTANTIATE_TEST_SUITE_P(Placements, DynamicLoadIntoTrained,
                         ::testing::Values(Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu,
                                           Placement::kHybrid),
                         [](const ::testing::TestParamInfo<Placement>& i) { return to_string(i.param); });

// Both stores, for the tests that run on each.
const std::vector<std::pair<const char*, Opener>>& stores() {
  static const std::vector<std::pair<const char*, Opener>> all = {{"production", open_production},
                                                                  {"reference", open_reference_store}};
  return all;
}

// A small config: dynamic 'user' (capacity 3, adagrad, lru, admit_after 1) and dense 'item'.
StoreConfig small_config() {
  StoreConfig c = config_of({"x", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kAdagrad, false});
  c.tables[0].spec.rows = 3;
  c.tables.pop_back();  // no 'ad'
  return c;
}

KeyBatch user_batch(const std::vector<Key>& keys, bool train = true) {
  KeyBatch kb;
  kb.features.push_back({"user", {0, static_cast<std::int64_t>(keys.size())}, keys, {}});
  kb.train = train;
  return kb;
}

// One training step of `keys` (one bag, gradients of 0.5) on `s`.
Status train(Store& s, std::int64_t id, const std::vector<Key>& keys) {
  const KeyBatch kb = user_batch(keys);
  STRATA_RETURN_IF_ERROR(s.submit(id, kb));
  Buffers b = make_buffers(s.config(), kb);
  STRATA_RETURN_IF_ERROR(s.forward(id, b.views));
  for (auto& d : b.data) std::fill(d.begin(), d.end(), 0.5f);
  return s.backward(id, b.cviews);
}

std::vector<float> weights_of(Store& s, const std::vector<Key>& keys, std::vector<float>* state = nullptr) {
  std::vector<float> w(keys.size() * 8), st(keys.size() * 8);
  EXPECT_TRUE(s.read_keys(0, keys, w.data(), st.data()).is_ok());
  if (state) *state = st;
  return w;
}

TEST(DynamicWriteKeys, HoldsExactlyTheKeysAsJustUsedInBothStores) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    auto opened = open(small_config());
    ASSERT_TRUE(opened.is_ok());
    Store& s = **opened;
    std::vector<float> w(3 * 8);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * static_cast<float>(i);
    const float initial = initial_state_value(s.config().tables[0].spec.optimizer);
    // At clock 0: the keys, their weights, the initial state.
    ASSERT_TRUE(s.write_keys(0, {5, -3, 9}, w.data(), nullptr).is_ok());
    EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{-3, 5, 9}));
    std::vector<float> st;
    EXPECT_EQ(weights_of(s, {5, -3, 9}, &st), w);
    EXPECT_EQ(st, std::vector<float>(24, initial));
    // Trained key 5 keeps its state through write_keys with null state; new key 7 starts at the initial state.
    ASSERT_TRUE(train(s, 1, {5}).is_ok());
    std::vector<float> trained;
    weights_of(s, {5}, &trained);
    ASSERT_NE(trained[0], initial);
    ASSERT_TRUE(s.write_keys(0, {7, 5}, w.data(), nullptr).is_ok());
    EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{5, 7}));
    weights_of(s, {7, 5}, &st);
    EXPECT_EQ(std::vector<float>(st.begin(), st.begin() + 8), std::vector<float>(8, initial));
    EXPECT_EQ(std::vector<float>(st.begin() + 8, st.end()), std::vector<float>(trained.begin(), trained.begin() + 8));
    // Given state is written; the tie order is the list's: key 1 is evicted first, then 2.
    std::vector<float> given(3 * 8, 2.0f);
    ASSERT_TRUE(s.write_keys(0, {1, 2, 3}, w.data(), given.data()).is_ok());
    weights_of(s, {1, 2, 3}, &st);
    EXPECT_EQ(st, given);
    ASSERT_TRUE(train(s, 2, {4}).is_ok());
    EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{2, 3, 4}));
    ASSERT_TRUE(train(s, 3, {6}).is_ok());
    EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{3, 4, 6}));
    // An empty list empties the table.
    ASSERT_TRUE(s.write_keys(0, {}, nullptr, nullptr).is_ok());
    EXPECT_TRUE(s.keys_held(0).value().empty());
  }
}

TEST(DynamicWriteKeys, RefusesNamingWhatIsWrongAndChangesNothing) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    auto opened = open(small_config());
    ASSERT_TRUE(opened.is_ok());
    Store& s = **opened;
    ASSERT_TRUE(train(s, 1, {10, 11}).is_ok());
    const std::vector<float> before = weights_of(s, {10, 11});
    std::vector<float> w(4 * 8, 1.0f);
    const auto refused = [&](const Status& st, StatusCode code, const std::string& says) {
      EXPECT_EQ(st.code(), code) << st.to_string();
      EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
      EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{10, 11}));
      EXPECT_EQ(weights_of(s, {10, 11}), before);
    };
    refused(s.write_keys(0, {5, 6, 5}, w.data(), nullptr), StatusCode::kInvalidArgument,
            "table 'user': write_keys: key 5 at positions 0 and 2 (expected distinct keys)");
    refused(s.write_keys(0, {1, 2, 3, 4}, w.data(), nullptr), StatusCode::kInvalidArgument,
            "4 keys (expected at most the capacity, 3)");
    refused(s.write_keys(0, {1}, nullptr, nullptr), StatusCode::kInvalidArgument, "weights is null");
    refused(s.write_keys(1, {1}, w.data(), nullptr), StatusCode::kInvalidArgument,
            "table 'item': write_keys of a dense table");
    refused(s.write_keys(7, {1}, w.data(), nullptr), StatusCode::kNotFound, "write_keys");
    ASSERT_TRUE(s.submit(2, user_batch({10}, false)).is_ok());
    refused(s.write_keys(0, {1}, w.data(), nullptr), StatusCode::kFailedPrecondition, "write_keys");
    ASSERT_TRUE(s.discard(2).is_ok());
  }
}

// Overwrites byte `at` of `path` (from its end when negative) with its complement.
void flip_byte(const std::string& path, std::int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::int64_t size = f.tellg();
  const std::int64_t pos = at < 0 ? size + at : at;
  f.seekg(pos);
  char ch = 0;
  f.read(&ch, 1);
  ch = static_cast<char>(~ch);
  f.seekp(pos);
  f.write(&ch, 1);
}

// The dynamic table file of 'user' in the checkpoint of `dir`.
std::string user_file(const std::string& dir) {
  Result<detail::Manifest> m = detail::read_manifest(dir);
  EXPECT_TRUE(m.is_ok());
  for (const auto& t : m.value().tables)
    if (t.name == "user") return dir + "/" + t.pieces.at(0).file;
  return "";
}

TEST(DynamicCheckpointLoad, RefusesAMismatchOrACorruptFileNamingItAndChangesNothing) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    const StoreConfig c = small_config();
    auto saver = open(c);
    ASSERT_TRUE(saver.is_ok());
    ASSERT_TRUE(train(**saver, 1, {1, 2}).is_ok());
    ASSERT_TRUE((*saver)->save(dir.path()).is_ok());
    // A store of different rows and step, which no refused load may change.
    auto target = open(c);
    ASSERT_TRUE(target.is_ok());
    Store& t = **target;
    ASSERT_TRUE(train(t, 1, {7}).is_ok());
    ASSERT_TRUE(train(t, 2, {8}).is_ok());
    const std::vector<float> before = weights_of(t, {7, 8});
    std::vector<float> item_before(6 * 4), item_now(6 * 4);
    ASSERT_TRUE(t.read_rows(1, 0, 6, item_before.data(), nullptr).is_ok());
    const auto unchanged = [&] {
      EXPECT_EQ(t.keys_held(0).value(), (std::vector<Key>{7, 8}));
      EXPECT_EQ(weights_of(t, {7, 8}), before);
      ASSERT_TRUE(t.read_rows(1, 0, 6, item_now.data(), nullptr).is_ok());
      EXPECT_EQ(item_now, item_before);
      EXPECT_EQ(t.step(), 2);
    };
    // Dense in the store, dynamic in the checkpoint, and the reverse; another capacity.
    StoreConfig dense = c;
    dense.tables[0].dynamic.reset();
    auto d = open(dense);
    ASSERT_TRUE(d.is_ok());
    Status st = (*d)->load(dir.path());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("table 'user' is a dynamic table in the checkpoint and a dense table in the store"),
              std::string::npos)
        << st.message();
    TempDir dense_dir;
    ASSERT_TRUE((*d)->save(dense_dir.path()).is_ok());
    st = t.load(dense_dir.path());
    EXPECT_NE(st.message().find("table 'user' is a dense table in the checkpoint and a dynamic table in the store"),
              std::string::npos)
        << st.message();
    unchanged();
    StoreConfig bigger = c;
    bigger.tables[0].spec.rows = 4;
    auto b = open(bigger);
    ASSERT_TRUE(b.is_ok());
    st = (*b)->load(dir.path());
    EXPECT_NE(
        st.message().find("dynamic table 'user': capacity 3 in the checkpoint (expected 4 from the store config)"),
        std::string::npos)
        << st.message();
    // A corrupt dynamic file (a weight's byte, then the header's clock) is named; nothing changes.
    const std::string file = user_file(dir.path());
    flip_byte(file, -1);
    st = t.load(dir.path());
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    EXPECT_NE(st.message().find(file + " (dynamic table 'user'): checksum"), std::string::npos) << st.message();
    unchanged();
    flip_byte(file, -1);
    // A manifest whose dynamic entry does not match its file's size is corrupt.
    Result<detail::Manifest> m = detail::read_manifest(dir.path());
    ASSERT_TRUE(m.is_ok());
    const std::string manifest = dir / detail::kManifest;
    const Result<std::string> good = detail::read_file(manifest);
    ASSERT_TRUE(good.is_ok());
    detail::Manifest bad = m.value();
    bad.tables[0].keys = 9;
    ASSERT_TRUE(detail::write_file_atomic(manifest, detail::manifest_text(bad)).is_ok());
    st = t.load(dir.path());
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    EXPECT_NE(st.message().find("dynamic table 'user': keys 9 (expected 0 to its capacity 3; corrupt)"),
              std::string::npos)
        << st.message();
    bad.tables[0].keys = 1;
    ASSERT_TRUE(detail::write_file_atomic(manifest, detail::manifest_text(bad)).is_ok());
    st = t.load(dir.path());
    EXPECT_NE(st.message().find("for its keys and sketch; corrupt"), std::string::npos) << st.message();
    unchanged();
    ASSERT_TRUE(detail::write_file_atomic(manifest, good.value()).is_ok());
    ASSERT_TRUE(t.load(dir.path()).is_ok());  // restored: it loads
    EXPECT_EQ(t.keys_held(0).value(), (std::vector<Key>{1, 2}));
    EXPECT_EQ(weights_of(t, {1, 2}), weights_of(**saver, {1, 2}));
  }
}

TEST(DynamicNpy, ExportAndImportRoundTripKeysAndWeights) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto a = open(small_config());
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(train(**a, 1, {40, -2}).is_ok());
    ASSERT_TRUE((*a)->export_npy("user", dir / "user.npy").is_ok());
    ASSERT_TRUE(fs::exists(dir / "user.keys.npy"));
    Result<std::vector<std::int64_t>> keys = read_npy_i64(dir / "user.keys.npy");
    ASSERT_TRUE(keys.is_ok()) << keys.status().to_string();
    EXPECT_EQ(keys.value(), (std::vector<std::int64_t>{-2, 40}));
    auto b = open(small_config());
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(train(**b, 1, {3}).is_ok());
    ASSERT_TRUE((*b)->import_npy("user", dir / "user.npy").is_ok());
    EXPECT_EQ((*b)->keys_held(0).value(), (std::vector<Key>{-2, 40}));
    std::vector<float> state;
    EXPECT_EQ(weights_of(**b, {-2, 40}, &state), weights_of(**a, {-2, 40}));
    // New keys: the initial state.
    EXPECT_EQ(state, std::vector<float>(16, initial_state_value((*b)->config().tables[0].spec.optimizer)));
    // Without its keys file the import is refused, naming it; nothing changes.
    fs::remove(dir / "user.keys.npy");
    const Status st = (*b)->import_npy("user", dir / "user.npy");
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find("user.keys.npy"), std::string::npos) << st.message();
    EXPECT_EQ((*b)->keys_held(0).value(), (std::vector<Key>{-2, 40}));
  }
}

// A store of small_config() opened by `open`, trained on one batch of keys 1 and 2 and saved into `dir`.
template <class Open>
Result<std::unique_ptr<Store>> trained_and_saved(const Open& open, const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> s, open(small_config()));
  STRATA_RETURN_IF_ERROR(train(*s, 1, {1, 2}));
  STRATA_RETURN_IF_ERROR(s->save(dir));
  return s;
}

// A save that commits between load reading the manifest and opening the dynamic file: load starts over.
TEST(DynamicCheckpointFiles, LoadStartsOverWhenASaveReplacesTheDynamicFile) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto a = trained_and_saved(open, dir.path());
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    const std::string old_file = user_file(dir.path());
    ASSERT_TRUE(train(**a, 2, {3}).is_ok());
    auto b = open(small_config());
    ASSERT_TRUE(b.is_ok());
    int opens = 0;
    detail::set_before_open_hook([&](const std::string&) {
      if (opens++ == 0) {
        ASSERT_TRUE((*a)->save(dir.path()).is_ok());
      }
    });
    const Status s = (*b)->load(dir.path());
    detail::set_before_open_hook({});
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_FALSE(fs::exists(old_file));  // the previous generation's dynamic file is gone after the commit
    EXPECT_TRUE(same_table(**a, **b, 0, false));
    EXPECT_EQ((*b)->step(), (*a)->step());
    // Only what the manifest lists (and the manifest, the lock) remains.
    Result<detail::Manifest> m = detail::read_manifest(dir.path());
    ASSERT_TRUE(m.is_ok());
    const std::vector<std::string> listed = detail::file_names(m.value());
    for (const auto& e : fs::directory_iterator(dir.path())) {
      const std::string f = e.path().filename().string();
      if (f.size() > 4 && f.compare(f.size() - 4, 4, ".tbl") == 0) {
        EXPECT_NE(std::find(listed.begin(), listed.end(), f), listed.end()) << f;
      }
    }
  }
}

// A save with a training batch in flight is the state of that batch discarded (clock and admissions kept).
TEST(DynamicCheckpointFiles, SaveWithABatchInFlightEqualsItsDiscard) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto a = open(small_config());
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(train(**a, 1, {1, 2}).is_ok());
    const KeyBatch kb = user_batch({3, 4});
    ASSERT_TRUE((*a)->submit(2, kb).is_ok());
    ASSERT_TRUE((*a)->save(dir.path()).is_ok());
    ASSERT_TRUE((*a)->discard(2).is_ok());
    auto b = open(small_config());
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE((*b)->load(dir.path()).is_ok());
    EXPECT_TRUE(same_table(**a, **b, 0, false));
    for (std::int64_t id = 3; id < 9; ++id) {
      const std::vector<Key> keys = {id, id % 3 + 1};
      ASSERT_TRUE(train(**a, id, keys).is_ok());
      ASSERT_TRUE(train(**b, id, keys).is_ok());
      EXPECT_TRUE(same_table(**a, **b, 0, false)) << id;
    }
  }
}

// A checkpoint saved with admit_after 3 loads into a store with admit_after 1 (a config change, not a corrupt file),
// which drops the admission counts, and back, which starts them from zero.
TEST(DynamicCheckpointFiles, AnotherAdmitAfterLoadsTheRowsAndKeepsCountsOnlyWhereBothCount) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    StoreConfig sketched = small_config();
    sketched.tables[0].dynamic->admit_after = 3;
    auto a = open(sketched);
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(train(**a, 1, {1, 2}).is_ok());
    ASSERT_TRUE((*a)->save(dir.path()).is_ok());
    // A store that admits at once keeps no admission counts: it loads the rows and drops the counts.
    auto b = open(small_config());  // admit_after 1
    ASSERT_TRUE(b.is_ok());
    const Status s = (*b)->load(dir.path());
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ((*b)->keys_held(0).value(), (*a)->keys_held(0).value());
    // And back: a store that counts loads a checkpoint without counts from zero counts.
    TempDir again;
    ASSERT_TRUE((*b)->save(again.path()).is_ok());
    const Status back = (*a)->load(again.path());
    EXPECT_TRUE(back.is_ok()) << back.to_string();
  }
}

// A dynamic file whose header clock is INT64_MAX (sizes and checksums consistent) is refused: the next training
// submit would overflow the clock.
TEST(DynamicCheckpointFiles, AClockTheNextSubmitWouldOverflowIsRefused) {
  for (const auto& [name, open] : stores()) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto a = trained_and_saved(open, dir.path());
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    const std::string file = user_file(dir.path());
    Result<std::string> bytes = detail::read_file(file);
    ASSERT_TRUE(bytes.is_ok());
    std::string b = bytes.value();
    const std::int64_t clock = std::numeric_limits<std::int64_t>::max();
    std::memcpy(&b[offsetof(detail::DynamicHeader, clock)], &clock, sizeof clock);
    ASSERT_TRUE(detail::write_file_atomic(file, b).is_ok());
    Result<detail::Manifest> m = detail::read_manifest(dir.path());
    ASSERT_TRUE(m.is_ok());
    detail::Manifest edited = m.value();
    for (auto& t : edited.tables)
      if (t.name == "user") t.pieces[0].crc = detail::crc32c(b.data(), b.size());
    ASSERT_TRUE(detail::write_file_atomic(dir / detail::kManifest, detail::manifest_text(edited)).is_ok());
    auto t = open(small_config());
    ASSERT_TRUE(t.is_ok());
    const Status s = (*t)->load(dir.path());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "loaded a clock of INT64_MAX: " << s.to_string();
  }
}

// write_keys of fp32 weights into a bf16 (stochastic rounding) table: both stores round alike.
TEST(DynamicCheckpointFiles, WriteKeysRoundsAlikeInBothStoresForBf16) {
  StoreConfig c = small_config();
  c.tables[0].spec.dtype = DType::kBF16;
  c.tables[0].spec.stochastic_rounding = true;
  auto p = Store::open(c);
  auto r = open_reference_store(c);
  ASSERT_TRUE(p.is_ok() && r.is_ok());
  std::mt19937_64 rng(7);
  std::vector<float> w(3 * 8), st(3 * 8);
  for (float& x : w) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& x : st) x = std::uniform_real_distribution<float>(0, 1)(rng);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE((*p)->write_keys(0, {4, -9, 12}, w.data(), round ? st.data() : nullptr).is_ok());
    ASSERT_TRUE((*r)->write_keys(0, {4, -9, 12}, w.data(), round ? st.data() : nullptr).is_ok());
    EXPECT_TRUE(same_table(**p, **r, 0, false));
    ASSERT_TRUE(train(**p, 1 + round, {4, 7}).is_ok());
    ASSERT_TRUE(train(**r, 1 + round, {4, 7}).is_ok());
    EXPECT_TRUE(same_table(**p, **r, 0, false));
  }
}

// A device that fails before or while write_keys or load writes a cached dynamic table's rows: the table keeps its keys
// (refused before anything changed) or holds none (its rows could not be written), never a key with another's row.
TEST(DynamicCheckpointFiles, AFailedWriteOrLoadLeavesTheKeysOrNone) {
  StoreConfig c = small_config();
  c.device.backend = BackendChoice::kEmu;
  for (TableConfig& t : c.tables) {
    t.placement = Placement::kCached;
    t.cache.rows = 2;
  }
  auto saver = Store::open(c);
  ASSERT_TRUE(saver.is_ok()) << saver.status().to_string();
  ASSERT_TRUE(train(**saver, 0, {1, 2}).is_ok());
  TempDir dir;
  ASSERT_TRUE((*saver)->save(dir / "ck").is_ok());
  const std::vector<float> want = weights_of(**saver, {1, 2});
  int failed_calls = 0;
  for (std::int64_t fail_at = 20; fail_at < 200; fail_at += 3) {
    for (const bool load : {false, true}) {
      StoreConfig f = c;
      f.device.emu_fail_after_ops = fail_at;
      auto s = Store::open(f);
      if (!s.is_ok()) continue;
      std::int64_t id = 1;
      while (id < 6 && train(**s, id, {5 + id, 6 + id}).is_ok()) ++id;
      (void)(*s)->discard(id);
      const std::vector<Key> before = (*s)->keys_held(0).value();
      const Status st = load ? (*s)->load(dir / "ck") : (*s)->write_keys(0, {1, 2}, want.data(), nullptr);
      if (st.is_ok()) continue;
      ++failed_calls;
      const std::vector<Key> after = (*s)->keys_held(0).value();
      EXPECT_TRUE(after == before || after.empty()) << "fail_at " << fail_at << ": " << st.to_string();
    }
  }
  EXPECT_GT(failed_calls, 0) << "no device fault reached a write";
}

}  // namespace
}  // namespace strata
