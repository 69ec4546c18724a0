#pragma once
// Dedup of one table's keys for a batch: the unique keys in first-use order and, for each unique
// key, the positions where it is used (ascending), as a CSR. Backward reduces gradients per unique
// row from this; the cache planner probes only unique keys.

#include <cstdint>
#include <vector>

#include "core/table_spec.hpp"

namespace strata {

/// Result of dedup_keys. Positions index the original key array.
struct UniqueKeys {
  std::vector<Key> keys;               ///< (U) unique keys in order of first use
  std::vector<std::int64_t> offsets;   ///< (U + 1) CSR offsets into `positions`
  std::vector<std::int32_t> positions; ///< (n) key positions grouped by unique key, ascending within each

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
inline UniqueView view_of(const UniqueKeys& u) noexcept { return {u.keys.data(), u.offsets.data(), u.positions.data(), u.size()}; }

/// Reusable scratch memory of dedup_keys: keeping it (and the UniqueKeys) across batches avoids
/// page-faulting megabytes of fresh memory every step.
struct DedupScratch {
  std::vector<std::uint64_t> slots; ///< hash table: hash tag | unique id + 1, 0 = empty
  std::vector<std::int32_t> uid;    ///< (n) unique id of each position
  std::vector<std::int64_t> cursor; ///< (U) scatter cursors
};

/// Dedups keys[0..n) (host memory; n < 2^31) into `out`, reusing the capacity of `out` and
/// `scratch`. O(n) with an open-addressing hash table. Single threaded and reentrant: call it from
/// several threads for several tables (each with its own out and scratch).
void dedup_keys(const Key* keys, std::int64_t n, UniqueKeys& out, DedupScratch& scratch);
/// Convenience form with fresh memory.
UniqueKeys dedup_keys(const Key* keys, std::int64_t n);

/// bag_of[j] = the bag of key position j, for offsets (batch + 1); `out` is resized to offsets[batch].
void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::vector<std::int32_t>& out);
/// The same into `out` (offsets[batch] entries, host memory, e.g. pinned staging).
void bag_of_positions(const std::int64_t* offsets, std::int64_t batch, std::int32_t* out);
std::vector<std::int32_t> bag_of_positions(const std::int64_t* offsets, std::int64_t batch);

}  // namespace strata
