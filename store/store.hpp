#pragma once
// Store: the public API of Strata. A trainer submits batches ahead of time, runs forward and
// backward (the optimizer is fused into backward), and checkpoints. Every placement mode sits
// behind this one interface, and so does the reference implementation used as the test oracle.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "store/stats.hpp"
#include "store/store_config.hpp"

// Declared only (calls taking a StreamView need its definition): a trainer that calls them includes
// gpu/device.hpp (device(), its streams and buffers) or a dispatch/ communicator header.
namespace strata::gpu {
class Device;
class StreamView;
}  // namespace strata::gpu
namespace strata::dispatch {
class Communicator;
}  // namespace strata::dispatch

namespace strata {

/// What this rank holds of a table (Store::shard_info): local row i is global row row_start + i * row_step, local
/// column j global column col_offset + j, as dispatch places them (dispatch/sharding_plan.hpp): row sharding puts key k
/// on rank k % world (row_start = rank, row_step = world; other types 0 and 1), column sharding gives the first
/// dim % world ranks one column more. Without a world: {kReplicated, 1, 0, the whole table, replicas {0}}.
struct ShardInfo {
  dispatch::ShardingType type = dispatch::ShardingType::kReplicated;
  int world = 1, rank = 0;
  std::int64_t rows = 0, dim = 0;                            ///< of the whole table
  std::int64_t local_rows = 0, row_start = 0, row_step = 1;  ///< local_rows, local_dim 0 (and row_start 0) if none held
  std::int32_t col_offset = 0, local_dim = 0;
  std::vector<int> replicas;  ///< the ranks holding this same shard, this one included, ascending (empty: none)
};

/// Changes a checkpoint's recorded config before Store::open_checkpoint opens it (see there).
using ConfigOverrides = std::function<void(StoreConfig&)>;

/// An embedding store. Create with Store::open (or open_reference_store for the oracle).
/// Training step protocol, per batch id (any int64, unique among batches in flight):
///   [preview(id, batch)] -> submit(id, batch) -> forward(id, outputs) -> backward(id, grads) (or discard(id))
/// Several batches may be in flight (submitted, not yet backward); `cached` tables prefetch their missing rows for them
/// at submit. Previews (optional) announce the keys of batches further ahead to the cache planner. forward reads the
/// rows as of the call; backward applies the optimizer to the rows the batch used. Every call validates all its input
/// before changing anything: on error nothing changed.
/// Thread-safety: one thread drives a Store (calls are not concurrent); CPU kernels run on its own oneTBB arena.
class Store {
 public:
  /// Validates the config and builds the tables (allocating and initialising host memory). `gpu` tables live on this
  /// store's device; `hybrid` tables are sharded over a world of one.
  static Result<std::unique_ptr<Store>> open(const StoreConfig& config);
  /// One rank of a world: `gpu` and `hybrid` tables are sharded over the ranks of `comm` by each table's ShardingPlan
  /// (with more than one rank, every table must be `gpu` or `hybrid`). Every rank opens its store with the same config,
  /// and then makes the same calls in the same order: submit/forward/backward/discard of each batch (its own keys; a
  /// batch may be empty on some ranks), read_rows (and so export_npy), save, load and set_learning_rate are
  /// collectives. write_rows/import_npy are local and must be given the same rows on every rank. open itself is
  /// collective: if any rank fails, every rank fails.
  ///
  /// Before building anything, open refuses on every rank a config that differs from rank 0's, naming the rank and the
  /// first field ("rank 2: table 'user' rows 1000 differs from rank 0's 2000"). Must match: the tables (all but their
  /// `cache`), cache.max_in_flight and cache.preview (ranks must accept the same calls). May differ, as they describe
  /// the rank's machine or its speed and never change results: threads, numa, numa_node, huge_pages, fake_numa_nodes,
  /// `device`, offload_gather, cache.policy, cache.lookahead, cache.planner_partitions, cache.transfer, and each
  /// table's `cache` size and cap (rows a rank's cache cannot hold bypass it; a batch its device cannot hold fails
  /// every rank).
  static Result<std::unique_ptr<Store>> open(const StoreConfig& config,
                                             const std::shared_ptr<dispatch::Communicator>& comm);

  /// Opens a store from a checkpoint alone: the config save() recorded in its manifest, then load() of its rows, state,
  /// step and rates; it continues bit for bit as the store that saved it. `overrides` edits the recorded config first,
  /// only in the fields that may differ per rank (see open(config, comm)). Errors, nothing opened: FailedPrecondition
  /// for a manifest without a config (open with its config, then load()); InvalidArgument naming another field
  /// overridden ("open_checkpoint 'ckpt': table 'user' rows 10 differs from the checkpoint's 20"); open()'s and
  /// load()'s. A concurrent save makes it start over (10 times at most). One store: a world's ranks open(config, comm).
  static Result<std::unique_ptr<Store>> open_checkpoint(const std::string& dir, const ConfigOverrides& overrides = {});

  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// The config it was opened with, each table's optimizer.learning_rate the rate in force (set_learning_rate, load).
  const StoreConfig& config() const noexcept { return config_; }
  /// Index of a table by name, or NotFound.
  Result<int> table_index(const std::string& name) const;
  /// The largest step(): the next backward takes step t = step() + 1, an int64 (Adam's bias correction reads it), so a
  /// store at kMaxStep refuses backward, and set_step and load refuse a larger count.
  static constexpr std::int64_t kMaxStep = INT64_MAX - 1;
  /// Number of backward() calls applied so far (Adam's step t is step() + 1 in the next backward). Restored by load()
  /// and set_step(); write_rows() leaves it alone. At most kMaxStep.
  std::int64_t step() const noexcept { return step_; }
  /// Sets step() (a trainer restoring a store from what it saved itself: read_rows/write_rows, learning_rate/
  /// set_learning_rate and step/set_step are together what save/load restore); the next backward is step `step + 1`.
  /// Errors (nothing changes): InvalidArgument for `step` < 0 or > kMaxStep, FailedPrecondition with batches in flight.
  /// On a world of several ranks, a collective like set_learning_rate: a rank refused or ranks setting different steps
  /// fail every rank ("ranks disagree on the step: rank 0 at set_step(5), rank 1 at set_step(6)"), no step changed.
  Status set_step(std::int64_t step);

  /// Validates `batch` (known features, each at most once, one batch size, offsets, key ranges, weights) and dedups
  /// its keys: a table's features share its rows (StoreConfig features). A dynamic table admits keys here, unless
  /// batch.train is false (core/dynamic_spec.hpp), and refuses a batch whose new keys cannot fit (ResourceExhausted).
  /// Fails with AlreadyExists when `batch_id` is in flight. A `cached` table takes a batch of any size: rows that do
  /// not fit its cache are read and updated outside it (CacheStats::bypassed); only a batch whose rows beyond the cache
  /// and staging could not fit the device's memory beside the cache is refused (ResourceExhausted).
  virtual Status submit(std::int64_t batch_id, KeyBatch batch) = 0;
  /// Looks up a submitted batch. `outputs[i]` receives feature i of the batch: (batch, dim) for pooled features,
  /// (num_keys, dim) for pooling none. Each view is host memory or, with `space = MemorySpace::kDevice`, memory of
  /// device() (see "Outputs and gradients on the device" below). Synchronous: on return every output is written (the
  /// host waited for the device). Device views are written with no order against any caller stream: work of the caller
  /// that still reads these buffers must be synchronized before the call.
  virtual Status forward(std::int64_t batch_id, const std::vector<MatrixView>& outputs) = 0;
  /// Applies gradients of the outputs (same shapes and memory spaces as forward's) to the rows the batch used, with
  /// each table's optimizer, then retires the batch. Requires forward(batch_id) first. Synchronous: on return the
  /// gradients have been read (device gradients: the host waited for the updates that read them; host gradients are
  /// copied before the call returns). Device gradients are read with no order against any caller stream: the caller
  /// must have synchronized the work that wrote them. Gradients holding NaN or Inf are refused (InvalidArgument naming
  /// the table, bag and column; nothing changes, the batch stays in flight) unless accept_nonfinite_gradients. On a
  /// failed device nothing is applied to the tables in host memory and step() does not advance. With cache.flush_every
  /// = N, every N-th step then flushes (its error is returned after the step was applied). At step() == kMaxStep it is
  /// refused (OutOfRange; nothing changes).
  virtual Status backward(std::int64_t batch_id, const std::vector<ConstMatrixView>& grads) = 0;

  /// Outputs and gradients on the device. A trainer whose dense model runs on the GPU gives views of device() memory
  /// (MemorySpace::kDevice): `gpu`, `cached` and `hybrid` tables (sharded over a communicator or not) look up straight
  /// into them and read fp32 gradients straight from them, with no PCIe copy and no host memcpy. `offload` tables look
  /// up into them too (with offload_gather cpu, the CPU's outputs are copied H2D into them once) and copy each gradient
  /// D2H once for their CPU optimizer. `cpu` tables go through pinned host memory: their outputs are copied H2D into
  /// the device views and their gradients D2H (all counted in stats().links). Views of one call may mix spaces; a
  /// gradient view must be in the space of forward's output of its feature. Keys stay host memory: the planner reads
  /// them on the CPU, ahead of the device.
  ///
  /// Stream-ordered calls: forward/backward(id, views, stream) with a stream of device(). The store's device work runs
  /// after everything queued on `stream` before the call, and whatever is queued on `stream` after the call runs after
  /// it (forward: the outputs written; backward: the gradients read), so the trainer's kernels and the store's need no
  /// host sync between them. What the host waits for in each case: README.md, "What a stream-ordered call waits for".
  /// Both keep the views and `stream` in use until the work queued on `stream` after the call has run: do not free or
  /// reuse them before. Errors, as for every bad input, change nothing (the batch stays in flight): a device view on a
  /// store without a device or outside device()'s memory (a host pointer marked kDevice), a gradient view in another
  /// space than forward's output, a null stream or one of another device (a store without a device takes none).
  virtual Status forward(std::int64_t batch_id, const std::vector<MatrixView>& outputs, gpu::StreamView stream) = 0;
  virtual Status backward(std::int64_t batch_id, const std::vector<ConstMatrixView>& grads, gpu::StreamView stream) = 0;
  /// The device of its `gpu`, `cached`, `offload` and `hybrid` tables (nullptr without one), for device views and
  /// streams; it lives as long as the store.
  virtual gpu::Device* device() noexcept { return nullptr; }
  /// Retires a submitted batch without backward (inference).
  virtual Status discard(std::int64_t batch_id) = 0;

  /// Announces the keys of a batch the trainer will submit later, so that the `lookahead` cache policy plans with a
  /// deeper window than the batches in flight (CacheConfig): a data loader typically knows the keys of many batches
  /// before the staging ring has room to submit them. Keys only: nothing is pinned, fetched, staged or planned, and no
  /// row changes; `batch` is validated as submit validates it and need not stay alive (only its unique keys are kept).
  ///
  /// The rules (ids increase, at most cache.preview pending, what submit and drop_previews do): README.md, "Previews".
  /// Only `cached` tables (and `hybrid` ones without a communicator) with the lookahead policy use previews; every
  /// other mode validates and ignores them. Local to this rank. Errors (nothing changes): "preview of batch ID: ...".
  virtual Status preview(std::int64_t batch_id, const KeyBatch& batch) = 0;
  /// Forgets every preview not yet submitted (see preview()). Never fails.
  virtual void drop_previews() = 0;
  /// Batches previewed and not yet submitted nor dropped.
  virtual std::int64_t previewed() const noexcept = 0;
  /// Makes every update visible in host memory (a no-op for `cpu`; caches write back).
  virtual Status flush() = 0;

  /// Copies rows [row0, row0+n) of a table: weights (n, dim) and, when non-null, optimizer state (n, state_dim), into
  /// host buffers. Sees every applied backward. After a device fault, a cached table reads from host memory when no
  /// backward was applied since the last flush, and fails with DataLoss (naming the steps lost) otherwise. Rows only:
  /// the rest of what the next backward reads is learning_rate() and step() (see set_step). `state` holds
  /// optimizer_state_dim(kind, dim) floats a row (core/table_spec.hpp; 0 for sgd).
  virtual Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) = 0;
  /// read_rows of the table named `table` (NotFound for an unknown name).
  Status read_rows(const std::string& table, std::int64_t row0, std::int64_t n, float* weights, float* state);
  /// Overwrites rows [row0, row0+n) (weights, and state when non-null). Fails if batches are in flight. Rows only: the
  /// learning rates and step() stay as they are (set_learning_rate, set_step).
  virtual Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) = 0;
  Status write_rows(const std::string& table, std::int64_t row0, std::int64_t n, const float* weights,
                    const float* state);  ///< by name, as read_rows
  /// A dynamic table's keys that have a row, ascending; read_keys reads their rows as read_rows (NotFound naming a key
  /// without one, nothing copied). InvalidArgument for a dense table.
  virtual Result<std::vector<Key>> keys_held(int table) const = 0;
  virtual Status read_keys(int table, const std::vector<Key>& keys, float* weights, float* state) = 0;
  /// Makes a dynamic table hold exactly `keys` (distinct, at most its capacity; key i in row i), with these weights
  /// (n, dim) and state (null: initial state; a key it held keeps its own), rounded as write_rows rounds, each as just
  /// used (last use the clock, count 1, touched in list order). Fails with batches in flight; errors change nothing.
  Status write_keys(int table, const std::vector<Key>& keys, const float* weights, const float* state);
  /// This rank's part of table `table` (NotFound for an unknown index). Local: no collective.
  virtual Result<ShardInfo> shard_info(int table) const;
  /// Copies local rows [local_row0, local_row0+n) of this rank's shard: weights (n, local_dim) and, when non-null,
  /// state (n, optimizer_state_dim(kind, local_dim)): block b's local column j is global state column b * dim +
  /// col_offset + j (adam: an m then a v slice; rowwise_adagrad is never column-sharded). Local (no collective),
  /// otherwise as read_rows. Refuses a table this rank does not hold and a range outside [0, local_rows), unchanged.
  Status read_shard(int table, std::int64_t local_row0, std::int64_t n, float* weights, float* state);
  /// Overwrites local rows of this rank's shard, as read_shard reads them; fails if batches are in flight. Local: a
  /// replicated table's other replicas keep their rows (give each the same).
  Status write_shard(int table, std::int64_t local_row0, std::int64_t n, const float* weights, const float* state);
  /// Sets the learning rate of one table, used from the next backward() on (batches already in flight included;
  /// schedules such as warm-up or decay call it between steps). `learning_rate` must be finite and >= 0, as in the
  /// config: 0 (-0.0 is held as 0) is an update of zero, which keeps every weight's bits while Adagrad's and Adam's
  /// state still advance as the optimizer defines (a schedule that decays to 0). Errors (nothing changes): NotFound for
  /// an unknown table, InvalidArgument "set_learning_rate: table 'user': learning_rate -1 (expected a finite number >=
  /// 0)". Saved by save() and restored by load(). On a world of several ranks a collective like submit: every rank sets
  /// the same table and rate at the same step(); a rank refused, or ranks that disagree, fail every rank (naming each
  /// rank's call: "set_learning_rate: ranks disagree: rank 0 sets table 'user' to 0.1 at step 5, ..."), none changed.
  Status set_learning_rate(const std::string& table, float learning_rate);
  /// Sets the learning rate of every table (checked for all before any changes; collective on a world, as above, where
  /// setting every table differs from setting each one).
  Status set_learning_rate(float learning_rate);
  /// The learning rate in force for a table, or NotFound.
  Result<float> learning_rate(const std::string& table) const;

  /// Counters so far (cache statistics, bytes per link). Cheap; does not synchronize.
  virtual StoreStats stats() const { return {}; }
  /// Batches submitted and not yet retired.
  virtual std::int64_t in_flight() const noexcept = 0;

  /// Writes a checkpoint of every table (rows, optimizer state), the step, the rates and the whole config (what
  /// open_checkpoint reopens) into `dir`: checksummed table files, then a manifest, each written to a temporary name,
  /// fsynced and renamed (a crash mid-save leaves the previous checkpoint intact), from rows read through the store
  /// (dirty cached rows written back first). Savers sharing `dir` take turns on a lock (flock); loads meanwhile are
  /// safe. On a world, a collective into one `dir` all ranks share: each rank writes the shards it holds (a replicated
  /// table once), the manifest commits once every rank's pieces are durable; ranks at different steps are refused.
  Status save(const std::string& dir);
  /// Restores a checkpoint of save() (of a store or a world of any size and sharding) for the same tables (names,
  /// rows, dims, dtypes, optimizers): rows and state where this store's sharding puts them, the step and the rates (the
  /// checkpoint's replace the store's, unless it predates recorded rates). Collective on a world (each rank reads some
  /// pieces and sends rows to their holders). Reads one manifest (rank 0's), opens each file once and verifies sizes
  /// and checksums before any row changes, then copies from those descriptors: a concurrent save cannot mix
  /// checkpoints (load starts over, up to 10 times). Errors before the copy (a missing or corrupt file, named; a path
  /// outside `dir`; another config) change nothing on any rank; a read or device error during it: "load failed while
  /// copying rows" (a mix of rows; step and rates unchanged: load again). Refused with batches in flight.
  Status load(const std::string& dir);
  /// load() that converts rows or state saved at another dtype: widened, or rounded to nearest (a value the dtype
  /// cannot hold refuses the load before the copy).
  Status load_converting_dtypes(const std::string& dir);
  /// Writes a table's weights as a NumPy .npy (rows, dim): fp32, fp16 for an fp16 table, bf16 widened to fp32.
  /// A dynamic table's: (keys held, dim) in keys_held order, its keys (int64) in `<path stem>.keys.npy` beside it.
  Status export_npy(const std::string& table, const std::string& path);
  /// Replaces a table's weights from a .npy (rows, dim) of <f4 or <f2, rounded to nearest into its dtype (state kept).
  /// A dynamic table's: both files export_npy writes, through write_keys (state kept for keys held, else initial).
  Status import_npy(const std::string& table, const std::string& path);

 protected:
  explicit Store(StoreConfig config) : config_(rates_held(std::move(config))) {}
  /// Table `table`'s learning rate in config_ changed to `learning_rate` (already checked): for implementations that
  /// keep a copy of the optimizer spec. Reading config_ at backward needs nothing.
  virtual void learning_rate_changed(int /*table*/, float /*learning_rate*/) {}
  /// The communicator of a store opened as a rank of a world, else null (set_learning_rate is a collective over it).
  virtual dispatch::Communicator* world() noexcept { return nullptr; }
  /// read_shard/write_shard once checked; by default read_rows/write_rows (a store without a world).
  virtual Status read_own_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state);
  virtual Status write_own_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state);
  StoreConfig config_;
  std::int64_t step_ = 0;

 private:
  /// `config` with each table's rate as held (-0.0 as 0), as open keeps it (store/learning_rate.cpp).
  static StoreConfig rates_held(StoreConfig config);
  /// Sets table `table`'s rate (already checked, and agreed on a world) on this rank alone.
  void apply_learning_rate(int table, float learning_rate);
  /// load(dir); with `manifest` (the MANIFEST text open_checkpoint read its config from), that manifest only, so that
  /// the config and the rows come from one checkpoint: no retry with a newer one (open_checkpoint starts over instead).
  Status load_checkpoint(const std::string& dir, const std::string* manifest, bool convert_dtypes = false);
};

/// The oracle: a deliberately simple implementation (plain loops over std::vector rows, no dedup, computed on the
/// calling thread; only the gradients' finiteness check, shared with the store, reads them in parallel in the caller's
/// oneTBB arena) that every mode is tested against. Same API, same results. open_reference_world holds each dynamic
/// table in `world` shards, as a store of that many ranks does (dispatch::ShardLayout::key_owner), side by side.
Result<std::unique_ptr<Store>> open_reference_store(const StoreConfig& config);
Result<std::unique_ptr<Store>> open_reference_world(const StoreConfig& config, int world);

}  // namespace strata
