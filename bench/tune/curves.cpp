#include "bench/tune/curves.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace strata::tune {

double HitCurve::distinct_per_step(std::int64_t steps) const noexcept {
  return steps > 0 ? static_cast<double>(lru.accesses()) / static_cast<double>(steps) : 0.0;
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

Result<HitCurve> curve_of(const cache::KeyTrace& keys, std::string name, std::vector<std::string> tables,
                          std::int64_t rows, int points, int belady_points) {
  HitCurve c;
  c.name = std::move(name);
  c.tables = std::move(tables);
  c.rows = rows;
  STRATA_ASSIGN_OR_RETURN(c.lru, cache::lru_curve(keys, cache::PerBatch::kDistinct));
  const std::int64_t lo = std::max<std::int64_t>(1, c.lru.min_capacity());
  const std::vector<std::int64_t> sizes = log_sizes(lo, std::max(lo, rows), points);
  const std::size_t n = sizes.size();
  const std::size_t belady = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(0, belady_points)));
  std::vector<bool> with_belady(n, false);  // `belady` indices spread evenly, the ends included
  for (std::size_t k = 0; k < belady; ++k) with_belady[belady == 1 ? n - 1 : k * (n - 1) / (belady - 1)] = true;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t size = sizes[i];
    CurvePoint p;
    p.rows = size;
    p.lru = c.lru.hit_rate_at(size);
    if (with_belady[i]) {
      STRATA_ASSIGN_OR_RETURN(const cache::BeladyHits b, cache::belady_hits(keys, size));
      p.belady = b.hit_rate();
    }
    c.points.push_back(p);
  }
  return c;
}

}  // namespace

Result<HitCurve> table_curve(const TableTrace& table, int points, int belady_points) {
  return curve_of(table.keys, table.spec.name, {table.spec.name}, table.spec.rows, points, belady_points);
}

Result<std::vector<HitCurve>> pool_curves(const TuneInput& input, int points) {
  std::map<std::pair<int, int>, std::vector<std::size_t>> shapes;
  for (std::size_t t = 0; t < input.tables.size(); ++t) {
    const TableSpec& s = input.tables[t].spec;
    shapes[{s.dim, optimizer_state_dim(s.optimizer.kind, s.dim)}].push_back(t);
  }
  std::vector<HitCurve> out;
  for (const auto& [shape, members] : shapes) {
    if (members.size() < 2) continue;
    if (members.size() > static_cast<std::size_t>(cache::kMaxCacheTables))
      return Status::invalid_argument("pool (dim " + std::to_string(shape.first) +
                                      "): " + std::to_string(members.size()) + " tables (expected at most " +
                                      std::to_string(cache::kMaxCacheTables) + ")");
    cache::KeyTrace pool;
    pool.batch_offsets.push_back(0);
    std::vector<std::string> names;
    std::int64_t rows = 0;
    for (const std::size_t t : members) {
      names.push_back(input.tables[t].spec.name);
      rows += input.tables[t].spec.rows;
    }
    for (std::int64_t step = 0; step < input.steps; ++step) {
      for (std::size_t m = 0; m < members.size(); ++m) {
        const cache::KeyTrace& k = input.tables[members[m]].keys;
        for (std::int64_t i = k.batch_offsets[step]; i < k.batch_offsets[step + 1]; ++i)
          pool.keys.push_back(
              cache::cache_key(static_cast<int>(m), static_cast<Key>(k.keys[static_cast<std::size_t>(i)])));
      }
      pool.batch_offsets.push_back(pool.num_keys());
    }
    STRATA_ASSIGN_OR_RETURN(
        HitCurve c,
        curve_of(pool, "pool (dim " + std::to_string(shape.first) + ", state " + std::to_string(shape.second) + ")",
                 std::move(names), rows, points, 0));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace strata::tune
