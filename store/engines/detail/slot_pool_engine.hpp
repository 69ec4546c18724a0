#pragma once
// The device core of the slot-pool placements (`gpu`, `cached`): HBM slot pools, one per record
// shape (dim, optimizer state, their element types) and shared by the tables of that shape, a copy and a compute
// stream, and the lookups and fused updates of a batch whose rows are in their slots. What differs between the
// placements stays with them: `gpu` maps a row to slot table base + row, with no misses (gpu_engine.cpp); `cached`
// plans slots with its prefetcher and moves rows in and out of them on the copy and write-back streams
// (cached_engine.cpp). Both stage a batch's arguments into a staging entry of this core's pool (device_features.hpp)
// and record its ready() once its rows are in their slots; forward, backward and discard below take it from there. Not
// thread-safe: the store's driving thread owns it.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/record_layout.hpp"
#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "store/engines/device_features.hpp"
#include "store/engines/engine.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// One batch's features served by one slot pool.
struct PoolWork {
  int pool = 0;
  std::vector<int> feats;                   ///< indexes into the engine's features of the batch, ascending
  std::vector<gpu::LookupFeature> looks;    ///< per feats, set at forward
  std::vector<gpu::UpdateFeature> updates;  ///< per feats, set at backward
};

/// A batch's device side, from its staging to its retirement.
struct SlotBatch {
  std::unique_ptr<gpu::Staging> st;  ///< its ready(): the batch's arguments and rows are on the device
  /// The output and gradient buffers of host views (stage_activations), taken by the first forward
  /// with a host view; none while every view is a device view.
  std::unique_ptr<gpu::Staging> act;
  std::vector<DeviceFeature> dev;  ///< per engine feature
  std::vector<PoolWork> work;      ///< per pool touched, in the order the lookups and updates run
};

/// A pool's name in messages: "(dim 8, state 8)", with its element types where they are not fp32
/// ("(dim 8, state 8, bf16, state bf16)").
std::string pool_name(const RecordShape& shape);

/// What a placement needs beside the copy and compute streams.
struct SlotPoolOptions {
  bool writeback_stream = false;  ///< a write-back stream (D2H), beside the copy stream (H2D)
  bool progress_event = false;    ///< an event recorded on the compute stream as each batch retires
};

class SlotPoolEngine {
 public:
  /// A slot pool: (slots, stride) records in device memory, and (`cached`) its overflow region.
  struct Pool {
    gpu::DeviceBuffer memory;
    gpu::DeviceBuffer overflow;  ///< view.overflow: records of the rows served outside the cache
    gpu::SlotPool view;
    std::vector<int> tables;  ///< the global tables it serves (pool-local index -> global table)
  };

  SlotPoolEngine(const StoreConfig& config, gpu::Device& dev) : config_(config), dev_(dev) {}
  SlotPoolEngine(const SlotPoolEngine&) = delete;
  SlotPoolEngine& operator=(const SlotPoolEngine&) = delete;
  /// Waits for the copy, write-back and compute streams, in that order: no device work outlives
  /// the pools and staging. An owner declares its core after the buffers its streams use (host
  /// tables, its own staging), so that those die after this waits.
  ~SlotPoolEngine();

  /// `tables` grouped by record shape (record_shape: dim, state and element types), the shape of a
  /// pool, shapes ascending.
  static std::map<RecordShape, std::vector<int>, RecordShapeLess> shapes(const StoreConfig& config,
                                                                         const std::vector<int>& tables);

  /// Creates the streams (copy, then write-back, then compute) and the progress event.
  Status init(const SlotPoolOptions& options);
  /// Allocates pool number pools().size(), of `slots` records of `shape`, serving `tables`. Only while the engine is
  /// set up, before any work is queued: queued host tasks and the cached engine's transfers keep references into the
  /// pool list, which this may reallocate. Out of device memory: ResourceExhausted "<needs><bytes> bytes of device
  /// memory: ..."
  /// (`needs` says what needs them, e.g. "slot pool (dim 8, state 8) of 100 rows needs ").
  Status add_pool(const RecordShape& shape, std::int64_t slots, std::vector<int> tables, const std::string& needs);

  /// Makes pool `p`'s overflow region (gpu::SlotPool::overflow) hold at least `records` records:
  /// when it holds fewer, waits for the copy, write-back and compute streams (the work queued on
  /// them may use it), allocates exactly `records` (no headroom: the batch's staging is
  /// taken after it, and the region never shrinks), copies the records over and frees the old region. Work issued later
  /// reads the pool's view, so it finds the records where they now are. Out of device memory: ResourceExhausted naming
  /// the bytes, the region unchanged.
  Status reserve_overflow(int p, std::int64_t records);
  /// On the compute stream: waits for order.after and b.st->ready(), gathers every pool's
  /// features into `outputs` (indexed like the batch's features, `f.feature`), and finishes them
  /// (finish_outputs: the host waits for host views or a synchronous call). A host view among the
  /// outputs first takes the batch's activation staging (which may wait for the oldest free
  /// entry's last use, as a submit may; an error changes nothing).
  Status forward(SlotBatch& b, const EngineFeatures& f, const std::vector<MatrixView>& outputs, const CallOrder& order);
  /// On the compute stream: waits for order.after, copies the host gradients in, runs every pool's
  /// fused update with each table's optimizer at step `t`, retires the batch (retire() below),
  /// and finishes the gradients (finish_gradients). Host gradients use the activation staging that
  /// forward took for the host outputs (the store refuses a gradient in another space than its
  /// output, so it is there).
  Status backward(SlotBatch& b, const EngineFeatures& f, const std::vector<ConstMatrixView>& grads, std::int64_t t,
                  const CallOrder& order);
  /// Retires a batch that was staged without applying anything: the compute stream waits for its
  /// ready() (its transfers finish before the staging is reused). Does not wait for the device.
  void discard(SlotBatch& b);

  const std::vector<Pool>& pools() const noexcept { return pools_; }
  const Pool& pool(int p) const { return pools_[static_cast<std::size_t>(p)]; }
  gpu::StreamView copy() const noexcept { return copy_.view(); }
  gpu::StreamView writeback() const noexcept { return writeback_.view(); }
  gpu::StreamView compute() const noexcept { return compute_.view(); }
  /// Recorded on the compute stream after every retired batch's last compute work (progress_event).
  gpu::EventView progress() const noexcept { return progress_.view(); }
  /// The staging entries of the batches: taken by the placement, given back by retire.
  gpu::StagingRing& staging() noexcept { return staging_; }
  /// The staging of host views' outputs and gradients (SlotBatch::act): taken by forward, given
  /// back by retire. A store that only ever sees device views never allocates it.
  const gpu::StagingRing& activation_staging() const noexcept { return activations_; }
  /// Engine::staging_stats of both pools.
  void staging_stats(StagingBytes& batches, StagingBytes& activations) const {
    add_staging(staging_, batches);
    add_staging(activations_, activations);
  }

 private:
  const TableSpec& spec_of(int table) const { return config_.tables[static_cast<std::size_t>(table)].spec; }
  // Records progress (if made) and b.st->done() on the compute stream after the batch's last
  // work there, and gives its staging back (and its activation staging, if it took one).
  void retire(SlotBatch& b);
  // Takes b.act, once per batch, and carves every feature's host-view buffers out of it. Changes
  // nothing on failure (staging the device has no room for).
  Status stage_activations(SlotBatch& b);

  const StoreConfig& config_;
  gpu::Device& dev_;
  gpu::Stream copy_, compute_;
  gpu::Stream writeback_;  // with SlotPoolOptions::writeback_stream
  gpu::Event progress_;    // with SlotPoolOptions::progress_event
  std::vector<Pool> pools_;
  gpu::StagingRing staging_{dev_};
  gpu::StagingRing activations_{dev_};
};

}  // namespace strata::detail
