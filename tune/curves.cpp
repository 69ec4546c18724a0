#include "tune/curves.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "store/model/table_cost.hpp"
#include "store/store_config.hpp"

namespace strata::tune {

double HitCurve::distinct_per_step(std::int64_t steps) const noexcept {
  const double accesses = sample_rate < 1.0 ? static_cast<double>(exact_accesses) : static_cast<double>(lru.accesses());
  return steps > 0 ? accesses / static_cast<double>(steps) : 0.0;
}

namespace {

// The sampled curve's hit rate at `rows` rows: its hits at rate x rows over its accesses.
double sampled_hit_rate(const cache::LruCurve& sample, double rate, std::int64_t rows) {
  return sample.hit_rate_at(std::llround(static_cast<double>(rows) * rate));
}

}  // namespace

double HitCurve::hit_rate(std::int64_t rows) const {
  if (sample_rate >= 1.0) return lru.hit_rate_at(rows);
  return sampled_hit_rate(lru, sample_rate, rows);
}

std::int64_t HitCurve::saturation_rows() const noexcept {
  return static_cast<std::int64_t>(std::ceil(static_cast<double>(lru.max_stack_distance()) / sample_rate));
}

std::string HitCurve::sampling_note() const {
  if (sample_rate >= 1.0) return "";
  char buf[200];
  if (error >= 0) {
    std::snprintf(buf, sizeof buf,
                  "sampled at %.4g%%, error <= %.2f points (measured against exact on the first %lld lookups)",
                  100.0 * sample_rate, 100.0 * error, static_cast<long long>(error_keys));
  } else {
    std::snprintf(buf, sizeof buf, "sampled at %.4g%%, error not measured (no exact prefix kept)", 100.0 * sample_rate);
  }
  return buf;
}

std::vector<std::int64_t> log_sizes(std::int64_t lo, std::int64_t hi, int count) {
  std::vector<std::int64_t> out;
  lo = std::max<std::int64_t>(1, lo);
  hi = std::max(lo, hi);
  count = std::max(2, count);
  const double a = std::log(static_cast<double>(lo)), b = std::log(static_cast<double>(hi));
  for (int i = 0; i < count; ++i) {
    const std::int64_t v = i == count - 1 ? hi : std::llround(std::exp(a + (b - a) * i / (count - 1)));
    const std::int64_t c = std::clamp(v, lo, hi);
    if (out.empty() || c > out.back()) out.push_back(c);
  }
  return out;
}

namespace {

// The largest |sampled - exact| LRU hit rate at `sizes` (clamped to the exact trace's reach).
Result<double> sampling_error(const cache::KeyTrace& exact, const cache::KeyTrace& sample, double rate,
                              const std::vector<std::int64_t>& sizes) {
  STRATA_ASSIGN_OR_RETURN(const cache::LruCurve e, cache::lru_curve(exact, cache::PerBatch::kDistinct));
  STRATA_ASSIGN_OR_RETURN(const cache::LruCurve s, cache::lru_curve(sample, cache::PerBatch::kDistinct));
  double worst = 0;
  for (const std::int64_t size : sizes)
    worst =
        std::max(worst, std::abs(e.hit_rate_at(size) - s.hit_rate_at(std::llround(static_cast<double>(size) * rate))));
  return worst;
}

// `keys` sampled at `rate` (1: exact), with `check` and `check_sample` the exact and sampled keys
// of the prefix the error is measured on (rate < 1); `min_rows` the exact smallest cache.
struct CurveKeys {
  const cache::KeyTrace* keys = nullptr;
  double rate = 1.0;
  std::int64_t min_rows = 0;
  std::int64_t exact_accesses = 0;
  const cache::KeyTrace* check = nullptr;
  const cache::KeyTrace* check_sample = nullptr;
};

Result<HitCurve> curve_of(const CurveKeys& k, std::string name, std::vector<std::string> tables, std::int64_t rows,
                          int points, int belady_points) {
  const cache::KeyTrace& keys = *k.keys;
  HitCurve c;
  c.name = std::move(name);
  c.tables = std::move(tables);
  c.rows = rows;
  c.sample_rate = k.rate;
  STRATA_ASSIGN_OR_RETURN(c.lru, cache::lru_curve(keys, cache::PerBatch::kDistinct));
  c.min_rows = k.rate < 1.0 ? k.min_rows : c.lru.min_capacity();
  c.exact_accesses = k.rate < 1.0 ? k.exact_accesses : c.lru.accesses();
  const std::int64_t lo = std::max<std::int64_t>(1, c.min_rows);
  const std::vector<std::int64_t> sizes = log_sizes(lo, std::max(lo, rows), points);
  if (k.rate < 1.0 && k.check != nullptr && k.check->num_keys() > 0) {
    STRATA_ASSIGN_OR_RETURN(c.error, sampling_error(*k.check, *k.check_sample, k.rate, sizes));
    c.error_keys = k.check->num_keys();
  }
  const std::size_t n = sizes.size();
  const std::size_t belady = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(0, belady_points)));
  std::vector<bool> with_belady(n, false);  // `belady` indices spread evenly, the ends included
  for (std::size_t k = 0; k < belady; ++k) with_belady[belady == 1 ? n - 1 : k * (n - 1) / (belady - 1)] = true;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t size = sizes[i];
    CurvePoint p;
    p.rows = size;
    p.lru = c.hit_rate(size);
    if (with_belady[i]) {
      // Sampled: at the rescaled size, where that holds every sampled step (else not computed).
      const std::int64_t at = k.rate < 1.0 ? std::llround(static_cast<double>(size) * k.rate) : size;
      if (auto b = cache::belady_hits(keys, at); b) {
        p.belady = b->hit_rate();
      } else if (k.rate >= 1.0) {
        return b.status();
      }
    }
    c.points.push_back(p);
  }
  return c;
}

// The keys of the `members` tables' traces (`which` of each), tagged by their index among the
// members, step by step.
cache::KeyTrace merged(const TuneInput& input, const std::vector<std::size_t>& members,
                       cache::KeyTrace TableTrace::*which) {
  cache::KeyTrace pool;
  pool.batch_offsets.push_back(0);
  const std::int64_t steps = (input.tables[members.front()].*which).num_batches();
  for (std::int64_t step = 0; step < steps; ++step) {
    for (std::size_t m = 0; m < members.size(); ++m) {
      const cache::KeyTrace& k = input.tables[members[m]].*which;
      for (std::int64_t i = k.batch_offsets[step]; i < k.batch_offsets[step + 1]; ++i)
        pool.keys.push_back(
            cache::cache_key(static_cast<int>(m), static_cast<Key>(k.keys[static_cast<std::size_t>(i)])));
    }
    pool.batch_offsets.push_back(pool.num_keys());
  }
  return pool;
}

}  // namespace

Result<HitCurve> table_curve(const TableTrace& table, int points, int belady_points, double sample_rate) {
  const CurveKeys k{&table.keys,          sample_rate,  table.max_distinct,
                    table.distinct_count, &table.check, &table.check_sample};
  return curve_of(k, table.spec.name, {table.spec.name}, table.spec.rows, points, belady_points);
}

Result<std::vector<HitCurve>> pool_curves(const TuneInput& input, int points, const std::vector<TableSpec>& specs) {
  if (!specs.empty() && specs.size() != input.tables.size())
    return Status::invalid_argument("pool_curves: " + std::to_string(specs.size()) + " specs for " +
                                    std::to_string(input.tables.size()) + " tables (expected one per table)");
  // Every table cached: the store's slot pools are the shapes.
  StoreConfig all_cached;
  for (std::size_t t = 0; t < input.tables.size(); ++t) {
    TableConfig tc;
    tc.spec = specs.empty() ? input.tables[t].spec : specs[t];
    tc.placement = Placement::kCached;
    all_cached.tables.push_back(std::move(tc));
  }
  std::vector<HitCurve> out;
  for (const SlotPool& pool : slot_pools(all_cached)) {
    const std::vector<std::size_t>& members = pool.tables;
    if (members.size() < 2) continue;
    if (members.size() > static_cast<std::size_t>(cache::kMaxCacheTables))
      return Status::invalid_argument("pool " + pool.name + ": " + std::to_string(members.size()) +
                                      " tables (expected at most " + std::to_string(cache::kMaxCacheTables) + ")");
    std::vector<std::string> names;
    std::int64_t rows = 0, min_rows = 0, accesses = 0;
    for (const std::size_t t : members) {
      names.push_back(input.tables[t].spec.name);
      rows += input.tables[t].spec.rows;
      min_rows += input.tables[t].max_distinct;  // sampled: an upper bound of the pool's
      accesses += input.tables[t].distinct_count;
    }
    const cache::KeyTrace keys = merged(input, members, &TableTrace::keys);
    const cache::KeyTrace check = merged(input, members, &TableTrace::check);
    const cache::KeyTrace check_sample = merged(input, members, &TableTrace::check_sample);
    const CurveKeys k{&keys, input.sample_rate, min_rows, accesses, &check, &check_sample};
    STRATA_ASSIGN_OR_RETURN(HitCurve c, curve_of(k, "pool " + pool.name, std::move(names), rows, points, 0));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace strata::tune
