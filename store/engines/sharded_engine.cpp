#include "store/engines/sharded_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "dispatch/agreement.hpp"
#include "dispatch/exchange.hpp"
#include "gpu/grow_buffer.hpp"
#include "host/kernels.hpp"
#include "store/engines/cached_engine.hpp"
#include "store/engines/detail/activation_copy.hpp"
#include "store/engines/gpu_engine.hpp"

namespace strata::detail {
namespace {

using Clock = std::chrono::steady_clock;
using dispatch::ShardLayout;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Inner engines by the placement of the tables they hold.
enum Inner { kGpuInner = 0, kCachedInner = 1, kInners = 2 };

// One inner engine's part of a batch.
struct InnerPart {
  EngineFeatures features;  // inner features (index into ShardedBatch::inner_batch) and inner tables
  std::unique_ptr<EngineBatch> state;
};

struct ShardedBatch final : EngineBatch {
  std::int64_t id = 0;
  std::vector<int> canon_of;              // per engine feature: canonical table
  std::vector<UniqueKeys> unique;         // per canonical table (empty when the batch lacks it)
  std::vector<std::vector<Key>> inverse;  // per engine feature: unique index of each key position
  dispatch::KeyExchange exchange;
  KeyBatch inner_batch;               // served keys, one unpooled feature per held table served
  std::vector<int> inner_feature_of;  // per canonical table: feature of inner_batch, or -1
  InnerPart inner[kInners];
  std::vector<std::size_t> served_at, unique_at;  // per table: float offsets into the engine's scratch
};

class ShardedEngine final : public Engine {
 public:
  ShardedEngine(const StoreConfig& config, gpu::Device& dev, dispatch::Communicator& comm)
      : config_(config), dev_(dev), comm_(comm), me_(comm.rank()) {}

  ~ShardedEngine() override {
    if (stream_) (void)dev_.synchronize(stream_.view());
    ws_.reset();
    comm_.forget_device(dev_);  // the communicator's staging of this device's buffers (mpi)
  }

  Status init(const Topology& topo, const std::vector<int>& tables, HostTableOptions options, tbb::task_arena& fills) {
    STRATA_ASSIGN_OR_RETURN(stream_, dev_.create_stream());
    STRATA_ASSIGN_OR_RETURN(done_, dev_.create_event());
    ws_ = std::make_unique<dispatch::ExchangeWorkspace>(dev_, stream_.view());
    tables_ = tables;
    canon_.assign(config_.tables.size(), -1);
    inner_config_ = std::make_unique<StoreConfig>(config_);
    inner_config_->tables.clear();
    std::vector<int> inner_tables[kInners];
    for (std::size_t c = 0; c < tables.size(); ++c) {
      const int t = tables[c];
      const TableConfig& tc = config_.tables[static_cast<std::size_t>(t)];
      canon_[static_cast<std::size_t>(t)] = static_cast<int>(c);
      STRATA_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::make(tc.spec, tc.sharding, comm_.size(), t));
      layouts_.push_back(layout);
      inner_of_.push_back({-1, -1});
      if (!layout.holds(me_)) continue;
      TableConfig shard = tc;
      shard.spec = layout.shard_spec(tc.spec, me_);
      shard.placement = tc.placement == Placement::kGpu ? Placement::kGpu : Placement::kCached;
      // A shard serves its rows to the exchange in fp32 (exactly as stored); the sources pool them
      // and round each pooled sum once into the table's output_dtype.
      shard.spec.output_dtype = DType::kF32;
      const int which = tc.placement == Placement::kGpu ? kGpuInner : kCachedInner;
      inner_of_.back() = {which, static_cast<int>(inner_config_->tables.size())};
      inner_tables[which].push_back(static_cast<int>(inner_config_->tables.size()));
      inner_config_->tables.push_back(std::move(shard));
    }
    if (!inner_tables[kGpuInner].empty()) {
      STRATA_ASSIGN_OR_RETURN(inner_[kGpuInner], make_gpu_engine(*inner_config_, inner_tables[kGpuInner], dev_));
    }
    if (!inner_tables[kCachedInner].empty()) {
      STRATA_ASSIGN_OR_RETURN(inner_[kCachedInner], make_cached_engine(topo, *inner_config_, inner_tables[kCachedInner],
                                                                       options, dev_, fills));
    }
    return Status::ok();
  }

  bool collective() const noexcept override { return true; }
  const char* name() const noexcept override { return "sharded"; }
  // This rank's shards in host memory: the cached inner engine's tables, by their global index.
  void host_tables(std::vector<std::pair<int, const HostTable*>>& out) const override {
    if (!inner_[kCachedInner]) return;
    std::vector<std::pair<int, const HostTable*>> shards;
    inner_[kCachedInner]->host_tables(shards);
    for (const auto& [inner_table, table] : shards)
      for (std::size_t c = 0; c < inner_of_.size(); ++c)
        if (inner_of_[c] == std::pair<int, int>{kCachedInner, inner_table}) out.emplace_back(tables_[c], table);
  }
  // Rows are pooled on this rank's device and gradients summed there: device views are written
  // and read in place; host views cost one D2H of the outputs and one H2D of the gradients.
  bool device_views() const noexcept override { return true; }

  // The inner engines read the shards' specs, copies of the tables' made at init.
  void learning_rate_changed(int table, float learning_rate) override {
    const auto [which, inner_table] = inner_of_[static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)])];
    if (which >= 0)
      inner_config_->tables[static_cast<std::size_t>(inner_table)].spec.optimizer.learning_rate = learning_rate;
  }

  Status refuse(const char* op, std::int64_t id, const Status& why) override { return agree(op, id, why); }

  Result<std::unique_ptr<EngineBatch>> submit(std::int64_t id, const KeyBatch& batch,
                                              const EngineFeatures& f) override {
    STRATA_RETURN_IF_ERROR(agree("submit", id, Status::ok()));
    auto b = std::make_unique<ShardedBatch>();
    b->id = id;
    const std::size_t T = tables_.size();
    b->unique.resize(T);
    b->inverse.resize(f.feature.size());
    Clock::time_point t0 = Clock::now();
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const int c = canon_[static_cast<std::size_t>(f.table[i])];
      b->canon_of.push_back(c);
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      UniqueKeys& u = b->unique[static_cast<std::size_t>(c)];
      dedup_keys(k, u, scratch_);
      std::vector<Key>& inv = b->inverse[i];
      inv.resize(static_cast<std::size_t>(k.num_keys()));
      for (std::int64_t x = 0; x < u.size(); ++x)
        for (std::int64_t p = u.offsets[static_cast<std::size_t>(x)]; p < u.offsets[static_cast<std::size_t>(x) + 1];
             ++p)
          inv[static_cast<std::size_t>(u.positions[static_cast<std::size_t>(p)])] = x;
    }
    std::vector<dispatch::ExchangeInput> in(T);
    for (std::size_t c = 0; c < T; ++c) {
      const UniqueKeys& u = b->unique[c];
      in[c] = {&layouts_[c], u.keys.data(), u.size(), u.size() ? u.offsets.data() : nullptr};
    }
    stats_.local_seconds += since(t0);
    t0 = Clock::now();
    auto ex = dispatch::KeyExchange::run(comm_, in);
    stats_.exchange_seconds += since(t0);
    if (!ex) return ex.status();
    b->exchange = std::move(ex).value();
    // The served keys become one unpooled feature per held table (one bag per key).
    b->inner_feature_of.assign(T, -1);
    for (std::size_t c = 0; c < T; ++c) {
      const std::vector<Key>& served = b->exchange.served(c);
      if (served.empty()) continue;
      const auto [which, inner_table] = inner_of_[c];
      STRATA_CHECK(which >= 0);  // only holders are sent keys
      JaggedKeys jk;
      jk.table = inner_config_->tables[static_cast<std::size_t>(inner_table)].spec.name;
      jk.keys = served;
      jk.offsets.resize(served.size() + 1);
      for (std::size_t x = 0; x <= served.size(); ++x) jk.offsets[x] = static_cast<std::int64_t>(x);
      b->inner_feature_of[c] = static_cast<int>(b->inner_batch.features.size());
      b->inner[which].features.feature.push_back(static_cast<int>(b->inner_batch.features.size()));
      b->inner[which].features.table.push_back(inner_table);
      b->inner_batch.features.push_back(std::move(jk));
    }
    t0 = Clock::now();
    Status local;
    for (int w = 0; w < kInners && local.is_ok(); ++w) {
      if (b->inner[w].features.empty()) continue;
      auto s = inner_[w]->submit(id, b->inner_batch, b->inner[w].features);
      if (s)
        b->inner[w].state = std::move(s).value();
      else
        local = s.status().with_context("rank " + std::to_string(me_));
    }
    stats_.lookup_seconds += since(t0);
    Status all = agree("submit", id, local);
    if (!all.is_ok()) {
      for (int w = 0; w < kInners; ++w)
        if (b->inner[w].state) (void)inner_[w]->discard(*b->inner[w].state, b->inner_batch, b->inner[w].features);
      return all;
    }
    ++stats_.batches;
    return std::unique_ptr<EngineBatch>(std::move(b));
  }

  Status forward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f,
                 const std::vector<MatrixView>& outputs, const CallOrder& order) override {
    auto& b = static_cast<ShardedBatch&>(eb);
    STRATA_RETURN_IF_ERROR(agree("forward", b.id, Status::ok()));
    const std::size_t T = tables_.size();
    Clock::time_point t0 = Clock::now();
    // Every buffer this batch needs, forward and backward, before any collective can fail for
    // memory: the scratch only grows, so what is reserved now is there at backward. First the
    // previous call's work on stream_ (a stream-ordered forward's pooling) must be done with it.
    Status local = dev_.synchronize(stream_.view());
    if (local.is_ok()) local = reserve(b, batch, f, outputs);
    // This rank's shards look up the keys it serves, into device memory.
    for (int w = 0; w < kInners && local.is_ok(); ++w) {
      if (!b.inner[w].state) continue;
      std::vector<MatrixView> views(b.inner_batch.features.size());
      for (std::size_t c = 0; c < T; ++c) {
        const int fi = b.inner_feature_of[c];
        if (fi < 0 || inner_of_[c].first != w) continue;
        const std::int64_t n = static_cast<std::int64_t>(b.exchange.served(c).size()), d = layouts_[c].local_dim(me_);
        views[static_cast<std::size_t>(fi)] = {served_.as<float>() + b.served_at[c], n, d, MemorySpace::kDevice};
      }
      local = inner_[w]->forward(*b.inner[w].state, b.inner_batch, b.inner[w].features, views, CallOrder{});
    }
    stats_.lookup_seconds += since(t0);
    STRATA_RETURN_IF_ERROR(agree("forward", b.id, local));
    // Rows back to their sources, device to device.
    std::vector<const float*> served_ptr(T);
    std::vector<float*> unique_ptr(T);
    for (std::size_t c = 0; c < T; ++c) {
      served_ptr[c] = served_.as<float>() + b.served_at[c];
      unique_ptr[c] = unique_.as<float>() + b.unique_at[c];
    }
    t0 = Clock::now();
    Status s = b.exchange.return_rows(comm_, *ws_, served_ptr, unique_ptr);
    stats_.exchange_seconds += since(t0);
    STRATA_RETURN_IF_ERROR(s);
    // Each source pools its bags from its unique rows on the device (gather_pool over a slot pool
    // of the unique rows: same kernel and order as every other mode), each output of its table's
    // output_dtype (half ones: the fp32 sum rounded to nearest once). `out` counts 32-bit words.
    t0 = Clock::now();
    const gpu::StreamView st = stream_.view();
    std::size_t meta = 0, out = 0;
    auto take = [&](auto* host, std::size_t n) { return stage_meta(meta, host, n); };
    std::vector<gpu::LookupFeature> looks(f.feature.size());
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const TableSpec& spec = config_.tables[static_cast<std::size_t>(tables_[c])].spec;
      gpu::LookupFeature& l = looks[i];
      l.offsets = stage_offsets(meta, k);
      l.batch = k.batch_size();
      l.rows = take(b.inverse[i].data(), b.inverse[i].size());
      l.weights = k.weights.empty() ? nullptr : take(k.weights.data(), k.weights.size());
      l.num_keys = k.num_keys();
      l.pooling = spec.pooling;
      l.out_dtype = spec.output_dtype;
      const MatrixView& o = outputs[static_cast<std::size_t>(f.feature[i])];
      if (o.space == MemorySpace::kDevice) {
        l.out = o.data;
      } else {
        l.out = out_.as<float>() + out;
        out += words(view_bytes(o.rows * o.cols, spec.output_dtype));
      }
    }
    dev_.copy_h2d(st, meta_.data(), meta_host_.data(), meta);
    if (order.after.state()) dev_.wait(st, order.after);  // the caller's outputs are free to write
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
      const std::int32_t dim = layouts_[c].dim();
      dev_.gather_pool(st, gpu::SlotPool{unique_ptr[c], b.unique[c].size(), dim, dim, 0}, {looks[i]});
    }
    if (out) dev_.copy_d2h(st, host_out_.data(), out_.data(), out * sizeof(float));
    if (out || !order.caller.state()) {
      s = dev_.synchronize(st);
      std::size_t at = 0;
      for (std::size_t i = 0; i < f.feature.size() && s.is_ok(); ++i) {
        const MatrixView& o = outputs[static_cast<std::size_t>(f.feature[i])];
        if (o.space == MemorySpace::kDevice) continue;
        const std::size_t n = view_bytes(o.rows * o.cols, out_dtype(b, i));
        if (n) copy_activations(dev_.counters(), o.data, host_out_.as<float>() + at, n);
        at += words(n);
      }
    } else {
      dev_.record(done_.view(), st);
      dev_.wait(order.caller, done_.view());
      s = dev_.status();
    }
    stats_.local_seconds += since(t0);
    return s;
  }

  Status backward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f,
                  const std::vector<ConstMatrixView>& grads, std::int64_t t, const CallOrder& order) override {
    auto& b = static_cast<ShardedBatch&>(eb);
    // Every rank agreed on this backward already (the store, before any engine retires a batch).
    // Each source sums the gradient of each of its unique keys on the device (ascending
    // positions), from fp32 gradients: half ones widened exactly on the host first (a host view's
    // as it is staged; a device view's D2H, a host wait, then H2D with the host views'). Forward
    // reserved every buffer used here.
    const std::size_t T = tables_.size();
    const gpu::StreamView st = stream_.view();
    Clock::time_point t0 = Clock::now();
    Status local = dev_.synchronize(st);  // the pinned metadata of forward was copied
    std::size_t meta = 0, in = 0;
    auto take = [&](auto* host, std::size_t n) { return stage_meta(meta, host, n); };
    std::vector<gpu::UpdateFeature> sums(f.feature.size());
    std::vector<std::int32_t> bag_of;
    std::vector<std::pair<std::size_t, std::size_t>> half_views;  // half device views: (feature, offset in host_out_)
    for (std::size_t i = 0; i < f.feature.size() && local.is_ok(); ++i) {
      const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const TableSpec& spec = config_.tables[static_cast<std::size_t>(tables_[c])].spec;
      const UniqueKeys& u = b.unique[c];
      gpu::UpdateFeature& x = sums[i];
      x.offsets = stage_offsets(meta, k);
      x.batch = k.batch_size();
      x.weights = k.weights.empty() ? nullptr : take(k.weights.data(), k.weights.size());
      x.num_keys = k.num_keys();
      x.pooling = spec.pooling;
      x.unique_slots = take(iota_.data(), static_cast<std::size_t>(u.size()));
      x.unique_offsets = take(u.offsets.data(), u.offsets.size());
      x.positions = take(u.positions.data(), u.positions.size());
      if (spec.pooling != Pooling::kNone) {
        bag_of_positions(k, bag_of);
        x.bag_of = take(bag_of.data(), bag_of.size());
      }
      x.num_unique = u.size();
      const ConstMatrixView& g = grads[static_cast<std::size_t>(f.feature[i])];
      const DType dtype = spec.output_dtype;
      if (g.space == MemorySpace::kDevice && dtype == DType::kF32) {
        x.grads = g.data;
        continue;
      }
      const std::size_t n = static_cast<std::size_t>(g.rows * g.cols);
      if (g.space == MemorySpace::kDevice) {
        if (n) half_views.emplace_back(i, in);  // widened below, once the host has it
      } else if (dtype == DType::kF32) {
        copy_activations(dev_.counters(), host_out_.as<float>() + in, g.data, n * sizeof(float));
      } else {
        widen_activations(dev_.counters(), host_out_.as<float>() + in, g.data, dtype, n);
      }
      x.grads = out_.as<float>() + in;
      in += n;
    }
    if (local.is_ok() && !half_views.empty()) {
      if (order.after.state()) dev_.wait(st, order.after);  // the caller's gradients are written
      std::size_t at = 0;
      for (const auto& view : half_views) {
        const std::size_t i = view.first;
        const ConstMatrixView& g = grads[static_cast<std::size_t>(f.feature[i])];
        const std::size_t bytes = view_bytes(g.rows * g.cols, out_dtype(b, i));
        dev_.copy_d2h(st, half_grads_.as<float>() + at, g.data, bytes);
        at += words(bytes);
      }
      local = dev_.synchronize(st);
      at = 0;
      for (std::size_t w = 0; w < half_views.size() && local.is_ok(); ++w) {
        const auto [i, to] = half_views[w];
        const ConstMatrixView& g = grads[static_cast<std::size_t>(f.feature[i])];
        const std::size_t n = static_cast<std::size_t>(g.rows * g.cols);
        widen_activations(dev_.counters(), host_out_.as<float>() + to, half_grads_.as<float>() + at, out_dtype(b, i),
                          n);
        at += words(view_bytes(g.rows * g.cols, out_dtype(b, i)));
      }
    }
    if (local.is_ok()) {
      dev_.copy_h2d(st, meta_.data(), meta_host_.data(), meta);
      if (in) dev_.copy_h2d(st, out_.data(), host_out_.data(), in * sizeof(float));
      if (order.after.state()) dev_.wait(st, order.after);  // the caller's gradients are written
      for (std::size_t i = 0; i < f.feature.size(); ++i) {
        const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
        const std::int32_t dim = layouts_[c].dim();
        dev_.reduce_grads(st, gpu::SlotPool{sums_.as<float>() + b.unique_at[c], b.unique[c].size(), dim, dim, 0},
                          {sums[i]});
      }
    }
    stats_.local_seconds += since(t0);
    // Sums to the holders, device to device (a local failure above fails every rank there).
    std::vector<const float*> sum_ptr(T);
    std::vector<float*> served_ptr(T);
    for (std::size_t c = 0; c < T; ++c) {
      sum_ptr[c] = sums_.as<float>() + b.unique_at[c];
      served_ptr[c] = served_.as<float>() + b.served_at[c];
    }
    t0 = Clock::now();
    Status s = b.exchange.send_grads(comm_, *ws_, sum_ptr, served_ptr, local);
    stats_.exchange_seconds += since(t0);
    if (!s.is_ok()) {
      (void)discard_inner(b);
      return s;
    }
    dev_.record(done_.view(), st);
    // Holders reduce per row and apply the optimizer, after the gradients landed (done_).
    t0 = Clock::now();
    Status status;
    applied_.clear();
    for (int w = 0; w < kInners; ++w) {
      if (!b.inner[w].state) continue;
      if (!status.is_ok()) {  // the device failed in an inner engine: the others apply nothing
        (void)inner_[w]->discard(*b.inner[w].state, b.inner_batch, b.inner[w].features);
        continue;
      }
      std::vector<ConstMatrixView> views(b.inner_batch.features.size());
      for (std::size_t c = 0; c < T; ++c) {
        const int fi = b.inner_feature_of[c];
        if (fi < 0 || inner_of_[c].first != w) continue;
        views[static_cast<std::size_t>(fi)] = {served_ptr[c], static_cast<std::int64_t>(b.exchange.served(c).size()),
                                               layouts_[c].local_dim(me_), MemorySpace::kDevice};
      }
      status = inner_[w]->backward(*b.inner[w].state, b.inner_batch, b.inner[w].features, views, t,
                                   CallOrder{done_.view(), {}});
      if (status.is_ok()) applied_.push_back(w);
    }
    if (!status.is_ok()) backward_not_applied();
    // The caller's gradients were read before send_grads returned (its all-to-all waited for the
    // stream), so its stream need not wait for anything.
    stats_.lookup_seconds += since(t0);
    account(b);
    return status;
  }

  // The call whose backward this engine applied last was refused (a later engine failed, or an
  // inner one did): its inner engines forget it (the cached shard's count of unflushed calls).
  void backward_not_applied() override {
    for (const int w : applied_) inner_[w]->backward_not_applied();
    applied_.clear();
  }

  Status discard(EngineBatch& eb, const KeyBatch&, const EngineFeatures&) override {
    auto& b = static_cast<ShardedBatch&>(eb);
    Status s = agree("discard", b.id, Status::ok());
    Status d = discard_inner(b);
    return s.is_ok() ? d : s;
  }

  Status flush() override {
    Status status;
    for (auto& e : inner_)
      if (e) {
        Status s = e->flush();
        if (status.is_ok()) status = s;
      }
    return status;
  }

  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override;
  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override;

  // This rank's shard, as dispatch placed it (ShardLayout); its rows are the inner engine's, local and unexchanged.
  void shard_info(int table, ShardInfo& info) const override {
    const ShardLayout& L = layouts_[static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)])];
    info.type = L.type();
    info.world = comm_.size();
    info.rank = me_;
    info.replicas.clear();
    if (!L.holds(me_)) {
      info.local_rows = info.local_dim = 0;
      return;
    }
    info.local_rows = L.local_rows(me_);
    info.local_dim = L.local_dim(me_);
    info.col_offset = L.col_offset(me_);
    if (L.type() == dispatch::ShardingType::kRow) info.row_start = me_, info.row_step = comm_.size();
    for (int r = 0; r < comm_.size(); ++r)
      if (r == me_ || L.type() == dispatch::ShardingType::kReplicated) info.replicas.push_back(r);
  }
  Status read_shard(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    const auto [which, inner_table] = inner_of_[static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)])];
    return which < 0 ? not_held(table) : inner_[which]->read_rows(inner_table, row0, n, weights, state);
  }
  Status write_shard(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    const auto [which, inner_table] = inner_of_[static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)])];
    return which < 0 ? not_held(table) : inner_[which]->write_rows(inner_table, row0, n, weights, state);
  }

  // A dynamic table (store/detail/dynamic_keys.hpp, "A world"): rows of this rank's shard, by their global rows, in
  // its inner engine. Local: no collective (the key exchange before it agreed who holds what).
  Status accepting() override {
    for (const auto& e : inner_)
      if (e) STRATA_RETURN_IF_ERROR(e->accepting());
    return Status::ok();
  }
  Status reset_rows(int table, const std::vector<std::int64_t>& rows, const float* weights,
                    const float* state) override {
    if (rows.empty()) return Status::ok();  // a rank without a shard of a table-wise table has none
    STRATA_ASSIGN_OR_RETURN(const auto held, held_rows(table, rows));
    return inner_[held.first]->reset_rows(held.second, local_, weights, state);
  }
  Status read_rows_at(int table, const TableSpec& /*spec*/, const std::vector<std::int64_t>& rows, float* weights,
                      float* state) override {
    if (rows.empty()) return Status::ok();
    STRATA_ASSIGN_OR_RETURN(const auto held, held_rows(table, rows));
    return inner_[held.first]->read_rows_at(
        held.second, inner_config_->tables[static_cast<std::size_t>(held.second)].spec, local_, weights, state);
  }

  void staging_stats(StagingBytes& batches, StagingBytes& activations) const override {
    for (const auto& e : inner_)
      if (e) e->staging_stats(batches, activations);
  }

  void cache_stats(std::vector<std::pair<int, cache::CacheStats>>& out) const override {
    if (!inner_[kCachedInner]) return;
    std::vector<std::pair<int, cache::CacheStats>> inner;
    inner_[kCachedInner]->cache_stats(inner);
    for (auto& [it, st] : inner)
      for (std::size_t c = 0; c < tables_.size(); ++c)
        if (inner_of_[c].first == kCachedInner && inner_of_[c].second == it) out.push_back({tables_[c], st});
  }

  void dispatch_stats(DispatchStats& out) const override {
    out = stats_;
    out.rank = me_;
    out.world = comm_.size();
  }

 private:
  // The store refuses a table this rank holds none of before it gets here (shard_info says so).
  Status not_held(int table) const {
    return Status::failed_precondition("table '" + config_.tables[static_cast<std::size_t>(table)].spec.name +
                                       "': rank " + std::to_string(me_) + " holds none of it");
  }
  Status agree(const char* op, std::int64_t id, const Status& local, std::int64_t a2 = 0, std::int64_t a3 = 0) {
    const Clock::time_point t0 = Clock::now();
    Status s = dispatch::agree(comm_, {op, id, a2, a3}, local);
    stats_.exchange_seconds += since(t0);
    return s;
  }

  // The inner engine and table of table `table` and, into local_, the local rows of `rows` (global rows this rank
  // holds: a dynamic table's shard's).
  Result<std::pair<int, int>> held_rows(int table, const std::vector<std::int64_t>& rows) {
    const std::size_t c = static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)]);
    if (inner_of_[c].first < 0) return not_held(table);
    local_.resize(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      STRATA_CHECK(layouts_[c].owner_of(rows[i]) == me_);
      local_[i] = layouts_[c].local_row(rows[i]);
    }
    return inner_of_[c];
  }

  std::vector<int> applied_;         // inner engines whose backward applied the last call (backward_not_applied)
  std::vector<std::int64_t> local_;  // held_rows' local rows

  // Host metadata -> the pinned metadata at `at` (8-byte aligned); returns where it will be on the
  // device once meta_host_ is copied into meta_.
  template <class T>
  T* stage_meta(std::size_t& at, const T* host, std::size_t n) {
    T* d = reinterpret_cast<T*>(meta_.as<char>() + at);
    if (n) std::memcpy(meta_host_.as<char>() + at, host, n * sizeof(T));
    at += (n * sizeof(T) + 7) / 8 * 8;
    return d;
  }
  // stage_meta of a feature's offsets (batch + 1) as int64: copied, or widened from int32 as they are written.
  const std::int64_t* stage_offsets(std::size_t& at, const JaggedKeys& k) {
    const auto* d = reinterpret_cast<const std::int64_t*>(meta_.as<char>() + at);
    copy_offsets(k, reinterpret_cast<std::int64_t*>(meta_host_.as<char>() + at));
    at += static_cast<std::size_t>(k.batch_size() + 1) * sizeof(std::int64_t);
    return d;
  }

  // The element type of engine feature i's outputs and gradients: its table's output_dtype.
  DType out_dtype(const ShardedBatch& b, std::size_t i) const {
    return config_.tables[static_cast<std::size_t>(tables_[static_cast<std::size_t>(b.canon_of[i])])].spec.output_dtype;
  }
  // Bytes of `n` elements of `dtype`, and the 32-bit words that hold `bytes` (half ones may end mid-word).
  static std::size_t view_bytes(std::int64_t n, DType dtype) {
    return static_cast<std::size_t>(n) * static_cast<std::size_t>(element_bytes(dtype));
  }
  static std::size_t words(std::size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

  template <class B>
  Status grow(B& buf, std::size_t bytes) {
    return gpu::grow_buffer(buf, bytes, dev_);  // keeps its old capacity when growing fails
  }

  // Lays out this batch in the device scratch (served rows, unique rows and their gradient sums
  // per table; host views' outputs and gradients, and half device views' gradients widened; the
  // metadata) and grows what is too small.
  Status reserve(ShardedBatch& b, const KeyBatch& batch, const EngineFeatures& f,
                 const std::vector<MatrixView>& outputs) {
    const std::size_t T = tables_.size();
    b.served_at.assign(T, 0);
    b.unique_at.assign(T, 0);
    std::size_t served = 0, unique = 0, host = 0, half = 0, meta = 0, most_unique = 0;
    for (std::size_t c = 0; c < T; ++c) {
      b.served_at[c] = served;
      b.unique_at[c] = unique;
      served += b.exchange.served(c).size() * static_cast<std::size_t>(layouts_[c].local_dim(me_));
      unique += static_cast<std::size_t>(b.unique[c].size() * layouts_[c].dim());
      most_unique = std::max(most_unique, static_cast<std::size_t>(b.unique[c].size()));
    }
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const MatrixView& o = outputs[static_cast<std::size_t>(f.feature[i])];
      const DType dtype = out_dtype(b, i);
      // fp32 gradients (words of outputs of dtype fit in them); a half device view's gradient also D2H, half.
      if (o.space != MemorySpace::kDevice || dtype != DType::kF32) host += static_cast<std::size_t>(o.rows * o.cols);
      if (o.space == MemorySpace::kDevice && dtype != DType::kF32) half += words(view_bytes(o.rows * o.cols, dtype));
      meta += sharded_feature_metadata_bytes(k.batch_size(), k.num_keys(), k.weights.size(),
                                             b.unique[static_cast<std::size_t>(b.canon_of[i])].size());
    }
    if (iota_.size() < most_unique) {
      iota_.resize(most_unique);
      for (std::size_t x = 0; x < iota_.size(); ++x) iota_[x] = static_cast<Key>(x);
    }
    STRATA_RETURN_IF_ERROR(grow(served_, served * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(unique_, unique * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(sums_, unique * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(out_, host * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(host_out_, host * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(half_grads_, half * sizeof(float)));
    STRATA_RETURN_IF_ERROR(grow(meta_, meta));
    STRATA_RETURN_IF_ERROR(grow(meta_host_, meta));
    return ws_->reserve(static_cast<std::size_t>(b.exchange.wire_bytes()),
                        static_cast<std::size_t>(b.exchange.index_keys()));
  }

  Status discard_inner(ShardedBatch& b) {
    Status status;
    for (int w = 0; w < kInners; ++w)
      if (b.inner[w].state) {
        Status s = inner_[w]->discard(*b.inner[w].state, b.inner_batch, b.inner[w].features);
        if (status.is_ok()) status = s;
      }
    return status;
  }

  void account(const ShardedBatch& b) {
    const dispatch::ExchangeBytes& x = b.exchange.bytes();
    stats_.key_bytes += x.keys;
    stats_.row_bytes += x.rows;
    stats_.grad_bytes += x.grads;
    stats_.bytes_no_dedup += x.total_no_dedup();
  }

  const StoreConfig& config_;
  gpu::Device& dev_;
  dispatch::Communicator& comm_;
  const int me_;
  std::vector<int> tables_;                    // canonical order: global table indexes
  std::vector<int> canon_;                     // global table -> canonical, or -1
  std::vector<ShardLayout> layouts_;           // per canonical table
  std::vector<std::pair<int, int>> inner_of_;  // per canonical table: (inner engine, inner table) or (-1, -1)
  std::unique_ptr<StoreConfig> inner_config_;  // the shards, as tables of the inner engines
  std::unique_ptr<Engine> inner_[kInners];
  DedupScratch scratch_;
  DispatchStats stats_;
  // Device scratch, grown to twice the largest batch (no allocation in a steady state). Each batch
  // has its layout in it (reserve, at forward); batches share the memory, as no device work of a
  // call outlives the next call (each starts by waiting for stream_).
  gpu::Stream stream_;  // exchange packing, pooling and gradient sums
  gpu::Event done_;     // the end of this engine's work on stream_, for the caller's or inner stream
  std::unique_ptr<dispatch::ExchangeWorkspace> ws_;
  gpu::DeviceBuffer served_;      // served rows, then at backward the served gradients: per table (served, local dim)
  gpu::DeviceBuffer unique_;      // returned rows: per table (unique keys, dim)
  gpu::DeviceBuffer sums_;        // gradient sums: per table (unique keys, dim)
  gpu::DeviceBuffer out_;         // host views' outputs, then their gradients and half device views' widened
  gpu::PinnedBuffer host_out_;    // the same, staged
  gpu::PinnedBuffer half_grads_;  // half device views' gradients, D2H to be widened into host_out_
  gpu::DeviceBuffer meta_;        // lookup or reduction metadata
  gpu::PinnedBuffer meta_host_;   // the same, staged
  std::vector<Key> iota_;         // 0, 1, ...: the sums' slots
};

// State floats of a row are `blocks` runs of `dim` (adagrad 1, adam 2: m then v) or, for rowwise
// adagrad, one float per row that column sharding never splits (validate_plan refuses it).
Status ShardedEngine::read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) {
  const std::size_t c = static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)]);
  STRATA_RETURN_IF_ERROR(agree("read_rows", table * 2 + (state != nullptr), Status::ok(), row0, n));
  const ShardLayout& L = layouts_[c];
  const auto [which, inner_table] = inner_of_[c];
  if (L.type() == dispatch::ShardingType::kReplicated)  // every rank holds every row
    return inner_[which]->read_rows(inner_table, row0, n, weights, state);
  const OptimizerKind kind = config_.tables[static_cast<std::size_t>(table)].spec.optimizer.kind;
  const int N = comm_.size();
  const std::int64_t dim = L.dim(), sd = optimizer_state_dim(kind, L.dim());
  // What each rank holds of the range: local rows [first, first + count), as [weights | state].
  std::vector<std::int64_t> first(static_cast<std::size_t>(N)), count(static_cast<std::size_t>(N)),
      width(static_cast<std::size_t>(N)), swidth(static_cast<std::size_t>(N)), rbytes(static_cast<std::size_t>(N)),
      rdispl(static_cast<std::size_t>(N), 0);
  for (int r = 0; r < N; ++r) {
    const auto [f0, k] = L.local_range(r, row0, n);
    const std::size_t ur = static_cast<std::size_t>(r);
    first[ur] = f0;
    count[ur] = L.holds(r) ? k : 0;
    width[ur] = L.local_dim(r);
    swidth[ur] = state ? optimizer_state_dim(kind, L.local_dim(r)) : 0;
    rbytes[ur] = count[ur] * (width[ur] + swidth[ur]) * static_cast<std::int64_t>(sizeof(float));
    if (r > 0) rdispl[ur] = rdispl[ur - 1] + rbytes[ur - 1];
  }
  const std::size_t me = static_cast<std::size_t>(me_);
  std::vector<float> mine(static_cast<std::size_t>(count[me] * (width[me] + swidth[me])));
  if (count[me] > 0)
    STRATA_RETURN_IF_ERROR(inner_[which]->read_rows(inner_table, first[me], count[me], mine.data(),
                                                    state ? mine.data() + count[me] * width[me] : nullptr));
  std::vector<float> all(
      static_cast<std::size_t>((rdispl.back() + rbytes.back()) / static_cast<std::int64_t>(sizeof(float))));
  const std::vector<std::int64_t> sbytes(static_cast<std::size_t>(N), rbytes[me]),
      sdispl(static_cast<std::size_t>(N), 0);
  const Clock::time_point t0 = Clock::now();
  Status s = comm_.all_to_all_v(mine.data(), sbytes.data(), sdispl.data(), all.data(), rbytes.data(), rdispl.data());
  stats_.exchange_seconds += since(t0);
  STRATA_RETURN_IF_ERROR(s);
  for (int r = 0; r < N; ++r) {
    const std::size_t ur = static_cast<std::size_t>(r);
    const float* w = all.data() + rdispl[ur] / static_cast<std::int64_t>(sizeof(float));
    const float* st = w + count[ur] * width[ur];
    const std::int64_t c0 = L.col_offset(r), wd = width[ur], swd = swidth[ur];
    for (std::int64_t i = 0; i < count[ur]; ++i) {
      // Row of the whole table, relative to row0.
      const std::int64_t g =
          (L.type() == dispatch::ShardingType::kRow ? (first[ur] + i) * N + r : first[ur] + i) - row0;
      std::memcpy(weights + g * dim + c0, w + i * wd, static_cast<std::size_t>(wd) * sizeof(float));
      if (!state || swd == 0) continue;
      if (wd == dim) {
        std::memcpy(state + g * sd, st + i * swd, static_cast<std::size_t>(swd) * sizeof(float));
      } else {
        for (std::int64_t blk = 0; blk < sd / dim; ++blk)
          std::memcpy(state + g * sd + blk * dim + c0, st + i * swd + blk * wd,
                      static_cast<std::size_t>(wd) * sizeof(float));
      }
    }
  }
  return Status::ok();
}

Status ShardedEngine::write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights,
                                 const float* state) {
  const std::size_t c = static_cast<std::size_t>(canon_[static_cast<std::size_t>(table)]);
  const ShardLayout& L = layouts_[c];
  const auto [which, inner_table] = inner_of_[c];
  if (which < 0) return Status::ok();  // this rank holds nothing of the table
  const auto [first, count] = L.local_range(me_, row0, n);
  if (count == 0) return Status::ok();
  const OptimizerKind kind = config_.tables[static_cast<std::size_t>(table)].spec.optimizer.kind;
  const std::int64_t dim = L.dim(), sd = optimizer_state_dim(kind, L.dim()), wd = L.local_dim(me_);
  const std::int64_t swd = optimizer_state_dim(kind, L.local_dim(me_)), c0 = L.col_offset(me_);
  std::vector<float> w(static_cast<std::size_t>(count * wd)), st(state ? static_cast<std::size_t>(count * swd) : 0);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t g =
        (L.type() == dispatch::ShardingType::kRow ? (first + i) * comm_.size() + me_ : first + i) - row0;
    std::memcpy(w.data() + i * wd, weights + g * dim + c0, static_cast<std::size_t>(wd) * sizeof(float));
    if (!state || swd == 0) continue;
    if (wd == dim) {
      std::memcpy(st.data() + i * swd, state + g * sd, static_cast<std::size_t>(swd) * sizeof(float));
    } else {
      for (std::int64_t blk = 0; blk < sd / dim; ++blk)
        std::memcpy(st.data() + i * swd + blk * wd, state + g * sd + blk * dim + c0,
                    static_cast<std::size_t>(wd) * sizeof(float));
    }
  }
  return inner_[which]->write_rows(inner_table, first, count, w.data(), state ? st.data() : nullptr);
}

}  // namespace

std::size_t sharded_feature_metadata_bytes(std::int64_t bags, std::int64_t keys, std::size_t weights,
                                           std::int64_t unique) {
  const auto words = [](std::size_t bytes) { return (bytes + 7) / 8 * 8; };
  const std::size_t B = static_cast<std::size_t>(bags), K = static_cast<std::size_t>(keys),
                    U = static_cast<std::size_t>(unique);
  return words(8 * (B + 1)) + words(8 * K) + words(4 * weights) + words(8 * U) + words(8 * (U + 1)) + words(4 * K) +
         words(4 * K);
}

Result<std::unique_ptr<Engine>> make_sharded_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device, dispatch::Communicator& comm,
                                                    tbb::task_arena& fills) {
  auto e = std::make_unique<ShardedEngine>(config, device, comm);
  STRATA_RETURN_IF_ERROR(e->init(topo, tables, options, fills));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace strata::detail
