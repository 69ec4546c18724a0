#include "tune/shard_traces.hpp"

#include <algorithm>
#include <cmath>

namespace strata::tune {
namespace {

struct Counts {
  std::int64_t keys = 0, max_keys = 0, distinct = 0, max_distinct = 0;
};

// `in` with its batches grouped N to a world step and only rank r's keys, as local rows.
cache::KeyTrace shard_keys(const cache::KeyTrace& in, int ranks, int rank, Counts* counts) {
  cache::KeyTrace out;
  const std::int64_t steps = in.num_batches();
  if (steps == 0) return out;
  const auto n = static_cast<std::uint64_t>(ranks), r = static_cast<std::uint64_t>(rank);
  out.batch_offsets.push_back(0);
  std::vector<std::uint64_t> window;
  for (std::int64_t s0 = 0; s0 < steps; s0 += ranks) {
    const std::int64_t s1 = std::min(steps, s0 + ranks);
    const auto begin = static_cast<std::size_t>(in.batch_offsets[static_cast<std::size_t>(s0)]);
    const auto end = static_cast<std::size_t>(in.batch_offsets[static_cast<std::size_t>(s1)]);
    window.clear();
    for (std::size_t i = begin; i < end; ++i)
      if (in.keys[i] % n == r) window.push_back(in.keys[i] / n);
    out.keys.insert(out.keys.end(), window.begin(), window.end());
    out.batch_offsets.push_back(static_cast<std::int64_t>(out.keys.size()));
    if (!counts) continue;
    counts->keys += static_cast<std::int64_t>(window.size());
    counts->max_keys = std::max(counts->max_keys, static_cast<std::int64_t>(window.size()));
    std::sort(window.begin(), window.end());
    const auto distinct = static_cast<std::int64_t>(std::unique(window.begin(), window.end()) - window.begin());
    counts->distinct += distinct;
    counts->max_distinct = std::max(counts->max_distinct, distinct);
  }
  return out;
}

std::int64_t scaled(std::int64_t count, double rate) {
  return rate < 1.0 ? static_cast<std::int64_t>(std::ceil(static_cast<double>(count) / rate)) : count;
}

}  // namespace

TableTrace shard_trace(const TableTrace& table, int ranks, int rank, double sample_rate) {
  TableTrace s;
  s.spec = table.spec;
  const std::int64_t rows = table.spec.rows;
  s.spec.rows = rows > rank ? (rows - rank + ranks - 1) / ranks : 0;
  Counts c;
  s.keys = shard_keys(table.keys, ranks, rank, &c);
  s.check = shard_keys(table.check, ranks, rank, nullptr);
  s.check_sample = shard_keys(table.check_sample, ranks, rank, nullptr);
  s.key_count = scaled(c.keys, sample_rate);
  s.bags = s.key_count;
  s.distinct_count = scaled(c.distinct, sample_rate);
  s.max_distinct = std::min(s.spec.rows, scaled(c.max_distinct, sample_rate));
  s.max_keys = scaled(c.max_keys, sample_rate);
  for (std::int64_t b = 0; b < s.keys.num_batches(); ++b)
    s.step_bags.push_back(s.keys.batch_offsets[static_cast<std::size_t>(b) + 1] -
                          s.keys.batch_offsets[static_cast<std::size_t>(b)]);
  return s;
}

std::int64_t max_served(const TableTrace& table, int ranks, double sample_rate) {
  const cache::KeyTrace& k = table.keys;
  const std::int64_t steps = k.num_batches();
  const auto n = static_cast<std::uint64_t>(ranks);
  std::int64_t most = 0;
  std::vector<std::int64_t> served(static_cast<std::size_t>(ranks));
  std::vector<std::uint64_t> step;
  for (std::int64_t s0 = 0; s0 < steps; s0 += ranks) {
    std::fill(served.begin(), served.end(), 0);
    for (std::int64_t s = s0; s < std::min(steps, s0 + ranks); ++s) {
      step.assign(k.keys.begin() + k.batch_offsets[static_cast<std::size_t>(s)],
                  k.keys.begin() + k.batch_offsets[static_cast<std::size_t>(s) + 1]);
      std::sort(step.begin(), step.end());
      step.erase(std::unique(step.begin(), step.end()), step.end());
      for (const std::uint64_t key : step) ++served[static_cast<std::size_t>(key % n)];
    }
    most = std::max(most, *std::max_element(served.begin(), served.end()));
  }
  return scaled(most, sample_rate);
}

std::vector<std::vector<TableTrace>> shard_traces(const TuneInput& input, int ranks) {
  std::vector<std::vector<TableTrace>> out;
  for (const TableTrace& t : input.tables) {
    out.emplace_back();
    for (int r = 0; r < ranks; ++r) out.back().push_back(shard_trace(t, ranks, r, input.sample_rate));
  }
  return out;
}

}  // namespace strata::tune
