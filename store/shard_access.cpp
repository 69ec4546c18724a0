// This rank's shards: Store::shard_info, read_shard and write_shard, with the checks every store shares. A store
// without a world holds every table whole; StoreImpl narrows shard_info through its engines (ShardedEngine).

#include <string>

#include "store/detail/batch_checks.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

// Rows [row0, row0 + n) of this rank's shard of a table (already known), with a weights buffer unless n is 0.
Status check_shard_rows(const char* op, const TableSpec& spec, const ShardInfo& si, std::int64_t row0, std::int64_t n,
                        const void* weights) {
  const std::string table = std::string(op) + ": table '" + spec.name + "': ";
  const std::string shard = "rank " + std::to_string(si.rank) + " of " + std::to_string(si.world) + ", " +
                            dispatch::to_string(si.type) + " sharding";
  if (si.local_rows == 0 || si.local_dim == 0)
    return Status::failed_precondition(table + "rank " + std::to_string(si.rank) + " of " + std::to_string(si.world) +
                                       " holds none of it (" + dispatch::to_string(si.type) +
                                       " sharding; expected a table this rank holds)");
  if (row0 < 0 || n < 0 || row0 > si.local_rows - n)
    return Status::out_of_range(table + "local rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                                ") out of this rank's shard [0, " + std::to_string(si.local_rows) + ") (" + shard +
                                ")");
  if (!weights && n > 0)
    return Status::invalid_argument(table + "weights is null (expected a buffer of " + std::to_string(n) + " x " +
                                    std::to_string(si.local_dim) + " floats)");
  return Status::ok();
}

}  // namespace

Result<ShardInfo> Store::shard_info(int table) const {
  if (Status s = detail::check_table(table, config_); !s.is_ok()) return s.with_context("shard_info");
  const TableSpec& spec = config_.tables[static_cast<std::size_t>(table)].spec;
  ShardInfo si;
  si.rows = si.local_rows = spec.rows;
  si.dim = si.local_dim = spec.dim;
  si.replicas = {0};
  return si;
}

Status Store::read_own_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) {
  return read_rows(table, row0, n, weights, state);
}

Status Store::write_own_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) {
  return write_rows(table, row0, n, weights, state);
}

Status Store::read_shard(int table, std::int64_t local_row0, std::int64_t n, float* weights, float* state) {
  if (Status s = detail::check_table(table, config_); !s.is_ok()) return s.with_context("read_shard");
  STRATA_ASSIGN_OR_RETURN(const ShardInfo si, shard_info(table));
  STRATA_RETURN_IF_ERROR(
      check_shard_rows("read_shard", config_.tables[static_cast<std::size_t>(table)].spec, si, local_row0, n, weights));
  return read_own_rows(table, local_row0, n, weights, state);
}

Status Store::write_shard(int table, std::int64_t local_row0, std::int64_t n, const float* weights,
                          const float* state) {
  if (in_flight() > 0) return detail::busy("write_shard", in_flight());
  if (Status s = detail::check_table(table, config_); !s.is_ok()) return s.with_context("write_shard");
  STRATA_ASSIGN_OR_RETURN(const ShardInfo si, shard_info(table));
  const TableSpec& spec = config_.tables[static_cast<std::size_t>(table)].spec;
  STRATA_RETURN_IF_ERROR(check_shard_rows("write_shard", spec, si, local_row0, n, weights));
  STRATA_RETURN_IF_ERROR(detail::check_holdable("write_shard", spec, local_row0, n, si.local_dim, weights,
                                                optimizer_state_dim(spec.optimizer.kind, si.local_dim), state));
  return write_own_rows(table, local_row0, n, weights, state);
}

}  // namespace strata
