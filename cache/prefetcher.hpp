#pragma once
// cache::Prefetcher: the loop that drives the cache planners of a `cached` store. It owns the
// window of batches submitted and previewed, one planner per slot pool (cache::PartitionedPlanner; the
// tools and tests may plan with cache::CachePlanner or a model instead: any type with the planner's
// calls), and decides when each batch is planned:
//   - submit: a batch enters the window of every pool it touches (a previewed batch keeps its
//     preview's place); the oldest pending batches are planned once `lookahead` batches stand
//     behind them.
//   - planning is all-or-nothing over the pools: probe every pool, then the executor's prepare(),
//     then commit every pool, then the executor's issue(). A plan that does not fit beside the rows
//     pinned by batches in flight (kResourceExhausted, from a pool or from prepare()) is deferred:
//     the batch stays pending, counted once in CacheStats::deferred of each table it touches, and
//     is planned when batches retire or, at the latest, by plan() (the store's forward).
//   - bypass (set_bypass(), for planners whose probe takes a bypass flag, CachePlanner's): plan()
//     plans with it, so the rows that do not fit beside the rows pinned by batches in flight go to
//     overflow slots outside the cache instead of the forward failing; so does the plan of a batch
//     that can never fit the cache (Batch::bypass_when_due, set by the caller from rows_beyond())
//     when it is due, instead of being deferred. Only prepare() (the executor: staging, device
//     memory for the overflow rows) can still refuse a plan. Off by default: a plan that does not
//     fit is then refused as before (the tools and the planner tests compare plans that way).
//   - retire / discard: the pools unpin the batch's rows (dirty when updated). When the oldest
//     pending batch is deferred and more than `lookahead` batches are pending, the batches due are
//     planned again, oldest first, up to the first that still does not fit.
//   - previews: keys of batches to be submitted later enter the window early (Store::preview).
//   - flush: every dirty row, in chunks the executor sizes, written back by the executor and then
//     marked clean.
// It produces plans (per pool: the slot of every unique row, the rows to write back, the rows to
// fill) and statistics; it moves no data. Moving data is the executor's job (Executor below): the
// store's cached engine (store/engines/cached_engine.cpp) implements it with staging, copy streams
// and events. So cache/ knows nothing of store/ or of a device, and tools without a device drive
// the same class with the PlanOnly executor, which moves nothing (strata-hitrate, the planner
// benchmarks). There is no default: a prefetcher with no executor set refuses (aborts) to plan or
// flush, so that an engine that forgot set_executor() cannot mark rows clean it never wrote back.
//
// Batches belong to the caller (the engine derives its batch from Batch): the prefetcher keeps
// pointers to them from submit() until retire() or discard(), and to their keys (TableKeys) as
// long. Not thread-safe: the store's driving thread owns it.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache/cache_planner.hpp"
#include "cache/partitioned_planner.hpp"
#include "core/status.hpp"
#include "host/dedup.hpp"

namespace strata::cache {

/// One table's unique keys in a batch. `table` is the prefetcher's number of the table (the
/// numbers given to add_pool()), not a pool-local index.
struct TableKeys {
  int table = 0;
  const UniqueKeys* unique = nullptr;  ///< alive while the batch is submitted
};

/// Whether a planner's probe takes a bypass flag (CachePlanner, PartitionedPlanner).
template <class Planner, class = void>
struct CanBypass : std::false_type {};
template <class Planner>
struct CanBypass<Planner, std::void_t<decltype(std::declval<const Planner&>().probe(
                              0, std::declval<const std::vector<FeatureKeys>&>(), true))>> : std::true_type {};

template <class Planner>
class BasicPrefetcher {
 public:
  using Probe = std::decay_t<
      decltype(std::declval<const Planner&>().probe(0, std::declval<const std::vector<FeatureKeys>&>()).value())>;
  using Plan = std::decay_t<decltype(std::declval<Planner&>().commit(std::declval<Probe>()))>;

  /// A batch, owned by the caller from submit() until retire() or discard() returns.
  struct Batch {
    std::int64_t id = 0;          ///< the caller's batch id: a preview of the same id gives its place
    std::vector<TableKeys> keys;  ///< set before submit(); each table at most once
    // Set by the prefetcher.
    std::int64_t seq = 0;  ///< place in the window (the planners' sequence number)
    struct Part {
      int pool = 0;
      std::vector<int> keys;  ///< indexes into Batch::keys of the pool's tables
      Probe probe;            ///< between probe and commit (what Executor::prepare may read)
      Plan plan;              ///< once planned
    };
    /// Set by the caller before submit(): the batch can never fit the cache (rows_beyond), so its
    /// plan bypasses the cache for the rows that do not fit when it is due instead of being
    /// deferred (with set_bypass()).
    bool bypass_when_due = false;
    std::vector<Part> parts;        ///< per pool touched, in the order `keys` first touch them
    bool planned = false;           ///< committed in every pool (and issued)
    bool deferred = false;          ///< its plan did not fit when due (counted in CacheStats::deferred)
    bool executor_refused = false;  ///< its last plan attempt failed in Executor::prepare, not in a pool
  };

  /// Moves the data of the plans. Required (set_executor) before the first plan or flush; PlanOnly
  /// below for a prefetcher that only plans.
  class Executor {
   public:
    /// Every pool accepted `b` (probed, nothing committed): take what executing it needs. An error
    /// leaves every pool unchanged; kResourceExhausted defers the batch, others are returned.
    virtual Status prepare(Batch& b) = 0;
    /// `b` is committed in every pool (Batch::Part::plan): issue its write-backs and fills. Cannot fail.
    virtual void issue(Batch& b) = 0;
    /// Rows of one flush chunk of pool `pool` (>= 1).
    virtual std::size_t flush_rows(int pool) = 0;
    /// Writes dirty rows of pool `pool` back to their host tables; once it returns OK they are
    /// marked clean. An error stops the flush (the rows stay dirty).
    virtual Status write_back(int pool, const std::vector<Transfer>& rows) = 0;

   protected:
    ~Executor() = default;
  };

  /// The executor of a prefetcher that only plans (tools and tests without a device or host
  /// tables): prepare() accepts every batch, issue() does nothing, write_back() drops the rows, so
  /// flush() marks every dirty row clean without writing it anywhere. Stateless.
  class PlanOnly final : public Executor {
   public:
    Status prepare(Batch&) override { return Status::ok(); }
    void issue(Batch&) override {}
    std::size_t flush_rows(int) override { return std::size_t{1} << 20; }  // any size: nothing is written
    Status write_back(int, const std::vector<Transfer>&) override { return Status::ok(); }
  };
  /// One PlanOnly executor, for set_executor(&plan_only()).
  static Executor& plan_only() {
    static PlanOnly e;
    return e;
  }

  /// `lookahead`: batches kept pending (submitted, not planned) behind the one planned; `tables`:
  /// the tables the pools serve are numbered 0 .. tables-1.
  BasicPrefetcher(int lookahead, int tables)
      : lookahead_(lookahead),
        where_(static_cast<std::size_t>(tables), {-1, -1}),
        deferred_(static_cast<std::size_t>(tables), 0) {}

  /// Adds a pool planned by `planner`, serving tables `tables` (its pool-local table l is
  /// tables[l]); returns the pool's number. Before the first submit.
  int add_pool(std::unique_ptr<Planner> planner, std::vector<int> tables);
  /// The executor (alive while the prefetcher is used): before the first submit or flush.
  void set_executor(Executor* executor) noexcept { exec_ = executor; }
  /// Plans with bypass (see the top of this file); before the first submit. Only for planners
  /// that can (CanBypass).
  void set_bypass(bool on) noexcept {
    static_assert(CanBypass<Planner>::value, "the planner's probe takes no bypass flag");
    bypass_ = on;
  }

  int pools() const noexcept { return static_cast<int>(pools_.size()); }
  const Planner& planner(int pool) const { return *pools_[static_cast<std::size_t>(pool)].planner; }
  const std::vector<int>& pool_tables(int pool) const { return pools_[static_cast<std::size_t>(pool)].tables; }
  /// (pool, pool-local index) of a table.
  std::pair<int, int> where(int table) const { return where_[static_cast<std::size_t>(table)]; }
  /// Whether some pool ranks rows by the window (lookahead): else previews change nothing.
  bool uses_window() const noexcept { return uses_window_; }
  /// Batches submitted and not yet retired or discarded.
  int in_flight() const noexcept { return in_flight_; }
  /// The oldest batch submitted and not yet planned, or null.
  const Batch* oldest_pending() const noexcept { return pending_.empty() ? nullptr : pending_.front(); }

  /// The planners' rows_beyond (rows no cache slot can take even when nothing is pinned), per pool
  /// (indexed by pool number); `b.keys` set. Only for planners that have rows_beyond
  /// (PartitionedPlanner). No state change.
  std::vector<std::int64_t> rows_beyond(const Batch& b) const;

  /// Submits `b` (id and keys set): into the window, then plans the batches due, oldest first. A
  /// plan that does not fit is deferred (not an error). Any other error takes `b` back (a previewed
  /// batch goes back to its preview) and is returned, also when it is the error of an older pending
  /// batch's plan: that batch stays pending (executor_refused when its prepare() failed), and the
  /// caller of submit(b) gets an error naming that batch, not `b`.
  Status submit(Batch& b);
  /// Plans the pending batches up to `b`, oldest first (the store's forward), with bypass when it
  /// is set (then only Executor::prepare can refuse); `b` submitted (planned or pending: checked).
  /// On an error the oldest pending batch is the one that failed (deferred when the error is
  /// kResourceExhausted).
  Status plan(Batch& b);
  /// A planned batch (checked) is done: its rows unpinned (dirty when `updated`). Then, when the
  /// oldest pending batch is deferred and more than `lookahead` batches are pending, the batches due
  /// are planned again as in submit(), up to the first that still does not fit (errors are left for
  /// plan()).
  void retire(Batch& b, bool updated);
  /// A batch given up: taken out of the window when unplanned, retired not updated when planned.
  void discard(Batch& b);

  /// The keys of batch `id`, to be submitted later, enter the window (only when uses_window()).
  void preview(std::int64_t id, std::vector<int> tables, std::vector<UniqueKeys> unique);
  /// Previews of ids up to `id` leave the window (the caller will not submit them).
  void previews_done(std::int64_t id);
  void drop_previews() { previews_done(std::numeric_limits<std::int64_t>::max()); }

  /// Every dirty row of every pool, in chunks of Executor::flush_rows, written back and then marked
  /// clean; stops at the executor's first error (that chunk and the rest stay dirty).
  Status flush();
  /// Drops every resident row of `table` (flush first; no batch in flight may use it).
  void invalidate_table(int table);
  /// Drops `rows` of `table` from the cache without writing them back (Planner::drop_rows; no batch in flight may use
  /// them).
  void drop_rows(int table, const std::vector<Key>& rows) {
    const auto [p, local] = where_[static_cast<std::size_t>(table)];
    pools_[static_cast<std::size_t>(p)].planner->drop_rows(local, rows);
  }

  /// A table's statistics, with the prefetcher's deferral count.
  CacheStats table_stats(int table) const;

 private:
  struct Pool {
    std::unique_ptr<Planner> planner;
    std::vector<int> tables;
  };
  // Keys of a batch to be submitted later: its window entry, under sequence number `seq`.
  struct Preview {
    std::int64_t id = 0, seq = 0;
    std::vector<int> tables;
    std::vector<UniqueKeys> unique;  // per feature, first-use order
  };

  std::vector<FeatureKeys> features(const Batch& b, const typename Batch::Part& w) const;
  void group(Batch& b) const;
  static bool same_keys(const Batch& b, const Preview& p);
  void window(std::int64_t seq, const std::vector<int>& tables, const std::vector<UniqueKeys>& unique, bool push);
  void unsubmit(Batch& b);
  Status plan_due();
  void plan_deferred() {
    if (!pending_.empty() && pending_.front()->deferred) (void)plan_due();
  }
  void mark_deferred(Batch& b);
  Status plan_front(bool bypass);

  int lookahead_;
  std::vector<std::pair<int, int>> where_;  // table -> (pool, pool-local index)
  std::vector<std::int64_t> deferred_;      // per table: batches whose plan was deferred
  std::vector<Pool> pools_;
  bool uses_window_ = false;
  bool bypass_ = false;  // set_bypass()
  Executor* exec_ = nullptr;
  std::deque<Batch*> pending_;    // submitted, not yet planned, oldest first
  std::deque<Preview> previews_;  // previewed, not yet submitted, ascending id and seq
  std::int64_t next_seq_ = 0;
  int in_flight_ = 0;
};

/// The store's prefetcher: pools planned by PartitionedPlanner.
using Prefetcher = BasicPrefetcher<PartitionedPlanner>;

// ---- implementation ----------------------------------------------------------------------------

template <class Planner>
int BasicPrefetcher<Planner>::add_pool(std::unique_ptr<Planner> planner, std::vector<int> tables) {
  const int p = static_cast<int>(pools_.size());
  for (std::size_t l = 0; l < tables.size(); ++l)
    where_[static_cast<std::size_t>(tables[l])] = {p, static_cast<int>(l)};
  uses_window_ = uses_window_ || planner->options().policy == Policy::kLookahead;
  pools_.push_back({std::move(planner), std::move(tables)});
  return p;
}

template <class Planner>
std::vector<FeatureKeys> BasicPrefetcher<Planner>::features(const Batch& b, const typename Batch::Part& w) const {
  std::vector<FeatureKeys> fk;
  fk.reserve(w.keys.size());
  for (int i : w.keys) {
    const TableKeys& k = b.keys[static_cast<std::size_t>(i)];
    fk.push_back({where_[static_cast<std::size_t>(k.table)].second, k.unique});
  }
  return fk;
}

// b.parts from b.keys: one entry per pool, in the order the keys first touch them.
template <class Planner>
void BasicPrefetcher<Planner>::group(Batch& b) const {
  b.parts.clear();
  for (std::size_t i = 0; i < b.keys.size(); ++i) {
    const int p = where_[static_cast<std::size_t>(b.keys[i].table)].first;
    auto it = std::find_if(b.parts.begin(), b.parts.end(), [p](const typename Batch::Part& w) { return w.pool == p; });
    if (it == b.parts.end()) {
      b.parts.emplace_back();
      b.parts.back().pool = p;
      it = b.parts.end() - 1;
    }
    it->keys.push_back(static_cast<int>(i));
  }
}

template <class Planner>
std::vector<std::int64_t> BasicPrefetcher<Planner>::rows_beyond(const Batch& b) const {
  Batch grouped;
  grouped.keys = b.keys;
  group(grouped);
  std::vector<std::int64_t> out(pools_.size(), 0);
  for (const auto& w : grouped.parts)
    out[static_cast<std::size_t>(w.pool)] =
        pools_[static_cast<std::size_t>(w.pool)].planner->rows_beyond(features(grouped, w));
  return out;
}

// Whether a batch's keys are those of its preview (same tables, same unique keys in order).
template <class Planner>
bool BasicPrefetcher<Planner>::same_keys(const Batch& b, const Preview& p) {
  if (b.keys.size() != p.tables.size()) return false;
  for (std::size_t i = 0; i < b.keys.size(); ++i)
    if (b.keys[i].table != p.tables[i] || b.keys[i].unique->keys != p.unique[i].keys) return false;
  return true;
}

// Pushes (or drops) a preview's keys into (from) the window of every pool they touch.
template <class Planner>
void BasicPrefetcher<Planner>::window(std::int64_t seq, const std::vector<int>& tables,
                                      const std::vector<UniqueKeys>& unique, bool push) {
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    std::vector<FeatureKeys> fk;
    for (std::size_t i = 0; i < tables.size(); ++i) {
      const auto [pool, local] = where_[static_cast<std::size_t>(tables[i])];
      if (static_cast<std::size_t>(pool) == p) fk.push_back({local, &unique[i]});
    }
    if (fk.empty()) continue;
    if (push)
      pools_[p].planner->window_push(seq, fk);
    else
      pools_[p].planner->window_drop(seq, fk);
  }
}

template <class Planner>
void BasicPrefetcher<Planner>::preview(std::int64_t id, std::vector<int> tables, std::vector<UniqueKeys> unique) {
  if (!uses_window_) return;  // only lookahead has a window
  Preview p{id, next_seq_++, std::move(tables), std::move(unique)};
  window(p.seq, p.tables, p.unique, true);
  previews_.push_back(std::move(p));
}

template <class Planner>
void BasicPrefetcher<Planner>::previews_done(std::int64_t id) {
  while (!previews_.empty() && previews_.front().id <= id) {
    const Preview& p = previews_.front();
    window(p.seq, p.tables, p.unique, false);
    previews_.pop_front();
  }
}

template <class Planner>
Status BasicPrefetcher<Planner>::submit(Batch& b) {
  group(b);
  b.planned = b.deferred = b.executor_refused = false;
  // A previewed batch keeps its place in the window (its sequence number) and, when its keys are
  // those previewed, its window entry. The previews of earlier ids stay until the caller reports
  // the submit done (previews_done), so that a failure here changes nothing.
  std::optional<Preview> taken;
  for (auto it = previews_.begin(); it != previews_.end(); ++it) {
    if (it->id != b.id) continue;
    taken = std::move(*it);
    previews_.erase(it);
    break;
  }
  const bool push = !taken || !same_keys(b, *taken);
  if (taken) {
    b.seq = taken->seq;
    if (push) window(taken->seq, taken->tables, taken->unique, false);
  } else {
    b.seq = next_seq_++;
  }
  if (push)
    for (const auto& w : b.parts) pools_[static_cast<std::size_t>(w.pool)].planner->window_push(b.seq, features(b, w));
  pending_.push_back(&b);
  if (Status s = plan_due(); !s.is_ok()) {
    unsubmit(b);
    if (taken) {  // back to a preview, in its place
      window(taken->seq, taken->tables, taken->unique, true);
      auto at = previews_.begin();
      while (at != previews_.end() && at->id < taken->id) ++at;
      previews_.insert(at, std::move(*taken));
    }
    return s;
  }
  ++in_flight_;
  return Status::ok();
}

// Takes back a submitted, unplanned batch.
template <class Planner>
void BasicPrefetcher<Planner>::unsubmit(Batch& b) {
  for (const auto& w : b.parts) pools_[static_cast<std::size_t>(w.pool)].planner->window_drop(b.seq, features(b, w));
  const auto it = std::find(pending_.begin(), pending_.end(), &b);
  if (it != pending_.end()) pending_.erase(it);
}

// Plans the pending batches that have `lookahead` later batches behind them, oldest first. A plan
// that does not fit is deferred, not refused: it stays pending, and is made when batches retire
// or, at the latest, by plan(). Other errors are returned.
template <class Planner>
Status BasicPrefetcher<Planner>::plan_due() {
  while (static_cast<int>(pending_.size()) > lookahead_) {
    Status s = plan_front(bypass_ && pending_.front()->bypass_when_due);
    if (s.code() == StatusCode::kResourceExhausted) {
      mark_deferred(*pending_.front());
      return Status::ok();
    }
    STRATA_RETURN_IF_ERROR(s);
  }
  return Status::ok();
}

template <class Planner>
void BasicPrefetcher<Planner>::mark_deferred(Batch& b) {
  if (b.deferred) return;
  b.deferred = true;
  for (const TableKeys& k : b.keys) ++deferred_[static_cast<std::size_t>(k.table)];
}

// Plans the oldest pending batch (with bypass: the rows that do not fit go outside the cache, for
// planners that can). All-or-nothing across pools.
template <class Planner>
Status BasicPrefetcher<Planner>::plan_front(bool bypass) {
  STRATA_CHECK(exec_ != nullptr && "set_executor() before planning (PlanOnly to only plan)");
  Batch& b = *pending_.front();
  b.executor_refused = false;  // this attempt's cause, not an earlier one's
  for (auto& w : b.parts) {
    const Planner& planner = *pools_[static_cast<std::size_t>(w.pool)].planner;
    Result<Probe> p = [&] {
      if constexpr (CanBypass<Planner>::value) {
        return planner.probe(b.seq, features(b, w), bypass);
      } else {
        return planner.probe(b.seq, features(b, w));
      }
    }();
    if (!p) return p.status().with_context("batch " + std::to_string(b.id));
    w.probe = std::move(p).value();
  }
  Status prepared = exec_->prepare(b);
  b.executor_refused = !prepared.is_ok();
  STRATA_RETURN_IF_ERROR(prepared);
  // From here on nothing fails: commit and issue.
  for (auto& w : b.parts) w.plan = pools_[static_cast<std::size_t>(w.pool)].planner->commit(std::move(w.probe));
  exec_->issue(b);
  b.planned = true;
  pending_.pop_front();
  return Status::ok();
}

template <class Planner>
Status BasicPrefetcher<Planner>::plan(Batch& b) {
  while (!b.planned) {
    STRATA_CHECK(!pending_.empty() && "plan() of a batch not submitted");
    Status s = plan_front(bypass_);
    if (s.is_ok()) continue;
    if (s.code() == StatusCode::kResourceExhausted) mark_deferred(*pending_.front());
    return s;
  }
  return Status::ok();
}

template <class Planner>
void BasicPrefetcher<Planner>::retire(Batch& b, bool updated) {
  STRATA_CHECK(b.planned && "retire() of a batch not planned (discard() takes back a pending one)");
  for (const auto& w : b.parts) pools_[static_cast<std::size_t>(w.pool)].planner->retire(w.plan, updated);
  --in_flight_;
  plan_deferred();
}

template <class Planner>
void BasicPrefetcher<Planner>::discard(Batch& b) {
  if (b.planned) return retire(b, false);
  unsubmit(b);
  --in_flight_;
  plan_deferred();  // a deferred batch behind it may fit now
}

template <class Planner>
Status BasicPrefetcher<Planner>::flush() {
  STRATA_CHECK(exec_ != nullptr && "set_executor() before flush (PlanOnly to drop the rows)");
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    Planner& planner = *pools_[p].planner;
    const std::vector<Transfer> dirty = planner.dirty();
    const std::size_t chunk = std::max<std::size_t>(1, exec_->flush_rows(static_cast<int>(p)));
    for (std::size_t at = 0; at < dirty.size(); at += chunk) {
      const std::vector<Transfer> part(dirty.begin() + static_cast<std::ptrdiff_t>(at),
                                       dirty.begin() + static_cast<std::ptrdiff_t>(std::min(dirty.size(), at + chunk)));
      STRATA_RETURN_IF_ERROR(exec_->write_back(static_cast<int>(p), part));
      planner.mark_clean(part);
    }
  }
  return Status::ok();
}

template <class Planner>
void BasicPrefetcher<Planner>::invalidate_table(int table) {
  const auto [p, local] = where_[static_cast<std::size_t>(table)];
  pools_[static_cast<std::size_t>(p)].planner->invalidate_table(local);
}

template <class Planner>
CacheStats BasicPrefetcher<Planner>::table_stats(int table) const {
  const auto [p, local] = where_[static_cast<std::size_t>(table)];
  CacheStats st = pools_[static_cast<std::size_t>(p)].planner->table_stats(local);
  st.deferred = deferred_[static_cast<std::size_t>(table)];
  return st;
}

// The store's, compiled once in cache/prefetcher.cpp (other planners are instantiated where used).
extern template class BasicPrefetcher<PartitionedPlanner>;

}  // namespace strata::cache
