#pragma once
// ShardingPlan: how one table is split over the ranks of a world, and ShardLayout: what that means
// for a given world size (who owns a key, which local row it is, which columns a rank holds).
//
//   replicated  every rank holds the whole table (data parallel); gradients of every rank are
//               applied on every rank, so the replicas stay identical
//   table       the whole table on one rank (`owner`, or table index % world when owner < 0)
//   row         key k on rank k % world, local row k / world
//   column      every rank holds all rows and a contiguous slice of the columns (dim split as
//               evenly as possible; the first dim % world ranks get one more)

#include <cstdint>
#include <string>

#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::dispatch {

enum class ShardingType { kReplicated = 0, kTable = 1, kRow = 2, kColumn = 3 };

struct ShardingPlan {
  ShardingType type = ShardingType::kRow;
  int owner = -1;  ///< kTable: the rank holding the table, in [0, world); -1 (any type): table index % world
};

const char* to_string(ShardingType t) noexcept;
Result<ShardingType> parse_sharding(const std::string& s);

/// Checks a plan for a table and a world size: "table 'user': column sharding over 4 ranks needs
/// dim >= 4, got 2"; an owner below -1 (any world), or a table-wise owner outside [0, world), is
/// refused. Capacities are checked by the caller, which knows its devices.
Status validate_plan(const TableSpec& spec, const ShardingPlan& plan, int world);

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
