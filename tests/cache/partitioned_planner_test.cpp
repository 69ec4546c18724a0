// PartitionedPlanner: a pool split into S partitions planned in parallel must decide exactly as S separate
// CachePlanners would, each fed the rows that hash to it (a row's partition: the top 32 bits of its
// cache key's hash scaled to [0, S)), with slot numbers offset by the partitions before it; with S = 1
// exactly as one CachePlanner. Checked on random multi-table traffic for every policy: the lookahead
// window (pushes and drops), capacity errors (the lowest refusing partition's, no state change), pins
// across batches in flight retired out of order, per-table caps, flushes and invalidations. Both
// the pool and the model (as a planner of its own) are driven by the store's driving loop,
// cache::BasicPrefetcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cache/partitioned_planner.hpp"
#include "cache/prefetcher.hpp"
#include "core/row_math.hpp"
#include "tests/cache/planner_options.hpp"

namespace strata::cache {
namespace {

CachePlannerOptions options(std::int64_t slots, Policy p, std::vector<PoolTable> tables) {
  CachePlannerOptions o = testing::pool_options(slots, p, std::move(tables));
  o.window = 8;
  return o;
}

// The model: S independent pools, with the partition rule and the split of slots and caps spelled out.
struct Model {
  Model(const CachePlannerOptions& o, int S) : partitions(S) {
    std::int64_t off = 0;
    for (int s = 0; s < S; ++s) {
      CachePlannerOptions so = o;
      so.slots = o.slots / S + (s < o.slots % S ? 1 : 0);
      for (PoolTable& t : so.tables)
        if (t.cap > 0) t.cap = t.cap / S + (s < t.cap % S ? 1 : 0);
      if (S > 1) so.name = o.name + " partition " + std::to_string(s) + " of " + std::to_string(S);
      offset.push_back(off);
      off += so.slots;
      pools.push_back(std::make_unique<CachePlanner>(so));
    }
  }
  int partition(int table, Key row) const {
    const std::uint64_t h = mix64(CachePlanner::cache_key(table, row));
    return static_cast<int>(((h >> 32) * static_cast<std::uint64_t>(partitions)) >> 32);
  }
  // The rows of each feature in partition s, in their order.
  std::vector<UniqueKeys> part(const std::vector<FeatureKeys>& fk, int s) const {
    std::vector<UniqueKeys> out(fk.size());
    for (std::size_t i = 0; i < fk.size(); ++i)
      for (Key k : fk[i].unique->keys)
        if (partition(fk[i].table, k) == s) out[i].keys.push_back(k);
    return out;
  }
  static std::vector<FeatureKeys> features(const std::vector<FeatureKeys>& fk, const std::vector<UniqueKeys>& keys) {
    std::vector<FeatureKeys> out;
    for (std::size_t i = 0; i < fk.size(); ++i) out.push_back({fk[i].table, &keys[i]});
    return out;
  }
  int partitions;
  std::vector<std::int64_t> offset;
  std::vector<std::unique_ptr<CachePlanner>> pools;
};

std::string str(const Transfer& t) {
  return "(" + std::to_string(t.slot) + " " + std::to_string(t.table) + " " + std::to_string(t.row) + ")";
}
std::vector<std::string> strs(const std::vector<Transfer>& v) {
  std::vector<std::string> out;
  for (const Transfer& t : v) out.push_back(str(t));
  return out;
}

// The model as a planner, so that the prefetcher drives it as it drives the PartitionedPlanner: the first
// partition to refuse a batch gives the error, plans are the partitions' plans with global slots (the
// lists partition by partition, each feature's slots back in its order).
struct ModelPlan : PoolPlan {
  std::vector<PoolPlan> partitions;
};
struct ModelProbe {
  std::int64_t seq = 0;
  std::vector<FeatureKeys> features;
  std::vector<std::vector<UniqueKeys>> parts;  // per partition: the features' rows in it
  std::vector<PoolProbe> probes;               // per partition
};
class ModelPlanner {
 public:
  ModelPlanner(const CachePlannerOptions& o, int S) : opt_(o), model_(o, S) {}
  const CachePlannerOptions& options() const { return opt_; }
  const Model& model() const { return model_; }
  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& fk) {
    for (int s = 0; s < model_.partitions; ++s) {
      const auto part = model_.part(fk, s);
      model_.pools[static_cast<std::size_t>(s)]->window_push(seq, Model::features(fk, part));
    }
  }
  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& fk) {
    for (int s = 0; s < model_.partitions; ++s) {
      const auto part = model_.part(fk, s);
      model_.pools[static_cast<std::size_t>(s)]->window_drop(seq, Model::features(fk, part));
    }
  }
  Result<ModelProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& fk) const {
    ModelProbe p;
    p.seq = seq;
    p.features = fk;
    for (int s = 0; s < model_.partitions; ++s) {
      p.parts.push_back(model_.part(fk, s));
      auto mp = model_.pools[static_cast<std::size_t>(s)]->probe(seq, Model::features(fk, p.parts.back()));
      if (!mp.is_ok()) return mp.status();
      p.probes.push_back(std::move(mp).value());
    }
    return p;
  }
  ModelPlan commit(ModelProbe p) {
    ModelPlan plan;
    plan.seq = p.seq;
    const auto& fk = p.features;
    plan.unique_slots.resize(fk.size());
    for (std::size_t i = 0; i < fk.size(); ++i) plan.unique_slots[i].assign(fk[i].unique->keys.size(), -1);
    for (int s = 0; s < model_.partitions; ++s) {
      PoolPlan mp = model_.pools[static_cast<std::size_t>(s)]->commit(std::move(p.probes[static_cast<std::size_t>(s)]));
      const Key off = model_.offset[static_cast<std::size_t>(s)];
      for (Transfer t : mp.fills) plan.fills.push_back({t.slot + off, t.table, t.row});
      for (Transfer t : mp.writebacks) plan.writebacks.push_back({t.slot + off, t.table, t.row});
      plan.hits += mp.hits;
      plan.misses += mp.misses;
      // Back to each feature's order.
      for (std::size_t i = 0; i < fk.size(); ++i) {
        std::size_t j = 0;
        for (std::size_t u = 0; u < fk[i].unique->keys.size(); ++u)
          if (model_.partition(fk[i].table, fk[i].unique->keys[u]) == s)
            plan.unique_slots[i][u] = mp.unique_slots[i][j++] + off;
      }
      plan.partitions.push_back(std::move(mp));
    }
    return plan;
  }
  void retire(const ModelPlan& plan, bool updated) {
    for (int s = 0; s < model_.partitions; ++s)
      model_.pools[static_cast<std::size_t>(s)]->retire(plan.partitions[static_cast<std::size_t>(s)], updated);
  }
  std::vector<Transfer> dirty() const {
    std::vector<Transfer> out;
    for (int s = 0; s < model_.partitions; ++s)
      for (Transfer t : model_.pools[static_cast<std::size_t>(s)]->dirty())
        out.push_back({t.slot + model_.offset[static_cast<std::size_t>(s)], t.table, t.row});
    return out;
  }
  void mark_clean(const std::vector<Transfer>& rows) {
    std::vector<std::vector<Transfer>> local(static_cast<std::size_t>(model_.partitions));
    for (const Transfer& t : rows) {
      std::size_t s = 0;
      while (s + 1 < local.size() && model_.offset[s + 1] <= t.slot) ++s;
      local[s].push_back({t.slot - model_.offset[s], t.table, t.row});
    }
    for (int s = 0; s < model_.partitions; ++s)
      model_.pools[static_cast<std::size_t>(s)]->mark_clean(local[static_cast<std::size_t>(s)]);
  }
  void invalidate_table(int table) {
    for (auto& m : model_.pools) m->invalidate_table(table);
  }
  void drop_rows(int table, const std::vector<Key>& rows) {
    for (int s = 0; s < model_.partitions; ++s) {
      std::vector<Key> mine;
      for (const Key r : rows)
        if (model_.partition(table, r) == s) mine.push_back(r);
      model_.pools[static_cast<std::size_t>(s)]->drop_rows(table, mine);
    }
  }
  CacheStats table_stats(int t) const {
    CacheStats want;
    for (const auto& m : model_.pools) want += m->table_stats(t);
    return want;
  }

 private:
  CachePlannerOptions opt_;
  Model model_;
};

// Records the rows a prefetcher's flush writes back (no device).
template <class Prefetcher>
struct FlushRecorder final : Prefetcher::Executor {
  Status prepare(typename Prefetcher::Batch&) override { return Status::ok(); }
  void issue(typename Prefetcher::Batch&) override {}
  std::size_t flush_rows(int) override { return 16; }
  Status write_back(int, const std::vector<Transfer>& rows) override {
    written.insert(written.end(), rows.begin(), rows.end());
    return Status::ok();
  }
  std::vector<Transfer> written;
};

class PartitionedPlannerMatchesPartitions : public ::testing::TestWithParam<std::tuple<Policy, int>> {};

// The PartitionedPlanner and the model, each under a prefetcher (the store's driving loop) with a window
// of 3 batches, get the same calls; their plans, errors and state must agree after each.
TEST_P(PartitionedPlannerMatchesPartitions, OnRandomTraffic) {
  const auto [policy, S] = GetParam();
  std::mt19937_64 rng(static_cast<std::uint64_t>(S) * 101 + static_cast<std::uint64_t>(policy));
  const std::vector<PoolTable> tables = {{"a", 0}, {"b", 0}, {"capped", 24}};
  const CachePlannerOptions o = options(96, policy, tables);
  ASSERT_TRUE(PartitionedPlanner::validate(o, S).is_ok());
  using ModelPrefetcher = BasicPrefetcher<ModelPlanner>;
  Prefetcher real(3, 3);
  ModelPrefetcher model(3, 3);
  real.add_pool(std::make_unique<PartitionedPlanner>(o, S), {0, 1, 2});
  model.add_pool(std::make_unique<ModelPlanner>(o, S), {0, 1, 2});
  FlushRecorder<Prefetcher> real_flush;
  FlushRecorder<ModelPrefetcher> model_flush;
  real.set_executor(&real_flush);
  model.set_executor(&model_flush);
  const PartitionedPlanner& pool = real.planner(0);
  const Model& m = model.planner(0).model();
  ASSERT_EQ(pool.partitions(), S);

  struct Batch {
    std::vector<UniqueKeys> keys;  // per table
    Prefetcher::Batch real;
    ModelPrefetcher::Batch model;
  };
  std::vector<std::unique_ptr<Batch>> pending, in_flight;  // oldest first
  std::int64_t id = 0;
  int refused = 0, planned = 0;
  for (int step = 0; step < 1500; ++step) {
    // Keep a window of up to 3 batches ahead (lookahead uses it; the others ignore it).
    while (pending.size() < 3) {
      auto b = std::make_unique<Batch>();
      b->keys.resize(3);
      for (int t = 0; t < 3; ++t) {
        std::vector<Key> keys;
        const int n = static_cast<int>(rng() % (rng() % 8 == 0 ? 40 : 10));  // sometimes too many for a partition
        for (int i = 0; i < n; ++i) keys.push_back(static_cast<Key>(rng() % (t == 0 ? 40 : 300)));
        b->keys[static_cast<std::size_t>(t)] = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
      }
      b->real.id = b->model.id = id++;
      for (int t = 0; t < 3; ++t) b->real.keys.push_back({t, &b->keys[static_cast<std::size_t>(t)]});
      b->model.keys = b->real.keys;
      ASSERT_TRUE(real.submit(b->real).is_ok());
      ASSERT_TRUE(model.submit(b->model).is_ok());
      ASSERT_FALSE(b->real.planned);  // no more than 3 pending: planned by forward below
      pending.push_back(std::move(b));
    }
    const int action = static_cast<int>(rng() % 10);
    if (action < 6 && in_flight.size() < 3) {
      // The oldest batch's forward: planned, or refused by a partition.
      Batch& b = *pending.front();
      const Status got = real.plan(b.real);
      const Status want = model.plan(b.model);
      ASSERT_EQ(got.is_ok(), want.is_ok()) << "step " << step << ": " << got.to_string() << " vs " << want.to_string();
      if (!got.is_ok()) {
        EXPECT_EQ(got.to_string(), want.to_string());
        if (S > 1) {
          EXPECT_NE(got.message().find("partition"), std::string::npos) << got.to_string();
        }
        ++refused;
        // Refused: given up (as the store does when it discards a batch), out of every window.
        real.discard(b.real);
        model.discard(b.model);
        pending.erase(pending.begin());
        continue;
      }
      const PartitionedPlan& p = b.real.parts[0].plan;
      const ModelPlan& mp = b.model.parts[0].plan;
      ASSERT_EQ(p.unique_slots, mp.unique_slots) << "step " << step;
      ASSERT_EQ(strs(p.fills), strs(mp.fills)) << "step " << step;
      ASSERT_EQ(strs(p.writebacks), strs(mp.writebacks)) << "step " << step;
      ASSERT_EQ(p.hits, mp.hits);
      ASSERT_EQ(p.misses, static_cast<std::int64_t>(mp.fills.size()));
      ASSERT_EQ(p.misses, mp.misses);
      in_flight.push_back(std::move(pending.front()));
      pending.erase(pending.begin());
      ++planned;
    } else if (action < 8 && !in_flight.empty()) {
      // Retire a batch in flight, not always the oldest; updated (dirty) or discarded.
      const std::size_t k = rng() % in_flight.size();
      const bool updated = rng() % 4 != 0;
      real.retire(in_flight[k]->real, updated);
      model.retire(in_flight[k]->model, updated);
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (action == 8) {
      ASSERT_TRUE(real.flush().is_ok());
      ASSERT_TRUE(model.flush().is_ok());
      ASSERT_EQ(strs(real_flush.written), strs(model_flush.written)) << "step " << step;
      real_flush.written.clear();
      model_flush.written.clear();
      ASSERT_TRUE(pool.dirty().empty());
      if (in_flight.empty() && rng() % 3 == 0) {
        const int table = static_cast<int>(rng() % 3);
        real.invalidate_table(table);
        model.invalidate_table(table);
      }
    } else if (action == 9 && in_flight.empty()) {
      // Rows dropped unwritten, dirty ones too (a dynamic table's rows given to new keys).
      const int table = static_cast<int>(rng() % 3);
      std::vector<Key> rows;
      for (int i = 0; i < 6; ++i) rows.push_back(static_cast<Key>(rng() % (table == 0 ? 40 : 300)));
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      real.drop_rows(table, rows);
      model.drop_rows(table, rows);
    } else if (policy == Policy::kLookahead && !pending.empty()) {
      // A batch leaves the window without being planned (discarded before its forward).
      real.discard(pending.back()->real);
      model.discard(pending.back()->model);
      pending.pop_back();
    }
    // The counts and the index agree after every operation.
    std::int64_t resident = 0, pinned = 0;
    for (const auto& partition : m.pools) {
      resident += partition->resident();
      pinned += partition->pinned();
    }
    ASSERT_EQ(pool.resident(), resident);
    ASSERT_EQ(pool.pinned(), pinned);
    for (int t = 0; t < 3; ++t) {
      const CacheStats want = model.table_stats(t);
      const CacheStats got = real.table_stats(t);
      ASSERT_EQ(got.hits, want.hits);
      ASSERT_EQ(got.misses, want.misses);
      ASSERT_EQ(got.evictions, want.evictions);
      ASSERT_EQ(got.writebacks, want.writebacks);
      ASSERT_EQ(got.deferred, want.deferred);
      for (Key row = 0; row < 40; ++row) {
        const int s = m.partition(t, row);
        const std::int64_t local = m.pools[static_cast<std::size_t>(s)]->slot_of(t, row);
        ASSERT_EQ(pool.slot_of(t, row), local < 0 ? -1 : local + m.offset[static_cast<std::size_t>(s)]);
      }
    }
  }
  // The traffic exercised what it should: batches planned, and some refused by a partition.
  EXPECT_GT(planned, 300);
  EXPECT_GT(refused, 0);
  EXPECT_LE(pool.pool_stats().hits, pool.pool_stats().accesses);
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndPartitions, PartitionedPlannerMatchesPartitions,
                         ::testing::Combine(::testing::Values(Policy::kLru, Policy::kLfu, Policy::kLookahead),
                                            ::testing::Values(1, 2, 3, 5)),
                         [](const ::testing::TestParamInfo<std::tuple<Policy, int>>& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_" +
                                  std::to_string(std::get<1>(i.param)) + "_partitions";
                         });

TEST(PartitionedPlanner, SlotsAreGlobalAndDistinct) {
  // Every partition's slots are its own range: a batch's rows land in distinct slots below the pool's.
  const CachePlannerOptions o = options(1000, Policy::kLru, {{"t", 0}});
  PartitionedPlanner pool(o, 7);
  std::vector<Key> keys;
  for (Key k = 0; k < 600; ++k) keys.push_back(k * 7919 % 100003);
  const UniqueKeys u = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
  auto probe = pool.probe(0, {{0, &u}});
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  EXPECT_EQ(probe.value().misses, 600);
  const PartitionedPlan plan = pool.commit(std::move(probe).value());
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
  // Marked clean by parts, partition by partition or not: every row's flag goes, and each counts once.
  std::vector<Transfer> rows = pool.dirty();
  std::reverse(rows.begin(), rows.end());
  pool.mark_clean(std::vector<Transfer>(rows.begin(), rows.begin() + 250));
  EXPECT_EQ(pool.dirty().size(), 350u);
  pool.mark_clean(std::vector<Transfer>(rows.begin() + 250, rows.end()));
  EXPECT_TRUE(pool.dirty().empty());
  EXPECT_EQ(pool.pool_stats().writebacks, 600);
}

TEST(PartitionedPlanner, OverflowSlotsAreGlobalAndInterleavedAfterThePools) {
  // 600 rows in a pool of 100 slots in 3 partitions: 100 cached, 500 in overflow slots numbered
  // from 100 on (partition s's i-th is 100 + 3 i + s), all distinct, within the probe's count.
  const CachePlannerOptions o = options(100, Policy::kLru, {{"t", 0}});
  PartitionedPlanner pool(o, 3);
  std::vector<Key> keys;
  for (Key k = 0; k < 600; ++k) keys.push_back(k * 7919 % 100003);
  const UniqueKeys u = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
  ASSERT_FALSE(pool.probe(0, {{0, &u}}).is_ok());
  EXPECT_EQ(pool.rows_beyond({{0, &u}}), 500);
  auto probe = pool.probe(0, {{0, &u}}, true);
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  EXPECT_TRUE(probe.value().overflow);
  const std::int64_t records = probe.value().overflow_records;
  const PartitionedPlan plan = pool.commit(std::move(probe).value());
  const std::set<Key> slots(plan.unique_slots[0].begin(), plan.unique_slots[0].end());
  EXPECT_EQ(slots.size(), 600u);
  EXPECT_LT(*slots.rbegin(), 100 + records);
  std::set<Key> overflow;
  for (const Transfer& t : plan.overflow) overflow.insert(t.slot);
  EXPECT_EQ(overflow.size(), 500u);
  EXPECT_GE(*overflow.begin(), 100);
  for (std::size_t i = 0; i < u.keys.size(); ++i) {
    const Key s = plan.unique_slots[0][i];
    EXPECT_EQ(s >= 100, overflow.count(s) == 1);
    EXPECT_EQ(pool.slot_of(0, u.keys[i]), s >= 100 ? -1 : s);
  }
  EXPECT_EQ(plan.fills.size(), 600u);
  EXPECT_EQ(pool.resident(), 100);
  EXPECT_EQ(pool.overflow_rows(), 500);
  EXPECT_EQ(pool.pool_stats().bypassed, 500);
  pool.retire(plan, true);
  EXPECT_EQ(pool.overflow_rows(), 0);
  EXPECT_EQ(pool.pinned(), 0);
  EXPECT_EQ(pool.dirty().size(), 100u);
  EXPECT_EQ(pool.pool_stats().writebacks, 500);
}

TEST(PartitionedPlanner, ValidateNamesThePoolTheTableAndTheNumbers) {
  const Status zero = PartitionedPlanner::validate(options(10, Policy::kLru, {{"t", 0}}), 0);
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("planner partitions 0 must be >= 1"), std::string::npos) << zero.to_string();
  const Status small = PartitionedPlanner::validate(options(3, Policy::kLru, {{"t", 0}}), 4);
  EXPECT_NE(small.message().find("(test): 3 rows cannot be split into 4 planner partitions"), std::string::npos)
      << small.to_string();
  const Status cap = PartitionedPlanner::validate(options(100, Policy::kLru, {{"t", 0}, {"users", 3}}), 4);
  EXPECT_NE(cap.message().find("table 'users': a cache cap of 3 rows cannot be split into 4"), std::string::npos)
      << cap.to_string();
  EXPECT_TRUE(PartitionedPlanner::validate(options(100, Policy::kLru, {{"t", 0}, {"users", 4}}), 4).is_ok());
  // A partition holds at most 2^30 slots (32-bit slot numbers inside): checked before any allocation.
  const Status big = PartitionedPlanner::validate(options(std::int64_t{3} << 30, Policy::kLru, {{"t", 0}}), 2);
  EXPECT_NE(big.message().find("use at least 3 planner partitions"), std::string::npos) << big.to_string();
  EXPECT_TRUE(PartitionedPlanner::validate(options(std::int64_t{3} << 30, Policy::kLru, {{"t", 0}}), 3).is_ok());
}

}  // namespace
}  // namespace strata::cache
