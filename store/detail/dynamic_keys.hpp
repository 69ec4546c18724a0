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
// - A world (a store opened with a communicator; its dynamic tables are sharded, row or table): rank r's index holds
//   the keys dispatch::ShardLayout::key_owner gives it, in key_capacity(r) rows of its own (its "local" rows; the
//   engines serve global_row(r, local)), under the rules above. A submit is collective (dynamic_world.cpp): each rank
//   sends its distinct keys and their uses to their owners; an owner takes its sources in rank order, each in first-use
//   order (so a key's first use is its first in the ranks' batches concatenated in rank order), checks every table,
//   and after every rank's check agreed trains its shard, writes the new rows and answers each key's global row. Every
//   shard's clock ticks at every training submit. The reference store with a world restates it (shards side by side).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dispatch/communicator.hpp"
#include "dispatch/shard_layout.hpp"
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
  /// In a world: per dynamic table (DynamicKeys order), the rows this rank's shard pinned for every rank's keys.
  std::vector<std::vector<std::int64_t>> held;
};

class DynamicKeys {
 public:
  /// Overwrites rows of a table (rows no batch in flight uses) with fp32 weights and state, n rows of each
  /// (Engine::reset_rows); called on the calling thread, once per table of a batch, one table at a time.
  using Reset =
      std::function<Status(int table, const std::vector<std::int64_t>& rows, const float* weights, const float* state)>;

  /// `comm`: the world of a sharded store (null: one rank), which outlives this.
  DynamicKeys(const StoreConfig& config, dispatch::Communicator* comm);
  bool any() const noexcept { return !tables_.empty(); }
  bool dynamic(int table) const { return index(table) != nullptr; }

  /// Gives the keys of tb's dynamic entries (int64, as merge() copies them) their rows, in place (keys without a row:
  /// the table's last row, `capacity`), admitting keys when `train` and writing the new rows' initial values through
  /// `reset`. Refused (ResourceExhausted naming the table; nothing changed) when admitted keys cannot fit.
  /// In a world the call is collective (batch `id`: every rank calls it, for the same id, in the same order).
  Result<Admitted> admit(TableBatch& tb, bool train, std::int64_t id, const Reset& reset);
  /// Unpins what admit() pinned.
  void release(const TableBatch& tb, const Admitted& a);
  /// Forward: the rows of the keys without a row (in each dynamic entry's unpooled fp32 rows) become their initial
  /// values rounded to the table's dtype, or zeros.
  void fill_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& rows) const;
  /// Backward: the gradient rows of the keys without a row become zeros.
  void drop_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& grads) const;

  /// The engines' rows of local rows of `table`'s index (a world's global rows; identical on one rank), in place.
  void engine_rows(int table, std::vector<std::int64_t>& rows) const;
  /// The rank whose shard of `table` holds `key` (0 on one rank).
  int owner(int table, Key key) const;
  /// The index of a dynamic table (null for a dense one).
  const KeyIndex* index(int table) const;
  KeyIndex* index(int table);
  void stats(std::vector<std::pair<std::string, DynamicStats>>& out) const;
  /// In a world: bytes this rank sent to other ranks in admit_world's exchanges (counts, keys and uses, rows).
  std::int64_t admission_bytes() const noexcept { return admission_bytes_; }

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
    dispatch::ShardLayout layout;  // in a world (rows: capacity + 1)
    std::int64_t capacity = 0;     // this rank's shard's (a world's table-wise shard of another rank: 0, its index a
                                   // placeholder of one row that no key reaches, without an admission sketch)
    // Scratch of admit(), kept across batches (a fresh one page-faulted its hash table every batch).
    DedupScratch scratch;
    UniqueKeys unique;
    std::vector<std::int64_t> uses;
    std::vector<std::pair<std::int64_t, Key>> made;  // (row, key) train() admitted
    NewRows fresh;                                   // the new rows of the last batch that had the table
    // A world's submit (dynamic_world.cpp): this rank's keys by owner (their unique indexes), the keys and uses it
    // received, its own merged distinct keys (first use over the sources in rank order) and their uses, and the global
    // row its owner answered for each of this rank's distinct keys.
    std::vector<std::vector<std::int32_t>> sent;
    std::vector<Key> got;
    std::vector<std::int64_t> got_uses;
    UniqueKeys merged;
    DedupScratch merged_scratch;
    std::vector<std::int64_t> merged_uses, answered;
  };
  Table* find(int table);
  const Table* find(int table) const;
  // Fills t.fresh with the initial rows of the keys t.made lists ((row, key) that KeyIndex::train admitted), for
  // `reset`.
  static void new_rows(Table& t);
  Result<Admitted> admit_world(TableBatch& tb, bool train, std::int64_t id, const Reset& reset);
  // Rewrites an entry's keys f to their rows (the last row for keys without one), listing those keys' positions; uid:
  // the unique key of each position (DedupScratch::uid of f's first-use dedup), rows: each unique key's row.
  static void translate(const Table& t, const std::vector<std::int32_t>& uid, const std::vector<std::int64_t>& rows,
                        JaggedKeys& f, std::vector<std::int64_t>& missing_at, std::vector<Key>& missing_key);
  std::vector<Table> tables_;
  dispatch::Communicator* comm_ = nullptr;
  std::vector<std::int64_t> wire_send_, wire_got_;  // admit_world's all-to-all buffers, kept across batches
  std::int64_t admission_bytes_ = 0;
};

}  // namespace strata::detail
