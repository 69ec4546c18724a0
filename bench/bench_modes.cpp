#include "bench/bench_modes.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "bench/bench_memory.hpp"
#include "core/half.hpp"
#include "dispatch/local_communicator.hpp"
#include "gpu/device.hpp"
#include "toolkit/machine_info.hpp"

namespace strata::bench {
namespace {

// A one-line progress bar on stderr (hidden with --no-progress).
class Progress {
 public:
  Progress(std::string label, int total, bool enabled) : label_(std::move(label)), total_(total), enabled_(enabled) {}
  void tick(int done) {
    if (!enabled_) return;
    const int width = 30;
    const int filled = total_ ? done * width / total_ : width;
    std::fprintf(stderr, "\r  %-34s [%s%s] %d/%d", label_.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total_);
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int total_;
  bool enabled_;
};

StoreStats stats_delta(const StoreStats& after, const StoreStats& before) {
  StoreStats d = after;
  d.links = after.links - before.links;
  for (std::size_t i = 0; i < d.cache.size() && i < before.cache.size(); ++i)
    d.cache[i].second -= before.cache[i].second;
  DispatchStats& x = d.dispatch;
  const DispatchStats& y = before.dispatch;
  x.batches -= y.batches;
  x.key_bytes -= y.key_bytes;
  x.row_bytes -= y.row_bytes;
  x.grad_bytes -= y.grad_bytes;
  x.bytes_no_dedup -= y.bytes_no_dedup;
  x.admission_bytes -= y.admission_bytes;
  x.exchange_seconds -= y.exchange_seconds;
  x.lookup_seconds -= y.lookup_seconds;
  x.local_seconds -= y.local_seconds;
  return d;
}

// The batches of one rank's run in order (run index i is batch i * ranks + rank of the source),
// read from a cursor as the steps ask for them and dropped once used: at most the batches in
// flight and previewed are held.
class BatchWindow {
 public:
  // `spread`: keys spread over [0, 2^63) (--dynamic), before any clock starts.
  BatchWindow(std::unique_ptr<BatchCursor> cursor, bool spread) : cursor_(std::move(cursor)), spread_(spread) {}
  // Run batch i (i >= the last drop_before); valid until drop_before passes it.
  Result<const KeyBatch*> at(std::int64_t i) {
    while (base_ + static_cast<std::int64_t>(held_.size()) <= i) {
      STRATA_ASSIGN_OR_RETURN(KeyBatch b, cursor_->next());
      if (spread_) spread_keys(b);
      held_.push_back(std::move(b));
    }
    return &held_[static_cast<std::size_t>(i - base_)];
  }
  // Forgets the batches before run index i.
  void drop_before(std::int64_t i) {
    for (; base_ < i && !held_.empty(); ++base_) held_.pop_front();
    base_ = std::max(base_, i);
  }

 private:
  std::unique_ptr<BatchCursor> cursor_;
  bool spread_ = false;
  std::deque<KeyBatch> held_;
  std::int64_t base_ = 0;
};

// The device of a `--trainer device` run whose store has none (`cpu` mode): the trainer's GPU,
// opened by the bench as --backend chooses (cuda when one is visible, else emu). The pooled outputs
// go to it H2D and the gradients come back D2H every step, as they do for a trainer whose dense
// model is on a GPU while its tables are in host memory; the copies are real and counted by this
// device's counters, which the bench adds to the store's (there are none in a cpu-only store).
Result<std::unique_ptr<gpu::Device>> open_trainer_device(const StoreConfig& c) {
  const Result<int> gpus = gpu::cuda_devices();
  const bool cuda = c.device.backend == BackendChoice::kCuda ||
                    (c.device.backend == BackendChoice::kAuto && gpus.is_ok() && gpus.value() > 0);
  if (cuda) return gpu::make_cuda_device(0);
  return gpu::make_emu_device();
}

// Rows of each feature's output (forward) and gradient (backward), shaped for each batch: batches
// of a trace need not have one shape. With the trainer on the device they are device buffers:
// the store's device (Store::device()) when it has one, else the trainer's own (open_trainer_device),
// and the calls are stream-ordered on the trainer's stream.
class StepBuffers {
 public:
  StepBuffers(Store& store, int rank, Trainer trainer) : store_(store), rng_(7 + static_cast<unsigned>(rank)) {
    if (trainer == Trainer::kDevice) dev_ = store.device();
    trainer_ = trainer;
  }
  // Opens the trainer's device where the store has none; creates the trainer's stream.
  Status init() {
    if (trainer_ != Trainer::kDevice) return Status::ok();
    if (dev_ == nullptr) {
      STRATA_ASSIGN_OR_RETURN(own_, open_trainer_device(store_.config()));
      dev_ = own_.get();
    }
    STRATA_ASSIGN_OR_RETURN(stream_, dev_->create_stream());
    return Status::ok();
  }
  Status shape(const KeyBatch& batch) {
    out_views.clear();
    grad_views.clear();
    dev_out_views.clear();
    dev_grad_views.clear();
    out_.resize(batch.features.size());
    grad_.resize(batch.features.size());
    hgrad_.resize(batch.features.size());
    half_.resize(batch.features.size(), DType::kF32);
    if (dev_) {
      dout_.resize(batch.features.size());
      dgrad_.resize(batch.features.size());
      pout_.resize(batch.features.size());
      pgrad_.resize(batch.features.size());
    }
    for (std::size_t i = 0; i < batch.features.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(const auto feature, find_feature(store_.config(), batch.features[i].table));
      const TableSpec& spec = store_.config().tables[static_cast<std::size_t>(feature.first)].spec;
      const std::int64_t rows = output_rows(batch.features[i], feature.second);
      const auto size = static_cast<std::size_t>(rows * spec.dim);
      if (out_[i].size() < size) {
        out_[i].resize(size);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const std::size_t old = grad_[i].size();
        grad_[i].resize(size);
        for (std::size_t k = old; k < size; ++k) grad_[i][k] = u(rng_);
        half_[i] = DType::kF32;  // its half-size gradients (below) are made again
      }
      // Half-size outputs: the buffers (sized in floats) hold twice what they need, and the
      // gradients are the same values rounded, in the first half of a buffer of their own.
      const DType out_dtype = spec.output_dtype;
      if (out_dtype != DType::kF32 && half_[i] != out_dtype) {
        hgrad_[i].assign(grad_[i].size(), 0.0f);
        auto* h = reinterpret_cast<std::uint16_t*>(hgrad_[i].data());
        for (std::size_t k = 0; k < grad_[i].size(); ++k) h[k] = narrow(out_dtype, grad_[i][k], false, 0);
        half_[i] = out_dtype;
      }
      const std::vector<float>& grad_src = out_dtype == DType::kF32 ? grad_[i] : hgrad_[i];
      if (dev_ && dout_[i].bytes() < size * sizeof(float)) {
        // The dense model's gradients: the same values as a host trainer's, written once (the
        // bench's own copy, not store traffic: setup_bytes says how much, drive subtracts it).
        STRATA_ASSIGN_OR_RETURN(dout_[i], dev_->allocate(grad_[i].size() * sizeof(float)));
        STRATA_ASSIGN_OR_RETURN(dgrad_[i], dev_->allocate(grad_[i].size() * sizeof(float)));
        STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer init, dev_->allocate_pinned(grad_[i].size() * sizeof(float)));
        std::memcpy(init.data(), grad_src.data(), grad_[i].size() * sizeof(float));
        dev_->copy_h2d(stream_.view(), dgrad_[i].data(), init.data(), grad_[i].size() * sizeof(float));
        STRATA_RETURN_IF_ERROR(dev_->synchronize(stream_.view()));
        setup_bytes += grad_[i].size() * sizeof(float);
      }
      float* out = out_[i].data();
      auto* grad = const_cast<float*>(grad_src.data());  // the store only reads gradients
      if (own_) {
        // The trainer's copies go through pinned memory, as a trainer's would (and strict emu requires).
        if (pout_[i].bytes() < size * sizeof(float)) {
          STRATA_ASSIGN_OR_RETURN(pout_[i], own_->allocate_pinned(grad_[i].size() * sizeof(float)));
          STRATA_ASSIGN_OR_RETURN(pgrad_[i], own_->allocate_pinned(grad_[i].size() * sizeof(float)));
        }
        out = pout_[i].as<float>();
        grad = pgrad_[i].as<float>();
      }
      out_views.push_back({out, rows, spec.dim, MemorySpace::kHost, out_dtype});
      grad_views.push_back({grad, rows, spec.dim, MemorySpace::kHost, out_dtype});
      if (dev_) {
        dev_out_views.push_back({dout_[i].as<float>(), rows, spec.dim, MemorySpace::kDevice, out_dtype});
        dev_grad_views.push_back({dgrad_[i].as<float>(), rows, spec.dim, MemorySpace::kDevice, out_dtype});
      }
    }
    return Status::ok();
  }
  // Forward into the trainer's buffers: host views (--trainer host); device views, stream-ordered
  // (the store's device); or host views, then the outputs H2D on the trainer's device (cpu mode).
  Status forward(std::int64_t id) {
    if (!dev_) return store_.forward(id, out_views);
    if (!own_) return store_.forward(id, dev_out_views, stream_.view());
    STRATA_RETURN_IF_ERROR(store_.forward(id, out_views));
    for (std::size_t i = 0; i < out_views.size(); ++i)
      if (const std::size_t b = view_bytes(out_views[i]))
        dev_->copy_h2d(stream_.view(), dout_[i].data(), out_views[i].data, b);
    return dev_->synchronize(stream_.view());
  }
  // Backward from the trainer's gradients (as forward; cpu mode: D2H first), and the trainer's
  // stream drained, so that a step's time holds all of its work.
  Status backward(std::int64_t id) {
    if (!dev_) return store_.backward(id, grad_views);
    if (!own_) {
      STRATA_RETURN_IF_ERROR(store_.backward(id, dev_grad_views, stream_.view()));
      return dev_->synchronize(stream_.view());
    }
    for (std::size_t i = 0; i < grad_views.size(); ++i)
      if (const std::size_t b = view_bytes(grad_views[i]))
        dev_->copy_d2h(stream_.view(), const_cast<float*>(grad_views[i].data), dgrad_[i].data(), b);
    STRATA_RETURN_IF_ERROR(dev_->synchronize(stream_.view()));
    return store_.backward(id, grad_views);
  }
  // The trainer's device when the bench opened it (its counters hold the trainer's copies), else null.
  gpu::Device* own_device() const noexcept { return own_.get(); }
  // The trainer's device (null: --trainer host).
  const gpu::Device* device() const noexcept { return dev_; }
  std::vector<MatrixView> out_views, dev_out_views;
  std::vector<ConstMatrixView> grad_views, dev_grad_views;
  std::uint64_t setup_bytes = 0;  // H2D bytes of the gradients' first upload (not store traffic)

 private:
  template <class View>
  static std::size_t view_bytes(const View& v) {
    return static_cast<std::size_t>(v.rows * v.cols * element_bytes(v.dtype));
  }
  Store& store_;
  Trainer trainer_ = Trainer::kHost;
  gpu::Device* dev_ = nullptr;
  std::unique_ptr<gpu::Device> own_;
  gpu::Stream stream_;
  std::mt19937 rng_;
  std::vector<std::vector<float>> out_, grad_;
  std::vector<std::vector<float>> hgrad_;  // half-size outputs: grad_ rounded to half_[i], two to a float
  std::vector<DType> half_;                // the dtype hgrad_[i] holds (fp32: none yet)
  std::vector<gpu::DeviceBuffer> dout_, dgrad_;
  std::vector<gpu::PinnedBuffer> pout_, pgrad_;  // cpu mode: the host side of the trainer's copies
};

// Adds one timed training batch to r's sums: keys, samples, the bytes of their rows, and the host
// bytes of the CPU kernels, which no device counts: the rows the CPU gather reads (cpu tables,
// offload tables pooled on the CPU; every key's row; the unpooled fp32 rows a table of several
// features is pooled from at the store's front) and the records the CPU optimizer reads and
// writes (cpu and offload tables; each distinct row of the batch once, as host/repeats.hpp sums
// its gradients).
Status count_timed_batch(const Store& store, const KeyBatch& b, ModeResult& r) {
  const StoreConfig& c = store.config();
  r.timed_keys += static_cast<double>(b.total_keys());
  r.timed_samples += static_cast<double>(b.batch_size());
  std::map<int, std::vector<Key>> host_keys;  // cpu and offload tables: the keys of all their features
  for (const JaggedKeys& f : b.features) {
    STRATA_ASSIGN_OR_RETURN(const auto feature, find_feature(c, f.table));
    const TableConfig& tc = c.tables[static_cast<std::size_t>(feature.first)];
    const double bytes = static_cast<double>(f.num_keys()) * row_sizes(tc.spec).row;
    r.timed_key_bytes += bytes;
    const bool cpu = tc.placement == Placement::kCpu, offload = tc.placement == Placement::kOffload;
    if (cpu || (offload && c.offload_gather == OffloadGather::kCpu)) r.timed_host_gather_bytes += bytes;
    // A table of several features is pooled per feature on the host from its unpooled fp32 rows.
    if (tc.features.size() > 1)
      r.timed_host_gather_bytes += static_cast<double>(f.num_keys()) * exchanged_row_bytes(tc.spec);
    if (cpu || offload) host_keys[feature.first].insert(host_keys[feature.first].end(), f.keys.begin(), f.keys.end());
  }
  // The optimizer updates each distinct row of a table once, over all its features.
  for (auto& [t, keys] : host_keys) {
    std::sort(keys.begin(), keys.end());
    const auto distinct = std::unique(keys.begin(), keys.end()) - keys.begin();
    r.timed_host_optimizer_bytes +=
        static_cast<double>(distinct) * row_sizes(c.tables[static_cast<std::size_t>(t)].spec).record;
  }
  ++r.timed_batches;
  return Status::ok();
}

// Runs the forward phase and the training phase of one rank's store. Rank r of `ranks` uses every
// ranks-th batch starting at r, so the ranks train on different batches of the same sequence.
// With `r` (rank 0) it records step times, the counters over the timed training steps and the
// sums of count_timed_batch.
Status drive(const Options& o, Store& store, const BatchSource& source, int rank, int ranks, const std::string& label,
             ModeResult* r) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(rank, ranks));
  BatchWindow window(std::move(cursor), o.dynamic);
  StepBuffers buffers(store, rank, o.trainer);
  STRATA_RETURN_IF_ERROR(buffers.init());
  const bool show = r != nullptr && o.progress;
  std::int64_t id = 0;
  const int total = o.warmup + o.steps;
  Progress fwd(label + " forward", total, show);
  // A trainer's data loader builds a fresh batch each step and moves it into the store; each
  // step's copy (read from the file for a trace) is made before its clock starts and moved in.
  for (int s = 0; s < total; ++s) {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, window.at(s));
    KeyBatch fresh = *b;
    window.drop_before(s + 1);
    STRATA_RETURN_IF_ERROR(buffers.shape(fresh));
    const auto t = Clock::now();
    STRATA_RETURN_IF_ERROR(store.submit(id, std::move(fresh)));
    STRATA_RETURN_IF_ERROR(buffers.forward(id));
    STRATA_RETURN_IF_ERROR(store.discard(id));
    if (r && s >= o.warmup) r->forward_s.push_back(seconds_since(t));
    ++id;
    fwd.tick(s + 1);
  }
  // Training keeps `depth` batches submitted ahead of the one being computed (the lookahead window
  // plus the prefetch pipeline), as a trainer would; the step time is submit(i + depth) + forward(i)
  // + backward(i).
  const int depth = o.lookahead + o.pipeline;
  // Training continues with the batches after the forward phase's, so a cache warmed by the
  // forward phase does not see the same batches again (unless the source has fewer than
  // 2 x (warmup + steps) batches and they cycle).
  const std::int64_t first = total;
  auto batch_of = [&](int s) { return window.at(first + s); };
  const std::int64_t base = id;
  // The keys of the timed training batches: duplication (dedup is per table and batch) and sums.
  double dup_keys = 0, dup_unique = 0;
  const auto count_submitted = [&](int s, const KeyBatch& b) -> Status {
    if (!r || s < o.warmup) return Status::ok();
    STRATA_RETURN_IF_ERROR(count_timed_batch(store, b, *r));
    if (ranks > 1) {
      std::map<std::string, std::vector<Key>> keys;  // dedup is per table: all its features' keys
      for (const auto& f : b.features) {
        std::vector<Key>& k = keys[table_of(o, f.table)];
        k.insert(k.end(), f.keys.begin(), f.keys.end());
      }
      for (auto& [table, sorted] : keys) {
        std::sort(sorted.begin(), sorted.end());
        dup_keys += static_cast<double>(sorted.size());
        dup_unique += static_cast<double>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
      }
    }
    return Status::ok();
  };
  const auto submit = [&](int s) -> Status {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(s));
    STRATA_RETURN_IF_ERROR(count_submitted(s, *b));
    return store.submit(base + s, *b);
  };
  // With --preview W the trainer announces the keys of the W batches after those submitted, as a
  // data loader that reads ahead would (keys only; the lookahead policy plans with them).
  int previewed = 0;  // batches [0, previewed) of the training phase have been previewed
  const auto preview_upto = [&](int end) -> Status {
    for (end = std::min(end, total); o.preview > 0 && previewed < end; ++previewed) {
      STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(previewed));
      STRATA_RETURN_IF_ERROR(store.preview(base + previewed, *b));
    }
    return Status::ok();
  };
  STRATA_RETURN_IF_ERROR(preview_upto(o.preview));
  for (int s = 0; s < std::min(depth - 1, total); ++s) {
    STRATA_RETURN_IF_ERROR(submit(s));
    STRATA_RETURN_IF_ERROR(preview_upto(s + 1 + o.preview));
  }
  Progress train(label + " train", total, show);
  // The counters of the timed steps: the store's, the trainer's own device's (cpu mode: its
  // copies of outputs and gradients), less the bench's first upload of the trainer's gradients.
  const auto snapshot = [&] {
    StoreStats st = store.stats();
    if (gpu::Device* own = buffers.own_device()) {
      st.links += own->counters().snapshot();
    }
    st.links.h2d -= buffers.setup_bytes;
    st.links.hbm_write -= buffers.setup_bytes;
    return st;
  };
  StoreStats before;
  for (int s = 0; s < total; ++s) {
    if (s == o.warmup) before = snapshot();
    KeyBatch fresh;
    const bool ahead = s + depth - 1 < total;
    if (ahead) {
      STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, batch_of(s + depth - 1));
      STRATA_RETURN_IF_ERROR(count_submitted(s + depth - 1, *b));
      fresh = *b;
      // Read what the previews of this step need before the clock starts.
      if (o.preview > 0) STRATA_RETURN_IF_ERROR(batch_of(std::min(total, s + depth + o.preview) - 1).status());
    }
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* current, batch_of(s));
    STRATA_RETURN_IF_ERROR(buffers.shape(*current));
    const auto t = Clock::now();
    if (ahead) {
      STRATA_RETURN_IF_ERROR(store.submit(base + s + depth - 1, std::move(fresh)));
      STRATA_RETURN_IF_ERROR(preview_upto(s + depth + o.preview));
    }
    const auto t1 = Clock::now();
    STRATA_RETURN_IF_ERROR(buffers.forward(base + s));
    const auto t2 = Clock::now();
    STRATA_RETURN_IF_ERROR(buffers.backward(base + s));
    if (r && s >= o.warmup) {
      r->train_s.push_back(seconds_since(t));
      r->submit_s.push_back(std::chrono::duration<double>(t1 - t).count());
      r->lookup_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      r->backward_s.push_back(seconds_since(t2));
    }
    // Batch s is done; the later ones are submitted, previewed or still to come.
    window.drop_before(first + s + 1);
    train.tick(s + 1);
  }
  if (r) {
    r->train_stats = stats_delta(snapshot(), before);
    if (const gpu::Device* d = buffers.device())
      r->trainer_device = d->info().backend == gpu::Backend::kCuda ? "cuda " + d->info().name : "emu";
    r->trainer_device_own = buffers.own_device() != nullptr;
  }
  // The duplication factor of the keys the timed training steps dispatched, to set against the
  // cut in bytes exchanged.
  if (r && ranks > 1) r->duplication_factor = dup_unique > 0 ? dup_keys / dup_unique : 1.0;
  return store.flush();
}

}  // namespace

Result<ModeResult> run_mode(const Options& o, const ModeDescriptor& mode, double cache_fraction,
                            const BatchSource& batches, const std::string& label) {
  STRATA_ASSIGN_OR_RETURN(StoreConfig config, make_config(o, mode, cache_fraction));
  const int ranks = o.mpi ? o.mpi->size() : runs_on_ranks(mode) ? o.ranks : 1;
  ModeResult r;
  r.mode = &mode;
  r.ranks = ranks;
  r.cache_fraction = cache_fraction;
  r.host_table_bytes = host_table_bytes(config);
  for (const SlotPool& p : slot_pools(config)) {
    r.cache_rows += p.rows;
    r.cache_bytes += static_cast<double>(p.rows) * row_sizes(config.tables[p.tables.front()].spec).record;
  }
  r.peak_rss_per_mode = reset_peak_rss();
  r.rss_start_bytes = process_rss_bytes();
  const auto t0 = Clock::now();
  if (o.mpi) {
    // This process is one rank; rank 0 records.
    const int me = o.mpi->rank();
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(config, o.mpi));
    r.setup_s = seconds_since(t0);
    STRATA_RETURN_IF_ERROR(drive(o, *store, batches, me, ranks, label, me == 0 ? &r : nullptr));
  } else if (ranks == 1) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(config));
    r.setup_s = seconds_since(t0);
    STRATA_RETURN_IF_ERROR(drive(o, *store, batches, 0, 1, label, &r));
  } else {
    // One thread per rank: opening, every step and read_rows are collectives.
    STRATA_ASSIGN_OR_RETURN(auto group, dispatch::make_local_group(ranks, comm_options(o)));
    std::vector<Status> status(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(ranks));
    for (int q = 0; q < ranks; ++q)
      threads.emplace_back([&, q] {
        auto store =
            Store::open(config, std::shared_ptr<dispatch::Communicator>(std::move(group[static_cast<std::size_t>(q)])));
        if (q == 0) r.setup_s = seconds_since(t0);
        status[static_cast<std::size_t>(q)] =
            store ? drive(o, **store, batches, q, ranks, label, q == 0 ? &r : nullptr) : store.status();
      });
    for (auto& t : threads) t.join();
    for (int q = 0; q < ranks; ++q)
      if (!status[static_cast<std::size_t>(q)].is_ok())
        return status[static_cast<std::size_t>(q)].with_context("rank " + std::to_string(q));
  }
  // A step is one batch on every rank: rank 0's timed training batches, averaged.
  const double n = std::max(1, r.timed_batches);
  r.keys_per_step = r.timed_keys / n * ranks;
  r.samples_per_step = r.timed_samples / n * ranks;
  r.bytes_per_lookup = r.timed_keys > 0 ? r.timed_key_bytes / r.timed_keys : 0;
  // The CPU kernels' host bytes are rank 0's, as its counters are (each rank pools its own batch).
  r.host_gather_bytes_per_step = r.timed_host_gather_bytes / n;
  r.host_optimizer_bytes_per_step = r.timed_host_optimizer_bytes / n;
  r.device = r.train_stats.device;
  r.device_peak_bytes = r.train_stats.device_peak_bytes;
  r.peak_rss_bytes = process_peak_rss_bytes();
  return r;
}

Result<std::vector<std::int64_t>> touched_rows_per_pool(const Options& o, const StoreConfig& config,
                                                        const BatchSource& source) {
  const std::vector<SlotPool> pools = slot_pools(config);
  std::map<std::string, std::size_t> pool_of;  // table name -> index into pools
  for (std::size_t p = 0; p < pools.size(); ++p)
    for (const std::size_t t : pools[p].tables) pool_of[config.tables[t].spec.name] = p;
  std::map<std::string, std::vector<Key>> keys;  // table -> its distinct keys so far (sorted after compact)
  const auto compact = [](std::vector<Key>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BatchCursor> cursor, source.cursor(0, 1));
  BatchWindow window(std::move(cursor), o.dynamic);
  const std::int64_t n = 2 * std::int64_t{o.warmup + o.steps};
  for (std::int64_t i = 0; i < n; ++i) {
    STRATA_ASSIGN_OR_RETURN(const KeyBatch* b, window.at(i));
    for (const auto& f : b->features) {
      const std::string& table = table_of(o, f.table);
      if (pool_of.count(table) == 0) continue;
      std::vector<Key>& v = keys[table];
      v.insert(v.end(), f.keys.begin(), f.keys.end());
      if (v.size() > (std::size_t{1} << 22)) compact(v);  // bounded memory for long runs
    }
    window.drop_before(i + 1);
  }
  std::vector<std::int64_t> touched(pools.size(), 0);
  for (auto& [table, v] : keys) {
    compact(v);
    touched[pool_of[table]] += static_cast<std::int64_t>(v.size());
  }
  return touched;
}

}  // namespace strata::bench
