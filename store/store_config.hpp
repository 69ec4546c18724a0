#pragma once
// StoreConfig: tables, placement per table, threads and NUMA policy; in C++ and in JSON.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/policy.hpp"
#include "core/dynamic_spec.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "dispatch/sharding_plan.hpp"

namespace strata {

/// Where a table's rows live and who computes on them (see docs/architecture.md, "Placement modes").
enum class Placement {
  kCpu = 0,      ///< NUMA host arenas, CPU kernels
  kOffload = 1,  ///< pinned host rows; the device reads them zero-copy or the CPU pools them (see OffloadGather)
  kCached = 2,   ///< pinned host rows plus an HBM row cache fed by the prefetcher
  kGpu = 3,      ///< every row in HBM; sharded over the ranks' devices by the table's ShardingPlan
  kHybrid = 4,   ///< sharded over the ranks; each rank's shard is `cached` (its host memory + its HBM cache)
};

/// Size of a `cached` table's share of its slot pool: set at most one of rows, bytes, fraction (none: fraction 0.1).
/// Tables of the same (dim, optimizer state) shape share one pool whose size is the sum of their shares.
struct TableCacheConfig {
  std::int64_t rows = 0;   ///< cache rows
  std::int64_t bytes = 0;  ///< cache bytes (weights and optimizer state)
  double fraction = 0.0;   ///< fraction of the table's rows, in (0, 1]
  bool cap = false;        ///< also cap the table at its share (else it competes for the whole pool)
};

/// Which device backs `offload`, `cached`, `gpu` and `hybrid` tables.
enum class BackendChoice { kAuto = 0, kCuda = 1, kEmu = 2 };

/// DeviceConfig::ordinal "auto": a rank of a world opens the GPU of its local rank (the nccl communicator's, else
/// local_rank() modulo the visible GPUs); a store without a communicator GPU 0. "current": the CUDA device current on
/// the thread that calls Store::open, in its primary context (README, "Using the store": which GPU).
inline constexpr int kDeviceOrdinalAuto = -2;
inline constexpr int kDeviceOrdinalCurrent = -1;

/// The device of a store (used only when a table is `offload`, `cached`, `gpu` or `hybrid`).
struct DeviceConfig {
  BackendChoice backend = BackendChoice::kAuto;  ///< auto: cuda when a GPU is visible, else emu
  /// CUDA device: >= 0 pins that device on every rank; kDeviceOrdinalAuto (the default) or kDeviceOrdinalCurrent choose
  /// it when the store opens (see those). The emu backend ignores it.
  int ordinal = kDeviceOrdinalAuto;
  std::int64_t capacity = 0;             ///< bytes of device memory to use (0: emu 1 GiB, cuda all free)
  int emu_max_delay_us = 0;              ///< emu: random delay before every stream op (tests)
  std::int64_t emu_fail_after_ops = -1;  ///< emu: inject a device fault at this op (tests)
};

/// How `offload` tables are looked up.
enum class OffloadGather {
  kDevice = 0,  ///< the device reads rows from pinned host memory (zero-copy); outputs come back D2H
  kCpu = 1,     ///< CPU threads gather and pool; the pooled outputs go H2D
};

/// How the cache moves rows between host tables and device slots (fills and write-backs).
enum class CacheTransfer {
  kAuto = 0,      ///< measured when the store opens: the faster of the two on this machine
  kStaged = 1,    ///< CPU threads copy records through pinned staging; DMA copies; an unpack kernel
  kZeroCopy = 2,  ///< a kernel reads and writes the (registered, mapped) host records directly
};

/// The cache and prefetcher of `cached` tables.
///
/// The lookahead policy plans each batch knowing the batches after it (its window): the `lookahead` batches submitted
/// behind it (each holds a staging entry, so lookahead < max_in_flight) and, beyond them, up to `preview` batches whose
/// keys the trainer announced with Store::preview (keys only: nothing is pinned, staged or fetched for them, so a
/// window of hundreds of batches costs host memory for their unique keys and nothing on the device).
struct CacheConfig {
  cache::Policy policy = cache::Policy::kLru;  ///< replacement policy
  int lookahead = 0;      ///< batches submitted beyond the one planned, which it sees (lookahead); < max_in_flight
  int max_in_flight = 8;  ///< batches submitted and not yet retired (staging ring entries)
  int preview = 0;        ///< most batches previewed and not yet submitted, in [0, kMaxPreview]; 0: no previews
  /// Cores that plan each slot pool, in [1, kMaxPlannerPartitions]: the pool's slots are split into this many
  /// partitions planned in parallel (cache/partitioned_planner.hpp; rows are ranked within their partition). Every
  /// partition of a pool, and of a capped table's cap, needs at least one row.
  int planner_partitions = 1;
  /// Every `flush_every` backward calls (store steps) the store flushes (Store::flush): host memory then holds every
  /// update up to that step, which bounds what a device fault can lose (README, "When the device fails"). 0: only
  /// explicit flushes, save and close write cached rows back.
  std::int64_t flush_every = 0;
  CacheTransfer transfer = CacheTransfer::kAuto;  ///< fills and write-backs
};

inline constexpr int kMaxPlannerPartitions = 256;  ///< upper bound of CacheConfig::planner_partitions
inline constexpr int kMaxPreview = 1 << 16;        ///< upper bound of CacheConfig::preview

/// How host tables are spread over NUMA nodes.
enum class NumaPolicy {
  kInterleave = 0,  ///< row blocks dealt round-robin over all nodes (bandwidth of every node)
  kBind = 1,        ///< every table bound to `numa_node`
  /// Bound to the node of the store's GPU, its kernel threads too (StoreStats::numa); else (no device, emu, a GPU hwloc
  /// does not place) as kInterleave, with StoreStats::numa.note saying why.
  kAuto = 2,
};

/// A named input of a batch (a KeyBatch entry) that looks up a table: several features of one table share its rows,
/// dedup, cache and optimizer, each with its own bags, pooling, weights and output (docs/architecture.md, "Features").
struct FeatureConfig {
  std::string name;                ///< unique over the store's features
  std::optional<Pooling> pooling;  ///< unset: the table's
};

/// One table and its placement.
struct TableConfig {
  TableSpec spec;                         ///< shape, pooling, initializer, optimizer
  Placement placement = Placement::kCpu;  ///< placement mode of this table
  /// Set: a dynamic table (any int64 key; spec.rows is its capacity; core/dynamic_spec.hpp). Unset: keys in [0, rows).
  std::optional<DynamicSpec> dynamic;
  std::vector<FeatureConfig> features;  ///< empty: one feature named as the table, with its pooling
  TableCacheConfig cache;               ///< `cached` and `hybrid` (per rank: a fraction of the rank's shard)
  /// `gpu` and `hybrid`: how the table is split over the ranks. Store::open checks it against the world (a store
  /// without a communicator is one rank): a table-wise owner must be in [0, world).
  dispatch::ShardingPlan sharding;
};

/// Upper bound of StoreConfig::threads: fixed, so a config valid on one machine is valid on every one.
inline constexpr int kMaxThreads = 1024;

/// Everything Store::open needs.
struct StoreConfig {
  std::vector<TableConfig> tables;  ///< at least one; names unique
  /// kernel threads (emu: per stream), in [0, kMaxThreads] (0: all cores; under numa auto with a GPU
  /// on a node oneTBB knows, the cores of that node). The store has two arenas of up to `threads`
  /// each: its kernels' and the cache's fills'.
  int threads = 0;
  NumaPolicy numa = NumaPolicy::kAuto;                    ///< host table placement
  int numa_node = 0;                                      ///< node for NumaPolicy::kBind (other policies: 0)
  bool huge_pages = true;                                 ///< back host tables with transparent huge pages
  int fake_numa_nodes = 0;                                ///< > 0: pretend the machine has this many nodes (tests)
  DeviceConfig device;                                    ///< device of offload/cached/gpu/hybrid tables
  CacheConfig cache;                                      ///< cache and prefetcher of cached tables
  OffloadGather offload_gather = OffloadGather::kDevice;  ///< lookups of offload tables
  /// backward refuses gradients holding NaN or +-Inf (naming the table and the bag), so they never reach rows or
  /// optimizer state; true accepts them (for trainers that clip or skip elsewhere).
  bool accept_nonfinite_gradients = false;
};

/// Rows of a cached table's share of its pool (resolving rows/bytes/fraction); >= 1.
std::int64_t cache_rows(const TableConfig& t);
/// The index of the table that feature `name` looks up and the feature's pooling (NotFound naming it when none does).
Result<std::pair<int, Pooling>> find_feature(const StoreConfig& config, const std::string& name);

const char* to_string(Placement p) noexcept;
Result<Placement> parse_placement(const std::string& s);
const char* to_string(NumaPolicy p) noexcept;
Result<NumaPolicy> parse_numa_policy(const std::string& s);
const char* to_string(BackendChoice b) noexcept;
Result<BackendChoice> parse_backend(const std::string& s);
const char* to_string(OffloadGather g) noexcept;
Result<OffloadGather> parse_offload_gather(const std::string& s);
const char* to_string(CacheTransfer t) noexcept;
Result<CacheTransfer> parse_cache_transfer(const std::string& s);
const char* to_string(Eviction e) noexcept;
Result<Eviction> parse_eviction(const std::string& s);
const char* to_string(Unseen u) noexcept;
Result<Unseen> parse_unseen(const std::string& s);

/// Checks every table and the store-wide fields, enums included (a value outside its enum, say
/// static_cast<Placement>(9), is named with its integer); errors name the table and the value. Also refuses what only
/// dispatch sets (the shard origin in TableSpec::init) and sharding owners below -1; owners beyond the world are
/// refused by Store::open, which knows the world.
Status validate(const StoreConfig& config);

/// Parses a JSON config. Schema (every field but tables[].name/rows/dim optional):
///   {"threads": 2, "numa": "auto"|"interleave"|"bind", "numa_node": 0, "huge_pages": true,
///    "tables": [{"name": "user", "rows": 1000, "dim": 64, "dtype": "fp32", "pooling": "sum",
///                "features": ["clicked", {"name": "bought", "pooling": "mean"}],
///                "kind": "dense"|"dynamic", "capacity": 1000 (dynamic: in place of rows), "admit_after": 1,
///                "eviction": "lru"|"lfu", "evict_after_steps": 0, "unseen": "initial"|"zeros" (these four: dynamic),
///                "placement": "cpu"|"offload"|"cached"|"gpu"|"hybrid", "init": {"bound": 0.01, "seed": 0},
///                "optimizer": {"kind": "adagrad", "learning_rate": 0.01, "eps": 1e-8, "beta1": 0.9, "beta2": 0.999,
///                              "weight_decay": 0, "initial_accumulator": 0},
///                "cache": {"rows": 0, "bytes": 0, "fraction": 0.1, "cap": false},
///                "sharding": {"type": "replicated"|"table"|"row"|"column", "owner": -1}}],
///    "device": {"backend": "auto"|"cuda"|"emu", "ordinal": "auto"|"current"|-1|0, "capacity": 0,
///               "emu_max_delay_us": 0, "emu_fail_after_ops": -1},
///    "cache": {"policy": "lru"|"lfu"|"lookahead", "lookahead": 0, "max_in_flight": 8, "preview": 0,
///              "planner_partitions": 1, "flush_every": 0, "transfer": "auto"|"staged"|"zero_copy"},
///    "offload_gather": "device"|"cpu", "accept_nonfinite_gradients": false}
/// cache.planner_partitions was called planner_shards, a name still read (not both at once). Unknown keys, values of
/// the wrong JSON type (never coerced: 8.9, true or 1e6 for an integer) and a key given twice in one object are
/// refused, quoting what was written and its path ("table 'user': dim: expected an integer in [-2^31, 2^31), got
/// 8.9"). Validates the result.
Result<StoreConfig> parse_store_config(const std::string& json_text);
/// Reads and parses a JSON config file.
Result<StoreConfig> load_store_config(const std::string& path);
/// The JSON form of a config (round-trips through parse_store_config).
std::string to_json(const StoreConfig& config);

}  // namespace strata
