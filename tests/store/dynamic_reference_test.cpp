// The reference store's dynamic tables (issue 36; the rules: store/detail/dynamic_keys.hpp): small
// cases computed by hand (admission by count, LRU and LFU victims, the TTL, evaluation batches, a
// batch refused beside pinned rows, extreme keys, zeros for unseen keys, the errors), and a dynamic
// table that admits every key training bit for bit as a dense table of those keys.

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

#include "core/row_math.hpp"
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

}  // namespace
}  // namespace strata
