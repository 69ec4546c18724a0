#pragma once
// CachePool: the host-side brain of one HBM slot pool. Tables of the same (dim, state_dim) share a
// pool, so hot rows of every table compete for the same slots ("flat" cache), with an optional
// per-table cap. The pool keeps the key->slot index, the replacement policy, pins (a slot used by a
// batch that has been planned but not yet retired is never evicted), dirty flags, and statistics.
// It moves no data: plan() returns which rows to write back and which to fill, and the prefetch
// pipeline (cache/pipeline.hpp) executes that on the device.
//
// Planning is two-phase so a batch touching several pools is all-or-nothing: probe() every pool
// (no state change; errors name the table and the numbers), then commit() each probe.
// Not thread-safe: the store's driving thread owns it.

#include <cstdint>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/detail/key_map.hpp"
#include "cache/policy.hpp"
#include "core/status.hpp"
#include "host/dedup.hpp"

namespace strata::cache {

/// Counters of a table or a pool.
struct CacheStats {
  std::int64_t accesses = 0;    ///< unique (batch, row) lookups planned
  std::int64_t hits = 0;        ///< of which already resident
  std::int64_t misses = 0;      ///< of which filled from the host
  std::int64_t evictions = 0;   ///< resident rows dropped to make room
  std::int64_t writebacks = 0;  ///< dirty rows copied back to the host (evictions and flushes)
  std::int64_t bytes_filled = 0;       ///< record bytes moved host -> device
  std::int64_t bytes_written_back = 0; ///< record bytes moved device -> host
  double hit_rate() const noexcept { return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0; }
  CacheStats& operator+=(const CacheStats& o) noexcept;
  CacheStats& operator-=(const CacheStats& o) noexcept;
};

/// One table served by a pool.
struct PoolTable {
  std::string name;          ///< for error messages
  std::int64_t cap = 0;      ///< max slots this table may hold (0: no cap)
};

/// Shape and policy of a pool.
struct CachePoolOptions {
  std::int64_t slots = 0;           ///< capacity in rows (> 0)
  Policy policy = Policy::kLru;     ///< replacement policy
  std::int64_t record_bytes = 0;    ///< bytes per slot record (weights + state), for the byte counters
  std::string name;                 ///< e.g. "dim 64" for messages
  std::vector<PoolTable> tables;    ///< tables of the pool; FeatureKeys::table indexes this
};

/// One table's deduplicated keys in a batch.
struct FeatureKeys {
  int table = 0;                      ///< index into CachePoolOptions::tables
  const UniqueKeys* unique = nullptr; ///< the feature's unique rows (host), alive during the call
};

/// A row moving between a slot and the host table.
struct Transfer {
  Key slot = 0;
  int table = 0;  ///< pool-local table index
  Key row = 0;
};

/// The result of planning one batch in one pool.
struct PoolPlan {
  std::int64_t seq = 0;                          ///< the batch's sequence number
  std::vector<std::vector<Key>> unique_slots;    ///< per feature: slot of each unique row (same order)
  std::vector<Transfer> writebacks;              ///< dirty victims: copy slot -> host before the fills
  std::vector<Transfer> fills;                   ///< misses: copy host -> slot
  std::int64_t hits = 0, misses = 0;
};

/// What probe() found; consumed by commit(). Valid only until the pool changes.
struct PoolProbe {
  std::int64_t seq = 0;
  std::vector<FeatureKeys> features;
  std::vector<std::vector<std::int64_t>> found;  ///< per feature, per unique row: slot or -1
};

class CachePool {
 public:
  explicit CachePool(CachePoolOptions options);

  const CachePoolOptions& options() const noexcept { return opt_; }

  /// Adds a submitted batch to the lookahead window (only the lookahead policy uses it). Call in
  /// submission order, before the batch is probed.
  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& features);
  /// Removes a batch from the window without planning it (discarded before planning).
  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features);

  /// Looks up every unique row and checks that the batch fits: its unique rows of each table fit
  /// the table's cap and the pool, and its misses fit the slots that are not pinned by batches in
  /// flight. No state change.
  Result<PoolProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& features) const;
  /// Applies a probe: pins hits, chooses victims by policy, assigns slots to misses.
  PoolPlan commit(PoolProbe probe);
  /// The batch is done (backward or discard): unpins its slots, marking them dirty when `updated`.
  void retire(const PoolPlan& plan, bool updated);

  /// Every dirty resident row, marked clean (the caller writes them back).
  std::vector<Transfer> take_dirty();
  /// Drops every resident row of `table` (none may be pinned or dirty: flush first).
  void invalidate_table(int table);

  /// Resident rows, pinned slots.
  std::int64_t resident() const noexcept { return resident_; }
  std::int64_t pinned() const noexcept { return pinned_total_; }
  /// Whether (table, row) is resident; its slot or -1.
  std::int64_t slot_of(int table, Key row) const noexcept;
  const CacheStats& table_stats(int table) const { return stats_[static_cast<std::size_t>(table)]; }
  CacheStats pool_stats() const;

 private:
  struct Slot {
    std::uint64_t key = detail::KeyMap::kEmpty;  // cache key (table, row)
    std::uint64_t score = 0;                      // policy score; lower is evicted first
    std::uint32_t freq = 0;
    std::uint64_t last = 0;                      // tick of the last use
    std::int32_t pins = 0;
    std::int32_t table = -1;
    bool dirty = false;
  };
  struct HeapEntry {
    std::uint64_t score;
    std::int64_t slot;
    bool operator>(const HeapEntry& o) const noexcept { return score > o.score || (score == o.score && slot > o.slot); }
  };
  using MinHeap = std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<HeapEntry>>;

  static std::uint64_t cache_key(int table, Key row) noexcept {
    return (static_cast<std::uint64_t>(table) << 48) | static_cast<std::uint64_t>(row);
  }
  std::int64_t next_use(std::uint64_t key) const noexcept;
  std::uint64_t score_of(const Slot& s) const noexcept;
  void make_evictable(std::int64_t slot);
  bool clean_top(MinHeap& h);
  std::int64_t take_victim(int table);
  void maybe_compact();

  CachePoolOptions opt_;
  detail::KeyMap index_;
  std::vector<Slot> slots_;
  std::vector<std::int64_t> free_;
  std::vector<MinHeap> heaps_;             // per table: unpinned resident slots (lazy)
  std::vector<std::int64_t> table_count_;  // resident slots per table
  std::vector<std::int64_t> table_pinned_; // pinned slots per table
  std::int64_t resident_ = 0, pinned_total_ = 0;
  std::uint64_t tick_ = 0;
  std::int64_t heap_entries_ = 0;
  std::vector<CacheStats> stats_;
  // Lookahead window: cache key -> ascending sequence numbers of its future uses.
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> future_;
};

/// Expands per-unique slots to per-lookup slots: out[positions[p]] = unique_slots[u] (CSR of `u`).
///   out: (u.positions.size()) host memory.
void expand_slots(const UniqueKeys& u, const std::vector<Key>& unique_slots, Key* out);

}  // namespace strata::cache
