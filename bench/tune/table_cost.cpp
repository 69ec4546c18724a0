#include "bench/tune/table_cost.hpp"

#include <algorithm>
#include <cmath>

#include "host/host_table.hpp"

namespace strata::tune {

void add_bytes(StepBytes& total, const StepBytes& b) {
  total.hbm_read += b.hbm_read;
  total.hbm_write += b.hbm_write;
  total.h2d += b.h2d;
  total.d2h += b.d2h;
  total.host_read += b.host_read;
  total.host_write += b.host_write;
  total.host_remote += b.host_remote;
  total.all_to_all += b.all_to_all;
  total.launches += b.launches;
  total.host_gathers.insert(total.host_gathers.end(), b.host_gathers.begin(), b.host_gathers.end());
}

namespace {

// Random host rows read (`read`) or written.
void host_rows(StepBytes& b, double rows, double row_bytes, bool read) {
  if (rows <= 0) return;
  (read ? b.host_read : b.host_write) += rows * row_bytes;
  b.host_gathers.push_back({rows, row_bytes});
}

// The table alone in `placement`, as the store maps its host records (several ranks: rank 0's
// shard, sharded row-wise).
Result<HostTableMemory> host_memory(const TableSpec& spec, Placement placement, const CostOptions& o) {
  StoreConfig one;
  one.threads = o.threads;
  TableConfig tc;
  tc.spec = spec;
  tc.placement = placement;
  one.tables.push_back(tc);
  return host_table_memory(one, o.numa_nodes, o.ranks > 1 ? o.ranks : 0, 0);
}

// Per-row sizes of a table: row, record (row and optimizer state) and padded record bytes.
struct RowSizes {
  double row = 0, record = 0, stride = 0;
};

RowSizes sizes_of(const TableSpec& spec) {
  const double state = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  return {4.0 * spec.dim, 4.0 * (spec.dim + state),
          4.0 * static_cast<double>(record_stride(spec.dim, static_cast<std::int32_t>(state)))};
}

// A cache of `cache_rows` rows over host records, `distinct` rows used per step at `hit_rate`:
// misses filled (host gather, H2D, HBM write) and as many dirty rows written back (HBM read, D2H,
// host write); HBM for the slots and the fill staging, host for the records, staging and index.
Status add_cache(TableCost& c, const TableSpec& spec, double distinct, std::int64_t max_distinct,
                 std::int64_t cache_rows, double hit_rate, Placement placement, const CostOptions& o) {
  const RowSizes z = sizes_of(spec);
  StepBytes& b = c.bytes;
  const double misses = distinct * (1.0 - hit_rate);
  b.h2d += misses * z.record;
  b.hbm_write += misses * z.record;
  host_rows(b, misses, z.record, /*read=*/true);
  b.hbm_read += misses * z.record;  // write-backs
  b.d2h += misses * z.record;
  host_rows(b, misses, z.record, /*read=*/false);
  const double staging = o.max_in_flight * static_cast<double>(max_distinct) * z.record;
  c.hbm_bytes += static_cast<double>(cache_rows) * z.stride + staging;
  STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
  c.host_bytes += m.mapped_bytes + staging + kCacheIndexBytesPerSlot * static_cast<double>(cache_rows);
  return Status::ok();
}

// One rank's cost of a table sharded row-wise over o.ranks ranks (header comment).
Result<TableCost> sharded_cost(const TableSpec& spec, const TableLoad& load, Placement placement,
                               std::int64_t cache_rows, double hit_rate, const CostOptions& o) {
  const RowSizes z = sizes_of(spec);
  const double N = o.ranks, f = (N - 1.0) / N, in_flight = o.max_in_flight;
  const double K = load.keys, U = load.distinct, S = load.distinct;
  const double Us = load.shard_distinct > 0 ? load.shard_distinct : U;
  const double s_max = static_cast<double>(std::max(load.max_distinct, load.shard_max_distinct));
  const double u_max = static_cast<double>(load.max_distinct), k_max = static_cast<double>(load.max_keys);
  TableCost c;
  StepBytes& b = c.bytes;
  b.all_to_all += (8.0 + 2.0 * z.row) * U * f + 8.0 * (N - 1.0);
  b.h2d += 8.0 * (2.0 * S + 1.0) + S * z.row;
  b.d2h += S * z.row;
  b.hbm_read += S * z.row + Us * z.record;
  b.hbm_write += S * z.row + Us * z.record;
  b.host_read += 2.0 * K * z.row;
  b.host_write += 2.0 * U * z.row;
  c.hbm_bytes += in_flight * 8.0 * (2.0 * s_max + 1.0) + 2.0 * s_max * z.row;
  c.comm_bytes = in_flight * (16.0 * u_max + 12.0 * k_max + 4.0 * u_max + 24.0 * s_max + z.row * (s_max + u_max)) +
                 2.0 * z.row * (s_max + u_max);
  c.host_bytes += c.comm_bytes;
  if (placement == Placement::kGpu) {
    c.hbm_bytes += std::ceil(static_cast<double>(spec.rows) / N) * z.stride;
    return c;
  }
  const std::int64_t smallest = std::max<std::int64_t>(1, load.shard_max_distinct);
  STRATA_RETURN_IF_ERROR(add_cache(c, spec, Us, smallest, cache_rows, hit_rate, placement, o));
  return c;
}

}  // namespace

Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& o) {
  if (o.ranks > 1) {
    if (placement != Placement::kGpu && placement != Placement::kHybrid)
      return Status::invalid_argument("table '" + spec.name + "': placement " + to_string(placement) +
                                      " serves one rank (expected gpu or hybrid over " + std::to_string(o.ranks) +
                                      " ranks)");
    return sharded_cost(spec, load, placement, cache_rows, hit_rate, o);
  }
  const RowSizes z = sizes_of(spec);
  const double in_flight = o.max_in_flight;
  const double K = load.keys, U = load.distinct, B = load.bags;
  TableCost c;
  StepBytes& b = c.bytes;
  const bool device = placement != Placement::kCpu;
  if (device) {
    b.h2d += 8.0 * (K + B + 1) + B * z.row;  // keys and offsets, output gradients
    b.d2h += B * z.row;                      // pooled outputs
    c.hbm_bytes += in_flight * 8.0 * (static_cast<double>(load.max_keys) + B + 1) + 2.0 * B * z.row;
  }
  switch (placement) {
    case Placement::kGpu:
    case Placement::kCached: {
      b.hbm_read += K * z.row + U * z.record;
      b.hbm_write += B * z.row + U * z.record;
      if (placement == Placement::kGpu)
        c.hbm_bytes += static_cast<double>(spec.rows) * z.stride;
      else
        STRATA_RETURN_IF_ERROR(add_cache(c, spec, U, load.max_distinct, cache_rows, hit_rate, placement, o));
      break;
    }
    case Placement::kOffload:
    case Placement::kCpu: {
      if (placement == Placement::kOffload) {
        b.h2d += U * z.row;
        host_rows(b, U, z.row, true);
        b.hbm_write += B * z.row;
      } else {
        host_rows(b, K, z.row, true);
      }
      host_rows(b, U, z.record, true);  // CPU optimizer
      host_rows(b, U, z.record, false);
      STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
      c.host_bytes += m.mapped_bytes + m.scratch_bytes;
      break;
    }
    case Placement::kHybrid:
      return Status::invalid_argument("table '" + spec.name +
                                      "': placement hybrid is planned over several ranks (--ranks > 1)");
  }
  return c;
}

}  // namespace strata::tune
