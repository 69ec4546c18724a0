#include "cache/analysis.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "cache/cache_planner.hpp"
#include "host/dedup.hpp"

namespace strata::cache {

namespace {

// ---- trace builders ----

// One batch per key (where both counting models coincide with the textbook one).
KeyTrace singleton_batches(const std::vector<std::uint64_t>& keys) {
  KeyTrace t;
  t.keys = keys;
  for (std::size_t i = 0; i <= keys.size(); ++i) t.batch_offsets.push_back(static_cast<std::int64_t>(i));
  return t;
}

KeyTrace batched(const std::vector<std::vector<std::uint64_t>>& batches) {
  KeyTrace t;
  t.batch_offsets.push_back(0);
  for (const auto& b : batches) {
    t.keys.insert(t.keys.end(), b.begin(), b.end());
    t.batch_offsets.push_back(static_cast<std::int64_t>(t.keys.size()));
  }
  return t;
}

std::vector<std::vector<std::uint64_t>> split(const KeyTrace& t) {
  std::vector<std::vector<std::uint64_t>> out;
  for (std::int64_t b = 0; b < t.num_batches(); ++b)
    out.emplace_back(t.keys.begin() + t.batch_offsets[b], t.keys.begin() + t.batch_offsets[b + 1]);
  return out;
}

std::vector<std::uint64_t> distinct_in_order(const std::vector<std::uint64_t>& keys) {
  std::vector<std::uint64_t> out;
  for (const auto k : keys)
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  return out;
}

std::int64_t count_distinct(const KeyTrace& t) { return static_cast<std::int64_t>(distinct_in_order(t.keys).size()); }

std::int64_t distinct_accesses(const KeyTrace& t) {
  std::int64_t n = 0;
  for (const auto& b : split(t)) n += static_cast<std::int64_t>(distinct_in_order(b).size());
  return n;
}

std::int64_t widest_batch(const KeyTrace& t) {
  std::int64_t w = 0;
  for (const auto& b : split(t)) w = std::max<std::int64_t>(w, static_cast<std::int64_t>(distinct_in_order(b).size()));
  return w;
}

// Keys drawn from `universe` keys with P(rank r) proportional to 1 / (r + 1)^skew (skew 0: uniform),
// mapped to scattered opaque 64-bit values; batch sizes uniform in [min_batch, max_batch].
KeyTrace random_trace(std::mt19937_64& rng, std::int64_t num_keys, std::int64_t universe, double skew,
                      std::int64_t min_batch, std::int64_t max_batch) {
  std::vector<double> cdf(static_cast<std::size_t>(universe));
  double total = 0;
  for (std::int64_t r = 0; r < universe; ++r) cdf[r] = total += 1.0 / std::pow(static_cast<double>(r + 1), skew);
  std::uniform_real_distribution<double> u(0.0, total);
  std::uniform_int_distribution<std::int64_t> batch_size(min_batch, max_batch);
  KeyTrace t;
  t.batch_offsets.push_back(0);
  while (t.num_keys() < num_keys) {
    const std::int64_t size = std::min(batch_size(rng), num_keys - t.num_keys());
    for (std::int64_t i = 0; i < size; ++i) {
      const auto r =
          std::min<std::int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin(), universe - 1);
      t.keys.push_back(cache_key(static_cast<int>(r % 7), r * 2654435761LL % kMaxCacheRows));
    }
    t.batch_offsets.push_back(t.num_keys());
  }
  return t;
}

// ---- brute-force references ----

// Textbook LRU cache of `capacity` rows, one access per key occurrence.
std::int64_t brute_lru_every_access(const KeyTrace& t, std::int64_t capacity) {
  std::vector<std::uint64_t> cache;  // most recent first
  std::int64_t hits = 0;
  for (const auto k : t.keys) {
    const auto it = std::find(cache.begin(), cache.end(), k);
    if (it != cache.end()) {
      ++hits;
      cache.erase(it);
    }
    cache.insert(cache.begin(), k);
    if (static_cast<std::int64_t>(cache.size()) > capacity) cache.pop_back();
  }
  return hits;
}

// A batch-at-a-time LRU cache as the planner runs it (capacity >= widest batch): a key hits when
// resident at the start of its batch; each miss evicts the least recently used resident key that
// the batch does not use; then the batch's keys are stamped (batch, first-use index).
std::int64_t brute_lru_batch_cache(const KeyTrace& t, std::int64_t capacity) {
  std::map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> stamp;  // resident key -> last use
  std::int64_t hits = 0;
  const auto batches = split(t);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const auto keys = distinct_in_order(batches[b]);
    const auto in_batch = [&](std::uint64_t k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
    for (const auto k : keys) hits += stamp.count(k);
    for (const auto k : keys) {
      if (stamp.count(k)) continue;
      if (static_cast<std::int64_t>(stamp.size()) == capacity) {
        auto victim = stamp.end();
        for (auto it = stamp.begin(); it != stamp.end(); ++it)
          if (!in_batch(it->first) && (victim == stamp.end() || it->second < victim->second)) victim = it;
        EXPECT_NE(victim, stamp.end());
        stamp.erase(victim);
      }
      stamp[k] = {-1, -1};  // resident; stamped below
    }
    for (std::size_t j = 0; j < keys.size(); ++j)
      stamp[keys[j]] = {static_cast<std::int64_t>(b), static_cast<std::int64_t>(j)};
  }
  return hits;
}

// The documented per-batch stack model at any capacity (also below the widest batch): the cache
// holds the `capacity` most recently used keys; a batch hits on those it finds there.
std::int64_t brute_lru_batch_stack(const KeyTrace& t, std::int64_t capacity) {
  std::vector<std::uint64_t> stack;  // most recent first, truncated to capacity
  std::int64_t hits = 0;
  for (const auto& batch : split(t)) {
    const auto keys = distinct_in_order(batch);
    for (const auto k : keys) hits += std::count(stack.begin(), stack.end(), k);
    for (const auto k : keys) stack.erase(std::remove(stack.begin(), stack.end(), k), stack.end());
    for (const auto k : keys) stack.insert(stack.begin(), k);  // a later first use ends up more recent
    if (static_cast<std::int64_t>(stack.size()) > capacity) stack.resize(static_cast<std::size_t>(capacity));
  }
  return hits;
}

// Exhaustive optimum for tiny traces (<= 16 distinct keys): the best hit count over every
// sequence of victim choices, including evicting more than needed, that keeps each batch's keys
// resident. A memo on (batch, resident set) keeps it fast; it still ranges over all choices.
std::int64_t brute_optimum(const KeyTrace& t, std::int64_t capacity) {
  const auto universe = distinct_in_order(t.keys);
  EXPECT_LE(universe.size(), 16u);
  std::vector<std::uint32_t> batch_mask;
  for (const auto& batch : split(t)) {
    std::uint32_t m = 0;
    for (const auto k : batch) m |= 1u << (std::find(universe.begin(), universe.end(), k) - universe.begin());
    batch_mask.push_back(m);
  }
  std::map<std::pair<std::size_t, std::uint32_t>, std::int64_t> memo;
  const auto best = [&](const auto& self, std::size_t b, std::uint32_t resident) -> std::int64_t {
    if (b == batch_mask.size()) return 0;
    const auto key = std::make_pair(b, resident);
    if (const auto it = memo.find(key); it != memo.end()) return it->second;
    const std::uint32_t need = batch_mask[b];
    const std::int64_t hits = __builtin_popcount(resident & need);
    const std::int64_t must_evict = std::max<std::int64_t>(0, __builtin_popcount(resident | need) - capacity);
    const std::uint32_t candidates = resident & ~need;
    std::int64_t result = -1;
    // Every subset of the candidates (the empty one included) with at least must_evict keys.
    for (std::uint32_t sub = candidates;; sub = (sub - 1) & candidates) {
      if (__builtin_popcount(sub) >= must_evict)
        result = std::max(result, hits + self(self, b + 1, (resident & ~sub) | need));
      if (sub == 0) break;
    }
    EXPECT_GE(result, 0) << "no feasible choice at batch " << b;
    memo[key] = result;
    return result;
  };
  return best(best, 0, 0);
}

// Furthest-next-use simulation with linear scans, O(n * capacity): an independent check of the
// heap bookkeeping of belady_hits on traces too large for brute_optimum.
std::int64_t brute_furthest_first(const KeyTrace& t, std::int64_t capacity) {
  const auto raw = split(t);
  std::vector<std::vector<std::uint64_t>> batches;
  for (const auto& b : raw) batches.push_back(distinct_in_order(b));
  const auto next_use = [&](std::uint64_t k, std::size_t after) {
    for (std::size_t b = after + 1; b < batches.size(); ++b)
      if (std::find(batches[b].begin(), batches[b].end(), k) != batches[b].end()) return static_cast<std::int64_t>(b);
    return static_cast<std::int64_t>(batches.size());
  };
  std::vector<std::uint64_t> cache;
  std::int64_t hits = 0;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const auto& keys = batches[b];
    for (const auto k : keys) hits += std::count(cache.begin(), cache.end(), k);
    for (const auto k : keys) {
      if (std::find(cache.begin(), cache.end(), k) != cache.end()) continue;
      if (static_cast<std::int64_t>(cache.size()) == capacity) {
        std::size_t victim = cache.size();
        std::int64_t furthest = -1;
        for (std::size_t j = 0; j < cache.size(); ++j) {
          if (std::find(keys.begin(), keys.end(), cache[j]) != keys.end()) continue;
          const std::int64_t nu = next_use(cache[j], b);
          if (nu > furthest) furthest = nu, victim = j;
        }
        EXPECT_LT(victim, cache.size());
        cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(victim));
      }
      cache.push_back(k);
    }
  }
  return hits;
}

// ---- helpers for results ----

LruCurve curve_of(const KeyTrace& t, PerBatch mode) {
  auto r = lru_curve(t, mode);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : LruCurve();
}

std::int64_t belady(const KeyTrace& t, std::int64_t capacity) {
  auto r = belady_hits(t, capacity);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r->hits : -1;
}

// Invariants every curve satisfies.
void expect_consistent(const LruCurve& c) {
  const auto& h = c.stack_distance_histogram();
  ASSERT_EQ(static_cast<std::int64_t>(h.size()), c.max_stack_distance() + 1);
  EXPECT_EQ(h[0], 0);
  std::int64_t reuse = 0;
  for (const auto x : h) reuse += x;
  EXPECT_EQ(reuse + c.compulsory_misses(), c.accesses());
  EXPECT_EQ(c.hits_at(0), 0);
  for (std::int64_t cap = 1; cap <= c.max_stack_distance() + 2; ++cap) EXPECT_GE(c.hits_at(cap), c.hits_at(cap - 1));
  EXPECT_EQ(c.hits_at(c.max_stack_distance()), c.accesses() - c.distinct_keys());
  EXPECT_LE(c.max_stack_distance(), c.distinct_keys());
}

// The classic reference string (Silberschatz, Operating System Concepts): with 3 frames,
// OPT has 9 faults, LRU 12.
const std::vector<std::uint64_t> kTextbook = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};

}  // namespace

// ---- cache keys ----

TEST(CacheKey, PacksTableHighAndRowLow) {
  EXPECT_EQ(cache_key(0, 0), 0u);
  EXPECT_EQ(cache_key(1, 5), (std::uint64_t{1} << 48) | 5u);
  const std::uint64_t k = cache_key(65535, kMaxCacheRows - 1);
  EXPECT_EQ(k, ~std::uint64_t{0});
  EXPECT_EQ(cache_key_table(k), 65535);
  EXPECT_EQ(cache_key_row(k), kMaxCacheRows - 1);
  EXPECT_NE(cache_key(1, 0), cache_key(0, 1));
  for (int table : {0, 3, 65535})
    for (Key row : {Key{0}, Key{1}, Key{123456789012}, kMaxCacheRows - 1}) {
      EXPECT_EQ(cache_key_table(cache_key(table, row)), table);
      EXPECT_EQ(cache_key_row(cache_key(table, row)), row);
    }
}

TEST(CacheKey, ValidateNamesTheValueAndTheRange) {
  EXPECT_TRUE(validate_cache_key(65535, kMaxCacheRows - 1).is_ok());
  EXPECT_EQ(validate_cache_key(65536, 0).message(), "cache key: table 65536 out of range [0, 65536)");
  EXPECT_EQ(validate_cache_key(-1, 0).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(validate_cache_key(3, -1).message(), "cache key: table 3: row -1 out of range [0, 281474976710656)");
  EXPECT_EQ(validate_cache_key(3, kMaxCacheRows).code(), StatusCode::kOutOfRange);
}

TEST(CacheKeyDeathTest, OutOfRangeAborts) {
  EXPECT_DEATH((void)cache_key(70000, 1), "table 70000 out of range");
  EXPECT_DEATH((void)cache_key(1, kMaxCacheRows), "row 281474976710656 out of range");
}

// ---- trace validation ----

TEST(KeyTrace, Validate) {
  EXPECT_TRUE(validate(KeyTrace{}).is_ok());
  EXPECT_TRUE(validate(KeyTrace{{}, {0}}).is_ok());
  EXPECT_TRUE(validate(KeyTrace{{1, 2}, {0, 0, 2, 2}}).is_ok());
  EXPECT_EQ(validate(KeyTrace{{1}, {}}).message(),
            "key trace: batch_offsets are empty but there are 1 keys (expected batches+1 offsets)");
  EXPECT_EQ(validate(KeyTrace{{1}, {1, 1}}).message(), "key trace: batch_offsets[0] is 1 (expected 0)");
  EXPECT_EQ(validate(KeyTrace{{1, 2}, {0, 2, 1, 2}}).message(),
            "key trace: batch_offsets are not monotone: batch_offsets[2] = 1 < batch_offsets[1] = 2");
  EXPECT_EQ(validate(KeyTrace{{1, 2}, {0, 1}}).message(),
            "key trace: batch_offsets end at 1 (expected the key count 2)");
}

TEST(KeyTrace, MalformedTraceIsAnErrorNotACrash) {
  const KeyTrace bad{{1, 2}, {0, 3}};
  EXPECT_EQ(lru_curve(bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lru_curve(bad, PerBatch::kDistinct).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(belady_hits(bad, 4).status().message(), "key trace: batch_offsets end at 3 (expected the key count 2)");
}

// ---- fixed examples ----

TEST(Analysis, TextbookExample) {
  const KeyTrace t = singleton_batches(kTextbook);
  for (const PerBatch mode : {PerBatch::kEveryAccess, PerBatch::kDistinct}) {
    const LruCurve c = curve_of(t, mode);
    expect_consistent(c);
    EXPECT_EQ(c.accesses(), 20);
    EXPECT_EQ(c.compulsory_misses(), 6);
    EXPECT_EQ(c.misses_at(3), 12);
    EXPECT_EQ(c.hits_at(3), 8);
    EXPECT_DOUBLE_EQ(c.hit_rate_at(3), 0.4);
  }
  const auto opt = belady_hits(t, 3);
  ASSERT_TRUE(opt.is_ok());
  EXPECT_EQ(opt->misses(), 9);
  EXPECT_EQ(opt->hits, 11);
  EXPECT_EQ(opt->accesses, 20);
  EXPECT_EQ(opt->compulsory_misses, 6);
  EXPECT_EQ(opt->capacity, 3);
  EXPECT_EQ(brute_optimum(t, 3), 11);
  EXPECT_EQ(brute_lru_every_access(t, 3), 8);
}

TEST(Analysis, EmptyTrace) {
  for (const KeyTrace& t : {KeyTrace{}, KeyTrace{{}, {0}}, KeyTrace{{}, {0, 0, 0}}}) {
    for (const PerBatch mode : {PerBatch::kEveryAccess, PerBatch::kDistinct}) {
      const LruCurve c = curve_of(t, mode);
      expect_consistent(c);
      EXPECT_EQ(c.accesses(), 0);
      EXPECT_EQ(c.distinct_keys(), 0);
      EXPECT_EQ(c.min_capacity(), 0);
      EXPECT_EQ(c.max_stack_distance(), 0);
      EXPECT_EQ(c.hits_at(100), 0);
      EXPECT_EQ(c.hit_rate_at(100), 0.0);
    }
    for (const std::int64_t cap : {0, 1, 5}) {
      const auto r = belady_hits(t, cap);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->accesses, 0);
      EXPECT_EQ(r->hits, 0);
      EXPECT_EQ(r->hit_rate(), 0.0);
    }
  }
  const LruCurve c;
  EXPECT_EQ(c.hits_at(3), 0);
}

TEST(Analysis, DuplicatesInABatch) {
  const KeyTrace t = batched({{5, 5, 7, 5}});
  const LruCurve every = curve_of(t, PerBatch::kEveryAccess);
  EXPECT_EQ(every.accesses(), 4);
  EXPECT_EQ(every.hits_at(0), 0);
  EXPECT_EQ(every.hits_at(1), 1);  // the second 5 right after the first
  EXPECT_EQ(every.hits_at(2), 2);  // the last 5, with 7 in between
  EXPECT_EQ(every.stack_distance_histogram(), (std::vector<std::int64_t>{0, 1, 1}));
  const LruCurve distinct = curve_of(t, PerBatch::kDistinct);
  EXPECT_EQ(distinct.accesses(), 2);
  EXPECT_EQ(distinct.min_capacity(), 2);
  EXPECT_EQ(distinct.hits_at(10), 0);
  const auto opt = belady_hits(t, 2);
  ASSERT_TRUE(opt.is_ok());
  EXPECT_EQ(opt->accesses, 2);
  EXPECT_EQ(opt->hits, 0);
}

TEST(Analysis, PerBatchDistanceIsTakenAtTheBatchStart) {
  // Batch 1 brings 3 in before reusing 1. Per access, 1 has distance 3 (2 and 3 came between).
  // Per batch, only 2 is more recent than 1 when batch 1 starts: distance 2, and a cache of 2 rows
  // evicts 2 (not 1, which batch 1 uses) to make room for 3.
  const KeyTrace t = batched({{1, 2}, {3, 1}});
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).hits_at(2), 0);
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).hits_at(3), 1);
  const LruCurve c = curve_of(t, PerBatch::kDistinct);
  EXPECT_EQ(c.hits_at(2), 1);
  EXPECT_EQ(c.stack_distance_histogram(), (std::vector<std::int64_t>{0, 0, 1}));
  EXPECT_EQ(brute_lru_batch_cache(t, 2), 1);
  EXPECT_EQ(belady(t, 2), 1);
}

TEST(Analysis, PerBatchTiesGoToTheLaterFirstUse) {
  // 1 and 2 were last used in the same batch; 2 was first used later there, so it is more recent
  // and the batch-LRU cache of 2 rows evicts 1 for 3.
  const KeyTrace t = batched({{1, 2, 1}, {3}, {2}, {1}});
  const LruCurve c = curve_of(t, PerBatch::kDistinct);
  EXPECT_EQ(c.hits_at(2), 1);
  EXPECT_EQ(brute_lru_batch_cache(t, 2), 1);
}

TEST(Analysis, CapacityZero) {
  const KeyTrace t = singleton_batches({1, 1, 2, 1});
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).hits_at(0), 0);
  EXPECT_EQ(curve_of(t, PerBatch::kDistinct).hits_at(0), 0);
  const auto r = belady_hits(t, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "belady: batch 0 has 1 distinct keys, more than the capacity 0 rows "
            "(every key of a batch must be resident at once)");
  // Only empty batches fit in no rows at all.
  const auto empty = belady_hits(KeyTrace{{}, {0, 0}}, 0);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->hits, 0);
}

TEST(Analysis, BatchLargerThanCapacityNamesTheFirstSuchBatch) {
  // Batch 1 has 3 distinct keys among 4 occurrences, batch 2 has 4.
  const KeyTrace t = batched({{1, 2}, {3, 4, 3, 5}, {1, 2, 3, 4}});
  const auto r = belady_hits(t, 2);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "belady: batch 1 has 3 distinct keys, more than the capacity 2 rows "
            "(every key of a batch must be resident at once)");
  EXPECT_EQ(belady_hits(t, 3).status().message(),
            "belady: batch 2 has 4 distinct keys, more than the capacity 3 rows "
            "(every key of a batch must be resident at once)");
  EXPECT_TRUE(belady_hits(t, 4).is_ok());
  EXPECT_EQ(curve_of(t, PerBatch::kDistinct).min_capacity(), 4);
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).min_capacity(), 0);
}

TEST(Analysis, NegativeCapacityIsAnError) {
  EXPECT_EQ(belady_hits(singleton_batches({1}), -1).status().message(), "belady: capacity -1 rows (expected >= 0)");
}

TEST(Analysis, OpaqueKeysUseAll64Bits) {
  const std::uint64_t a = ~std::uint64_t{0}, b = std::uint64_t{1} << 63, c = 0;
  const KeyTrace t = singleton_batches({a, b, c, a, b, c});
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).hits_at(3), 3);
  EXPECT_EQ(curve_of(t, PerBatch::kEveryAccess).hits_at(2), 0);
  EXPECT_EQ(belady(t, 2), 2);  // keep a for its reuse, then keep c (a is never used again)
  EXPECT_EQ(brute_optimum(t, 2), 2);
}

// ---- random traces against brute force ----

TEST(AnalysisRandom, LruMatchesListSimulationAtEveryCapacity) {
  std::mt19937_64 rng(1);
  for (int iter = 0; iter < 600; ++iter) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 60)(rng);
    const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(1, 12)(rng);
    const double skew = std::uniform_real_distribution<double>(0.0, 1.5)(rng);
    const std::int64_t max_batch = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
    const KeyTrace t = random_trace(rng, n, universe, skew, 0, max_batch);
    ASSERT_TRUE(validate(t).is_ok());
    const std::int64_t d = count_distinct(t);

    const LruCurve every = curve_of(t, PerBatch::kEveryAccess);
    expect_consistent(every);
    EXPECT_EQ(every.accesses(), n);
    EXPECT_EQ(every.distinct_keys(), d);
    for (std::int64_t cap = 0; cap <= d + 1; ++cap)
      ASSERT_EQ(every.hits_at(cap), brute_lru_every_access(t, cap)) << "iter " << iter << " capacity " << cap;
    EXPECT_EQ(every.hits_at(d), n - d);

    const LruCurve per_batch = curve_of(t, PerBatch::kDistinct);
    expect_consistent(per_batch);
    EXPECT_EQ(per_batch.accesses(), distinct_accesses(t));
    EXPECT_EQ(per_batch.min_capacity(), widest_batch(t));
    for (std::int64_t cap = 0; cap <= d + 1; ++cap) {
      ASSERT_EQ(per_batch.hits_at(cap), brute_lru_batch_stack(t, cap)) << "iter " << iter << " capacity " << cap;
      if (cap >= per_batch.min_capacity()) {
        ASSERT_EQ(per_batch.hits_at(cap), brute_lru_batch_cache(t, cap)) << "iter " << iter << " capacity " << cap;
      }
    }
    EXPECT_EQ(per_batch.hits_at(d), per_batch.accesses() - d);
  }
}

// Long traces over few keys: the curve's access times are compacted many times over (they run out
// every distinct_keys accesses or so); every capacity must still match the list simulations.
TEST(AnalysisRandom, LruMatchesListSimulationOnLongTraces) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 6; ++iter) {
    const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(20, 400)(rng);
    const std::int64_t max_batch = std::uniform_int_distribution<std::int64_t>(1, 32)(rng);
    const KeyTrace t = random_trace(rng, 20000, universe, 0.8, 0, max_batch);
    const std::int64_t d = count_distinct(t);
    const LruCurve every = curve_of(t, PerBatch::kEveryAccess);
    const LruCurve per_batch = curve_of(t, PerBatch::kDistinct);
    for (const std::int64_t cap : {std::int64_t{1}, d / 10, d / 3, d / 2, d - 1, d}) {
      ASSERT_EQ(every.hits_at(cap), brute_lru_every_access(t, cap)) << "iter " << iter << " capacity " << cap;
      ASSERT_EQ(per_batch.hits_at(cap), brute_lru_batch_stack(t, cap)) << "iter " << iter << " capacity " << cap;
    }
  }
}

// The curve predicts the cache itself: a CachePlanner with the lru policy, each batch planned and
// retired in turn, hits exactly LruCurve(kDistinct).hits_at(slots) at every capacity a batch fits;
// and tables capped at shares that fill the pool (as strata-tune plans them) each get their own
// curve's hits at their share.
// The batches of `t` as rows: each distinct key numbered densely (a pool's rows are below 2^48).
std::vector<std::vector<Key>> batches_of(const KeyTrace& t) {
  std::map<std::uint64_t, Key> row_of;
  std::vector<std::vector<Key>> out;
  for (std::int64_t b = 0; b < t.num_batches(); ++b) {
    out.emplace_back();
    for (std::int64_t i = t.batch_offsets[b]; i < t.batch_offsets[b + 1]; ++i)
      out.back().push_back(
          row_of.try_emplace(t.keys[static_cast<std::size_t>(i)], static_cast<Key>(row_of.size())).first->second);
  }
  return out;
}

// Hits per table of an lru CachePlanner of the tables' `caps` (0: one uncapped table of `slots`).
std::vector<std::int64_t> pool_hits(const std::vector<KeyTrace>& tables, std::int64_t slots,
                                    const std::vector<std::int64_t>& caps) {
  CachePlannerOptions o;
  o.slots = slots;
  o.policy = Policy::kLru;
  o.record_bytes = 4;
  o.name = "test";
  for (std::size_t t = 0; t < tables.size(); ++t) o.tables.push_back({"t" + std::to_string(t), caps[t]});
  CachePlanner pool(o);
  std::vector<std::vector<std::vector<Key>>> keys;
  for (const KeyTrace& t : tables) keys.push_back(batches_of(t));
  for (std::size_t b = 0; b < keys[0].size(); ++b) {
    std::vector<UniqueKeys> unique;
    for (std::size_t t = 0; t < tables.size(); ++t)
      unique.push_back(dedup_keys(keys[t][b].data(), static_cast<std::int64_t>(keys[t][b].size())));
    std::vector<FeatureKeys> features;
    for (std::size_t t = 0; t < tables.size(); ++t) features.push_back({static_cast<int>(t), &unique[t]});
    auto probe = pool.probe(static_cast<std::int64_t>(b), features);
    EXPECT_TRUE(probe.is_ok()) << probe.status().to_string();
    if (!probe.is_ok()) return {};
    pool.retire(pool.commit(std::move(probe).value()), true);
  }
  std::vector<std::int64_t> hits;
  for (std::size_t t = 0; t < tables.size(); ++t) hits.push_back(pool.table_stats(static_cast<int>(t)).hits);
  return hits;
}

TEST(AnalysisRandom, LruCurveEqualsTheCachePlanner) {
  std::mt19937_64 rng(21);
  for (int iter = 0; iter < 20; ++iter) {
    const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(10, 300)(rng);
    const std::int64_t max_batch = std::uniform_int_distribution<std::int64_t>(1, 24)(rng);
    const KeyTrace t = random_trace(rng, 3000, universe, 0.9, 1, max_batch);
    const LruCurve c = curve_of(t, PerBatch::kDistinct);
    const std::int64_t d = count_distinct(t);
    for (const std::int64_t cap : {c.min_capacity(), c.min_capacity() + 1, (c.min_capacity() + d) / 2, d}) {
      if (cap < 1) continue;
      ASSERT_EQ(pool_hits({t}, cap, {0})[0], c.hits_at(cap)) << "iter " << iter << " capacity " << cap;
    }
  }
}

TEST(AnalysisRandom, CappedSharesGetTheirOwnCurves) {
  std::mt19937_64 rng(22);
  for (int iter = 0; iter < 10; ++iter) {
    std::vector<KeyTrace> tables;
    std::vector<std::int64_t> caps;
    std::int64_t slots = 0;
    for (int t = 0; t < 3; ++t) {
      // Same batch count for every table: batch b of each is one step.
      KeyTrace k;
      k.batch_offsets.push_back(0);
      const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(20, 200)(rng);
      for (int b = 0; b < 150; ++b) {
        const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 12)(rng);
        for (std::int64_t i = 0; i < n; ++i) k.keys.push_back(rng() % static_cast<std::uint64_t>(universe));
        k.batch_offsets.push_back(k.num_keys());
      }
      const LruCurve c = curve_of(k, PerBatch::kDistinct);
      const std::int64_t cap = std::max<std::int64_t>(
          1, std::uniform_int_distribution<std::int64_t>(c.min_capacity(), c.min_capacity() + universe / 2)(rng));
      tables.push_back(std::move(k));
      caps.push_back(cap);
      slots += cap;
    }
    const std::vector<std::int64_t> hits = pool_hits(tables, slots, caps);
    ASSERT_EQ(hits.size(), 3u);
    for (int t = 0; t < 3; ++t)
      ASSERT_EQ(hits[t], curve_of(tables[t], PerBatch::kDistinct).hits_at(caps[t]))
          << "iter " << iter << " table " << t;
  }
}

TEST(AnalysisRandom, BeladyIsOptimalOnTinyTraces) {
  std::mt19937_64 rng(2);
  int compared = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 12)(rng);
    const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
    const double skew = std::uniform_real_distribution<double>(0.0, 1.2)(rng);
    const std::int64_t max_batch = std::uniform_int_distribution<std::int64_t>(1, 4)(rng);
    const KeyTrace t = random_trace(rng, n, universe, skew, iter % 5 == 0 ? 0 : 1, max_batch);
    const std::int64_t widest = widest_batch(t);
    for (std::int64_t cap = 0; cap <= 3; ++cap) {
      const auto r = belady_hits(t, cap);
      if (cap < widest) {
        ASSERT_FALSE(r.is_ok()) << "iter " << iter << " capacity " << cap;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        continue;
      }
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->accesses, distinct_accesses(t));
      EXPECT_EQ(r->compulsory_misses, count_distinct(t));
      ASSERT_EQ(r->hits, brute_optimum(t, cap)) << "iter " << iter << " capacity " << cap;
      ++compared;
    }
  }
  EXPECT_GT(compared, 4000);
}

TEST(AnalysisRandom, BeladyMatchesLinearFurthestFirstOnLargerTraces) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 60; ++iter) {
    const std::int64_t universe = std::uniform_int_distribution<std::int64_t>(5, 300)(rng);
    const std::int64_t max_batch = std::uniform_int_distribution<std::int64_t>(1, 24)(rng);
    const KeyTrace t = random_trace(rng, 1500, universe, 0.9, 1, max_batch);
    const std::int64_t widest = widest_batch(t);
    const std::int64_t d = count_distinct(t);
    for (const std::int64_t cap : {widest, widest + 1, (widest + d) / 2, d - 1, d, d + 5}) {
      if (cap < widest) continue;
      ASSERT_EQ(belady(t, cap), brute_furthest_first(t, cap)) << "iter " << iter << " capacity " << cap;
    }
  }
}

TEST(AnalysisRandom, EnoughCapacityHitsEverythingButTheFirstUse) {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 100; ++iter) {
    const KeyTrace t = random_trace(rng, 400, 50, 1.0, 0, 10);
    const std::int64_t d = count_distinct(t);
    const LruCurve every = curve_of(t, PerBatch::kEveryAccess);
    const LruCurve per_batch = curve_of(t, PerBatch::kDistinct);
    for (const std::int64_t cap : {d, d + 1, 10 * d}) {
      EXPECT_EQ(every.hits_at(cap), t.num_keys() - d);
      EXPECT_EQ(per_batch.hits_at(cap), per_batch.accesses() - d);
      const auto opt = belady_hits(t, cap);
      ASSERT_TRUE(opt.is_ok());
      EXPECT_EQ(opt->hits, opt->accesses - d);
    }
  }
}

// LRU <= Belady at every feasible capacity, and more rows never hurt the optimum; over skew and
// batch size.
class LruVsBelady : public ::testing::TestWithParam<std::tuple<double, std::int64_t>> {};

TEST_P(LruVsBelady, LruNeverBeatsTheOptimum) {
  const auto [skew, max_batch] = GetParam();
  std::mt19937_64 rng(static_cast<std::uint64_t>(skew * 100) * 1000 + static_cast<std::uint64_t>(max_batch));
  for (int iter = 0; iter < 6; ++iter) {
    const KeyTrace t = random_trace(rng, 2000, 300, skew, max_batch == 1 ? 1 : 0, max_batch);
    const LruCurve per_batch = curve_of(t, PerBatch::kDistinct);
    const LruCurve every = curve_of(t, PerBatch::kEveryAccess);
    std::int64_t previous = -1;
    // Every capacity near the smallest (where the policies differ most), then every 5th.
    for (std::int64_t cap = per_batch.min_capacity(); cap <= per_batch.distinct_keys() + 1;
         cap += cap < per_batch.min_capacity() + 40 ? 1 : 5) {
      const std::int64_t opt = belady(t, cap);
      ASSERT_LE(per_batch.hits_at(cap), opt) << "capacity " << cap;
      ASSERT_GE(opt, previous) << "capacity " << cap;
      previous = opt;
      if (max_batch == 1) {  // one key per batch: the two models are the same
        ASSERT_EQ(every.hits_at(cap), per_batch.hits_at(cap));
      }
    }
    EXPECT_EQ(belady(t, per_batch.distinct_keys()), per_batch.accesses() - per_batch.distinct_keys());
  }
}

INSTANTIATE_TEST_SUITE_P(SkewAndBatch, LruVsBelady,
                         ::testing::Combine(::testing::Values(0.0, 0.8, 1.2), ::testing::Values(1, 8, 32)));

}  // namespace strata::cache
