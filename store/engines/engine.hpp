#pragma once
// Engine: what one placement mode does for the tables placed in it. The store validates, tracks
// batches in flight and fans out to its engines (cpu, offload, cached, gpu, hybrid); an
// engine serves several tables at once so that device work can be table-batched. Engines receive
// only validated input and run inside the store's oneTBB arena, one call at a time.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cache/cache_planner.hpp"
#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "store/store.hpp"

namespace strata {
class HostTable;
}  // namespace strata

namespace strata::detail {

/// Per-batch state an engine keeps from submit to backward/discard.
struct EngineBatch {
  virtual ~EngineBatch() = default;
};

/// The features of a batch that one engine serves.
struct EngineFeatures {
  std::vector<int> feature;  ///< indexes into KeyBatch::features (and the output/gradient views)
  std::vector<int> table;    ///< global table index of each
  bool empty() const noexcept { return feature.empty(); }
};

/// How the device work of one forward or backward is ordered with the caller's
/// (Store::forward/backward with a stream). Only engines with device_views() get a non-empty one.
struct CallOrder {
  gpu::EventView after;    ///< recorded on the caller's stream: the engine's device work waits for it (empty: none)
  gpu::StreamView caller;  ///< the caller's stream, which waits for the engine's work on device views; empty: a
                           ///< synchronous call, where the host waits for that work instead
};

class Engine {
 public:
  virtual ~Engine() = default;
  /// Accepts a validated batch. May fail (e.g. the cache cannot hold it) only before changing any
  /// table state. `batch` stays alive and unchanged until the batch is retired.
  virtual Result<std::unique_ptr<EngineBatch>> submit(std::int64_t id, const KeyBatch& batch,
                                                      const EngineFeatures& f) = 0;
  /// The refusals of submit that do not depend on a batch's keys (a failed device, batches in flight at a limit),
  /// asked before the batch's keys of dynamic tables get rows (an admission a later refusal leaves in place).
  /// Default: none.
  virtual Status accepting() { return Status::ok(); }
  /// Writes the outputs of the engine's features (views indexed like batch.features; shapes,
  /// spaces and device ranges checked). Views are host memory unless device_views().
  virtual Status forward(EngineBatch& b, const KeyBatch& batch, const EngineFeatures& f,
                         const std::vector<MatrixView>& outputs, const CallOrder& order) = 0;
  /// Applies the gradients with each table's optimizer at store step `t` (1-based) and retires the
  /// batch. Views are host memory unless device_views(); device gradients are already checked finite.
  /// Called after prepare_backward of the same call succeeded on every engine.
  virtual Status backward(EngineBatch& b, const KeyBatch& batch, const EngineFeatures& f,
                          const std::vector<ConstMatrixView>& grads, std::int64_t t, const CallOrder& order) = 0;
  /// Called by the store, for one backward call, on every engine with a part in the batch before
  /// any engine's backward, after the gradients were checked (shapes, finiteness): the work of the
  /// call that may fail without changing any table state, done first so that a failure (on the
  /// device, say) refuses the whole call with nothing applied anywhere and the batch in flight (a
  /// later backward calls it again; discard does not). An engine whose updates run on the CPU
  /// copies its device gradients to host memory here. `grads` and `order` as for backward.
  /// Default: nothing.
  virtual Status prepare_backward(EngineBatch& /*b*/, const KeyBatch& /*batch*/, const EngineFeatures& /*f*/,
                                  const std::vector<ConstMatrixView>& /*grads*/, const CallOrder& /*order*/) {
    return Status::ok();
  }
  /// Called by the store when this engine's backward of a call returned ok but a later engine's
  /// failed (the device failed during the call, so the store refuses the call: the step does not
  /// advance and the host tables are unchanged). What this engine applied lives only in the failed
  /// device's memory and is not part of the store's state: an engine that counts applied updates
  /// (cached: the calls since the last flush, which decide what a read after the fault may return)
  /// forgets the call. Default: nothing.
  virtual void backward_not_applied() {}
  /// Whether forward and backward take views in device memory (MemorySpace::kDevice) and a
  /// CallOrder: the lookups write into them and the updates read from them on the device, ordered
  /// after `order.after`, and `order.caller` waits for that work (the host, without one); an engine
  /// that updates on the CPU (offload) copies device gradients to the host in prepare_backward. The
  /// store stages device views through pinned host memory for the other engines (host_bounce.hpp).
  virtual bool device_views() const noexcept { return false; }
  /// Retires a batch without applying anything.
  virtual Status discard(EngineBatch& b, const KeyBatch& batch, const EngineFeatures& f) = 0;

  /// The keys of a batch to be submitted later (Store::preview, validated; ids increase from one
  /// preview to the next; `f` not empty). For engines that plan ahead; keys only, no table state
  /// changes, `batch` is not kept. Others ignore it (the default).
  virtual void preview(std::int64_t /*id*/, const KeyBatch& /*batch*/, const EngineFeatures& /*f*/) {}
  /// Batch `id`, which had been previewed, was submitted (every engine accepted it): forget the
  /// previews of ids up to `id` (a submit() of `id` may already have taken its own).
  virtual void previews_done(std::int64_t /*id*/) {}
  /// Forget every preview.
  virtual void drop_previews() {}
  /// Makes every applied update visible in the host tables.
  virtual Status flush() = 0;
  /// Row copies of a table this engine serves (range checked by the store); state may be null.
  /// write_rows is only called with no batch in flight.
  virtual Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) = 0;
  virtual Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) = 0;
  /// Rows `rows` of table `table` (its spec; any order, repeats allowed; range checked by the store), as read_rows of
  /// each; state may be null. Default: read_rows of each run of consecutive rows (the rows sorted, through buffers of
  /// a run); engines whose read_rows flushes flush once.
  virtual Status read_rows_at(int table, const TableSpec& spec, const std::vector<std::int64_t>& rows, float* weights,
                              float* state);
  /// Overwrites rows of a dynamic table that no batch in flight uses, in every tier that holds them: they are given to
  /// new keys before the batch that uses them is submitted, with earlier batches in flight (and forwards of discarded
  /// ones that may still read them). n = rows.size() rows of fp32 weights and state, rounded into the table's dtypes as
  /// write_rows rounds. Default: the engine serves no dynamic table.
  virtual Status reset_rows(int /*table*/, const std::vector<std::int64_t>& /*rows*/, const float* /*weights*/,
                            const float* /*state*/) {
    return Status::internal(std::string(name()) + " engine: reset_rows of a dynamic table it does not serve");
  }
  /// This rank's part of a table this engine serves: narrows `info` (the whole table, Store::shard_info's default) for
  /// engines that shard. Rows of that part (range checked by the store against it; by default the whole table's).
  virtual void shard_info(int /*table*/, ShardInfo& /*info*/) const {}
  virtual Status read_shard(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) {
    return read_rows(table, row0, n, weights, state);
  }
  virtual Status write_shard(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) {
    return write_rows(table, row0, n, weights, state);
  }
  /// Table `table`'s learning rate in the store's config changed (Store::set_learning_rate, load):
  /// for engines that keep their own copy of the optimizer spec. Engines that read the store's
  /// config at backward need nothing (the default).
  virtual void learning_rate_changed(int /*table*/, float /*learning_rate*/) {}
  /// Per-table cache statistics (global table index), for engines that cache.
  virtual void cache_stats(std::vector<std::pair<int, cache::CacheStats>>&) const {}
  /// Adds the staging this engine holds between calls (StoreStats::staging, activation_staging).
  /// Default (no staging): nothing.
  virtual void staging_stats(StagingBytes& /*batches*/, StagingBytes& /*activations*/) const {}
  /// Its name in StoreStats::numa_engines and numa_tables: "cpu", "offload", "cached", "gpu" or "sharded".
  virtual const char* name() const noexcept = 0;
  /// Whether it works through the store's device (its pinned staging counts in StoreStats::numa_engines). Default: yes.
  virtual bool uses_device() const noexcept { return true; }
  /// Adds (global table index, its host table) for each table whose rows (or shard) it holds in host memory. Default
  /// (rows in device memory): nothing.
  virtual void host_tables(std::vector<std::pair<int, const HostTable*>>& /*out*/) const {}
  /// Traffic between ranks and where the time went, for engines that dispatch.
  virtual void dispatch_stats(DispatchStats&) const {}

  /// Collective engines (sharded tables) take part in every submit/forward/backward/discard and
  /// read_rows of their tables on every rank, even with no features of their own in a batch.
  virtual bool collective() const noexcept { return false; }
  /// For collective engines: this rank failed `op` on `id` before reaching the engine (bad input);
  /// tells the other ranks, which are waiting in the same call, and returns `why`.
  virtual Status refuse(const char* /*op*/, std::int64_t /*id*/, const Status& why) { return why; }
};

/// Adds `entries` staging entries of `z` bytes in all to `to` (Engine::staging_stats): a mirrored
/// region counts on both sides.
inline void add_staging(const gpu::StagingSizes& z, std::size_t entries, StagingBytes& to) {
  to.pinned += z.mirrored + z.host_only;
  to.device += z.mirrored + z.dev_only;
  to.entries += entries;
}

/// Adds the free entries of `ring` to `to`, and the entries it made ahead of the device.
inline void add_staging(const gpu::StagingRing& ring, StagingBytes& to) {
  add_staging(ring.free_capacity(), ring.free_entries(), to);
  to.ahead += ring.made_ahead();
}

}  // namespace strata::detail
