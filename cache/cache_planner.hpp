#pragma once
// CachePlanner: the host-side brain of one HBM slot pool. Tables of the same record shape (dim,
// state_dim and element types: core/record_layout.hpp) share a pool, so hot rows of every table
// compete for the same slots ("flat" cache), with an optional per-table cap. The pool keeps the
// key->slot index, the replacement policy, pins (a slot used by a batch that has been planned but
// not yet retired is never evicted), dirty flags, and statistics. It moves no data: commit()
// returns which rows to write back and which to fill. cache::Prefetcher
// (cache/prefetcher.hpp) drives the pools, and the store's cached engine executes its plans on the
// device.
//
// Planning is two-phase so a batch touching several pools is all-or-nothing: probe() every pool
// (no state change; errors name the table and the numbers), then commit() each probe.
//
// Rows that do not fit (bypass): a probe asked to bypass never refuses a batch. The misses that fit
// the free and evictable slots (and each table's cap) are filled into cache slots as usual; the
// others get overflow slots, numbered from options().slots on: device memory outside the cache
// (gpu::SlotPool::overflow) that holds the row only while batches in flight use it. An overflow row
// is in the pool's index like a resident one, so a later batch using it pins it too (a hit: one
// copy of the row on the device, updated by each backward in call order); it is never a victim and
// never dirty: the executor writes a batch's overflow rows back to the host after its backward
// (PoolPlan::overflow), and the row leaves when its last pin goes. So a cache of any size trains
// batches of any size (FBGEMM likewise leaves rows that do not fit in host memory).
// Batches are usually planned in sequence order; they may be planned in another order (a batch
// submitted without a preview while previews are in the window gets a higher number than theirs
// but is planned first): every decision stays valid, the window just ranks that batch's rows as if
// it came after the previews.
// Not thread-safe: the store's driving thread owns it.
//
// Cost: probe, commit and retire are O(1) amortized per unique row (hash lookups and FIFO queues;
// see cache/detail/eviction_order.hpp; lookahead adds one sketch line per row and a winner-tree
// pass of 6 compares per victim), window_push/window_drop O(1) per row plus the row's uses in the
// window beyond the reach of its mask (CachePlannerOptions::window batches, at least 64).

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_stats.hpp"
#include "cache/detail/eviction_order.hpp"
#include "cache/detail/frequency_sketch.hpp"
#include "cache/detail/key_map.hpp"
#include "cache/detail/window_map.hpp"
#include "cache/policy.hpp"
#include "core/status.hpp"
#include "host/dedup.hpp"

namespace strata::cache {

/// One table served by a pool.
struct PoolTable {
  std::string name;      ///< for error messages
  std::int64_t cap = 0;  ///< max slots this table may hold (0: no cap)
};

/// Shape and policy of a pool.
struct CachePlannerOptions {
  std::int64_t slots = 0;         ///< capacity in rows (> 0)
  Policy policy = Policy::kLru;   ///< replacement policy
  std::int64_t record_bytes = 0;  ///< bytes per slot record (weights + state), for the byte counters
  std::string name;               ///< e.g. "dim 64" for messages
  std::vector<PoolTable> tables;  ///< tables of the pool; FeatureKeys::table indexes this
  /// lookahead: half-life, in unique rows planned, of the frequency that ranks rows with no use in
  /// the window (cache/policy.hpp); 0: kDefaultHalfLifeSlots x slots.
  std::int64_t half_life = 0;
  /// lookahead: batches the window holds at most (submitted ahead + previewed + the one planned),
  /// so that each key's uses in it stay in its window entry's mask (detail/window_map.hpp; masks
  /// reach 320 batches at most); a deeper window still works, slower. 0: 64.
  std::int64_t window = 0;
};

/// Default half-life of the lookahead policy's frequency, in multiples of the pool's slots.
inline constexpr std::int64_t kDefaultHalfLifeSlots = 16;

/// One table's deduplicated keys in a batch.
struct FeatureKeys {
  int table = 0;                       ///< index into CachePlannerOptions::tables
  const UniqueKeys* unique = nullptr;  ///< the feature's unique rows (host), alive during the call
};

/// A row moving between a slot and the host table.
struct Transfer {
  Key slot = 0;
  int table = 0;  ///< pool-local table index
  Key row = 0;
};

/// The result of planning one batch in one pool.
struct PoolPlan {
  std::int64_t seq = 0;                        ///< the batch's sequence number
  std::vector<std::vector<Key>> unique_slots;  ///< per feature: slot of each unique row (same order)
  std::vector<Transfer> writebacks;            ///< dirty victims: copy slot -> host before the fills
  std::vector<Transfer> fills;                 ///< misses: copy host -> slot (overflow slots included)
  /// The batch's rows in overflow slots (bypassed now, or by a batch in flight): copy slot -> host
  /// after the batch's backward (not after a discard).
  std::vector<Transfer> overflow;
  std::int64_t hits = 0, misses = 0;
};

/// What probe() found; consumed by commit(). Valid only until the pool changes.
struct PoolProbe {
  std::int64_t seq = 0;
  std::vector<FeatureKeys> features;
  /// Per feature, per unique row: its slot (a cache or an overflow slot), or kMiss (to fill into a
  /// cache slot) or kBypass (to fill into an overflow slot).
  std::vector<std::vector<std::int64_t>> found;
  /// Overflow records the pool needs once this is committed: its overflow slots stay below
  /// options().slots + overflow_records.
  std::int64_t overflow_records = 0;
  bool overflow = false;  ///< some row is or will be in an overflow slot
  static constexpr std::int64_t kMiss = -1, kBypass = -2;
};

// Cache-line aligned: the pools of a PartitionedPlanner are planned on different cores, and the counters
// every call writes (in the object) must not share a line with a neighbouring pool's.
class alignas(64) CachePlanner {
 public:
  explicit CachePlanner(CachePlannerOptions options);

  const CachePlannerOptions& options() const noexcept { return opt_; }

  /// Adds a batch to the lookahead window (only the lookahead policy uses it): a submitted batch,
  /// or the keys of one to be submitted later (a preview). Sequence numbers order the window: a
  /// batch with a lower `seq` is taken to be planned earlier. Push before the batch is probed,
  /// usually in increasing `seq` (cheapest); a lower `seq` than batches already pushed is allowed
  /// (e.g. a preview replaced by the keys actually submitted). A (seq, row) pair is pushed at most
  /// once while it is in the window; each table appears in at most one of `features`. Only ranks
  /// change: no row is pinned, filled or evicted.
  void window_push(std::int64_t seq, const std::vector<FeatureKeys>& features);
  /// Removes a batch from the window without planning it (discarded before planning, or a preview
  /// that will not be submitted). `features` as pushed.
  void window_drop(std::int64_t seq, const std::vector<FeatureKeys>& features);

  /// Looks up every unique row and checks that the batch fits: its unique rows of each table fit
  /// the table's cap and the pool, and its misses fit the slots that are not pinned by batches in
  /// flight. With `bypass`, a batch always fits: the misses beyond that room (the first ones in
  /// feature and row order fill the room) go to overflow slots (see the top of this file). No
  /// state change. Each table appears in at most one of `features`.
  Result<PoolProbe> probe(std::int64_t seq, const std::vector<FeatureKeys>& features, bool bypass = false) const;
  /// Applies a probe: pins hits, chooses victims by policy, assigns slots to misses (overflow slots
  /// to the misses the probe bypassed).
  PoolPlan commit(PoolProbe probe);
  /// The batch is done (backward or discard): unpins its slots, marking them dirty when `updated`;
  /// an overflow row leaves with its last pin (counted as written back when `updated`: the
  /// executor writes PoolPlan::overflow back after the backward).
  void retire(const PoolPlan& plan, bool updated);

  /// Every dirty resident row, in slot order; they stay dirty until mark_clean().
  std::vector<Transfer> dirty() const;
  /// Rows of dirty() whose write-back has completed: marks them clean and counts the write-backs.
  /// Call before the pool plans again (their slots must still hold them).
  void mark_clean(const std::vector<Transfer>& rows);
  /// Drops every resident row of `table` (none may be pinned or dirty: flush first).
  void invalidate_table(int table);
  /// Drops `rows` of `table` where resident, dirty ones too: their contents are discarded, not written back (a dynamic
  /// table's rows given to new keys, whose host rows are then rewritten). None may be pinned (aborts).
  void drop_rows(int table, const std::vector<Key>& rows);

  /// Resident rows, pinned slots (of the cache: overflow rows are not counted).
  std::int64_t resident() const noexcept { return resident_; }
  std::int64_t pinned() const noexcept { return pinned_total_; }
  /// Rows in overflow slots (used by batches in flight).
  std::int64_t overflow_rows() const noexcept { return static_cast<std::int64_t>(overflow_index_.size()); }
  /// Whether (table, row) is resident in the cache; its slot or -1 (also for an overflow row).
  std::int64_t slot_of(int table, Key row) const noexcept;
  const CacheStats& table_stats(int table) const { return table_[static_cast<std::size_t>(table)].stats; }
  CacheStats pool_stats() const;

  /// The key the pool's index keeps (table, row) under (table in the top 16 bits).
  static std::uint64_t cache_key(int table, Key row) noexcept {
    return (static_cast<std::uint64_t>(table) << 48) | static_cast<std::uint64_t>(row);
  }

 private:
  // A slot's record: 32 bytes, two to a cache line. Looking up, pinning, evicting or retiring a
  // slot touches this record only (plus the dense version_).
  struct alignas(32) Slot {
    static constexpr std::uint32_t kDirty = 0x80000000u;  // in `state`
    std::uint64_t key = detail::KeyMap::kEmpty;           // cache key (table, row); kEmpty when free
    std::uint64_t last = 0;                               // tick of the last use
    std::int64_t next_use = detail::WindowMap::kNone;     // lookahead: first use of the row in the window
    std::uint32_t freq = 0;                               // uses while resident (lookahead: and its level)
    std::uint32_t state = 0;                              // pins (batches planned, not retired, using it), dirty bit
    std::uint32_t pins() const noexcept { return state & ~kDirty; }
    bool dirty() const noexcept { return (state & kDirty) != 0; }
    std::size_t table() const noexcept { return static_cast<std::size_t>(key >> 48); }  // of a resident row
  };

  static const Slot kFreeSlot;  // stands in for the record of an absent row in branch-free code

  static Key row_of(std::uint64_t key) noexcept { return static_cast<Key>(key & ((std::uint64_t{1} << 48) - 1)); }
  // The index's callable confirming a candidate slot's key (kEmpty for slot -1, without a branch).
  struct KeyOf {
    const Slot* slots;
    std::uint64_t operator()(std::int32_t slot) const noexcept { return (slot >= 0 ? &slots[slot] : &kFreeSlot)->key; }
  };
  KeyOf key_of() const noexcept { return {slots_.data()}; }
  // lookahead keeps a slot's frequency level (detail::FrequencySketch, as of its last use) in the
  // top 8 bits of `freq` and its uses while resident (saturating) in the low 24.
  static constexpr std::uint32_t kUsesMask = (1u << 24) - 1;
  // The bucket of a ranked slot (cache/detail/eviction_order.hpp): 0 for lru, its uses (capped)
  // for lfu, its frequency level for lookahead.
  std::uint32_t ranked_bucket(const Slot& s) const noexcept {
    if (opt_.policy == Policy::kLru) return 0;
    if (opt_.policy == Policy::kLookahead) return s.freq >> 24;
    return std::min<std::uint32_t>(s.freq, (1u << 23) - 1);
  }
  void pin(Slot& s, std::int64_t slot);
  void enter_order(std::int64_t slot);
  std::int64_t take_victim(int table);

  CachePlannerOptions opt_;
  detail::KeyMap index_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> version_;  // per slot: bumped when it leaves the eviction order or is re-queued
  std::vector<std::int64_t> free_;
  detail::EvictionOrder order_;                     // every evictable slot
  std::vector<detail::EvictionOrder> table_order_;  // per table: its evictable slots (kept for tables with a cap)
  bool any_cap_ = false;                            // some table has a cap
  // Per table: its statistics, resident slots (exact only when any_cap_) and pinned slots. A cache
  // line or two of its own each (written on every pin), so that pools planned on different cores
  // (PartitionedPlanner) never write the same line.
  struct alignas(64) TableState {
    CacheStats stats;
    std::int64_t count = 0;
    std::int64_t pinned = 0;
  };
  std::vector<TableState> table_;
  std::int64_t resident_ = 0, pinned_total_ = 0;
  std::uint64_t tick_ = 0;
  detail::WindowMap window_;        // lookahead: uses of each key in the window
  detail::FrequencySketch sketch_;  // lookahead: recent use frequency of every key, resident or not
  struct Miss {
    std::uint64_t key;      // cache key of the row to fill
    std::int64_t slot;      // its slot
    std::uint32_t feature;  // index into the probe's features
    std::uint32_t u;        // index into the feature's unique rows
  };
  std::vector<Miss> misses_;  // commit() scratch
  struct First {
    std::uint64_t hash;  // of the row's cache key
    std::uint32_t u;     // index into the feature's unique rows
  };
  std::vector<First> first_;             // window_push() scratch: rows with no use in the window before
  std::vector<std::uint32_t> hit_rows_;  // commit() scratch

  // Overflow slots (bypass): slot opt_.slots + i is overflow_[i]. Apart from the cache's index and
  // records: rare, and never ranked. Emptied (numbers start again from 0) when the last one leaves.
  struct OverflowSlot {
    std::uint64_t key = detail::KeyMap::kEmpty;  // cache key (table, row); kEmpty when free
    std::uint32_t pins = 0;
  };
  std::int64_t overflow_slot_of(std::uint64_t key) const noexcept {
    const auto it = overflow_index_.find(key);
    return it == overflow_index_.end() ? -1 : opt_.slots + it->second;
  }
  void bypass_misses(PoolProbe& p, const std::vector<std::int64_t>& misses,
                     const std::vector<std::int64_t>& hits_unpinned) const;
  void commit_overflow(PoolProbe& probe, PoolPlan& plan);
  void retire_slow(const PoolPlan& plan, bool updated);
  std::vector<OverflowSlot> overflow_;
  std::vector<std::int64_t> overflow_free_;                         // indexes into overflow_
  std::unordered_map<std::uint64_t, std::int64_t> overflow_index_;  // cache key -> index into overflow_
};

/// Expands per-unique slots to per-lookup slots: out[positions[p]] = unique_slots[u] (CSR of `u`).
///   out: (u.positions.size()) host memory.
void expand_slots(const UniqueKeys& u, const std::vector<Key>& unique_slots, Key* out);

}  // namespace strata::cache
