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
//
// Several ranks (CostOptions::ranks = N > 1; store/detail/sharded_engine.hpp). Every table is
// `gpu` or `hybrid`, sharded row-wise (key k on rank k % N), and the costs are those of one rank:
// rank 0, which holds the largest shard (ceil(rows / N) rows). Each rank trains on a batch of the
// input's step shape (as strata-bench --ranks runs them: rank r takes steps r, r + N, ...). With U
// the rank's distinct rows per step and f = (N - 1) / N the share of them held elsewhere:
//   all-to-all  keys out 8 U f, their rows back 4 d U f, gradients out 4 d U f, and one count
//               per table and peer (8 (N - 1)): as dispatch::KeyExchange counts them
//   served      the rank serves S = U keys per step (the other ranks' keys of its shard; row
//               sharding spreads them evenly), as unpooled bags of its inner gpu or cached engine:
//               keys and offsets H2D (8 (2 S + 1)), S rows D2H and S gradients H2D; HBM gathers S
//               rows, writes S outputs, and the optimizer reads and writes U_s records (U_s: the
//               distinct rows the worst shard serves per step, TableLoad::shard_distinct)
//   source      the CPU pools the rank's K keys from the returned rows and sums their gradients
//               (host reads 2 K row bytes, writes 2 U row bytes)
//   hybrid      as cached on the shard: fills and write-backs of U_s (1 - hit rate) records, the
//               hit rate of the worst shard's cache of `cache_rows` rows (rows per rank)
// Memory per rank: gpu: the shard's rows in HBM; hybrid: the shard's host records
// (host_table_memory of rank 0), its cache, staging and index as cached; both: keys staging per
// batch in flight and one step's served rows and gradients in HBM (S_max = the larger of the
// rank's and the shard's most distinct rows of one step), and in host memory the communication
// buffers: per batch in flight its unique keys, positions and inverse (8 U + 8 U + 12 K), the
// keys sent and served (4 U + 24 S_max) and the row buffers kept between forward and backward
// (4 d (S_max + U)), plus one step's rows and gradients being exchanged (8 d (S_max + U)).

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
  /// Several ranks: distinct rows the worst shard serves per step (mean; 0: one rank).
  double shard_distinct = 0;
  /// Several ranks: most distinct rows one shard serves in one step (the smallest hybrid cache).
  std::int64_t shard_max_distinct = 0;
};

/// Options shared by every table's cost.
struct CostOptions {
  int max_in_flight = 8;  ///< batches in flight (StoreConfig::cache.max_in_flight)
  int numa_nodes = 1;     ///< NUMA nodes of the planned machine (host table layout)
  int threads = 0;        ///< store worker threads (CPU optimizer scratch; 0: this machine's cores)
  int ranks = 1;          ///< ranks of the world (> 1: gpu and hybrid tables sharded row-wise; costs per rank)
};

/// One table in one placement.
struct TableCost {
  StepBytes bytes;        ///< per step
  double hbm_bytes = 0;   ///< HBM taken
  double host_bytes = 0;  ///< host memory taken
  double comm_bytes = 0;  ///< several ranks: the communication buffers, part of host_bytes
};

/// The cost of `spec` (validated) in `placement` with `load`; for cached and hybrid, a cache of
/// `cache_rows` rows (hybrid: per rank) with LRU hit rate `hit_rate`. One rank: cpu, offload,
/// cached or gpu (hybrid is an error). Several ranks: gpu or hybrid, sharded row-wise, the cost of
/// rank 0 (the others are errors: a world takes only sharded tables).
Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& options);

/// Adds `b` into `total` (every link, and the gathers appended).
void add_bytes(StepBytes& total, const StepBytes& b);

}  // namespace strata::tune
