#pragma once
// Offline hit-rate analysis of a key trace: the exact LRU hit-rate curve for every capacity at once
// (Mattson's stack distances) and Belady's optimum (MIN) for one capacity. Used by strata-tune to
// size caches; host-only, no device code.
//
// Two ways of counting accesses (see PerBatch):
// - per access: every key occurrence is one access, batches are ignored (the textbook model);
// - per batch, distinct: the way our cache works. A batch is planned as a whole: its keys are
//   deduplicated, every distinct key of the batch must be resident while the batch runs, and a
//   key's repeated occurrences in one batch are one access. A key hits when it is resident at the
//   start of its batch; victims for a batch are never keys of that batch. This needs a capacity of
//   at least the largest batch's distinct key count (LruCurve::min_capacity()).
// Belady's optimum is only computed in the per-batch distinct model.

#include <cstdint>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::cache {

/// Bits of a cache key that hold the table id (the high bits).
inline constexpr int kCacheKeyTableBits = 16;
/// Bits of a cache key that hold the row (the low bits).
inline constexpr int kCacheKeyRowBits = 48;
/// Table ids must be in [0, kMaxCacheTables).
inline constexpr std::int64_t kMaxCacheTables = std::int64_t{1} << kCacheKeyTableBits;
/// Rows must be in [0, kMaxCacheRows): tables of up to 2^48 (~2.8e14) rows.
inline constexpr std::int64_t kMaxCacheRows = std::int64_t{1} << kCacheKeyRowBits;

/// Checks that (table, row) can be packed by cache_key: "cache key: table 70000 out of range
/// [0, 65536)" or "cache key: table 3: row -1 out of range [0, 281474976710656)".
[[nodiscard]] Status validate_cache_key(int table, Key row);

/// Packs a table id (high 16 bits) and a row (low 48 bits) into one opaque 64-bit cache key, so
/// that keys of different tables never collide. Limits: table in [0, 65536), row in [0, 2^48);
/// anything else is a programmer error and aborts (check untrusted input with validate_cache_key).
std::uint64_t cache_key(int table, Key row);

/// The table id packed into a cache key by cache_key.
inline int cache_key_table(std::uint64_t key) noexcept { return static_cast<int>(key >> kCacheKeyRowBits); }

/// The row packed into a cache key by cache_key.
inline Key cache_key_row(std::uint64_t key) noexcept {
  return static_cast<Key>(key & ((std::uint64_t{1} << kCacheKeyRowBits) - 1));
}

/// A sequence of cache keys split into batches: batch b uses keys[batch_offsets[b] ..
/// batch_offsets[b+1]), in the order of use. Keys are opaque (e.g. from cache_key); only equality
/// matters. Host memory.
struct KeyTrace {
  std::vector<std::uint64_t> keys;          ///< (num_keys) cache keys in order of use
  std::vector<std::int64_t> batch_offsets;  ///< (batches + 1): starts at 0, non-decreasing, ends at
                                            ///< keys.size(); may be empty when keys is empty

  /// Number of batches (0 for an empty trace).
  std::int64_t num_batches() const noexcept {
    return batch_offsets.empty() ? 0 : static_cast<std::int64_t>(batch_offsets.size()) - 1;
  }
  /// Number of key occurrences.
  std::int64_t num_keys() const noexcept { return static_cast<std::int64_t>(keys.size()); }
};

/// Checks the shape of a trace: batch_offsets start at 0, never decrease and end at the key count
/// (or are empty with no keys). The message names the offending entry and what was expected.
[[nodiscard]] Status validate(const KeyTrace& trace);

/// How accesses are counted; see the top of this header.
enum class PerBatch : std::uint8_t {
  kEveryAccess = 0,  ///< every key occurrence is an access; batches are ignored (textbook LRU)
  kDistinct = 1,     ///< one access per distinct (batch, key); a key hits when it is resident at
                     ///< the start of its batch (our cache's semantics)
};

/// The exact LRU hit count of a trace at every capacity (in rows), from the histogram of stack
/// distances. The stack distance of an access is 1 + the number of distinct other keys used since
/// the previous access to the same key; an LRU cache of capacity c hits exactly the accesses of
/// distance <= c (the first access to a key is a compulsory miss at every capacity).
///
/// With PerBatch::kDistinct the distance is taken at the start of the access's batch (keys of the
/// same batch do not count) and keys last used in the same batch are ordered by their first
/// occurrence in that batch (a key first used later is more recent), which models a batch-at-a-time
/// LRU cache whose victims are never keys of the current batch. Such a cache exists only for
/// capacities >= min_capacity(); below it, hits_at(c) still counts the accesses whose key is among
/// the c most recently used keys at the start of the batch, which no real cache achieves.
///
/// Immutable once built; safe to read from several threads.
class LruCurve {
 public:
  /// The curve of an empty trace (no accesses).
  LruCurve() = default;

  /// How accesses were counted.
  PerBatch per_batch() const noexcept { return per_batch_; }
  /// Number of accesses: key occurrences (kEveryAccess) or distinct (batch, key) pairs (kDistinct).
  std::int64_t accesses() const noexcept { return accesses_; }
  /// Number of distinct keys in the trace.
  std::int64_t distinct_keys() const noexcept { return distinct_keys_; }
  /// First accesses to a key, which miss at every capacity (== distinct_keys()).
  std::int64_t compulsory_misses() const noexcept { return distinct_keys_; }
  /// Smallest capacity a real cache needs: 0 for kEveryAccess, the largest distinct key count of
  /// one batch for kDistinct.
  std::int64_t min_capacity() const noexcept { return min_capacity_; }
  /// Largest stack distance seen (0 without reuse): capacities >= it reach the maximum hit count
  /// accesses() - distinct_keys().
  std::int64_t max_stack_distance() const noexcept { return static_cast<std::int64_t>(cumulative_hits_.size()) - 1; }

  /// LRU hits with `capacity` rows (>= 0; negative aborts). O(1).
  std::int64_t hits_at(std::int64_t capacity) const;
  /// LRU misses with `capacity` rows: accesses() - hits_at(capacity). O(1).
  std::int64_t misses_at(std::int64_t capacity) const { return accesses_ - hits_at(capacity); }
  /// hits_at(capacity) / accesses(), 0 for an empty trace. O(1).
  double hit_rate_at(std::int64_t capacity) const;

  /// (max_stack_distance() + 1) entries: [d] = accesses with stack distance d; [0] is always 0.
  const std::vector<std::int64_t>& stack_distance_histogram() const noexcept { return histogram_; }

 private:
  friend Result<LruCurve> lru_curve(const KeyTrace& trace, PerBatch per_batch);

  PerBatch per_batch_ = PerBatch::kEveryAccess;
  std::int64_t accesses_ = 0;
  std::int64_t distinct_keys_ = 0;
  std::int64_t min_capacity_ = 0;
  std::vector<std::int64_t> histogram_{0};        ///< see stack_distance_histogram()
  std::vector<std::int64_t> cumulative_hits_{0};  ///< [c] = hits at capacity c, c <= max distance
};

/// Computes the LRU curve of a trace (Mattson's algorithm, with a Fenwick tree over access times
/// counting the keys used since a key's previous access; the times are compacted to the live keys
/// whenever they run out, so the tree has about 2 x distinct_keys() entries). O(n log d) time and
/// O(n) memory for n key occurrences over d distinct keys (expected, keys are numbered through a
/// hash map). Fails only when the trace does not pass validate(). Single threaded, reentrant.
[[nodiscard]] Result<LruCurve> lru_curve(const KeyTrace& trace, PerBatch per_batch = PerBatch::kEveryAccess);

/// Result of belady_hits, counted per distinct (batch, key).
struct BeladyHits {
  std::int64_t capacity = 0;           ///< the capacity in rows this was computed for
  std::int64_t accesses = 0;           ///< distinct (batch, key) pairs
  std::int64_t hits = 0;               ///< accesses whose key was resident at the start of the batch
  std::int64_t compulsory_misses = 0;  ///< first accesses to each key (== distinct keys)

  /// accesses - hits.
  std::int64_t misses() const noexcept { return accesses - hits; }
  /// hits / accesses, 0 for an empty trace.
  double hit_rate() const noexcept {
    return accesses == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(accesses);
  }
};

/// The most hits any cache of `capacity` rows can get on this trace (Belady's MIN), in the
/// per-batch distinct model (PerBatch::kDistinct): batch by batch, a key hits when it is resident
/// at the start of its batch, every distinct key of the batch is then made resident, and each
/// needed slot is taken from the resident key, not used by this batch, whose next use is furthest
/// in the future (in batches; never-used-again first). This is optimal among all caches that keep a
/// batch's keys resident while it runs, and LruCurve(kDistinct).hits_at(c) <= hits for every c.
///
/// Errors: capacity < 0, a trace that fails validate(), or a batch with more distinct keys than
/// the capacity ("batch 7 has 5 distinct keys, more than the capacity 4 rows"), all
/// InvalidArgument. O(n log n) time (a max-heap of resident keys by next use, with lazy deletion)
/// and O(n) memory for n key occurrences. Single threaded, reentrant.
[[nodiscard]] Result<BeladyHits> belady_hits(const KeyTrace& trace, std::int64_t capacity);

}  // namespace strata::cache
