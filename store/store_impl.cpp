// The production Store: validates, tracks batches in flight, and fans out to one Engine per
// placement mode in use (each serving all the tables of that mode), inside a oneTBB arena of
// `threads` workers. Offload and cached tables share one device.

#include <tbb/task_arena.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dispatch/agreement.hpp"
#include "gpu/device.hpp"
#include "host/fp_env.hpp"
#include "host/host_table.hpp"
#include "host/page_nodes.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/detail/config_agreement.hpp"
#include "store/detail/dynamic_keys.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/detail/features.hpp"
#include "store/detail/numa_home.hpp"
#include "store/detail/open_device.hpp"
#include "store/engines/cached_engine.hpp"
#include "store/engines/cpu_engine.hpp"
#include "store/engines/finite_check.hpp"
#include "store/engines/gpu_engine.hpp"
#include "store/engines/host_bounce.hpp"
#include "store/engines/offload_engine.hpp"
#include "store/engines/sharded_engine.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

class StoreImpl final : public Store, public detail::DynamicAccess {
 public:
  StoreImpl(StoreConfig config, Topology topo, std::shared_ptr<dispatch::Communicator> comm)
      : Store(std::move(config)),
        topo_(std::move(topo)),
        comm_(std::move(comm)),
        index_(detail::make_table_index(config_)),
        features_(config_),
        dynamic_(config_, comm_.get()) {}

  ~StoreImpl() override {
    // A store whose open failed before it had engines has nothing to write back (and arena_ may not
    // be initialized: executing in it would initialize a fresh one).
    if (engines_.empty()) return;
    // Nothing written is lost on close: cached rows go back to the host tables. (Errors cannot be
    // reported from a destructor; a failing device already reported them to the calls that failed.)
    // Sorted: with sharded tables discard is collective, and every rank must go in the same order.
    std::vector<std::int64_t> ids;
    for (const auto& b : batches_) ids.push_back(b.first);
    std::sort(ids.begin(), ids.end());
    for (std::int64_t id : ids) (void)discard(id);
    (void)flush();
  }

  Status init() {
    if (config_.numa == NumaPolicy::kBind && config_.numa_node >= topo_.num_nodes())
      return Status::invalid_argument("numa_node " + std::to_string(config_.numa_node) + " out of range [0, " +
                                      std::to_string(topo_.num_nodes()) + ")");
    // Engine groups, in the order engines are asked to accept a batch: those that can refuse one
    // (caches) first, so a refusal needs no rollback of collective work. Engines whose backward
    // runs on the device come before those that update host memory on the CPU, so that a device
    // that fails during a backward fails it before any host table changed (see backward()).
    enum Group { kSharded, kCachedG, kGpuG, kOffloadG, kCpuG, kGroups };
    std::vector<int> group[kGroups];
    for (std::size_t t = 0; t < config_.tables.size(); ++t) {
      const int ti = static_cast<int>(t);
      switch (config_.tables[t].placement) {
        case Placement::kCpu:
          group[kCpuG].push_back(ti);
          break;
        case Placement::kOffload:
          group[kOffloadG].push_back(ti);
          break;
        case Placement::kCached:
          group[kCachedG].push_back(ti);
          break;
        // Without a world, a `gpu` table is a whole table in this device's HBM and a `hybrid` one
        // is a world of one: its shard is the table, cached in this device's HBM.
        case Placement::kGpu:
          group[comm_ ? kSharded : kGpuG].push_back(ti);
          break;
        case Placement::kHybrid:
          group[comm_ ? kSharded : kCachedG].push_back(ti);
          break;
      }
    }
    engine_of_.assign(config_.tables.size(), -1);
    // On the calling thread (device ordinal "current" is this thread's current device).
    if (group[kSharded].size() + group[kCachedG].size() + group[kOffloadG].size() + group[kGpuG].size() > 0) {
      auto dev = detail::open_device(config_.device, comm_.get(), config_.threads, topo_.num_nodes());
      if (!dev) return dev.status();
      device_ = std::move(dev).value();
    }
    const detail::NumaHome home = detail::resolve_numa_home(config_, topo_, device_ != nullptr,
                                                            device_ ? device_->info().pci_bus_id : std::string(),
                                                            [this] { return detail::NumaAbilities::of(topo_); });
    const HostTableOptions& ho = home.host;
    numa_ = home.placement;
    if (device_) {
      // Before anything allocates staging: its pinned memory on the host tier's node.
      detail::place_pinned(*device_, topo_, numa_);
      bounce_ = std::make_unique<detail::HostBounce>(*device_);
      finite_ = std::make_unique<detail::FiniteCheck>(*device_);
    }
    {
      // Every call runs its work in arena_ (its threads on the host tier's node when numa_ says one),
      // and the arena runs it (also on the calling thread, which gets its own environment back on
      // return) with the FP environment it was initialized under: the default one, whatever the
      // caller set (host/fp_env.hpp). fill_arena_, alike, runs the cache's host tasks.
      DefaultFpEnv fp;
      tbb::task_arena::constraints where(tbb::task_arena::automatic,
                                         config_.threads > 0 ? config_.threads : tbb::task_arena::automatic);
      if (numa_.thread_node >= 0) where.numa_id = numa_.thread_node;
      STRATA_CHECK(!arena_.is_active());
      arena_.initialize(where);
      fill_arena_.initialize(where);
    }
    Status status;
    // The tables as the engines serve them (features.hpp: a table of several features unpooled). Engines keep a
    // reference to it: learning_rate_changed keeps its rates.
    const StoreConfig& served = features_.trivial() ? config_ : features_.engines();
    arena_.execute([&] {
      for (int g = 0; g < kGroups; ++g) {
        if (group[g].empty()) continue;
        Result<std::unique_ptr<detail::Engine>> e = Status::internal("unreachable");
        switch (g) {
          case kSharded:
            e = detail::make_sharded_engine(topo_, served, group[g], ho, *device_, *comm_, fill_arena_);
            break;
          case kCachedG:
            e = detail::make_cached_engine(topo_, served, group[g], ho, *device_, fill_arena_);
            break;
          case kOffloadG:
            e = detail::make_offload_engine(topo_, served, group[g], ho, *device_);
            break;
          case kCpuG:
            e = detail::make_cpu_engine(topo_, served, group[g], ho);
            break;
          case kGpuG:
            e = detail::make_gpu_engine(served, group[g], *device_);
            break;
        }
        if (!e) {
          status = e.status();
          return;
        }
        for (int t : group[g]) engine_of_[static_cast<std::size_t>(t)] = static_cast<int>(engines_.size());
        if (e.value()->collective()) collective_ = e.value().get();
        engines_.push_back(std::move(e).value());
      }
    });
    return status;
  }

  Status submit(std::int64_t id, KeyBatch batch) override {
    if (batches_.count(id)) return refuse("submit", id, detail::duplicate_batch(id));
    auto checked = detail::check_batch(id, batch, checked_config(), checked_index());
    if (!checked) return refuse("submit", id, checked.status());
    std::vector<int> tables = std::move(checked).value();
    Entry e;
    e.batch = std::move(batch);
    e.tables = std::move(tables);
    e.front = !features_.trivial();
    if (e.front) e.served = features_.merge(e.batch, e.tables);
    e.parts = parts_of(e.served_tables());
    // Dynamic tables' keys get their rows before any engine sees them (a device placement plans and copies rows at
    // submit). What an engine refuses whatever the keys, it refuses first, so that such a refusal changes no index.
    if (dynamic_.any()) {
      for (std::size_t k = 0; k < engines_.size(); ++k) {
        if (e.parts[k].features.empty() && engines_[k].get() != collective_) continue;
        if (Status ready = engines_[k]->accepting(); !ready.is_ok())
          return refuse("submit", id, ready.with_context("batch " + std::to_string(id)));
      }
      auto admitted = arena_.execute([&] {
        return dynamic_.admit(e.served, e.batch.train, id,
                              [&](int t, const std::vector<std::int64_t>& rows, const float* w, const float* st) {
                                return engine(t).reset_rows(t, rows, w, st);
                              });
      });
      // Admission agreed its outcome already (in a world: its collectives did), so no refuse() here.
      if (!admitted) return admitted.status().with_context("batch " + std::to_string(id));
      e.admitted = std::move(admitted).value();
    }
    // The Entry moves into the map only after every engine accepted. Engines may keep pointers to
    // the elements of its batches' features (those buffers survive the move), never to a KeyBatch itself.
    // An engine refusing a batch whose keys were admitted (a device without room for its staging) leaves the admission
    // in place (dynamic_keys.hpp); the batch's pins are released.
    const KeyBatch& served = e.served_batch();
    Status status;
    arena_.execute([&] {
      for (std::size_t k = 0; k < engines_.size() && status.is_ok(); ++k) {
        auto& p = e.parts[k];
        if (p.features.empty() && engines_[k].get() != collective_) continue;
        auto b = engines_[k]->submit(id, served, p.features);
        if (!b) {
          status = b.status();
          discard_parts(e, served, k);
          return;
        }
        p.state = std::move(b).value();
      }
    });
    if (!status.is_ok()) {
      if (dynamic_.any()) dynamic_.release(e.served, e.admitted);
      return status;
    }
    batches_.emplace(id, std::move(e));
    if (previews_.submitted(id)) {
      arena_.execute([&] {
        for (auto& engine : engines_) engine->previews_done(id);
      });
    }
    return Status::ok();
  }

  Status preview(std::int64_t id, const KeyBatch& batch) override {
    STRATA_ASSIGN_OR_RETURN(std::vector<int> tables, detail::check_preview(id, batch, checked_config(), checked_index(),
                                                                           previews_, batches_.count(id) > 0));
    detail::TableBatch merged;
    if (!features_.trivial()) merged = features_.merge(batch, tables);
    const KeyBatch& served = features_.trivial() ? batch : merged.batch;
    std::vector<Part> parts = parts_of(features_.trivial() ? tables : merged.tables);
    // A dynamic table's keys are no row ids until submit gives them rows: no engine previews them.
    for (Part& p : parts) {
      detail::EngineFeatures kept;
      for (std::size_t i = 0; i < p.features.table.size(); ++i) {
        if (dynamic_.dynamic(p.features.table[i])) continue;
        kept.feature.push_back(p.features.feature[i]);
        kept.table.push_back(p.features.table[i]);
      }
      p.features = std::move(kept);
    }
    arena_.execute([&] {
      for (std::size_t k = 0; k < engines_.size(); ++k)
        if (!parts[k].features.empty()) engines_[k]->preview(id, served, parts[k].features);
    });
    previews_.add(id);
    return Status::ok();
  }

  void drop_previews() override {
    previews_.clear();
    arena_.execute([&] {
      for (auto& engine : engines_) engine->drop_previews();
    });
  }

  std::int64_t previewed() const noexcept override { return previews_.size(); }

  Status forward(std::int64_t id, const std::vector<MatrixView>& outputs) override {
    return forward_on(id, outputs, gpu::StreamView(), false);
  }
  Status forward(std::int64_t id, const std::vector<MatrixView>& outputs, gpu::StreamView stream) override {
    return forward_on(id, outputs, stream, true);
  }
  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads) override {
    return backward_on(id, grads, gpu::StreamView(), false);
  }
  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads, gpu::StreamView stream) override {
    return backward_on(id, grads, stream, true);
  }
  gpu::Device* device() noexcept override { return device_.get(); }

  Status forward_on(std::int64_t id, const std::vector<MatrixView>& outputs, gpu::StreamView stream, bool ordered) {
    auto found = detail::find_batch(batches_, id, checked_config(), outputs, "output", false, device_.get());
    if (found && ordered) found = refusal_or(detail::check_stream("forward", id, device_.get(), stream), found);
    if (!found) return refuse("forward", id, found.status());
    Entry& e = *found.value();
    // Views of engines that take host views only, and those of features pooled here, go through
    // pinned host memory (host_bounce.hpp).
    const std::vector<bool> bounce = bounced(e, outputs);
    const bool any_bounce = std::find(bounce.begin(), bounce.end(), true) != bounce.end();
    Result<detail::CallOrder> order = order_after(stream);
    Result<std::vector<MatrixView>> host = outputs;
    if (order && any_bounce) host = bounce_->host_outputs(outputs, bounce);
    if (!order || !host) return refuse("forward", id, order ? host.status() : order.status());
    // The engines' views: the trainer's, or the unpooled rows of a table of several features.
    std::vector<MatrixView> native = outputs, adapted = host.value();
    if (!features_.trivial()) {
      native = served_views(e, outputs, e.rows);
      adapted = served_views(e, host.value(), e.rows);
    }
    Status status;
    arena_.execute([&] {
      for (std::size_t k = 0; k < engines_.size() && status.is_ok(); ++k) {
        if (!e.parts[k].state) continue;
        const bool own = engines_[k]->device_views();
        status = engines_[k]->forward(*e.parts[k].state, e.served_batch(), e.parts[k].features, own ? native : adapted,
                                      own ? order.value() : detail::CallOrder{});
      }
      if (status.is_ok() && dynamic_.any()) dynamic_.fill_missing(e.served, e.admitted, row_pointers<float*>(e.rows));
      if (status.is_ok() && e.front)
        detail::pool_features(features_, e.batch, e.tables, e.served, row_pointers<const float*>(e.rows), host.value());
    });
    // Backward spreads the gradients into the same buffers (every element written), which go back to rows_pool_ when
    // the batch retires: a step allocates and page-faults none.
    if (status.is_ok() && any_bounce) status = bounce_->copy_outputs(outputs, host.value(), bounce, order.value());
    if (!status.is_ok()) return status;
    e.forwarded = true;
    e.spaces.clear();
    for (const MatrixView& v : outputs) e.spaces.push_back(v.space);
    return status;
  }

  Status backward_on(std::int64_t id, const std::vector<ConstMatrixView>& grads, gpu::StreamView stream, bool ordered) {
    // In the arena: the gradients' finiteness check reads them on the store's threads.
    auto found = arena_.execute(
        [&] { return detail::find_batch(batches_, id, checked_config(), grads, "gradient", true, device_.get()); });
    if (found && ordered) found = refusal_or(detail::check_stream("backward", id, device_.get(), stream), found);
    if (found && !found.value()->batch.train) found = detail::evaluation_backward(id);
    if (found && step_ >= kMaxStep)
      found = Status::out_of_range("batch " + std::to_string(id) + ": backward at step " + std::to_string(step_) +
                                   ", the largest step count (expected a store below it: set_step a smaller one)");
    if (!found) return refuse("backward", id, found.status());
    Entry& e = *found.value();
    // A failed device applies nothing, not even to the tables in host memory: the batch stays in
    // flight (discard retires it) and the step does not advance.
    if (device_) {
      Status dev = device_->status();
      if (!dev.is_ok()) return refuse("backward", id, dev.with_context("batch " + std::to_string(id) + ": backward"));
    }
    Result<detail::CallOrder> order = order_after(stream);
    if (!order) return refuse("backward", id, order.status());
    // Device gradients: counted on the device, and the host waits for the count (see store.hpp).
    if (finite_) {
      Status finite = arena_.execute(
          [&] { return finite_->check(id, e.batch, e.tables, checked_config(), grads, order.value().after); });
      if (!finite.is_ok()) return refuse("backward", id, finite);
    }
    const std::vector<bool> bounce = bounced(e, grads);
    Result<std::vector<ConstMatrixView>> host = grads;
    if (std::find(bounce.begin(), bounce.end(), true) != bounce.end())
      host = bounce_->host_gradients(grads, bounce, order.value());
    if (!host) return refuse("backward", id, host.status());
    // The engines' gradients: the trainer's, or a table of several features' spread onto its keys.
    std::vector<ConstMatrixView> native = grads, adapted = host.value();
    if (!features_.trivial()) {
      native = served_views(e, grads, e.rows);
      adapted = served_views(e, host.value(), e.rows);
      arena_.execute([&] {
        detail::spread_gradients(features_, e.batch, e.tables, e.served, host.value(), row_pointers<float*>(e.rows));
        if (dynamic_.any()) dynamic_.drop_missing(e.served, e.admitted, row_pointers<float*>(e.rows));
      });
    }
    const KeyBatch& served = e.served_batch();
    // What can fail without changing a table runs for every engine before any engine applies:
    // an engine that updates on the CPU copies its device gradients to the host here, so a device
    // that fails on that copy refuses the call before a device engine (first below) updated.
    Status prepared;
    arena_.execute([&] {
      for (std::size_t k = 0; k < engines_.size() && prepared.is_ok(); ++k) {
        if (!e.parts[k].state) continue;
        const bool own = engines_[k]->device_views();
        prepared = engines_[k]->prepare_backward(*e.parts[k].state, served, e.parts[k].features, own ? native : adapted,
                                                 own ? order.value() : detail::CallOrder{});
      }
    });
    if (!prepared.is_ok())
      return refuse("backward", id, prepared.with_context("batch " + std::to_string(id) + ": backward"));
    // Every rank must agree before any engine retires its part: a rank that refused (bad
    // gradients, a failed device) keeps the batch in flight, and so must the others.
    if (collective_) STRATA_RETURN_IF_ERROR(refuse("backward", id, Status::ok()));
    const std::int64_t t = step_ + 1;
    Status status;
    arena_.execute([&] {
      // Device engines go first (init's group order): when one fails (the device failed during
      // this call), the host engines after it retire the batch without applying its gradients.
      std::vector<std::size_t> applied;  // engines whose backward returned ok
      for (std::size_t k = 0; k < engines_.size(); ++k) {
        if (!e.parts[k].state) continue;
        if (status.is_ok()) {
          const bool own = engines_[k]->device_views();
          status = engines_[k]->backward(*e.parts[k].state, served, e.parts[k].features, own ? native : adapted, t,
                                         own ? order.value() : detail::CallOrder{});
          if (status.is_ok()) applied.push_back(k);
        } else {
          (void)engines_[k]->discard(*e.parts[k].state, served, e.parts[k].features);
        }
      }
      // A later engine failed (the device failed during the call): the call is refused, so what
      // the engines before it applied on the device is not part of the store's state.
      if (!status.is_ok())
        for (const std::size_t k : applied) engines_[k]->backward_not_applied();
    });
    retire(e);
    batches_.erase(id);
    if (!status.is_ok()) return status;
    step_ = t;
    if (config_.cache.flush_every > 0 && step_ % config_.cache.flush_every == 0)
      STRATA_RETURN_IF_ERROR(flush().with_context(
          "batch " + std::to_string(id) + " was applied, then the periodic flush (cache.flush_every) after step " +
          std::to_string(step_)));
    return status;
  }

  Status discard(std::int64_t id) override {
    auto it = batches_.find(id);
    if (it == batches_.end()) return refuse("discard", id, detail::unknown_batch(id));
    Entry& e = it->second;
    Status status;
    arena_.execute([&] {
      for (std::size_t k = 0; k < engines_.size(); ++k) {
        if (!e.parts[k].state) continue;
        Status s = engines_[k]->discard(*e.parts[k].state, e.served_batch(), e.parts[k].features);
        if (status.is_ok()) status = s;
      }
    });
    retire(e);
    batches_.erase(it);
    return status;
  }

  Status flush() override {
    Status status;
    arena_.execute([&] {
      for (auto& engine : engines_) {
        Status s = engine->flush();
        if (status.is_ok()) status = s;
      }
    });
    return status;
  }

  StoreStats stats() const override {
    StoreStats s;
    std::vector<std::pair<int, cache::CacheStats>> per;
    for (const auto& e : engines_) e->cache_stats(per);
    for (const auto& [t, st] : per) s.cache.push_back({config_.tables[static_cast<std::size_t>(t)].spec.name, st});
    for (const auto& e : engines_) e->staging_stats(s.staging, s.activation_staging);
    if (device_) {
      s.device = device_->info().backend == gpu::Backend::kCuda ? "cuda " + device_->info().name : "emu";
      s.links = device_->counters().snapshot();
      s.device_peak_bytes = device_->peak_bytes();
      s.device_resources = device_->resource_counts();
    }
    if (collective_) collective_->dispatch_stats(s.dispatch);
    s.dispatch.admission_bytes = dynamic_.admission_bytes();
    dynamic_.stats(s.dynamic);
    s.numa = detail::with_pinned(numa_, device_.get());
    numa_stats(s);
    return s;
  }

  // StoreStats::numa_engines and numa_tables: each engine's placement, and each table of host rows
  // with a sample of its pages asked of the kernel (a few dozen pages a table: cheap).
  void numa_stats(StoreStats& s) const {
    std::vector<std::pair<int, const HostTable*>> held;
    std::vector<const char*> engine_of(config_.tables.size(), "");
    for (const auto& e : engines_) {
      const std::size_t before = held.size();
      e->host_tables(held);
      s.numa_engines.emplace_back(e->name(), detail::engine_placement(s.numa, held.size() > before, e->uses_device()));
      for (std::size_t i = before; i < held.size(); ++i) engine_of[static_cast<std::size_t>(held[i].first)] = e->name();
    }
    std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [t, table] : held) {
      const TableConfig& tc = config_.tables[static_cast<std::size_t>(t)];
      TableNuma n;
      n.table = tc.spec.name;
      n.placement = to_string(tc.placement);
      n.engine = engine_of[static_cast<std::size_t>(t)];
      n.memory_node = s.numa.memory_node;
      n.thread_node = s.numa.thread_node;
      n.pages = sample_page_nodes(table->memory());
      s.numa_tables.push_back(std::move(n));
    }
  }

  std::int64_t in_flight() const noexcept override { return static_cast<std::int64_t>(batches_.size()); }

  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    Status range = detail::check_row_range(table, row0, n, config_);
    if (range.is_ok()) range = detail::dense_only("read_rows", table, config_);
    if (range.is_ok()) range = check_weights("read_rows", table, n, weights);
    if (!range.is_ok())
      return table >= 0 && static_cast<std::size_t>(table) < config_.tables.size() && &engine(table) == collective_
                 ? refuse("read_rows", table * 2 + (state != nullptr), range)
                 : range;
    Status status;
    arena_.execute([&] { status = engine(table).read_rows(table, row0, n, weights, state); });
    return status;
  }

  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    if (!batches_.empty()) return detail::busy("write_rows", in_flight());
    STRATA_RETURN_IF_ERROR(detail::check_row_range(table, row0, n, config_));
    STRATA_RETURN_IF_ERROR(detail::dense_only("write_rows", table, config_));
    STRATA_RETURN_IF_ERROR(check_weights("write_rows", table, n, weights));
    const TableSpec& spec = config_.tables[static_cast<std::size_t>(table)].spec;
    STRATA_RETURN_IF_ERROR(detail::check_holdable("write_rows", spec, row0, n, spec.dim, weights,
                                                  optimizer_state_dim(spec.optimizer.kind, spec.dim), state));
    Status status;
    arena_.execute([&] { status = engine(table).write_rows(table, row0, n, weights, state); });
    return status;
  }

  Result<std::vector<Key>> keys_held(int table) const override {
    STRATA_ASSIGN_OR_RETURN(const KeyIndex* index, dynamic_index("keys_held", table));
    std::vector<Key> keys;
    for (const KeyIndex::Entry& x : index->entries()) keys.push_back(x.key);
    std::sort(keys.begin(), keys.end());
    return keys;
  }
  Status read_keys(int table, const std::vector<Key>& keys, float* weights, float* state) override {
    STRATA_ASSIGN_OR_RETURN(const KeyIndex* index, dynamic_index("read_keys", table));
    const auto n = static_cast<std::int64_t>(keys.size());
    STRATA_RETURN_IF_ERROR(check_weights("read_keys", table, n, weights));
    std::vector<std::int64_t> rows(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      rows[i] = index->row_of(keys[i]);
      if (rows[i] == KeyIndex::kNone)
        return detail::key_without_row(config_.tables[static_cast<std::size_t>(table)].spec, keys[i], i,
                                       dynamic_.owner(table, keys[i]), rank());
    }
    dynamic_.engine_rows(table, rows);
    const TableSpec& spec = config_.tables[static_cast<std::size_t>(table)].spec;
    return on_engine(table, [&](detail::Engine& e) { return e.read_rows_at(table, spec, rows, weights, state); });
  }

  Result<ShardInfo> shard_info(int table) const override {
    STRATA_ASSIGN_OR_RETURN(ShardInfo si, Store::shard_info(table));
    engine(table).shard_info(table, si);
    return si;
  }

 protected:
  void learning_rate_changed(int table, float learning_rate) override {
    features_.set_learning_rate(table, learning_rate);
    engine(table).learning_rate_changed(table, learning_rate);
  }
  dispatch::Communicator* world() noexcept override { return comm_.get(); }
  int rank() const noexcept { return comm_ ? comm_->rank() : 0; }
  Status read_own_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    STRATA_RETURN_IF_ERROR(detail::dense_only("read_shard", table, config_));
    Status status;
    arena_.execute([&] { status = engine(table).read_shard(table, row0, n, weights, state); });
    return status;
  }
  Status write_own_rows(int table, std::int64_t row0, std::int64_t n, const float* weights,
                        const float* state) override {
    STRATA_RETURN_IF_ERROR(detail::dense_only("write_shard", table, config_));
    Status status;
    arena_.execute([&] { status = engine(table).write_shard(table, row0, n, weights, state); });
    return status;
  }
  Status read_dynamic(int table, detail::DynamicState& out) override {
    STRATA_ASSIGN_OR_RETURN(const KeyIndex* index, dynamic_index("read_dynamic", table));
    out.clock = index->clock();
    out.entries = index->entries();
    out.sketch = index->sketch_state();
    const TableSpec& spec = config_.tables[static_cast<std::size_t>(table)].spec;
    out.weights.resize(out.entries.size() * static_cast<std::size_t>(spec.dim));
    out.state.resize(out.entries.size() * static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim)));
    std::vector<std::int64_t> rows(out.entries.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = out.entries[i].row;
    dynamic_.engine_rows(table, rows);
    return on_engine(table, [&](detail::Engine& e) {
      return e.read_rows_at(table, spec, rows, out.weights.data(), out.state.data());
    });
  }
  Status write_dynamic(int table, const detail::DynamicState& in) override {
    STRATA_RETURN_IF_ERROR(dynamic_index("write_dynamic", table).status());
    // An engine that cannot write (a failed device) refuses first, nothing changed. Then the index: restore checks
    // everything and changes nothing on error (no copy of it, which would hold a third index of the capacity beside
    // restore's own new one); then the rows, as rows given to new keys are written. Rows an engine could not write
    // after all are no key's: the table then holds none (a restore of nothing), and the error says so.
    STRATA_RETURN_IF_ERROR(on_engine(table, [](detail::Engine& e) { return e.accepting(); }));
    for (const KeyIndex::Entry& x : in.entries)
      if (dynamic_.owner(table, x.key) != rank())
        return detail::key_of_another_rank(config_.tables[static_cast<std::size_t>(table)].spec, x.key,
                                           dynamic_.owner(table, x.key), rank());
    KeyIndex& index = *dynamic_.index(table);
    STRATA_RETURN_IF_ERROR(index.restore(in.clock, in.entries, in.sketch));
    std::vector<std::int64_t> rows(in.entries.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = in.entries[i].row;
    dynamic_.engine_rows(table, rows);
    Status written = on_engine(
        table, [&](detail::Engine& e) { return e.reset_rows(table, rows, in.weights.data(), in.state.data()); });
    if (written.is_ok()) return written;
    STRATA_CHECK(index.restore(in.clock, {}, in.sketch).is_ok());
    return written.with_context("table '" + config_.tables[static_cast<std::size_t>(table)].spec.name +
                                "': its rows could not be written, so it holds no keys now");
  }

 private:
  struct Part {
    detail::EngineFeatures features;
    std::unique_ptr<detail::EngineBatch> state;
  };
  struct Entry {
    KeyBatch batch;             // as submitted: by feature
    std::vector<int> tables;    // index in checked_config() of each feature: its table, or (features) the feature
    detail::TableBatch served;  // unless features_ is trivial: the batch as the engines serve it
    std::vector<Part> parts;    // per engine
    bool forwarded = false;
    std::vector<MemorySpace> spaces;  // of forward's outputs, per feature
    // Per entry of `served` of a table of several features: its unpooled rows (forward), then its gradients
    // spread onto its keys (backward); (keys, dim) fp32.
    std::vector<std::vector<float>> rows;
    bool front = false;         // `served` is set: the store has features (batches go to the engines by table)
    detail::Admitted admitted;  // dynamic tables: what admission gave each entry of `served` (pinned until retired)
    const KeyBatch& served_batch() const { return front ? served.batch : batch; }
    const std::vector<int>& served_tables() const { return front ? served.tables : tables; }
  };
  // `found`, unless `check` failed.
  template <class T>
  static Result<T> refusal_or(const Status& check, Result<T> found) {
    if (!check.is_ok()) return check;
    return found;
  }

  // Per feature: a device view of an engine that takes host views only, or of a feature pooled at
  // the front (features.hpp), bounced through pinned host memory.
  template <class View>
  std::vector<bool> bounced(const Entry& e, const std::vector<View>& views) {
    std::vector<bool> b(views.size(), false);
    for (std::size_t i = 0; i < views.size(); ++i) {
      const int table = table_of(e, i);
      b[i] = views[i].space == MemorySpace::kDevice && (features_.merged(table) || !engine(table).device_views());
    }
    return b;
  }

  // The table of feature i of a batch.
  int table_of(const Entry& e, std::size_t i) const {
    return features_.trivial() ? e.tables[i] : features_.table_of(e.tables[i]);
  }
  // What batches and views by feature are checked against: the tables, or (features) one entry per feature.
  const StoreConfig& checked_config() const { return features_.trivial() ? config_ : features_.features(); }
  const detail::TableIndex& checked_index() const { return features_.trivial() ? index_ : features_.index(); }

  // The engine parts of a batch whose entries are of `tables`.
  std::vector<Part> parts_of(const std::vector<int>& tables) const {
    std::vector<Part> parts(engines_.size());
    for (std::size_t i = 0; i < tables.size(); ++i) {
      auto& p = parts[static_cast<std::size_t>(engine_of_[static_cast<std::size_t>(tables[i])])];
      p.features.feature.push_back(static_cast<int>(i));
      p.features.table.push_back(tables[i]);
    }
    return parts;
  }

  // The engines' views of a batch with features (one per entry of e.served): a table of one
  // feature gets that feature's view; a table of several its unpooled rows in `rows` (host, fp32,
  // sized here).
  template <class View>
  std::vector<View> served_views(const Entry& e, const std::vector<View>& views,
                                 std::vector<std::vector<float>>& rows) {
    const detail::TableBatch& tb = e.served;
    std::vector<View> out(tb.batch.features.size());
    if (rows.empty() && !rows_pool_.empty()) {
      rows = std::move(rows_pool_.back());  // sized as another batch's: a resize to the same size touches nothing
      rows_pool_.pop_back();
    }
    rows.resize(out.size());
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto k = static_cast<std::size_t>(tb.entry_of[i]);
      if (!features_.merged(tb.tables[k])) out[k] = views[i];
    }
    for (std::size_t k = 0; k < out.size(); ++k) {
      if (!features_.merged(tb.tables[k])) continue;
      const std::int64_t keys = tb.batch.features[k].num_keys();
      const std::int32_t dim = config_.tables[static_cast<std::size_t>(tb.tables[k])].spec.dim;
      rows[k].resize(static_cast<std::size_t>(keys * dim));
      out[k] = View{rows[k].data(), keys, dim, MemorySpace::kHost, DType::kF32};
    }
    return out;
  }
  template <class P>
  static std::vector<P> row_pointers(std::vector<std::vector<float>>& rows) {
    std::vector<P> p;
    p.reserve(rows.size());
    for (auto& r : rows) p.push_back(r.data());
    return p;
  }

  // Orders a call after the work queued on `stream` so far (none for an empty view): records
  // in_, which every engine's and the adaptors' streams wait for. One event, re-recorded by
  // every call (a wait takes the record in force when it is issued), so a step makes none.
  Result<detail::CallOrder> order_after(gpu::StreamView stream) {
    if (!stream.state()) return detail::CallOrder{};
    if (!in_) {
      STRATA_ASSIGN_OR_RETURN(in_, device_->create_event());
    }
    device_->record(in_.view(), stream);
    return detail::CallOrder{in_.view(), stream};
  }

  // A call that failed on this rank before reaching the engines: ranks waiting for it in the
  // same collective call learn why instead of timing out.
  Status refuse(const char* op, std::int64_t id, const Status& why) {
    if (!collective_) return why;
    Status s;
    arena_.execute([&] { s = collective_->refuse(op, id, why); });
    return s;
  }

  // The weights buffer of read_rows/write_rows (of a table already checked); state may be null.
  Status check_weights(const char* op, int table, std::int64_t n, const void* weights) const {
    if (weights || n == 0) return Status::ok();
    const TableSpec& s = config_.tables[static_cast<std::size_t>(table)].spec;
    return Status::invalid_argument("table '" + s.name + "': " + op + " weights is null (expected a buffer of " +
                                    std::to_string(n) + " x " + std::to_string(s.dim) + " floats)");
  }

  // What a batch held beyond the engines' parts, given back as it retires (backward applied, discard).
  void retire(Entry& e) {
    dynamic_.release(e.served, e.admitted);
    if (!e.rows.empty() && rows_pool_.size() < kRowsPool) rows_pool_.push_back(std::move(e.rows));
  }

  // Retires the parts of a batch the engines before engine `upto` accepted (a refused submit).
  void discard_parts(Entry& e, const KeyBatch& served, std::size_t upto) {
    for (std::size_t j = 0; j < upto; ++j)
      if (e.parts[j].state) (void)engines_[j]->discard(*e.parts[j].state, served, e.parts[j].features);
  }

  // `io(engine)` of a table's engine on the arena.
  template <class F>
  Status on_engine(int table, const F& io) {
    Status status;
    arena_.execute([&] { status = io(engine(table)); });
    return status;
  }

  // The key index of dynamic table `table` (detail::dynamic_only's errors otherwise).
  Result<const KeyIndex*> dynamic_index(const char* op, int table) const {
    STRATA_RETURN_IF_ERROR(detail::dynamic_only(op, table, config_));
    return dynamic_.index(table);
  }

  detail::Engine& engine(int table) const {
    return *engines_[static_cast<std::size_t>(engine_of_[static_cast<std::size_t>(table)])];
  }

  Topology topo_;
  std::shared_ptr<dispatch::Communicator> comm_;
  detail::TableIndex index_;
  detail::FeatureMap features_;  // declared before the engines, which hold its engines() config
  detail::DynamicKeys dynamic_;  // the key indexes of dynamic tables
  tbb::task_arena arena_;
  // The threads of the cache's row copies, which host tasks run (CacheTransfers): an arena of their
  // own, with arena_'s constraints, because in one arena more host-task threads plus the driving
  // thread than slots could wait on each other (an arena with a reserved master slot has max(2, n)
  // slots): the driver holds a slot while it waits for a stream whose host task waits for one.
  tbb::task_arena fill_arena_;
  NumaPlacement numa_;                   // where the host tier lives (config `numa`, resolved at init)
  std::unique_ptr<gpu::Device> device_;  // declared before the engines: destroyed after them
  std::vector<std::unique_ptr<detail::Engine>> engines_;
  std::vector<int> engine_of_;
  detail::Engine* collective_ = nullptr;  // the sharded tables' engine, when there are any
  // With a device (destroyed before it): the adaptor of device views for host-view engines, the
  // device gradients' finiteness check, and the event that orders a call after the caller's stream.
  std::unique_ptr<detail::HostBounce> bounce_;
  std::unique_ptr<detail::FiniteCheck> finite_;
  gpu::Event in_;
  std::unordered_map<std::int64_t, Entry> batches_;
  // Unpooled rows of retired batches (Entry::rows), reused by the next ones; at most kRowsPool sets.
  static constexpr std::size_t kRowsPool = 2;
  std::vector<std::vector<std::vector<float>>> rows_pool_;
  detail::PreviewIds previews_;  // previewed, not yet submitted
};

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const StoreConfig& config) { return open(config, nullptr); }

namespace {

// Every placement serves every table kind and element type (dynamic tables: issue 36, sharded by row or table;
// half-size rows, state, outputs and gradients: issue 31); what a world refuses is its placements and plans, here.
Result<std::unique_ptr<Store>> open_rank(const StoreConfig& config, std::shared_ptr<dispatch::Communicator> comm) {
  STRATA_RETURN_IF_ERROR(validate(config));
  // Without a communicator the store is a world of one rank: a plan must hold there too (a
  // table-wise owner 5 opened here while a 1-rank world refused it).
  const int world = comm ? comm->size() : 1;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    if (world > 1 && tc.placement != Placement::kGpu && tc.placement != Placement::kHybrid)
      return Status::invalid_argument("table '" + tc.spec.name + "': placement " + to_string(tc.placement) +
                                      " serves one rank; in a world of " + std::to_string(world) +
                                      " ranks every table must be gpu or hybrid");
    if (tc.placement != Placement::kGpu && tc.placement != Placement::kHybrid) continue;
    const Status plan = tc.dynamic ? dispatch::validate_dynamic_plan(tc.spec, tc.sharding, world)
                                   : dispatch::validate_plan(tc.spec, tc.sharding, world);
    if (!plan.is_ok() && !comm)
      return Status::invalid_argument(plan.message() + " (a store opened without a communicator is one rank)");
    STRATA_RETURN_IF_ERROR(plan);
  }
  Result<Topology> topo =
      config.fake_numa_nodes > 0 ? Result<Topology>(Topology::fake(config.fake_numa_nodes)) : Topology::discover();
  if (!topo) return topo.status();
  auto store = std::make_unique<StoreImpl>(config, std::move(topo).value(), std::move(comm));
  STRATA_RETURN_IF_ERROR(store->init());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const StoreConfig& config,
                                           const std::shared_ptr<dispatch::Communicator>& comm) {
  if (!comm) return open_rank(config, nullptr);
  // Collective from here. Every rank's config must be valid and agree with rank 0's on what every
  // rank must share before anything is sized by it: a rank with more rows or another plan would
  // make the exchanges crash, another learning rate or seed would train apart without a word.
  const std::string rank = "rank " + std::to_string(comm->rank());
  STRATA_RETURN_IF_ERROR(dispatch::agree(*comm, {"open", 0, 0, 0}, validate(config).with_context(rank)));
  STRATA_RETURN_IF_ERROR(detail::agree_on_config(*comm, config));
  auto store = open_rank(config, comm);
  // A rank that failed (a shard that does not fit its device, ...) fails them all.
  Status all = dispatch::agree(*comm, {"open", 0, 0, 0}, store ? Status::ok() : store.status().with_context(rank));
  if (!all.is_ok()) return all;
  return store;
}

Result<int> Store::table_index(const std::string& name) const {
  for (std::size_t i = 0; i < config_.tables.size(); ++i)
    if (config_.tables[i].spec.name == name) return static_cast<int>(i);
  return Status::not_found("unknown table '" + name + "'");
}

}  // namespace strata
