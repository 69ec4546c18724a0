#include "bench/tune/table_cost.hpp"

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

// The table alone in `placement`, as the store maps its host records.
Result<HostTableMemory> host_memory(const TableSpec& spec, Placement placement, const CostOptions& o) {
  StoreConfig one;
  one.threads = o.threads;
  TableConfig tc;
  tc.spec = spec;
  tc.placement = placement;
  one.tables.push_back(tc);
  return host_table_memory(one, o.numa_nodes);
}

}  // namespace

Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& o) {
  const double state = optimizer_state_dim(spec.optimizer.kind, spec.dim);
  const double row_bytes = 4.0 * spec.dim;
  const double record_bytes = 4.0 * (spec.dim + state);
  const double stride_bytes = 4.0 * static_cast<double>(record_stride(spec.dim, static_cast<std::int32_t>(state)));
  const double in_flight = o.max_in_flight;
  const double K = load.keys, U = load.distinct, B = load.bags;
  TableCost c;
  StepBytes& b = c.bytes;
  const bool device = placement != Placement::kCpu;
  if (device) {
    b.h2d += 8.0 * (K + B + 1) + B * row_bytes;  // keys and offsets, output gradients
    b.d2h += B * row_bytes;                      // pooled outputs
    c.hbm_bytes += in_flight * 8.0 * (static_cast<double>(load.max_keys) + B + 1) + 2.0 * B * row_bytes;
  }
  switch (placement) {
    case Placement::kGpu:
    case Placement::kCached: {
      b.hbm_read += K * row_bytes + U * record_bytes;
      b.hbm_write += B * row_bytes + U * record_bytes;
      if (placement == Placement::kGpu) {
        c.hbm_bytes += static_cast<double>(spec.rows) * stride_bytes;
        break;
      }
      const double misses = U * (1.0 - hit_rate);
      b.h2d += misses * record_bytes;
      b.hbm_write += misses * record_bytes;
      host_rows(b, misses, record_bytes, /*read=*/true);
      b.hbm_read += misses * record_bytes;  // write-backs
      b.d2h += misses * record_bytes;
      host_rows(b, misses, record_bytes, /*read=*/false);
      const double staging = in_flight * static_cast<double>(load.max_distinct) * record_bytes;
      c.hbm_bytes += static_cast<double>(cache_rows) * stride_bytes + staging;
      STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
      c.host_bytes += m.mapped_bytes + staging + kCacheIndexBytesPerSlot * static_cast<double>(cache_rows);
      break;
    }
    case Placement::kOffload:
    case Placement::kCpu: {
      if (placement == Placement::kOffload) {
        b.h2d += U * row_bytes;
        host_rows(b, U, row_bytes, true);
        b.hbm_write += B * row_bytes;
      } else {
        host_rows(b, K, row_bytes, true);
      }
      host_rows(b, U, record_bytes, true);  // CPU optimizer
      host_rows(b, U, record_bytes, false);
      STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
      c.host_bytes += m.mapped_bytes + m.scratch_bytes;
      break;
    }
    case Placement::kHybrid:
      return Status::invalid_argument("table '" + spec.name +
                                      "': placement hybrid is not planned (strata-tune plans one rank)");
  }
  return c;
}

}  // namespace strata::tune
