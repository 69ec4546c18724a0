#include "host/dedup.hpp"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <limits>
#include <string>

#include <map>
#include <random>

namespace strata {

TEST(Dedup, EmptyAndSingle) {
  auto u = dedup_keys(nullptr, 0);
  EXPECT_EQ(u.size(), 0);
  EXPECT_EQ(u.offsets, std::vector<std::int64_t>{0});
  Key k = 5;
  u = dedup_keys(&k, 1);
  EXPECT_EQ(u.keys, std::vector<Key>{5});
  EXPECT_EQ(u.positions, std::vector<std::int32_t>{0});
}

namespace {

// Checks u against a std::map built from keys: unique keys in first-use order, each with its
// positions ascending.
void expect_matches_map(const std::vector<Key>& keys, const UniqueKeys& u) {
  std::map<Key, std::vector<std::int32_t>> want;
  std::vector<Key> order;
  for (std::size_t j = 0; j < keys.size(); ++j) {
    if (!want.count(keys[j])) order.push_back(keys[j]);
    want[keys[j]].push_back(static_cast<std::int32_t>(j));
  }
  ASSERT_EQ(u.keys, order);
  ASSERT_EQ(u.offsets.size(), order.size() + 1);
  ASSERT_EQ(u.positions.size(), keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::vector<std::int32_t> got(u.positions.begin() + u.offsets[i], u.positions.begin() + u.offsets[i + 1]);
    ASSERT_EQ(got, want[order[i]]) << "unique key " << i;
  }
}

}  // namespace

TEST(Dedup, MatchesAMapOnRandomKeys) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = static_cast<int>(rng() % 5000);
    const Key range = 1 + static_cast<Key>(rng() % 3000);
    std::vector<Key> keys(static_cast<std::size_t>(n));
    for (auto& k : keys)
      k = static_cast<Key>(rng() % static_cast<std::uint64_t>(range)) * 1000003;  // sparse, large keys
    expect_matches_map(keys, dedup_keys(keys.data(), n));
  }
}

// kAny's parallel path (hash partitions, chunks of positions) gives every key with all its
// positions ascending, each key once, in the same order whatever the thread count; the scratch and
// output are reused across sizes around the chunk size, few and many duplicates, one hot key,
// negative and huge keys. Runs in arenas of 4 and 3 threads, so the parallel path is taken on any
// machine; kFirstUse with the same scratch stays in first-use order.
TEST(Dedup, AnyOrderParallelPathHasEveryKeyAndPosition) {
  tbb::task_arena arena4(4), arena3(3);
  std::mt19937_64 rng(7);
  DedupScratch par, par3, ser;
  par.parallel_from = 0;
  par3.parallel_from = 0;
  ser.parallel_from = 0;  // kFirstUse ignores it
  UniqueKeys up, up3, us;
  const std::int64_t sizes[] = {1, 2, 100, 16383, 16384, 16385, 40000, 70001};
  for (int trial = 0; trial < 24; ++trial) {
    const std::int64_t n = sizes[trial % 8];
    const int shape = trial / 8;  // 0: mostly unique, 1: many duplicates, 2: a hot key and extremes
    std::vector<Key> keys(static_cast<std::size_t>(n));
    for (auto& k : keys) {
      if (shape == 0) k = static_cast<Key>(rng() % 2000000);
      if (shape == 1) k = static_cast<Key>(rng() % 97);
      if (shape == 2) {
        const std::uint64_t r = rng() % 8;
        k = r < 5    ? 42
            : r == 5 ? -static_cast<Key>(rng() % 1000)
            : r == 6 ? std::numeric_limits<Key>::max() - static_cast<Key>(rng() % 3)
                     : static_cast<Key>(rng());
      }
    }
    SCOPED_TRACE("n " + std::to_string(n) + " shape " + std::to_string(shape));
    arena4.execute([&] { dedup_keys(keys.data(), n, up, par, DedupOrder::kAny); });
    arena3.execute([&] { dedup_keys(keys.data(), n, up3, par3, DedupOrder::kAny); });
    arena4.execute([&] { dedup_keys(keys.data(), n, us, ser); });
    expect_matches_map(keys, us);
    EXPECT_EQ(up.keys, up3.keys);
    EXPECT_EQ(up.positions, up3.positions);
    // kAny: the same (key -> positions) as first-use order, in some order.
    std::map<Key, std::vector<std::int32_t>> want, got;
    for (std::int64_t i = 0; i < us.size(); ++i)
      want[us.keys[static_cast<std::size_t>(i)]] = {us.positions.begin() + us.offsets[static_cast<std::size_t>(i)],
                                                    us.positions.begin() + us.offsets[static_cast<std::size_t>(i) + 1]};
    ASSERT_EQ(up.offsets.size(), up.keys.size() + 1);
    ASSERT_EQ(up.offsets.front(), 0);
    ASSERT_EQ(up.offsets.back(), n);
    for (std::int64_t i = 0; i < up.size(); ++i) {
      ASSERT_LE(up.offsets[static_cast<std::size_t>(i)], up.offsets[static_cast<std::size_t>(i) + 1]);
      const bool fresh =
          got.emplace(up.keys[static_cast<std::size_t>(i)],
                      std::vector<std::int32_t>(up.positions.begin() + up.offsets[static_cast<std::size_t>(i)],
                                                up.positions.begin() + up.offsets[static_cast<std::size_t>(i) + 1]))
              .second;
      ASSERT_TRUE(fresh) << "key " << up.keys[static_cast<std::size_t>(i)] << " twice";
    }
    EXPECT_EQ(got, want);
  }
}

TEST(Dedup, BagOfPositions) {
  const std::int64_t offsets[] = {0, 2, 2, 5};
  EXPECT_EQ(bag_of_positions(offsets, 3), (std::vector<std::int32_t>{0, 0, 2, 2, 2}));
}

// int32 keys (read as they are) dedup as the same keys as int64 do, in first-use and in any order (its parallel
// path forced), and a feature's int32 offsets give the bags int64 ones give (issue 35).
TEST(Dedup, Int32KeysGiveTheInt64Result) {
  std::mt19937_64 rng(36);
  JaggedKeys wide;
  wide.offsets = {0, 3, 3, 7, 10};
  for (int j = 0; j < 10; ++j) wide.keys.push_back(static_cast<Key>(rng() % 6));
  JaggedKeys narrow;
  narrow.offsets32.assign(wide.offsets.begin(), wide.offsets.end());
  narrow.keys32.assign(wide.keys.begin(), wide.keys.end());
  std::vector<std::int32_t> bag_wide, bag_narrow;
  bag_of_positions(wide, bag_wide);
  bag_of_positions(narrow, bag_narrow);
  EXPECT_EQ(bag_wide, bag_narrow);
  EXPECT_EQ(bag_wide, (std::vector<std::int32_t>{0, 0, 0, 2, 2, 2, 2, 3, 3, 3}));
  std::vector<std::int64_t> offsets(5);
  std::vector<Key> keys(10);
  copy_offsets(narrow, offsets.data());
  copy_keys(narrow, keys.data());
  EXPECT_EQ(offsets, wide.offsets);
  EXPECT_EQ(keys, wide.keys);
  std::vector<Key> many(100000);
  for (Key& k : many) k = static_cast<Key>(rng() % 30000);
  const std::vector<std::int32_t> many32(many.begin(), many.end());
  tbb::task_arena arena(2);
  arena.execute([&] {
    for (const DedupOrder order : {DedupOrder::kFirstUse, DedupOrder::kAny}) {
      UniqueKeys a, b;
      DedupScratch sa, sb;
      sa.parallel_from = sb.parallel_from = 1000;
      dedup_keys(many.data(), static_cast<std::int64_t>(many.size()), a, sa, order);
      dedup_keys(many32.data(), static_cast<std::int64_t>(many32.size()), b, sb, order);
      EXPECT_EQ(a.keys, b.keys);
      EXPECT_EQ(a.offsets, b.offsets);
      EXPECT_EQ(a.positions, b.positions);
    }
  });
}

}  // namespace strata
