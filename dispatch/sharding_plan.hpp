#pragma once
// ShardingPlan: how one table is split over the ranks of a world (dispatch/shard_layout.hpp: what that means for a
// given world size).
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

/// Checks the plan of a dynamic table of `capacity` rows (TableSpec::rows) for a world size, beyond validate_plan: row
/// or table sharding only, and with row sharding every rank's shard holds at least one key (capacity >= world).
Status validate_dynamic_plan(const TableSpec& spec, const ShardingPlan& plan, int world);

}  // namespace strata::dispatch
