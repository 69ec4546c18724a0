#include "tune/validate.hpp"

#include <algorithm>
#include <list>
#include <map>
#include <unordered_map>

#include "core/record_layout.hpp"
#include "toolkit/feature_tables.hpp"

namespace strata::tune {

namespace {
bool caches(Placement p) { return p == Placement::kCached || p == Placement::kHybrid; }
}  // namespace

double TablePrediction::hit_rate() const noexcept {
  if (!caches(placement)) return -1;
  return accesses > 0 ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0;
}

double RunPrediction::hit_rate() const noexcept {
  std::int64_t a = 0, h = 0;
  bool any = false;
  for (const TablePrediction& t : tables)
    if (caches(t.placement)) {
      any = true;
      a += t.accesses;
      h += t.hits;
    }
  if (!any) return -1;
  return a > 0 ? static_cast<double>(h) / static_cast<double>(a) : 0.0;
}

std::vector<std::pair<std::string, std::vector<std::string>>> plan_features(const StoreConfig& plan) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const TableConfig& t : plan.tables) {
    if (t.features.empty()) continue;
    out.push_back({t.spec.name, {}});
    for (const FeatureConfig& f : t.features) out.back().second.push_back(f.name);
  }
  return out;
}

Status check_plan_tables(const StoreConfig& plan, const std::vector<std::string>& names,
                         const std::vector<std::int64_t>& rows, const std::vector<int>& dims, const std::string& what,
                         const std::map<std::string, std::vector<std::string>>& features) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto t = std::find_if(plan.tables.begin(), plan.tables.end(),
                                [&](const TableConfig& c) { return c.spec.name == names[i]; });
    if (t == plan.tables.end())
      return Status::invalid_argument("table '" + names[i] + "' of the " + what + " is not in the plan (" +
                                      std::to_string(plan.tables.size()) + " tables, " + std::to_string(names.size()) +
                                      " in the " + what + ")");
    if (t->spec.rows != rows[i])
      return Status::invalid_argument("table '" + names[i] + "' has " + std::to_string(t->spec.rows) +
                                      " rows in the plan but " + std::to_string(rows[i]) + " in the " + what);
    if (!dims.empty() && t->spec.dim != dims[i])
      return Status::invalid_argument("table '" + names[i] + "' has dim " + std::to_string(t->spec.dim) +
                                      " in the plan but " + std::to_string(dims[i]) + " in the " + what);
    std::vector<std::string> listed;
    for (const FeatureConfig& f : t->features) listed.push_back(f.name);
    const auto it = features.find(names[i]);
    const std::vector<std::string> used = it == features.end() ? std::vector<std::string>{} : it->second;
    STRATA_RETURN_IF_ERROR(bench::check_same_features(names[i], listed, "plan", used, what));
  }
  for (const TableConfig& c : plan.tables)
    if (std::find(names.begin(), names.end(), c.spec.name) == names.end())
      return Status::invalid_argument("table '" + c.spec.name + "' of the plan is not in the " + what);
  return Status::ok();
}

namespace {

// Run batches [from, to) of a source trace of `n` batches (run batch i is source batch i mod n).
cache::KeyTrace run_keys(const cache::KeyTrace& source, std::int64_t from, std::int64_t to) {
  cache::KeyTrace out;
  out.batch_offsets.push_back(0);
  const std::int64_t n = source.num_batches();
  for (std::int64_t i = from; i < to; ++i) {
    const std::int64_t b = i % n;
    out.keys.insert(out.keys.end(), source.keys.begin() + source.batch_offsets[b],
                    source.keys.begin() + source.batch_offsets[b + 1]);
    out.batch_offsets.push_back(out.num_keys());
  }
  return out;
}

// The per-step load of run batches [from, to) of rank 0 of `ranks` (run batch i is source batch
// i * ranks, mod the source's batches).
TableLoad window_load(const TableTrace& t, const TableConfig& tc, std::int64_t from, std::int64_t to, int ranks) {
  TableLoad l;
  if (tc.features.size() > 1) l.features = static_cast<int>(tc.features.size());
  const cache::KeyTrace& k = t.keys;
  const std::int64_t n = k.num_batches();
  std::vector<std::uint64_t> scratch;
  double keys = 0, bags = 0, distinct = 0;
  for (std::int64_t i = from; i < to; ++i) {
    const std::int64_t b = i * ranks % n;
    scratch.assign(k.keys.begin() + k.batch_offsets[b], k.keys.begin() + k.batch_offsets[b + 1]);
    std::sort(scratch.begin(), scratch.end());
    const auto u = static_cast<std::int64_t>(std::unique(scratch.begin(), scratch.end()) - scratch.begin());
    keys += static_cast<double>(scratch.size());
    bags += static_cast<double>(t.step_bags[static_cast<std::size_t>(b)]);
    distinct += static_cast<double>(u);
    l.max_keys = std::max(l.max_keys, static_cast<std::int64_t>(scratch.size()));
    l.max_distinct = std::max(l.max_distinct, u);
    l.max_bags = std::max(l.max_bags, t.step_bags[static_cast<std::size_t>(b)]);
    const std::int64_t rows = step_feature_rows(t, tc, b);
    l.feature_rows += static_cast<double>(rows);
    l.max_feature_rows = std::max(l.max_feature_rows, rows);
  }
  const double steps = static_cast<double>(to - from);
  l.keys = keys / steps;
  l.bags = bags / steps;
  l.distinct = distinct / steps;
  l.feature_rows /= steps;
  return l;
}

// The keys of source batch `b` of a table: count, bags, distinct rows in order of first use.
struct StepKeys {
  BatchKeys k;
  std::vector<std::uint64_t> first_use;  // distinct rows, in the order of their first occurrence
};

StepKeys step_keys(const TableTrace& t, const TableConfig& tc, std::int64_t b,
                   std::unordered_map<std::uint64_t, std::int64_t>& seen, std::int64_t stamp) {
  StepKeys s;
  const cache::KeyTrace& k = t.keys;
  for (std::int64_t i = k.batch_offsets[b]; i < k.batch_offsets[b + 1]; ++i) {
    auto [it, fresh] = seen.try_emplace(k.keys[static_cast<std::size_t>(i)], stamp);
    if (fresh || it->second != stamp) {
      it->second = stamp;
      s.first_use.push_back(k.keys[static_cast<std::size_t>(i)]);
    }
  }
  s.k.keys = k.batch_offsets[b + 1] - k.batch_offsets[b];
  s.k.bags = t.step_bags[static_cast<std::size_t>(b)];
  s.k.distinct = static_cast<std::int64_t>(s.first_use.size());
  if (tc.features.size() > 1) s.k.features = static_cast<std::int64_t>(tc.features.size());
  s.k.feature_rows = step_feature_rows(t, tc, b);
  return s;
}

// A batch-at-a-time LRU cache of `capacity` rows with dirty bits, as a cached table's capped
// cache behaves (cache/analysis.hpp, PerBatch::kDistinct): a row hits when resident at the start
// of its batch; victims are the least recently used rows not in the batch (rows last used by one
// batch ordered by their first occurrence in it); a row is dirty once a training batch used it
// since its fill, and only dirty victims are written back.
class DirtyLru {
 public:
  explicit DirtyLru(std::int64_t capacity) : capacity_(capacity) {}
  // One batch (its distinct rows in order of first use): its fills and write-backs.
  void step(const std::vector<std::uint64_t>& rows, bool training, std::int64_t& fills, std::int64_t& writebacks) {
    fills = writebacks = 0;
    std::vector<bool> dirty(rows.size(), training);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto it = where_.find(rows[i]);
      if (it == where_.end()) {
        ++fills;
        continue;
      }
      dirty[i] = dirty[i] || it->second->second;
      order_.erase(it->second);
      where_.erase(it);
    }
    const std::int64_t room = capacity_ - static_cast<std::int64_t>(rows.size());
    while (static_cast<std::int64_t>(order_.size()) > std::max<std::int64_t>(0, room)) {
      if (order_.front().second) ++writebacks;
      where_.erase(order_.front().first);
      order_.pop_front();
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      order_.emplace_back(rows[i], dirty[i]);
      where_[rows[i]] = std::prev(order_.end());
    }
  }

 private:
  std::int64_t capacity_;
  std::list<std::pair<std::uint64_t, bool>> order_;  // least recently used first; (row, dirty)
  std::unordered_map<std::uint64_t, std::list<std::pair<std::uint64_t, bool>>::iterator> where_;
};

// Each plan table's trace, and its simulated cache (empty unless its placement is `cached`:
// kCached on one rank, kHybrid over ranks).
void plan_tables(const TuneInput& input, const StoreConfig& plan, Placement cached,
                 std::vector<const TableTrace*>& traces, std::vector<DirtyLru>& caches) {
  for (const TableConfig& tc : plan.tables) {
    traces.push_back(&*std::find_if(input.tables.begin(), input.tables.end(),
                                    [&](const TableTrace& t) { return t.spec.name == tc.spec.name; }));
    caches.emplace_back(tc.placement == cached ? cache_rows(tc) : 0);
  }
}

// The bytes strata-bench's counters see over its training phase (predict_run's header comment),
// per table and in all, summed over the run's batches (not yet divided by the steps).
Status predict_bytes(const TuneInput& input, const StoreConfig& plan, std::int64_t steps, std::int64_t counted,
                     const CostOptions& o, RunPrediction& r) {
  const std::int64_t end = 2 * steps;
  std::vector<const TableTrace*> traces;
  std::vector<DirtyLru> caches;
  plan_tables(input, plan, Placement::kCached, traces, caches);
  std::unordered_map<std::uint64_t, std::int64_t> seen;
  std::int64_t stamp = 0;
  for (std::int64_t i = 0; i < end; ++i) {
    // Groups of tables whose lists share one staging array: slot pools (a record shape), and the
    // offload engine's row groups (rows of one dim and dtype: a record shape without state).
    std::map<RecordShape, BatchKeys, RecordShapeLess> pools, offload;
    for (std::size_t t = 0; t < plan.tables.size(); ++t) {
      const TableConfig& tc = plan.tables[t];
      const cache::KeyTrace& keys = traces[t]->keys;
      seen.clear();
      StepKeys sk = step_keys(*traces[t], tc, i % keys.num_batches(), seen, ++stamp);
      if (tc.placement == Placement::kCached) caches[t].step(sk.first_use, i >= steps, sk.k.fills, sk.k.writebacks);
      if (i < steps) continue;  // the forward phase: not counted
      StepBytes& mine = r.tables[t].bytes;
      add_bytes(mine, compute_bytes(tc.spec, tc.placement, sk.k, o));
      if (i < counted) continue;  // submitted before the counters started
      add_bytes(mine, submit_bytes(tc.spec, tc.placement, sk.k, o));
      if (tc.placement == Placement::kCached || tc.placement == Placement::kOffload) {
        BatchKeys& g = tc.placement == Placement::kCached ? pools[record_shape(tc.spec)]
                                                          : offload[RecordShape{tc.spec.dim, tc.spec.dtype}];
        g.fills += sk.k.fills;
        g.writebacks += sk.k.writebacks;
        g.distinct += sk.k.distinct;
      }
    }
    for (const auto& [shape, g] : pools)
      add_bytes(r.bytes, group_submit_bytes(Placement::kCached, g.fills, g.writebacks, g.distinct, o));
    for (const auto& [shape, g] : offload)
      add_bytes(r.bytes, group_submit_bytes(Placement::kOffload, g.fills, g.writebacks, g.distinct, o));
  }
  for (TablePrediction& p : r.tables) {
    add_bytes(r.bytes, p.bytes);
    scale_bytes(p.bytes, 1.0 / static_cast<double>(steps));
  }
  scale_bytes(r.bytes, 1.0 / static_cast<double>(steps));
  return Status::ok();
}

// Several ranks (row sharding): the bytes rank 0's counters see over its training phase, and its
// hybrid caches' hits, as strata-bench --ranks N runs the plan on thread ranks: in run batch i (a
// world step) rank r trains on source batch i N + r; each rank sends its distinct keys of a table
// to their holders (key k on rank k % N, local row k / N), and rank 0 serves every source's keys of
// its shard, sources in rank order and each one's keys in the order of their first use, as one
// unpooled feature of its inner engine (a cache for hybrid, which sees its distinct rows in the
// order of their first use there).
Status predict_sharded(const TuneInput& input, const StoreConfig& plan, std::int64_t steps, std::int64_t counted,
                       const CostOptions& o, RunPrediction& r) {
  const std::int64_t end = 2 * steps;
  const int N = o.ranks;
  const auto n = static_cast<std::uint64_t>(N);
  std::vector<const TableTrace*> traces;
  std::vector<DirtyLru> caches;
  plan_tables(input, plan, Placement::kHybrid, traces, caches);
  std::unordered_map<std::uint64_t, std::int64_t> seen;
  std::int64_t stamp = 0;
  std::vector<std::uint64_t> served;
  for (std::int64_t i = 0; i < end; ++i) {
    std::map<RecordShape, BatchKeys, RecordShapeLess> pools;  // the hybrid tables' slot pools
    for (std::size_t t = 0; t < plan.tables.size(); ++t) {
      const TableConfig& tc = plan.tables[t];
      const std::int64_t batches = traces[t]->keys.num_batches();
      ShardStep k;
      served.clear();
      for (int q = 0; q < N; ++q) {
        seen.clear();
        const StepKeys sk = step_keys(*traces[t], tc, (i * N + q) % batches, seen, ++stamp);
        if (q == 0) k.source = sk.k;
        for (const std::uint64_t key : sk.first_use) {
          if (key % n == 0) served.push_back(key / n);
          if (q == 0 && key % n != 0) ++k.remote;
        }
      }
      // The inner engine's distinct rows, in the order of their first use.
      seen.clear();
      ++stamp;
      std::vector<std::uint64_t> rows;
      for (const std::uint64_t row : served) {
        auto [it, fresh] = seen.try_emplace(row, stamp);
        if (fresh || it->second != stamp) {
          it->second = stamp;
          rows.push_back(row);
        }
      }
      k.served.keys = k.served.bags = static_cast<std::int64_t>(served.size());
      k.served.distinct = static_cast<std::int64_t>(rows.size());
      TablePrediction& p = r.tables[t];
      if (tc.placement == Placement::kHybrid) {
        caches[t].step(rows, i >= steps, k.served.fills, k.served.writebacks);
        if (i >= counted) {
          p.accesses += k.served.distinct;
          p.hits += k.served.distinct - k.served.fills;
        }
      }
      if (i < steps) continue;  // the forward phase: not counted
      add_bytes(p.bytes, sharded_compute_bytes(tc.spec, k, o));
      r.exchange_bytes += exchange_bytes(tc.spec, static_cast<double>(k.remote));
      if (i < counted) continue;  // submitted before the counters started
      add_bytes(p.bytes, sharded_submit_bytes(tc.spec, tc.placement, k, o));
      if (tc.placement == Placement::kHybrid && k.served.keys > 0) {
        BatchKeys& g = pools[record_shape(tc.spec)];
        g.fills += k.served.fills;
        g.writebacks += k.served.writebacks;
      }
    }
    for (const auto& [key, g] : pools)
      add_bytes(r.bytes, group_submit_bytes(Placement::kCached, g.fills, g.writebacks, 0, o));
  }
  for (TablePrediction& p : r.tables) {
    add_bytes(r.bytes, p.bytes);
    scale_bytes(p.bytes, 1.0 / static_cast<double>(steps));
  }
  scale_bytes(r.bytes, 1.0 / static_cast<double>(steps));
  r.exchange_bytes /= static_cast<double>(steps);
  return Status::ok();
}

}  // namespace

StepBytes measured_step_bytes(const StepBytes& counted, const RunPrediction& predicted) {
  StepBytes b = counted;
  b.all_to_all += std::max(0.0, predicted.bytes.all_to_all - predicted.exchange_bytes);
  b.host_remote = predicted.bytes.host_remote;
  b.launches = predicted.bytes.launches;
  b.host_gathers = predicted.bytes.host_gathers;
  return b;
}

Result<RunPrediction> predict_run(const TuneInput& input, const StoreConfig& plan, std::int64_t steps, int pipeline,
                                  const HardwareProfile& profile, bool trainer_on_device, int ranks) {
  if (steps < 1) return Status::invalid_argument("--steps " + std::to_string(steps) + " (expected >= 1)");
  if (ranks < 1) return Status::invalid_argument("--ranks " + std::to_string(ranks) + " (expected >= 1)");
  for (const TableConfig& tc : plan.tables) {
    if (ranks > 1 && tc.placement != Placement::kGpu && tc.placement != Placement::kHybrid)
      return Status::invalid_argument("table '" + tc.spec.name + "' is " + to_string(tc.placement) + ": a world of " +
                                      std::to_string(ranks) + " ranks takes gpu or hybrid tables");
    if (ranks > 1 && tc.sharding.type != dispatch::ShardingType::kRow)
      return Status::invalid_argument("table '" + tc.spec.name + "' is sharded " +
                                      dispatch::to_string(tc.sharding.type) +
                                      " (validate predicts row sharding, as strata-tune plans it)");
    if (ranks == 1 && tc.placement == Placement::kHybrid)
      return Status::invalid_argument("table '" + tc.spec.name +
                                      "' is hybrid: validate runs one rank (give --ranks N for a plan made with it)");
  }
  const std::int64_t counted = steps + std::min<std::int64_t>(steps, std::max(1, pipeline) - 1);
  if (input.sample_rate < 1.0) return Status::invalid_argument("validate needs every key (no --sample)");
  CostOptions o;
  o.trainer_on_device = trainer_on_device;
  o.zero_copy = plan.cache.transfer == CacheTransfer::kZeroCopy;
  o.offload_cpu_gather = plan.offload_gather == OffloadGather::kCpu;
  o.check_finite = !plan.accept_nonfinite_gradients;
  o.store_has_device = std::any_of(plan.tables.begin(), plan.tables.end(),
                                   [](const TableConfig& t) { return t.placement != Placement::kCpu; });
  o.max_in_flight = plan.cache.max_in_flight;
  o.threads = plan.threads;
  o.numa_nodes = static_cast<int>(std::max<std::size_t>(1, profile.numa_nodes.size()));
  o.l2_bytes = static_cast<std::uint64_t>(profile.l2_cache_bytes.value);
  o.ranks = ranks;
  RunPrediction r;
  r.steps = steps;
  r.ranks = ranks;
  for (const TableConfig& tc : plan.tables) {
    const auto it = std::find_if(input.tables.begin(), input.tables.end(),
                                 [&](const TableTrace& t) { return t.spec.name == tc.spec.name; });
    if (it == input.tables.end()) return Status::invalid_argument("table '" + tc.spec.name + "' has no keys");
    TablePrediction p;
    p.name = tc.spec.name;
    p.placement = tc.placement;
    p.load = window_load(*it, tc, steps, 2 * steps, ranks);
    if (tc.placement == Placement::kHybrid) p.cache_rows = cache_rows(tc);  // hits: predict_sharded
    if (tc.placement == Placement::kCached) {
      p.cache_rows = cache_rows(tc);
      STRATA_ASSIGN_OR_RETURN(const cache::LruCurve both,
                              cache::lru_curve(run_keys(it->keys, 0, 2 * steps), cache::PerBatch::kDistinct));
      STRATA_ASSIGN_OR_RETURN(const cache::LruCurve first,
                              cache::lru_curve(run_keys(it->keys, 0, counted), cache::PerBatch::kDistinct));
      p.accesses = both.accesses() - first.accesses();
      p.hits = both.hits_at(p.cache_rows) - first.hits_at(p.cache_rows);
    }
    r.tables.push_back(std::move(p));
  }
  STRATA_RETURN_IF_ERROR(ranks > 1 ? predict_sharded(input, plan, steps, counted, o, r)
                                   : predict_bytes(input, plan, steps, counted, o, r));
  r.model = model_options(profile, ranks, plan.numa, o.store_has_device);
  r.step = model_step(profile, r.bytes, r.model);
  return r;
}

}  // namespace strata::tune
