// Time of the exact LRU curve (cache/analysis.hpp, per batch distinct, as strata-tune plan runs
// it) on a trace of 10 million lookups over 1 million distinct keys, in batches of 4096 keys:
// uniform keys (little reuse within a batch) and Zipf-like keys (much). Issue 20's target: under
// 10 s on the 2-core CI VM.

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cache/analysis.hpp"

namespace {

using strata::cache::KeyTrace;

// `n` keys over `distinct` values; skew 0 is uniform, else P(rank r) ~ r^-skew by inverse
// power-law sampling (approximate, for timing only).
KeyTrace make_trace(std::int64_t n, std::int64_t distinct, double skew, std::int64_t batch) {
  KeyTrace t;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  t.keys.resize(static_cast<std::size_t>(n));
  for (auto& k : t.keys) {
    if (skew == 0) {
      k = rng() % static_cast<std::uint64_t>(distinct);
    } else {
      const double x = std::pow(u(rng), 1.0 / (1.0 - skew + 1e-9));  // heavier toward 0 for skew < 1
      k = static_cast<std::uint64_t>(x * static_cast<double>(distinct - 1)) * 0x9E3779B97F4A7C15ull;
    }
  }
  for (std::int64_t i = 0; i < n; i += batch) t.batch_offsets.push_back(i);
  t.batch_offsets.push_back(n);
  return t;
}

void BM_LruCurve(benchmark::State& state) {
  const double skew = static_cast<double>(state.range(0)) / 100.0;
  const KeyTrace t = make_trace(10'000'000, 1'000'000, skew, 4096);
  std::int64_t distinct = 0;
  for (auto _ : state) {
    auto c = strata::cache::lru_curve(t, strata::cache::PerBatch::kDistinct);
    distinct = c->distinct_keys();
    benchmark::DoNotOptimize(c);
  }
  state.counters["distinct_keys"] = static_cast<double>(distinct);
  state.counters["lookups"] = static_cast<double>(t.num_keys());
}
BENCHMARK(BM_LruCurve)->Arg(0)->Arg(50)->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
