#include "store/engines/offload_engine.hpp"

#include <cstring>
#include <unordered_map>

#include "gpu/staging.hpp"
#include "host/dedup.hpp"
#include "store/engines/cpu_engine.hpp"
#include "store/engines/detail/activation_copy.hpp"
#include "store/engines/detail/mapped_rows.hpp"

namespace strata::detail {
namespace {

// Device gather: the distinct rows of the batch's features of one dim and dtype, read once from
// host memory (zero-copy) into `rows`, where the gather finds them (half rows stay half there and
// are widened by the gather).
struct RowGroup {
  std::int32_t dim = 0;
  DType dtype = DType::kF32;
  std::int64_t unique = 0;         // distinct rows (of all its features)
  float** sources = nullptr;       // (unique) device: device addresses of their host records
  float* rows = nullptr;           // (unique, words()) device
  std::vector<std::size_t> feats;  // engine features in this group

  // Words of one row's weights (the records' first words; no state).
  std::int64_t words() const { return element_words(dim, dtype); }
  gpu::SlotPool pool() const {
    gpu::SlotPool p{rows, unique, words(), dim, 0};
    p.dtype = dtype;
    return p;
  }
};

struct OffloadBatch final : EngineBatch {
  std::unique_ptr<gpu::Staging> st;       // its ready(): metadata uploaded (device gather)
  std::unique_ptr<gpu::Staging> act;      // device gather, host views: the device buffers of the outputs (looks[i].out)
  std::vector<gpu::LookupFeature> looks;  // per engine feature, device pointers (out: set with act)
  std::vector<float*> host_out;           // per engine feature, pinned: its output elements (or gradient, as given)
  std::vector<RowGroup> groups;           // device gather: one per dim
  std::vector<const float*> grads;        // per engine feature, host: set by prepare_backward
  bool outputs_pending = false;           // CPU gather: a stream-ordered forward's copies out of host_out may be queued
};

class OffloadEngine final : public Engine {
 public:
  OffloadEngine(const StoreConfig& config, gpu::Device& dev, std::unordered_map<int, HostTableOps> tables,
                MappedRows mapped, gpu::Stream copy, gpu::Stream compute)
      : config_(config),
        dev_(dev),
        tables_(std::move(tables)),
        mapped_(std::move(mapped)),
        copy_(std::move(copy)),
        compute_(std::move(compute)) {}

  ~OffloadEngine() override {
    (void)dev_.synchronize(copy_.view());
    (void)dev_.synchronize(compute_.view());
  }

  Status accepting() override { return dev_.status(); }  // a failed device accepts no more work

  Result<std::unique_ptr<EngineBatch>> submit(std::int64_t, const KeyBatch& batch, const EngineFeatures& f) override {
    STRATA_RETURN_IF_ERROR(accepting());
    auto b = std::make_unique<OffloadBatch>();
    const bool device_gather = config_.offload_gather == OffloadGather::kDevice;
    std::size_t mirrored = 0, outs = 0, rows = 0;
    if (device_gather) group_rows(batch, f, *b);
    for (const RowGroup& g : b->groups) {
      mirrored += gpu::Staging::bytes_for<float*>(static_cast<std::size_t>(g.unique));
      rows += gpu::Staging::bytes_for<float>(static_cast<std::size_t>(g.unique * g.words()));
    }
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      if (device_gather) {
        mirrored += gpu::Staging::bytes_for<std::int64_t>(static_cast<std::size_t>(k.batch_size() + 1)) +
                    gpu::Staging::bytes_for<Key>(static_cast<std::size_t>(k.num_keys())) +
                    gpu::Staging::bytes_for<float>(k.weights.size());
      }
      outs += gpu::Staging::bytes_for<float>(words(bytes_of(batch, f, i)));
    }
    // The device buffers of the outputs are taken only by a device gather's forward of host views
    // (activation_staging).
    STRATA_ASSIGN_OR_RETURN(b->st, staging_.take({mirrored, outs, rows}));
    std::vector<Key*> inverse(f.feature.size(), nullptr);
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const TableSpec& spec = spec_of(f.table[i]);
      gpu::LookupFeature lf;
      lf.batch = k.batch_size();
      lf.num_keys = k.num_keys();
      lf.pooling = spec.pooling;
      lf.out_dtype = spec.output_dtype;
      if (device_gather) {
        auto offs = b->st->mirrored<std::int64_t>(static_cast<std::size_t>(k.batch_size() + 1));
        copy_offsets(k, offs.host);
        auto keys = b->st->mirrored<Key>(static_cast<std::size_t>(k.num_keys()));
        inverse[i] = keys.host;
        lf.offsets = offs.dev;
        lf.rows = keys.dev;  // the key's row in its group's buffer, set below
        if (!k.weights.empty()) {
          auto w = b->st->mirrored<float>(k.weights.size());
          std::memcpy(w.host, k.weights.data(), k.weights.size() * sizeof(float));
          lf.weights = w.dev;
        }
      }
      b->host_out.push_back(b->st->host_only<float>(words(bytes_of(batch, f, i))));
      b->looks.push_back(lf);
    }
    for (RowGroup& g : b->groups) {
      auto sources = b->st->mirrored<float*>(static_cast<std::size_t>(g.unique));
      g.sources = sources.dev;
      g.rows = b->st->dev_only<float>(static_cast<std::size_t>(g.unique * g.words()));
      std::int64_t next = 0;
      gpu::NodeBytes read;  // the device reads each row from host memory: counted as cache fills are
      for (std::size_t i : g.feats) {
        const UniqueKeys& u = unique_[i];
        const HostTable& table = tables_.at(f.table[i]).table();
        for (std::int64_t r = 0; r < u.size(); ++r, ++next) {
          const Key row = u.keys[static_cast<std::size_t>(r)];
          sources.host[next] = mapped_.row(f.table[i], row);
          read.add(table.node_of(row), static_cast<std::uint64_t>(g.words()) * sizeof(float));
          for (std::int64_t p = u.offsets[static_cast<std::size_t>(r)]; p < u.offsets[static_cast<std::size_t>(r) + 1];
               ++p)
            inverse[i][u.positions[static_cast<std::size_t>(p)]] = next;
        }
      }
      dev_.counters().add_host_reads(read);
    }
    if (device_gather) {
      b->st->upload(copy_.view());
      dev_.record(b->st->ready(), copy_.view());
    }
    dev_.record(b->st->done(), copy_.view());
    return std::unique_ptr<EngineBatch>(std::move(b));
  }

  bool device_views() const noexcept override { return true; }
  void staging_stats(StagingBytes& batches, StagingBytes& activations) const override {
    add_staging(staging_, batches);
    add_staging(activations_, activations);
  }

  // Device views: the device gather writes each feature straight into the caller's buffer, and the
  // CPU gather's pinned outputs go H2D straight into it (one copy per view, from the batch's own
  // staging: the store's host bounce would add a memcpy into its scratch and, before, a copy into
  // this engine's device staging). Host views: the device gather's outputs come back D2H into the
  // batch's pinned staging, and the host waits and copies them out; the CPU gather pools into
  // them in place, as the `cpu` engine does (nothing crosses PCIe).
  Status forward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f,
                 const std::vector<MatrixView>& outputs, const CallOrder& order) override {
    auto& b = static_cast<OffloadBatch&>(eb);
    const gpu::StreamView s = compute_.view();
    bool host = false, device = false;
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      if (!bytes_of(batch, f, i)) continue;  // a feature of zero rows may have null views
      (out(outputs, f, i).space == MemorySpace::kDevice ? device : host) = true;
    }
    const bool device_gather = config_.offload_gather == OffloadGather::kDevice;
    if (host && device_gather) STRATA_RETURN_IF_ERROR(stage_outputs(batch, f, b));
    // The caller's buffers are written on the device only after its work queued before the call.
    if (device && order.after.state()) dev_.wait(s, order.after);
    if (device_gather) {
      // Per dim: the distinct rows cross PCIe once (one launch), then one table-batched gather.
      dev_.wait(s, b.st->ready());
      for (const RowGroup& g : b.groups) {
        dev_.records_from_host(s, g.pool(), nullptr, g.unique, g.sources);
        std::vector<gpu::LookupFeature> looks;
        for (std::size_t i : g.feats) {
          looks.push_back(b.looks[i]);
          if (out(outputs, f, i).space == MemorySpace::kDevice) looks.back().out = out(outputs, f, i).data;
        }
        dev_.gather_pool(s, g.pool(), looks);
      }
      for (std::size_t i = 0; i < f.feature.size(); ++i)
        if (out(outputs, f, i).space == MemorySpace::kHost)
          dev_.copy_d2h(s, b.host_out[i], b.looks[i].out, bytes_of(batch, f, i));
    } else {
      // CPU threads pool: into a host view in place (a trainer on the host, as `cpu` does: nothing
      // crosses PCIe), or into pinned memory whose pooled outputs go H2D into a device view. A
      // forward of this batch again must not rewrite that memory while the last one's copies out
      // of it may still be queued (a stream-ordered call returned without waiting).
      if (b.outputs_pending) STRATA_RETURN_IF_ERROR(dev_.synchronize(b.st->done()));
      b.outputs_pending = false;
      // Every table pooled in one table-batched pass (HostBatch), then the device views' copies:
      // each output of its table's output_dtype (forward_item), as host_out and the copies are.
      features_.clear();
      for (std::size_t i = 0; i < f.feature.size(); ++i) {
        const MatrixView& o = out(outputs, f, i);
        HostFeature x;
        x.ops = &tables_.at(f.table[i]);
        x.keys = &batch.features[static_cast<std::size_t>(f.feature[i])];
        x.out = o.space == MemorySpace::kHost ? o.data : b.host_out[i];
        features_.push_back(x);
      }
      host_.forward(features_);
      for (std::size_t i = 0; i < f.feature.size(); ++i) {
        const MatrixView& o = out(outputs, f, i);
        if (o.space == MemorySpace::kHost) continue;
        if (const std::size_t n = bytes_of(batch, f, i)) dev_.copy_h2d(s, o.data, b.host_out[i], n);
      }
    }
    // The activation entry's done first: a host wait for the batch's done then covers both, so
    // the next forward finds this entry ready to reuse instead of making another.
    if (b.act) dev_.record(b.act->done(), s);
    dev_.record(b.st->done(), s);
    // A stream-ordered call with device views only returns without waiting: the caller's stream
    // waits instead, and backward()'s host wait on this stream covers the device's reads of the
    // host rows before the CPU updates them.
    if (device && order.caller.state()) dev_.wait(order.caller, b.st->done());
    if (!host && order.caller.state()) {
      // Only the device gather reads host rows on the device; the CPU gather's copies read the
      // batch's own pinned outputs.
      if (config_.offload_gather == OffloadGather::kDevice) {
        reads_pending_ = true;
      } else {
        b.outputs_pending = true;
      }
      return dev_.status();
    }
    STRATA_RETURN_IF_ERROR(dev_.synchronize(b.st->done()));
    reads_pending_ = false;  // done is the last work on this stream
    for (std::size_t i = 0; device_gather && i < f.feature.size(); ++i) {
      const MatrixView& o = out(outputs, f, i);
      if (const std::size_t n = bytes_of(batch, f, i); n && o.space == MemorySpace::kHost)
        copy_activations(dev_.counters(), o.data, b.host_out[i], n);
    }
    return Status::ok();
  }

  // Brings every gradient to host memory before any engine of the call applies anything: each
  // device view D2H once into the batch's pinned staging (host_out, free since forward: its last
  // use is ordered before on this stream), after the caller's work (order.after); half ones stay
  // half there, widened exactly as the CPU optimizer reads them (backward_item). The host then
  // waits for this stream, also with host gradients only while a stream-ordered forward of device
  // views may still be reading the host rows the CPU is about to update. Changes no table.
  Status prepare_backward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f,
                          const std::vector<ConstMatrixView>& grads, const CallOrder& order) override {
    auto& b = static_cast<OffloadBatch&>(eb);
    const gpu::StreamView s = compute_.view();
    b.grads.assign(f.feature.size(), nullptr);
    bool device_grads = false;
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const ConstMatrixView& g = grads[static_cast<std::size_t>(f.feature[i])];
      if (g.space == MemorySpace::kHost) {
        b.grads[i] = g.data;
        continue;
      }
      if (!device_grads && order.after.state()) dev_.wait(s, order.after);
      device_grads = true;
      if (const std::size_t n = bytes_of(batch, f, i)) dev_.copy_d2h(s, b.host_out[i], g.data, n);
      b.grads[i] = b.host_out[i];
    }
    if (!device_grads && !reads_pending_) return dev_.status();
    dev_.record(b.st->done(), s);
    STRATA_RETURN_IF_ERROR(dev_.synchronize(b.st->done()));
    reads_pending_ = false;
    return Status::ok();
  }

  Status backward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f, const std::vector<ConstMatrixView>&,
                  std::int64_t t, const CallOrder&) override {
    auto& b = static_cast<OffloadBatch&>(eb);
    STRATA_CHECK(b.grads.size() == f.feature.size());  // the store calls prepare_backward first
    // Nothing on the device reads these rows while the CPU updates them: forward or
    // prepare_backward waited for this engine's device work. A failed device applies nothing (the
    // store retires the batch), as in every device mode.
    if (Status dev = dev_.status(); !dev.is_ok()) {
      release(b);
      return dev;
    }
    // The CPU optimizer of every table in one table-batched pass (HostBatch), reading each
    // gradient of its table's output_dtype (half ones widened exactly as read, as `cpu` does).
    features_.clear();
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      HostFeature x;
      x.ops = &tables_.at(f.table[i]);
      x.keys = &batch.features[static_cast<std::size_t>(f.feature[i])];
      x.grads = b.grads[i];
      x.step = make_optimizer_step(spec_of(f.table[i]), t);
      features_.push_back(x);
    }
    host_.backward(features_);
    release(b);
    return Status::ok();
  }

  Status discard(EngineBatch& eb, const KeyBatch&, const EngineFeatures&) override {
    release(static_cast<OffloadBatch&>(eb));
    return Status::ok();
  }

  Status flush() override { return dev_.status(); }
  const char* name() const noexcept override { return "offload"; }
  void host_tables(std::vector<std::pair<int, const HostTable*>>& out) const override { add_host_tables(tables_, out); }

  Status read_rows_at(int table, const TableSpec&, const std::vector<std::int64_t>& rows, float* weights,
                      float* state) override {
    tables_.at(table).read_rows(rows, weights, state);
    return Status::ok();
  }
  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    tables_.at(table).read_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    STRATA_RETURN_IF_ERROR(reads_done());
    tables_.at(table).write_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status reset_rows(int table, const std::vector<std::int64_t>& rows, const float* weights,
                    const float* state) override {
    STRATA_RETURN_IF_ERROR(reads_done());
    tables_.at(table).write_rows(rows, weights, state);
    return Status::ok();
  }

 private:
  // A stream-ordered forward of a discarded batch may still be reading the rows (only then does
  // this wait on the device: offload rows stay writable after a device fault).
  Status reads_done() {
    if (reads_pending_) {
      STRATA_RETURN_IF_ERROR(dev_.synchronize(compute_.view()));
      reads_pending_ = false;
    }
    return Status::ok();
  }
  const TableSpec& spec_of(int table) const { return config_.tables[static_cast<std::size_t>(table)].spec; }
  static const MatrixView& out(const std::vector<MatrixView>& outputs, const EngineFeatures& f, std::size_t i) {
    return outputs[static_cast<std::size_t>(f.feature[i])];
  }
  // Bytes of feature i's output (and gradient): its elements of the table's output_dtype.
  std::size_t bytes_of(const KeyBatch& batch, const EngineFeatures& f, std::size_t i) const {
    const TableSpec& spec = spec_of(f.table[i]);
    return static_cast<std::size_t>(output_rows(batch.features[static_cast<std::size_t>(f.feature[i])], spec.pooling) *
                                    spec.dim) *
           static_cast<std::size_t>(element_bytes(spec.output_dtype));
  }
  // 32-bit words that hold `bytes` (an output of half elements may end mid-word).
  static std::size_t words(std::size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  void release(OffloadBatch& b) {
    staging_.give_back(std::move(b.st));
    activations_.give_back(std::move(b.act));  // its done() was recorded by the forward that took it
  }

  // Takes b.act, once per batch, for the device buffers of host views' outputs (every feature's).
  // Changes nothing on failure.
  Status stage_outputs(const KeyBatch& batch, const EngineFeatures& f, OffloadBatch& b) {
    if (b.act) return Status::ok();
    std::size_t outs = 0;
    for (std::size_t i = 0; i < f.feature.size(); ++i)
      outs += gpu::Staging::bytes_for<float>(words(bytes_of(batch, f, i)));
    auto act = activations_.take({0, 0, outs});
    if (!act)
      return act.status().with_context("staging of " + std::to_string(outs) +
                                       " bytes of device memory for the outputs of host views");
    b.act = std::move(act).value();
    for (std::size_t i = 0; i < f.feature.size(); ++i)
      b.looks[i].out = b.act->dev_only<float>(words(bytes_of(batch, f, i)));
    return Status::ok();
  }

  // Dedups every feature's keys (unique_) and groups the features by dim (b.groups).
  void group_rows(const KeyBatch& batch, const EngineFeatures& f, OffloadBatch& b) {
    if (unique_.size() < f.feature.size()) unique_.resize(f.feature.size());
    std::unordered_map<std::int64_t, std::size_t> group_of;  // by dim * 4 + dtype
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      dedup_keys(k, unique_[i], scratch_, DedupOrder::kAny);
      const TableSpec& spec = spec_of(f.table[i]);
      auto [it, fresh] =
          group_of.emplace(std::int64_t{spec.dim} * 4 + static_cast<std::int64_t>(spec.dtype), b.groups.size());
      if (fresh) b.groups.push_back(RowGroup{spec.dim, spec.dtype, 0, nullptr, nullptr, {}});
      RowGroup& g = b.groups[it->second];
      g.unique += unique_[i].size();
      g.feats.push_back(i);
    }
  }

  const StoreConfig& config_;
  gpu::Device& dev_;
  std::unordered_map<int, HostTableOps> tables_;
  MappedRows mapped_;  // device gather: the device addresses of the tables' records
  gpu::Stream copy_, compute_;
  // A forward returned before its work on compute_ was done (stream-ordered, device views only):
  // the device may still read host rows.
  bool reads_pending_ = false;
  std::vector<HostFeature> features_;  // the CPU gather's and optimizer's features of a call (reused)
  HostBatch host_;                     // the CPU gather and optimizer
  std::vector<UniqueKeys> unique_;     // per engine feature of the batch being submitted
  DedupScratch scratch_;
  gpu::StagingRing staging_{dev_};
  gpu::StagingRing activations_{dev_};  // host views' outputs on the device (OffloadBatch::act)
};

}  // namespace

Result<std::unique_ptr<Engine>> make_offload_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device) {
  options.pinner = &device.pinner();
  // Small tables share 2 MiB arenas, pinned whole (host/host_table.hpp); the tables keep them alive.
  ArenaPacker packer;
  options.packer = &packer;
  std::unordered_map<int, HostTableOps> ops;
  MappedRows mapped;
  for (int t : tables) {
    const TableSpec& spec = config.tables[static_cast<std::size_t>(t)].spec;
    STRATA_ASSIGN_OR_RETURN(HostTable table, HostTable::create(topo, spec, options));
    if (config.offload_gather == OffloadGather::kDevice)
      STRATA_RETURN_IF_ERROR(mapped.add(device, t, table.ref()).with_context("offload table '" + spec.name + "'"));
    ops.emplace(t, HostTableOps(std::move(table)));
  }
  STRATA_ASSIGN_OR_RETURN(gpu::Stream copy, device.create_stream());
  STRATA_ASSIGN_OR_RETURN(gpu::Stream compute, device.create_stream());
  return std::unique_ptr<Engine>(std::make_unique<OffloadEngine>(config, device, std::move(ops), std::move(mapped),
                                                                 std::move(copy), std::move(compute)));
}

}  // namespace strata::detail
