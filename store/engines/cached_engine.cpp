#include "store/engines/cached_engine.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "cache/prefetcher.hpp"
#include "gpu/staging.hpp"
#include "store/engines/cache_transfers.hpp"
#include "store/engines/detail/slot_pool_engine.hpp"
#include "store/engines/device_features.hpp"

namespace strata::detail {
namespace {

using gpu::Staging;

// Bytes of records one flush chunk writes back, at most (cache_flush_rows).
constexpr std::size_t kFlushChunkBytes = std::size_t{64} << 20;

// A slot pool (the core's pool, planned by the prefetcher's pool of the same number).
using Pool = SlotPoolEngine::Pool;

// One batch's transfers in one pool: the device side of the prefetcher's Batch::Part of the same
// index (and of the SlotBatch::work of the same index).
struct PoolMoves {
  const Pool* pool = nullptr;
  const cache::PartitionedPlan* plan = nullptr;
  Key* wb_slots_dev = nullptr;
  // The write-backs' records, packed on the device, and (staged) their pinned copy: the dirty
  // victims' at plan time; the pinned copy, on the same stream, the overflow rows' after the backward.
  float* wb_dev = nullptr;
  float* wb_host = nullptr;
  float* overflow_dev = nullptr;  // the overflow rows' records, packed on the compute stream after the backward
  Key* fill_slots_dev = nullptr;
  float *fill_host = nullptr, *fill_dev = nullptr;  // staged
  float** wb_rows_dev = nullptr;                    // zero-copy transfers: device addresses of the host records
  float** fill_rows_dev = nullptr;
  Key* overflow_slots_dev = nullptr;  // the plan's overflow rows (bypassed), written back after the backward
  float** overflow_rows_dev = nullptr;
};

// The prefetcher's batch (id, keys, plans) with what the device needs to execute it.
// Its SlotBatch (staging, device features, work per pool as `parts`) once staged; its ready(): the
// batch's rows are in their slots.
struct CachedBatch final : EngineBatch, cache::Prefetcher::Batch, SlotBatch {
  // The batch's features. Not the KeyBatch itself: the store moves it after submit, but the
  // features' buffer moves with it unchanged.
  const JaggedKeys* feats = nullptr;
  EngineFeatures features;
  std::vector<UniqueKeys> unique;  // per engine feature (the prefetcher's keys point here)
  std::vector<PoolMoves> moves;    // per pool touched, as `parts`, once staged
};

// The prefetcher (cache/prefetcher.hpp) decides what to plan when; the engine executes its plans
// on the device (staging, fills and write-backs on the copy and write-back streams).
class CachedEngine final : public Engine, private cache::Prefetcher::Executor {
 public:
  CachedEngine(const StoreConfig& config, gpu::Device& dev, tbb::task_arena& fills)
      : config_(config),
        dev_(dev),
        transfers_(dev, fills),
        prefetcher_(config.cache.lookahead, static_cast<int>(config.tables.size())),
        core_(config, dev) {
    prefetcher_.set_executor(this);
    prefetcher_.set_bypass(true);  // rows that do not fit are served outside the cache
  }

  Status init(const Topology& topo, const std::vector<int>& tables, HostTableOptions options) {
    options.pinner = &dev_.pinner();
    // Small tables share 2 MiB arenas, pinned whole (host/host_table.hpp); the tables keep them alive.
    ArenaPacker packer;
    options.packer = &packer;
    STRATA_RETURN_IF_ERROR(core_.init({/*writeback_stream=*/true, /*progress_event=*/true}));
    STRATA_ASSIGN_OR_RETURN(uploaded_, dev_.create_event());
    STRATA_ASSIGN_OR_RETURN(packed_, dev_.create_event());
    STRATA_ASSIGN_OR_RETURN(written_, dev_.create_event());
    STRATA_ASSIGN_OR_RETURN(Staging fs, Staging::create(dev_));
    flush_staging_ = std::make_unique<Staging>(std::move(fs));
    for (int t : tables) {
      STRATA_ASSIGN_OR_RETURN(HostTable table, HostTable::create(topo, spec_of(t), options));
      transfers_.add_table(t, std::move(table));
    }
    for (const auto& [shape, members] : SlotPoolEngine::shapes(config_, tables)) {
      cache::CachePlannerOptions po;
      po.policy = config_.cache.policy;
      po.window = config_.cache.lookahead + config_.cache.preview + 1;
      po.name = pool_name(shape);
      po.record_bytes = (row_words(shape) + state_words(shape)) * 4;
      for (int t : members) {
        const TableConfig& tc = config_.tables[static_cast<std::size_t>(t)];
        po.slots += cache_rows(tc);
        po.tables.push_back({tc.spec.name, tc.cache.cap ? cache_rows(tc) : 0});
      }
      STRATA_RETURN_IF_ERROR(cache::PartitionedPlanner::validate(po, config_.cache.planner_partitions));
      STRATA_RETURN_IF_ERROR(core_.add_pool(
          shape, po.slots, members, "slot pool " + po.name + " of " + std::to_string(po.slots) + " rows needs "));
      prefetcher_.add_pool(std::make_unique<cache::PartitionedPlanner>(po, config_.cache.planner_partitions), members);
      zero_copy_.push_back(false);
    }
    return choose_transfer();
  }

  void preview(std::int64_t id, const KeyBatch& batch, const EngineFeatures& f) override {
    if (!prefetcher_.uses_window()) return;  // only lookahead has a window
    std::vector<UniqueKeys> unique(f.feature.size());
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      dedup_keys(k, unique[i], scratch_);
      unique[i].offsets = {};
      unique[i].positions = {};
    }
    prefetcher_.preview(id, f.table, std::move(unique));
  }

  void previews_done(std::int64_t id) override { prefetcher_.previews_done(id); }

  void drop_previews() override { prefetcher_.drop_previews(); }

  Status accepting() override {
    STRATA_RETURN_IF_ERROR(dev_.status());  // a failed device accepts no more work
    if (prefetcher_.in_flight() < config_.cache.max_in_flight) return Status::ok();
    return Status::failed_precondition(std::to_string(prefetcher_.in_flight()) +
                                       " batches are already in flight and the staging ring holds "
                                       "cache.max_in_flight = " +
                                       std::to_string(config_.cache.max_in_flight) + "; retire one first");
  }

  Result<std::unique_ptr<EngineBatch>> submit(std::int64_t id, const KeyBatch& batch,
                                              const EngineFeatures& f) override {
    STRATA_RETURN_IF_ERROR(dev_.status());  // a failed device accepts no more work
    STRATA_RETURN_IF_ERROR(accepting().with_context("batch " + std::to_string(id)));
    auto b = std::make_unique<CachedBatch>();
    b->id = id;
    b->feats = batch.features.data();
    b->features = f;
    b->unique.resize(f.feature.size());
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      dedup_keys(k, b->unique[i], scratch_);
      b->keys.push_back({f.table[i], &b->unique[i]});
    }
    // A batch that could not fit even an empty cache bypasses it for the rows that do not fit,
    // from when it is due; refused only when those rows and its staging could never fit the
    // device beside the slot pools. Every other batch is planned at its forward at the latest.
    const std::vector<std::int64_t> beyond = prefetcher_.rows_beyond(*b);
    std::size_t beyond_bytes = 0;
    for (std::size_t p = 0; p < beyond.size(); ++p)
      beyond_bytes += static_cast<std::size_t>(beyond[p]) *
                      static_cast<std::size_t>(core_.pool(static_cast<int>(p)).view.record_bytes());
    b->bypass_when_due = beyond_bytes > 0;
    if (b->bypass_when_due) STRATA_RETURN_IF_ERROR(fits_the_device(*b, beyond, beyond_bytes));
    STRATA_RETURN_IF_ERROR(prefetcher_.submit(*b));
    return std::unique_ptr<EngineBatch>(std::move(b));
  }

  bool device_views() const noexcept override { return true; }

  Status forward(EngineBatch& eb, const KeyBatch&, const EngineFeatures& f, const std::vector<MatrixView>& outputs,
                 const CallOrder& order) override {
    auto& b = static_cast<CachedBatch&>(eb);
    // A deferred plan (and, with lookahead, a plan still waiting for later batches) is made now:
    // the batches before this one that have retired no longer pin their rows.
    // Rows that do not fit beside the rows pinned by batches in flight bypass the cache (plan()
    // plans with bypass), so only the device's memory can refuse it.
    {
      Status planned = prefetcher_.plan(b);
      if (!planned.is_ok()) {
        if (planned.code() != StatusCode::kResourceExhausted) return planned;
        return planned.with_context(
            "forward of batch " + std::to_string(b.id) +
            ": the device has no room for its staging and its rows outside the cache beside the cache (retire the "
            "batches in flight first, whose staging it could reuse, or make room on the device: fewer cache rows, a "
            "lower cache.max_in_flight or smaller batches)");
      }
    }
    return core_.forward(b, f, outputs, order);
  }

  Status backward(EngineBatch& eb, const KeyBatch&, const EngineFeatures& f, const std::vector<ConstMatrixView>& grads,
                  std::int64_t t, const CallOrder& order) override {
    auto& b = static_cast<CachedBatch&>(eb);
    STRATA_CHECK(b.planned);  // forward came first
    // The core gives the batch's staging back before the prefetcher's retire, which may plan
    // deferred batches into it: the entry's `drained` is recorded after the overflow rows'
    // write-back, which uses it, before anything can take it.
    const gpu::EventView drained = b.st->drained();
    Status applied = core_.backward(b, f, grads, t, order);
    sent_overflow_ = write_back_overflow(b, drained);
    prefetcher_.retire(b, true);
    if (applied.is_ok()) ++unflushed_;
    return applied;
  }

  // The call's update stays on the failed device: host memory holds the table as of the last
  // flush, which is what the store now holds it to be. Unless the call already sent its overflow
  // rows home with the update applied (another engine's backward failed after this one's): host
  // memory then holds an update the store does not count, so the call stays counted and a read
  // after the fault reports DataLoss rather than that mix.
  void backward_not_applied() override {
    if (unflushed_ > 0 && !sent_overflow_) --unflushed_;
  }

  Status discard(EngineBatch& eb, const KeyBatch&, const EngineFeatures&) override {
    auto& b = static_cast<CachedBatch&>(eb);
    if (!b.planned) {
      prefetcher_.discard(b);  // a deferred batch behind it may be planned now
      return Status::ok();
    }
    core_.discard(b);
    prefetcher_.discard(b);
    return dev_.status();
  }

  // Writes every dirty cached row back to its host table, in chunks of at most kFlushChunkBytes
  // of records (so a flush needs that much staging, not the whole cache), on the write-back
  // stream. A row is marked clean only once its copy has landed: a flush that fails (no staging
  // memory, a device fault) leaves the rest dirty, to be written by the next flush, and never
  // reports rows it did not write. Returns only when the write-back stream is idle, so the
  // write-backs of rows that plans evicted have landed too (and the copy stream, so no fill
  // still reads a host row): on return every host table holds every row written.
  Status flush() override {
    const gpu::StreamView s = core_.writeback();
    // The flush staging is reserved for the largest chunk any pool can need (a chunk, or the
    // whole pool when smaller), so that flushes in a training loop (cache.flush_every) allocate
    // once, not whenever more rows are dirty than before.
    flush_largest_ = {};
    for (int p = 0; p < static_cast<int>(core_.pools().size()); ++p) {
      const auto W = static_cast<std::size_t>(cache_flush_rows(core_.pool(p).view.slots, core_.pool(p).view.stride));
      const gpu::StagingSizes z = flush_sizes(p, W);
      flush_largest_ = {std::max(flush_largest_.mirrored, z.mirrored), std::max(flush_largest_.host_only, z.host_only),
                        std::max(flush_largest_.dev_only, z.dev_only)};
    }
    // The prefetcher lists the dirty rows pool by pool and chunk by chunk (write_back below).
    STRATA_RETURN_IF_ERROR(prefetcher_.flush());
    STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
    STRATA_RETURN_IF_ERROR(dev_.synchronize(core_.copy()));
    STRATA_RETURN_IF_ERROR(dev_.status());
    unflushed_ = 0;
    return Status::ok();
  }

  // Executor: rows of a flush chunk of pool `p`: at most kFlushChunkBytes of records.
  std::size_t flush_rows(int p) override {
    const std::size_t rec = static_cast<std::size_t>(core_.pool(p).view.stride);
    return std::max<std::size_t>(1, kFlushChunkBytes / (rec * sizeof(float)));
  }

  // Executor: one flush chunk, on the write-back stream. Returns once its rows are in host memory
  // (the prefetcher then marks them clean).
  Status write_back(int p, const std::vector<cache::Transfer>& part) override {
    const gpu::StreamView s = core_.writeback();
    const Pool& pool = core_.pool(p);
    const bool zero_copy = zero_copy_[static_cast<std::size_t>(p)];
    const std::size_t rec = static_cast<std::size_t>(pool.view.stride);
    STRATA_RETURN_IF_ERROR(dev_.synchronize(flush_staging_->done()));
    const std::size_t W = part.size();
    STRATA_RETURN_IF_ERROR(flush_staging_->reserve(flush_sizes(p, W), flush_largest_));
    auto slots = flush_staging_->mirrored<Key>(W);
    for (std::size_t i = 0; i < W; ++i) slots.host[i] = part[i].slot;
    float** mapped = zero_copy ? transfers_.stage_rows(*flush_staging_, pool, part) : nullptr;
    float* host = zero_copy ? nullptr : flush_staging_->host_only<float>(W * rec);
    float* dev = flush_staging_->dev_only<float>(W * rec);
    dev_.wait(s, core_.progress());
    flush_staging_->upload(s);
    dev_.pack_records(s, pool.view, slots.dev, static_cast<std::int64_t>(W), dev);
    transfers_.send_home(s, pool, part, dev, host, mapped);
    dev_.record(flush_staging_->done(), s);
    return dev_.synchronize(flush_staging_->done());
  }

  // Staging of a flush chunk of W rows of `pool`: their slots (and host addresses, zero-copy),
  // their records packed on the device (and their pinned copy, staged).
  gpu::StagingSizes flush_sizes(int p, std::size_t W) const {
    const bool zero_copy = zero_copy_[static_cast<std::size_t>(p)];
    const std::size_t records = W * static_cast<std::size_t>(core_.pool(p).view.stride);
    return {Staging::bytes_for<Key>(W) + (zero_copy ? Staging::bytes_for<float*>(W) : 0),
            zero_copy ? 0 : Staging::bytes_for<float>(records), Staging::bytes_for<float>(records)};
  }

  // After a device fault the rows stay readable while host memory holds every applied update: no
  // backward succeeded since the last flush (cache.flush_every = 1 keeps it so at every step; a
  // backward that failed applied nothing). Otherwise those updates died with the device, and the
  // error says how many steps' worth.
  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    STRATA_RETURN_IF_ERROR(flushed(table));
    transfers_.host(table).read_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status read_rows_at(int table, const TableSpec&, const std::vector<std::int64_t>& rows, float* weights,
                      float* state) override {
    STRATA_RETURN_IF_ERROR(flushed(table));
    transfers_.host(table).read_rows(rows, weights, state);
    return Status::ok();
  }

  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    STRATA_RETURN_IF_ERROR(flush());
    prefetcher_.invalidate_table(table);
    transfers_.host(table).write_rows(row0, n, weights, state);
    return Status::ok();
  }

  // A row given to a new key may still be on its way home (the write-back of a plan that evicted it, or of an overflow
  // row): those land first. Its cached copy, if any, is dropped unwritten, so that the batch using it fills it anew.
  Status reset_rows(int table, const std::vector<std::int64_t>& rows, const float* weights,
                    const float* state) override {
    STRATA_RETURN_IF_ERROR(dev_.synchronize(core_.writeback()));
    prefetcher_.drop_rows(table, rows);
    transfers_.host(table).write_rows(rows, weights, state);
    return Status::ok();
  }

  void staging_stats(StagingBytes& batches, StagingBytes& activations) const override {
    core_.staging_stats(batches, activations);
    // The pools' overflow regions, once a batch bypassed the cache (kept, as staging is).
    for (const Pool& pool : core_.pools()) batches.device += pool.overflow.bytes();
    // The flush's own entry, once a flush gave it room (flush() returns with its chunks landed).
    const gpu::StagingSizes f = flush_staging_->capacity();
    if (f.mirrored + f.host_only + f.dev_only > 0) add_staging(f, 1, batches);
  }

  const char* name() const noexcept override { return "cached"; }
  void host_tables(std::vector<std::pair<int, const HostTable*>>& out) const override { transfers_.host_tables(out); }
  void cache_stats(std::vector<std::pair<int, cache::CacheStats>>& out) const override {
    for (const auto& pool : core_.pools())
      for (const int t : pool.tables) out.push_back({t, prefetcher_.table_stats(t)});
  }

 private:
  const TableSpec& spec_of(int table) const { return config_.tables[static_cast<std::size_t>(table)].spec; }

  // A flush before a read of host rows; after a device fault, whether host memory holds every update (DataLoss else).
  Status flushed(int table) {
    if (Status flushed = flush(); !flushed.is_ok()) {
      if (dev_.status().is_ok()) return flushed;
      if (unflushed_ > 0)
        return Status::data_loss("table '" + spec_of(table).name + "': the device failed (" + dev_.status().message() +
                                 ") with the updates of " + std::to_string(unflushed_) +
                                 " backward call(s) since the last flush only in its memory; host memory holds the "
                                 "table as of that flush (cache.flush_every bounds what a device fault loses)");
    }
    return Status::ok();
  }

  // The staging of a batch, from its shape, not from the cache's state: its fills, its write-backs
  // and (`overflow`: when some of its rows are outside the cache) its overflow rows are each at
  // most its unique rows (a cold cache fills them all), so the staging of a training loop stops
  // growing after its first batches (gpu/staging.hpp).
  gpu::StagingSizes staging_want(const CachedBatch& b, bool overflow) const {
    const std::size_t lists = overflow ? 3 : 2;                // write-backs, fills, overflow rows
    std::vector<std::size_t> unique(core_.pools().size(), 0);  // per pool
    for (std::size_t i = 0; i < b.keys.size(); ++i)
      unique[static_cast<std::size_t>(prefetcher_.where(b.keys[i].table).first)] +=
          static_cast<std::size_t>(b.unique[i].size());
    gpu::StagingSizes want;
    for (std::size_t p = 0; p < unique.size(); ++p) {
      if (unique[p] == 0) continue;
      const std::size_t records = unique[p] * static_cast<std::size_t>(core_.pool(static_cast<int>(p)).view.stride);
      want.mirrored += lists * Staging::bytes_for<Key>(unique[p]);
      want.dev_only += (overflow ? 2 : 1) * Staging::bytes_for<float>(records);  // write-backs (overflow rows), packed
      if (zero_copy_[p]) {
        want.mirrored += lists * Staging::bytes_for<float*>(unique[p]);
      } else {
        want.host_only += 2 * Staging::bytes_for<float>(records);
        want.dev_only += Staging::bytes_for<float>(records);  // fills
      }
    }
    for (std::size_t i = 0; i < b.keys.size(); ++i)
      add_feature_bytes(b.feats[static_cast<std::size_t>(b.features.feature[i])], b.unique[i].size(),
                        spec_of(b.features.table[i]), want.mirrored);
    return want;
  }

  // submit() of a batch whose rows `beyond` (per pool, beyond_bytes of records) can never be
  // cached: refused when they and its staging would not fit the device even beside nothing but
  // the slot pools.
  Status fits_the_device(const CachedBatch& b, const std::vector<std::int64_t>& beyond,
                         std::size_t beyond_bytes) const {
    std::size_t pools = 0, rows = 0;
    for (std::size_t p = 0; p < beyond.size(); ++p) {
      pools += core_.pool(static_cast<int>(p)).memory.bytes();
      rows += static_cast<std::size_t>(beyond[p]);
    }
    const gpu::StagingSizes want = staging_want(b, true);
    const std::size_t need = beyond_bytes + want.mirrored + want.dev_only;
    const std::size_t capacity = dev_.info().capacity;
    if (capacity == 0 || need + pools <= capacity) return Status::ok();
    return Status::resource_exhausted(
        "batch " + std::to_string(b.id) + ": " + std::to_string(rows) +
        " of its unique rows do not fit the cache, and with its staging they need " + std::to_string(need) +
        " bytes of device memory, more than the " + std::to_string(capacity > pools ? capacity - pools : 0) +
        " bytes the device (" + std::to_string(capacity) + " bytes) leaves beside the slot pools (" +
        std::to_string(pools) + " bytes); split the batch or give the device more memory");
  }

  // Executor: every pool accepted the batch; makes room for its overflow rows and takes its
  // staging (the plan is committed after this).
  Status prepare(cache::Prefetcher::Batch& pb) override {
    auto& b = static_cast<CachedBatch&>(pb);
    b.work.clear();
    b.moves.clear();
    bool overflow = false;
    for (const auto& part : b.parts) {
      PoolWork w;
      w.pool = part.pool;
      w.feats = part.keys;  // the batch's keys are its features, in order
      b.work.push_back(std::move(w));
      b.moves.emplace_back();
      overflow = overflow || part.probe.overflow;
      if (Status r = core_.reserve_overflow(part.pool, part.probe.overflow_records); !r.is_ok())
        return r.with_context("batch " + std::to_string(b.id));
    }
    const gpu::StagingSizes want = staging_want(b, overflow);
    auto st = core_.staging().take(want);
    if (!st)
      return st.status().with_context("batch " + std::to_string(b.id) + ": staging of " +
                                      std::to_string(want.mirrored + want.dev_only) + " bytes of device memory and " +
                                      std::to_string(want.mirrored + want.host_only) + " bytes of pinned memory");
    b.st = std::move(st).value();
    return Status::ok();
  }

  // Executor: the batch is committed in every pool; stages its metadata and issues its transfers.
  void issue(cache::Prefetcher::Batch& pb) override {
    auto& b = static_cast<CachedBatch&>(pb);
    b.dev.resize(b.features.feature.size());
    for (std::size_t k = 0; k < b.work.size(); ++k) {
      b.moves[k].pool = &core_.pool(b.work[k].pool);
      b.moves[k].plan = &b.parts[k].plan;
      stage_metadata(b, b.work[k], b.moves[k]);
    }
    issue_transfers(b);
  }

  // Issues a planned batch's write-backs and fills, each direction on its own stream so that they
  // overlap (D2H of the victims while the misses move H2D):
  //   copy:       wait progress | upload | record uploaded | wait written | fills in | wait packed
  //               | fills into their slots | record ready
  //   write-back: wait progress, uploaded | pack victims | record packed | victims home | record
  //               written, drained
  // progress: the victims' last compute work is done before their slots are read or written.
  // packed: a slot is read out before the fill that reuses it writes it. written (as recorded by
  // the batches before, waited for before this batch's fills read host memory): a row written
  // back is in host memory before a later miss of it reads it (flush and reads wait for the whole
  // write-back stream). drained: the staging entry is not reused before its write-backs are done.
  void issue_transfers(CachedBatch& b) {
    const gpu::StreamView copy = core_.copy(), wb = core_.writeback();
    bool any_wb = false;
    for (const PoolMoves& m : b.moves) any_wb = any_wb || !m.plan->writebacks.empty();
    dev_.wait(copy, core_.progress());
    b.st->upload(copy);
    if (any_wb) dev_.record(uploaded_.view(), copy);
    dev_.wait(copy, written_.view());
    if (any_wb) {
      dev_.wait(wb, core_.progress());
      dev_.wait(wb, uploaded_.view());
      for (const PoolMoves& m : b.moves)
        if (!m.plan->writebacks.empty())
          dev_.pack_records(wb, m.pool->view, m.wb_slots_dev, static_cast<std::int64_t>(m.plan->writebacks.size()),
                            m.wb_dev);
      dev_.record(packed_.view(), wb);
      for (const PoolMoves& m : b.moves)
        if (!m.plan->writebacks.empty())
          transfers_.send_home(wb, *m.pool, m.plan->writebacks, m.wb_dev, m.wb_host, m.wb_rows_dev);
      dev_.record(written_.view(), wb);
      dev_.record(b.st->drained(), wb);
    }
    for (const PoolMoves& m : b.moves)
      if (!m.plan->fills.empty() && !m.fill_rows_dev)
        transfers_.stage_in(copy, *m.pool, m.plan->fills, m.fill_host, m.fill_dev);
    if (any_wb) dev_.wait(copy, packed_.view());
    for (const PoolMoves& m : b.moves) {
      if (m.plan->fills.empty()) continue;
      const std::int64_t F = static_cast<std::int64_t>(m.plan->fills.size());
      if (m.fill_rows_dev) {
        dev_.records_from_host(copy, m.pool->view, m.fill_slots_dev, F, m.fill_rows_dev);
        transfers_.count_host(*m.pool, m.plan->fills, false);
      } else {
        dev_.unpack_records(copy, m.pool->view, m.fill_slots_dev, F, m.fill_dev);
      }
    }
    dev_.record(b.st->ready(), copy);
  }

  // After the batch's backward: its rows in overflow slots are packed on the compute stream right
  // behind its updates (so before any later batch's work there: a row a batch still in flight
  // shares may be updated next, and a pack on another stream would read it while it is written),
  // `progress` is recorded again (the packs are the batch's last compute work), and they go home
  // on the write-back stream after it, through the pinned buffer its dirty victims went through
  // (the same stream, so those are done). Then `written` (a later fill of such a row, or of the
  // overflow slot it held, waits for it) and the entry's `drained`. A row a batch still in flight
  // also uses goes home again after that batch's backward, in stream order, so host memory ends
  // with the last update. Before the prefetcher's retire frees their slots.
  // Returns whether it sent any row.
  bool write_back_overflow(CachedBatch& b, gpu::EventView drained) {
    bool any = false;
    for (const PoolMoves& m : b.moves) any = any || !m.plan->overflow.empty();
    if (!any) return false;
    const gpu::StreamView compute = core_.compute(), wb = core_.writeback();
    for (const PoolMoves& m : b.moves)
      if (!m.plan->overflow.empty())
        dev_.pack_records(compute, m.pool->view, m.overflow_slots_dev,
                          static_cast<std::int64_t>(m.plan->overflow.size()), m.overflow_dev);
    dev_.record(core_.progress(), compute);
    dev_.wait(wb, core_.progress());
    for (const PoolMoves& m : b.moves)
      if (!m.plan->overflow.empty())
        transfers_.send_home(wb, *m.pool, m.plan->overflow, m.overflow_dev, m.wb_host, m.overflow_rows_dev);
    dev_.record(written_.view(), wb);
    dev_.record(drained, wb);
    return true;
  }

  // Writes the batch's lookup and update arguments, and the slots and buffers of its transfers,
  // into its staging (`m`: the transfers of the pool of `w`).
  void stage_metadata(CachedBatch& b, const PoolWork& w, PoolMoves& m) {
    Staging& st = *b.st;
    const Pool& pool = *m.pool;
    const std::size_t rec = static_cast<std::size_t>(pool.view.stride);
    for (std::size_t j = 0; j < w.feats.size(); ++j) {
      const std::size_t i = static_cast<std::size_t>(w.feats[j]);
      b.dev[i] = stage_feature(st, b.feats[static_cast<std::size_t>(b.features.feature[i])],
                               spec_of(b.features.table[i]), b.unique[i], m.plan->unique_slots[j]);
    }
    const std::size_t W = m.plan->writebacks.size(), F = m.plan->fills.size(), O = m.plan->overflow.size();
    auto wb = st.mirrored<Key>(W);
    for (std::size_t i = 0; i < W; ++i) wb.host[i] = m.plan->writebacks[i].slot;
    m.wb_slots_dev = wb.dev;
    auto fs = st.mirrored<Key>(F);
    for (std::size_t i = 0; i < F; ++i) fs.host[i] = m.plan->fills[i].slot;
    m.fill_slots_dev = fs.dev;
    auto os = st.mirrored<Key>(O);
    for (std::size_t i = 0; i < O; ++i) os.host[i] = m.plan->overflow[i].slot;
    m.overflow_slots_dev = os.dev;
    m.wb_dev = st.dev_only<float>(W * rec);
    m.overflow_dev = st.dev_only<float>(O * rec);
    if (zero_copy_[static_cast<std::size_t>(w.pool)]) {
      m.wb_rows_dev = transfers_.stage_rows(st, pool, m.plan->writebacks);
      m.fill_rows_dev = transfers_.stage_rows(st, pool, m.plan->fills);
      m.overflow_rows_dev = transfers_.stage_rows(st, pool, m.plan->overflow);
      return;
    }
    m.wb_host = st.host_only<float>(std::max(W, O) * rec);  // victims', then overflow rows
    m.fill_host = st.host_only<float>(F * rec);
    m.fill_dev = st.dev_only<float>(F * rec);
  }

  // Zero-copy transfers need the device address of every host table; kAuto measures both ways.
  Status choose_transfer() {
    const CacheTransfer want = config_.cache.transfer;
    if (want == CacheTransfer::kStaged) return Status::ok();
    if (const Status m = transfers_.map_tables(); !m.is_ok()) {
      if (want == CacheTransfer::kAuto) return Status::ok();  // staged, then
      return m.with_context("cache transfer zero_copy");
    }
    for (std::size_t p = 0; p < zero_copy_.size(); ++p) {
      if (want == CacheTransfer::kZeroCopy) {
        zero_copy_[p] = true;
      } else {
        // kAuto. The emu device has no PCIe to measure (both ways are host memcpys): it runs the
        // probe, so that tests hold it to changing nothing, and stays staged.
        STRATA_ASSIGN_OR_RETURN(const bool faster,
                                transfers_.zero_copy_is_faster(core_.copy(), core_.pool(static_cast<int>(p))));
        zero_copy_[p] = faster && dev_.info().backend == gpu::Backend::kCuda;
      }
    }
    return Status::ok();
  }

  const StoreConfig& config_;
  gpu::Device& dev_;
  // Between the copy and write-back streams, recorded by every batch with write-backs (see
  // issue_transfers): its metadata uploaded, its victims packed, its victims in host memory.
  gpu::Event uploaded_, packed_, written_;
  CacheTransfers transfers_;     // the host tables, and the row moves between them and the pools
  std::vector<bool> zero_copy_;  // per pool: fills and write-backs by the zero-copy kernels (else staged)
  // The window, the planners, deferral, previews and flush planning; plans executed by this engine.
  cache::Prefetcher prefetcher_;
  std::unique_ptr<Staging> flush_staging_;
  DedupScratch scratch_;
  gpu::StagingSizes flush_largest_;  // during a flush: the staging its largest chunk needs
  std::int64_t unflushed_ = 0;       // backward calls applied since the last complete flush
  bool sent_overflow_ = false;       // the last backward sent overflow rows home
  // The pools, the copy, write-back and compute streams, the lookups and updates. Last: destroyed
  // first, it waits for its streams before the host tables and staging above go.
  SlotPoolEngine core_;
};

}  // namespace

std::int64_t cache_flush_rows(std::int64_t slots, std::int64_t stride) {
  const auto chunk = static_cast<std::int64_t>(kFlushChunkBytes / (static_cast<std::size_t>(stride) * sizeof(float)));
  return std::min(slots, std::max<std::int64_t>(1, chunk));
}

Result<std::unique_ptr<Engine>> make_cached_engine(const Topology& topo, const StoreConfig& config,
                                                   const std::vector<int>& tables, HostTableOptions options,
                                                   gpu::Device& device, tbb::task_arena& fills) {
  auto e = std::make_unique<CachedEngine>(config, device, fills);
  STRATA_RETURN_IF_ERROR(e->init(topo, tables, options));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace strata::detail
