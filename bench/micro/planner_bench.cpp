// Micro-benchmarks of the cache planner: cache::CachePlanner probe + commit + retire of one batch
// (plus window_push of the batch K ahead, as the store does, for every policy; only lookahead uses
// it), driven by the store's prefetcher (cache::BasicPrefetcher with its PlanOnly executor), on
// Zipf 1.05 batches of a 1M-row table, one thread. Items are unique keys planned, so
// items_per_second is unique keys per second per core (BM_PlanBatchPartitioned: the same over a
// cache::PartitionedPlanner whose partitions run in parallel, in wall time; BM_PlanPhases: where a batch's
// time goes, call by call). The BM_PlanBatch* times are those of the whole loop, the prefetcher's
// own work included (grouping the batch's keys per pool, its pending queue, the feature lists it
// builds for each call); BM_PlanPhases times only the planner's calls, so its phases add up to
// less than BM_PlanBatch's time per batch, and the difference is the prefetcher's overhead.
// The pool is warmed on the whole batch set before timing; batches then cycle with increasing
// sequence numbers. A 1% cache (10k rows) cannot hold a batch of 4096 bags (~12k unique rows), so
// it is measured with 1024 bags (~4k unique).

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include <tbb/task_arena.h>

#include "cache/partitioned_planner.hpp"
#include "cache/prefetcher.hpp"
#include "host/dedup.hpp"
#include "toolkit/workload.hpp"

namespace strata {
namespace {

constexpr std::int64_t kRows = 1000000;
constexpr std::int64_t kBatch = 4096;  // bags (default)
constexpr int kBag = 8;                // keys per bag: 32768 lookups, ~12k unique at zipf 1.05
constexpr int kDistinctBatches = 256;  // cycled; long enough that the cycle is not a cache working set
constexpr int kWindow = 4;             // batches pushed beyond the one planned

struct Batches {
  std::vector<std::vector<Key>> keys;  // raw lookups per batch
  std::vector<UniqueKeys> unique;      // deduplicated
};

// The batch set of `bags` bags per batch (built once per size).
const Batches& batches(std::int64_t bags = kBatch) {
  static std::map<std::int64_t, Batches> cache;
  auto it = cache.find(bags);
  if (it != cache.end()) return it->second;
  Batches out;
  auto sampler = bench::KeySampler::create("zipf:1.05", kRows, 42);
  if (!sampler.is_ok()) {
    std::fprintf(stderr, "planner_bench: %s\n", sampler.status().to_string().c_str());
    std::abort();
  }
  out.keys.resize(kDistinctBatches);
  out.unique.resize(kDistinctBatches);
  for (int i = 0; i < kDistinctBatches; ++i) {
    out.keys[i].resize(static_cast<std::size_t>(bags * kBag));
    sampler.value().fill(out.keys[i].data(), bags * kBag);
    out.unique[i] = dedup_keys(out.keys[i].data(), bags * kBag);
  }
  return cache.emplace(bags, std::move(out)).first->second;
}

// Seconds spent in each planner call of Driver::plan, summed over the batches planned (BM_PlanPhases).
struct Phases {
  double push = 0, probe = 0, commit = 0, retire = 0;
};

// A planner that times the calls of `Planner` into `phases` when it is set: the prefetcher drives it
// as it drives the pool itself.
template <class Planner>
class Timed {
 public:
  template <class... Args>
  explicit Timed(Args&&... args) : planner_(std::forward<Args>(args)...) {}
  Phases* phases = nullptr;
  const Planner& planner() const { return planner_; }
  const cache::CachePlannerOptions& options() const noexcept { return planner_.options(); }
  void window_push(std::int64_t seq, const std::vector<cache::FeatureKeys>& f) {
    time(&Phases::push, [&] { planner_.window_push(seq, f); });
  }
  void window_drop(std::int64_t seq, const std::vector<cache::FeatureKeys>& f) { planner_.window_drop(seq, f); }
  auto probe(std::int64_t seq, const std::vector<cache::FeatureKeys>& f) const {
    return time(&Phases::probe, [&] { return planner_.probe(seq, f); });
  }
  template <class Probe>
  auto commit(Probe p) {
    return time(&Phases::commit, [&] { return planner_.commit(std::move(p)); });
  }
  template <class Plan>
  void retire(const Plan& plan, bool updated) {
    time(&Phases::retire, [&] { planner_.retire(plan, updated); });
  }
  std::vector<cache::Transfer> dirty() const { return planner_.dirty(); }
  void mark_clean(const std::vector<cache::Transfer>& rows) { planner_.mark_clean(rows); }
  void invalidate_table(int table) { planner_.invalidate_table(table); }
  cache::CacheStats table_stats(int table) const { return planner_.table_stats(table); }

 private:
  template <class Fn>
  auto time(double Phases::*phase, const Fn& fn) const {
    using Clock = std::chrono::steady_clock;
    if (!phases) return fn();
    const Clock::time_point t0 = Clock::now();
    struct Lap {  // adds the time when the call returns (its result, if any, is returned as is)
      Phases* p;
      double Phases::*phase;
      Clock::time_point t0;
      ~Lap() { p->*phase += std::chrono::duration<double>(Clock::now() - t0).count(); }
    } lap{phases, phase, t0};
    return fn();
  }
  Planner planner_;
};

// A pool (cache::CachePlanner, or cache::PartitionedPlanner of `partitions`) driven over the cycling batch set by
// a prefetcher of lookahead `window` (each plan() submits the batch `window` ahead, which plans the
// oldest); plan() plans one batch, retires it and returns its unique count (with `t`, adding each
// planner call's time to it).
template <class Planner = cache::CachePlanner>
struct Driver {
  using Prefetcher = cache::BasicPrefetcher<Timed<Planner>>;
  Driver(cache::Policy policy, double fraction, std::int64_t bags = kBatch, int window = kWindow, int partitions = 1)
      : set(batches(bags)), window(window), prefetcher(window, 1), ring(static_cast<std::size_t>(window) + 1) {
    cache::CachePlannerOptions o;
    o.slots = static_cast<std::int64_t>(fraction * kRows);
    o.policy = policy;
    o.window = window + 1;
    o.record_bytes = 64 * 4;
    o.name = "bench";
    o.tables = {{"t", 0}};
    std::unique_ptr<Timed<Planner>> planner;
    if constexpr (std::is_same_v<Planner, cache::PartitionedPlanner>)
      planner = std::make_unique<Timed<Planner>>(o, partitions);
    else
      planner = std::make_unique<Timed<Planner>>(std::move(o));
    timed = planner.get();
    prefetcher.add_pool(std::move(planner), {0});
    prefetcher.set_executor(&Prefetcher::plan_only());
    for (; pushed < window; ++pushed) submit(at(pushed));
  }
  const UniqueKeys& at(std::int64_t seq) const { return set.unique[static_cast<std::size_t>(seq % kDistinctBatches)]; }
  const Planner& planner() const { return timed->planner(); }
  // Submits the next batch with keys `u` (alive until it is planned and retired).
  void submit(const UniqueKeys& u) {
    typename Prefetcher::Batch& b = ring[static_cast<std::size_t>(pushed % (window + 1))];
    b.id = pushed;
    b.keys = {{0, &u}};
    check(prefetcher.submit(b));
  }
  // Submits the batch `window` ahead (keys `u`, by default its keys in the set), which plans the
  // oldest; retires the oldest.
  std::int64_t plan(Phases* t = nullptr) { return plan(at(pushed), t); }
  std::int64_t plan(const UniqueKeys& u, Phases* t = nullptr) {
    timed->phases = t;
    submit(u);
    ++pushed;
    typename Prefetcher::Batch& b = ring[static_cast<std::size_t>(seq % (window + 1))];
    check(prefetcher.plan(b));
    const std::int64_t unique = b.keys[0].unique->size();
    prefetcher.retire(b, true);
    ++seq;
    return unique;
  }
  static void check(const Status& s) {
    if (s.is_ok()) return;
    std::fprintf(stderr, "planner_bench: %s\n", s.to_string().c_str());
    std::abort();
  }
  const Batches& set;
  int window;  // batches submitted beyond the one planned
  Prefetcher prefetcher;
  Timed<Planner>* timed = nullptr;               // the prefetcher's planner
  std::vector<typename Prefetcher::Batch> ring;  // batches submitted, not retired, by id modulo window + 1
  std::int64_t seq = 0, pushed = 0;
};

cache::Policy policy_arg(std::int64_t a) { return static_cast<cache::Policy>(a); }

void set_label(benchmark::State& state, cache::Policy p, std::int64_t pct, std::int64_t bags = kBatch) {
  state.SetLabel(std::string(cache::to_string(p)) + " cache " + std::to_string(pct) + "% " + std::to_string(bags) +
                 " bags");
}

// probe + commit + retire of already deduplicated keys.
void BM_PlanBatch(benchmark::State& state) {
  const cache::Policy policy = policy_arg(state.range(0));
  const std::int64_t bags = state.range(2);
  Driver<> d(policy, static_cast<double>(state.range(1)) / 100.0, bags);
  for (int i = 0; i < kDistinctBatches; ++i) d.plan();  // warm the cache
  std::int64_t unique = 0, lookups = 0;
  for (auto _ : state) {
    unique += d.plan();
    lookups += bags * kBag;
  }
  const auto& st = d.planner().pool_stats();
  state.SetItemsProcessed(unique);
  state.counters["hit_rate"] = st.hit_rate();
  state.counters["unique_per_batch"] = static_cast<double>(unique) / static_cast<double>(state.iterations());
  state.counters["lookups_per_second"] = benchmark::Counter(static_cast<double>(lookups), benchmark::Counter::kIsRate);
  set_label(state, policy, state.range(1), bags);
}
BENCHMARK(BM_PlanBatch)
    ->ArgNames({"policy", "cache_pct", "bags"})
    ->ArgsProduct({{0, 1, 2}, {1}, {1024}})
    ->ArgsProduct({{0, 1, 2}, {5, 20}, {kBatch}})
    ->Unit(benchmark::kMicrosecond);

// A pool planned in `partitions` partitions in parallel (cache::PartitionedPlanner, oneTBB's default arena: every
// core of the machine). Real time: items_per_second is unique keys per second of wall time, over
// all the cores the partitions ran on; per_core divides it by min(partitions, cores). Compare with
// partitions = 1 of the same run (the CachePlanner behind a PartitionedPlanner, no split). hit_rate shows what
// ranking rows within their partition costs.
void BM_PlanBatchPartitioned(benchmark::State& state) {
  const cache::Policy policy = policy_arg(state.range(0));
  const int partitions = static_cast<int>(state.range(2));
  Driver<cache::PartitionedPlanner> d(policy, static_cast<double>(state.range(1)) / 100.0, kBatch, kWindow, partitions);
  for (int i = 0; i < kDistinctBatches; ++i) d.plan();
  const cache::CacheStats warm = d.planner().pool_stats();
  std::int64_t unique = 0;
  for (auto _ : state) unique += d.plan();
  cache::CacheStats st = d.planner().pool_stats();
  st -= warm;
  const double cores = std::min<double>(partitions, tbb::this_task_arena::max_concurrency());
  state.SetItemsProcessed(unique);
  state.counters["hit_rate"] = st.hit_rate();
  state.counters["per_core"] = benchmark::Counter(static_cast<double>(unique) / cores, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(cache::to_string(policy)) + " cache " + std::to_string(state.range(1)) + "% " +
                 std::to_string(partitions) + " partitions");
}
BENCHMARK(BM_PlanBatchPartitioned)
    ->ArgNames({"policy", "cache_pct", "partitions"})
    ->ArgsProduct({{0, 1, 2}, {5, 20}, {1, 2, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// lookahead with a window of 4 submitted + 180 previewed batches (Store::preview): the depth at
// which it comes within 3 pp of Belady in the hit-rate study (README.md).
void BM_PlanBatchDeepWindow(benchmark::State& state) {
  Driver<> d(cache::Policy::kLookahead, static_cast<double>(state.range(0)) / 100.0, kBatch, 184);
  for (int i = 0; i < kDistinctBatches; ++i) d.plan();
  std::int64_t unique = 0;
  for (auto _ : state) unique += d.plan();
  state.SetItemsProcessed(unique);
  state.counters["hit_rate"] = d.planner().pool_stats().hit_rate();
  state.SetLabel("lookahead window 184 cache " + std::to_string(state.range(0)) + "%");
}
BENCHMARK(BM_PlanBatchDeepWindow)->ArgName("cache_pct")->Arg(5)->Arg(20)->Unit(benchmark::kMicrosecond);

// window_push, probe, commit and retire timed one by one (steady_clock around each call): where the
// planning time of a batch goes. Counters: microseconds per batch in each call. Only the planner's
// calls are timed, not the prefetcher around them (nor the steady_clock reads): the four do not
// add up to the time per batch (the benchmark's own time, or BM_PlanBatch's). Args: policy, cache %,
// partitions (a cache::PartitionedPlanner; 1 partition is the CachePlanner itself) and the window (batches pushed
// beyond the one planned: 4, or 184 = 4 submitted + 180 previewed as in BM_PlanBatchDeepWindow).
void BM_PlanPhases(benchmark::State& state) {
  const cache::Policy policy = policy_arg(state.range(0));
  const int partitions = static_cast<int>(state.range(2)), window = static_cast<int>(state.range(3));
  Driver<cache::PartitionedPlanner> d(policy, static_cast<double>(state.range(1)) / 100.0, kBatch, window, partitions);
  for (int i = 0; i < kDistinctBatches; ++i) d.plan();
  Phases t;
  std::int64_t unique = 0;
  for (auto _ : state) unique += d.plan(&t);
  const double us = 1e6 / static_cast<double>(state.iterations());
  state.counters["push_us"] = t.push * us;
  state.counters["probe_us"] = t.probe * us;
  state.counters["commit_us"] = t.commit * us;
  state.counters["retire_us"] = t.retire * us;
  state.SetItemsProcessed(unique);
  state.SetLabel(std::string(cache::to_string(policy)) + " cache " + std::to_string(state.range(1)) + "% " +
                 std::to_string(partitions) + " partitions window " + std::to_string(window));
}
BENCHMARK(BM_PlanPhases)
    ->ArgNames({"policy", "cache_pct", "partitions", "window"})
    ->ArgsProduct({{0, 1, 2}, {5, 20}, {1, 2}, {kWindow}})
    ->Args({2, 5, 1, 184})
    ->Args({2, 20, 1, 184})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// dedup_keys of the raw lookups of the batch submitted (reused scratch, as the store does) + probe
// + commit + retire of the batch planned.
void BM_DedupAndPlanBatch(benchmark::State& state) {
  const cache::Policy policy = policy_arg(state.range(0));
  Driver<> d(policy, static_cast<double>(state.range(1)) / 100.0);
  for (int i = 0; i < kDistinctBatches; ++i) d.plan();
  // The keys of the batches submitted and not retired, by sequence number modulo kWindow + 1.
  std::vector<UniqueKeys> ring(kWindow + 1);
  DedupScratch scratch;
  std::int64_t unique = 0, lookups = 0;
  for (auto _ : state) {
    const auto& raw = d.set.keys[static_cast<std::size_t>(d.pushed % kDistinctBatches)];
    UniqueKeys& u = ring[static_cast<std::size_t>(d.pushed % (kWindow + 1))];
    dedup_keys(raw.data(), static_cast<std::int64_t>(raw.size()), u, scratch);
    unique += d.plan(u);
    lookups += static_cast<std::int64_t>(raw.size());
  }
  state.SetItemsProcessed(unique);
  state.counters["lookups_per_second"] = benchmark::Counter(static_cast<double>(lookups), benchmark::Counter::kIsRate);
  set_label(state, policy, state.range(1));
}
BENCHMARK(BM_DedupAndPlanBatch)
    ->ArgNames({"policy", "cache_pct"})
    ->ArgsProduct({{0, 1, 2}, {5}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace strata
