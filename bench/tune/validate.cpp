#include "bench/tune/validate.hpp"

#include <algorithm>

namespace strata::tune {

double TablePrediction::hit_rate() const noexcept {
  if (placement != Placement::kCached) return -1;
  return accesses > 0 ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0;
}

double RunPrediction::hit_rate() const noexcept {
  std::int64_t a = 0, h = 0;
  bool any = false;
  for (const TablePrediction& t : tables)
    if (t.placement == Placement::kCached) {
      any = true;
      a += t.accesses;
      h += t.hits;
    }
  if (!any) return -1;
  return a > 0 ? static_cast<double>(h) / static_cast<double>(a) : 0.0;
}

Status check_plan_tables(const StoreConfig& plan, const std::vector<std::string>& names,
                         const std::vector<std::int64_t>& rows, const std::vector<int>& dims, const std::string& what) {
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

// The per-step load of run batches [from, to).
TableLoad window_load(const TableTrace& t, std::int64_t from, std::int64_t to) {
  TableLoad l;
  const cache::KeyTrace& k = t.keys;
  const std::int64_t n = k.num_batches();
  std::vector<std::uint64_t> scratch;
  double keys = 0, bags = 0, distinct = 0;
  for (std::int64_t i = from; i < to; ++i) {
    const std::int64_t b = i % n;
    scratch.assign(k.keys.begin() + k.batch_offsets[b], k.keys.begin() + k.batch_offsets[b + 1]);
    std::sort(scratch.begin(), scratch.end());
    const auto u = static_cast<std::int64_t>(std::unique(scratch.begin(), scratch.end()) - scratch.begin());
    keys += static_cast<double>(scratch.size());
    bags += static_cast<double>(t.step_bags[static_cast<std::size_t>(b)]);
    distinct += static_cast<double>(u);
    l.max_keys = std::max(l.max_keys, static_cast<std::int64_t>(scratch.size()));
    l.max_distinct = std::max(l.max_distinct, u);
  }
  const double steps = static_cast<double>(to - from);
  l.keys = keys / steps;
  l.bags = bags / steps;
  l.distinct = distinct / steps;
  return l;
}

}  // namespace

Result<RunPrediction> predict_run(const TuneInput& input, const StoreConfig& plan, std::int64_t steps, int pipeline,
                                  const HardwareProfile& profile) {
  if (steps < 1) return Status::invalid_argument("--steps " + std::to_string(steps) + " (expected >= 1)");
  const std::int64_t counted = steps + std::min<std::int64_t>(steps, std::max(1, pipeline) - 1);
  if (input.sample_rate < 1.0) return Status::invalid_argument("validate needs every key (no --sample)");
  CostOptions o;
  o.max_in_flight = plan.cache.max_in_flight;
  o.threads = plan.threads;
  o.numa_nodes = static_cast<int>(std::max<std::size_t>(1, profile.numa_nodes.size()));
  RunPrediction r;
  r.steps = steps;
  for (const TableConfig& tc : plan.tables) {
    const auto it = std::find_if(input.tables.begin(), input.tables.end(),
                                 [&](const TableTrace& t) { return t.spec.name == tc.spec.name; });
    if (it == input.tables.end()) return Status::invalid_argument("table '" + tc.spec.name + "' has no keys");
    TablePrediction p;
    p.name = tc.spec.name;
    p.placement = tc.placement;
    p.load = window_load(*it, steps, 2 * steps);
    double hit = 0;
    if (tc.placement == Placement::kCached) {
      p.cache_rows = cache_rows(tc);
      STRATA_ASSIGN_OR_RETURN(const cache::LruCurve both,
                              cache::lru_curve(run_keys(it->keys, 0, 2 * steps), cache::PerBatch::kDistinct));
      STRATA_ASSIGN_OR_RETURN(const cache::LruCurve first,
                              cache::lru_curve(run_keys(it->keys, 0, counted), cache::PerBatch::kDistinct));
      p.accesses = both.accesses() - first.accesses();
      p.hits = both.hits_at(p.cache_rows) - first.hits_at(p.cache_rows);
      hit = p.hit_rate();
    }
    STRATA_ASSIGN_OR_RETURN(const TableCost c, table_cost(tc.spec, p.load, tc.placement, p.cache_rows, hit, o));
    p.bytes = c.bytes;
    add_bytes(r.bytes, c.bytes);
    r.tables.push_back(std::move(p));
  }
  r.step = model_step(profile, r.bytes);
  return r;
}

}  // namespace strata::tune
