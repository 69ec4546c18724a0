#include "tune/capacity.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <unordered_set>

#include "host/dedup.hpp"
#include "toolkit/workload.hpp"
#include "tune/curves.hpp"
#include "tune/text.hpp"

namespace strata::tune {

Status check_capacity_options(const CapacityOptions& o) {
  const DynamicSpec& d = o.dynamic;
  if (d.admit_after < 1 || d.admit_after > kMaxAdmitAfter)
    return Status::invalid_argument("--admit-after " + std::to_string(d.admit_after) + " (expected in [1, " +
                                    std::to_string(kMaxAdmitAfter) + "])");
  if (d.evict_after_steps < 0 || d.evict_after_steps >= (std::int64_t{1} << 62))
    return Status::invalid_argument("--evict-after-steps " + std::to_string(d.evict_after_steps) +
                                    " (expected in [0, 2^62): 0 for no TTL)");
  if (d.eviction != Eviction::kLru && d.eviction != Eviction::kLfu)
    return Status::invalid_argument("--eviction " + std::to_string(static_cast<int>(d.eviction)) +
                                    " (expected lru or lfu)");
  for (const std::int64_t c : o.capacities)
    if (c < 1 || c > kMaxDynamicCapacity)
      return Status::invalid_argument("--capacities: capacity " + std::to_string(c) + " (expected in [1, " +
                                      std::to_string(kMaxDynamicCapacity) + "])");
  if (o.points < 2 || o.points > kMaxCurvePoints)
    return Status::invalid_argument("--points " + std::to_string(o.points) + " (expected in [2, " +
                                    std::to_string(kMaxCurvePoints) + "])");
  if (!(o.tolerance >= 0.0 && o.tolerance <= 1.0))
    return Status::invalid_argument("--tolerance " + percent_text(o.tolerance) + " (expected in [0, 100] points)");
  if (o.refine < 0 || o.refine > kMaxCurvePoints)
    return Status::invalid_argument("--refine " + std::to_string(o.refine) + " (expected in [0, " +
                                    std::to_string(kMaxCurvePoints) + "])");
  if (o.in_flight < 1)
    return Status::invalid_argument("--in-flight " + std::to_string(o.in_flight) + " (expected >= 1)");
  return Status::ok();
}

double TableCapacity::fraction(std::int64_t part) const noexcept {
  return uses > 0 ? static_cast<double>(part) / static_cast<double>(uses) : 0.0;
}

double TableCapacity::late_growth() const noexcept {
  const auto n = static_cast<std::int64_t>(distinct_by_step.size());
  if (n == 0) return 0.0;
  const std::int64_t span = std::max<std::int64_t>(1, n / 10);
  const std::int64_t before = n - span - 1 >= 0 ? distinct_by_step[static_cast<std::size_t>(n - span - 1)] : 0;
  return static_cast<double>(distinct_by_step.back() - before) / static_cast<double>(span);
}

std::vector<std::int64_t> default_capacities(std::int64_t max_step_distinct, std::int64_t distinct, int points) {
  std::vector<std::int64_t> out;
  if (distinct <= 0) return out;
  const std::int64_t hi = std::min(distinct, kMaxDynamicCapacity);
  const std::int64_t lo = std::clamp<std::int64_t>(max_step_distinct, 1, hi);
  for (int i = 0; i < points; ++i) {
    const double f = points > 1 ? static_cast<double>(i) / (points - 1) : 1.0;
    const double c = std::exp(std::log(static_cast<double>(lo)) * (1.0 - f) + std::log(static_cast<double>(hi)) * f);
    out.push_back(std::clamp<std::int64_t>(std::llround(c), lo, hi));
  }
  out.back() = hi;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int recommend(const TableCapacity& t, double tolerance) {
  if (t.unbounded < 0) return -1;
  const CapacityRun& u = t.runs[static_cast<std::size_t>(t.unbounded)];
  const double target = t.fraction(u.hits) - tolerance;
  for (std::size_t i = 0; i < t.runs.size(); ++i) {
    const CapacityRun& r = t.runs[i];
    // Exact at tolerance 0 (hits as integers): the unbounded run itself always qualifies.
    if (r.refused_batches == 0 && (r.hits >= u.hits || t.fraction(r.hits) >= target)) return static_cast<int>(i);
  }
  return t.unbounded;
}

namespace {

// One table's keys of a batch as the store serves a dynamic table (features.hpp's merge): its features bag by bag,
// then distinct in first-use order with their uses.
class TableKeys {
 public:
  explicit TableKeys(std::vector<std::size_t> features) : features_(std::move(features)) {}

  void take(const KeyBatch& b) {
    merged_.clear();
    if (features_.size() == 1) {
      if (features_.front() < b.features.size()) {
        const JaggedKeys& f = b.features[features_.front()];
        dedup_keys(f, unique_, scratch_, DedupOrder::kFirstUse);
      } else {
        dedup_keys(merged_.data(), 0, unique_, scratch_, DedupOrder::kFirstUse);
      }
    } else {
      std::int64_t bags = 0;
      for (const std::size_t i : features_)
        if (i < b.features.size()) bags = std::max(bags, b.features[i].batch_size());
      for (std::int64_t bag = 0; bag < bags; ++bag)
        for (const std::size_t i : features_) {
          if (i >= b.features.size() || bag >= b.features[i].batch_size()) continue;
          const JaggedKeys& f = b.features[i];
          for (std::int64_t j = f.offset(bag); j < f.offset(bag + 1); ++j) merged_.push_back(f.key(j));
        }
      dedup_keys(merged_.data(), static_cast<std::int64_t>(merged_.size()), unique_, scratch_, DedupOrder::kFirstUse);
    }
    uses_.resize(unique_.keys.size());
    total_ = 0;
    for (std::size_t i = 0; i < uses_.size(); ++i) {
      uses_[i] = unique_.offsets[i + 1] - unique_.offsets[i];
      total_ += uses_[i];
    }
  }
  const std::vector<Key>& keys() const noexcept { return unique_.keys; }
  const std::vector<std::int64_t>& uses() const noexcept { return uses_; }
  std::int64_t total() const noexcept { return total_; }

 private:
  std::vector<std::size_t> features_;
  std::vector<Key> merged_;
  UniqueKeys unique_;
  DedupScratch scratch_;
  std::vector<std::int64_t> uses_;
  std::int64_t total_ = 0;
};

// One (table, capacity) replay.
struct Replay {
  std::size_t table = 0;
  std::unique_ptr<KeyIndex> index;
  std::deque<std::vector<std::int64_t>> in_flight;  // rows of the batches still pinned, oldest first
  std::vector<std::int64_t> rows;
  std::vector<std::pair<std::int64_t, Key>> created;
  CapacityRun run;

  void train(const TableKeys& k, int max_in_flight) {
    Status s = index->train(k.keys(), k.uses(), rows, created);
    bool deferred = false;
    while (!s.is_ok() && !in_flight.empty()) {
      index->release(in_flight.front());
      in_flight.pop_front();
      deferred = true;
      s = index->train(k.keys(), k.uses(), rows, created);
    }
    if (!s.is_ok()) {
      STRATA_CHECK(s.code() == StatusCode::kResourceExhausted);
      ++run.refused_batches;
      run.refused += k.total();
      return;
    }
    run.deferred_batches += deferred ? 1 : 0;
    // `created` lists the admitted keys in first-use order, as they come in `keys`.
    std::size_t next = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::int64_t u = k.uses()[i];
      if (rows[i] == KeyIndex::kNone) {
        run.not_admitted += u;
      } else if (next < created.size() && created[next].second == k.keys()[i]) {
        run.admitted += u;
        ++next;
      } else {
        run.hits += u;
      }
    }
    in_flight.push_back(std::move(rows));
    rows = {};
    while (static_cast<int>(in_flight.size()) >= max_in_flight) {
      index->release(in_flight.front());
      in_flight.pop_front();
    }
  }
};

// The index memory of a capacity, from a small index of the same options (bytes are linear in the capacity, but
// for the LFU buckets' map and the sketch's power-of-two width).
double estimated_index_bytes(std::int64_t capacity, const DynamicSpec& spec) {
  constexpr std::int64_t kProbe = 4096;
  const std::int64_t n = std::min(capacity, kProbe);
  const KeyIndex probe(n, spec);
  return static_cast<double>(probe.bytes()) * static_cast<double>(capacity) / static_cast<double>(n);
}

// `in` with its keys spread over [0, 2^63) as strata-bench --dynamic spreads them, in `copy`.
const KeyBatch& spread_copy(const KeyBatch& in, KeyBatch& copy) {
  copy = in;
  bench::spread_keys(copy);
  return copy;
}

// Pass 1: each table's uses, distinct keys and their growth.
Status count_keys(const BatchPass& pass, std::int64_t steps, bool spread, std::vector<TableKeys>& keys,
                  std::vector<TableCapacity>& out, const ProgressFn& progress) {
  std::vector<std::unordered_set<Key>> seen(keys.size());
  std::int64_t step = 0;
  KeyBatch spread_batch;
  return pass([&](const KeyBatch& in) -> Status {
    const KeyBatch* b = spread ? &spread_copy(in, spread_batch) : &in;
    tbb::parallel_for(std::size_t{0}, keys.size(), [&](std::size_t t) {
      keys[t].take(*b);
      TableCapacity& tc = out[t];
      for (const Key k : keys[t].keys()) seen[t].insert(k);
      tc.uses += keys[t].total();
      tc.max_step_distinct = std::max(tc.max_step_distinct, static_cast<std::int64_t>(keys[t].keys().size()));
      tc.distinct_by_step.push_back(static_cast<std::int64_t>(seen[t].size()));
    });
    ++step;
    if (progress && (step % 256 == 0 || step == steps))
      progress("counting distinct keys: " + std::to_string(step) + " of " + std::to_string(steps) + " batches");
    return Status::ok();
  });
}

}  // namespace

namespace {

// Replays every batch of `pass` through runs of `capacities` (per table; each in [1, kMaxDynamicCapacity]) and
// returns the runs, per table in the order given. The memory of their indexes is checked against `memory_limit`
// (> 0) before any is made.
Result<std::vector<std::vector<CapacityRun>>> replay(const BatchPass& pass, std::int64_t steps,
                                                     const std::vector<std::vector<std::int64_t>>& capacities,
                                                     std::vector<TableKeys>& keys, const CapacityOptions& o,
                                                     double memory_limit, const ProgressFn& progress) {
  double bytes = 0;
  std::size_t runs = 0;
  for (const std::vector<std::int64_t>& caps : capacities)
    for (const std::int64_t c : caps) {
      bytes += estimated_index_bytes(c, o.dynamic);
      ++runs;
    }
  if (memory_limit > 0 && bytes > memory_limit)
    return Status::invalid_argument("the key indexes of the " + std::to_string(runs) + " runs take about " +
                                    bytes_text(bytes) + ", more than the " + bytes_text(memory_limit) +
                                    " this machine can use (expected fewer or smaller --capacities, or fewer "
                                    "--points)");
  std::vector<Replay> replays;
  for (std::size_t t = 0; t < capacities.size(); ++t)
    for (const std::int64_t c : capacities[t]) {
      Replay rp;
      rp.table = t;
      rp.index = std::make_unique<KeyIndex>(c, o.dynamic);
      rp.run.capacity = c;
      replays.push_back(std::move(rp));
    }
  std::int64_t step = 0;
  KeyBatch spread_batch;
  STRATA_RETURN_IF_ERROR(pass([&](const KeyBatch& in) -> Status {
    const KeyBatch* b = o.spread ? &spread_copy(in, spread_batch) : &in;
    tbb::parallel_for(std::size_t{0}, keys.size(), [&](std::size_t t) { keys[t].take(*b); });
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, replays.size(), 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i)
                          replays[i].train(keys[replays[i].table], o.in_flight);
                      });
    ++step;
    if (progress && (step % 256 == 0 || step == steps))
      progress("replaying " + std::to_string(replays.size()) + " runs: " + std::to_string(step) + " of " +
               std::to_string(steps) + " batches");
    return Status::ok();
  }));
  std::vector<std::vector<CapacityRun>> out(capacities.size());
  for (Replay& rp : replays) {
    rp.run.counts = rp.index->counts();
    rp.run.rows_in_use = rp.index->size();
    rp.run.index_bytes = rp.index->bytes();
    out[rp.table].push_back(rp.run);
  }
  return out;
}

// Adds `runs` to a table's, in capacity order, and finds its unbounded run again.
void merge_runs(TableCapacity& t, std::vector<CapacityRun> runs) {
  const std::int64_t unbounded = std::min(t.distinct, kMaxDynamicCapacity);
  t.runs.insert(t.runs.end(), runs.begin(), runs.end());
  std::sort(t.runs.begin(), t.runs.end(),
            [](const CapacityRun& a, const CapacityRun& b) { return a.capacity < b.capacity; });
  t.unbounded = -1;
  for (std::size_t i = 0; i < t.runs.size(); ++i)
    if (t.runs[i].capacity == unbounded) t.unbounded = static_cast<int>(i);
}

}  // namespace

std::vector<std::int64_t> refinement(const TableCapacity& t, int points) {
  std::vector<std::int64_t> out;
  if (t.recommended <= 0) return out;
  const std::int64_t lo = t.runs[static_cast<std::size_t>(t.recommended) - 1].capacity;
  const std::int64_t hi = t.runs[static_cast<std::size_t>(t.recommended)].capacity;
  for (int i = 1; i <= points; ++i) {
    const std::int64_t c = lo + (hi - lo) * i / (points + 1);
    if (c > lo && c < hi && (out.empty() || c > out.back())) out.push_back(c);
  }
  return out;
}

Result<CapacityPlan> plan_capacity(const std::vector<bench::SourceTable>& tables, std::int64_t steps,
                                   const BatchPass& pass, const CapacityOptions& o, double memory_limit,
                                   const ProgressFn& progress) {
  STRATA_RETURN_IF_ERROR(check_capacity_options(o));
  CapacityPlan plan;
  plan.options = o;
  std::vector<TableKeys> keys;
  for (const bench::SourceTable& t : tables) {
    keys.emplace_back(t.features);
    TableCapacity tc;
    tc.name = t.name;
    plan.tables.push_back(std::move(tc));
  }
  STRATA_RETURN_IF_ERROR(count_keys(pass, steps, o.spread, keys, plan.tables, progress));
  plan.steps = plan.tables.empty() ? 0 : static_cast<std::int64_t>(plan.tables.front().distinct_by_step.size());

  // The runs: each table's candidates and its unbounded capacity.
  std::vector<std::vector<std::int64_t>> capacities(plan.tables.size());
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    TableCapacity& tc = plan.tables[t];
    tc.distinct = tc.distinct_by_step.empty() ? 0 : tc.distinct_by_step.back();
    if (tc.distinct == 0) continue;
    std::vector<std::int64_t>& caps = capacities[t];
    caps = o.capacities.empty() ? default_capacities(tc.max_step_distinct, tc.distinct, o.points) : o.capacities;
    caps.push_back(std::min(tc.distinct, kMaxDynamicCapacity));
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<std::vector<CapacityRun>> runs,
                          replay(pass, plan.steps, capacities, keys, o, memory_limit, progress));
  bool refine = false;
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    TableCapacity& tc = plan.tables[t];
    merge_runs(tc, std::move(runs[t]));
    tc.recommended = recommend(tc, o.tolerance);
    capacities[t] = o.refine > 0 ? refinement(tc, o.refine) : std::vector<std::int64_t>{};
    refine = refine || !capacities[t].empty();
  }
  if (!refine) return plan;
  // One more pass: capacities between the recommended one and the candidate below it.
  STRATA_ASSIGN_OR_RETURN(runs, replay(pass, plan.steps, capacities, keys, o, memory_limit, progress));
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    TableCapacity& tc = plan.tables[t];
    merge_runs(tc, std::move(runs[t]));
    tc.recommended = recommend(tc, o.tolerance);
  }
  return plan;
}

}  // namespace strata::tune
