// Time of a dynamic table's key index (host/key_index.hpp): train() + release() of batches of 8192
// key draws (deduplicated to distinct keys with their uses, as the store gives them) over 10x the
// capacity's keys, Zipf-like, at capacity 1M, in the steady state (the table full, every batch
// admitting and evicting). Reports ns per drawn key (items/s) and the index's bytes per row.
//   build/default/bench/strata-micro-keyindex --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "host/key_index.hpp"

namespace {

using strata::Key;
using strata::KeyIndex;

constexpr std::int64_t kCapacity = 1 << 20;
constexpr std::int64_t kUniverse = 10 * kCapacity;
constexpr std::int64_t kDraws = 8192;
constexpr int kBatches = 384;

struct Batch {
  std::vector<Key> keys;
  std::vector<std::int64_t> uses;
};

// Batches of kDraws draws; P(rank < x) = (x / universe)^(1 - skew) (inverse power-law sampling),
// ranks scattered over the int64 keys.
std::vector<Batch> make_batches(double skew, std::int64_t universe = kUniverse, int count = kBatches,
                                unsigned seed = 7) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<Batch> batches(static_cast<std::size_t>(count));
  std::unordered_map<Key, std::size_t> at;
  for (Batch& b : batches) {
    at.clear();
    for (std::int64_t j = 0; j < kDraws; ++j) {
      const double x = std::pow(u(rng), 1.0 / (1.0 - skew));
      const auto rank = static_cast<std::uint64_t>(x * static_cast<double>(universe - 1));
      const auto key = static_cast<Key>(rank * 0x9E3779B97F4A7C15ull);
      const auto [it, added] = at.emplace(key, b.keys.size());
      if (added) {
        b.keys.push_back(key);
        b.uses.push_back(0);
      }
      ++b.uses[it->second];
    }
  }
  return batches;
}

// Args: eviction (0 lru, 1 lfu), admit_after, skew in percent.
void BM_TrainRelease(benchmark::State& state) {
  strata::DynamicSpec spec;
  spec.eviction = state.range(0) == 0 ? strata::Eviction::kLru : strata::Eviction::kLfu;
  spec.admit_after = state.range(1);
  const std::vector<Batch> batches = make_batches(static_cast<double>(state.range(2)) / 100.0);
  KeyIndex index(kCapacity, spec);
  std::vector<std::int64_t> rows;
  std::vector<std::pair<std::int64_t, Key>> created;
  const auto step = [&](const Batch& b) {
    if (!index.train(b.keys, b.uses, rows, created).is_ok()) state.SkipWithError("train refused");
    index.release(rows);
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (const Batch& b : batches) step(b);  // to the steady state
  }
  const auto before = index.counts();
  std::int64_t distinct = 0;
  std::size_t i = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the loop variable is unused by design
    const Batch& b = batches[i++ % batches.size()];
    step(b);
    distinct += static_cast<std::int64_t>(b.keys.size());
  }
  const auto after = index.counts();
  state.SetItemsProcessed(state.iterations() * kDraws);
  state.counters["ns_per_key"] = benchmark::Counter(static_cast<double>(state.iterations() * kDraws),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["distinct_per_batch"] = static_cast<double>(distinct) / static_cast<double>(state.iterations());
  state.counters["admitted_per_batch"] =
      static_cast<double>(after.admissions - before.admissions) / static_cast<double>(state.iterations());
  state.counters["bytes_per_row"] = static_cast<double>(index.bytes()) / static_cast<double>(kCapacity);
  state.counters["size"] = static_cast<double>(index.size());
}
BENCHMARK(BM_TrainRelease)
    ->ArgNames({"lfu", "admit_after", "skew"})
    ->Args({0, 1, 80})
    ->Args({1, 1, 80})
    ->Args({0, 3, 80})
    ->Args({1, 3, 80})
    ->Args({0, 1, 50})
    ->Unit(benchmark::kMicrosecond);

// A store's submit of several dynamic tables (store/detail/dynamic_keys.cpp): check() of every table, then
// train() of every table, the batch before released after. Each table's index has left the caches by the time its
// train() comes. Args: tables, capacity (the universe of keys: as many, as in strata-bench --dynamic), skew in
// percent, check (1: check() before train(), as for a full table).
void BM_StoreStep(benchmark::State& state) {
  const auto tables = static_cast<std::size_t>(state.range(0));
  const std::int64_t capacity = state.range(1);
  const double skew = static_cast<double>(state.range(2)) / 100.0;
  const bool check = state.range(3) != 0;
  std::vector<std::vector<Batch>> batches(tables);
  std::vector<KeyIndex> index;
  for (std::size_t t = 0; t < tables; ++t) {
    batches[t] = make_batches(skew, capacity, 32, static_cast<unsigned>(7 + t));
    index.emplace_back(capacity, strata::DynamicSpec{});
  }
  std::vector<std::vector<std::int64_t>> rows(tables), before(tables);
  std::vector<std::pair<std::int64_t, Key>> created;
  std::size_t i = 0;
  const auto step = [&] {
    const std::size_t b = i++ % 32;
    for (std::size_t t = 0; t < tables; ++t) {
      if (check && !index[t].check(batches[t][b].keys, batches[t][b].uses).is_ok()) state.SkipWithError("refused");
    }
    for (std::size_t t = 0; t < tables; ++t) {
      if (!index[t].train(batches[t][b].keys, batches[t][b].uses, rows[t], created).is_ok())
        state.SkipWithError("train refused");
      index[t].release(before[t]);
      std::swap(rows[t], before[t]);
    }
  };
  for (int s = 0; s < 64; ++s) step();  // to the steady state
  std::int64_t distinct = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the loop variable is unused by design
    for (std::size_t t = 0; t < tables; ++t) distinct += static_cast<std::int64_t>(batches[t][i % 32].keys.size());
    step();
  }
  state.counters["ns_per_distinct_key"] =
      benchmark::Counter(static_cast<double>(distinct), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StoreStep)
    ->ArgNames({"tables", "capacity", "skew", "check"})
    ->Args({26, 20000, 90, 1})
    ->Args({26, 20000, 90, 0})
    ->Args({4, 1 << 20, 90, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
