#pragma once
// The `cached` placement: rows in pinned host memory, hot rows in HBM slot pools (one pool per
// (dim, optimizer state) shape, shared by the tables of that shape), fed by the prefetcher
// (cache::Prefetcher plans; this engine executes its plans on the device).
// See docs/architecture.md, "One step in each mode", `cached`.
//
// Streams: `copy` runs each batch's prefetch (metadata upload, fills; the write-backs of dirty
// victims run beside it on the `writeback` stream) and ends with the batch's `ready` event;
// `compute` waits for it, then runs lookups and updates. The pools, streams, lookups and updates
// are the slot-pool core's (slot_pool_engine.hpp), shared with `gpu`; the row moves between slots
// and host tables are cache_transfers.hpp's.
// Before a prefetch touches victim slots, the copy stream waits for the compute stream's latest
// backward (victims are unpinned, so every batch that used them has had its backward issued).
// Rows that do not fit the cache (beside the rows pinned by batches in flight, or at all) are
// served from each pool's overflow region (gpu::SlotPool::overflow), filled like misses and
// written back on the write-back stream after the backward of each batch that uses them.
// Host sync points: forward (outputs come back), flush, reuse of a staging entry, and growing a
// pool's overflow region (all three streams).

#include <tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// Rows of one flush chunk of a slot pool of `slots` records of `stride` floats: as many as 64 MiB
/// of records hold (at least one), or the whole pool when that is smaller. A flush reserves its
/// staging for the largest chunk of any pool (twice it, gpu/staging.hpp) and keeps it.
std::int64_t cache_flush_rows(std::int64_t slots, std::int64_t stride);

/// `fills`: the arena of the threads that copy staged rows to and from the host tables
/// (CacheTransfers); it outlives the engine.
Result<std::unique_ptr<Engine>> make_cached_engine(const Topology& topo, const StoreConfig& config,
                                                   const std::vector<int>& tables, HostTableOptions options,
                                                   gpu::Device& device, tbb::task_arena& fills);

}  // namespace strata::detail
