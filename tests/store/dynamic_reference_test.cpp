// The reference store's dynamic tables (issue 36; the rules: store/detail/dynamic_keys.hpp): small
// cases computed by hand (admission by count, LRU and LFU victims, the TTL, evaluation batches, a
// batch refused beside pinned rows, extreme keys, zeros for unseen keys, the errors), and a dynamic
// table that admits every key training bit for bit as a dense table of those keys. A world of the reference
// (open_reference_world(config, world)): its shards against independent world-1 references, a batch one shard cannot
// fit, read_dynamic/write_dynamic by shard, the global rows stochastic rounding draws with.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/half.hpp"
#include "core/row_math.hpp"
#include "dispatch/shard_layout.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/store.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

constexpr float kRate = 0.5f;

TableConfig table(const std::string& name, std::int64_t rows, std::optional<DynamicSpec> dyn) {
  TableConfig t;
  t.spec.name = name;
  t.spec.rows = rows;
  t.spec.dim = 2;
  t.spec.pooling = Pooling::kNone;  // one output row per key: what each key read
  t.spec.init.bound = 0.5f;
  t.spec.init.seed = 7;
  t.spec.optimizer.kind = OptimizerKind::kSgd;
  t.spec.optimizer.learning_rate = kRate;
  t.dynamic = dyn;
  return t;
}

DynamicSpec spec(std::int64_t admit_after, Eviction eviction = Eviction::kLru, std::int64_t ttl = 0,
                 Unseen unseen = Unseen::kInitial) {
  return DynamicSpec{admit_after, eviction, ttl, unseen};
}

// One dynamic table "item" of `capacity` rows (and a dense table "user" when `with_dense`).
std::unique_ptr<Store> open_store(std::int64_t capacity, const DynamicSpec& d, bool with_dense = false) {
  StoreConfig c;
  c.tables.push_back(table("item", capacity, d));
  if (with_dense) c.tables.push_back(table("user", 4, std::nullopt));
  auto s = open_reference_store(c);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

// One bag of `keys` of feature `name`.
KeyBatch batch(const std::vector<Key>& keys, bool train = true, const std::string& name = "item") {
  KeyBatch kb;
  JaggedKeys f;
  f.table = name;
  f.offsets = {0, static_cast<std::int64_t>(keys.size())};
  f.keys = keys;
  kb.features.push_back(f);
  kb.train = train;
  return kb;
}

// What key k of table "item" starts as (dim 2).
std::vector<float> initial(Key k) {
  std::vector<float> row(2);
  init_row(row.data(), table_seed(7, table_name_hash("item")), k, 2, 0.5f);
  return row;
}

// submit, forward (returning what each key position read, (keys, 2)), then backward with gradient 1 everywhere, or
// discard (`retire` false: left in flight).
std::vector<float> run(Store& s, std::int64_t id, const KeyBatch& kb, bool backward = true, bool retire = true) {
  const Status submitted = s.submit(id, kb);
  EXPECT_TRUE(submitted.is_ok()) << submitted.to_string();
  const std::int64_t n = kb.features[0].num_keys();
  std::vector<float> out(static_cast<std::size_t>(n * 2), -7.0f);
  EXPECT_TRUE(s.forward(id, {{out.data(), n, 2}}).is_ok());
  if (!retire) return out;
  const std::vector<float> ones(out.size(), 1.0f);
  if (backward) {
    EXPECT_TRUE(s.backward(id, {{ones.data(), n, 2}}).is_ok());
  } else {
    EXPECT_TRUE(s.discard(id).is_ok());
  }
  return out;
}

std::vector<Key> held(const Store& s, int t = 0) {
  auto k = s.keys_held(t);
  EXPECT_TRUE(k.is_ok()) << k.status().to_string();
  return k.is_ok() ? k.value() : std::vector<Key>{};
}

std::vector<float> read(Store& s, const std::vector<Key>& keys, int t = 0) {
  std::vector<float> w(keys.size() * 2);
  const Status st = s.read_keys(t, keys, w.data(), nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return w;
}

DynamicStats stats(const Store& s, std::size_t t = 0) { return s.stats().dynamic.at(t).second; }

std::vector<std::int64_t> counts(const DynamicStats& d) {
  return {d.rows, d.capacity, d.admissions, d.evictions, d.expirations, d.not_admitted, d.unseen, d.index_bytes};
}

std::vector<float> minus_rate(std::vector<float> row, float times = 1.0f) {
  for (float& x : row) x -= kRate * times;
  return row;
}

TEST(DynamicReference, AdmitsAfterCountsAndDropsGradientsOfKeysWithoutRows) {
  auto s = open_store(4, spec(2));
  // 5 once: not admitted (0 + 1 < 2), reads its initial values, its gradient is dropped; 7 twice: admitted.
  const std::vector<float> out = run(*s, 1, batch({5, 7, 7}));
  const std::vector<float> i5 = initial(5), i7 = initial(7);
  EXPECT_EQ(out, (std::vector<float>{i5[0], i5[1], i7[0], i7[1], i7[0], i7[1]}));
  EXPECT_EQ(held(*s), (std::vector<Key>{7}));
  EXPECT_EQ(read(*s, {7}), minus_rate(i7, 2.0f));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{1, 4, 1, 0, 0, 1, 0, 0}));
  // 5 again: the sketch holds 1, plus 1 reaches 2; it starts from its initial values.
  EXPECT_EQ(run(*s, 2, batch({5})), i5);
  EXPECT_EQ(held(*s), (std::vector<Key>{5, 7}));
  EXPECT_EQ(read(*s, {5, 7}), (std::vector<float>{i5[0] - kRate, i5[1] - kRate, i7[0] - 2 * kRate, i7[1] - 2 * kRate}));
  EXPECT_EQ(stats(*s).admissions, 2);
}

TEST(DynamicReference, LruEvictsTheLeastRecentTiesToTheRowTouchedFirst) {
  auto s = open_store(2, spec(1));
  run(*s, 1, batch({20, 10}), false);  // clock 1: 20 touched before 10
  run(*s, 2, batch({30}), false);      // full: 20 and 10 last used at 1, 20 touched first
  EXPECT_EQ(held(*s), (std::vector<Key>{10, 30}));
  EXPECT_EQ(read(*s, {30}), initial(30));  // the row 20 had, reset
  run(*s, 3, batch({10}), false);          // 10 last used at 3, 30 at 2
  run(*s, 4, batch({40}), false);
  EXPECT_EQ(held(*s), (std::vector<Key>{10, 40}));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{2, 2, 4, 2, 0, 0, 0, 0}));
}

TEST(DynamicReference, HitsAndAdmissionsAreTouchedInFirstUseOrder) {
  auto s = open_store(3, spec(1));
  run(*s, 1, batch({1, 2}), false);
  run(*s, 2, batch({3, 1}), false);  // 3 admitted, then 1 hit: both last used at 2, 3 touched first
  run(*s, 3, batch({4}), false);     // evicts 2 (last used at 1)
  run(*s, 4, batch({5}), false);     // evicts 3
  EXPECT_EQ(held(*s), (std::vector<Key>{1, 4, 5}));
}

TEST(DynamicReference, LfuEvictsTheSmallestCountThenTheLeastRecent) {
  auto s = open_store(2, spec(1, Eviction::kLfu));
  run(*s, 1, batch({1, 1, 1, 2}), false);  // counts 3 and 1
  run(*s, 2, batch({2}), false);           // 2: count 2, last used at 2 (LRU would evict 1)
  run(*s, 3, batch({3}), false);
  EXPECT_EQ(held(*s), (std::vector<Key>{1, 3}));
  run(*s, 4, batch({4}), false);  // 3: count 1 < 1's 3
  EXPECT_EQ(held(*s), (std::vector<Key>{1, 4}));
  run(*s, 5, batch({5, 5, 5}), false);  // 4: count 1; then 1 (3, last used 1) against 5 (3, last used 5)
  run(*s, 6, batch({6}), false);
  EXPECT_EQ(held(*s), (std::vector<Key>{5, 6}));
  EXPECT_EQ(stats(*s).evictions, 4);
}

TEST(DynamicReference, TtlExpiresUnpinnedRowsUnusedForMoreThanItsSteps) {
  auto s = open_store(4, spec(1, Eviction::kLru, 2), true);
  run(*s, 1, batch({1}));                // clock 1
  run(*s, 2, batch({2}));                // clock 2
  run(*s, 3, batch({0}, true, "user"));  // clock 3: every training submit ticks
  run(*s, 4, batch({}));                 // clock 4: 1 expires (4 - 1 > 2); 2 does not (4 - 2 = 2)
  EXPECT_EQ(held(*s), (std::vector<Key>{2}));
  run(*s, 5, batch({2, 9}), true, false);  // clock 5, 9 stays pinned
  run(*s, 6, batch({2}));
  run(*s, 7, batch({2}));
  run(*s, 8, batch({2}));                // 9: 8 - 5 > 2, but pinned
  run(*s, 9, batch({3}, false), false);  // an evaluation batch: no expiry
  EXPECT_EQ(held(*s), (std::vector<Key>{2, 9}));
  ASSERT_TRUE(s->discard(5).is_ok());
  run(*s, 10, batch({2}));  // clock 9
  EXPECT_EQ(held(*s), (std::vector<Key>{2}));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{1, 4, 3, 0, 2, 0, 1, 0}));
  for (std::int64_t id = 11; id <= 13; ++id) run(*s, id, batch({5}, false), false);  // evaluation: no tick
  run(*s, 14, batch({7}));                                                           // clock 10: 2 stays (10 - 9 <= 2)
  EXPECT_EQ(held(*s), (std::vector<Key>{2, 7}));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{2, 4, 4, 0, 2, 0, 4, 0}));
}

TEST(DynamicReference, EvaluationBatchesAdmitNothingAndRefuseBackward) {
  auto s = open_store(4, spec(1));
  ASSERT_TRUE(s->submit(1, batch({1, 2}, false)).is_ok());
  std::vector<float> out(4);
  ASSERT_TRUE(s->forward(1, {{out.data(), 2, 2}}).is_ok());
  const std::vector<float> i1 = initial(1), i2 = initial(2);
  EXPECT_EQ(out, (std::vector<float>{i1[0], i1[1], i2[0], i2[1]}));
  const std::vector<float> ones(4, 1.0f);
  const Status st = s->backward(1, {{ones.data(), 2, 2}});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "batch 1: backward of an evaluation batch (KeyBatch::train false; expected discard)");
  ASSERT_TRUE(s->discard(1).is_ok());
  EXPECT_TRUE(held(*s).empty());
  run(*s, 2, batch({1}));
  EXPECT_EQ(run(*s, 3, batch({1, 3}, false), false),
            (std::vector<float>{i1[0] - kRate, i1[1] - kRate, initial(3)[0], initial(3)[1]}));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{1, 4, 1, 0, 0, 0, 3, 0}));
}

TEST(DynamicReference, BatchThatCannotFitBesidePinnedRowsChangesNothing) {
  StoreConfig c;
  c.tables.push_back(table("item", 3, spec(2)));
  c.tables.push_back(table("tag", 1, spec(1)));
  auto opened = open_reference_store(c);
  ASSERT_TRUE(opened.is_ok());
  Store& s = *opened.value();
  run(s, 1, batch({1, 1, 2, 2}), true, false);  // rows 0 and 1 pinned, row 2 free
  run(s, 2, batch({5}, true, "tag"), true, false);
  const auto before = [&](int t) { return std::make_pair(held(s, t), counts(stats(s, static_cast<std::size_t>(t)))); };
  const auto item = before(0), tag = before(1);
  const std::vector<float> rows = read(s, {1, 2});
  // item: 3 is admitted (0 + 2 >= 2) into row 2, 4 is not; tag: 6 finds its one row pinned.
  KeyBatch kb = batch({3, 3, 4});
  kb.features.push_back(batch({6}, true, "tag").features[0]);
  const Status st = s.submit(3, kb);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "batch 3: table 'tag': 1 new keys need rows: 0 free and 0 evictable of capacity 1 (1 rows pinned by "
            "batches in flight)");
  EXPECT_EQ(before(0), item);
  EXPECT_EQ(before(1), tag);
  EXPECT_EQ(read(s, {1, 2}), rows);
  EXPECT_EQ(s.in_flight(), 2);
  ASSERT_TRUE(s.discard(1).is_ok());
  ASSERT_TRUE(s.discard(2).is_ok());
  // The refused batch counted nothing: one use of 3 and of 4 now is not enough.
  run(s, 4, batch({4, 3}));
  EXPECT_EQ(held(s), (std::vector<Key>{1, 2}));
  EXPECT_EQ(counts(stats(s)), (std::vector<std::int64_t>{2, 3, 2, 0, 0, 2, 0, 0}));
}

TEST(DynamicReference, AnyInt64IsAKey) {
  auto s = open_store(4, spec(1));
  constexpr Key kMin = std::numeric_limits<Key>::min(), kMax = std::numeric_limits<Key>::max();
  const std::vector<float> out = run(*s, 1, batch({kMax, -1, kMin}), false);
  const std::vector<float> a = initial(kMax), b = initial(-1), c = initial(kMin);
  EXPECT_EQ(out, (std::vector<float>{a[0], a[1], b[0], b[1], c[0], c[1]}));
  EXPECT_EQ(held(*s), (std::vector<Key>{kMin, -1, kMax}));
  EXPECT_EQ(read(*s, {kMin, -1, kMax}), (std::vector<float>{c[0], c[1], b[0], b[1], a[0], a[1]}));
}

TEST(DynamicReference, UnseenZeros) {
  auto s = open_store(4, spec(3, Eviction::kLru, 0, Unseen::kZeros));
  const std::vector<float> i6 = initial(6);
  EXPECT_EQ(run(*s, 1, batch({5, 6, 6, 6})), (std::vector<float>{0, 0, i6[0], i6[1], i6[0], i6[1], i6[0], i6[1]}));
  EXPECT_EQ(held(*s), (std::vector<Key>{6}));
  EXPECT_EQ(run(*s, 2, batch({5}, false), false), (std::vector<float>{0, 0}));
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{1, 4, 1, 0, 0, 1, 1, 0}));
}

TEST(DynamicReference, RefusesDenseCallsAndKeysWithoutRows) {
  auto s = open_store(4, spec(1), true);
  run(*s, 1, batch({3}));
  std::vector<float> w(2, -7.0f);
  Status st = s->read_keys(0, {3, 4}, w.data(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "table 'item': key 4 at position 1 has no row (expected keys that keys_held lists)");
  EXPECT_EQ(w, (std::vector<float>{-7.0f, -7.0f}));  // nothing copied
  EXPECT_EQ(s->keys_held(1).status().message(), "table 'user': keys_held of a dense table (expected a dynamic table)");
  st = s->read_keys(1, {0}, w.data(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "table 'user': read_keys of a dense table (expected a dynamic table)");
  EXPECT_EQ(s->keys_held(9).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->keys_held(9).status().message(), "keys_held: table index 9 out of range [0, 2)");
  st = s->read_rows(0, 0, 1, w.data(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "table 'item': read_rows of a dynamic table (expected a dense table; a dynamic table's rows are read by "
            "key: keys_held, read_keys)");
  EXPECT_EQ(s->write_rows(0, 0, 1, w.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->read_rows(1, 0, 1, w.data(), nullptr).is_ok());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A dynamic table that admits every key (admit_after 1, capacity beyond the keys used) against a dense table of the
// same name and seed: the same outputs and the same rows and state, bit for bit (its rows are not the keys, so
// stochastic rounding would draw other bits: bf16 rounds to nearest here).
class DynamicAsDense : public ::testing::TestWithParam<std::tuple<OptimizerKind, DType>> {};

TEST_P(DynamicAsDense, TrainsBitForBit) {
  const auto [kind, dtype] = GetParam();
  TableConfig t = table("item", 64, std::nullopt);
  t.spec.dim = 4;
  t.spec.pooling = Pooling::kSum;
  t.spec.dtype = dtype;
  t.spec.optimizer.kind = kind;
  t.spec.optimizer.learning_rate = 0.05f;
  t.spec.optimizer.initial_accumulator = 0.1f;
  t.features = {{"item.a", std::nullopt}, {"item.b", Pooling::kNone}, {"item.c", Pooling::kMean}};
  StoreConfig dense;
  dense.tables = {t};
  StoreConfig dyn = dense;
  dyn.tables[0].dynamic = spec(1);
  auto a = open_reference_store(dense), b = open_reference_store(dyn);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string() << b.status().to_string();
  std::mt19937_64 rng(11 + static_cast<int>(kind) * 2 + static_cast<int>(dtype));
  std::vector<Key> used;
  for (std::int64_t id = 1; id <= 20; ++id) {
    KeyBatch kb;
    for (const char* name : {"item.a", "item.b", "item.c"}) {
      if (rng() % 4 == 0) continue;
      JaggedKeys f;
      f.table = name;
      f.offsets = {0};
      for (int bag = 0; bag < 3; ++bag) {
        for (std::uint64_t k = rng() % 5; k > 0; --k) f.keys.push_back(static_cast<Key>(rng() % (rng() % 2 ? 8 : 60)));
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      if (rng() % 2)
        for (std::size_t k = 0; k < f.keys.size(); ++k) f.weights.push_back(0.25f * static_cast<float>(1 + rng() % 8));
      used.insert(used.end(), f.keys.begin(), f.keys.end());
      kb.features.push_back(f);
    }
    if (kb.features.empty()) kb = batch({1}, true, "item.a");
    testing::Buffers x = testing::make_buffers(dense, kb), y = testing::make_buffers(dyn, kb);
    ASSERT_TRUE(a.value()->submit(id, kb).is_ok());
    ASSERT_TRUE(b.value()->submit(id, kb).is_ok());
    ASSERT_TRUE(a.value()->forward(id, x.views).is_ok());
    ASSERT_TRUE(b.value()->forward(id, y.views).is_ok());
    for (std::size_t i = 0; i < x.data.size(); ++i) ASSERT_TRUE(same_bits(x.data[i], y.data[i])) << "batch " << id;
    testing::fill_random(rng, x);
    for (std::size_t i = 0; i < x.data.size(); ++i) std::copy(x.data[i].begin(), x.data[i].end(), y.data[i].begin());
    ASSERT_TRUE(a.value()->backward(id, x.cviews).is_ok());
    ASSERT_TRUE(b.value()->backward(id, y.cviews).is_ok());
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  const auto keys = b.value()->keys_held(0);
  ASSERT_TRUE(keys.is_ok());
  EXPECT_EQ(keys.value(), used);
  const std::int32_t sd = optimizer_state_dim(kind, 4);
  std::vector<float> w(used.size() * 4), s(used.size() * static_cast<std::size_t>(sd) + 1);
  ASSERT_TRUE(b.value()->read_keys(0, used, w.data(), s.data()).is_ok());
  for (std::size_t i = 0; i < used.size(); ++i) {
    std::vector<float> dw(4), ds(static_cast<std::size_t>(sd) + 1);
    ASSERT_TRUE(a.value()->read_rows(0, used[i], 1, dw.data(), ds.data()).is_ok());
    EXPECT_TRUE(same_bits(dw, std::vector<float>(w.begin() + static_cast<std::ptrdiff_t>(i * 4),
                                                 w.begin() + static_cast<std::ptrdiff_t>(i * 4 + 4))))
        << "key " << used[i];
    EXPECT_TRUE(same_bits(std::vector<float>(ds.begin(), ds.begin() + sd),
                          std::vector<float>(s.begin() + static_cast<std::ptrdiff_t>(i) * sd,
                                             s.begin() + static_cast<std::ptrdiff_t>(i + 1) * sd)))
        << "key " << used[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DynamicAsDense,
                         ::testing::Combine(::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad),
                                            ::testing::Values(DType::kF32, DType::kBF16)));

// A world of the reference (open_reference_world): each dynamic table in shards, one per rank.

using detail::DynamicAccess;
using detail::DynamicState;

// "item": dynamic, capacity `capacity`, dim 2, adagrad (a state too), unpooled, sharded by `plan` (placement gpu).
StoreConfig world_config(std::int64_t capacity, const DynamicSpec& d, dispatch::ShardingPlan plan) {
  StoreConfig c;
  c.tables.push_back(table("item", capacity, d));
  c.tables[0].spec.optimizer.kind = OptimizerKind::kAdagrad;
  c.tables[0].spec.optimizer.initial_accumulator = 0.1f;
  c.tables[0].sharding = plan;
  c.tables[0].placement = Placement::kGpu;  // what a sharded table is (the reference has no device)
  return c;
}

std::unique_ptr<Store> open_world(const StoreConfig& c, int world) {
  auto s = open_reference_world(c, world);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

dispatch::ShardLayout layout_of(const StoreConfig& c, int world) {
  TableSpec served = c.tables[0].spec;
  served.rows += 1;
  return dispatch::ShardLayout::make(served, c.tables[0].sharding, world, 0).value();
}

DynamicState state_of(Store& s) {
  DynamicState st;
  const Status read = dynamic_cast<DynamicAccess&>(s).read_dynamic(0, st);
  EXPECT_TRUE(read.is_ok()) << read.to_string();
  return st;
}

bool same_state(const DynamicState& a, const DynamicState& b) {
  return a.clock == b.clock && a.entries == b.entries && a.sketch == b.sketch && same_bits(a.weights, b.weights) &&
         same_bits(a.state, b.state);
}

// The entries of shard r of a world's state (its keys' entries, in order, with their weights and state), its sketch
// bytes at `sketch_at` (advanced), and the clock.
DynamicState shard_state(const DynamicState& all, const dispatch::ShardLayout& l, int r, std::size_t sketch_bytes,
                         std::size_t& sketch_at) {
  DynamicState out;
  out.clock = all.clock;
  const std::size_t sd = all.entries.empty() ? 0 : all.state.size() / all.entries.size();
  for (std::size_t i = 0; i < all.entries.size(); ++i) {
    if (l.key_owner(all.entries[i].key) != r) continue;
    out.entries.push_back(all.entries[i]);
    out.weights.insert(out.weights.end(), all.weights.begin() + static_cast<std::ptrdiff_t>(2 * i),
                       all.weights.begin() + static_cast<std::ptrdiff_t>(2 * i + 2));
    out.state.insert(out.state.end(), all.state.begin() + static_cast<std::ptrdiff_t>(sd * i),
                     all.state.begin() + static_cast<std::ptrdiff_t>(sd * (i + 1)));
  }
  if (!all.sketch.empty()) {
    out.sketch.assign(all.sketch.begin() + static_cast<std::ptrdiff_t>(sketch_at),
                      all.sketch.begin() + static_cast<std::ptrdiff_t>(sketch_at + sketch_bytes));
    sketch_at += sketch_bytes;
  }
  return out;
}

// Keys of a world test: small ones, negatives and keys near INT64_MIN and INT64_MAX.
std::vector<Key> key_pool(std::mt19937_64& rng, std::size_t n) {
  std::vector<Key> pool;
  while (pool.size() < n) {
    const auto i = static_cast<Key>(rng() % 64);
    const Key k = pool.size() % 3 == 0   ? std::numeric_limits<Key>::min() + i
                  : pool.size() % 3 == 1 ? std::numeric_limits<Key>::max() - i
                                         : static_cast<Key>(rng() % 81) - 40;
    if (std::find(pool.begin(), pool.end(), k) == pool.end()) pool.push_back(k);
  }
  return pool;
}

// A batch's keys: at most `distinct` keys of `pool` (hot ones more often), each used 1 to 3 times, shuffled.
std::vector<Key> random_keys(std::mt19937_64& rng, const std::vector<Key>& pool, std::int64_t distinct) {
  std::vector<Key> keys, chosen;
  const auto n = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(distinct + 1));
  for (std::int64_t i = 0; i < n; ++i) {
    const Key k = pool[rng() % (rng() % 2 ? 4 : pool.size())];
    if (std::find(chosen.begin(), chosen.end(), k) != chosen.end()) continue;
    chosen.push_back(k);
    for (std::uint64_t u = 1 + rng() % 3; u > 0; --u) keys.push_back(k);
  }
  std::shuffle(keys.begin(), keys.end(), rng);
  return keys;
}

// Submits `keys` (training or not) and forwards: what each key position read.
std::vector<float> submit_forward(Store& s, std::int64_t id, const std::vector<Key>& keys, bool train) {
  const Status st = s.submit(id, batch(keys, train));
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::vector<float> out(keys.size() * 2, -7.0f);
  EXPECT_TRUE(s.forward(id, {{out.data(), static_cast<std::int64_t>(keys.size()), 2}}).is_ok());
  return out;
}

// Backward with `grads` (keys x 2), or discard for an evaluation batch.
void retire(Store& s, std::int64_t id, const std::vector<float>& grads, bool train) {
  const Status st =
      train ? s.backward(id, {{grads.data(), static_cast<std::int64_t>(grads.size() / 2), 2}}) : s.discard(id);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

class ReferenceWorld : public ::testing::TestWithParam<std::tuple<int, dispatch::ShardingType>> {};

// The world's shards are independent indexes: each is a world-1 reference of the shard's capacity fed the batches'
// keys it owns (in their order; a batch with none still ticks its clock), with the same rows, clocks, sketches,
// weights, state, outputs and counters.
TEST_P(ReferenceWorld, ShardsAreIndependentIndexes) {
  const auto [world, type] = GetParam();
  const int owner = type == dispatch::ShardingType::kTable ? world - 1 : -1;
  for (const DynamicSpec& d : {spec(1), spec(2, Eviction::kLfu), spec(2, Eviction::kLru, 3)}) {
    SCOPED_TRACE(::testing::Message() << "world " << world << " " << dispatch::to_string(type) << " admit_after "
                                      << d.admit_after << " ttl " << d.evict_after_steps);
    const std::int64_t capacity = 4 * world + 1;
    const StoreConfig c = world_config(capacity, d, {type, owner});
    auto all = open_world(c, world);
    ASSERT_TRUE(all);
    const dispatch::ShardLayout l = layout_of(c, world);
    std::vector<std::unique_ptr<Store>> one(static_cast<std::size_t>(world));  // per shard with keys
    std::int64_t least = capacity;
    for (int r = 0; r < world; ++r) {
      if (l.key_capacity(r) == 0) continue;
      least = std::min(least, l.key_capacity(r));
      one[static_cast<std::size_t>(r)] = open_world(world_config(l.key_capacity(r), d, {}), 1);
    }
    std::mt19937_64 rng(static_cast<std::uint64_t>(world * 100 + static_cast<int>(type) * 10 + d.admit_after));
    const std::vector<Key> pool = key_pool(rng, static_cast<std::size_t>(3 * capacity));
    for (std::int64_t id = 1; id <= 40; ++id) {
      const bool train = rng() % 6 != 0;
      const std::vector<Key> keys = random_keys(rng, pool, least);  // no shard refuses it
      std::vector<float> grads(keys.size() * 2);
      for (float& g : grads) g = 0.25f * static_cast<float>(static_cast<int>(rng() % 9) - 4);
      const std::vector<float> out = submit_forward(*all, id, keys, train);
      for (int r = 0; r < world; ++r) {
        if (!one[static_cast<std::size_t>(r)]) continue;
        std::vector<Key> mine;
        std::vector<float> mine_grads;
        std::vector<std::size_t> at;  // positions in `keys`
        for (std::size_t j = 0; j < keys.size(); ++j) {
          if (l.key_owner(keys[j]) != r) continue;
          mine.push_back(keys[j]);
          at.push_back(j);
          mine_grads.insert(mine_grads.end(), grads.begin() + static_cast<std::ptrdiff_t>(2 * j),
                            grads.begin() + static_cast<std::ptrdiff_t>(2 * j + 2));
        }
        Store& s = *one[static_cast<std::size_t>(r)];
        const std::vector<float> got = submit_forward(s, id, mine, train);
        for (std::size_t i = 0; i < at.size(); ++i)
          ASSERT_TRUE(same_bits({got[2 * i], got[2 * i + 1]}, {out[2 * at[i]], out[2 * at[i] + 1]}))
              << "batch " << id << " key " << mine[i] << " of shard " << r;
        retire(s, id, mine_grads, train);
      }
      retire(*all, id, grads, train);
      // Every shard as its own store, after every batch.
      const DynamicState whole = state_of(*all);
      std::size_t sketch_at = 0, entries = 0;
      DynamicStats sum;
      for (int r = 0; r < world; ++r) {
        if (!one[static_cast<std::size_t>(r)]) continue;
        Store& s = *one[static_cast<std::size_t>(r)];
        const DynamicState want = state_of(s);
        const DynamicState got = shard_state(whole, l, r, want.sketch.size(), sketch_at);
        ASSERT_TRUE(same_state(got, want)) << "batch " << id << " shard " << r;
        // The world lists shard 0's entries, then shard 1's, ...
        for (std::size_t i = 0; i < want.entries.size(); ++i) ASSERT_EQ(whole.entries[entries + i], want.entries[i]);
        entries += want.entries.size();
        sum += stats(s);
      }
      ASSERT_EQ(sketch_at, whole.sketch.size());
      ASSERT_EQ(entries, whole.entries.size());
      sum.capacity = capacity;
      ASSERT_EQ(counts(stats(*all)), counts(sum)) << "batch " << id;
    }
    std::vector<Key> keys;
    for (const auto& e : state_of(*all).entries) keys.push_back(e.key);
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(held(*all), keys);
    EXPECT_GT(stats(*all).evictions + stats(*all).expirations, 0);  // small enough to evict
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ReferenceWorld,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(dispatch::ShardingType::kRow,
                                                              dispatch::ShardingType::kTable)));

// Keys of `layout`'s shard r, from 0 up.
std::vector<Key> keys_of(const dispatch::ShardLayout& l, int r, std::size_t n) {
  std::vector<Key> keys;
  for (Key k = 0; keys.size() < n; ++k)
    if (l.key_owner(k) == r) keys.push_back(k);
  return keys;
}

TEST(ReferenceWorld, BatchOneShardCannotFitChangesNoShard) {
  const StoreConfig c = world_config(8, spec(2), {dispatch::ShardingType::kRow, -1});
  auto s = open_world(c, 4);  // shards of 2 rows
  ASSERT_TRUE(s);
  const dispatch::ShardLayout l = layout_of(c, 4);
  const std::vector<Key> a = keys_of(l, 0, 2), b = keys_of(l, 2, 3);
  run(*s, 1, batch({a[0], a[0], b[0], b[0], a[1], b[1]}));  // a[0] and b[0] admitted, a[1] and b[1] counted once
  run(*s, 2, batch({b[0]}), true, false);                   // b[0]'s row pinned
  const DynamicState before = state_of(*s);
  const auto stats_before = counts(stats(*s));
  // a[1] would be admitted into shard 0's free row; shard 2 has one free row for b[1] and b[2].
  const Status st = s->submit(3, batch({a[1], b[1], b[2], b[2]}));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "batch 3: table 'item', shard 2 of 4: 2 new keys need rows: 1 free and 0 evictable of capacity 2 (1 rows "
            "pinned by batches in flight)");
  EXPECT_TRUE(same_state(state_of(*s), before));
  EXPECT_EQ(counts(stats(*s)), stats_before);
  EXPECT_EQ(s->in_flight(), 1);
  ASSERT_TRUE(s->discard(2).is_ok());
  run(*s, 3, batch({a[1], b[1]}));  // each reaches 2 (the refused batch counted nothing)
  std::vector<Key> want = {a[0], a[1], b[0], b[1]};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(held(*s), want);
  EXPECT_EQ(counts(stats(*s)), (std::vector<std::int64_t>{4, 8, 4, 0, 0, 2, 0, 0}));
}

TEST(ReferenceWorld, ReadWriteDynamicRoundTripContinuesBitForBit) {
  const StoreConfig c = world_config(10, spec(2, Eviction::kLru, 4), {dispatch::ShardingType::kRow, -1});
  auto a = open_world(c, 3), b = open_world(c, 3);
  ASSERT_TRUE(a && b);
  std::mt19937_64 rng(21);
  const std::vector<Key> pool = key_pool(rng, 30);
  const auto step = [&](std::int64_t id, std::vector<Store*> stores) {
    const std::vector<Key> keys = random_keys(rng, pool, 3);
    std::vector<float> grads(keys.size() * 2);
    for (float& g : grads) g = 0.125f * static_cast<float>(static_cast<int>(rng() % 9) - 4);
    std::vector<std::vector<float>> outs;
    for (Store* s : stores) outs.push_back(submit_forward(*s, id, keys, true));
    for (Store* s : stores) retire(*s, id, grads, true);
    for (const auto& out : outs) ASSERT_TRUE(same_bits(out, outs[0])) << "batch " << id;
  };
  for (std::int64_t id = 1; id <= 15; ++id) step(id, {a.get()});
  const DynamicState saved = state_of(*a);
  ASSERT_FALSE(saved.sketch.empty());
  auto& access = dynamic_cast<DynamicAccess&>(*b);
  const DynamicState fresh = state_of(*b);
  // What a world refuses, with nothing changed: a row beyond its shard's capacity, a sketch of another size.
  const dispatch::ShardLayout l = layout_of(c, 3);
  DynamicState bad = saved;
  ASSERT_FALSE(bad.entries.empty());
  const int shard = l.key_owner(bad.entries[0].key);
  bad.entries[0].row = l.key_capacity(shard);
  Status st = access.write_dynamic(0, bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "write_dynamic: table 'item': key " + std::to_string(bad.entries[0].key) +
                              " (entry 0) at row " + std::to_string(bad.entries[0].row) + " of shard " +
                              std::to_string(shard) + " of 3 (expected a row below its capacity, " +
                              std::to_string(l.key_capacity(shard)) + ")");
  bad = saved;
  bad.sketch.pop_back();
  st = access.write_dynamic(0, bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "write_dynamic: table 'item': a sketch of " + std::to_string(bad.sketch.size()) +
                              " bytes (expected " + std::to_string(saved.sketch.size()) +
                              ": its 3 shards' sketches in shard order)");
  EXPECT_TRUE(same_state(state_of(*b), fresh));
  ASSERT_TRUE(access.write_dynamic(0, saved).is_ok());
  EXPECT_TRUE(same_state(state_of(*b), saved));
  EXPECT_EQ(held(*b), held(*a));
  for (std::int64_t id = 16; id <= 30; ++id) step(id, {a.get(), b.get()});
  EXPECT_TRUE(same_state(state_of(*b), state_of(*a)));
}

// A shard's row is held at its global row, which stochastic rounding draws with (as the engines, serving global rows).
TEST(ReferenceWorld, StochasticRoundingDrawsWithTheGlobalRow) {
  StoreConfig c = world_config(4, spec(1), {dispatch::ShardingType::kRow, -1});
  TableSpec& t = c.tables[0].spec;
  t.dim = 8;
  t.dtype = DType::kBF16;
  t.stochastic_rounding = true;
  t.optimizer.kind = OptimizerKind::kSgd;
  auto s = open_world(c, 2);
  ASSERT_TRUE(s);
  const dispatch::ShardLayout l = layout_of(c, 2);
  const Key k = keys_of(l, 1, 1)[0];  // shard 1's row 0: global row 1
  ASSERT_TRUE(s->submit(1, batch({k})).is_ok());
  std::vector<float> out(8), grad(8), w(8);
  ASSERT_TRUE(s->forward(1, {{out.data(), 1, 8}}).is_ok());
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 0.0123f * static_cast<float>(i + 1);
  ASSERT_TRUE(s->backward(1, {{grad.data(), 1, 8}}).is_ok());
  ASSERT_TRUE(s->read_keys(0, {k}, w.data(), nullptr).is_ok());
  const auto want = [&](std::int64_t row) {  // the initial row rounded to nearest, minus rate x gradient, rounded
    std::vector<float> v(8);
    init_row(v.data(), table_seed(7, table_name_hash("item")), k, 8, 0.5f);
    const std::uint64_t key = rounding_row_key(rounding_seed(t), row, 1, RoundingSalt::kWeights);
    for (std::int32_t i = 0; i < 8; ++i) {
      const float x =
          rounded(DType::kBF16, v[static_cast<std::size_t>(i)], false, 0) - kRate * grad[static_cast<std::size_t>(i)];
      v[static_cast<std::size_t>(i)] = rounded(DType::kBF16, x, true, rounding_bits(key, i));
    }
    return v;
  };
  EXPECT_TRUE(same_bits(w, want(l.global_row(1, 0))));
  EXPECT_FALSE(same_bits(w, want(0)));  // the shard's own row draws other bits
}

TEST(ReferenceWorld, OpenRefusesWorldsAndPlansThatCannotHoldTheKeys) {
  StoreConfig c = world_config(3, spec(1), {dispatch::ShardingType::kRow, -1});
  EXPECT_EQ(open_reference_world(c, 0).status().message(),
            "open_reference_world: a world of 0 ranks (expected at least 1)");
  EXPECT_EQ(open_reference_world(c, 4).status().message(),
            "dynamic table 'item': capacity 3 is below the world size 4 (row sharding gives every rank a shard of "
            "capacity / ranks rows; expected a capacity of at least 4)");
  c.tables[0].sharding = {dispatch::ShardingType::kColumn, -1};
  EXPECT_EQ(open_reference_world(c, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(open_reference_world(c, 1).is_ok()) << open_reference_world(c, 1).status().to_string();
  c.tables[0].dynamic.reset();  // a dense table: any plan in any world
  EXPECT_TRUE(open_reference_world(c, 2).is_ok()) << open_reference_world(c, 2).status().to_string();
}

}  // namespace
}  // namespace strata
