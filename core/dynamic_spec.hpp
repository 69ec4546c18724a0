#pragma once
// DynamicSpec: a dynamic table's keys are any int64; a row is created for a key on first use in
// training, up to the table's capacity (TableSpec::rows), with admission and eviction. The rules,
// which host/key_index.hpp implements and the reference store restates (docs/architecture.md,
// "Dynamic tables"):
// - The clock: every training submit of a store advances each dynamic table's clock by one (1, 2,
//   ...); a row's last use is the clock of the last training batch that used it, its count the
//   uses (key occurrences) since it was admitted. A batch's distinct keys are taken in first-use
//   order (the served entry: bag by bag, the table's features in order, each in key order).
// - A training submit at clock T: a key with a row is a hit (last use T, count + its uses). A key
//   without one is admitted when admit_after <= 1 or when its admission count (the sketch's
//   estimate before this batch, plus its uses in it) reaches admit_after; the sketch then counts
//   the uses of every key that had no row.
// - Room: rows in use by batches in flight (submitted, not retired) and by this batch are pinned.
//   With evict_after_steps S > 0, unpinned rows with T - last use > S are evicted first (TTL).
//   Admitted keys, in first-use order, take a free row, else evict the unpinned row first in the
//   eviction order: lru, the least recent last use (ties: the row touched earlier: rows are touched
//   in first-use order); lfu, the smallest count, then as lru. When the admitted keys outnumber the
//   free and unpinned rows, the batch is refused and nothing changes.
// - A new row's weights are init_row(seed, key) (core/row_math.hpp: what dense row `key` starts
//   as), its optimizer state the initial state. An evicted key's training is gone.
// - A key without a row after this (not admitted), or in a batch that does not train (an
//   evaluation submit: no admission, no clock, no counts), reads its initial values (or zeros,
//   Unseen::kZeros) and its gradient is dropped.

#include <cstdint>

namespace strata {

/// Which unpinned row a dynamic table evicts when it is full.
enum class Eviction { kLru = 0, kLfu = 1 };

/// What a key without a row reads.
enum class Unseen { kInitial = 0, kZeros = 1 };

/// A dynamic table's options (its capacity is TableSpec::rows).
struct DynamicSpec {
  std::int64_t admit_after = 1;        ///< uses before a key gets a row, in [1, kMaxAdmitAfter]
  Eviction eviction = Eviction::kLru;  ///< when full
  std::int64_t evict_after_steps = 0;  ///< TTL in clock ticks (0: none), in [0, 2^62)
  Unseen unseen = Unseen::kInitial;    ///< what a key without a row reads
};

/// Largest DynamicSpec::admit_after (the admission sketch's counters are 16-bit).
inline constexpr std::int64_t kMaxAdmitAfter = 65535;

}  // namespace strata
