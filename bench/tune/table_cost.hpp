#pragma once
// What one table costs per training step in each placement: the bytes it moves over each link
// (store/cost_model.hpp's StepBytes) and the memory it takes in HBM and in host memory. The
// planner (bench/tune/planner.hpp) adds these up over the tables and models the step.
//
// Per step, with K key occurrences, U distinct rows, B bags, rows of d floats (row bytes 4d) and
// records of d + s floats (s the optimizer state; record bytes 4(d+s)), and M = U (1 - hit rate):
//   every device placement: keys and offsets H2D (8 (K + B + 1) bytes), pooled outputs D2H and
//                           their gradients H2D (4 B d bytes each; the Store API takes host buffers)
//   gpu      HBM: gather K rows, write B outputs, read and write U records (optimizer)
//   cached   gpu's, plus M fills (gathered from host, H2D, written to HBM) and M dirty write-backs
//            (read from HBM, D2H, written to host rows): every row a step uses is updated, so in
//            steady state every eviction writes back
//   offload  the device reads U rows from pinned host memory (H2D, host gather); the CPU
//            optimizer reads and writes U records
//   cpu      CPU threads gather K rows and read and write U records; no device traffic
// Host row traffic is listed as random-row gathers (StepBytes::host_gathers).
//
// Memory (what the planner counts against the budgets):
//   HBM  gpu: rows x record stride x 4 (as the gpu engine allocates); cached: cache rows x stride
//        x 4; every device placement: per batch in flight its keys and offsets, and one step's
//        pooled outputs and their gradients; cached also, per batch in flight, its largest step's
//        distinct rows as fill records
//   host cpu, offload, cached: the mapped table records (store/cost_model.hpp's host_table_memory,
//        exact for the table alone), cpu and offload the CPU optimizer's scratch; cached the
//        pinned staging of the batches in flight (largest step's distinct records each) and the
//        cache index (kCacheIndexBytesPerSlot per cache row)

#include <cstdint>

#include "store/cost_model.hpp"
#include "store/store_config.hpp"

namespace strata::tune {

/// Host bytes per cache slot of the pool's bookkeeping (estimate from cache/cache_pool.hpp: the
/// 32-byte slot record, the key map's entry of about 16 bytes at its load, the slot's version and
/// eviction-order entry).
inline constexpr double kCacheIndexBytesPerSlot = 64;

/// Per-step shape of one table's keys.
struct TableLoad {
  double keys = 0;                ///< key occurrences per step (mean)
  double bags = 0;                ///< bags per step (mean)
  double distinct = 0;            ///< distinct rows per step (mean)
  std::int64_t max_keys = 0;      ///< most key occurrences of one step
  std::int64_t max_distinct = 0;  ///< most distinct rows of one step (the smallest cache)
};

/// Options shared by every table's cost.
struct CostOptions {
  int max_in_flight = 8;  ///< batches in flight (StoreConfig::cache.max_in_flight)
  int numa_nodes = 1;     ///< NUMA nodes of the planned machine (host table layout)
  int threads = 0;        ///< store worker threads (CPU optimizer scratch; 0: this machine's cores)
};

/// One table in one placement.
struct TableCost {
  StepBytes bytes;        ///< per step
  double hbm_bytes = 0;   ///< HBM taken
  double host_bytes = 0;  ///< host memory taken
};

/// The cost of `spec` (validated) in `placement` (cpu, offload, cached or gpu) with `load`; for
/// cached, a cache of `cache_rows` rows with LRU hit rate `hit_rate`. Errors: hybrid (sharded
/// placements are not planned yet).
Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& options);

/// Adds `b` into `total` (every link, and the gathers appended).
void add_bytes(StepBytes& total, const StepBytes& b);

}  // namespace strata::tune
