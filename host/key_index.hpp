#pragma once
// KeyIndex: a dynamic table's key -> row map with the rules that store/detail/dynamic_keys.hpp
// states (admission through a count-min sketch, TTL expiry, LRU or LFU eviction, pins of rows in
// flight); the reference store restates them. Host memory only; not thread-safe (one caller at a
// time).
//
// Data structures (per row of capacity, `bytes()` reports the total):
// - Hash index: open addressing with linear probing over ceil(capacity * 5 / 4) 8-byte slots (load
//   <= 0.8), a slot = (32 high bits of the key's hash, row). The home slot is derived from the
//   stored hash bits, so a deletion shifts the following entries back (no tombstones) without
//   touching the rows' keys; a probe reads a row's key only when the hash bits match.
// - Row metadata in one 32-byte record per row (key, last use, count, LRU links): a hit verifies
//   the key and touches the row on one cache line. Pin counts in a 32-bit array of their own.
// - Exact LRU order: an intrusive doubly linked list of rows by touch (a batch touches its rows in
//   first-use order at the tail), so last uses never decrease from the head; TTL expiry walks the
//   prefix with T - last use > S from the head, the eviction victim is the first unpinned row.
// - LFU (eviction kLfu only): frequency buckets. A second intrusive list holds the rows ordered by
//   (count, touch), and an ordered map count -> last row of that count's bucket. A touched row
//   goes to the tail of its new count's bucket, which keeps each bucket in LRU order because the
//   row is the latest touched; the victim is the list's first unpinned row. O(log distinct counts)
//   per touch, memory 8 bytes per row plus a map node per distinct count (a std::set of (count,
//   touch stamp, row) would cost ~56 bytes per row and a stamp per row besides).
// - Free rows: a hierarchical bitset (1 bit per row, one summary bit per 64 below it), the lowest
//   free row in O(log64 capacity).
// - Admission (admit_after > 1 only): host/admission_sketch.hpp, the sketch the reference store
//   uses too. A rowless key is admitted iff estimate (before the batch) + uses >= admit_after; after
//   the batch's admissions every key that had no row adds its uses, then the sketch ages once.
//   admit_after <= 1 admits every key and keeps no sketch (no memory).
// Counts are int64, saturating at INT64_MAX. Rows are 32-bit inside: capacity <= kMaxDynamicCapacity
// (core/dynamic_spec.hpp), so ceil(capacity * 5 / 4) slots stay addressable by 32 hash bits.

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/dynamic_spec.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "host/admission_sketch.hpp"

namespace strata {

/// A dynamic table's key index (see the top of this file). Copyable (a deep copy). Not
/// thread-safe.
class KeyIndex {
 public:
  /// The row of a key without one.
  static constexpr std::int64_t kNone = -1;
  /// The largest clock restore() takes (training submits can never reach it; past it they would overflow).
  static constexpr std::int64_t kMaxClock = std::int64_t{1} << 62;

  /// An empty index of `capacity` rows, 1 <= capacity <= kMaxDynamicCapacity (the caller validates
  /// it; outside aborts), under `spec`'s admission and eviction rules.
  KeyIndex(std::int64_t capacity, const DynamicSpec& spec);

  /// A training batch at clock()+1: `keys` are its distinct keys in first-use order, uses[i] >= 1
  /// their occurrences. Applies the rules (hits, admission via the sketch, TTL expiry, eviction by
  /// policy, pins) and advances the clock; rows[i] = the key's row or kNone (not admitted), each
  /// row pinned until release(rows); `created` gets (row, key) of each key admitted now, in
  /// first-use order (the caller initializes those rows). When the admitted keys outnumber the
  /// free and unpinned rows (rows pinned by earlier batches not released, and this batch's own
  /// rows, are never evicted) it returns ResourceExhausted saying how many rows were needed, free,
  /// evictable and pinned, and the capacity, and changes nothing at all (not the sketch, not the
  /// clock); rows is then all kNone and created empty. Keys repeated in `keys` are a programmer
  /// error (a repeated new key aborts), as are uses below 1 and sizes that differ (abort).
  Status train(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses, std::vector<std::int64_t>& rows,
               std::vector<std::pair<std::int64_t, Key>>& created);

  /// What train(keys, uses, ...) would return now, changing nothing (OK: it would apply), so that
  /// a caller can check every table before it trains any. A train() of the same keys right after
  /// (no train, find or restore between) reuses its lookups, and with the same uses and no release
  /// between its decision too.
  Status check(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses);

  /// An evaluation batch: rows[i] = the row of keys[i] or kNone (keys may repeat); the found rows
  /// are pinned (once per occurrence); nothing else changes (no clock, counts, sketch, LRU order)
  /// but counts().unseen.
  void find(const std::vector<Key>& keys, std::vector<std::int64_t>& rows);
  /// find() of distinct keys with their uses (counts().unseen adds the uses of the keys not found).
  void find(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses, std::vector<std::int64_t>& rows);

  /// Unpins the rows one train() or find() returned (kNone entries skipped). Rows pinned by several
  /// batches stay pinned until each released them. Releasing a row not pinned aborts.
  void release(const std::vector<std::int64_t>& rows);

  /// Takes rows in use back from their keys, which then have none (as if never admitted): for a
  /// caller that could not write the rows train() gave new keys. counts() stay. A row free or
  /// pinned aborts.
  void forget(const std::vector<std::int64_t>& rows);

  /// The clock: training batches applied (the last one's clock).
  std::int64_t clock() const noexcept { return clock_; }
  /// Rows in all.
  std::int64_t capacity() const noexcept { return capacity_; }
  /// Rows in use.
  std::int64_t size() const noexcept { return size_; }
  /// Rows pinned by batches not released.
  std::int64_t pinned() const noexcept { return pinned_rows_; }

  /// The row of a key or kNone (no pin, no change). For read_rows-like lookups.
  std::int64_t row_of(Key key) const;

  /// What the index did since it was made (restore() keeps them).
  struct Counts {
    std::int64_t admissions = 0;    ///< keys given a row
    std::int64_t evictions = 0;     ///< rows taken from a key by the eviction policy
    std::int64_t expirations = 0;   ///< rows freed by the TTL
    std::int64_t not_admitted = 0;  ///< uses of keys train() left without a row
    std::int64_t unseen = 0;        ///< uses in find() of keys without a row
  };
  Counts counts() const noexcept { return counts_; }

  /// Host memory the index holds (hash table, per-row metadata, LFU buckets, free rows, sketch).
  std::int64_t bytes() const noexcept;

  /// One row in use, for checkpoints.
  struct Entry {
    Key key;
    std::int64_t row, last_use, count;
    bool operator==(const Entry& o) const {
      return key == o.key && row == o.row && last_use == o.last_use && count == o.count;
    }
  };
  /// Every row in use in the eviction tie order (the row touched earliest first).
  std::vector<Entry> entries() const;
  /// The admission sketch's state (AdmissionSketch::state()). Empty when admit_after <= 1 (no
  /// sketch kept).
  std::vector<std::uint8_t> sketch_state() const;
  /// Size of sketch_state() (0 without a sketch).
  std::int64_t sketch_state_bytes() const noexcept;

  /// Replaces the clock, the rows and the sketch (counts() stay). No row may be pinned
  /// (FailedPrecondition otherwise). `entries` in the order entries() gives: rows distinct in
  /// [0, capacity), keys distinct, 0 <= last_use <= clock and not decreasing, count >= 1; the
  /// sketch empty (a zeroed sketch) or of sketch_state_bytes() with its uses added below 10 x its
  /// width. InvalidArgument naming the bad entry or field otherwise, nothing changed.
  Status restore(std::int64_t clock, const std::vector<Entry>& entries, const std::vector<std::uint8_t>& sketch);

 private:
  static constexpr std::uint32_t kNil = 0xFFFFFFFFu;

  struct Slot {
    std::uint32_t hash;  // high 32 bits of the key's hash
    std::uint32_t row;   // kNil: empty
  };
  struct alignas(32) Meta {
    Key key;
    std::int64_t last_use;
    std::int64_t count;
    std::uint32_t prev, next;  // LRU list
  };
  struct Links {
    std::uint32_t prev, next;
  };

  /// A hierarchical bitset of free rows: the lowest in O(log64 n).
  class FreeRows {
   public:
    explicit FreeRows(std::int64_t n);
    void set(std::int64_t i);
    void clear(std::int64_t i);
    bool test(std::int64_t i) const;
    std::int64_t lowest() const;  // kNone when none
    std::int64_t bytes() const noexcept;

   private:
    std::vector<std::vector<std::uint64_t>> levels_;  // [0]: a bit per row, each above: a bit per word below
  };

  // The allocator of the per-row arrays: cache-line aligned, and those of 2 MiB and more on transparent huge pages
  // (madvise), since a batch reads them at random (a TLB miss a key on 4 KiB pages).
  template <class T>
  struct RowAlloc {
    using value_type = T;
    RowAlloc() = default;
    template <class U>
    RowAlloc(const RowAlloc<U>&) noexcept {}  // NOLINT(google-explicit-constructor): allocators convert
    T* allocate(std::size_t n) {
      static_assert(alignof(T) <= 64, "allocate_bytes aligns to cache lines");
      return static_cast<T*>(allocate_bytes(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept { free_bytes(p, n * sizeof(T)); }
    bool operator==(const RowAlloc&) const noexcept { return true; }
    bool operator!=(const RowAlloc&) const noexcept { return false; }
  };
  template <class T>
  using RowVector = std::vector<T, RowAlloc<T>>;
  static void* allocate_bytes(std::size_t bytes);
  static void free_bytes(void* p, std::size_t bytes) noexcept;

  static std::uint32_t key_hash(Key key) noexcept;
  std::uint64_t home(std::uint32_t hash) const noexcept;
  std::uint64_t next_slot(std::uint64_t slot) const noexcept { return slot + 1 == slots_.size() ? 0 : slot + 1; }
  std::int64_t find_slot(Key key, std::uint32_t hash) const;                   // kNone when absent
  void lookup(const std::vector<Key>& keys, std::vector<std::int64_t>& rows);  // fills hashes_ too
  void insert_slot(Key key, std::uint32_t hash, std::uint32_t row);
  void erase_slot(std::int64_t slot);

  void lru_unlink(std::uint32_t row);
  void lru_append(std::uint32_t row);
  void lfu_unlink(std::uint32_t row);
  void lfu_insert(std::uint32_t row);
  void remove_row(std::uint32_t row, std::uint32_t hash);  // out of the hash, the lists; into the free rows
  void pin(std::uint32_t row);

  bool admits(Key key, std::int64_t uses) const;  // a key without a row, now
  // kinds_ and the decided_ counts of a batch of looked-up rows, changing nothing else.
  void decide(const std::vector<Key>& keys, const std::vector<std::int64_t>& uses,
              const std::vector<std::int64_t>& rows);
  Status room(std::int64_t admitted, std::int64_t hits_pinned_now) const;
  void pin_found(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>* uses);

  std::int64_t capacity_;
  DynamicSpec spec_;
  std::int64_t clock_ = 0;
  std::int64_t size_ = 0;
  std::int64_t pinned_rows_ = 0;
  Counts counts_;

  RowVector<Slot> slots_;
  RowVector<Meta> meta_;
  RowVector<std::uint32_t> pins_;
  std::uint32_t lru_head_ = kNil, lru_tail_ = kNil;
  RowVector<Links> lfu_;  // kLfu only
  std::uint32_t lfu_head_ = kNil, lfu_tail_ = kNil;
  std::map<std::int64_t, std::uint32_t> buckets_;  // count -> last row with it in the LFU list
  FreeRows free_;

  bool sketched_;           // admit_after > 1
  AdmissionSketch sketch_;  // empty unless sketched_

  // Scratch reused across batches (not state).
  std::vector<std::uint32_t> hashes_;
  std::vector<std::uint8_t> kinds_;    // per key of a train(): hit, admitted, not admitted
  std::vector<std::uint32_t> admits_;  // the admitted keys' positions
  struct Victim {
    std::uint32_t row, hash;
  };
  std::vector<Victim> victims_;  // the rows the admissions evict, in order
  // The last check()'s keys and rows (hashes_ holds their hashes), while checked_ says they are current.
  std::vector<Key> checked_keys_;
  std::vector<std::int64_t> checked_rows_;
  bool checked_ = false;
  // The last decide()'s admissions and hit rows no earlier batch pins, while decided_ says kinds_ and they are current
  // for checked_keys_ with checked_uses_ (a check() followed by no lookup or release).
  std::vector<std::int64_t> checked_uses_;
  std::int64_t decided_admitted_ = 0;
  std::int64_t decided_hits_pinned_now_ = 0;
  bool decided_ = false;
};

}  // namespace strata
