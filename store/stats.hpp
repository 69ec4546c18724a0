#pragma once
// StoreStats: the counters a store reports (Store::stats()): each cached table's cache statistics,
// bytes per link, device memory and resources, the sharded tables' traffic, staging bytes. Plain
// values, in a header of their own so that store.hpp reports them without pulling the planners.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_stats.hpp"
#include "gpu/link_bytes.hpp"
#include "host/page_nodes.hpp"

namespace strata {

/// Traffic between ranks and time of the sharded (`gpu`/`hybrid` over a world) tables, this rank's
/// share since the store was opened.
struct DispatchStats {
  int rank = 0, world = 1;
  std::int64_t batches = 0;                                   ///< batches exchanged (submitted and looked up)
  std::int64_t key_bytes = 0, row_bytes = 0, grad_bytes = 0;  ///< exchanged with other ranks (dedup on)
  std::int64_t bytes_no_dedup = 0;  ///< what keys + rows + gradients would have been without dedup
  std::int64_t admission_bytes =
      0;                        ///< dynamic tables' keys, uses and rows sent to their shards' ranks (not in bytes())
  double exchange_seconds = 0;  ///< in collectives (agreement, counts, keys, rows, gradients)
  double lookup_seconds = 0;    ///< in this rank's shards (the inner engine)
  double local_seconds = 0;     ///< dedup, pooling and gradient sums at the source
  std::int64_t bytes() const noexcept { return key_bytes + row_bytes + grad_bytes; }
};

/// Bytes of staging buffers (pinned host and device memory) a store's device engines hold.
struct StagingBytes {
  std::size_t pinned = 0;   ///< pinned host memory
  std::size_t device = 0;   ///< device memory
  std::size_t entries = 0;  ///< staging entries (one per batch in flight, reused)
  std::size_t ahead = 0;    ///< entries ever made rather than wait for the device (the host ran ahead of it)
};

/// Where a store's host tier lives (config `numa`, the same for every engine of the store): logical
/// NUMA nodes, -1 when not bound to one.
struct NumaPlacement {
  int memory_node = -1;  ///< of its host tables (and shards)
  int thread_node = -1;  ///< of its threads: its oneTBB arena and its fill arena (the cache's row copies)
  int pinned_node = -1;  ///< of the pinned memory its device allocates (staging, bounce buffers)
  std::string note;      ///< why placement is less than asked (first touch, no GPU node, ...; "" when it is not)
};

/// Where one table's host rows are (a host table, a shard, `cached`'s host tier): as configured and as measured.
struct TableNuma {
  std::string table, placement, engine;    ///< its name, its config placement, the engine holding its rows
  int memory_node = -1, thread_node = -1;  ///< configured: NumaPlacement's of its engine
  PageNodes pages;                         ///< measured: where up to 64 of its pages, evenly spaced, lie
};

/// A dynamic table's key index (core/dynamic_spec.hpp): rows in use, what admission and eviction did, its memory.
struct DynamicStats {
  std::int64_t rows = 0, capacity = 0;                          ///< rows in use, of capacity
  std::int64_t admissions = 0, evictions = 0, expirations = 0;  ///< rows created; evicted when full; by the TTL
  std::int64_t not_admitted = 0, unseen = 0;  ///< uses of keys without a row: training batches, evaluation ones
  std::int64_t index_bytes = 0;               ///< host memory of the index and its admission sketch
  /// Adds another shard's (or rank's) counters, every field.
  DynamicStats& operator+=(const DynamicStats& o) noexcept {
    rows += o.rows;
    capacity += o.capacity;
    admissions += o.admissions;
    evictions += o.evictions;
    expirations += o.expirations;
    not_admitted += o.not_admitted;
    unseen += o.unseen;
    index_bytes += o.index_bytes;
    return *this;
  }
};

/// Counters of a store since it was opened (for benchmarks and tuning).
struct StoreStats {
  std::vector<std::pair<std::string, cache::CacheStats>> cache;  ///< per `cached` table, by name
  std::string device;                                            ///< "" without a device, else "emu" or "cuda <name>"
  gpu::LinkBytes links;               ///< bytes per link counted by the device layer and the prefetcher
  std::size_t device_peak_bytes = 0;  ///< peak device memory allocated
  DispatchStats dispatch;             ///< sharded tables only
  /// Allocations, frees and events of the device so far (a training loop's steady state adds none).
  gpu::ResourceCounts device_resources;
  /// The device engines' staging between calls, entries of batches in flight not counted. `staging`: the batches'
  /// arguments and rows, `cached`'s flush entry, offload's pinned outputs and gradients; `activation_staging`: the
  /// outputs and gradients of host views (none with device views only, nor offload_gather cpu, which pools in place).
  StagingBytes staging;
  StagingBytes activation_staging;  ///< see `staging`
  NumaPlacement numa;
  /// Per engine ("cpu", "offload", "cached", "gpu", "sharded"), in the store's order: `numa` as it applies to it
  /// (memory_node -1 without host rows, pinned_node -1 without a device); per table with host rows, in config order.
  std::vector<std::pair<std::string, NumaPlacement>> numa_engines;
  std::vector<TableNuma> numa_tables;                         ///< see numa_engines
  std::vector<std::pair<std::string, DynamicStats>> dynamic;  ///< per dynamic table, by name
};

}  // namespace strata
