#pragma once
// ShardLayout: what a ShardingPlan (dispatch/sharding_plan.hpp) means for a given world size: who owns a key, which
// local row it is, which columns a rank holds.
//
// A dynamic table (rows = capacity + 1, the last standing for keys without a row; store/detail/dynamic_keys.hpp) is
// sharded by row or table only: its keys are held by key_owner(k) (row: a hash of the key, so that any int64 keys
// spread evenly; table: the owner), whose key index gives them its local rows, global_row() in the layout's rows.

#include <cstdint>
#include <utility>

#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "dispatch/sharding_plan.hpp"

namespace strata::dispatch {

/// A validated plan resolved for a world size. Cheap to copy.
class ShardLayout {
 public:
  /// `table_index` resolves the default owner of table-wise plans.
  static Result<ShardLayout> make(const TableSpec& spec, const ShardingPlan& plan, int world, int table_index);

  ShardingType type() const noexcept { return type_; }
  int world() const noexcept { return world_; }
  std::int64_t rows() const noexcept { return rows_; }
  std::int32_t dim() const noexcept { return dim_; }
  /// True when every rank holds a part of every row (column, replicated): keys go to all ranks.
  bool to_all() const noexcept { return type_ == ShardingType::kColumn || type_ == ShardingType::kReplicated; }
  /// The rank holding key k (row, table); meaningless when to_all().
  int owner_of(Key k) const noexcept { return type_ == ShardingType::kRow ? static_cast<int>(k % world_) : owner_; }
  /// The row of key k in its holder's shard.
  Key local_row(Key k) const noexcept { return type_ == ShardingType::kRow ? k / world_ : k; }
  /// Rows of rank r's shard (0 when it holds nothing).
  std::int64_t local_rows(int r) const noexcept;
  /// Columns of rank r's shard and where they start in the whole row.
  std::int32_t local_dim(int r) const noexcept;
  std::int32_t col_offset(int r) const noexcept;
  /// Whether rank r holds any part of the table.
  bool holds(int r) const noexcept { return local_rows(r) > 0 && local_dim(r) > 0; }
  /// Whether owner `o` sends rows back to source `s` in forward (replicated: each rank reads its own).
  bool returns_rows(int o, int s) const noexcept { return type_ != ShardingType::kReplicated || o == s; }
  /// First local row of rank r among global rows [row0, row0 + n) and how many there are.
  std::pair<std::int64_t, std::int64_t> local_range(int r, std::int64_t row0, std::int64_t n) const noexcept;
  /// Dynamic tables (row or table sharding): the rank whose key index holds key k (row: mix64 of k with a seed of its
  /// own, modulo the world; independent of KeyIndex's hash), the keys its index holds at most (its local rows among
  /// global rows [0, rows - 1)), and the global row of its local row l (row: l * world + r; table: l).
  int key_owner(Key k) const noexcept;
  std::int64_t key_capacity(int r) const noexcept { return local_range(r, 0, rows_ - 1).second; }
  Key global_row(int r, Key l) const noexcept { return type_ == ShardingType::kRow ? l * world_ + r : l; }
  /// The spec of rank r's shard: local rows and columns, pooling none (the source pools), and an
  /// initializer origin so the shard starts as the matching slice of the whole table.
  TableSpec shard_spec(const TableSpec& whole, int r) const;

 private:
  ShardingType type_ = ShardingType::kRow;
  int world_ = 1;
  int owner_ = 0;
  std::int64_t rows_ = 0;
  std::int32_t dim_ = 0;
};

}  // namespace strata::dispatch
