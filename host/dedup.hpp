#pragma once
// Dedup of one table's keys for a batch: the unique keys (in first-use order unless asked
// otherwise) and, for each unique key, the positions where it is used (ascending), as a CSR.
// Backward reduces gradients per unique row from this; the cache planner probes only unique keys.

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// Result of dedup_keys. Positions index the original key array.
struct UniqueKeys {
  std::vector<Key> keys;                ///< (U) unique keys (in order of first use for kFirstUse)
  std::vector<std::int64_t> offsets;    ///< (U + 1) CSR offsets into `positions`
  std::vector<std::int32_t> positions;  ///< (n) key positions grouped by unique key, ascending within each

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(keys.size()); }
};

/// A non-owning view of a UniqueKeys (or of the same arrays elsewhere, e.g. a device slot plan
/// whose "keys" are slot numbers).
struct UniqueView {
  const Key* keys = nullptr;                ///< (size) unique keys (or slots)
  const std::int64_t* offsets = nullptr;    ///< (size + 1) CSR offsets into positions
  const std::int32_t* positions = nullptr;  ///< (offsets[size]) key positions, ascending within each
  std::int64_t size = 0;
};

/// View of a UniqueKeys (valid while it lives and is not modified).
inline UniqueView view_of(const UniqueKeys& u) noexcept {
  return {u.keys.data(), u.offsets.data(), u.positions.data(), u.size()};
}

/// Key counts from which dedup_keys(..., DedupOrder::kAny) works in parallel (below it the
/// partitioning costs more than the second thread saves).
inline constexpr std::int64_t kDedupParallelFrom = 32768;

/// The order dedup_keys gives the unique keys.
enum class DedupOrder {
  kFirstUse,  ///< order of first use in the batch (the cache planner ranks recency by it)
  kAny,       ///< any deterministic order (grouped by hash partition); allows the parallel path
};

/// Reusable scratch memory of dedup_keys: keeping it (and the UniqueKeys) across batches avoids
/// page-faulting megabytes of fresh memory every step.
struct DedupScratch {
  std::vector<std::uint64_t> slots;  ///< hash table: hash tag | unique id + 1, 0 = empty
  std::vector<std::int32_t> uid;     ///< (n) unique id of each position
  std::vector<std::int64_t> cursor;  ///< (U) scatter cursors
  // The parallel path (host/dedup.cpp): positions grouped by hash partition, per-partition results.
  std::vector<std::int32_t> by_part;  ///< (n) positions, grouped by partition, ascending within each
  std::vector<Key> part_keys;         ///< (n) the keys of by_part
  std::vector<std::uint8_t> part;     ///< (n) partition of each position
  std::vector<std::int64_t> counts;   ///< (chunks x partitions) positions per chunk and partition
  struct Part {
    std::vector<std::uint64_t> slots;  ///< hash table of the partition
    std::vector<Key> keys;             ///< unique keys, in order of first use
    std::vector<std::int32_t> local;   ///< (partition's positions) local unique id of each
    std::vector<std::int64_t> cursor;  ///< scatter cursor of each unique key
  };
  std::vector<Part> parts;
  /// Key counts from which kAny runs in parallel (tests set it to force either path).
  std::int64_t parallel_from = kDedupParallelFrom;
};

/// Dedups keys[0..n) (host memory; n < 2^31) into `out`, reusing the capacity of `out` and
/// `scratch`: the unique keys in `order`, and each one's positions ascending. O(n) with
/// open-addressing hash tables. kFirstUse runs on the calling thread; kAny, from
/// scratch.parallel_from keys on, partitions the keys by hash and runs on the calling thread's
/// oneTBB arena. Reentrant: call it from several threads for several tables (each with its own
/// out and scratch).
void dedup_keys(const Key* keys, std::int64_t n, UniqueKeys& out, DedupScratch& scratch,
                DedupOrder order = DedupOrder::kFirstUse);
/// The same of int32 keys, read as they are.
void dedup_keys(const std::int32_t* keys, std::int64_t n, UniqueKeys& out, DedupScratch& scratch,
                DedupOrder order = DedupOrder::kFirstUse);
/// The same of a feature's keys (int64 or int32: JaggedKeys::keys32).
void dedup_keys(const JaggedKeys& f, UniqueKeys& out, DedupScratch& scratch, DedupOrder order = DedupOrder::kFirstUse);
/// Convenience form with fresh memory.
UniqueKeys dedup_keys(const Key* keys, std::int64_t n);

/// bag_of[j] = the bag of key position j, for offsets (batch + 1); `out` is resized to offsets[batch].
void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::vector<std::int32_t>& out);
/// The same of a feature's offsets (int64 or int32: JaggedKeys::offsets32), into `out` or its num_keys() entries.
void bag_of_positions(const JaggedKeys& f, std::vector<std::int32_t>& out);
void bag_of_positions(const JaggedKeys& f, std::int32_t* out);
/// A feature's offsets (batch + 1) or keys (num_keys) into `out` as int64: copied, or widened from int32 (for copies
/// that are made anyway, into pinned staging).
void copy_offsets(const JaggedKeys& f, std::int64_t* out);
void copy_keys(const JaggedKeys& f, Key* out);
/// The same into `out` (offsets[batch] entries, host memory, e.g. pinned staging).
void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::int32_t* out);
std::vector<std::int32_t> bag_of_positions(const std::int64_t* offsets, std::int64_t batch);

}  // namespace strata
