#pragma once
// Sharded tables (placements `gpu` and `hybrid` over a world of ranks): each rank holds its shards
// (dispatch::ShardLayout) in an inner engine, `gpu` (rows in HBM) or `cached` (rows in this rank's
// host memory with its own HBM cache and prefetcher), and batches flow
//
//   submit    dedup per table -> keys to their holders (KeyExchange::run) -> the holder submits the
//             served keys to its inner engine (unpooled lookups, so a cached shard prefetches them)
//   forward   inner lookup of the served rows -> rows back to the sources -> each source pools its
//             bags from the rows of its unique keys (same kernel and order as every other mode)
//   backward  each source sums the gradient of each unique key -> sums to the holders -> the inner
//             engine reduces them per row (sources in rank order) and applies the optimizer
//
// Every call is collective: all ranks call submit/forward/backward/discard/read_rows for the same
// batch (or rows) in the same order, even when their own batch has no keys for these tables. Each
// starts with dispatch::agree, so a rank at a different call, or a local error on one rank, gives
// every rank a clear error instead of a hang; a rank that never arrives gives a timeout naming it.

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dispatch/communicator.hpp"
#include "dispatch/shard_layout.hpp"
#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// Bytes of metadata the sharded engine reserves for one feature of `bags` bags, `keys` keys,
/// `weights` per-key weights (0 or keys) and `unique` distinct keys, in its device scratch and
/// again in its pinned staging: room for forward's (offsets, keys as unique indexes, weights) and
/// backward's (unique slots and offsets, positions, bag of each position), every array rounded up
/// to 8 bytes. The engine grows both buffers to twice a call's sum over its features.
std::size_t sharded_feature_metadata_bytes(std::int64_t bags, std::int64_t keys, std::size_t weights,
                                           std::int64_t unique);

/// `tables`: the global indexes of the sharded tables (all `gpu` or all `hybrid` placements may be
/// mixed). The communicator, device and `fills` (make_cached_engine's, for cached shards) outlive the engine.
Result<std::unique_ptr<Engine>> make_sharded_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device, dispatch::Communicator& comm,
                                                    tbb::task_arena& fills);

}  // namespace strata::detail
