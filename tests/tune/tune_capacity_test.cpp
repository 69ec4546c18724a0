// strata-tune capacity (tune/capacity.hpp): its replay through the key index against an independent LRU of its own
// (a std::map, features merged bag by bag) and against the store's own counters (a cpu store trained on the same
// batches), and the recommendation rule.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "store/store.hpp"
#include "tests/store/store_test_util.hpp"
#include "tune/capacity.hpp"

namespace strata::tune {
namespace {

// Batches of two features over raw keys anywhere in int64: feature 0 ("a") a table of its own, features 1 and 2
// ("x", "y") one table together; a few hot keys, many cold ones, bags of 0-3 keys.
std::vector<KeyBatch> random_batches(std::uint64_t seed, int batches) {
  std::mt19937_64 rng(seed);
  std::vector<Key> pool;
  for (int i = 0; i < 60; ++i) pool.push_back(static_cast<Key>(rng()));  // negative ones too
  pool.push_back(INT64_MIN);
  pool.push_back(INT64_MAX);
  std::vector<KeyBatch> out;
  for (int s = 0; s < batches; ++s) {
    KeyBatch b;
    for (const char* name : {"a", "x", "y"}) {
      JaggedKeys f;
      f.table = name;
      f.offsets.push_back(0);
      for (int bag = 0; bag < 5; ++bag) {
        const int n = static_cast<int>(rng() % 4);
        for (int j = 0; j < n; ++j) {
          const std::size_t hot = rng() % 8;
          f.keys.push_back(rng() % 3 == 0 ? pool[rng() % pool.size()] : pool[hot]);
        }
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      b.features.push_back(std::move(f));
    }
    out.push_back(std::move(b));
  }
  return out;
}

// Independent: an LRU table of `capacity` rows that admits every key, a batch's keys pinned, refused when its
// distinct keys do not fit. Keys of a batch: its features bag by bag, distinct in first-use order.
struct Expected {
  std::int64_t hits = 0, admitted = 0, refused = 0, evictions = 0;
};
Expected simple_lru(const std::vector<KeyBatch>& batches, const std::vector<std::size_t>& features,
                    std::int64_t capacity) {
  Expected e;
  std::map<Key, std::int64_t> stamp;             // key -> last touch
  std::set<std::pair<std::int64_t, Key>> order;  // (last touch, key)
  std::int64_t clock = 0;
  for (const KeyBatch& b : batches) {
    std::vector<Key> first_use;
    std::map<Key, std::int64_t> uses;
    for (std::int64_t bag = 0; bag < b.batch_size(); ++bag)
      for (const std::size_t i : features) {
        const JaggedKeys& f = b.features[i];
        for (std::int64_t j = f.offsets[bag]; j < f.offsets[bag + 1]; ++j)
          if (uses[f.keys[j]]++ == 0) first_use.push_back(f.keys[j]);
      }
    if (static_cast<std::int64_t>(first_use.size()) > capacity) {
      for (const auto& [k, u] : uses) e.refused += u;
      continue;
    }
    for (const Key k : first_use) {
      if (stamp.count(k)) {
        e.hits += uses[k];
        continue;
      }
      e.admitted += uses[k];
      if (static_cast<std::int64_t>(stamp.size()) == capacity) {
        auto victim = order.begin();
        while (uses.count(victim->second)) ++victim;  // a key of this batch is pinned
        stamp.erase(victim->second);
        order.erase(victim);
        ++e.evictions;
      }
      stamp[k] = -1;
      order.insert({-1, k});
    }
    for (const Key k : first_use) {  // touched in first-use order
      order.erase({stamp[k], k});
      stamp[k] = ++clock;
      order.insert({clock, k});
    }
  }
  return e;
}

TEST(TuneCapacity, ReplayMatchesAnIndependentLruOnRandomKeys) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<KeyBatch> batches = random_batches(seed, 60);
    const std::vector<bench::SourceTable> tables{{"a", 1, {0}}, {"xy", 1, {1, 2}}};
    const BatchPass pass = [&](const std::function<Status(const KeyBatch&)>& each) {
      for (const KeyBatch& b : batches) STRATA_RETURN_IF_ERROR(each(b));
      return Status::ok();
    };
    CapacityOptions o;
    o.capacities = {3, 8, 12, 20, 40};
    auto plan = plan_capacity(tables, static_cast<std::int64_t>(batches.size()), pass, o);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    ASSERT_EQ(plan->tables.size(), 2u);
    for (std::size_t t = 0; t < 2; ++t) {
      const TableCapacity& tc = plan->tables[t];
      ASSERT_GE(tc.unbounded, 0);
      EXPECT_EQ(tc.runs[static_cast<std::size_t>(tc.unbounded)].capacity, tc.distinct);
      EXPECT_EQ(tc.distinct_by_step.size(), batches.size());
      for (const CapacityRun& r : tc.runs) {
        const Expected e = simple_lru(batches, tables[t].features, r.capacity);
        SCOPED_TRACE("seed " + std::to_string(seed) + ", table " + tc.name + ", capacity " +
                     std::to_string(r.capacity));
        EXPECT_EQ(r.hits, e.hits);
        EXPECT_EQ(r.admitted, e.admitted);
        EXPECT_EQ(r.refused, e.refused);
        EXPECT_EQ(r.counts.evictions, e.evictions);
        EXPECT_EQ(r.not_admitted, 0);
        EXPECT_EQ(r.hits + r.admitted + r.refused, tc.uses);
      }
      // The unbounded capacity admits each distinct key exactly once.
      EXPECT_EQ(tc.runs[static_cast<std::size_t>(tc.unbounded)].counts.admissions, tc.distinct);
    }
  }
}

// The store trained on the same batches (one in flight) counts what the replay counts at its capacities: admissions,
// evictions, expirations, uses without a row and rows in use, for a table of one feature and one of two.
TEST(TuneCapacity, ReplayCountsWhatTheStoreCounts) {
  struct Options {
    std::int64_t admit_after;
    Eviction eviction;
    std::int64_t ttl;
  };
  for (const Options& k : {Options{1, Eviction::kLru, 0}, Options{2, Eviction::kLfu, 3}}) {
    const std::vector<KeyBatch> batches = random_batches(7 + static_cast<std::uint64_t>(k.admit_after), 40);
    StoreConfig c;
    c.threads = 1;
    for (const char* name : {"a", "xy"}) {
      TableConfig t;
      t.spec.name = name;
      t.spec.rows = name[1] ? 30 : 15;  // the capacity: a batch's distinct keys always fit
      t.spec.dim = 4;
      t.dynamic = DynamicSpec{k.admit_after, k.eviction, k.ttl, Unseen::kInitial};
      if (name[1]) t.features = {{"x", std::nullopt}, {"y", std::nullopt}};
      c.tables.push_back(t);
    }
    auto opened = Store::open(c);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    Store& s = **opened;
    for (std::size_t id = 0; id < batches.size(); ++id) {
      ASSERT_TRUE(s.submit(static_cast<std::int64_t>(id), batches[id]).is_ok());
      testing::Buffers b = testing::make_buffers(c, batches[id]);
      ASSERT_TRUE(s.forward(static_cast<std::int64_t>(id), b.views).is_ok());
      ASSERT_TRUE(s.backward(static_cast<std::int64_t>(id), b.cviews).is_ok());
    }
    const BatchPass pass = [&](const std::function<Status(const KeyBatch&)>& each) {
      for (const KeyBatch& b : batches) STRATA_RETURN_IF_ERROR(each(b));
      return Status::ok();
    };
    CapacityOptions o;
    o.dynamic = *c.tables[0].dynamic;
    o.capacities = {15, 30};
    auto plan = plan_capacity({{"a", 1, {0}}, {"xy", 1, {1, 2}}}, 40, pass, o);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    for (std::size_t t = 0; t < 2; ++t) {
      const DynamicStats st = s.stats().dynamic.at(t).second;
      const TableCapacity& tc = plan->tables[t];
      const auto run =
          std::find_if(tc.runs.begin(), tc.runs.end(), [&](const CapacityRun& r) { return r.capacity == st.capacity; });
      ASSERT_NE(run, tc.runs.end());
      SCOPED_TRACE("admit_after " + std::to_string(k.admit_after) + ", table " + tc.name);
      EXPECT_EQ(run->counts.admissions, st.admissions);
      EXPECT_EQ(run->counts.evictions, st.evictions);
      EXPECT_EQ(run->counts.expirations, st.expirations);
      EXPECT_EQ(run->not_admitted, st.not_admitted);
      EXPECT_EQ(run->rows_in_use, st.rows);
      EXPECT_GT(st.evictions + st.expirations, 0);
      EXPECT_EQ(run->refused_batches, 0);
    }
  }
}

TEST(TuneCapacity, RecommendsTheSmallestCapacityWithinTheToleranceThatRefusesNoBatch) {
  TableCapacity t;
  t.uses = 1000;
  t.distinct = 500;
  const auto run = [](std::int64_t c, std::int64_t hits, std::int64_t refused_batches) {
    CapacityRun r;
    r.capacity = c;
    r.hits = hits;
    r.refused_batches = refused_batches;
    return r;
  };
  // 600 hits unbounded (60%); capacity 50 refuses batches although its hits would qualify.
  t.runs = {run(50, 595, 2), run(100, 500, 0), run(200, 589, 0), run(300, 591, 0), run(500, 600, 0)};
  t.unbounded = 4;
  EXPECT_EQ(recommend(t, 0.01), 3);   // 59.1% >= 59%; 58.9% is not
  EXPECT_EQ(recommend(t, 0.012), 2);  // 58.9% >= 58.8%
  EXPECT_EQ(recommend(t, 0.0), 4);    // only the unbounded one
  EXPECT_EQ(recommend(t, 1.0), 1);    // anything that refuses nothing
  t.recommended = 3;                  // refined between 200 and 300
  EXPECT_EQ(refinement(t, 3), (std::vector<std::int64_t>{225, 250, 275}));
  t.recommended = 0;
  EXPECT_TRUE(refinement(t, 3).empty());
  t.unbounded = -1;
  EXPECT_EQ(recommend(t, 0.01), -1);

  EXPECT_EQ(default_capacities(10, 1000, 3), (std::vector<std::int64_t>{10, 100, 1000}));
  EXPECT_EQ(default_capacities(2000, 1000, 4), (std::vector<std::int64_t>{1000}));
  EXPECT_TRUE(default_capacities(0, 0, 4).empty());
}

TEST(TuneCapacity, BadOptionsAreRefusedNamingTheValue) {
  const auto refused = [](CapacityOptions o, const std::string& needle) {
    const Status s = check_capacity_options(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  CapacityOptions o;
  EXPECT_TRUE(check_capacity_options(o).is_ok());
  o.capacities = {0};
  refused(o, "capacity 0 (expected in [1, 2147483646])");
  o.capacities = {kMaxDynamicCapacity + 1};
  refused(o, "capacity 2147483647");
  o = {};
  o.dynamic.admit_after = 0;
  refused(o, "--admit-after 0");
  o.dynamic.admit_after = kMaxAdmitAfter + 1;
  refused(o, "--admit-after 65536");
  o = {};
  o.dynamic.evict_after_steps = -1;
  refused(o, "--evict-after-steps -1");
  o = {};
  o.in_flight = 0;
  refused(o, "--in-flight 0");
}

}  // namespace
}  // namespace strata::tune
