// KeyIndex: the rules of core/dynamic_spec.hpp, checked case by case and against a small model
// written here from the spec (std::map, O(n) victim scans).
#include "host/key_index.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/row_math.hpp"

namespace strata {
namespace {

using Rows = std::vector<std::int64_t>;
using Created = std::vector<std::pair<std::int64_t, Key>>;
constexpr std::int64_t kNone = KeyIndex::kNone;
constexpr Key kMin = std::numeric_limits<Key>::min();
constexpr Key kMax = std::numeric_limits<Key>::max();

DynamicSpec make_spec(std::int64_t admit_after, Eviction eviction, std::int64_t ttl) {
  DynamicSpec spec;
  spec.admit_after = admit_after;
  spec.eviction = eviction;
  spec.evict_after_steps = ttl;
  return spec;
}

// Trains `keys` once each (or with `uses`), releases the rows, returns them.
Rows train_released(KeyIndex& index, const std::vector<Key>& keys, std::vector<std::int64_t> uses = {}) {
  if (uses.empty()) uses.assign(keys.size(), 1);
  Rows rows;
  Created created;
  const Status st = index.train(keys, uses, rows, created);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  index.release(rows);
  return rows;
}

std::vector<Key> keys_of(const KeyIndex& index) {
  std::vector<Key> keys;
  for (const auto& e : index.entries()) keys.push_back(e.key);
  return keys;
}

TEST(KeyIndex, HitsKeepTheirRowsAndFreeRowsGoLowestFirst) {
  KeyIndex index(4, make_spec(1, Eviction::kLru, 0));
  Rows rows;
  Created created;
  ASSERT_TRUE(index.train({10, 20, 30}, {1, 2, 1}, rows, created).is_ok());
  EXPECT_EQ(rows, (Rows{0, 1, 2}));
  EXPECT_EQ(created, (Created{{0, 10}, {1, 20}, {2, 30}}));
  EXPECT_EQ(index.pinned(), 3);
  index.release(rows);
  ASSERT_TRUE(index.train({20, 40}, {3, 1}, rows, created).is_ok());
  EXPECT_EQ(rows, (Rows{1, 3}));
  EXPECT_EQ(created, (Created{{3, 40}}));
  index.release(rows);
  EXPECT_EQ(index.clock(), 2);
  EXPECT_EQ(index.size(), 4);
  EXPECT_EQ(index.row_of(20), 1);
  EXPECT_EQ(index.row_of(99), kNone);
  const std::vector<KeyIndex::Entry> want = {{10, 0, 1, 1}, {30, 2, 1, 1}, {20, 1, 2, 5}, {40, 3, 2, 1}};
  EXPECT_EQ(index.entries(), want);
  EXPECT_EQ(index.counts().admissions, 4);
  EXPECT_EQ(index.sketch_state_bytes(), 0);  // admit_after 1 keeps no sketch
}

// forget() takes rows back from their keys (an engine could not write them): the keys read as unseen, the rows are the
// lowest free ones again, the other keys keep theirs in their order.
TEST(KeyIndex, ForgottenRowsAreFreeAndTheirKeysHaveNone) {
  for (const Eviction eviction : {Eviction::kLru, Eviction::kLfu}) {
    KeyIndex index(4, make_spec(1, eviction, 0));
    train_released(index, {10, 20, 30});
    index.forget({0, 2});
    EXPECT_EQ(index.row_of(10), kNone);
    EXPECT_EQ(index.row_of(30), kNone);
    EXPECT_EQ(index.size(), 1);
    EXPECT_EQ(keys_of(index), (std::vector<Key>{20}));
    EXPECT_EQ(train_released(index, {40, 10, 50, 60}), (Rows{0, 2, 3, 1})) << "evicts 20 last";
    EXPECT_EQ(keys_of(index), (std::vector<Key>{40, 10, 50, 60}));
  }
}

// More batches in flight on one row than 16-bit pin counts hold (65,535 aborted the process): the row stays pinned,
// not evictable, until the last of them is released.
TEST(KeyIndex, ARowPinnedByMoreThan65535BatchesStaysPinnedUntilTheLast) {
  KeyIndex index(1, make_spec(1, Eviction::kLru, 0));
  Rows rows;
  Created created;
  ASSERT_TRUE(index.train({7}, {1}, rows, created).is_ok());
  constexpr int kBatches = 70000;
  for (int i = 0; i < kBatches; ++i) {
    Rows found;
    index.find({7}, found);
    ASSERT_EQ(found, Rows{0});
  }
  index.release(rows);
  for (int i = 0; i < kBatches - 1; ++i) index.release({0});
  EXPECT_EQ(index.pinned(), 1);
  EXPECT_EQ(index.check({8}, {1}).code(), StatusCode::kResourceExhausted);  // the one row is pinned
  index.release({0});
  EXPECT_EQ(index.pinned(), 0);
  EXPECT_TRUE(index.check({8}, {1}).is_ok());
}

TEST(KeyIndex, AdmissionCountsUsesAcrossBatchesThroughTheSketch) {
  KeyIndex index(8, make_spec(3, Eviction::kLru, 0));
  // Key 7: 1 use per batch (1, 2, 3: admitted at the third); key 8: 3 uses at once; key 9: 2.
  EXPECT_EQ(train_released(index, {7, 8, 9}, {1, 3, 2}), (Rows{kNone, 0, kNone}));
  EXPECT_EQ(train_released(index, {7}), (Rows{kNone}));
  EXPECT_EQ(train_released(index, {7, 9}), (Rows{1, 2}));
  EXPECT_EQ(index.counts().not_admitted, 1 + 2 + 1);
  EXPECT_EQ(index.counts().admissions, 3);
  // A row's count starts at the uses of the batch that admitted it.
  EXPECT_EQ(index.entries().back().count, 1);
  EXPECT_EQ(index.sketch_state_bytes(), 8 + 2 * 4 * 64);
}

TEST(KeyIndex, LruEvictsTheLeastRecentThenTheEarlierTouched) {
  KeyIndex index(3, make_spec(1, Eviction::kLru, 0));
  train_released(index, {1, 2, 3});                        // one clock: ties in first-use order
  EXPECT_EQ(train_released(index, {4}), (Rows{0}));        // evicts 1
  EXPECT_EQ(train_released(index, {2, 5}), (Rows{1, 2}));  // 2 hits, 5 evicts 3
  EXPECT_EQ(train_released(index, {6, 7}), (Rows{0, 1}));  // evicts 4 then 2
  EXPECT_EQ(keys_of(index), (std::vector<Key>{5, 6, 7}));
  EXPECT_EQ(index.counts().evictions, 4);
}

TEST(KeyIndex, LfuEvictsTheSmallestCountThenTheLeastRecent) {
  KeyIndex index(3, make_spec(1, Eviction::kLfu, 0));
  train_released(index, {1, 2, 3}, {5, 2, 2});
  train_released(index, {1});                              // counts: 1:6, 2:2, 3:2
  EXPECT_EQ(train_released(index, {4}), (Rows{1}));        // 2 (count 2, touched before 3)
  EXPECT_EQ(train_released(index, {3, 5}), (Rows{2, 1}));  // 3 -> 3 uses; 5 evicts 4 (count 1)
  EXPECT_EQ(train_released(index, {6}, {9}), (Rows{1}));   // 5 (count 1)
  EXPECT_EQ(train_released(index, {7}), (Rows{2}));        // 3 (count 3) before 1 (6) and 6 (9)
  EXPECT_EQ(keys_of(index), (std::vector<Key>{1, 6, 7}));
}

TEST(KeyIndex, TtlExpiresRowsNotUsedForMoreThanItsSteps) {
  KeyIndex index(4, make_spec(1, Eviction::kLru, 2));
  train_released(index, {1, 2});  // clock 1
  train_released(index, {3});     // clock 2
  train_released(index, {2});     // clock 3
  EXPECT_EQ(index.size(), 3);
  EXPECT_EQ(train_released(index, {4, 5}), (Rows{0, 3}));  // clock 4: 1 (4 - 1 > 2) expired, row 0 reused
  EXPECT_EQ(index.counts().expirations, 1);
  EXPECT_EQ(index.counts().evictions, 0);
  EXPECT_EQ(keys_of(index), (std::vector<Key>{3, 2, 4, 5}));
  train_released(index, {});  // clock 5: 3 (last use 2) expires
  EXPECT_EQ(keys_of(index), (std::vector<Key>{2, 4, 5}));
  EXPECT_EQ(index.row_of(3), kNone);
}

TEST(KeyIndex, AFullTableFillsAndDrainsByTtl) {
  constexpr std::int64_t kCap = 64;
  KeyIndex index(kCap, make_spec(1, Eviction::kLfu, 3));
  std::vector<Key> keys(kCap);
  for (std::int64_t i = 0; i < kCap; ++i) keys[static_cast<std::size_t>(i)] = i * 1000003 - 7;
  train_released(index, keys);
  EXPECT_EQ(index.size(), kCap);
  std::vector<Key> half(keys.begin(), keys.begin() + kCap / 2);
  for (int step = 0; step < 3; ++step) train_released(index, {});
  train_released(index, half);  // clock 5: the other half (last use 1) expire first
  EXPECT_EQ(index.size(), kCap / 2);
  EXPECT_EQ(index.counts().expirations, kCap / 2);
  for (int step = 0; step < 4; ++step) train_released(index, {});
  EXPECT_EQ(index.size(), 0);
  EXPECT_TRUE(index.entries().empty());
  // Refilled from row 0 up.
  const Rows rows = train_released(index, {kMax, kMin});
  EXPECT_EQ(rows, (Rows{0, 1}));
}

TEST(KeyIndex, ABatchThatCannotFitBesidePinnedRowsIsRefusedAndChangesNothing) {
  KeyIndex index(3, make_spec(2, Eviction::kLru, 1));
  Rows held;
  Created created;
  ASSERT_TRUE(index.train({1, 2}, {2, 2}, held, created).is_ok());  // pinned, not released
  train_released(index, {3}, {2});                                  // evictable
  Rows found;
  index.find({3}, found);  // now pinned too
  const auto entries = index.entries();
  const auto sketch = index.sketch_state();
  const auto counts = index.counts();
  Rows rows;
  const Status st = index.train({4, 1}, {2, 1}, rows, created);  // 4 needs a row: 0 free, 0 evictable
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("1 new keys need rows, 0 free, 0 evictable, 3 pinned"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("capacity 3"), std::string::npos);
  EXPECT_EQ(rows, (Rows{kNone, kNone}));
  EXPECT_TRUE(created.empty());
  EXPECT_EQ(index.entries(), entries);
  EXPECT_EQ(index.sketch_state(), sketch);
  EXPECT_EQ(index.clock(), 2);
  EXPECT_EQ(index.pinned(), 3);
  EXPECT_EQ(index.counts().admissions, counts.admissions);
  EXPECT_EQ(index.counts().not_admitted, counts.not_admitted);
  // A key not admitted needs no room.
  ASSERT_TRUE(index.train({5}, {1}, rows, created).is_ok());
  EXPECT_EQ(rows, (Rows{kNone}));
  index.release(rows);
  // Released by find's batch, 3 is evictable (and past the TTL: expired, not evicted).
  index.release(found);
  ASSERT_TRUE(index.train({4}, {2}, rows, created).is_ok());
  EXPECT_EQ(rows, (Rows{2}));
  EXPECT_EQ(index.counts().expirations, 1);
  index.release(rows);
  index.release(held);
  EXPECT_EQ(index.pinned(), 0);
}

TEST(KeyIndex, CheckSaysWhatTrainWouldAndChangesNothing) {
  KeyIndex index(2, make_spec(2, Eviction::kLru, 0));
  Rows held;
  Created created;
  ASSERT_TRUE(index.train({1, 2}, {2, 3}, held, created).is_ok());
  const auto entries = index.entries();
  const auto sketch = index.sketch_state();
  const Status checked = index.check({3, 1}, {2, 1});
  EXPECT_EQ(checked.code(), StatusCode::kResourceExhausted);
  Rows rows;
  EXPECT_EQ(index.train({3, 1}, {2, 1}, rows, created).to_string(), checked.to_string());
  EXPECT_TRUE(index.check({3, 1}, {1, 1}).is_ok());  // 3 not admitted: no room needed
  EXPECT_TRUE(index.check({1, 2}, {1, 1}).is_ok());
  EXPECT_EQ(index.entries(), entries);
  EXPECT_EQ(index.sketch_state(), sketch);
  EXPECT_EQ(index.clock(), 1);
  index.release(held);
  EXPECT_TRUE(index.check({3, 1}, {2, 1}).is_ok());
}

TEST(KeyIndex, FindWithUsesCountsTheUnseenUses) {
  KeyIndex index(2, make_spec(1, Eviction::kLru, 0));
  train_released(index, {1});
  Rows rows;
  index.find({9, 1, 8}, {2, 4, 3}, rows);
  EXPECT_EQ(rows, (Rows{kNone, 0, kNone}));
  EXPECT_EQ(index.counts().unseen, 5);
  index.release(rows);
  EXPECT_EQ(index.pinned(), 0);
}

TEST(KeyIndex, FindPinsButNeverAdmitsOrReorders) {
  KeyIndex index(2, make_spec(1, Eviction::kLru, 0));
  train_released(index, {1, 2});
  Rows found;
  index.find({1, 9, 1, 8}, found);
  EXPECT_EQ(found, (Rows{0, kNone, 0, kNone}));
  EXPECT_EQ(index.counts().unseen, 2);
  EXPECT_EQ(keys_of(index), (std::vector<Key>{1, 2}));  // 1 still least recent
  EXPECT_EQ(index.clock(), 1);
  // 1 is pinned twice: the next new key evicts 2 instead.
  EXPECT_EQ(train_released(index, {3}), (Rows{1}));
  EXPECT_EQ(index.pinned(), 1);
  index.release(found);  // kNone entries skipped, row 0 twice
  EXPECT_EQ(index.pinned(), 0);
  EXPECT_EQ(train_released(index, {4}), (Rows{0}));
}

TEST(KeyIndex, ExtremeKeysAreKeysLikeAnyOther) {
  KeyIndex index(4, make_spec(1, Eviction::kLru, 0));
  const std::vector<Key> keys = {kMin, kMax, 0, -1};
  EXPECT_EQ(train_released(index, keys), (Rows{0, 1, 2, 3}));
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(index.row_of(keys[i]), static_cast<std::int64_t>(i));
  EXPECT_EQ(train_released(index, {-1, kMin}), (Rows{3, 0}));
  EXPECT_EQ(train_released(index, {1}), (Rows{1}));  // evicts kMax
  EXPECT_EQ(index.row_of(kMax), kNone);
  EXPECT_EQ(keys_of(index), (std::vector<Key>{0, -1, kMin, 1}));
}

// ---- the model --------------------------------------------------------------------------------

// The rules restated from store/detail/dynamic_keys.hpp, and host/admission_sketch.hpp's sketch
// restated too (a change to either shows here).
class Model {
 public:
  Model(std::int64_t capacity, const DynamicSpec& spec) : capacity_(capacity), spec_(spec) {
    for (std::int64_t r = 0; r < capacity; ++r) free_.insert(r);
    width_ = 64;
    while (width_ < capacity) width_ *= 2;
    sketch_.assign(static_cast<std::size_t>(4 * width_), 0);
  }

  bool train(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses, Rows& rows, Created& created) {
    rows.assign(keys.size(), kNone);
    created.clear();
    std::vector<bool> admit(keys.size(), false);
    std::set<std::int64_t> batch_rows;
    std::int64_t admitted = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = rows_.find(keys[i]);
      if (it != rows_.end()) {
        rows[i] = it->second.row;
        batch_rows.insert(it->second.row);
      } else {
        admit[i] = spec_.admit_after <= 1 || estimate(keys[i]) + uses[i] >= spec_.admit_after;
        admitted += admit[i] ? 1 : 0;
      }
    }
    std::int64_t unpinned = 0;
    for (const auto& [key, r] : rows_) unpinned += (pins_[r.row] == 0 && batch_rows.count(r.row) == 0) ? 1 : 0;
    if (admitted > static_cast<std::int64_t>(free_.size()) + unpinned) {
      rows.assign(keys.size(), kNone);
      return false;
    }
    const std::int64_t now = ++clock_;
    const auto movable = [&](const Row& r) { return pins_[r.row] == 0 && batch_rows.count(r.row) == 0; };
    if (spec_.evict_after_steps > 0) {
      for (auto it = rows_.begin(); it != rows_.end();) {
        if (movable(it->second) && now - it->second.last_use > spec_.evict_after_steps) {
          free_.insert(it->second.row);
          ++counts_.expirations;
          it = rows_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!admit[i]) continue;
      std::int64_t row;
      if (!free_.empty()) {
        row = *free_.begin();
        free_.erase(free_.begin());
      } else {
        auto victim = rows_.end();
        for (auto it = rows_.begin(); it != rows_.end(); ++it) {
          if (!movable(it->second)) continue;
          if (victim == rows_.end() || before(it->second, victim->second)) victim = it;
        }
        row = victim->second.row;
        rows_.erase(victim);
        ++counts_.evictions;
      }
      rows_[keys[i]] = Row{row, 0, 0, 0};
      batch_rows.insert(row);
      rows[i] = row;
      created.emplace_back(row, keys[i]);
      ++counts_.admissions;
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (rows[i] == kNone) continue;
      Row& r = rows_[keys[i]];
      r.count = r.count > std::numeric_limits<std::int64_t>::max() - uses[i] ? std::numeric_limits<std::int64_t>::max()
                                                                             : r.count + uses[i];
      r.last_use = now;
      r.stamp = ++stamp_;
      ++pins_[r.row];
    }
    std::int64_t added = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const bool had_row = rows[i] != kNone && !admit[i];
      if (had_row) continue;
      if (!admit[i]) counts_.not_admitted += uses[i];
      for (int d = 0; d < 4; ++d) {
        auto& c = sketch_[static_cast<std::size_t>(d * width_) + column(keys[i], d)];
        c = static_cast<std::uint16_t>(std::min<std::int64_t>(65535, c + uses[i]));
      }
      added += uses[i];
    }
    tally_ += added;
    if (spec_.admit_after > 1 && tally_ >= 10 * width_) {
      for (auto& c : sketch_) c = static_cast<std::uint16_t>(c / 2);
      tally_ = 0;
    }
    return true;
  }

  void find(const std::vector<Key>& keys, Rows& rows) {
    rows.assign(keys.size(), kNone);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = rows_.find(keys[i]);
      if (it == rows_.end()) {
        ++counts_.unseen;
      } else {
        rows[i] = it->second.row;
        ++pins_[it->second.row];
      }
    }
  }

  void release(const Rows& rows) {
    for (const std::int64_t r : rows) {
      if (r != kNone) --pins_[r];
    }
  }

  std::vector<KeyIndex::Entry> entries() const {
    std::vector<std::pair<std::int64_t, KeyIndex::Entry>> by_stamp;
    for (const auto& [key, r] : rows_) by_stamp.push_back({r.stamp, {key, r.row, r.last_use, r.count}});
    std::sort(by_stamp.begin(), by_stamp.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<KeyIndex::Entry> out;
    for (const auto& [stamp, e] : by_stamp) out.push_back(e);
    return out;
  }
  // In KeyIndex::sketch_state()'s format (empty: admit_after <= 1 keeps no sketch).
  std::vector<std::uint8_t> sketch_state() const {
    std::vector<std::uint8_t> out;
    if (spec_.admit_after <= 1) return out;
    for (int b = 0; b < 8; ++b) out.push_back(static_cast<std::uint8_t>(tally_ >> (8 * b)));
    for (const std::uint16_t c : sketch_) {
      out.push_back(static_cast<std::uint8_t>(c % 256));
      out.push_back(static_cast<std::uint8_t>(c / 256));
    }
    return out;
  }
  const KeyIndex::Counts& counts() const { return counts_; }
  std::int64_t clock() const { return clock_; }

 private:
  struct Row {
    std::int64_t row, last_use, count, stamp;
  };
  bool before(const Row& a, const Row& b) const {
    if (spec_.eviction == Eviction::kLfu && a.count != b.count) return a.count < b.count;
    return a.stamp < b.stamp;
  }
  std::uint64_t column(Key key, int d) const {
    return mix64(static_cast<std::uint64_t>(key) ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(d + 1))) &
           static_cast<std::uint64_t>(width_ - 1);
  }
  std::int64_t estimate(Key key) const {
    std::int64_t e = 65535;
    for (int d = 0; d < 4; ++d) {
      e = std::min<std::int64_t>(e, sketch_[static_cast<std::size_t>(d * width_) + column(key, d)]);
    }
    return e;
  }

  std::int64_t capacity_;
  DynamicSpec spec_;
  std::int64_t clock_ = 0, stamp_ = 0, width_ = 0, tally_ = 0;
  std::map<Key, Row> rows_;
  std::set<std::int64_t> free_;
  std::map<std::int64_t, int> pins_;
  std::vector<std::uint16_t> sketch_;
  KeyIndex::Counts counts_;
};

// A random stream of batches over a few dozen keys (the extremes among them), with batches held
// in flight and released at random.
class Stream {
 public:
  explicit Stream(std::uint64_t seed, std::int64_t capacity) : rng_(seed) {
    universe_ = {kMin, kMax, 0, -1, kMin + 1, kMax - 1};
    while (static_cast<std::int64_t>(universe_.size()) < 3 * capacity + 4) {
      universe_.push_back(static_cast<Key>(rng_()));
    }
    max_batch_ = capacity;
  }
  // Distinct keys in first-use order and their uses.
  void batch(std::vector<Key>& keys, std::vector<std::int64_t>& uses) {
    keys.clear();
    uses.clear();
    const auto n = std::uniform_int_distribution<std::int64_t>(0, max_batch_)(rng_);
    std::map<Key, std::size_t> at;
    for (std::int64_t j = 0; j < n; ++j) {
      // Skewed: low indices much more often.
      const auto u = std::uniform_real_distribution<double>(0, 1)(rng_);
      const auto k = universe_[static_cast<std::size_t>(u * u * static_cast<double>(universe_.size()))];
      const auto [it, added] = at.emplace(k, keys.size());
      if (added) {
        keys.push_back(k);
        uses.push_back(0);
      }
      uses[it->second] += 1;  // repeated keys: more uses of one distinct key
    }
  }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

 private:
  std::mt19937_64 rng_;
  std::vector<Key> universe_;
  std::int64_t max_batch_;
};

class KeyIndexModel : public ::testing::TestWithParam<std::tuple<std::int64_t, Eviction, std::int64_t>> {};

// `steps` batches (1 in 8 a find()) through the index and the model, each batch's rows and the
// state after it compared; `refused` gets the trains refused.
void run_against_model(const DynamicSpec& spec, std::int64_t capacity, int steps, std::uint64_t seed, int& refused) {
  KeyIndex index(capacity, spec);
  Model model(capacity, spec);
  Stream stream(seed, capacity);
  std::vector<Rows> held;  // batches in flight (the index's rows == the model's)
  std::vector<Key> keys;
  std::vector<std::int64_t> uses;
  Rows rows, want_rows;
  Created created, want_created;
  refused = 0;
  for (int step = 0; step < steps; ++step) {
    stream.batch(keys, uses);
    if (stream.pick(8) == 0) {
      index.find(keys, rows);
      model.find(keys, want_rows);
      ASSERT_EQ(rows, want_rows) << "step " << step;
      held.push_back(rows);
    } else {
      const bool ok = model.train(keys, uses, want_rows, want_created);
      ASSERT_EQ(index.check(keys, uses).is_ok(), ok) << "step " << step;
      const Status st = index.train(keys, uses, rows, created);
      ASSERT_EQ(st.is_ok(), ok) << "step " << step << ": " << st.to_string();
      refused += ok ? 0 : 1;
      ASSERT_EQ(rows, want_rows) << "step " << step;
      ASSERT_EQ(created, want_created) << "step " << step;
      if (ok) held.push_back(rows);
    }
    // Release some batches, in any order; at most 3 in flight.
    while (!held.empty() && (held.size() > 3 || stream.pick(2) == 0)) {
      const auto at = static_cast<std::size_t>(stream.pick(static_cast<int>(held.size())));
      index.release(held[at]);
      model.release(held[at]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
    }
    ASSERT_EQ(index.entries(), model.entries()) << "step " << step;
    ASSERT_EQ(index.sketch_state(), model.sketch_state()) << "step " << step;
    ASSERT_EQ(index.clock(), model.clock());
  }
  const auto got = index.counts(), want = model.counts();
  EXPECT_EQ(got.admissions, want.admissions);
  EXPECT_EQ(got.evictions, want.evictions);
  EXPECT_EQ(got.expirations, want.expirations);
  EXPECT_EQ(got.not_admitted, want.not_admitted);
  EXPECT_EQ(got.unseen, want.unseen);
  EXPECT_GT(got.evictions + got.expirations, 100);  // the stream does force room to be made
}

TEST_P(KeyIndexModel, EveryBatchPlacesKeysAsTheModelDoes) {
  const auto [admit_after, eviction, ttl] = GetParam();
  int refused = 0;
  run_against_model(make_spec(admit_after, eviction, ttl), 12, 2500,
                    admit_after * 31 + static_cast<int>(eviction) * 7 + ttl, refused);
  EXPECT_GT(refused, 0);
}

TEST(KeyIndex, ALargerTablePlacesKeysAsTheModelDoes) {
  // Longer probe clusters and backward shifts in the hash index than 12 rows give.
  int refused = 0;
  run_against_model(make_spec(1, Eviction::kLru, 0), 300, 150, 5, refused);
  run_against_model(make_spec(3, Eviction::kLfu, 6), 300, 150, 6, refused);
}

INSTANTIATE_TEST_SUITE_P(Rules, KeyIndexModel,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(Eviction::kLru, Eviction::kLfu),
                                            ::testing::Values(0, 4)),
                         [](const auto& info) {
                           return "admit" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == Eviction::kLru ? "_lru" : "_lfu") + "_ttl" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- checkpoints ------------------------------------------------------------------------------

TEST(KeyIndex, RestoredIndexDecidesAsTheOriginal) {
  for (const Eviction eviction : {Eviction::kLru, Eviction::kLfu}) {
    const DynamicSpec spec = make_spec(2, eviction, 5);
    constexpr std::int64_t kCap = 16;
    KeyIndex original(kCap, spec);
    Stream stream(99, kCap);
    std::vector<Key> keys;
    std::vector<std::int64_t> uses;
    for (int step = 0; step < 200; ++step) {
      stream.batch(keys, uses);
      train_released(original, keys, uses);
    }
    KeyIndex restored(kCap, spec);
    ASSERT_TRUE(restored.restore(original.clock(), original.entries(), original.sketch_state()).is_ok());
    EXPECT_EQ(restored.entries(), original.entries());
    EXPECT_EQ(restored.sketch_state(), original.sketch_state());
    Rows a, b;
    Created ca, cb;
    for (int step = 0; step < 300; ++step) {
      stream.batch(keys, uses);
      ASSERT_TRUE(original.train(keys, uses, a, ca).is_ok());
      ASSERT_TRUE(restored.train(keys, uses, b, cb).is_ok());
      ASSERT_EQ(a, b) << "step " << step;
      ASSERT_EQ(ca, cb) << "step " << step;
      original.release(a);
      restored.release(b);
    }
    EXPECT_EQ(restored.entries(), original.entries());
    EXPECT_EQ(restored.sketch_state(), original.sketch_state());
  }
}

TEST(KeyIndex, RestoreRefusesBadInputAndChangesNothing) {
  KeyIndex index(4, make_spec(2, Eviction::kLfu, 0));
  train_released(index, {1, 2, 3}, {2, 2, 2});
  const auto entries = index.entries();
  const auto sketch = index.sketch_state();
  using E = KeyIndex::Entry;
  const auto refused = [&](std::int64_t clock, const std::vector<E>& es, const std::vector<std::uint8_t>& sk,
                           const std::string& says) {
    const Status st = index.restore(clock, es, sk);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << says;
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
    EXPECT_EQ(index.entries(), entries);
    EXPECT_EQ(index.sketch_state(), sketch);
    EXPECT_EQ(index.clock(), 1);
  };
  refused(5, {{1, 4, 1, 1}}, {}, "entry 0 (key 1, row 4): row outside [0, 4)");
  refused(5, {{1, 0, 1, 1}, {2, 0, 1, 1}}, {}, "entry 1 (key 2, row 0): row given twice");
  refused(5, {{1, 0, 1, 1}, {1, 1, 1, 1}}, {}, "entry 1 (key 1, row 1): key given twice");
  refused(5, {{1, 0, 6, 1}}, {}, "last use 6 outside [0, 5]");
  refused(5, {{1, 0, 3, 1}, {2, 1, 2, 1}}, {}, "entry 1 (key 2, row 1): last use 2 outside [3, 5]");
  refused(5, {{1, 0, 1, 0}}, {}, "count 0 < 1");
  refused(5, {}, {1, 2, 3}, "sketch of 3 bytes, expected 520");
  std::vector<std::uint8_t> tally_too_big(520, 0);
  tally_too_big[1] = 3;  // 768 >= 10 * 64
  refused(5, {}, tally_too_big, "sketch's uses added 768 outside [0, 640)");
  refused(-1, {}, {}, "clock -1");
  refused(5, std::vector<E>(5, E{0, 0, 1, 1}), {}, "5 entries, more than the 4 rows");

  Rows rows;
  index.find({1}, rows);
  EXPECT_EQ(index.restore(1, {}, {}).code(), StatusCode::kFailedPrecondition);
  index.release(rows);
  // Empty entries and sketch: an empty index, a zeroed sketch; counts stay.
  ASSERT_TRUE(index.restore(7, {}, {}).is_ok());
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.clock(), 7);
  EXPECT_EQ(index.sketch_state(), std::vector<std::uint8_t>(520, 0));
  EXPECT_EQ(index.counts().admissions, 3);
  KeyIndex no_sketch(4, make_spec(1, Eviction::kLru, 0));
  EXPECT_EQ(no_sketch.restore(0, {}, {0}).code(), StatusCode::kInvalidArgument);
  // Rows written at clock 0 (Store::write_keys of a store that never trained) have last use 0.
  KeyIndex at_zero(2, make_spec(1, Eviction::kLru, 0));
  ASSERT_TRUE(at_zero.restore(0, {{5, 1, 0, 1}, {6, 0, 0, 1}}, {}).is_ok());
  train_released(at_zero, {7});  // evicts key 5, first in the tie order
  EXPECT_EQ(at_zero.row_of(5), KeyIndex::kNone);
  EXPECT_EQ(at_zero.row_of(7), 1);
  EXPECT_EQ(at_zero.row_of(6), 0);
}

TEST(KeyIndex, BytesPerRowStayNearTheTarget) {
  const KeyIndex lru(1 << 12, make_spec(1, Eviction::kLru, 0));
  const double per_row = static_cast<double>(lru.bytes()) / static_cast<double>(lru.capacity());
  EXPECT_LT(per_row, 48.0);
  const KeyIndex sketched(1 << 12, make_spec(4, Eviction::kLru, 0));
  EXPECT_EQ(sketched.bytes() - lru.bytes(), 2 * 4 * (1 << 12));
}

}  // namespace
}  // namespace strata
