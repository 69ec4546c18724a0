// CachePlanner: one conformance suite for every policy (pins are never evicted, dirty victims are
// written back, capacity errors change nothing, index consistency under random traffic), plus the
// behaviour that tells the policies apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "cache/cache_planner.hpp"
#include "tests/cache/planner_options.hpp"

namespace strata::cache {
namespace {

CachePlannerOptions options(std::int64_t slots, Policy p, std::vector<PoolTable> tables = {{"a", 0}, {"b", 0}}) {
  return testing::pool_options(slots, p, std::move(tables));
}

UniqueKeys uniq(std::vector<Key> keys) { return dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size())); }

// Plans one single-table batch; asserts success.
PoolPlan plan(CachePlanner& pool, std::int64_t seq, int table, const UniqueKeys& u) {
  auto p = pool.probe(seq, {{table, &u}});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return pool.commit(std::move(p).value());
}

class PolicyConformance : public ::testing::TestWithParam<Policy> {};

TEST_P(PolicyConformance, RandomTrafficKeepsIndexPinsAndDirtyRowsConsistent) {
  std::mt19937_64 rng(5);
  CachePlanner pool(options(64, GetParam()));
  std::set<std::pair<int, Key>> dirty;  // rows updated in a slot and not yet written back
  std::vector<std::pair<PoolPlan, std::vector<UniqueKeys>>> in_flight;
  std::int64_t seq = 0;
  for (int step = 0; step < 3000; ++step) {
    if (in_flight.size() < 3) {
      std::vector<UniqueKeys> us(2);
      for (int t = 0; t < 2; ++t) {
        std::vector<Key> keys;
        for (int i = 0; i < 6; ++i) keys.push_back(static_cast<Key>(rng() % (t == 0 ? 30 : 200)));
        us[static_cast<std::size_t>(t)] = uniq(keys);
      }
      std::vector<FeatureKeys> fk = {{0, &us[0]}, {1, &us[1]}};
      pool.window_push(seq, fk);
      auto probe = pool.probe(seq, fk);
      ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
      PoolPlan p = pool.commit(std::move(probe).value());
      // Victims written back are exactly the dirty rows that left.
      for (const auto& wb : p.writebacks) {
        ASSERT_TRUE(dirty.erase({wb.table, wb.row})) << "wrote back a clean row";
        ASSERT_EQ(pool.slot_of(wb.table, wb.row), -1);
      }
      // Every key of the batch is resident in the slot the plan says, and slots are distinct.
      std::set<Key> used;
      for (int t = 0; t < 2; ++t)
        for (std::size_t u = 0; u < us[static_cast<std::size_t>(t)].keys.size(); ++u) {
          const Key s = p.unique_slots[static_cast<std::size_t>(t)][u];
          ASSERT_EQ(pool.slot_of(t, us[static_cast<std::size_t>(t)].keys[u]), s);
          ASSERT_TRUE(used.insert(s).second);
        }
      // No slot of a batch in flight was taken.
      for (const auto& [q, qus] : in_flight)
        for (std::size_t f = 0; f < q.unique_slots.size(); ++f)
          for (std::size_t u = 0; u < q.unique_slots[f].size(); ++u)
            ASSERT_EQ(pool.slot_of(static_cast<int>(f), qus[f].keys[u]), q.unique_slots[f][u]) << "pinned slot evicted";
      in_flight.push_back({std::move(p), std::move(us)});
      ++seq;
    }
    if (!in_flight.empty() && (in_flight.size() == 3 || rng() % 2)) {
      const bool update = rng() % 4 != 0;
      pool.retire(in_flight.front().first, update);
      if (update)
        for (int t = 0; t < 2; ++t)
          for (Key k : in_flight.front().second[static_cast<std::size_t>(t)].keys) dirty.insert({t, k});
      in_flight.erase(in_flight.begin());
    }
    if (step % 500 == 499) {
      for (const auto& x : testing::take_dirty(pool)) ASSERT_TRUE(dirty.erase({x.table, x.row}));
      ASSERT_TRUE(dirty.empty());
    }
  }
  const CacheStats s = pool.pool_stats();
  EXPECT_EQ(s.accesses, s.hits + s.misses);
  EXPECT_GT(s.evictions, 0);
  EXPECT_GT(s.hits, 0);
  EXPECT_LE(pool.resident(), 64);
}

TEST_P(PolicyConformance, BatchLargerThanCacheIsRefusedWithoutChange) {
  CachePlanner pool(options(4, GetParam()));
  UniqueKeys u = uniq({1, 2, 3, 4, 5});
  auto p = pool.probe(0, {{0, &u}});
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("5 unique rows"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("'a': 5"), std::string::npos) << p.status().message();
  EXPECT_EQ(pool.resident(), 0);
}

TEST_P(PolicyConformance, MissesBeyondUnpinnedSlotsAreRefused) {
  CachePlanner pool(options(4, GetParam()));
  UniqueKeys a = uniq({1, 2, 3});
  PoolPlan pa = plan(pool, 0, 0, a);  // 3 slots pinned
  UniqueKeys b = uniq({7, 8});
  auto p = pool.probe(1, {{0, &b}});
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("3 pinned by batches in flight"), std::string::npos) << p.status().message();
  pool.retire(pa, false);
  EXPECT_TRUE(pool.probe(1, {{0, &b}}).is_ok());
}

TEST_P(PolicyConformance, PerTableCapIsRespected) {
  CachePlanner pool(options(8, GetParam(), {{"a", 2}, {"b", 0}}));
  for (int i = 0; i < 10; ++i) {
    UniqueKeys u = uniq({static_cast<Key>(i), static_cast<Key>(i + 100)});
    PoolPlan p = plan(pool, i, 0, u);
    pool.retire(p, true);
    std::int64_t resident_a = 0;
    for (Key k = 0; k < 200; ++k) resident_a += pool.slot_of(0, k) >= 0;
    EXPECT_LE(resident_a, 2);
  }
  UniqueKeys big = uniq({1, 2, 3});
  auto p = pool.probe(99, {{0, &big}});
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("cap is 2"), std::string::npos) << p.status().message();
}

TEST_P(PolicyConformance, InvalidateDropsOnlyThatTable) {
  CachePlanner pool(options(8, GetParam()));
  UniqueKeys a = uniq({1, 2}), b = uniq({3});
  auto pr = pool.probe(0, {{0, &a}, {1, &b}});
  ASSERT_TRUE(pr.is_ok());
  PoolPlan p = pool.commit(std::move(pr).value());
  pool.retire(p, false);
  pool.invalidate_table(0);
  EXPECT_EQ(pool.slot_of(0, 1), -1);
  EXPECT_GE(pool.slot_of(1, 3), 0);
  EXPECT_EQ(pool.resident(), 1);
}

// drop_rows forgets rows, dirty or not, without a write-back; the table's cap counts them out.
TEST_P(PolicyConformance, DropRowsForgetsThemUnwritten) {
  CachePlanner pool(options(8, GetParam(), {{"a", 3}, {"b", 0}}));
  UniqueKeys a = uniq({1, 2, 3}), b = uniq({4});
  auto pr = pool.probe(0, {{0, &a}, {1, &b}});
  ASSERT_TRUE(pr.is_ok());
  pool.retire(pool.commit(std::move(pr).value()), true);  // all dirty; 'a' at its cap
  pool.drop_rows(0, {1, 2, 99});
  EXPECT_EQ(pool.slot_of(0, 1), -1);
  EXPECT_EQ(pool.slot_of(0, 2), -1);
  EXPECT_EQ(pool.resident(), 2);
  std::vector<Key> dirty;
  for (const Transfer& t : pool.dirty()) dirty.push_back(t.table * 100 + t.row);
  std::sort(dirty.begin(), dirty.end());
  EXPECT_EQ(dirty, (std::vector<Key>{3, 104}));
  // Two rows of 'a' fit beside row 3 again: misses, filled into free slots, row 3 kept.
  UniqueKeys again = uniq({1, 2});
  PoolPlan p = plan(pool, 1, 0, again);
  EXPECT_EQ(p.fills.size(), 2u);
  EXPECT_TRUE(p.writebacks.empty());
  EXPECT_GE(pool.slot_of(0, 3), 0);
}

// With bypass a probe never refuses: the misses that fit the free slots (and the table's cap) go to
// cache slots, first come first served, the rest to overflow slots numbered from the pool's slots on.
// A later batch in flight shares an overflow row (a hit); it is never dirty, counted as written back
// when an updating batch retires, and leaves with its last pin, the numbers starting over.
TEST_P(PolicyConformance, BypassPutsTheMissesThatDoNotFitInOverflowSlots) {
  CachePlanner pool(options(4, GetParam(), {{"a", 0}, {"b", 1}}));
  const UniqueKeys a = uniq({1, 2, 3}), b = uniq({10, 11});
  ASSERT_FALSE(pool.probe(0, {{0, &a}, {1, &b}}).is_ok());  // b's cap is 1
  auto pa = pool.probe(0, {{0, &a}, {1, &b}}, true);
  ASSERT_TRUE(pa.is_ok()) << pa.status().to_string();
  EXPECT_EQ(pa.value().overflow_records, 1);
  const PoolPlan plan_a = pool.commit(std::move(pa).value());
  ASSERT_EQ(plan_a.overflow.size(), 1u);
  EXPECT_EQ(plan_a.overflow[0].slot, 4);
  EXPECT_EQ(plan_a.overflow[0].table, 1);
  EXPECT_EQ(plan_a.overflow[0].row, 11);
  EXPECT_EQ(plan_a.unique_slots[1][1], 4);
  EXPECT_EQ(plan_a.fills.size(), 5u);  // the overflow row is filled like the others
  EXPECT_EQ(pool.slot_of(1, 11), -1);  // not in the cache
  EXPECT_EQ(pool.overflow_rows(), 1);
  EXPECT_EQ(pool.resident(), 4);
  // b: row 11 is batch a's overflow row (a hit, the same slot); row 12 does not fit b's cap.
  const UniqueKeys b2 = uniq({11, 12});
  auto pb = pool.probe(1, {{1, &b2}}, true);
  ASSERT_TRUE(pb.is_ok());
  const PoolPlan plan_b = pool.commit(std::move(pb).value());
  EXPECT_EQ(plan_b.unique_slots[0][0], 4);
  EXPECT_EQ(plan_b.unique_slots[0][1], 5);
  EXPECT_EQ(plan_b.hits, 1);
  EXPECT_EQ(plan_b.misses, 1);
  ASSERT_EQ(plan_b.fills.size(), 1u);
  EXPECT_EQ(plan_b.fills[0].slot, 5);
  EXPECT_EQ(plan_b.overflow.size(), 2u);
  CacheStats sb = pool.table_stats(1);
  EXPECT_EQ(sb.bypassed, 3);
  EXPECT_EQ(sb.accesses, 4);
  EXPECT_EQ(sb.hits, 1);
  EXPECT_EQ(sb.misses, 3);
  pool.retire(plan_a, true);
  EXPECT_EQ(pool.overflow_rows(), 2);  // row 11 is still batch b's
  EXPECT_EQ(pool.table_stats(1).writebacks, 1);
  pool.retire(plan_b, false);
  EXPECT_EQ(pool.overflow_rows(), 0);
  EXPECT_EQ(pool.table_stats(1).writebacks, 1);
  for (const Transfer& t : pool.dirty()) EXPECT_LT(t.slot, 4);  // overflow rows are never dirty
  EXPECT_EQ(pool.dirty().size(), 4u);
  // The overflow slots start over: 5 new rows, 4 evict the (dirty) cached ones, 1 is slot 4 again.
  const UniqueKeys c = uniq({20, 21, 22, 23, 24});
  auto pc = pool.probe(2, {{0, &c}}, true);
  ASSERT_TRUE(pc.is_ok());
  const PoolPlan plan_c = pool.commit(std::move(pc).value());
  EXPECT_EQ(plan_c.writebacks.size(), 4u);
  ASSERT_EQ(plan_c.overflow.size(), 1u);
  EXPECT_EQ(plan_c.overflow[0].slot, 4);
  EXPECT_EQ(plan_c.overflow[0].row, 24);
  pool.retire(plan_c, true);
  const CacheStats s = pool.pool_stats();
  EXPECT_EQ(s.accesses, s.hits + s.misses);
  EXPECT_EQ(s.bypassed, 4);
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyConformance, ::testing::Values(Policy::kLru, Policy::kLfu, Policy::kLookahead),
                         [](const ::testing::TestParamInfo<Policy>& i) { return std::string(to_string(i.param)); });

// Cache of 2 holding 1 (used three times) and 2 (used last): inserting 3, LRU evicts 1 and LFU evicts 2.
TEST(Policies, LruEvictsLeastRecentLfuLeastFrequent) {
  for (Policy pol : {Policy::kLru, Policy::kLfu}) {
    CachePlanner pool(options(2, pol));
    auto touch = [&](std::int64_t seq, Key k) {
      UniqueKeys u = uniq({k});
      pool.retire(plan(pool, seq, 0, u), false);
    };
    touch(0, 1);
    touch(1, 1);
    touch(2, 1);
    touch(3, 2);  // cache {1 (freq 3), 2 (recent)}
    touch(4, 3);  // LRU evicts 1; LFU evicts 2
    if (pol == Policy::kLru) {
      EXPECT_EQ(pool.slot_of(0, 1), -1);
      EXPECT_GE(pool.slot_of(0, 2), 0);
    } else {
      EXPECT_GE(pool.slot_of(0, 1), 0);
      EXPECT_EQ(pool.slot_of(0, 2), -1);
    }
  }
}

TEST(Policies, LookaheadEvictsTheRowUsedFarthestAheadAndAdmitsOneOffsLast) {
  CachePlanner pool(options(2, Policy::kLookahead));
  std::vector<UniqueKeys> b = {uniq({1}), uniq({2}), uniq({3}), uniq({1}), uniq({5}), uniq({2})};
  auto fk = [&](std::size_t i) { return std::vector<FeatureKeys>{{0, &b[i]}}; };
  for (std::size_t i = 0; i < b.size(); ++i) pool.window_push(static_cast<std::int64_t>(i), fk(i));
  auto run = [&](std::size_t i) {
    auto p = pool.probe(static_cast<std::int64_t>(i), fk(i));
    ASSERT_TRUE(p.is_ok());
    pool.retire(pool.commit(std::move(p).value()), false);
  };
  run(0);
  run(1);  // cache {1 (next use 3), 2 (next use 5)}
  run(2);  // 3 is never used again in the window: Belady evicts 2 (farthest next use)
  EXPECT_GE(pool.slot_of(0, 1), 0);
  EXPECT_GE(pool.slot_of(0, 3), 0);
  EXPECT_EQ(pool.slot_of(0, 2), -1);
  run(3);  // hit on 1
  EXPECT_EQ(pool.table_stats(0).hits, 1);
  run(4);  // 3 and 1 have no further use; 5 replaces one of them, 5 itself is next out
  run(5);
  EXPECT_GE(pool.slot_of(0, 2), 0);
}

// Regression: recency inside a batch follows the order of first use, for hits and misses alike
// (hits used to be stamped before misses, making a batch's hot rows look older than its new ones).
TEST(Policies, LruRecencyFollowsFirstUseWithinABatch) {
  CachePlanner pool(options(2, Policy::kLru));
  UniqueKeys b0 = uniq({1}), b1 = uniq({2, 1}), b2 = uniq({3});  // in b1, 2 (a miss) is used before 1 (a hit)
  pool.retire(plan(pool, 0, 0, b0), false);
  pool.retire(plan(pool, 1, 0, b1), false);
  pool.retire(plan(pool, 2, 0, b2), false);
  EXPECT_EQ(pool.slot_of(0, 2), -1);  // least recently used
  EXPECT_GE(pool.slot_of(0, 1), 0);
}

// Regression: rows with no use in the lookahead window are ranked as by LFU (uses, then recency),
// not left tied (ties went to the lowest slot).
TEST(Policies, LookaheadRanksRowsOutsideTheWindowByUsesThenRecency) {
  CachePlanner pool(options(2, Policy::kLookahead));
  std::vector<UniqueKeys> b = {uniq({1}), uniq({2}), uniq({2}), uniq({1}), uniq({3})};
  for (std::size_t i = 0; i < b.size(); ++i) {
    const std::vector<FeatureKeys> fk = {{0, &b[i]}};
    pool.window_push(static_cast<std::int64_t>(i), fk);
    auto p = pool.probe(static_cast<std::int64_t>(i), fk);
    ASSERT_TRUE(p.is_ok());
    pool.retire(pool.commit(std::move(p).value()), false);
  }
  // 1 (slot 0) and 2 (slot 1) were both used twice; 1 more recently, so 2 made room for 3.
  EXPECT_GE(pool.slot_of(0, 1), 0);
  EXPECT_EQ(pool.slot_of(0, 2), -1);
}

TEST(Policies, ParseRejectsUnknownNames) {
  EXPECT_EQ(parse_policy("lookahead").value(), Policy::kLookahead);
  auto p = parse_policy("fifo");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("'fifo'"), std::string::npos);
  EXPECT_NE(p.status().message().find("lru, lfu or lookahead"), std::string::npos);
}

}  // namespace
}  // namespace strata::cache
