#include "host/dedup.hpp"

#include <gtest/gtest.h>

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

TEST(Dedup, MatchesAMapOnRandomKeys) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = static_cast<int>(rng() % 5000);
    const Key range = 1 + static_cast<Key>(rng() % 3000);
    std::vector<Key> keys(static_cast<std::size_t>(n));
    for (auto& k : keys) k = static_cast<Key>(rng() % static_cast<std::uint64_t>(range)) * 1000003;  // sparse, large keys
    auto u = dedup_keys(keys.data(), n);
    std::map<Key, std::vector<std::int32_t>> want;
    std::vector<Key> order;
    for (int j = 0; j < n; ++j) {
      if (!want.count(keys[static_cast<std::size_t>(j)])) order.push_back(keys[static_cast<std::size_t>(j)]);
      want[keys[static_cast<std::size_t>(j)]].push_back(j);
    }
    ASSERT_EQ(u.keys, order);
    for (std::size_t i = 0; i < order.size(); ++i) {
      std::vector<std::int32_t> got(u.positions.begin() + u.offsets[i], u.positions.begin() + u.offsets[i + 1]);
      ASSERT_EQ(got, want[order[i]]);
    }
  }
}

TEST(Dedup, BagOfPositions) {
  const std::int64_t offsets[] = {0, 2, 2, 5};
  EXPECT_EQ(bag_of_positions(offsets, 3), (std::vector<std::int32_t>{0, 0, 2, 2, 2}));
}

}  // namespace strata
