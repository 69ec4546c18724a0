// strata-tune's spatial sampling (tune/tune_input.hpp, curves.hpp): at 1% of the keys the
// LRU curve stays within 1 point of the exact one on a sizeable skewed trace, the curve states the
// error it measured on the exact prefix, and the exact one-pass curve (cache::lru_curve, the same
// code the sampled curve runs on) still equals a brute-force LRU simulation.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <random>
#include <unordered_map>
#include <vector>

#include "tune/curves.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {
namespace {

// One table of `rows` rows, `steps` steps of `keys` keys (one key per bag): rows drawn as
// rows x u^2 (u uniform in [0, 1)), a skewed popularity with a long tail (row r's share falls as
// 1 / sqrt(r)). Deterministic.
TuneInput skewed(std::int64_t rows, int steps, int keys, const Sampling& sampling, std::uint64_t seed = 20) {
  TableSpec spec;
  spec.name = "t";
  spec.rows = rows;
  spec.dim = 16;
  InputBuilder builder({spec}, sampling);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int s = 0; s < steps; ++s) {
    KeyBatch b;
    JaggedKeys f;
    f.table = "t";
    for (int k = 0; k <= keys; ++k) f.offsets.push_back(k);
    for (int k = 0; k < keys; ++k) {
      const double x = u(rng);
      f.keys.push_back(std::min<Key>(rows - 1, static_cast<Key>(static_cast<double>(rows) * x * x)));
    }
    b.features.push_back(std::move(f));
    EXPECT_TRUE(builder.add(b).is_ok());
  }
  return std::move(builder).finish("skewed");
}

TEST(TuneSampling, OnePercentIsWithinOnePointOfExact) {
  // 4M lookups over 1M rows: at 1% about 8.7K sampled keys, enough that the
  // estimate's spread is well under a point (SHARDS' error falls with the sampled keys).
  constexpr std::int64_t kRows = 1'000'000;
  constexpr int kSteps = 2000, kKeys = 2000;
  const TuneInput exact = skewed(kRows, kSteps, kKeys, Sampling{});
  Sampling one_percent;
  one_percent.rate = 0.01;
  one_percent.check_keys = 400'000;
  const TuneInput sampled = skewed(kRows, kSteps, kKeys, one_percent);
  ASSERT_NEAR(sampled.sample_rate, 0.01, 1e-6);
  // The exact counts are kept whatever the sampling.
  EXPECT_EQ(sampled.tables[0].key_count, exact.tables[0].key_count);
  EXPECT_EQ(sampled.tables[0].distinct_count, exact.tables[0].distinct_count);
  EXPECT_EQ(sampled.tables[0].max_distinct, exact.tables[0].max_distinct);
  EXPECT_NEAR(static_cast<double>(sampled.tables[0].keys.num_keys()), 0.01 * kSteps * kKeys, 0.002 * kSteps * kKeys);

  auto e = table_curve(exact.tables[0], 24, 0);
  auto s = table_curve(sampled.tables[0], 24, 0, sampled.sample_rate);
  ASSERT_TRUE(e.is_ok() && s.is_ok());
  ASSERT_EQ(e->points.size(), s->points.size());
  double worst = 0;
  for (std::size_t i = 0; i < e->points.size(); ++i) {
    EXPECT_EQ(e->points[i].rows, s->points[i].rows);
    worst = std::max(worst, std::abs(e->points[i].lru - s->points[i].lru));
    EXPECT_NEAR(s->points[i].lru, e->points[i].lru, 0.01) << "at " << e->points[i].rows << " rows";
  }
  // Every size, not only the report's.
  for (std::int64_t rows = 1024; rows <= kRows; rows *= 2) EXPECT_NEAR(s->hit_rate(rows), e->hit_rate(rows), 0.01);
  // The curve says its error, measured on the exact prefix; the exact curve has none.
  EXPECT_GE(s->error, 0.0);
  EXPECT_EQ(s->error_keys, 400'000);
  EXPECT_NE(s->sampling_note().find("sampled at 1%, error <= "), std::string::npos) << s->sampling_note();
  EXPECT_EQ(e->error, -1.0);
  EXPECT_EQ(e->sampling_note(), "");
  std::printf("1%% sampling: largest difference from exact %.3f points over %zu sizes; prefix error %.3f points\n",
              100 * worst, e->points.size(), 100 * s->error);
}

TEST(TuneSampling, TheSampleIsAHashOfTheKeyEveryOccurrenceOrNone) {
  Sampling half;
  half.rate = 0.5;
  int kept = 0;
  for (Key r = 0; r < 100000; ++r) {
    const bool k = half.keeps(cache::cache_key(0, r));
    EXPECT_EQ(k, half.keeps(cache::cache_key(0, r)));
    kept += k;
  }
  EXPECT_NEAR(kept, 50000, 1000);
  // The same row of another table is another key.
  int same = 0;
  for (Key r = 0; r < 10000; ++r) same += half.keeps(cache::cache_key(0, r)) == half.keeps(cache::cache_key(1, r));
  EXPECT_NEAR(same, 5000, 400);
  EXPECT_TRUE(Sampling{}.keeps(12345));
}

// Brute force: a batch-at-a-time LRU list of `capacity` rows (a batch's keys are made most
// recent in the order of their first use; victims are the least recent keys not in the batch).
std::int64_t brute_force_hits(const cache::KeyTrace& t, std::int64_t capacity) {
  std::list<std::uint64_t> order;  // front: most recent
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where;
  std::int64_t hits = 0;
  for (std::int64_t b = 0; b < t.num_batches(); ++b) {
    std::vector<std::uint64_t> batch;
    for (std::int64_t i = t.batch_offsets[b]; i < t.batch_offsets[b + 1]; ++i) {
      const std::uint64_t k = t.keys[static_cast<std::size_t>(i)];
      if (std::find(batch.begin(), batch.end(), k) == batch.end()) batch.push_back(k);
    }
    for (const std::uint64_t k : batch) hits += where.count(k) ? 1 : 0;
    for (const std::uint64_t k : batch) {
      if (auto it = where.find(k); it != where.end()) order.erase(it->second);
      order.push_front(k);
      where[k] = order.begin();
    }
    while (static_cast<std::int64_t>(order.size()) > capacity) {
      where.erase(order.back());
      order.pop_back();
    }
  }
  return hits;
}

TEST(TuneSampling, TheExactOnePassCurveEqualsBruteForceAtEverySize) {
  const TuneInput in = skewed(500, 300, 24, Sampling{}, 3);
  auto c = table_curve(in.tables[0], 8, 0);
  ASSERT_TRUE(c.is_ok());
  for (std::int64_t cap = c->min_rows; cap <= 500; ++cap)
    ASSERT_EQ(c->lru.hits_at(cap), brute_force_hits(in.tables[0].keys, cap)) << "capacity " << cap;
}

}  // namespace
}  // namespace strata::tune
