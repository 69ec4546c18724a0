#pragma once
// ShardedPool: one slot pool planned by several cores. The pool's slots are split into S shards,
// each a CachePool of its own (its key index, policy, window, pins, dirty flags and statistics);
// a row belongs to the shard its cache key hashes to, so the shards share nothing and are planned
// in parallel (oneTBB, in the caller's arena). With S = 1 every call goes straight to the one
// CachePool: same decisions, no split, no copies.
//
// What changes with S > 1: each policy ranks rows within their shard, not over the whole pool (as
// the set-associative caches of HugeCTR and FBGEMM rank rows within a set), so the hit rates move
// a little (BM_PlanBatchSharded reports them); a batch must fit every shard it touches (a shard
// holds slots / S rows, so a batch near the pool's capacity may be refused where S = 1 takes it:
// the error names the shard); a table's cap is split over the shards the same way.
// Slot numbers are global: shard s owns the slots [offset(s), offset(s) + slots(s)).
// Not thread-safe: the store's driving thread owns it (it forks the shards' work itself).

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache_pool.hpp"

namespace strata::cache {

/// What probe() found; consumed by commit(). Valid only until the pool changes.
struct ShardedProbe {
  std::int64_t seq = 0;
  std::int64_t misses = 0;        ///< rows to fill, over every shard
  std::vector<PoolProbe> shards;  ///< per shard
  // S > 1: per shard, per feature: the feature's rows that hash to the shard (keys only), and the
  // index of each in the feature's unique rows. The shards' probes point into `keys`.
  std::vector<std::vector<UniqueKeys>> keys;
  std::vector<std::vector<std::vector<std::uint32_t>>> rows;
};

/// A plan with global slot numbers (the PoolPlan part), and what retire() needs of each shard.
struct ShardedPlan : PoolPlan {
  std::vector<PoolPlan> shards;  ///< S > 1: per shard, in its own slot numbers
};

class ShardedPool {
 public:
  /// Slots one shard (a CachePool: 32-bit slot numbers inside) holds at most.
  static constexpr std::int64_t kMaxShardSlots = std::int64_t{1} << 30;

  /// A pool of `options.slots` slots in `shards` shards (1 <= shards <= slots; a table's cap, when
  /// it has one, at least `shards`): check with validate() first.
  ShardedPool(const CachePoolOptions& options, int shards);

  /// Why `options` cannot be split into `shards` shards, naming the pool, the table and the
  /// numbers; OK when it can.
  static Status validate(const CachePoolOptions& options, int shards);

  const CachePoolOptions& options() const noexcept { return opt_; }
  int shards() const noexcept { return static_cast<int>(shards_.size()); }

  /// Whether a batch fits the pool when nothing is pinned: its rows within every shard's slots and
  /// each table's rows within its cap (in every shard). A batch refused here can never be planned;
  /// one accepted is refused by probe() only while rows pinned by batches in flight crowd it out.
  /// Errors start with `who` (e.g. "batch 7") and name the table or the pool (and the shard when
  /// S > 1) with the numbers. No state change.
  Status check_fits(const std::string& who, const std::vector<FeatureKeys>& features) const;

  /// As CachePool's, split by shard.
  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& features);
  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features);
  /// As CachePool::probe, in every shard; the first shard that refuses the batch (lowest number)
  /// gives the error. No state change.
  Result<ShardedProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& features) const;
  /// As CachePool::commit, in every shard; the plan's lists go shard by shard.
  ShardedPlan commit(ShardedProbe probe);
  /// As CachePool::retire.
  void retire(const ShardedPlan& plan, bool updated);
  /// As CachePool's (global slots, shard by shard).
  std::vector<Transfer> dirty() const;
  void mark_clean(const std::vector<Transfer>& rows);
  /// As CachePool::invalidate_table.
  void invalidate_table(int table);

  std::int64_t resident() const noexcept;
  std::int64_t pinned() const noexcept;
  /// Whether (table, row) is resident; its (global) slot or -1.
  std::int64_t slot_of(int table, Key row) const noexcept;
  CacheStats table_stats(int table) const;
  CacheStats pool_stats() const;

 private:
  // The shard of a cache key's hash: its top 32 bits (the index tag: uniform) scaled to [0, S).
  std::size_t shard_of(std::uint64_t hash) const noexcept {
    return static_cast<std::size_t>(((hash >> 32) * shards_.size()) >> 32);
  }
  // The rows of each feature that hash to shard `s`: into `keys` (and, when given, their indexes
  // in the feature's unique rows into `rows`). Touches only these and the features: one task per
  // shard runs it, each on its own buffers.
  void split(const std::vector<FeatureKeys>& features, std::size_t s, std::vector<UniqueKeys>& keys,
             std::vector<std::vector<std::uint32_t>>* rows) const;
  std::vector<FeatureKeys> shard_features(const std::vector<FeatureKeys>& features,
                                          const std::vector<UniqueKeys>& keys) const;

  CachePoolOptions opt_;
  std::vector<std::unique_ptr<CachePool>> shards_;
  std::vector<std::int64_t> offset_;                  // per shard: its first global slot
  std::vector<std::vector<UniqueKeys>> window_keys_;  // per shard: window_push/window_drop scratch
};

}  // namespace strata::cache
