// strata-hitrate: hit rates of the real cache planner (cache::CachePlanner) under each policy, against
// the offline bounds of cache/analysis.hpp, on synthetic Zipf traces of one table.
//
// For every Zipf alpha and cache capacity (a fraction of the rows) the program drives a CachePlanner
// with the store's prefetcher (cache::BasicPrefetcher, PlanOnly executor: no device): batch j is planned
// (probe + commit) once batches j+1 .. j+K+W have entered the lookahead window (K = --lookahead
// submitted batches, W = --preview batches previewed beyond them as with Store::preview), then
// retired as updated. Hits are counted
// per unique (batch, row), as CachePlanner counts them. The same trace goes to cache::belady_hits
// (the optimum) and cache::lru_curve(PerBatch::kDistinct) (exact LRU). The pool's LRU agrees with
// the curve only up to the order of rows within one batch: the pool stamps a batch's hits before its
// misses, the curve orders them by first use. --check-lru-order feeds the curve the pool's order,
// which must then give exactly the pool's hit count.
//
// Warm-up: the first --warmup fraction of the batches run but are not counted; the reported rates
// cover batches [warm-up, B). Rates over all batches are written too (hit_rate_all).
//
// --drift N draws drift:ALPHA:N instead of zipf:ALPHA (the hot rows move every N batches);
// static_top then holds the most probable rows of each batch's epoch.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cache/analysis.hpp"
#include "cache/cache_planner.hpp"
#include "cache/policy.hpp"
#include "cache/prefetcher.hpp"
#include "host/dedup.hpp"
#include "toolkit/workload.hpp"

namespace strata::bench {
namespace {

struct StudyOptions {
  std::int64_t rows = 1000000;                          // rows of the table
  std::int64_t batch = 1024;                            // bags per batch
  int bag_size = 8;                                     // keys per bag (fixed)
  std::int64_t batches = 1000;                          // batches in the trace
  std::vector<double> alphas = {0.9, 1.05, 1.2};        // Zipf exponents
  std::vector<double> capacities = {0.01, 0.05, 0.20};  // cache slots as a fraction of rows
  std::vector<std::string> policies = {"lru", "lfu", "lookahead"};
  int lookahead = 4;       // K: batches pushed to the window beyond the one planned
  int preview = 0;         // W: batches previewed beyond those K (the window holds K + W batches)
  std::int64_t drift = 0;  // > 0: drift:ALPHA:N with N = drift (the hot set moves every N batches)
  double half_life = 0;    // lookahead: frequency half-life in multiples of the slots (0: the pool's default)
  double warmup = 0.2;     // fraction of batches not counted
  std::uint64_t seed = 42;
  int threads = 0;  // 0: hardware concurrency
  std::string json_out;
  bool progress = ::isatty(STDERR_FILENO) != 0;  // progress only on a terminal (--no-progress hides it there too)
  bool check_lru_order = false;                  // also run lru_curve on the pool's within-batch order
};

// Hits and accesses (unique (batch, row) pairs) per batch.
struct BatchCounts {
  std::vector<std::int64_t> hits, accesses;
};

struct Totals {
  std::int64_t hits = 0, accesses = 0;
  double rate() const { return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0; }
};

Totals sum_from(const BatchCounts& c, std::int64_t first) {
  Totals t;
  for (std::size_t b = static_cast<std::size_t>(first); b < c.hits.size(); ++b) {
    t.hits += c.hits[b];
    t.accesses += c.accesses[b];
  }
  return t;
}

// One alpha's trace: the deduplicated keys of every batch (first-use order), and the same as a
// KeyTrace of cache keys for the analysis functions.
struct Trace {
  double alpha = 0;
  std::vector<UniqueKeys> unique;
  cache::KeyTrace keys;
  std::int64_t widest = 0;        // most unique rows in one batch
  std::int64_t total_unique = 0;  // unique (batch, row) pairs
  std::int64_t distinct_rows = 0;
  std::vector<std::int32_t> rank_of_key;  // 0-based Zipf rank (in its batch's epoch) of each entry of keys.keys
};

std::string alpha_str(double a) {
  std::ostringstream s;
  s << a;
  return s.str();
}

std::string dist_str(const StudyOptions& o, double alpha) {
  return o.drift > 0 ? "drift:" + alpha_str(alpha) + ":" + std::to_string(o.drift) : "zipf:" + alpha_str(alpha);
}

Result<Trace> make_trace(const StudyOptions& o, double alpha) {
  auto sampler = KeySampler::create(dist_str(o, alpha), o.rows, o.seed);
  if (!sampler.is_ok()) return sampler.status();
  KeySampler& s = sampler.value();
  Trace t;
  t.alpha = alpha;
  const std::int64_t n = o.batch * o.bag_size;
  std::vector<Key> keys(static_cast<std::size_t>(n));
  DedupScratch scratch;
  t.unique.resize(static_cast<std::size_t>(o.batches));
  t.keys.batch_offsets.push_back(0);
  std::vector<std::int32_t> rank_of_row(static_cast<std::size_t>(o.rows), -1);  // in the current batch
  std::vector<bool> seen(static_cast<std::size_t>(o.rows), false);
  for (std::int64_t b = 0; b < o.batches; ++b) {
    s.set_step(b);  // batch b is step b (moves the hot set under drift; a no-op otherwise)
    // As KeySampler::fill, keeping the rank of each row for the static-top reference.
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t rank = s.next_rank();
      const Key row = s.rank_to_row(rank);
      keys[static_cast<std::size_t>(i)] = row;
      rank_of_row[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(rank);
    }
    UniqueKeys& u = t.unique[static_cast<std::size_t>(b)];
    dedup_keys(keys.data(), n, u, scratch);
    // The planner only reads the unique rows; drop the CSR to keep the trace small.
    u.positions = {};
    u.offsets = {};
    // First-use order, one entry per distinct row: exactly what PerBatch::kDistinct counts.
    for (Key k : u.keys) {
      t.keys.keys.push_back(cache::cache_key(0, k));
      t.rank_of_key.push_back(rank_of_row[static_cast<std::size_t>(k)]);
      t.distinct_rows += !seen[static_cast<std::size_t>(k)];
      seen[static_cast<std::size_t>(k)] = true;
    }
    t.keys.batch_offsets.push_back(static_cast<std::int64_t>(t.keys.keys.size()));
    t.widest = std::max(t.widest, u.size());
  }
  t.total_unique = t.keys.num_keys();
  return t;
}

// Drives the real planner over the trace with the store's prefetcher: batch j is planned once
// batches j+1 .. j+K+W are in the window (K submitted, W previewed); each batch is retired
// (updated) before the next is planned.
// With `order`, also records the rows of each batch in the order the pool stamps their time of use
// (hits, then misses, each in first-use order), as a KeyTrace.
Result<BatchCounts> run_pool(const Trace& t, std::int64_t slots, cache::Policy policy, int lookahead, int preview,
                             double half_life, cache::KeyTrace* order = nullptr) {
  const int window = lookahead + preview;
  cache::CachePlannerOptions opt;
  opt.slots = slots;
  opt.policy = policy;
  opt.window = window + 1;
  if (half_life > 0) opt.half_life = std::max<std::int64_t>(1, std::llround(half_life * static_cast<double>(slots)));
  opt.record_bytes = 0;
  opt.name = "study";
  opt.tables = {{"t", 0}};
  using Prefetcher = cache::BasicPrefetcher<cache::CachePlanner>;
  Prefetcher prefetcher(lookahead, 1);
  prefetcher.add_pool(std::make_unique<cache::CachePlanner>(std::move(opt)), {0});
  prefetcher.set_executor(&Prefetcher::plan_only());  // plans only: no device, nothing moves
  const std::int64_t B = static_cast<std::int64_t>(t.unique.size());
  BatchCounts c;
  c.hits.resize(static_cast<std::size_t>(B));
  c.accesses.resize(static_cast<std::size_t>(B));
  // The batches submitted and not yet retired (at most K + 1), by id modulo K + 1.
  std::vector<Prefetcher::Batch> ring(static_cast<std::size_t>(lookahead) + 1);
  auto batch = [&](std::int64_t j) -> Prefetcher::Batch& {
    return ring[static_cast<std::size_t>(j % (lookahead + 1))];
  };
  std::int64_t previewed = 0, submitted = 0;
  for (std::int64_t j = 0; j < B; ++j) {
    // Batches up to j + K + W previewed (a no-op unless the policy has a window), up to j + K
    // submitted: the last submit plans batch j, or plan() does once none is left to submit.
    for (; previewed < B && previewed <= j + window && preview > 0; ++previewed)
      prefetcher.preview(previewed, {0}, {t.unique[static_cast<std::size_t>(previewed)]});
    for (; submitted < B && submitted <= j + lookahead; ++submitted) {
      Prefetcher::Batch& b = batch(submitted);
      b.id = submitted;
      b.keys = {{0, &t.unique[static_cast<std::size_t>(submitted)]}};
      STRATA_RETURN_IF_ERROR(prefetcher.submit(b));
    }
    Prefetcher::Batch& b = batch(j);
    STRATA_RETURN_IF_ERROR(prefetcher.plan(b));
    const cache::PoolPlan& plan = b.parts[0].plan;
    if (order) {
      // A row missed iff it is filled: its slot is one of the fills'.
      if (order->batch_offsets.empty()) order->batch_offsets.push_back(0);
      const auto& u = t.unique[static_cast<std::size_t>(j)].keys;
      std::vector<bool> missed(u.size(), false);
      std::unordered_set<Key> filled;
      for (const cache::Transfer& f : plan.fills) filled.insert(f.slot);
      for (std::size_t i = 0; i < u.size(); ++i) missed[i] = filled.count(plan.unique_slots[0][i]) > 0;
      for (std::size_t i = 0; i < u.size(); ++i)
        if (!missed[i]) order->keys.push_back(cache::cache_key(0, u[i]));
      for (std::size_t i = 0; i < u.size(); ++i)
        if (missed[i]) order->keys.push_back(cache::cache_key(0, u[i]));
      order->batch_offsets.push_back(static_cast<std::int64_t>(order->keys.size()));
    }
    c.hits[static_cast<std::size_t>(j)] = plan.hits;
    c.accesses[static_cast<std::size_t>(j)] = plan.hits + plan.misses;
    prefetcher.retire(b, true);
  }
  const cache::CacheStats st = prefetcher.planner(0).pool_stats();
  if (st.accesses != t.total_unique)
    return Status::internal("pool counted " + std::to_string(st.accesses) + " accesses, trace has " +
                            std::to_string(t.total_unique));
  return c;
}

// Belady's MIN in the per-batch distinct model, batch by batch, so that hits after the warm-up can
// be counted. Same algorithm as cache::belady_hits; keys with the same next use may be evicted in
// another order (ids here are rows), which can move hits between batches but not change the total
// (the optimum), and the caller checks that the totals agree.
BatchCounts belady_per_batch(const Trace& t, std::int64_t rows, std::int64_t capacity) {
  constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
  const auto& off = t.keys.batch_offsets;
  const std::int64_t B = t.keys.num_batches();
  const std::int64_t n = t.keys.num_keys();
  // One table: the row is a dense id.
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    ids[static_cast<std::size_t>(i)] = cache::cache_key_row(t.keys.keys[static_cast<std::size_t>(i)]);
  std::vector<std::int64_t> next_use(static_cast<std::size_t>(n));
  std::vector<std::int64_t> next_batch(static_cast<std::size_t>(rows), kNever);
  for (std::int64_t b = B - 1; b >= 0; --b)
    for (std::int64_t i = off[b]; i < off[b + 1]; ++i) {
      next_use[i] = next_batch[ids[i]];
      next_batch[ids[i]] = b;
    }
  std::vector<std::int64_t> resident_next(static_cast<std::size_t>(rows), -1);
  std::priority_queue<std::pair<std::int64_t, std::int64_t>> heap;
  std::int64_t resident = 0;
  BatchCounts c;
  c.hits.resize(static_cast<std::size_t>(B));
  c.accesses.resize(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t hits = 0;
    for (std::int64_t i = off[b]; i < off[b + 1]; ++i) hits += resident_next[ids[i]] >= 0;
    c.hits[b] = hits;
    c.accesses[b] = off[b + 1] - off[b];
    for (std::int64_t evict = resident + (c.accesses[b] - hits) - capacity; evict > 0;) {
      const auto [next, id] = heap.top();
      heap.pop();
      if (resident_next[id] != next) continue;
      resident_next[id] = -1;
      --resident;
      --evict;
    }
    for (std::int64_t i = off[b]; i < off[b + 1]; ++i) {
      if (resident_next[ids[i]] < 0) ++resident;
      resident_next[ids[i]] = next_use[i];
      heap.emplace(next_use[i], ids[i]);
    }
  }
  return c;
}

// Results of one (alpha, capacity) cell.
struct Cell {
  double alpha = 0, fraction = 0;
  std::int64_t slots = 0;
  bool feasible = true;
  std::string note;
  std::vector<std::pair<std::string, Totals>> policies;      // after warm-up
  std::vector<std::pair<std::string, Totals>> policies_all;  // all batches
  Totals belady, belady_all, lru_exact, lru_exact_all;
  Totals static_top, static_top_all;  // the c most probable rows always resident (a reference)
  std::int64_t belady_library_hits = -1;
  std::int64_t pool_lru_hits_all = -1;    // CachePlanner lru, all batches
  std::int64_t lru_pool_order_hits = -1;  // lru_curve on the pool's within-batch order (--check-lru-order)
};

// Runs jobs on `threads` threads; each job reports its own errors.
void run_jobs(std::vector<std::function<void()>>& jobs, int threads) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) jobs[i]();
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

double pp(double a, double b) { return (a - b) * 100.0; }

// One run of the study: its options, traces and cells, and what the checks found.
struct Study {
  explicit Study(const StudyOptions& opts) : o(opts) {}
  const StudyOptions& o;
  std::vector<cache::Policy> policies;
  int threads = 1;
  std::int64_t warm = 0;  // batches not counted
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::vector<Trace> traces;  // one per alpha
  nlohmann::json trace_info = nlohmann::json::array();
  std::vector<Cell> cells;
  std::vector<std::size_t> cell_alpha;  // index into traces
  // Exact LRU of the whole trace and of the warm-up prefix, per alpha: LRU is online, so the hits
  // after the warm-up are the difference.
  std::vector<cache::LruCurve> curve_all, curve_warm;
  std::mutex mu;      // guards error and the progress lines
  std::string error;  // the first job's error
  std::atomic<int> done{0};
  int total_jobs = 0;
  double max_lru_diff_pp = 0;
  std::int64_t max_lru_diff_hits = 0;
  bool lru_order_checked = false;
  std::int64_t lru_order_max_diff = 0;

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  // A job's progress line (with --progress).
  void report(const std::string& what, std::chrono::steady_clock::time_point start) {
    if (!o.progress) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> g(mu);
    std::fprintf(stderr, "[%6.1fs] %-40s done in %5.2fs (%d/%d)\n", elapsed(), what.c_str(), secs, ++done, total_jobs);
  }
  // Records a job's error (the last one wins, as any one stops the run).
  void fail(const std::string& message) {
    std::lock_guard<std::mutex> g(mu);
    error = message;
  }
};

// The policies by name, the threads and the warm-up; an exit code when a policy is unknown.
int set_up(Study& s) {
  const StudyOptions& o = s.o;
  for (const auto& name : o.policies) {
    auto p = cache::parse_policy(name);
    if (!p.is_ok()) {
      std::cerr << "strata-hitrate: " << p.status().to_string() << "\n";
      return 2;
    }
    s.policies.push_back(p.value());
  }
  s.threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  s.warm = static_cast<std::int64_t>(std::floor(o.warmup * static_cast<double>(o.batches)));
  return 0;
}

// The traces, one per alpha, generated in parallel, and their summary for the JSON.
int generate_traces(Study& s) {
  const StudyOptions& o = s.o;
  s.traces.resize(o.alphas.size());
  std::vector<std::function<void()>> gen;
  for (std::size_t a = 0; a < o.alphas.size(); ++a)
    gen.push_back([&s, &o, a] {
      const auto start = std::chrono::steady_clock::now();
      auto tr = make_trace(o, o.alphas[a]);
      std::lock_guard<std::mutex> g(s.mu);
      if (!tr.is_ok()) {
        s.error = tr.status().to_string();
        return;
      }
      s.traces[a] = std::move(tr).value();
      if (o.progress)
        std::fprintf(stderr, "[%6.1fs] alpha %s: %lld batches generated in %5.2fs\n", s.elapsed(),
                     alpha_str(o.alphas[a]).c_str(), static_cast<long long>(o.batches),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    });
  run_jobs(gen, s.threads);
  if (!s.error.empty()) {
    std::cerr << "strata-hitrate: " << s.error << "\n";
    return 2;
  }
  for (const Trace& t : s.traces)
    s.trace_info.push_back(
        {{"alpha", t.alpha},
         {"unique_per_batch_max", t.widest},
         {"unique_per_batch_mean", static_cast<double>(t.total_unique) / static_cast<double>(o.batches)},
         {"unique_accesses", t.total_unique},
         {"distinct_rows", t.distinct_rows}});
  return 0;
}

// One cell per (alpha, capacity); infeasible where a batch has more unique rows than the slots.
void make_cells(Study& s) {
  const StudyOptions& o = s.o;
  for (std::size_t a = 0; a < o.alphas.size(); ++a)
    for (double f : o.capacities) {
      Cell cell;
      cell.alpha = o.alphas[a];
      cell.fraction = f;
      cell.slots = std::llround(f * static_cast<double>(o.rows));
      if (cell.slots < s.traces[a].widest) {
        cell.feasible = false;
        cell.note = "a batch has up to " + std::to_string(s.traces[a].widest) + " unique rows, more than the " +
                    std::to_string(cell.slots) + " slots";
      }
      cell.policies.resize(s.policies.size());
      cell.policies_all.resize(s.policies.size());
      s.cells.push_back(cell);
      s.cell_alpha.push_back(a);
    }
}

std::string cell_name(const Cell& c) {
  return "alpha " + alpha_str(c.alpha) + " cap " + alpha_str(c.fraction * 100) + "%: ";
}

// The exact LRU curves of trace `a`, of the whole trace and of its warm-up prefix.
void lru_curves_job(Study& s, std::size_t a) {
  const auto start = std::chrono::steady_clock::now();
  const Trace& t = s.traces[a];
  auto c = cache::lru_curve(t.keys, cache::PerBatch::kDistinct);
  cache::KeyTrace prefix;
  prefix.batch_offsets.assign(t.keys.batch_offsets.begin(), t.keys.batch_offsets.begin() + s.warm + 1);
  prefix.keys.assign(t.keys.keys.begin(), t.keys.keys.begin() + prefix.batch_offsets.back());
  auto w = cache::lru_curve(prefix, cache::PerBatch::kDistinct);
  if (!c.is_ok() || !w.is_ok()) return s.fail("lru_curve: " + (c.is_ok() ? w.status() : c.status()).to_string());
  s.curve_all[a] = std::move(c).value();
  s.curve_warm[a] = std::move(w).value();
  s.report("alpha " + alpha_str(t.alpha) + ": lru_curve", start);
}

// Cell `ci` under policy `pi`: the CachePlanner's hits (and, --check-lru-order, lru_curve on the
// pool's own order).
void policy_job(Study& s, std::size_t ci, std::size_t pi) {
  const auto start = std::chrono::steady_clock::now();
  const StudyOptions& o = s.o;
  const Trace& t = s.traces[s.cell_alpha[ci]];
  Cell& c = s.cells[ci];
  const cache::Policy policy = s.policies[pi];
  const bool check = o.check_lru_order && policy == cache::Policy::kLru;
  cache::KeyTrace order;
  auto r = run_pool(t, c.slots, policy, o.lookahead, o.preview, o.half_life, check ? &order : nullptr);
  if (!r.is_ok())
    return s.fail(std::string("CachePlanner ") + cache::to_string(policy) + ": " + r.status().to_string());
  if (policy == cache::Policy::kLru) c.pool_lru_hits_all = sum_from(r.value(), 0).hits;
  if (check) {
    auto curve = cache::lru_curve(order, cache::PerBatch::kDistinct);
    if (!curve.is_ok()) return s.fail("lru_curve (pool order): " + curve.status().to_string());
    c.lru_pool_order_hits = curve.value().hits_at(c.slots);
  }
  c.policies[pi] = {cache::to_string(policy), sum_from(r.value(), s.warm)};
  c.policies_all[pi] = {cache::to_string(policy), sum_from(r.value(), 0)};
  s.report(cell_name(c) + cache::to_string(policy), start);
}

// Cell `ci`'s Belady optimum, per batch and by cache::belady_hits (which must agree).
void belady_job(Study& s, std::size_t ci) {
  const auto start = std::chrono::steady_clock::now();
  const Trace& t = s.traces[s.cell_alpha[ci]];
  Cell& c = s.cells[ci];
  auto lib = cache::belady_hits(t.keys, c.slots);
  if (!lib.is_ok()) return s.fail("belady_hits: " + lib.status().to_string());
  const BatchCounts b = belady_per_batch(t, s.o.rows, c.slots);
  c.belady = sum_from(b, s.warm);
  c.belady_all = sum_from(b, 0);
  c.belady_library_hits = lib.value().hits;
  s.report(cell_name(c) + "belady", start);
}

// Every (alpha, capacity, policy) run, Belady per cell and the LRU curves per alpha, on the
// study's threads, the longest jobs first (which balances the threads).
int run_cells(Study& s) {
  struct Job {
    int order;  // lower runs first
    std::function<void()> run;
  };
  std::vector<Job> jobs;
  s.curve_all.resize(s.traces.size());
  s.curve_warm.resize(s.traces.size());
  for (std::size_t a = 0; a < s.traces.size(); ++a) jobs.push_back({1, [&s, a] { lru_curves_job(s, a); }});
  for (std::size_t ci = 0; ci < s.cells.size(); ++ci) {
    if (!s.cells[ci].feasible) continue;
    for (std::size_t pi = 0; pi < s.policies.size(); ++pi)
      jobs.push_back({s.policies[pi] == cache::Policy::kLookahead ? 0 : 2, [&s, ci, pi] { policy_job(s, ci, pi); }});
    jobs.push_back({1, [&s, ci] { belady_job(s, ci); }});
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& x, const Job& y) { return x.order < y.order; });
  std::vector<std::function<void()>> runs;
  for (auto& j : jobs) runs.push_back(std::move(j.run));
  s.total_jobs = static_cast<int>(runs.size());
  run_jobs(runs, s.threads);
  if (!s.error.empty()) {
    std::cerr << "strata-hitrate: " << s.error << "\n";
    return 1;
  }
  return 0;
}

// The checks (the two Belady counts agree; CachePlanner lru against exact LRU) and the references
// (exact LRU, the static top rows) of every feasible cell.
int check_cells(Study& s) {
  const StudyOptions& o = s.o;
  for (std::size_t ci = 0; ci < s.cells.size(); ++ci) {
    Cell& c = s.cells[ci];
    if (!c.feasible) continue;
    const std::size_t a = s.cell_alpha[ci];
    const Trace& t = s.traces[a];
    if (c.belady_library_hits != c.belady_all.hits) {
      std::cerr << "strata-hitrate: per-batch Belady counted " << c.belady_all.hits << " hits, cache::belady_hits "
                << c.belady_library_hits << " (alpha " << c.alpha << ", " << c.slots << " slots)\n";
      return 1;
    }
    c.lru_exact_all = {s.curve_all[a].hits_at(c.slots), s.curve_all[a].accesses()};
    c.lru_exact = {s.curve_all[a].hits_at(c.slots) - s.curve_warm[a].hits_at(c.slots),
                   s.curve_all[a].accesses() - s.curve_warm[a].accesses()};
    for (std::int64_t b = 0; b < o.batches; ++b) {
      std::int64_t hits = 0;
      for (std::int64_t i = t.keys.batch_offsets[static_cast<std::size_t>(b)];
           i < t.keys.batch_offsets[static_cast<std::size_t>(b) + 1]; ++i)
        hits += t.rank_of_key[static_cast<std::size_t>(i)] < c.slots;
      const std::int64_t acc = t.unique[static_cast<std::size_t>(b)].size();
      c.static_top_all.hits += hits;
      c.static_top_all.accesses += acc;
      if (b >= s.warm) {
        c.static_top.hits += hits;
        c.static_top.accesses += acc;
      }
    }
    if (c.lru_pool_order_hits >= 0) {
      s.lru_order_checked = true;
      s.lru_order_max_diff = std::max(s.lru_order_max_diff, std::abs(c.lru_pool_order_hits - c.pool_lru_hits_all));
    }
    for (std::size_t pi = 0; pi < s.policies.size(); ++pi) {
      if (s.policies[pi] != cache::Policy::kLru) continue;
      s.max_lru_diff_pp = std::max(s.max_lru_diff_pp, std::abs(pp(c.policies[pi].second.rate(), c.lru_exact.rate())));
      s.max_lru_diff_hits =
          std::max(s.max_lru_diff_hits, std::abs(c.policies_all[pi].second.hits - c.lru_exact_all.hits));
    }
  }
  return 0;
}

// The console table: every cell's hit rate under each policy and the references.
void print_table(const Study& s) {
  const StudyOptions& o = s.o;
  std::printf(
      "\nstrata-hitrate: 1 table x %lld rows, batch %lld bags x %d keys (%lld lookups), %lld batches, seed %llu, %s\n",
      static_cast<long long>(o.rows), static_cast<long long>(o.batch), o.bag_size,
      static_cast<long long>(o.batch * o.bag_size), static_cast<long long>(o.batches),
      static_cast<unsigned long long>(o.seed),
      (o.drift > 0 ? "drift:ALPHA:" + std::to_string(o.drift) : std::string("zipf:ALPHA")).c_str());
  std::printf(
      "lookahead window: K = %d submitted + W = %d previewed batches; frequency half-life %s; hit rates per unique "
      "(batch, row) over batches [%lld, %lld) (first %g%% are warm-up)\n\n",
      o.lookahead, o.preview,
      o.half_life > 0 ? (alpha_str(o.half_life) + " x slots").c_str()
                      : (std::to_string(cache::kDefaultHalfLifeSlots) + " x slots (default)").c_str(),
      static_cast<long long>(s.warm), static_cast<long long>(o.batches), o.warmup * 100);
  std::printf("%-6s %-6s %8s", "alpha", "cache", "slots");
  for (const auto& p : o.policies) std::printf(" %9s", p.c_str());
  std::printf(" %9s %9s %10s %12s\n", "lru_exact", "belady", "static_top", "la-gap(pp)");
  for (const Cell& c : s.cells) {
    std::printf("%-6s %5g%% %8lld", alpha_str(c.alpha).c_str(), c.fraction * 100, static_cast<long long>(c.slots));
    if (!c.feasible) {
      std::printf("  infeasible: %s\n", c.note.c_str());
      continue;
    }
    double la = -1;
    for (const auto& [name, tot] : c.policies) {
      std::printf(" %8.2f%%", tot.rate() * 100);
      if (name == "lookahead") la = tot.rate();
    }
    std::printf(" %8.2f%% %8.2f%% %9.2f%%", c.lru_exact.rate() * 100, c.belady.rate() * 100, c.static_top.rate() * 100);
    if (la >= 0) std::printf(" %12.2f", pp(c.belady.rate(), la));
    std::printf("\n");
  }
  std::printf(
      "\nstatic_top: hits if the cache always held the `slots` most probable rows (true Zipf ranks): a\n"
      "frequency oracle for reference, not a policy (no compulsory misses, no room kept for a batch's\n"
      "misses, so it can exceed belady). la-gap = belady - lookahead.\n");
  std::printf(
      "CachePlanner lru vs exact LRU (lru_curve kDistinct): max difference %.4f pp after warm-up, %lld hits over all "
      "batches\n",
      s.max_lru_diff_pp, static_cast<long long>(s.max_lru_diff_hits));
  if (s.lru_order_checked)
    std::printf("lru_curve on the pool's own within-batch order (hits, then misses): max difference %lld hits (%s)\n",
                static_cast<long long>(s.lru_order_max_diff), s.lru_order_max_diff == 0 ? "exact" : "MISMATCH");
  else if (s.max_lru_diff_hits != 0)
    std::printf(
        "(the pool stamps a batch's hits before its misses, lru_curve orders a batch by first use; run with\n"
        " --check-lru-order to compare against lru_curve on the pool's order)\n");
}

// The study's two targets over the feasible cells: lookahead at least as good as lru and lfu, and
// within 3 pp of Belady at capacities of 5% and more.
struct Targets {
  bool ge_ok = true, gap_ok = true, have_la = false, have_other = false;
  nlohmann::json cells = nlohmann::json::array();
};

Targets evaluate_targets(const Study& s) {
  Targets t;
  for (const Cell& c : s.cells) {
    if (!c.feasible) continue;
    double la = -1, best_other = -1;
    for (const auto& [name, tot] : c.policies) {
      if (name == "lookahead")
        la = tot.rate();
      else
        best_other = std::max(best_other, tot.rate());
    }
    if (la < 0) continue;
    t.have_la = true;
    t.have_other = t.have_other || best_other >= 0;
    const bool ge = best_other < 0 || la >= best_other;
    const double gap = pp(c.belady.rate(), la);
    const bool gap_applies = c.fraction >= 0.05 - 1e-9;
    const bool within = !gap_applies || gap <= 3.0;
    t.ge_ok = t.ge_ok && ge;
    t.gap_ok = t.gap_ok && within;
    t.cells.push_back({{"alpha", c.alpha},
                       {"capacity_fraction", c.fraction},
                       {"lookahead_minus_best_other_pp",
                        best_other < 0 ? nlohmann::json(nullptr) : nlohmann::json(pp(la, best_other))},
                       {"lookahead_ge_lru_lfu", ge},
                       {"gap_pp", gap},
                       {"within_3pp", gap_applies ? nlohmann::json(within) : nlohmann::json(nullptr)}});
  }
  return t;
}

// The targets on the console, and the cells that missed them or were infeasible.
void print_targets(const Study& s, const Targets& t) {
  const bool have_other = t.have_other, ge_ok = t.ge_ok, gap_ok = t.gap_ok;
  const nlohmann::json& target_cells = t.cells;
  if (t.have_la) {
    std::printf("target 1: lookahead >= max(lru, lfu) in every feasible cell: %s\n",
                !have_other ? "not evaluated (run lru and lfu too)"
                : ge_ok     ? "HOLDS"
                            : "MISSED");
    for (const auto& tc : target_cells)
      if (!tc["lookahead_ge_lru_lfu"].get<bool>())
        std::printf("  alpha %s cap %g%%: lookahead %+.2f pp vs best of lru/lfu\n",
                    alpha_str(tc["alpha"].get<double>()).c_str(), tc["capacity_fraction"].get<double>() * 100,
                    tc["lookahead_minus_best_other_pp"].get<double>());
    std::printf("target 2: lookahead within 3 pp of Belady at capacity >= 5%%: %s\n", gap_ok ? "HOLDS" : "MISSED");
    for (const auto& tc : target_cells)
      if (tc["within_3pp"].is_boolean() && !tc["within_3pp"].get<bool>())
        std::printf("  alpha %s cap %g%%: gap %.2f pp\n", alpha_str(tc["alpha"].get<double>()).c_str(),
                    tc["capacity_fraction"].get<double>() * 100, tc["gap_pp"].get<double>());
  }
  for (const Cell& c : s.cells)
    if (!c.feasible)
      std::printf("note: alpha %s cap %g%% is infeasible (not counted in the targets)\n", alpha_str(c.alpha).c_str(),
                  c.fraction * 100);
}

// The JSON's trace: how the keys were drawn and the study driven.
nlohmann::json trace_json(const Study& s) {
  const StudyOptions& o = s.o;
  return {{"generator", "bench::KeySampler zipf:ALPHA (rejection-inversion; ranks scattered by RowPermutation)"},
          {"tables", 1},
          {"rows", o.rows},
          {"batch", o.batch},
          {"bag_size", o.bag_size},
          {"lookups_per_batch", o.batch * o.bag_size},
          {"batches", o.batches},
          {"seed", o.seed},
          {"lookahead", o.lookahead},
          {"preview", o.preview},
          {"window", o.lookahead + o.preview},
          {"distribution", o.drift > 0 ? "drift:ALPHA:" + std::to_string(o.drift) : std::string("zipf:ALPHA")},
          {"half_life_slots", o.half_life > 0 ? o.half_life : static_cast<double>(cache::kDefaultHalfLifeSlots)},
          {"warmup_fraction", o.warmup},
          {"warmup_batches", s.warm},
          {"counted", "unique (batch, row) accesses of batches [warmup_batches, batches)"},
          {"driver",
           "CachePlanner, one table, no device: window_push up to batch j+K+W, probe(j), commit, retire(plan, "
           "updated=true)"},
          {"per_alpha", s.trace_info}};
}

// The JSON's results: every cell under each policy and the references.
nlohmann::json results_json(const Study& s) {
  const StudyOptions& o = s.o;
  nlohmann::json results = nlohmann::json::array();
  for (const Cell& c : s.cells) {
    auto row = [&](const std::string& policy, const Totals& t, const Totals& all) {
      nlohmann::json r = {
          {"alpha", c.alpha}, {"capacity_fraction", c.fraction}, {"capacity_rows", c.slots}, {"policy", policy}};
      if (!c.feasible) {
        r["feasible"] = false;
        r["note"] = c.note;
        r["hit_rate"] = nullptr;
        r["belady_hit_rate"] = nullptr;
        r["gap_pp"] = nullptr;
      } else {
        r["feasible"] = true;
        r["hit_rate"] = t.rate();
        r["belady_hit_rate"] = c.belady.rate();
        r["gap_pp"] = pp(c.belady.rate(), t.rate());
        r["hits"] = t.hits;
        r["accesses"] = t.accesses;
        r["hit_rate_all"] = all.rate();
        r["belady_hit_rate_all"] = c.belady_all.rate();
      }
      results.push_back(r);
    };
    for (std::size_t pi = 0; pi < s.policies.size(); ++pi)
      row(o.policies[pi], c.feasible ? c.policies[pi].second : Totals{},
          c.feasible ? c.policies_all[pi].second : Totals{});
    row("lru_exact", c.lru_exact, c.lru_exact_all);
    row("belady", c.belady, c.belady_all);
    row("static_top", c.static_top, c.static_top_all);
  }
  return results;
}

// Writes --json; an exit code when it cannot.
int write_json(const Study& s, const Targets& t) {
  const StudyOptions& o = s.o;
  nlohmann::json j;
  j["trace"] = trace_json(s);
  j["results"] = results_json(s);
  j["lru_check"] = {{"max_abs_diff_pp", s.max_lru_diff_pp}, {"max_abs_diff_hits_all_batches", s.max_lru_diff_hits}};
  if (s.lru_order_checked) j["lru_check"]["pool_order_max_abs_diff_hits_all_batches"] = s.lru_order_max_diff;
  if (t.have_la)
    j["targets"] = {
        {"lookahead_ge_max_lru_lfu_every_cell", t.have_other ? nlohmann::json(t.ge_ok) : nlohmann::json(nullptr)},
        {"lookahead_within_3pp_of_belady_at_5_and_20_percent", t.gap_ok},
        {"cells", t.cells}};
  j["elapsed_s"] = s.elapsed();
  std::ofstream f(o.json_out);
  f << j.dump(2) << "\n";
  if (!f) {
    std::cerr << "strata-hitrate: cannot write " << o.json_out << "\n";
    return 1;
  }
  return 0;
}

int run(const StudyOptions& o) {
  Study s(o);
  if (const int code = set_up(s)) return code;
  if (const int code = generate_traces(s)) return code;
  make_cells(s);
  if (const int code = run_cells(s)) return code;
  if (const int code = check_cells(s)) return code;
  print_table(s);
  const Targets t = evaluate_targets(s);
  print_targets(s, t);
  if (!o.json_out.empty())
    if (const int code = write_json(s, t)) return code;
  if (o.progress) std::fprintf(stderr, "[%6.1fs] done\n", s.elapsed());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::StudyOptions o;
  CLI::App app{
      "strata-hitrate: hit rates of the cache planner (CachePlanner lru/lfu/lookahead) vs exact LRU and Belady on Zipf "
      "traces"};
  app.add_option("--rows", o.rows, "rows of the table")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "bags per batch")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--bag-size", o.bag_size, "keys per bag")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batches", o.batches, "batches in the trace")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--alphas", o.alphas, "Zipf exponents")->capture_default_str()->delimiter(',');
  app.add_option("--capacities", o.capacities, "cache sizes as fractions of the rows")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--policies", o.policies, "policies to run (lru, lfu, lookahead)")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--lookahead", o.lookahead, "K: batches in the window beyond the one being planned")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--preview", o.preview,
                 "W: batches previewed (Store::preview) beyond the K submitted ones; the window holds K + W batches")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--drift", o.drift,
                 "draw drift:ALPHA:N with N = this (the hot rows move every N batches); 0: zipf:ALPHA")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--half-life", o.half_life,
                 "lookahead: half-life of the frequency of rows with no use in the window, in multiples of the cache "
                 "slots (0: the pool's default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "fraction of the batches run but not counted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--seed", o.seed, "seed of the keys")->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0: all cores)")->capture_default_str();
  app.add_option("--json", o.json_out, "write the results as JSON to this file");
  app.add_flag("!--no-progress", o.progress, "no progress on stderr");
  app.add_flag("--check-lru-order", o.check_lru_order,
               "also feed lru_curve the rows of each batch in the order CachePlanner stamps them (hits, then misses); "
               "its hit count must equal the pool's lru exactly");
  CLI11_PARSE(app, argc, argv);
  if (o.rows > std::numeric_limits<std::int32_t>::max()) {
    std::cerr << "strata-hitrate: --rows must be below 2^31\n";
    return 2;
  }
  if (static_cast<double>(o.batch) * o.bag_size >= 2147483647.0) {
    std::cerr << "strata-hitrate: --batch x --bag-size must be below 2^31\n";
    return 2;
  }
  return strata::bench::run(o);
}
