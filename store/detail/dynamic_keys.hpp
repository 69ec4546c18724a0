#pragma once
// Dynamic tables (TableConfig::dynamic) at the store's front: a key index per table (host/key_index.hpp) gives each
// key of a batch a row of the table's capacity, and the engines serve a dense table of capacity + 1 rows, the last
// one standing for keys without a row. Such a table is served unpooled (features.hpp: "merged"): forward's rows of
// keys without a row are replaced by their initial values (or zeros) before the front pools them, and backward's
// gradients of those keys are dropped (zero rows, so the last row stays as it was for every optimizer).
//
// The rules (core/dynamic_spec.hpp holds the options), which host/key_index.hpp implements and the reference store
// restates (docs/architecture.md, "Dynamic tables"):
// - The clock: every training submit of a store advances each dynamic table's clock by one (1, 2, ...); a row's last
//   use is the clock of the last training batch that used it, its count the uses (key occurrences) since it was
//   admitted. A batch's distinct keys are taken in first-use order (the served entry: bag by bag, the table's features
//   in order, each in key order).
// - A training submit at clock T: a key with a row is a hit (last use T, count + its uses). A key without one is
//   admitted when admit_after <= 1 or when its admission count (host/admission_sketch.hpp: the estimate before this
//   batch, plus its uses in it) reaches admit_after; the sketch then counts the uses of every key that had no row.
// - Room: rows in use by batches in flight (submitted, not retired) and by this batch are pinned. With
//   evict_after_steps S > 0, unpinned rows with T - last use > S are evicted first (TTL). Admitted keys, in first-use
//   order, take the lowest free row, else evict the unpinned row first in the eviction order (lru: the least recent
//   last use, ties to the row touched earlier, rows being touched in first-use order; lfu: the smallest count, then
//   as lru) and take its row. When the admitted keys outnumber the free and unpinned rows, the batch is refused and
//   nothing changes.
// - A new row's weights are init_row(seed, key) (core/row_math.hpp: what dense row `key` starts as), its optimizer
//   state the initial state. An evicted key's training is gone.
// - A key without a row after this (not admitted), or in a batch that does not train (KeyBatch::train false: no
//   admission, no clock, no counts), reads its initial values (or zeros, Unseen::kZeros); its gradient is dropped.
// - When: at submit, before any engine sees the batch (every placement serves dynamic tables; the device ones plan and
//   copy rows at submit), after the engines' refusals that do not depend on keys (Engine::accepting). New rows are
//   written in every tier (Engine::reset_rows: a cached row's copy is dropped unwritten); a key whose new row an engine
//   could not write has none after all (KeyIndex::forget) and the submit fails. An engine refusing the batch after
//   admission (a device without room for its staging, a failed device) leaves the admission in place: the index and
//   the rows agree, the keys admitted hold their initial rows, the clock has ticked.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "host/dedup.hpp"
#include "host/key_index.hpp"
#include "store/detail/features.hpp"
#include "store/stats.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// What admission gave one batch's dynamic entries (per entry of its TableBatch; empty for dense ones).
struct Admitted {
  std::vector<std::vector<std::int64_t>> rows;  ///< each distinct key's row or KeyIndex::kNone (pinned until release)
  std::vector<std::vector<std::int64_t>> missing_at;  ///< key positions without a row, ascending
  std::vector<std::vector<Key>> missing_key;          ///< their keys
};

class DynamicKeys {
 public:
  /// Overwrites rows of a table (rows no batch in flight uses) with fp32 weights and state, n rows of each
  /// (Engine::reset_rows); called on the calling thread, once per table of a batch, one table at a time.
  using Reset =
      std::function<Status(int table, const std::vector<std::int64_t>& rows, const float* weights, const float* state)>;

  explicit DynamicKeys(const StoreConfig& config);
  bool any() const noexcept { return !tables_.empty(); }
  bool dynamic(int table) const { return index(table) != nullptr; }

  /// Gives the keys of tb's dynamic entries (int64, as merge() copies them) their rows, in place (keys without a row:
  /// the table's last row, `capacity`), admitting keys when `train` and writing the new rows' initial values through
  /// `reset`. Refused (ResourceExhausted naming the table; nothing changed) when admitted keys cannot fit.
  Result<Admitted> admit(TableBatch& tb, bool train, const Reset& reset);
  /// Unpins what admit() pinned.
  void release(const TableBatch& tb, const Admitted& a);
  /// Forward: the rows of the keys without a row (in each dynamic entry's unpooled fp32 rows) become their initial
  /// values rounded to the table's dtype, or zeros.
  void fill_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& rows) const;
  /// Backward: the gradient rows of the keys without a row become zeros.
  void drop_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& grads) const;

  /// The index of a dynamic table (null for a dense one).
  const KeyIndex* index(int table) const;
  KeyIndex* index(int table);
  void stats(std::vector<std::pair<std::string, DynamicStats>>& out) const;

 private:
  // A batch's new rows of one table and their initial weights and state.
  struct NewRows {
    std::vector<std::int64_t> rows;
    std::vector<float> w, s;
  };
  struct Table {
    int table = 0;
    TableSpec spec;
    DynamicSpec dyn;
    std::uint64_t seed = 0;  // table_seed of the table: a key's initial values are init_row(seed, key)
    std::unique_ptr<KeyIndex> index;
    // Scratch of admit(), kept across batches (a fresh one page-faulted its hash table every batch).
    DedupScratch scratch;
    UniqueKeys unique;
    std::vector<std::int64_t> uses;
    std::vector<std::pair<std::int64_t, Key>> made;  // (row, key) train() admitted
    NewRows fresh;                                   // the new rows of the last batch that had the table
  };
  Table* find(int table);
  const Table* find(int table) const;
  // Fills t.fresh with the initial rows of the keys t.made lists ((row, key) that KeyIndex::train admitted), for
  // `reset`.
  static void new_rows(Table& t);
  // Rewrites an entry's keys f to their rows (the last row for keys without one), listing those keys' positions; uid:
  // the unique key of each position (DedupScratch::uid of f's first-use dedup), rows: each unique key's row.
  static void translate(const Table& t, const std::vector<std::int32_t>& uid, const std::vector<std::int64_t>& rows,
                        JaggedKeys& f, std::vector<std::int64_t>& missing_at, std::vector<Key>& missing_key);
  std::vector<Table> tables_;
};

}  // namespace strata::detail
