#pragma once
// The row moves of the `cached` engine between its slot pools (SlotPoolEngine::Pool) and the
// pinned host tables of their tables, which this owns. Two ways, chosen per pool by the engine
// (cache.transfer):
//   - staged: write-backs are a pack kernel (the caller's), a D2H copy into pinned staging and a
//     host task that scatters the rows into the host tables on CPU threads; fills are a host task
//     that gathers the rows into pinned staging and an H2D copy, unpacked by the caller;
//   - zero-copy: records_to_host/records_from_host on the host records' device addresses.
// Host DRAM traffic is counted at issue, as the device counts its own work. The host tasks refer
// to this object and to the pool: both outlive every stream that runs them (the engine waits for
// its streams before either goes). Not thread-safe: the store's driving thread owns it.

#include <tbb/task_arena.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cache/cache_planner.hpp"
#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "host/host_table.hpp"
#include "store/engines/cpu_engine.hpp"
#include "store/engines/detail/mapped_rows.hpp"
#include "store/engines/detail/slot_pool_engine.hpp"

namespace strata::detail {

/// Rows zero_copy_is_faster moves through a pool, at most (fewer when the pool has fewer slots).
inline constexpr std::int64_t kTransferProbeRows = 4096;

class CacheTransfers {
 public:
  using Pool = SlotPoolEngine::Pool;

  /// `fills`: the arena whose threads run the staged rows' copies to and from the host tables (the
  /// store's fill arena, on its home node; it outlives this).
  CacheTransfers(gpu::Device& dev, tbb::task_arena& fills) : dev_(dev), fills_(fills) {}
  CacheTransfers(const CacheTransfers&) = delete;
  CacheTransfers& operator=(const CacheTransfers&) = delete;

  /// Adds the host table of global table `table` (pinned through the device's pinner).
  void add_table(int table, HostTable t);
  HostTableOps& host(int table) { return host_.at(table); }
  /// Adds (table, its host table) of each table added (Engine::host_tables).
  void host_tables(std::vector<std::pair<int, const HostTable*>>& out) const { add_host_tables(host_, out); }

  /// Maps every host table for the zero-copy transfers (MappedRows). The device's error for the
  /// first table that cannot be (with its name); the tables mapped before stay mapped.
  Status map_tables();

  /// The device addresses of the host records of `rows` of `pool`, in `st`'s mirrored region
  /// (device, rows.size()). Needs map_tables().
  float** stage_rows(gpu::Staging& st, const Pool& pool, const std::vector<cache::Transfer>& rows) const;

  /// On `s`: records packed on the device (`dev`, (rows, stride)) -> their host rows, zero-copy
  /// through `mapped` (device addresses of the host records) or, when null, through the pinned
  /// staging `host` ((rows, stride)) and CPU threads.
  void send_home(gpu::StreamView s, const Pool& pool, std::vector<cache::Transfer> rows, const float* dev, float* host,
                 float** mapped);

  /// On `s` (staged fills): host tables -> pinned staging `host` -> `dev` ((fills, stride) device),
  /// to be unpacked into the slots by the caller.
  void stage_in(gpu::StreamView s, const Pool& pool, const std::vector<cache::Transfer>& fills, float* host,
                float* dev);

  /// Counts the host DRAM traffic of moving `rows` of `pool` (`write`: into host memory), at
  /// issue. send_home and stage_in count their own; the caller counts the zero-copy fills it issues.
  void count_host(const Pool& pool, const std::vector<cache::Transfer>& rows, bool write);

  /// Moves up to kTransferProbeRows rows of the pool's tables into its (empty) slots and back, both
  /// ways, on `s`, and says whether the zero-copy kernels took less time. Changes no row;
  /// synchronizes `s`.
  /// Needs map_tables(). False when its staging does not fit on the device.
  Result<bool> zero_copy_is_faster(gpu::StreamView s, const Pool& pool);

 private:
  gpu::Device& dev_;
  tbb::task_arena& fills_;
  std::unordered_map<int, HostTableOps> host_;
  MappedRows mapped_;  // the device addresses of the host tables (zero-copy)
};

}  // namespace strata::detail
