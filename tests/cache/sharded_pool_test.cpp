// ShardedPool: a pool split into S shards planned in parallel must decide exactly as S separate
// CachePools would, each fed the rows that hash to it (a row's shard: the top 32 bits of its
// cache key's hash scaled to [0, S)), with slot numbers offset by the shards before it; with S = 1
// exactly as one CachePool. Checked on random multi-table traffic for every policy: the lookahead
// window (pushes and drops), capacity errors (the lowest refusing shard's, no state change), pins
// across batches in flight retired out of order, per-table caps, flushes and invalidations.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cache/sharded_pool.hpp"
#include "core/row_math.hpp"
#include "tests/cache/pool_options.hpp"

namespace strata::cache {
namespace {

CachePoolOptions options(std::int64_t slots, Policy p, std::vector<PoolTable> tables) {
  CachePoolOptions o = testing::pool_options(slots, p, std::move(tables));
  o.window = 8;
  return o;
}

// The model: S independent pools, with the shard rule and the split of slots and caps spelled out.
struct Model {
  Model(const CachePoolOptions& o, int S) : shards(S) {
    std::int64_t off = 0;
    for (int s = 0; s < S; ++s) {
      CachePoolOptions so = o;
      so.slots = o.slots / S + (s < o.slots % S ? 1 : 0);
      for (PoolTable& t : so.tables)
        if (t.cap > 0) t.cap = t.cap / S + (s < t.cap % S ? 1 : 0);
      if (S > 1) so.name = o.name + " shard " + std::to_string(s) + " of " + std::to_string(S);
      offset.push_back(off);
      off += so.slots;
      pools.push_back(std::make_unique<CachePool>(so));
    }
  }
  int shard(int table, Key row) const {
    const std::uint64_t h = mix64(CachePool::cache_key(table, row));
    return static_cast<int>(((h >> 32) * static_cast<std::uint64_t>(shards)) >> 32);
  }
  // The rows of each feature in shard s, in their order.
  std::vector<UniqueKeys> part(const std::vector<FeatureKeys>& fk, int s) const {
    std::vector<UniqueKeys> out(fk.size());
    for (std::size_t i = 0; i < fk.size(); ++i)
      for (Key k : fk[i].unique->keys)
        if (shard(fk[i].table, k) == s) out[i].keys.push_back(k);
    return out;
  }
  static std::vector<FeatureKeys> features(const std::vector<FeatureKeys>& fk, const std::vector<UniqueKeys>& keys) {
    std::vector<FeatureKeys> out;
    for (std::size_t i = 0; i < fk.size(); ++i) out.push_back({fk[i].table, &keys[i]});
    return out;
  }
  int shards;
  std::vector<std::int64_t> offset;
  std::vector<std::unique_ptr<CachePool>> pools;
};

std::string str(const Transfer& t) {
  return "(" + std::to_string(t.slot) + " " + std::to_string(t.table) + " " + std::to_string(t.row) + ")";
}
std::vector<std::string> strs(const std::vector<Transfer>& v) {
  std::vector<std::string> out;
  for (const Transfer& t : v) out.push_back(str(t));
  return out;
}

class ShardedPoolMatchesShards : public ::testing::TestWithParam<std::tuple<Policy, int>> {};

TEST_P(ShardedPoolMatchesShards, OnRandomTraffic) {
  const auto [policy, S] = GetParam();
  std::mt19937_64 rng(static_cast<std::uint64_t>(S) * 101 + static_cast<std::uint64_t>(policy));
  const std::vector<PoolTable> tables = {{"a", 0}, {"b", 0}, {"capped", 24}};
  const CachePoolOptions o = options(96, policy, tables);
  ASSERT_TRUE(ShardedPool::validate(o, S).is_ok());
  ShardedPool pool(o, S);
  Model model(o, S);
  ASSERT_EQ(pool.shards(), S);

  struct InFlight {
    ShardedPlan plan;
    std::vector<PoolPlan> model;  // per shard
  };
  std::vector<InFlight> in_flight;
  // Batches pushed into the window and not yet planned or dropped, oldest first.
  struct Pending {
    std::int64_t seq;
    std::vector<UniqueKeys> keys;  // per table
  };
  std::vector<Pending> window;
  std::int64_t seq = 0;
  int refused = 0, planned = 0;
  const auto fk_of = [](const Pending& p) {
    std::vector<FeatureKeys> fk;
    for (std::size_t t = 0; t < p.keys.size(); ++t) fk.push_back({static_cast<int>(t), &p.keys[t]});
    return fk;
  };
  for (int step = 0; step < 1500; ++step) {
    // Keep a window of up to 3 batches ahead (lookahead uses it; the others ignore it).
    while (window.size() < 3) {
      Pending p{seq++, std::vector<UniqueKeys>(3)};
      for (int t = 0; t < 3; ++t) {
        std::vector<Key> keys;
        const int n = static_cast<int>(rng() % (rng() % 8 == 0 ? 40 : 10));  // sometimes too many for a shard
        for (int i = 0; i < n; ++i) keys.push_back(static_cast<Key>(rng() % (t == 0 ? 40 : 300)));
        p.keys[static_cast<std::size_t>(t)] = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
      }
      const auto fk = fk_of(p);
      pool.window_push(p.seq, fk);
      for (int s = 0; s < S; ++s) {
        const auto part = model.part(fk, s);
        model.pools[static_cast<std::size_t>(s)]->window_push(p.seq, Model::features(fk, part));
      }
      window.push_back(std::move(p));
    }
    const int action = static_cast<int>(rng() % 10);
    if (action < 6 && in_flight.size() < 3) {
      // Plan the oldest batch of the window.
      Pending p = std::move(window.front());
      window.erase(window.begin());
      const auto fk = fk_of(p);
      auto probe = pool.probe(p.seq, fk);
      // The model: the first shard to refuse gives the error.
      std::vector<std::vector<UniqueKeys>> parts;
      std::vector<PoolProbe> model_probes;
      Status model_status = Status::ok();
      std::int64_t model_misses = 0;
      for (int s = 0; s < S; ++s) {
        parts.push_back(model.part(fk, s));
        auto mp = model.pools[static_cast<std::size_t>(s)]->probe(p.seq, Model::features(fk, parts.back()));
        if (!mp.is_ok()) {
          if (model_status.is_ok()) model_status = mp.status();
          continue;
        }
        for (const auto& f : mp.value().found)
          for (std::int64_t slot : f) model_misses += slot < 0;
        model_probes.push_back(std::move(mp).value());
      }
      ASSERT_EQ(probe.is_ok(), model_status.is_ok()) << "step " << step;
      if (!probe.is_ok()) {
        EXPECT_EQ(probe.status().to_string(), model_status.to_string());
        if (S > 1) {
          EXPECT_NE(probe.status().message().find("shard"), std::string::npos) << probe.status().to_string();
        }
        ++refused;
        // Refused: drop it from the window everywhere (as the store does when it gives up a batch).
        pool.window_drop(p.seq, fk);
        for (int s = 0; s < S; ++s)
          model.pools[static_cast<std::size_t>(s)]->window_drop(
              p.seq, Model::features(fk, parts[static_cast<std::size_t>(s)]));
        continue;
      }
      EXPECT_EQ(probe.value().misses, model_misses);
      InFlight f;
      f.plan = pool.commit(std::move(probe).value());
      std::vector<Transfer> fills, writebacks;
      std::vector<std::vector<Key>> slots(fk.size());
      for (std::size_t i = 0; i < fk.size(); ++i) slots[i].assign(fk[i].unique->keys.size(), -1);
      std::int64_t hits = 0;
      for (int s = 0; s < S; ++s) {
        PoolPlan mp =
            model.pools[static_cast<std::size_t>(s)]->commit(std::move(model_probes[static_cast<std::size_t>(s)]));
        const Key off = model.offset[static_cast<std::size_t>(s)];
        for (Transfer t : mp.fills) fills.push_back({t.slot + off, t.table, t.row});
        for (Transfer t : mp.writebacks) writebacks.push_back({t.slot + off, t.table, t.row});
        hits += mp.hits;
        // Back to each feature's order.
        for (std::size_t i = 0; i < fk.size(); ++i) {
          std::size_t j = 0;
          for (std::size_t u = 0; u < fk[i].unique->keys.size(); ++u)
            if (model.shard(fk[i].table, fk[i].unique->keys[u]) == s) slots[i][u] = mp.unique_slots[i][j++] + off;
        }
        f.model.push_back(std::move(mp));
      }
      ASSERT_EQ(f.plan.unique_slots, slots) << "step " << step;
      ASSERT_EQ(strs(f.plan.fills), strs(fills)) << "step " << step;
      ASSERT_EQ(strs(f.plan.writebacks), strs(writebacks)) << "step " << step;
      ASSERT_EQ(f.plan.hits, hits);
      ASSERT_EQ(f.plan.misses, static_cast<std::int64_t>(fills.size()));
      in_flight.push_back(std::move(f));
      ++planned;
    } else if (action < 8 && !in_flight.empty()) {
      // Retire a batch in flight, not always the oldest; updated (dirty) or discarded.
      const std::size_t k = rng() % in_flight.size();
      const bool updated = rng() % 4 != 0;
      pool.retire(in_flight[k].plan, updated);
      for (int s = 0; s < S; ++s)
        model.pools[static_cast<std::size_t>(s)]->retire(in_flight[k].model[static_cast<std::size_t>(s)], updated);
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (action == 8) {
      std::vector<Transfer> want;
      for (int s = 0; s < S; ++s)
        for (Transfer t : testing::take_dirty(*model.pools[static_cast<std::size_t>(s)]))
          want.push_back({t.slot + model.offset[static_cast<std::size_t>(s)], t.table, t.row});
      const std::vector<Transfer> dirty = pool.dirty();
      ASSERT_EQ(strs(dirty), strs(want)) << "step " << step;
      pool.mark_clean(dirty);
      ASSERT_TRUE(pool.dirty().empty());
      if (in_flight.empty() && rng() % 3 == 0) {
        const int table = static_cast<int>(rng() % 3);
        pool.invalidate_table(table);
        for (auto& m : model.pools) m->invalidate_table(table);
      }
    } else if (policy == Policy::kLookahead && !window.empty()) {
      // A batch leaves the window without being planned (a preview that will not come).
      Pending p = std::move(window.back());
      window.pop_back();
      const auto fk = fk_of(p);
      pool.window_drop(p.seq, fk);
      for (int s = 0; s < S; ++s) {
        const auto part = model.part(fk, s);
        model.pools[static_cast<std::size_t>(s)]->window_drop(p.seq, Model::features(fk, part));
      }
    }
    // The counts and the index agree after every operation.
    std::int64_t resident = 0, pinned = 0;
    for (const auto& m : model.pools) {
      resident += m->resident();
      pinned += m->pinned();
    }
    ASSERT_EQ(pool.resident(), resident);
    ASSERT_EQ(pool.pinned(), pinned);
    for (int t = 0; t < 3; ++t) {
      CacheStats want;
      for (const auto& m : model.pools) want += m->table_stats(t);
      const CacheStats got = pool.table_stats(t);
      ASSERT_EQ(got.hits, want.hits);
      ASSERT_EQ(got.misses, want.misses);
      ASSERT_EQ(got.evictions, want.evictions);
      ASSERT_EQ(got.writebacks, want.writebacks);
      for (Key row = 0; row < 40; ++row) {
        const int s = model.shard(t, row);
        const std::int64_t local = model.pools[static_cast<std::size_t>(s)]->slot_of(t, row);
        ASSERT_EQ(pool.slot_of(t, row), local < 0 ? -1 : local + model.offset[static_cast<std::size_t>(s)]);
      }
    }
  }
  // The traffic exercised what it should: batches planned, and some refused by a shard.
  EXPECT_GT(planned, 300);
  EXPECT_GT(refused, 0);
  EXPECT_LE(pool.pool_stats().hits, pool.pool_stats().accesses);
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndShards, ShardedPoolMatchesShards,
                         ::testing::Combine(::testing::Values(Policy::kLru, Policy::kLfu, Policy::kLookahead),
                                            ::testing::Values(1, 2, 3, 5)),
                         [](const ::testing::TestParamInfo<std::tuple<Policy, int>>& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_" +
                                  std::to_string(std::get<1>(i.param)) + "_shards";
                         });

TEST(ShardedPool, SlotsAreGlobalAndDistinct) {
  // Every shard's slots are its own range: a batch's rows land in distinct slots below the pool's.
  const CachePoolOptions o = options(1000, Policy::kLru, {{"t", 0}});
  ShardedPool pool(o, 7);
  std::vector<Key> keys;
  for (Key k = 0; k < 600; ++k) keys.push_back(k * 7919 % 100003);
  const UniqueKeys u = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
  auto probe = pool.probe(0, {{0, &u}});
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  EXPECT_EQ(probe.value().misses, 600);
  const ShardedPlan plan = pool.commit(std::move(probe).value());
  const std::set<Key> slots(plan.unique_slots[0].begin(), plan.unique_slots[0].end());
  EXPECT_EQ(slots.size(), 600u);
  EXPECT_GE(*slots.begin(), 0);
  EXPECT_LT(*slots.rbegin(), 1000);
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(pool.slot_of(0, u.keys[i]), plan.unique_slots[0][i]);
  EXPECT_EQ(pool.resident(), 600);
  EXPECT_EQ(pool.pinned(), 600);
  pool.retire(plan, true);
  EXPECT_EQ(pool.pinned(), 0);
  EXPECT_EQ(pool.dirty().size(), 600u);
  // Marked clean by parts, shard by shard or not: every row's flag goes, and each counts once.
  std::vector<Transfer> rows = pool.dirty();
  std::reverse(rows.begin(), rows.end());
  pool.mark_clean(std::vector<Transfer>(rows.begin(), rows.begin() + 250));
  EXPECT_EQ(pool.dirty().size(), 350u);
  pool.mark_clean(std::vector<Transfer>(rows.begin() + 250, rows.end()));
  EXPECT_TRUE(pool.dirty().empty());
  EXPECT_EQ(pool.pool_stats().writebacks, 600);
}

TEST(ShardedPool, ValidateNamesThePoolTheTableAndTheNumbers) {
  const Status zero = ShardedPool::validate(options(10, Policy::kLru, {{"t", 0}}), 0);
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("planner shards 0 must be >= 1"), std::string::npos) << zero.to_string();
  const Status small = ShardedPool::validate(options(3, Policy::kLru, {{"t", 0}}), 4);
  EXPECT_NE(small.message().find("(test): 3 rows cannot be split into 4 planner shards"), std::string::npos)
      << small.to_string();
  const Status cap = ShardedPool::validate(options(100, Policy::kLru, {{"t", 0}, {"users", 3}}), 4);
  EXPECT_NE(cap.message().find("table 'users': a cache cap of 3 rows cannot be split into 4"), std::string::npos)
      << cap.to_string();
  EXPECT_TRUE(ShardedPool::validate(options(100, Policy::kLru, {{"t", 0}, {"users", 4}}), 4).is_ok());
  // A shard holds at most 2^30 slots (32-bit slot numbers inside): checked before any allocation.
  const Status big = ShardedPool::validate(options(std::int64_t{3} << 30, Policy::kLru, {{"t", 0}}), 2);
  EXPECT_NE(big.message().find("use at least 3 planner shards"), std::string::npos) << big.to_string();
  EXPECT_TRUE(ShardedPool::validate(options(std::int64_t{3} << 30, Policy::kLru, {{"t", 0}}), 3).is_ok());
}

}  // namespace
}  // namespace strata::cache
