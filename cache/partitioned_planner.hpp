#pragma once
// PartitionedPlanner: one slot pool planned by several cores. The pool's slots are split into S partitions,
// each a CachePlanner of its own (its key index, policy, window, pins, dirty flags and statistics);
// a row belongs to the partition its cache key hashes to, so the partitions share nothing and are planned
// in parallel (oneTBB, in the caller's arena). With S = 1 every call goes straight to the one
// CachePlanner: same decisions, no split, no copies.
//
// What changes with S > 1: each policy ranks rows within their partition, not over the whole pool (as
// the set-associative caches of HugeCTR and FBGEMM rank rows within a set), so the hit rates move
// a little (BM_PlanBatchPartitioned reports them); a batch must fit every partition it touches (a partition
// holds slots / S rows, so a batch near the pool's capacity may bypass the cache for rows where S = 1
// takes them all); a table's cap is split over the partitions the same way.
// Slot numbers are global: partition s owns the slots [offset(s), offset(s) + slots(s)), and its
// overflow slots (CachePlanner: bypass) interleave after the pool's: its local overflow slot
// slots(s) + i is global slot options().slots + i * S + s.
// Not thread-safe: the store's driving thread owns it (it forks the partitions' work itself).

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache_planner.hpp"

namespace strata::cache {

/// What probe() found; consumed by commit(). Valid only until the pool changes.
struct PartitionedProbe {
  std::int64_t seq = 0;
  std::int64_t misses = 0;            ///< rows to fill, over every partition (into cache or overflow slots)
  std::int64_t overflow_records = 0;  ///< as PoolProbe's, over the pool: its overflow slots stay below slots + this
  bool overflow = false;              ///< as PoolProbe's: some row is or will be in an overflow slot
  std::vector<PoolProbe> partitions;  ///< per partition
  // S > 1: per partition, per feature: the feature's rows that hash to the partition (keys only), and the
  // index of each in the feature's unique rows. The partitions' probes point into `keys`.
  std::vector<std::vector<UniqueKeys>> keys;
  std::vector<std::vector<std::vector<std::uint32_t>>> rows;
};

/// A plan with global slot numbers (the PoolPlan part), and what retire() needs of each partition.
struct PartitionedPlan : PoolPlan {
  std::vector<PoolPlan> partitions;  ///< S > 1: per partition, in its own slot numbers
};

class PartitionedPlanner {
 public:
  /// Slots one partition (a CachePlanner: 32-bit slot numbers inside) holds at most.
  static constexpr std::int64_t kMaxPartitionSlots = std::int64_t{1} << 30;

  /// A pool of `options.slots` slots in `partitions` partitions (1 <= partitions <= slots; a table's cap, when
  /// it has one, at least `partitions`): check with validate() first.
  PartitionedPlanner(const CachePlannerOptions& options, int partitions);

  /// Why `options` cannot be split into `partitions` partitions, naming the pool, the table and the
  /// numbers; OK when it can.
  static Status validate(const CachePlannerOptions& options, int partitions);

  const CachePlannerOptions& options() const noexcept { return opt_; }
  int partitions() const noexcept { return static_cast<int>(partitions_.size()); }

  /// Rows of a batch that no cache slot can take even when nothing is pinned: beyond a partition's
  /// slots, or beyond a table's cap in a partition. A batch with none is refused by probe() (without
  /// bypass) only while rows pinned by batches in flight crowd it out; one with some is planned with
  /// bypass (at least these rows go to overflow slots). No state change.
  std::int64_t rows_beyond(const std::vector<FeatureKeys>& features) const;

  /// As CachePlanner's, split by partition.
  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& features);
  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features);
  /// As CachePlanner::probe, in every partition; the first partition that refuses the batch (lowest number)
  /// gives the error. No state change.
  Result<PartitionedProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& features, bool bypass = false) const;
  /// As CachePlanner::commit, in every partition; the plan's lists go partition by partition.
  PartitionedPlan commit(PartitionedProbe probe);
  /// As CachePlanner::retire.
  void retire(const PartitionedPlan& plan, bool updated);
  /// As CachePlanner's (global slots, partition by partition).
  std::vector<Transfer> dirty() const;
  void mark_clean(const std::vector<Transfer>& rows);
  /// As CachePlanner::invalidate_table.
  void invalidate_table(int table);
  /// As CachePlanner::drop_rows.
  void drop_rows(int table, const std::vector<Key>& rows);

  std::int64_t resident() const noexcept;
  std::int64_t pinned() const noexcept;
  std::int64_t overflow_rows() const noexcept;
  /// Whether (table, row) is resident; its (global) slot or -1.
  std::int64_t slot_of(int table, Key row) const noexcept;
  CacheStats table_stats(int table) const;
  CacheStats pool_stats() const;

 private:
  // The partition of a cache key's hash: its top 32 bits (the index tag: uniform) scaled to [0, S).
  std::size_t partition_of(std::uint64_t hash) const noexcept {
    return static_cast<std::size_t>(((hash >> 32) * partitions_.size()) >> 32);
  }
  // The rows of each feature that hash to partition `s`: into `keys` (and, when given, their indexes
  // in the feature's unique rows into `rows`). Touches only these and the features: one task per
  // partition runs it, each on its own buffers.
  void split(const std::vector<FeatureKeys>& features, std::size_t s, std::vector<UniqueKeys>& keys,
             std::vector<std::vector<std::uint32_t>>* rows) const;
  std::vector<FeatureKeys> partition_features(const std::vector<FeatureKeys>& features,
                                              const std::vector<UniqueKeys>& keys) const;
  // The global number of partition s's slot `local` (a cache or an overflow slot).
  Key global_slot(std::size_t s, Key local) const noexcept {
    const std::int64_t n = partitions_[s]->options().slots;
    return local < n ? offset_[s] + local
                     : opt_.slots + (local - n) * static_cast<std::int64_t>(partitions_.size()) + static_cast<Key>(s);
  }
  // Appends `from` to `to` with partition s's slots made global.
  void append_global(const std::vector<Transfer>& from, std::size_t s, std::vector<Transfer>& to) const;

  CachePlannerOptions opt_;
  std::vector<std::unique_ptr<CachePlanner>> partitions_;
  std::vector<std::int64_t> offset_;                  // per partition: its first global slot
  std::vector<std::vector<UniqueKeys>> window_keys_;  // per partition: window_push/window_drop scratch
};

}  // namespace strata::cache
