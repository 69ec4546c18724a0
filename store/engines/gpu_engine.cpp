#include "store/engines/gpu_engine.hpp"

#include <algorithm>
#include <cstring>

#include "host/host_table.hpp"
#include "store/engines/detail/slot_pool_engine.hpp"
#include "store/engines/device_features.hpp"

namespace strata::detail {
namespace {

struct GpuBatch final : EngineBatch, SlotBatch {
  std::vector<UniqueKeys> unique;  // per engine feature
};

// Rows moved per bounce through pinned memory by read_rows and write_rows.
constexpr std::int64_t kChunkRows = 16384;

class GpuEngine final : public Engine {
 public:
  GpuEngine(const StoreConfig& config, gpu::Device& dev) : config_(config), dev_(dev), core_(config, dev) {}

  Status init(const std::vector<int>& tables) {
    STRATA_RETURN_IF_ERROR(core_.init({}));
    where_.assign(config_.tables.size(), {-1, 0});
    for (const auto& [shape, members] : SlotPoolEngine::shapes(config_, tables)) {
      std::int64_t slots = 0;
      for (int t : members) {
        where_[static_cast<std::size_t>(t)] = {static_cast<int>(core_.pools().size()), slots};
        slots += spec_of(t).rows;
      }
      std::string names;
      for (int t : members) names += (names.empty() ? "'" : ", '") + spec_of(t).name + "'";
      STRATA_RETURN_IF_ERROR(core_.add_pool(shape, slots, members,
                                            "gpu tables " + names + " (" + std::to_string(slots) + " rows of dim " +
                                                std::to_string(shape.dim) + ") need "));
    }
    for (int t : tables) STRATA_RETURN_IF_ERROR(initialize(t));
    return Status::ok();
  }

  Status accepting() override { return dev_.status(); }  // a failed device accepts no more work

  Result<std::unique_ptr<EngineBatch>> submit(std::int64_t, const KeyBatch& batch, const EngineFeatures& f) override {
    STRATA_RETURN_IF_ERROR(accepting());
    auto b = std::make_unique<GpuBatch>();
    b->unique.resize(f.feature.size());
    std::size_t mirrored = 0;
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      dedup_keys(k, b->unique[i], scratch_);
      add_feature_bytes(k, b->unique[i].size(), spec_of(f.table[i]), mirrored);
    }
    group_by_pool(f, b->work);
    STRATA_ASSIGN_OR_RETURN(b->st, core_.staging().take({mirrored, 0, 0}));
    std::vector<Key> slots;
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const Key base = where_[static_cast<std::size_t>(f.table[i])].second;
      slots.assign(b->unique[i].keys.begin(), b->unique[i].keys.end());
      for (Key& x : slots) x += base;
      b->dev.push_back(stage_feature(*b->st, batch.features[static_cast<std::size_t>(f.feature[i])],
                                     spec_of(f.table[i]), b->unique[i], slots));
    }
    b->st->upload(core_.copy());
    dev_.record(b->st->ready(), core_.copy());
    return std::unique_ptr<EngineBatch>(std::move(b));
  }

  bool device_views() const noexcept override { return true; }
  void staging_stats(StagingBytes& batches, StagingBytes& activations) const override {
    core_.staging_stats(batches, activations);
  }

  Status forward(EngineBatch& eb, const KeyBatch&, const EngineFeatures& f, const std::vector<MatrixView>& outputs,
                 const CallOrder& order) override {
    return core_.forward(static_cast<GpuBatch&>(eb), f, outputs, order);
  }

  Status backward(EngineBatch& eb, const KeyBatch&, const EngineFeatures& f, const std::vector<ConstMatrixView>& grads,
                  std::int64_t t, const CallOrder& order) override {
    return core_.backward(static_cast<GpuBatch&>(eb), f, grads, t, order);
  }

  Status discard(EngineBatch& eb, const KeyBatch&, const EngineFeatures&) override {
    core_.discard(static_cast<GpuBatch&>(eb));
    return dev_.status();
  }

  Status flush() override { return dev_.synchronize(core_.compute()); }
  const char* name() const noexcept override { return "gpu"; }

  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    if (Status s = dev_.synchronize(core_.compute()); !s.is_ok())
      return s.with_context("table '" + spec_of(table).name + "' (gpu: its rows live only in device memory)");
    return bounce(table, row0, n, true, false, [&](float* rec, std::int64_t r, const RecordShape& shape) {
      read_record(rec, shape, weights + r * shape.dim, state ? state + r * shape.state_dim : nullptr);
    });
  }

  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    STRATA_RETURN_IF_ERROR(dev_.synchronize(core_.compute()));
    // Read-modify-write: without `state` the optimizer state of the rows stays as it is.
    // Half elements are rounded to nearest (HostTable::write_row).
    return bounce(table, row0, n, state == nullptr, true, [&](float* rec, std::int64_t r, const RecordShape& shape) {
      write_record(rec, shape, weights + r * shape.dim, state ? state + r * shape.state_dim : nullptr);
    });
  }

  // Without a host wait: the records and their slots go through a staging entry and are unpacked into the slots on the
  // compute stream, after its work in flight (a retired batch's updates, a discarded batch's stream-ordered forward
  // may still touch the rows' slots) and before the lookups of the batch that uses them (queued there later).
  Status reset_rows(int table, const std::vector<std::int64_t>& rows, const float* weights,
                    const float* state) override {
    if (rows.empty()) return Status::ok();
    const auto [p, base] = where_[static_cast<std::size_t>(table)];
    const gpu::SlotPool& pool = core_.pool(p).view;
    const RecordShape shape = pool.shape();
    STRATA_CHECK(state || shape.state_dim == 0);
    const std::size_t n = rows.size(), rec = static_cast<std::size_t>(pool.stride);
    STRATA_ASSIGN_OR_RETURN(
        std::unique_ptr<gpu::Staging> st,
        core_.staging().take({gpu::Staging::bytes_for<Key>(n) + gpu::Staging::bytes_for<float>(n * rec), 0, 0}));
    const auto slots = st->mirrored<Key>(n);
    const auto records = st->mirrored<float>(n * rec);
    std::memset(records.host, 0, n * rec * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) {
      slots.host[i] = base + rows[i];
      write_record(records.host + i * rec, shape, weights + i * static_cast<std::size_t>(shape.dim),
                   state ? state + i * static_cast<std::size_t>(shape.state_dim) : nullptr);
    }
    const gpu::StreamView s = core_.compute();
    st->upload(s);
    dev_.unpack_records(s, pool, slots.dev, static_cast<std::int64_t>(n), records.dev);
    dev_.record(st->done(), s);
    core_.staging().give_back(std::move(st));
    return dev_.status();
  }

 private:
  const TableSpec& spec_of(int table) const { return config_.tables[static_cast<std::size_t>(table)].spec; }

  // Writes the initial rows of a table (its initializer, with a shard's origin) into its slots,
  // computed on the device (gpu/kernels/bodies.hpp: init_record), and waits for them.
  Status initialize(int table) {
    const TableSpec& spec = spec_of(table);
    const auto [p, base] = where_[static_cast<std::size_t>(table)];
    dev_.init_records(core_.copy(), core_.pool(p).view, base, spec.rows,
                      gpu::record_init(spec));  // half rows: rounded to nearest
    return dev_.synchronize(core_.copy());
  }

  // Visits rows [row0, row0 + n) of a table through pinned memory, in chunks: with `load` the
  // records come D2H first (else they start zeroed), fn(record, row - row0, record shape) reads
  // or writes each, and with `store` they go back H2D. Synchronous.
  template <class Fn>
  Status bounce(int table, std::int64_t row0, std::int64_t n, bool load, bool store, Fn fn) {
    const auto [p, base] = where_[static_cast<std::size_t>(table)];
    const gpu::SlotPool& pool = core_.pool(p).view;
    const std::int64_t chunk = std::min<std::int64_t>(n, kChunkRows);
    if (chunk == 0) return Status::ok();
    if (bounce_.bytes() < static_cast<std::size_t>(chunk * pool.record_bytes())) {
      STRATA_ASSIGN_OR_RETURN(bounce_, dev_.allocate_pinned(static_cast<std::size_t>(chunk * pool.record_bytes())));
    }
    float* host = bounce_.as<float>();
    const gpu::StreamView s = core_.copy();
    for (std::int64_t r0 = 0; r0 < n; r0 += chunk) {
      const std::int64_t m = std::min(chunk, n - r0);
      float* dev = pool.base + (base + row0 + r0) * pool.stride;
      const std::size_t bytes = static_cast<std::size_t>(m * pool.record_bytes());
      if (load) {
        dev_.copy_d2h(s, host, dev, bytes);
        STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
      } else {
        std::memset(host, 0, bytes);
      }
      for (std::int64_t r = 0; r < m; ++r) fn(host + r * pool.stride, r0 + r, pool.shape());
      if (store) {
        dev_.copy_h2d(s, dev, host, bytes);
        STRATA_RETURN_IF_ERROR(dev_.synchronize(s));
      }
    }
    return Status::ok();
  }

  // The features of a batch by pool, pools ascending.
  void group_by_pool(const EngineFeatures& f, std::vector<PoolWork>& work) const {
    for (int p = 0; p < static_cast<int>(core_.pools().size()); ++p) {
      PoolWork w;
      w.pool = p;
      for (std::size_t i = 0; i < f.feature.size(); ++i)
        if (where_[static_cast<std::size_t>(f.table[i])].first == p) w.feats.push_back(static_cast<int>(i));
      if (!w.feats.empty()) work.push_back(std::move(w));
    }
  }

  const StoreConfig& config_;
  gpu::Device& dev_;
  std::vector<std::pair<int, std::int64_t>> where_;  // global table -> (pool, first slot)
  gpu::PinnedBuffer bounce_;
  DedupScratch scratch_;
  // Last: destroyed first, it waits for its streams before the buffers above go.
  SlotPoolEngine core_;
};

}  // namespace

Result<std::unique_ptr<Engine>> make_gpu_engine(const StoreConfig& config, const std::vector<int>& tables,
                                                gpu::Device& device) {
  auto e = std::make_unique<GpuEngine>(config, device);
  STRATA_RETURN_IF_ERROR(e->init(tables));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace strata::detail
