#pragma once
// What one table costs per training step in each placement: the bytes it moves over each link
// (store/model/cost_model.hpp's StepBytes) and the memory it takes in HBM and in host memory: the one
// model of the engines' allocations and transfers, beside the engines. strata-tune's planner
// (tune/planner.hpp) adds these up over the tables and models the step; strata-tune validate
// (tune/validate.hpp) predicts a run's counters with it; strata-bench's memory guard estimates a
// run's HBM and pinned staging with it.
//
// Per step, with K key occurrences, U distinct rows, B bags, P pooled rows (B; K without pooling),
// rows of d elements of the table's dtype (row bytes r = 4d for fp32, 2d for bf16 and fp16),
// outputs and gradients of d elements of its output_dtype (o = 4d or 2d bytes per pooled row),
// records of the row and s optimizer state elements of its state_dtype (record bytes R = 4
// (row_words + state_words), core/record_layout.hpp) padded to the stride S (bytes; record_words)
// in device slots and host tables. Rows move at their dtype wherever they go (the engines keep a
// half-size row half-size in host memory, slots and staging; gradient sums are counted at r too). Every byte
// below is what the engines issue and the device layer counts (store/engines/*_engine.cpp,
// gpu/device.cpp), so on emu the prediction of a run equals its counters exactly
// (tune/validate.hpp); a copy moves its bytes over PCIe and reads or writes them in HBM.
//   metadata   gpu and cached: the feature's lookup and update arguments, uploaded H2D with the
//              batch (EngineStaging::gpu_feature: offsets, slots, weights, unique slots and
//              offsets, positions, bag of each position, hot rows; each array rounded up to 64
//              bytes); offload: offsets, keys and weights (EngineStaging::offload_feature), and
//              per dim group the host addresses of its distinct rows (EngineStaging::list)
//   gather     HBM reads K rows and the index (8 (B + 1) + 8 K, + 4 K with weights), writes P
//              outputs (P o)
//   update     HBM reads P gradient rows (P o), U records and 16 U of slots and offsets, and 8 K of
//              positions; writes U records
//   trainer    --trainer host: outputs D2H and gradients H2D (P o each; gpu, cached);
//              --trainer device: gpu and cached write outputs and read gradients in place, and
//              the store counts the gradients' NaN and Inf on the device (HBM reads P o, 8 bytes
//              of counts D2H); offload writes the outputs in place (offload-cpu: its one H2D
//              of them goes into the trainer's buffers) and copies each gradient D2H once, for
//              the CPU optimizer, and the store counts their NaN and Inf as for gpu; cpu: the
//              host-bounce adaptor's outputs H2D and gradients D2H (P o each, in a store with a
//              device, whose check counts them too; else the trainer's own device's: strata-bench
//              opens one)
//   gpu        metadata, gather, update
//   cached     gpu's, plus per step F fills (host reads F R; staged: F S H2D, unpacked in HBM;
//              zero-copy: F R H2D) and W write-backs of dirty rows (packed in HBM; staged: W S
//              D2H; zero-copy: W R D2H; host writes W R), and per slot pool the slots of its fills
//              and write-backs (and, zero-copy, their host addresses) in the metadata. A row is
//              dirty once a backward used it since its fill: rows last used by forward-only batches
//              are written back by nobody (validate simulates the cache; the planner, in steady
//              training, counts a write-back for every miss, W = F = U (1 - hit rate))
//   offload    the device reads the U distinct rows from pinned host memory (H2D U r, host reads
//              U r) and gathers them (a host trainer's outputs then come back D2H); offload-cpu:
//              CPU threads pool (host reads K r) and the outputs go H2D into a device trainer's
//              buffers (a host trainer's are pooled in place); the CPU optimizer reads and writes
//              U records
//   cpu        CPU threads gather K rows and read and write U records
// Host bytes of CPU kernels (CPU gather, CPU optimizer) are StepBytes::host_cpu_read/write too:
// no device counts them. Host row traffic is listed as random-row gathers (StepBytes::host_gathers).
// Memory (what the planner counts against the budgets), with E = CostOptions::max_in_flight (the
// plan's cache.max_in_flight) and U_max, K_max, B_max a step's most distinct rows, keys and bags,
// P_max its pooled rows (B_max, or K_max without pooling):
//   HBM  gpu: rows x record stride x 4 (as the gpu engine allocates); cached: cache rows x stride
//        x 4. gpu and cached: the slot-pool engine's staging ring (gpu/staging.hpp), E entries,
//        each grown to twice its largest batch's need (store/engines/gpu_engine.cpp submit,
//        cached_engine.cpp prepare; every array rounded up to 64 bytes): the feature's arguments
//        (EngineStaging::gpu_feature(B_max, K_max, 0, U_max)) and, cached, the slots of its fills
//        and write-backs (2 list(U_max)), the write-backs packed at the stride and the fills at the
//        stride (staged; zero-copy: their host addresses instead of the fills); cached also the
//        flush staging (store/engines/cached_engine.cpp: twice one flush chunk, the whole cache up
//        to 64 MiB of records, and its slots; reserved by the first flush, then kept); the
//        transfer probe of cache.transfer auto (up to 4096 rows both ways, staged while the store
//        opens, before the rest) counts instead when it is larger than the two together.
//        One step's outputs and gradients: with the trainer on the device its own buffers (2 P_max
//        rows); on the host the activation staging of the host views, E entries of an output and a
//        gradient buffer grown to twice (4 P_max rows rounded up to 64 bytes each). offload: per
//        batch in flight an entry of the offload engine's ring grown to twice its largest batch's
//        need (store/engines/offload_engine.cpp): with the device gather its arguments (offsets,
//        keys, the distinct rows' host addresses: EngineStaging::offload_feature + list(U_max)) and
//        the U_max distinct rows read into device memory; one step's outputs and gradients (a device
//        trainer's own buffers, or per batch in flight a host trainer's device-gather output buffer
//        grown to twice; offload-cpu with the trainer on the host holds no device memory).
//        An entry per batch submitted and not retired, and the ring makes a new one rather than
//        wait for a free entry whose device work (a retired batch's update) is still running, up
//        to kMaxBusyFree - 1 = 2 more: E covers a trainer that keeps E - 2 batches in flight
//        without waiting for the device (strata-bench keeps 2; E defaults to 8), or E batches when
//        the device is done with a retired batch by the next submit (the sharded engine waits for
//        its inner engines; a forward into host views waits for the device). A cache smaller than
//        the rows of the batches in flight defers the later ones' plans and stages fewer.
//   host cpu, offload, cached: the mapped table records (store/model/cost_model.hpp's host_table_memory,
//        exact for the table alone), cpu and offload the CPU optimizer's scratch; offload the
//        pinned side of its ring (the mirrored arguments and the outputs, grown to twice, per
//        batch in flight); cached the pinned side of its staging, flush staging and (host trainer)
//        activation staging, and the cache index (kCacheIndexBytesPerSlot per cache row). The
//        pinned staging of gpu tables (the ring's mirrored side and, with the trainer on the
//        host, the activation staging) is TableCost::gpu_pinned_bytes, outside host_bytes: the
//        planner does not budget it, store_memory counts it.
//   flush A store keeps one flush staging for its caches, sized for the largest chunk of any slot
//        pool: table_cost counts it per cached table (TableCost::flush_hbm_bytes and
//        flush_host_bytes, as if the table's pool were the only one; the planner sums them, an
//        upper bound), store_memory once, from the store's pools.
//
// A table of several features (TableConfig::features; TableLoad::features and BatchKeys::features
// > 1; store/detail/features.hpp, store/store_impl.cpp). The engines get one entry of its keys,
// the features merged bag by bag (B: the batch's bags, once), and serve it unpooled with fp32
// outputs into host views (the store's buffers of its rows, then of its spread gradients): every
// count above is that of the table with pooling none, output_dtype fp32 and the trainer on the
// host (gpu and cached: P = K rows of 4d D2H, their gradients H2D, the activation staging of host
// views; offload: the device gather's outputs D2H, the gradients read in place; sharded: the
// source's outputs D2H and gradients H2D). Then the store's front: the host pools each feature
// from the K unpooled fp32 rows (a CPU gather: host reads K 4d), and with the trainer on the
// device its features' views go through the host bounce (store/engines/host_bounce.hpp): outputs
// H2D and gradients D2H, F o bytes each, with F the rows of its features' outputs (a bag each per
// pooled feature, a key each per unpooled one: feature_rows) and o the table's output row, the
// gradients' NaN and Inf counted first (reads F o, one 8-byte count per feature written and D2H;
// a cpu table's only in a store with a device). Memory: the engine's as above, plus the unpooled
// rows of a batch in host memory (K_max 4d) and, with the trainer on the device, its own buffers
// of the features' outputs and gradients (2 F_max o in HBM; none counted for a cpu table, as for
// one feature) and the bounce's pinned scratch (two buffers grown to twice a call's views, each
// rounded up to 64 bytes: at most 4 (F_max o + 64 features)); in host memory (gpu:
// gpu_pinned_bytes).
//
// Several ranks (CostOptions::ranks = N > 1; store/engines/sharded_engine.hpp). Every table is
// `gpu` or `hybrid`, sharded row-wise (key k on rank k % N, local row k / N), and the costs are
// those of one rank: rank 0, which holds the largest shard (ceil(rows / N) rows). Each rank trains
// on a batch of the input's step shape (as strata-bench --ranks runs them: rank r takes steps r,
// r + N, ...). Per step rank 0 has K keys, B bags and U distinct keys of its own batch, `remote` of
// them held by other ranks, and serves S keys (S here counts keys, not the stride: every source's
// distinct keys of its shard, a key that several sources look up once to each) of U_s distinct
// shard rows (ShardStep). The bytes (sharded_submit_bytes, sharded_compute_bytes; r, o and R as
// above, words of 8 bytes):
//   all-to-all  keys out, their rows back and gradients out, (8 + 2 r) remote, and one count per
//               table and peer (8 (N - 1)): as dispatch::KeyExchange sends them
//   served      at submit, as its inner gpu or cached engine stages a feature (S unpooled bags of
//               one key): EngineStaging::gpu_feature(S, S, 0, U_s) H2D (none when S = 0); at
//               forward it gathers S rows into device memory (HBM reads S r + 8 (S + 1) + 8 S,
//               writes S r); at backward it updates U_s records from S gradient rows (reads
//               S r + U_s (R + 16) + 8 S, writes U_s R)
//   exchange    device to device (dispatch/exchange.cpp; thread ranks' peer copies, counted as HBM
//               reads at the sender and writes at the receiver): served rows packed (d2d S r),
//               sent (reads S r), received (writes U r) and put at the unique keys (reads U r +
//               8 U, writes U r); gradient sums taken (reads U r + 8 U, writes U r), sent (reads
//               U r), received (writes S r) and copied into the served order (d2d S r); the index
//               lists of both H2D (8 U each)
//   source      the device pools the rank's K keys from its U returned rows (gather_pool) and
//               sums their gradients per unique key (reduce_grads: reads P o + 16 U + 8 K, writes
//               U r); their metadata H2D in 8-byte words: forward offsets, unique index of each key
//               and weights, backward offsets, weights, unique slots and offsets, positions and
//               (pooled) bag of each position; with the trainer on the device the outputs and
//               gradients are the trainer's device buffers (the gradients' NaN/Inf count as for
//               one rank), with it on the host the outputs go D2H and the gradients H2D (P o each)
//   hybrid      as cached on the shard: fills and write-backs of the served rows at submit (and
//               the lists of its slot pool, group_submit_bytes)
// On emu these are rank 0's counters exactly (validate --ranks N, tune/validate.hpp). The
// planner takes the means: S = U (row sharding spreads every rank's keys evenly), U_s the worst
// shard's distinct rows per step (TableLoad::shard_distinct), remote U (N - 1) / N, and for
// hybrid U_s (1 - hit rate) fills and as many write-backs, the hit rate of the worst shard's cache
// of `cache_rows` rows (rows per rank).
// Memory per rank: gpu: the shard's rows in HBM; hybrid: the shard's host records
// (host_table_memory of rank 0), its cache and index as cached; both: the inner engine's staging
// of the served keys as a gpu or cached table's (above) with S_max keys in S_max bags and U_s,max
// distinct rows (S_max: TableLoad::shard_max_served, the most keys one rank serves in one step;
// U_s,max: shard_max_distinct), hybrid with its flush staging or probe; and the engine's device
// scratch in HBM, grown to twice one step's need: served rows, unique rows and their gradient
// sums, and the exchange's send and receive buffers (2 r (S_max + 2 U_max + 2 max(S_max,
// U_max))); the metadata of the source's pooling and gradient sums (2 M, M =
// EngineStaging::sharded_feature(B_max, K_max, 0, U_max)) and the exchange's index lists
// (16 U_max), each in HBM and again in pinned host memory; one step's outputs, then gradients
// (2 o P_max: the engine's buffer and its pinned staging with the trainer on the host, the
// trainer's own buffers in HBM with it on the device); in host memory the communication metadata
// per batch in flight: its unique keys, positions and inverse (8 U + 8 U + 12 K) and the keys sent
// and served (4 U + 24 S_max), and the pinned index lists and staging.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/record_layout.hpp"
#include "store/model/cost_model.hpp"
#include "store/store_config.hpp"

namespace strata {

/// Per-row sizes of a table, in bytes: a row (dim elements of its dtype), an output or gradient
/// row (dim elements of its output_dtype), a gradient row as the device engines update or sum it
/// (dim fp32: half ones widened), a record (row and optimizer state, in whole words) and a record
/// padded to record_words (core/record_layout.hpp), as host tables, slots and staging hold it.
struct RowSizes {
  double row = 0, out = 0, grad = 0, record = 0, stride = 0;
};
/// The row sizes of `spec`.
RowSizes row_sizes(const TableSpec& spec);
/// A row of `spec` as it moves between ranks and through the exchange's buffers (an inner engine's
/// lookup, a gradient sum): fp32 whatever the table's dtype (dispatch/exchange.cpp).
double exchanged_row_bytes(const TableSpec& spec);
/// All-to-all bytes of `remote` keys of `spec` sent to other ranks: each key out, its row back and
/// its gradient out.
double exchange_bytes(const TableSpec& spec, double remote);

/// Host bytes per cache slot of the pool's bookkeeping (estimate from cache/cache_planner.hpp: the
/// 32-byte slot record, the key map's entry of about 16 bytes at its load, the slot's version and
/// eviction-order entry).
inline constexpr double kCacheIndexBytesPerSlot = 64;

/// Per-step shape of one table's keys.
struct TableLoad {
  double keys = 0;                ///< key occurrences per step (mean)
  double bags = 0;                ///< bags per step (mean)
  double distinct = 0;            ///< distinct rows per step (mean)
  std::int64_t max_keys = 0;      ///< most key occurrences of one step
  std::int64_t max_bags = 0;      ///< most bags of one step (0: `bags` rounded up)
  std::int64_t max_distinct = 0;  ///< most distinct rows of one step (the smallest cache)
  /// Several ranks: distinct rows the worst shard serves per step (mean; 0: one rank).
  double shard_distinct = 0;
  /// Several ranks: most distinct rows one shard serves in one step (the smallest hybrid cache).
  std::int64_t shard_max_distinct = 0;
  /// Several ranks: most keys one rank serves in one step (every source's distinct keys of its
  /// shard; 0: the larger of max_distinct and shard_max_distinct).
  std::int64_t shard_max_served = 0;
  /// A table of several features (TableConfig::features; see the header): how many (0 or 1: a
  /// table served with its feature's pooling), and the rows of their outputs per step (mean, and
  /// the most of one step; feature_rows). `bags` is then the table's entry's: the batch's bags.
  int features = 0;
  double feature_rows = 0;
  std::int64_t max_feature_rows = 0;
};

/// One table's keys in one step: exact counts (validate) or rounded means (the planner).
struct BatchKeys {
  std::int64_t keys = 0;        ///< key occurrences (K)
  std::int64_t bags = 0;        ///< bags (B)
  std::int64_t distinct = 0;    ///< distinct rows (U)
  std::int64_t weights = 0;     ///< per-key weights given (0 or K)
  std::int64_t fills = 0;       ///< cached: rows filled into the cache (F)
  std::int64_t writebacks = 0;  ///< cached: dirty rows written back (W)
  /// A table of several features (see the header): its features in the batch (0 or 1: a table
  /// served with its feature's pooling) and the rows of their outputs (feature_rows); `bags` is
  /// then the table's entry's (the batch's bags, once).
  std::int64_t features = 0;
  std::int64_t feature_rows = 0;
};

/// The rows of the outputs of `table`'s features in a batch of `bags` bags whose features have
/// `keys[j]` key occurrences (the table's features' order; TableConfig::features): a bag each per
/// pooled feature, a key each per unpooled one. A table of one feature: its pooled rows.
std::int64_t feature_rows(const TableConfig& table, std::int64_t bags, const std::vector<std::int64_t>& keys);

/// Options shared by every table's cost.
struct CostOptions {
  int max_in_flight = 8;          ///< batches in flight (StoreConfig::cache.max_in_flight)
  int numa_nodes = 1;             ///< NUMA nodes of the planned machine (host table layout)
  int threads = 0;                ///< store worker threads (CPU optimizer scratch; 0: this machine's cores)
  std::uint64_t l2_bytes = 0;     ///< L2 of one core (CPU optimizer scratch; 0: this machine's)
  int ranks = 1;                  ///< ranks of the world (> 1: gpu and hybrid tables sharded row-wise; costs per rank)
  bool trainer_on_device = true;  ///< the trainer's dense model on the GPU (strata-bench --trainer device)
  bool zero_copy = false;         ///< cached: zero-copy fills and write-backs (else staged; emu always stages)
  bool offload_cpu_gather = false;  ///< offload tables pooled by CPU threads (StoreConfig::offload_gather cpu)
  bool check_finite = true;         ///< device gradients checked for NaN and Inf (accept_nonfinite_gradients false)
  bool store_has_device =
      false;                   ///< a table of the store is not `cpu` (its cpu tables' device gradients are checked too)
  bool transfer_probe = true;  ///< cached: cache.transfer auto (the store measures both transfers when it opens)
  /// Several ranks, memory: the whole table on the rank, serving every rank's distinct keys (an
  /// upper bound for table, column and replicated sharding; store_memory sets it per table). The
  /// step bytes stay those of row sharding.
  bool whole_shards = false;
};

/// Bytes one table's batch moves when it is submitted (cached: planned): metadata, cached fills
/// and write-backs, offload's reads of host rows. One rank.
StepBytes submit_bytes(const TableSpec& spec, Placement placement, const BatchKeys& k, const CostOptions& options);
/// Bytes of one table's forward and backward of a batch: gathers, updates, the trainer's outputs
/// and gradients, CPU kernels. One rank.
StepBytes compute_bytes(const TableSpec& spec, Placement placement, const BatchKeys& k, const CostOptions& options);
/// Bytes a batch moves once per group of tables (cached: a slot pool, the tables of one dim and
/// optimizer state; offload: the tables of one dim) at submit: the group's lists of `fills`,
/// `writebacks` (cached) or `distinct` rows (offload) in the metadata.
StepBytes group_submit_bytes(Placement placement, std::int64_t fills, std::int64_t writebacks, std::int64_t distinct,
                             const CostOptions& options);

/// One sharded table's keys on one rank in one step (several ranks, row sharding).
struct ShardStep {
  /// The rank's own batch: K keys, B bags, U distinct keys (whose rows come from their holders).
  BatchKeys source;
  std::int64_t remote = 0;  ///< of the U, those held by other ranks (sent over the all-to-all)
  /// The keys the rank serves: every source's distinct keys of its shard, one unpooled bag each
  /// (keys = bags = S), U_s distinct rows of the shard among them (`distinct`), and a hybrid
  /// cache's fills and write-backs of them.
  BatchKeys served;
};

/// Bytes one rank's sharded table moves when a batch is submitted: the inner engine's (gpu or
/// cached) staging of the served keys, and a hybrid cache's fills and write-backs (not the lists
/// of its slot pool: group_submit_bytes, kCached).
StepBytes sharded_submit_bytes(const TableSpec& spec, Placement placement, const ShardStep& k,
                               const CostOptions& options);
/// Bytes of one rank's forward and backward of a sharded table: the served rows' lookup and
/// update, the rows and gradient sums exchanged device to device, the source's pooling and
/// gradient sums and their metadata, the trainer's outputs and gradients, and the all-to-all
/// (the same for gpu and hybrid).
StepBytes sharded_compute_bytes(const TableSpec& spec, const ShardStep& k, const CostOptions& options);

/// One table in one placement.
struct TableCost {
  StepBytes bytes;        ///< per step
  double hbm_bytes = 0;   ///< HBM taken
  double host_bytes = 0;  ///< host memory taken
  double comm_bytes = 0;  ///< several ranks: the communication buffers, part of host_bytes
  /// The table's host records (and CPU optimizer scratch) as host_table_memory maps the table
  /// alone, part of host_bytes; the rest is staging, cache index and communication buffers.
  double host_table_bytes = 0;
  /// A cache's flush staging, part of hbm_bytes and host_bytes: as if the table's slot pool were the
  /// store's only one (the store keeps one flush staging for its largest pool's chunk; store_memory
  /// counts it once, the planner sums every cached table's).
  double flush_hbm_bytes = 0, flush_host_bytes = 0;
  /// A gpu table's pinned staging (the ring's mirrored side; with the trainer on the host the
  /// activation staging of the host views), not part of host_bytes (the planner budgets host
  /// memory for host tables); store_memory counts it.
  double gpu_pinned_bytes = 0;
};

/// The cost of `spec` (validated) in `placement` with `load`; for cached and hybrid, a cache of
/// `cache_rows` rows (hybrid: per rank) with LRU hit rate `hit_rate`. One rank: cpu, offload,
/// cached or gpu (hybrid is an error). Several ranks: gpu or hybrid, sharded row-wise, the cost of
/// rank 0 (the others are errors: a world takes only sharded tables).
Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& options);

/// Adds `b` into `total` (every link, and the gathers appended).
void add_bytes(StepBytes& total, const StepBytes& b);
/// Multiplies every byte count of `b` (and its gathers' rows) by `f`.
void scale_bytes(StepBytes& b, double f);

/// A table's step at its largest when only its shape is known (a memory estimate before any key
/// is read): `keys` key occurrences in `bags` bags, every key a distinct row (at most the table's
/// rows; over `ranks` > 1 ranks, at most a shard's rows each rank serves). The means equal the
/// maxima.
TableLoad largest_load(const TableSpec& spec, std::int64_t keys, std::int64_t bags, int ranks = 1);

/// A slot pool of a store's caches: the `cached` and `hybrid` tables of one record shape (dim,
/// dtype, optimizer state elements and their dtype: record_shape) share one, as the slot-pool
/// engines group them (store/engines/detail/slot_pool_engine.hpp, keyed by RecordShapeLess).
struct SlotPool {
  RecordShape shape;                ///< the tables' record shape
  std::string name;                 ///< as the store names it in messages: "(dim 16, state 0)"
  std::int64_t rows = 0;            ///< slots: the sum of the tables' cache_rows
  std::vector<std::size_t> tables;  ///< indices into the config's tables
};
/// The slot pools of `config`'s cached and hybrid tables, shapes ascending (the tables' cache rows
/// as configured: a hybrid table's are per rank).
std::vector<SlotPool> slot_pools(const StoreConfig& config);

/// What one rank of a store takes by the model, beside the tables' host records.
struct StoreMemory {
  double hbm_bytes = 0;           ///< device memory (rank 0's: the largest shards)
  double host_staging_bytes = 0;  ///< host memory beside the records: pinned staging, cache indexes, communication
};
/// The memory of one rank of a store opened with `config` (validated), by the model: the sum over
/// its tables of table_cost's HBM, and of its host memory less each table's own records
/// (TableCost::host_table_bytes: host_table_memory counts those for the whole config, where small
/// tables share arenas), with gpu tables' pinned staging, and the store's one flush staging (the
/// largest of its slot pools' chunks) in place of each cached table's. `loads[t]`: table t's step
/// (config order). Caches: each table's cache_rows (several ranks: of rank 0's shard, row sharding;
/// a table of another sharding plan is priced whole on the rank, CostOptions::whole_shards); a hit
/// rate of 0 (memory does not depend on it).
/// Without a world (options.ranks 1) a hybrid table is priced as a cached one, as Store::open opens
/// it. Errors: table_cost's; a load count other than the tables'.
Result<StoreMemory> store_memory(const StoreConfig& config, const std::vector<TableLoad>& loads,
                                 const CostOptions& options);

}  // namespace strata
