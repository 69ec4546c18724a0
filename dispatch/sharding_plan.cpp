#include "dispatch/sharding_plan.hpp"

#include "dispatch/shard_layout.hpp"

#include "core/row_math.hpp"

namespace strata::dispatch {

const char* to_string(ShardingType t) noexcept {
  switch (t) {
    case ShardingType::kReplicated:
      return "replicated";
    case ShardingType::kTable:
      return "table";
    case ShardingType::kRow:
      return "row";
    case ShardingType::kColumn:
      return "column";
  }
  return "?";
}

Result<ShardingType> parse_sharding(const std::string& s) {
  for (ShardingType t : {ShardingType::kReplicated, ShardingType::kTable, ShardingType::kRow, ShardingType::kColumn})
    if (s == to_string(t)) return t;
  return Status::invalid_argument("unknown sharding '" + s + "' (expected replicated, table, row or column)");
}

Status validate_plan(const TableSpec& spec, const ShardingPlan& plan, int world) {
  const std::string who = "table '" + spec.name + "': ";
  if (world < 1) return Status::invalid_argument(who + "world size " + std::to_string(world) + " must be >= 1");
  // Below the default (a negative owner used to be taken as -1), whatever the type and the world.
  if (plan.owner < -1)
    return Status::invalid_argument(who + "sharding owner " + std::to_string(plan.owner) +
                                    " out of range (expected -1, the default, or for table sharding a rank in [0, "
                                    "world size))");
  switch (plan.type) {
    case ShardingType::kTable:
      if (plan.owner >= world)
        return Status::invalid_argument(who + "table sharding owner rank " + std::to_string(plan.owner) +
                                        " out of range [0, " + std::to_string(world) + ") for a world of " +
                                        std::to_string(world) + (world == 1 ? " rank" : " ranks"));
      break;
    case ShardingType::kColumn:
      if (spec.dim < world)
        return Status::invalid_argument(who + "column sharding over " + std::to_string(world) + " ranks needs dim >= " +
                                        std::to_string(world) + ", got " + std::to_string(spec.dim));
      // Row-wise adagrad keeps one accumulator per whole row (the mean of the squared gradient over
      // all columns); a column slice cannot compute it without the other slices.
      if (spec.optimizer.kind == OptimizerKind::kRowwiseAdagrad && world > 1)
        return Status::invalid_argument(who +
                                        "column sharding cannot apply rowwise_adagrad (its accumulator spans the "
                                        "whole row); use row or table sharding");
      break;
    case ShardingType::kRow:
    case ShardingType::kReplicated:
      break;
  }
  if (plan.type != ShardingType::kTable && plan.owner >= 0)
    return Status::invalid_argument(who + "owner " + std::to_string(plan.owner) +
                                    " is only meaningful for table sharding, not " + to_string(plan.type));
  return Status::ok();
}

Status validate_dynamic_plan(const TableSpec& spec, const ShardingPlan& plan, int world) {
  STRATA_RETURN_IF_ERROR(validate_plan(spec, plan, world));
  const std::string who = "dynamic table '" + spec.name + "': ";
  if (plan.type != ShardingType::kRow && plan.type != ShardingType::kTable && world > 1)
    return Status::invalid_argument(who + to_string(plan.type) + " sharding over " + std::to_string(world) +
                                    " ranks cannot hold its keys (expected row sharding, by a hash of the key, or "
                                    "table sharding)");
  if (plan.type == ShardingType::kRow && spec.rows < world)
    return Status::invalid_argument(who + "capacity " + std::to_string(spec.rows) + " is below the world size " +
                                    std::to_string(world) +
                                    " (row sharding gives every rank a shard of capacity / ranks rows; expected a "
                                    "capacity of at least " +
                                    std::to_string(world) + ")");
  return Status::ok();
}

Result<ShardLayout> ShardLayout::make(const TableSpec& spec, const ShardingPlan& plan, int world, int table_index) {
  STRATA_RETURN_IF_ERROR(validate_plan(spec, plan, world));
  ShardLayout l;
  l.type_ = plan.type;
  l.world_ = world;
  l.owner_ = plan.type == ShardingType::kTable ? (plan.owner >= 0 ? plan.owner : table_index % world) : 0;
  l.rows_ = spec.rows;
  l.dim_ = spec.dim;
  return l;
}

std::int64_t ShardLayout::local_rows(int r) const noexcept {
  switch (type_) {
    case ShardingType::kRow:
      return rows_ > r ? (rows_ - r + world_ - 1) / world_ : 0;
    case ShardingType::kTable:
      return r == owner_ ? rows_ : 0;
    default:
      return rows_;
  }
}

std::int32_t ShardLayout::local_dim(int r) const noexcept {
  if (type_ != ShardingType::kColumn) return dim_;
  return dim_ / world_ + (r < dim_ % world_ ? 1 : 0);
}

std::int32_t ShardLayout::col_offset(int r) const noexcept {
  if (type_ != ShardingType::kColumn) return 0;
  const std::int32_t base = dim_ / world_, extra = dim_ % world_;
  return r * base + (r < extra ? r : extra);
}

std::pair<std::int64_t, std::int64_t> ShardLayout::local_range(int r, std::int64_t row0,
                                                               std::int64_t n) const noexcept {
  switch (type_) {
    case ShardingType::kRow: {
      // Local rows l with row0 <= l * world + r < row0 + n.
      const auto first = [&](std::int64_t g) { return g <= r ? 0 : (g - r + world_ - 1) / world_; };
      const std::int64_t a = first(row0), b = first(row0 + n);
      return {a, b - a};
    }
    case ShardingType::kTable:
      return r == owner_ ? std::make_pair(row0, n) : std::make_pair(row0, std::int64_t{0});
    default:
      return {row0, n};
  }
}

int ShardLayout::key_owner(Key k) const noexcept {
  if (type_ != ShardingType::kRow) return owner_;
  // A seed of its own: KeyIndex hashes the keys a rank holds with mix64 too, and a shared hash would leave the keys of
  // one rank in a fraction of its index's slots.
  constexpr std::uint64_t kShardSeed = 0x5EED'D15B'A7C4'0001ull;
  return static_cast<int>(mix64(static_cast<std::uint64_t>(k) ^ kShardSeed) % static_cast<std::uint64_t>(world_));
}

TableSpec ShardLayout::shard_spec(const TableSpec& whole, int r) const {
  TableSpec s = whole;
  s.rows = local_rows(r);
  s.dim = local_dim(r);
  s.pooling = Pooling::kNone;
  if (type_ == ShardingType::kRow) {
    s.init.row_stride = whole.init.row_stride * world_;
    s.init.row_offset = whole.init.row_offset + r * whole.init.row_stride;
  }
  s.init.col_offset = whole.init.col_offset + col_offset(r);
  return s;
}

}  // namespace strata::dispatch
