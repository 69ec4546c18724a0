// Planner equivalence: CachePlanner against RefPlanner, a small reference planner written for clarity
// (std::map, std::set, a linear scan for every victim), each driven by the cached engine's own
// driving loop, cache::BasicPrefetcher, on the same randomized calls: batches pushed into the
// lookahead window at submit, planned (all-or-nothing over several pools) once `lookahead` later
// batches stand behind them or at their forward, deferred when they do not fit beside the rows
// pinned by batches in flight (or when the executor has no staging for them), taken back when the
// executor fails otherwise, retired in any order, discarded before or after planning, flushes (in
// chunks, some failing) and table invalidations in between; with previews, batches pushed into the
// window ahead of their submit, kept or re-keyed (a push below later ones) when submitted, dropped
// when skipped, and batches submitted without a preview planned before previews with lower
// sequence numbers.
// Every decision must match exactly: plan and submit errors, which batches are planned and
// deferred when, hits, misses, the slot of every row, victims and their order (fills and
// write-backs), flushed rows, statistics, and the resident/pinned counts and key->slot index after
// every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cache/cache_planner.hpp"
#include "cache/detail/frequency_sketch.hpp"
#include "cache/detail/key_map.hpp"
#include "cache/prefetcher.hpp"
#include "tests/sanitizers.hpp"

namespace strata::cache {
namespace {

// ---- the reference ---------------------------------------------------------------------------
// Semantics (cache/policy.hpp): the victim of a miss is a free slot when the table is under its cap
// and one is free (the lowest-numbered slot first at the start; freed slots are reused last freed
// first); otherwise the unpinned resident slot (of the table alone when the table is at its cap) of
// lowest rank, ties going to the lower table index and then the lower slot. Ranks:
//   lru:       last use (a per-key tick: batches in commit order, features in order, unique rows
//              in first-use order, hits and misses alike)
//   lfu:       (uses while resident, last use)
//   lookahead: rows with no use in the window (batches pushed and not yet committed or dropped)
//              first, by (last use + level * step, level, last use), the level being the row's
//              frequency level as of its last use (detail::FrequencySketch, fed every planned row
//              of a batch: its hits feature by feature, then its misses; step = half-life / 4);
//              then rows with a use, the farthest next use first, then fewer uses. The next use
//              of a row is the lowest of its pushed uses still in the window.
// (The lookahead rank of rows outside the window changed with the frequency sketch: it was
// (uses while resident, last use). Updated on purpose, with the policy.)
class RefPlanner {
 public:
  explicit RefPlanner(CachePlannerOptions o)
      : opt_(std::move(o)),
        slots_(static_cast<std::size_t>(opt_.slots)),
        count_(opt_.tables.size(), 0),
        pinned_(opt_.tables.size(), 0),
        stats_(opt_.tables.size()),
        half_life_(opt_.half_life > 0 ? opt_.half_life : kDefaultHalfLifeSlots * opt_.slots),
        sketch_(opt_.slots, static_cast<std::uint64_t>(std::max<std::int64_t>(1, half_life_))) {
    for (std::int64_t s = opt_.slots - 1; s >= 0; --s) free_.push_back(s);
  }

  const CachePlannerOptions& options() const { return opt_; }

  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& features) {
    if (opt_.policy != Policy::kLookahead) return;
    for (const auto& f : features)
      for (Key row : f.unique->keys) window_[{f.table, row}].insert(seq);
  }

  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features) {
    if (opt_.policy != Policy::kLookahead) return;
    for (const auto& f : features)
      for (Key row : f.unique->keys) {
        auto it = window_.find({f.table, row});
        if (it == window_.end()) continue;
        it->second.erase(seq);
        if (it->second.empty()) window_.erase(it);
      }
  }

  Result<PoolProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& features) const {
    PoolProbe p;
    p.seq = seq;
    p.features = features;
    const std::size_t T = opt_.tables.size();
    std::vector<std::int64_t> unique(T, 0), misses(T, 0), hits_unpinned(T, 0);
    for (const auto& f : features) {
      const std::size_t t = static_cast<std::size_t>(f.table);
      std::vector<std::int64_t> found;
      for (Key row : f.unique->keys) {
        const std::int64_t s = slot_of(f.table, row);
        found.push_back(s);
        if (s < 0)
          ++misses[t];
        else if (slots_[static_cast<std::size_t>(s)].pins == 0)
          ++hits_unpinned[t];
      }
      unique[t] += f.unique->size();
      p.found.push_back(std::move(found));
    }
    std::int64_t total_unique = 0, total_misses = 0, total_hits_unpinned = 0;
    for (std::size_t t = 0; t < T; ++t) {
      total_unique += unique[t];
      total_misses += misses[t];
      total_hits_unpinned += hits_unpinned[t];
      const std::int64_t cap = opt_.tables[t].cap;
      const std::string who = "table '" + opt_.tables[t].name + "' in slot pool " + opt_.name + ": the batch";
      if (cap <= 0) continue;
      if (unique[t] > cap)
        return Status::resource_exhausted(who + " has " + std::to_string(unique[t]) +
                                          " unique rows but the table's cache cap is " + std::to_string(cap) +
                                          " slots");
      const std::int64_t room = cap - pinned_[t] - hits_unpinned[t];
      if (misses[t] > room)
        return Status::resource_exhausted(who + " needs " + std::to_string(misses[t]) + " new slots but only " +
                                          std::to_string(room) + " of its cap of " + std::to_string(cap) +
                                          " are not pinned by batches in flight");
    }
    const std::string who = "slot pool " + opt_.name + ": the batch";
    if (total_unique > opt_.slots) {
      std::string list;
      for (std::size_t t = 0; t < T; ++t) {
        if (unique[t] == 0) continue;
        if (!list.empty()) list += ", ";
        list += "'" + opt_.tables[t].name + "': " + std::to_string(unique[t]);
      }
      return Status::resource_exhausted(who + " has " + std::to_string(total_unique) + " unique rows (" + list +
                                        ") but the cache holds only " + std::to_string(opt_.slots) + " rows");
    }
    std::int64_t pinned_total = 0;
    for (auto n : pinned_) pinned_total += n;
    const std::int64_t evictable = opt_.slots - pinned_total - total_hits_unpinned;
    if (total_misses > evictable)
      return Status::resource_exhausted(
          who + " needs " + std::to_string(total_misses) + " new slots but only " + std::to_string(evictable) + " of " +
          std::to_string(opt_.slots) + " are free or evictable (" + std::to_string(pinned_total) +
          " pinned by batches in flight); raise the cache capacity or keep fewer batches in flight");
    return p;
  }

  PoolPlan commit(const PoolProbe& probe) {
    PoolPlan plan;
    plan.seq = probe.seq;
    std::vector<std::int64_t> tick_base;
    if (opt_.policy == Policy::kLookahead) sketch_.start(static_cast<std::uint64_t>(tick_));
    for (const auto& f : probe.features) {
      tick_base.push_back(tick_);
      tick_ += f.unique->keys.size();
    }
    for (std::size_t i = 0; i < probe.features.size(); ++i) {
      const FeatureKeys& f = probe.features[i];
      std::vector<Key> us(f.unique->keys.size(), -1);
      CacheStats& st = stats_[static_cast<std::size_t>(f.table)];
      for (std::size_t u = 0; u < us.size(); ++u) {
        ++st.accesses;
        const std::int64_t s = probe.found[i][u];
        if (s < 0) continue;
        RefSlot& r = slots_[static_cast<std::size_t>(s)];
        pin(r);
        ++r.freq;
        r.last = tick_base[i] + static_cast<std::int64_t>(u) + 1;
        us[u] = s;
        ++st.hits;
        ++plan.hits;
        consume(r.table, r.row, probe.seq);
        count(r);
      }
      plan.unique_slots.push_back(std::move(us));
    }
    for (std::size_t i = 0; i < probe.features.size(); ++i) {
      const FeatureKeys& f = probe.features[i];
      auto& us = plan.unique_slots[i];
      CacheStats& st = stats_[static_cast<std::size_t>(f.table)];
      for (std::size_t u = 0; u < us.size(); ++u) {
        if (us[u] >= 0) continue;
        const std::int64_t s = victim(f.table);
        RefSlot& r = slots_[static_cast<std::size_t>(s)];
        if (r.resident) {
          CacheStats& vs = stats_[static_cast<std::size_t>(r.table)];
          ++vs.evictions;
          if (r.dirty) {
            plan.writebacks.push_back({s, r.table, r.row});
            ++vs.writebacks;
            vs.bytes_written_back += opt_.record_bytes;
          }
          index_.erase({r.table, r.row});
          --count_[static_cast<std::size_t>(r.table)];
        }
        const Key row = f.unique->keys[u];
        r = RefSlot();
        r.resident = true;
        r.table = f.table;
        r.row = row;
        r.freq = 1;
        r.last = tick_base[i] + static_cast<std::int64_t>(u) + 1;
        index_[{f.table, row}] = s;
        ++count_[static_cast<std::size_t>(f.table)];
        pin(r);
        us[u] = s;
        plan.fills.push_back({s, f.table, row});
        ++st.misses;
        ++plan.misses;
        st.bytes_filled += opt_.record_bytes;
        consume(f.table, row, probe.seq);
        count(r);
      }
    }
    return plan;
  }

  void retire(const PoolPlan& plan, bool updated) {
    for (const auto& us : plan.unique_slots)
      for (Key s : us) {
        RefSlot& r = slots_[static_cast<std::size_t>(s)];
        if (updated) r.dirty = true;
        if (--r.pins == 0) --pinned_[static_cast<std::size_t>(r.table)];
      }
  }

  std::vector<Transfer> dirty() const {
    std::vector<Transfer> out;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const RefSlot& r = slots_[i];
      if (r.resident && r.dirty) out.push_back({static_cast<Key>(i), r.table, r.row});
    }
    return out;
  }

  void mark_clean(const std::vector<Transfer>& rows) {
    for (const Transfer& t : rows) {
      RefSlot& r = slots_[static_cast<std::size_t>(t.slot)];
      ASSERT_TRUE(r.resident && r.dirty && r.table == t.table && r.row == t.row);
      r.dirty = false;
      ++stats_[static_cast<std::size_t>(r.table)].writebacks;
      stats_[static_cast<std::size_t>(r.table)].bytes_written_back += opt_.record_bytes;
    }
  }

  void invalidate_table(int table) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      RefSlot& r = slots_[i];
      if (!r.resident || r.table != table) continue;
      ASSERT_TRUE(r.pins == 0 && !r.dirty);
      index_.erase({r.table, r.row});
      r = RefSlot();
      free_.push_back(static_cast<std::int64_t>(i));
    }
    count_[static_cast<std::size_t>(table)] = 0;
  }

  std::int64_t slot_of(int table, Key row) const {
    auto it = index_.find({table, row});
    return it == index_.end() ? -1 : it->second;
  }
  std::int64_t resident() const { return static_cast<std::int64_t>(index_.size()); }
  std::int64_t pinned() const {
    std::int64_t n = 0;
    for (const auto& r : slots_) n += r.pins > 0;
    return n;
  }
  const CacheStats& table_stats(int t) const { return stats_[static_cast<std::size_t>(t)]; }

 private:
  struct RefSlot {
    bool resident = false;
    int table = -1;
    Key row = -1;
    std::int64_t pins = 0;
    bool dirty = false;
    std::int64_t freq = 0;
    std::int64_t last = 0;
    std::int64_t level = 0;  // lookahead: frequency level as of the last use
  };
  // (class, primary, secondary, tertiary): lower is evicted first.
  using Rank = std::tuple<int, std::int64_t, std::int64_t, std::int64_t>;

  Rank rank(const RefSlot& r) const {
    switch (opt_.policy) {
      case Policy::kLru:
        return {0, 0, r.last, 0};
      case Policy::kLfu:
        return {0, std::min<std::int64_t>(r.freq, (1 << 23) - 1), r.last, 0};
      case Policy::kLookahead: {
        auto it = window_.find({r.table, r.row});
        if (it == window_.end()) {
          const std::int64_t step = std::max<std::int64_t>(1, std::max<std::int64_t>(1, half_life_) / 4);
          return {0, r.last + r.level * step, r.level, r.last};
        }
        return {1, -*it->second.begin(), std::min<std::int64_t>(r.freq, (1 << 20) - 1), 0};
      }
    }
    return {};
  }

  // lookahead: one planned use of a row in the frequency sketch.
  void count(RefSlot& r) {
    if (opt_.policy != Policy::kLookahead) return;
    const std::uint64_t key = (static_cast<std::uint64_t>(r.table) << 48) | static_cast<std::uint64_t>(r.row);
    r.level = sketch_.add(detail::KeyMap::hash(key));
  }

  std::int64_t victim(int table) {
    const std::size_t t = static_cast<std::size_t>(table);
    const bool capped = opt_.tables[t].cap > 0 && count_[t] >= opt_.tables[t].cap;
    if (!capped && !free_.empty()) {
      const std::int64_t s = free_.back();
      free_.pop_back();
      return s;
    }
    std::int64_t best = -1;
    std::tuple<Rank, int, std::int64_t> best_key;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const RefSlot& r = slots_[s];
      if (!r.resident || r.pins > 0 || (capped && r.table != table)) continue;
      const auto key = std::make_tuple(rank(r), r.table, static_cast<std::int64_t>(s));
      if (best < 0 || key < best_key) {
        best = static_cast<std::int64_t>(s);
        best_key = key;
      }
    }
    EXPECT_GE(best, 0) << "no victim although probe() found room";
    return best;
  }

  void pin(RefSlot& r) {
    if (r.pins++ == 0) ++pinned_[static_cast<std::size_t>(r.table)];
  }

  void consume(int table, Key row, std::int64_t seq) {
    auto it = window_.find({table, row});
    if (it == window_.end()) return;
    it->second.erase(seq);
    if (it->second.empty()) window_.erase(it);
  }

  CachePlannerOptions opt_;
  std::vector<RefSlot> slots_;
  std::vector<std::int64_t> free_;
  std::map<std::pair<int, Key>, std::int64_t> index_;
  std::vector<std::int64_t> count_, pinned_;
  std::vector<CacheStats> stats_;
  std::int64_t tick_ = 0;
  std::map<std::pair<int, Key>, std::set<std::int64_t>> window_;  // uses
  std::int64_t half_life_;
  detail::FrequencySketch sketch_;
};

// ---- comparison helpers -----------------------------------------------------------------------

std::string str(const Transfer& t) {
  return "(slot " + std::to_string(t.slot) + ", table " + std::to_string(t.table) + ", row " + std::to_string(t.row) +
         ")";
}

void expect_same_transfers(const std::vector<Transfer>& got, const std::vector<Transfer>& want,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(got[i].slot == want[i].slot && got[i].table == want[i].table && got[i].row == want[i].row)
        << what << " #" << i << ": got " << str(got[i]) << ", want " << str(want[i]);
}

void expect_same_stats(const CacheStats& a, const CacheStats& b, const std::string& what) {
  EXPECT_EQ(a.accesses, b.accesses) << what;
  EXPECT_EQ(a.hits, b.hits) << what;
  EXPECT_EQ(a.misses, b.misses) << what;
  EXPECT_EQ(a.evictions, b.evictions) << what;
  EXPECT_EQ(a.writebacks, b.writebacks) << what;
  EXPECT_EQ(a.bytes_filled, b.bytes_filled) << what;
  EXPECT_EQ(a.bytes_written_back, b.bytes_written_back) << what;
  EXPECT_EQ(a.deferred, b.deferred) << what;
}

// ---- the workload -----------------------------------------------------------------------------

struct Shape {
  Policy policy = Policy::kLru;
  int lookahead = 0;      // batches kept in the window before the front one is planned
  int max_in_flight = 2;  // planned, not retired
  int previews = 0;       // most batches previewed and not yet submitted (0: no previews)
  int pools = 1;
  int max_tables = 3;
  std::int64_t min_slots = 6, max_slots = 48;
  double cap_chance = 0.4;  // of a table having a per-table cap
  double min_cap = 0.0;     // smallest cap, as a fraction of the pool
  double batch = 1.0 / 3;   // most keys drawn per table and batch, as a fraction of the pool
  double min_rows = 0.5;    // fewest rows of a table, as a multiple of the pool (at most 4 more)
  int steps = 400;
};

using RealPrefetcher = BasicPrefetcher<CachePlanner>;
using RefPrefetcher = BasicPrefetcher<RefPlanner>;

// The executor of a prefetcher in the test: moves nothing, refuses some plans (as the engine's
// does when no staging can be had, or when the device failed) and some flush chunks, and records
// the rows flushed. The two prefetchers' executors draw the same decisions from the same seed, so
// equal calls get equal answers.
template <class Prefetcher>
class TestExecutor final : public Prefetcher::Executor {
 public:
  explicit TestExecutor(std::uint64_t seed) : rng_(seed) {}
  Status prepare(typename Prefetcher::Batch& b) override {
    const std::uint64_t r = rng_() % 100;
    if (r < 3) return Status::resource_exhausted("batch " + std::to_string(b.id) + ": no staging (test)");
    if (r < 5) return Status::unavailable("batch " + std::to_string(b.id) + ": device lost (test)");
    return Status::ok();
  }
  void issue(typename Prefetcher::Batch& b) override { ++issued_[b.id]; }
  std::size_t flush_rows(int pool) override { return static_cast<std::size_t>(3 + pool); }
  Status write_back(int pool, const std::vector<Transfer>& rows) override {
    if (rng_() % 100 < 5) return Status::unavailable("write-back of pool " + std::to_string(pool) + " failed (test)");
    for (const Transfer& t : rows) written_.push_back({pool, t});
    return Status::ok();
  }
  // Rows written back since the last call, with their pool.
  std::vector<std::pair<int, Transfer>> take_written() { return std::exchange(written_, {}); }
  int issued(std::int64_t id) const {
    auto it = issued_.find(id);
    return it == issued_.end() ? 0 : it->second;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::pair<int, Transfer>> written_;
  std::map<std::int64_t, int> issued_;
};

// One batch, as the caller keeps it: per pool its features (each table at most once), and the
// batch as each prefetcher sees it.
struct Batch {
  std::int64_t id = 0;
  std::vector<std::vector<UniqueKeys>> unique;  // [pool][feature]
  std::vector<std::vector<int>> table;          // [pool][feature], pool-local
  RealPrefetcher::Batch real;
  RefPrefetcher::Batch ref;
  bool counted_deferred = false;
  bool counted_pool_refusal = false;
};

class Harness {
 public:
  Harness(const Shape& shape, std::uint64_t seed)
      : shape_(shape), rng_(seed), real_exec_(seed * 31 + 7), ref_exec_(seed * 31 + 7) {
    std::vector<CachePlannerOptions> options;
    for (int p = 0; p < shape_.pools; ++p) {
      CachePlannerOptions o;
      o.slots = shape_.min_slots +
                static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(shape_.max_slots - shape_.min_slots + 1));
      o.policy = shape_.policy;
      o.record_bytes = 8 + 8 * p;
      o.name = "(pool " + std::to_string(p) + ")";
      const int tables = 1 + static_cast<int>(rng_() % static_cast<std::uint64_t>(shape_.max_tables));
      std::vector<std::int64_t> rows;
      for (int t = 0; t < tables; ++t) {
        std::int64_t cap = 0;
        if (chance(shape_.cap_chance)) {
          const auto lo =
              std::max<std::int64_t>(1, static_cast<std::int64_t>(shape_.min_cap * static_cast<double>(o.slots)));
          cap = lo + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(o.slots - lo + 1));
        }
        o.tables.push_back({"p" + std::to_string(p) + "t" + std::to_string(t), cap});
        rows.push_back(static_cast<std::int64_t>(shape_.min_rows * static_cast<double>(o.slots)) +
                       static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(4 * o.slots)));
      }
      rows_.push_back(rows);
      first_table_.push_back(tables_);
      tables_ += tables;
      options.push_back(std::move(o));
    }
    real_ = std::make_unique<RealPrefetcher>(shape_.lookahead, tables_);
    ref_ = std::make_unique<RefPrefetcher>(shape_.lookahead, tables_);
    for (int p = 0; p < shape_.pools; ++p) {
      std::vector<int> ids;
      for (std::size_t t = 0; t < rows_[static_cast<std::size_t>(p)].size(); ++t)
        ids.push_back(first_table_[static_cast<std::size_t>(p)] + static_cast<int>(t));
      real_->add_pool(std::make_unique<CachePlanner>(options[static_cast<std::size_t>(p)]), ids);
      ref_->add_pool(std::make_unique<RefPlanner>(options[static_cast<std::size_t>(p)]), ids);
    }
    real_->set_executor(&real_exec_);
    ref_->set_executor(&ref_exec_);
  }

  void run() {
    for (int step = 0; step < shape_.steps && !::testing::Test::HasFatalFailure(); ++step) {
      const std::uint64_t op = rng_() % 100;
      if (op < 40) {
        if (pending_.size() + in_flight_.size() < static_cast<std::size_t>(shape_.max_in_flight + shape_.lookahead))
          submit();
      } else if (op < 55) {
        if (!pending_.empty()) (void)forward(rng_() % pending_.size());  // may fail: the batches stay pending
      } else if (op < 85) {
        if (!in_flight_.empty()) {
          const std::size_t i = rng_() % in_flight_.size();
          retire(i, rng_() % 4 != 0);
        }
      } else if (op < 90) {
        if (!pending_.empty()) drop(rng_() % pending_.size());
      } else if (op < 97) {
        (void)flush();
      } else {
        invalidate();
      }
      check_state("step " + std::to_string(step));
    }
    // Drain: drop the previews, plan and retire everything, flush.
    while (!previews_.empty()) skip_preview();
    while (!pending_.empty() && !::testing::Test::HasFatalFailure()) {
      if (!forward(0)) {
        if (in_flight_.empty())
          drop(0);
        else
          retire(0, true);
      }
    }
    while (!in_flight_.empty() && !::testing::Test::HasFatalFailure()) retire(0, true);
    for (int i = 0; i < 100 && !flush(); ++i) {
    }
    check_state("end");
  }

  std::int64_t planned() const { return planned_; }
  std::int64_t refused() const { return refused_; }
  /// Batches deferred because a pool could not fit them (the executor's refusals not counted).
  std::int64_t pool_refused() const { return pool_refused_; }
  std::int64_t evictions() const {
    std::int64_t n = 0;
    for (int p = 0; p < real_->pools(); ++p) n += real_->planner(p).pool_stats().evictions;
    return n;
  }

 private:
  bool chance(double p) { return static_cast<double>(rng_() % 1000000) < p * 1e6; }

  // Skewed rows: the minimum of two or three uniform draws.
  Key draw(std::int64_t rows) {
    const auto r = [&] { return static_cast<Key>(rng_() % static_cast<std::uint64_t>(rows)); };
    Key k = std::min(r(), r());
    if (rng_() % 2) k = std::min(k, r());
    return k;
  }

  // A batch with fresh keys.
  Batch& make_batch(std::int64_t id) {
    auto b = std::make_unique<Batch>();
    b->id = id;
    b->unique.resize(rows_.size());
    b->table.resize(rows_.size());
    draw_keys(*b);
    batches_.push_back(std::move(b));
    return *batches_.back();
  }

  void draw_keys(Batch& b) {
    for (std::size_t p = 0; p < rows_.size(); ++p) {
      b.unique[p].clear();
      b.table[p].clear();
      const std::int64_t slots = real_->planner(static_cast<int>(p)).options().slots;
      std::vector<int> order(rows_[p].size());
      for (std::size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int>(t);
      std::shuffle(order.begin(), order.end(), rng_);
      for (int t : order) {
        if (!chance(0.7)) continue;
        // Mostly well under the pool, sometimes more than it (or its cap) holds. (One draw per
        // statement: the order of unsequenced draws differs between builds.)
        const std::int64_t most =
            chance(0.05)
                ? slots + 4
                : std::max<std::int64_t>(1, static_cast<std::int64_t>(shape_.batch * static_cast<double>(slots)));
        const std::int64_t want = 1 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(most));
        std::vector<Key> keys;
        for (std::int64_t j = 0; j < want; ++j) keys.push_back(draw(rows_[p][static_cast<std::size_t>(t)]));
        b.unique[p].push_back(dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size())));
        b.table[p].push_back(t);
      }
    }
  }

  // The batch's keys as the prefetchers number the tables, pool by pool.
  std::vector<TableKeys> keys_of(const Batch& b) const {
    std::vector<TableKeys> keys;
    for (std::size_t p = 0; p < b.unique.size(); ++p)
      for (std::size_t i = 0; i < b.unique[p].size(); ++i)
        keys.push_back({first_table_[p] + b.table[p][i], &b.unique[p][i]});
    return keys;
  }

  // As the store's preview(): the keys of a later batch (ids counting up from 0) enter the window.
  void preview() {
    Batch& b = make_batch(next_preview_id_++);
    std::vector<int> tables;
    std::vector<UniqueKeys> unique;
    for (const TableKeys& k : keys_of(b)) {
      tables.push_back(k.table);
      unique.push_back(*k.unique);
    }
    real_->preview(b.id, tables, unique);
    ref_->preview(b.id, tables, unique);
    previews_.push_back(&b);
  }
  // The oldest previewed batch will not be submitted.
  void skip_preview() {
    real_->previews_done(previews_.front()->id);
    ref_->previews_done(previews_.front()->id);
    previews_.erase(previews_.begin());
  }

  void submit() {
    Batch* raw = nullptr;
    bool from_preview = false;
    if (shape_.previews > 0) {
      // Preview ahead, sometimes skip the oldest preview, then mostly submit the oldest preview:
      // with its keys, or (as when the keys submitted differ) re-keyed under its id, a push below
      // the later previews. Otherwise a batch without a preview (ids counting down from -1): it
      // gets a number above the previews' and is planned before them.
      while (static_cast<int>(previews_.size()) < shape_.previews && chance(0.6)) preview();
      if (!previews_.empty() && chance(0.1)) skip_preview();
      if (!previews_.empty() && chance(0.8)) {
        raw = previews_.front();
        previews_.erase(previews_.begin());
        from_preview = true;
        if (chance(0.3)) draw_keys(*raw);
      }
    }
    if (!raw) raw = &make_batch(next_plain_id_--);
    raw->real.id = raw->ref.id = raw->id;
    raw->real.keys = raw->ref.keys = keys_of(*raw);
    const Status a = real_->submit(raw->real);
    const Status e = ref_->submit(raw->ref);
    expect_same_status(a, e, "submit of batch " + std::to_string(raw->id));
    if (a.is_ok()) {
      pending_.push_back(raw);
    } else {
      ++refused_;
      if (from_preview) previews_.insert(previews_.begin(), raw);  // back to its preview
    }
    sync();
  }

  // As the store's forward(): plans the pending batches up to the i-th.
  bool forward(std::size_t i) {
    Batch& b = *pending_[i];
    const Status a = real_->plan(b.real);
    const Status e = ref_->plan(b.ref);
    expect_same_status(a, e, "plan of batch " + std::to_string(b.id));
    if (!a.is_ok()) ++refused_;
    sync();
    return a.is_ok();
  }

  // Backward (updated) or discard of a batch in flight.
  void retire(std::size_t i, bool updated) {
    Batch& b = *in_flight_[i];
    if (updated) {
      real_->retire(b.real, true);
      ref_->retire(b.ref, true);
    } else {
      real_->discard(b.real);
      ref_->discard(b.ref);
    }
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    sync();
  }

  // Discard of a batch not yet planned.
  void drop(std::size_t i) {
    Batch& b = *pending_[i];
    real_->discard(b.real);
    ref_->discard(b.ref);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    sync();
  }

  bool flush() {
    const Status a = real_->flush();
    const Status e = ref_->flush();
    expect_same_status(a, e, "flush");
    const auto got = real_exec_.take_written(), want = ref_exec_.take_written();
    EXPECT_EQ(got.size(), want.size()) << "flushed rows";
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      EXPECT_EQ(got[i].first, want[i].first) << "flushed row #" << i;
      expect_same_transfers({got[i].second}, {want[i].second}, "flushed row #" + std::to_string(i));
    }
    return a.is_ok();
  }

  // As the engine's write_rows(): flush, then drop every row of a table no batch in flight uses.
  void invalidate() {
    const std::size_t p = rng_() % rows_.size();
    const int t = static_cast<int>(rng_() % rows_[p].size());
    for (const Batch* b : in_flight_)
      for (int bt : b->table[p])
        if (bt == t) return;
    if (!flush()) return;
    real_->invalidate_table(first_table_[p] + t);
    ref_->invalidate_table(first_table_[p] + t);
  }

  static void expect_same_status(const Status& a, const Status& e, const std::string& what) {
    EXPECT_EQ(a.is_ok(), e.is_ok()) << what << ": " << (a.is_ok() ? e.to_string() : a.to_string());
    if (!a.is_ok() && !e.is_ok()) {
      EXPECT_EQ(a.code(), e.code()) << what;
      EXPECT_EQ(a.message(), e.message()) << what;
    }
  }

  // After every call: the batches the prefetchers planned (both the same ones, with the same
  // plans) move from pending to in flight.
  void sync() {
    for (std::size_t i = 0; i < pending_.size();) {
      Batch& b = *pending_[i];
      const std::string what = "batch " + std::to_string(b.id);
      ASSERT_EQ(b.real.planned, b.ref.planned) << what;
      ASSERT_EQ(b.real.deferred, b.ref.deferred) << what;
      ASSERT_EQ(b.real.executor_refused, b.ref.executor_refused) << what;
      ASSERT_EQ(b.real.seq, b.ref.seq) << what;
      if (b.real.deferred && !b.counted_deferred) {
        b.counted_deferred = true;
        ++refused_;
      }
      // Deferred by a pool (too full), not by the executor's refusal of staging: its last attempt
      // failed in a pool. (A batch the executor refused and a pool later accepted is planned.)
      if (b.real.deferred && !b.real.executor_refused && !b.real.planned && !b.counted_pool_refusal) {
        b.counted_pool_refusal = true;
        ++pool_refused_;
      }
      if (!b.real.planned) {
        ++i;
        continue;
      }
      ASSERT_EQ(b.real.parts.size(), b.ref.parts.size()) << what;
      for (std::size_t k = 0; k < b.real.parts.size(); ++k) {
        const PoolPlan& a = b.real.parts[k].plan;
        const PoolPlan& e = b.ref.parts[k].plan;
        const std::string where = "plan of " + what + " in pool " + std::to_string(b.real.parts[k].pool);
        ASSERT_EQ(b.real.parts[k].pool, b.ref.parts[k].pool) << where;
        EXPECT_EQ(a.seq, e.seq) << where;
        EXPECT_EQ(a.hits, e.hits) << where;
        EXPECT_EQ(a.misses, e.misses) << where;
        EXPECT_EQ(a.unique_slots, e.unique_slots) << where;
        expect_same_transfers(a.fills, e.fills, where + ", fills");
        expect_same_transfers(a.writebacks, e.writebacks, where + ", write-backs");
      }
      EXPECT_EQ(real_exec_.issued(b.id), ref_exec_.issued(b.id)) << what;
      in_flight_.push_back(&b);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      ++planned_;
    }
  }

  void check_state(const std::string& when) {
    ASSERT_EQ(real_->in_flight(), ref_->in_flight()) << when;
    ASSERT_EQ(real_->in_flight(), static_cast<int>(pending_.size() + in_flight_.size())) << when;
    for (int p = 0; p < real_->pools(); ++p) {
      const std::string what = when + ", pool " + std::to_string(p);
      const CachePlanner& real = real_->planner(p);
      const RefPlanner& ref = ref_->planner(p);
      ASSERT_EQ(real.resident(), ref.resident()) << what;
      ASSERT_EQ(real.pinned(), ref.pinned()) << what;
      for (std::size_t t = 0; t < rows_[static_cast<std::size_t>(p)].size(); ++t) {
        const int id = first_table_[static_cast<std::size_t>(p)] + static_cast<int>(t);
        expect_same_stats(real_->table_stats(id), ref_->table_stats(id), what + ", table " + std::to_string(t));
        for (Key row = 0; row < rows_[static_cast<std::size_t>(p)][t]; ++row)
          ASSERT_EQ(real.slot_of(static_cast<int>(t), row), ref.slot_of(static_cast<int>(t), row))
              << what << ", table " << t << ", row " << row;
      }
    }
  }

  Shape shape_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::int64_t>> rows_;  // [pool][table]
  std::vector<int> first_table_;                 // [pool]: the prefetchers' number of its table 0
  int tables_ = 0;
  TestExecutor<RealPrefetcher> real_exec_;
  TestExecutor<RefPrefetcher> ref_exec_;
  std::unique_ptr<RealPrefetcher> real_;
  std::unique_ptr<RefPrefetcher> ref_;
  std::vector<std::unique_ptr<Batch>> batches_;
  std::vector<Batch*> pending_, in_flight_, previews_;
  std::int64_t next_preview_id_ = 0, next_plain_id_ = -1, planned_ = 0, refused_ = 0, pool_refused_ = 0;
};

// ---- the tests --------------------------------------------------------------------------------

class PlannerEquivalence : public ::testing::TestWithParam<std::tuple<Policy, int>> {};

TEST_P(PlannerEquivalence, SmallPoolsManyTablesAndCaps) {
  const auto [policy, lookahead] = GetParam();
  std::int64_t planned = 0, refused = 0, pool_refused = 0, evictions = 0;
  for (std::uint64_t seed = 0; seed < 12 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Shape s;
    s.policy = policy;
    s.lookahead = lookahead;
    s.max_in_flight = 1 + static_cast<int>(seed % 4);
    s.pools = 1 + static_cast<int>(seed % 2);
    Harness h(s, 1000 * seed + 17 * static_cast<std::uint64_t>(lookahead) + static_cast<std::uint64_t>(policy));
    h.run();
    planned += h.planned();
    refused += h.refused();
    pool_refused += h.pool_refused();
    evictions += h.evictions();
  }
  // The workload reaches the interesting cases (deep windows in small pools refuse many batches):
  // refusals of the pools themselves, not only the test executor's random ones.
  EXPECT_GT(planned, 300);
  EXPECT_GT(refused, 0);
  EXPECT_GT(pool_refused, 0);
  EXPECT_GT(evictions, 500);
}

// Steps of the longer runs below. Under ASan or TSan, which check memory and races rather than
// which rows are resident, a quarter of them (every path is reached within the first few hundred
// steps; the 27 cases of each took 20-25 s under ASan at full length); the default preset runs all.
int long_run_steps(int steps) { return testing::full_or_sanitized(steps, steps / 4); }

// Larger pools and batches over many steps: long-lived residents, deep eviction orders.
Shape larger_pool_shape(Policy policy, int lookahead, int steps) {
  Shape s;
  s.policy = policy;
  s.lookahead = lookahead;
  s.max_in_flight = 3;
  s.pools = 1;
  s.max_tables = 2;
  s.min_slots = 200;
  s.max_slots = 300;
  s.cap_chance = 0.3;
  s.min_cap = 0.5;
  s.batch = 0.15;
  s.min_rows = 2;
  s.steps = steps;
  return s;
}

TEST_P(PlannerEquivalence, LongerRunsOnLargerPools) {
  const auto [policy, lookahead] = GetParam();
  const Shape s = larger_pool_shape(policy, lookahead, long_run_steps(3000));
  Harness h(s, 99 + static_cast<std::uint64_t>(lookahead) * 3 + static_cast<std::uint64_t>(policy));
  h.run();
  EXPECT_GT(h.planned(), s.steps / 10);
  EXPECT_GT(h.evictions(), s.steps);
  std::printf("planned %lld, refused %lld, evictions %lld\n", static_cast<long long>(h.planned()),
              static_cast<long long>(h.refused()), static_cast<long long>(h.evictions()));
}

// Previews (Store::preview): the window runs up to ~100 batches ahead of the submitted ones (uses
// more than 64 batches apart), previewed batches are re-keyed under their number (pushes below
// later batches) or skipped, and batches submitted without a preview are planned before previews
// with lower numbers.
TEST_P(PlannerEquivalence, WithPreviews) {
  const auto [policy, lookahead] = GetParam();
  std::int64_t planned = 0, evictions = 0;
  for (std::uint64_t seed = 0; seed < 6 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Shape s;
    s.policy = policy;
    s.lookahead = lookahead;
    s.max_in_flight = 1 + static_cast<int>(seed % 3);
    s.pools = 1 + static_cast<int>(seed % 2);
    s.previews = seed % 2 ? 100 : 3 + static_cast<int>(seed);
    s.steps = 1200;
    Harness h(s, 5000 + 1000 * seed + 17 * static_cast<std::uint64_t>(lookahead) + static_cast<std::uint64_t>(policy));
    h.run();
    planned += h.planned();
    evictions += h.evictions();
  }
  EXPECT_GT(planned, 300);
  EXPECT_GT(evictions, 500);
}

TEST_P(PlannerEquivalence, LongerRunsWithPreviews) {
  const auto [policy, lookahead] = GetParam();
  Shape s = larger_pool_shape(policy, lookahead, long_run_steps(5000));
  s.previews = 80;
  Harness h(s, 777 + static_cast<std::uint64_t>(lookahead) * 3 + static_cast<std::uint64_t>(policy));
  h.run();
  EXPECT_GT(h.planned(), s.steps * 3 / 50);
  EXPECT_GT(h.evictions(), s.steps * 3 / 5);
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndLookahead, PlannerEquivalence,
                         ::testing::Combine(::testing::Values(Policy::kLru, Policy::kLfu, Policy::kLookahead),
                                            ::testing::Range(0, 9)),
                         [](const ::testing::TestParamInfo<std::tuple<Policy, int>>& i) {
                           return std::string(to_string(std::get<0>(i.param))) + "_lookahead" +
                                  std::to_string(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace strata::cache
