#include "store/detail/sharded_engine.hpp"

#include <chrono>
#include <cstring>

#include "dispatch/agreement.hpp"
#include "dispatch/exchange.hpp"
#include "host/kernels.hpp"
#include "store/detail/cached_engine.hpp"
#include "store/detail/gpu_engine.hpp"

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
};

class ShardedEngine final : public Engine {
 public:
  ShardedEngine(const StoreConfig& config, gpu::Device& dev, dispatch::Communicator& comm)
      : config_(config), dev_(dev), comm_(comm), me_(comm.rank()) {}

  Status init(const Topology& topo, const std::vector<int>& tables, HostTableOptions options) {
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
      const int which = tc.placement == Placement::kGpu ? kGpuInner : kCachedInner;
      inner_of_.back() = {which, static_cast<int>(inner_config_->tables.size())};
      inner_tables[which].push_back(static_cast<int>(inner_config_->tables.size()));
      inner_config_->tables.push_back(std::move(shard));
    }
    if (!inner_tables[kGpuInner].empty()) {
      STRATA_ASSIGN_OR_RETURN(inner_[kGpuInner], make_gpu_engine(*inner_config_, inner_tables[kGpuInner], dev_));
    }
    if (!inner_tables[kCachedInner].empty()) {
      STRATA_ASSIGN_OR_RETURN(inner_[kCachedInner],
                              make_cached_engine(topo, *inner_config_, inner_tables[kCachedInner], options, dev_));
    }
    return Status::ok();
  }

  bool collective() const noexcept override { return true; }

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
      dedup_keys(k.keys.data(), k.num_keys(), u, scratch_);
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
                 const std::vector<MatrixView>& outputs, const CallOrder&) override {
    auto& b = static_cast<ShardedBatch&>(eb);
    STRATA_RETURN_IF_ERROR(agree("forward", b.id, Status::ok()));
    // This rank's shards look up the keys it serves.
    const std::size_t T = tables_.size();
    std::vector<std::vector<float>> served_rows(T);
    Clock::time_point t0 = Clock::now();
    Status local;
    for (int w = 0; w < kInners && local.is_ok(); ++w) {
      if (!b.inner[w].state) continue;
      std::vector<MatrixView> views(b.inner_batch.features.size());
      for (std::size_t c = 0; c < T; ++c) {
        const int fi = b.inner_feature_of[c];
        if (fi < 0 || inner_of_[c].first != w) continue;
        const std::int64_t n = static_cast<std::int64_t>(b.exchange.served(c).size()), d = layouts_[c].local_dim(me_);
        served_rows[c].resize(static_cast<std::size_t>(n * d));
        views[static_cast<std::size_t>(fi)] = {served_rows[c].data(), n, d};
      }
      local = inner_[w]->forward(*b.inner[w].state, b.inner_batch, b.inner[w].features, views, CallOrder{});
    }
    stats_.lookup_seconds += since(t0);
    STRATA_RETURN_IF_ERROR(agree("forward", b.id, local));
    // Rows back to their sources.
    std::vector<std::vector<float>> unique_rows(T);
    std::vector<const float*> served_ptr(T);
    std::vector<float*> unique_ptr(T);
    for (std::size_t c = 0; c < T; ++c) {
      served_ptr[c] = served_rows[c].data();
      unique_rows[c].resize(static_cast<std::size_t>(b.unique[c].size() * layouts_[c].dim()));
      unique_ptr[c] = unique_rows[c].data();
    }
    t0 = Clock::now();
    Status s = b.exchange.return_rows(comm_, served_ptr, unique_ptr);
    stats_.exchange_seconds += since(t0);
    STRATA_RETURN_IF_ERROR(s);
    // Each source pools its bags from its unique rows, exactly as the other modes pool table rows.
    t0 = Clock::now();
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const TableSpec& spec = config_.tables[static_cast<std::size_t>(tables_[c])].spec;
      float* base = unique_rows[c].data();
      RowRef ref;
      ref.bases = &base;
      ref.stride = spec.dim;
      ref.dim = spec.dim;
      BagsView bags{k.offsets.data(), k.batch_size(), b.inverse[i].data(),
                    k.weights.empty() ? nullptr : k.weights.data()};
      float* out = outputs[static_cast<std::size_t>(f.feature[i])].data;
      if (spec.pooling == Pooling::kNone)
        gather_rows(ref, bags.keys, bags.weights, k.num_keys(), out);
      else
        gather_pool(ref, bags, spec.pooling, out);
    }
    stats_.local_seconds += since(t0);
    return Status::ok();
  }

  Status backward(EngineBatch& eb, const KeyBatch& batch, const EngineFeatures& f,
                  const std::vector<ConstMatrixView>& grads, std::int64_t t, const CallOrder&) override {
    auto& b = static_cast<ShardedBatch&>(eb);
    // Every rank agreed on this backward already (the store, before any engine retires a batch).
    // Each source sums the gradient of each of its unique keys (ascending positions).
    const std::size_t T = tables_.size();
    std::vector<std::vector<float>> sums(T);
    std::vector<const float*> sum_ptr(T);
    Clock::time_point t0 = Clock::now();
    for (std::size_t c = 0; c < T; ++c) {
      sums[c].assign(static_cast<std::size_t>(b.unique[c].size() * layouts_[c].dim()), 0.0f);
      sum_ptr[c] = sums[c].data();
    }
    std::vector<std::int32_t> bag_of;
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t c = static_cast<std::size_t>(b.canon_of[i]);
      const JaggedKeys& k = batch.features[static_cast<std::size_t>(f.feature[i])];
      const TableSpec& spec = config_.tables[static_cast<std::size_t>(tables_[c])].spec;
      if (spec.pooling != Pooling::kNone) bag_of_positions(k.offsets.data(), k.batch_size(), bag_of);
      BagsView bags{k.offsets.data(), k.batch_size(), k.keys.data(), k.weights.empty() ? nullptr : k.weights.data()};
      reduce_unique_grads(bags, spec.pooling, view_of(b.unique[c]), bag_of.data(),
                          grads[static_cast<std::size_t>(f.feature[i])].data, spec.dim, sums[c].data());
    }
    stats_.local_seconds += since(t0);
    // Sums to the holders.
    std::vector<std::vector<float>> served_grads(T);
    std::vector<float*> served_ptr(T);
    for (std::size_t c = 0; c < T; ++c) {
      served_grads[c].resize(b.exchange.served(c).size() * static_cast<std::size_t>(layouts_[c].local_dim(me_)));
      served_ptr[c] = served_grads[c].data();
    }
    t0 = Clock::now();
    Status s = b.exchange.send_grads(comm_, sum_ptr, served_ptr);
    stats_.exchange_seconds += since(t0);
    if (!s.is_ok()) {
      (void)discard_inner(b);
      return s;
    }
    // Holders reduce per row and apply the optimizer.
    t0 = Clock::now();
    Status status;
    for (int w = 0; w < kInners; ++w) {
      if (!b.inner[w].state) continue;
      std::vector<ConstMatrixView> views(b.inner_batch.features.size());
      for (std::size_t c = 0; c < T; ++c) {
        const int fi = b.inner_feature_of[c];
        if (fi < 0 || inner_of_[c].first != w) continue;
        views[static_cast<std::size_t>(fi)] = {
            served_grads[c].data(), static_cast<std::int64_t>(b.exchange.served(c).size()), layouts_[c].local_dim(me_)};
      }
      Status x = inner_[w]->backward(*b.inner[w].state, b.inner_batch, b.inner[w].features, views, t, CallOrder{});
      if (status.is_ok()) status = x;
    }
    stats_.lookup_seconds += since(t0);
    account(b);
    return status;
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
  Status agree(const char* op, std::int64_t id, const Status& local, std::int64_t a2 = 0, std::int64_t a3 = 0) {
    const Clock::time_point t0 = Clock::now();
    Status s = dispatch::agree(comm_, {op, id, a2, a3}, local);
    stats_.exchange_seconds += since(t0);
    return s;
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

Result<std::unique_ptr<Engine>> make_sharded_engine(const Topology& topo, const StoreConfig& config,
                                                    const std::vector<int>& tables, HostTableOptions options,
                                                    gpu::Device& device, dispatch::Communicator& comm) {
  auto e = std::make_unique<ShardedEngine>(config, device, comm);
  STRATA_RETURN_IF_ERROR(e->init(topo, tables, options));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace strata::detail
