#include "core/key_batch.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace strata {

namespace {
TableSpec spec() {
  TableSpec s;
  s.name = "item";
  s.rows = 10;
  s.dim = 4;
  return s;
}
JaggedKeys feature() {
  JaggedKeys f;
  f.table = "item";
  f.offsets = {0, 2, 2, 5};
  f.keys = {1, 9, 0, 0, 3};
  return f;
}
}  // namespace

TEST(KeyBatch, ValidFeature) {
  EXPECT_TRUE(validate(feature(), spec(), 3).is_ok());
  KeyBatch b;
  b.features = {feature(), feature()};
  EXPECT_EQ(b.batch_size(), 3);
  EXPECT_EQ(b.total_keys(), 10);
  EXPECT_EQ(output_rows(feature(), Pooling::kSum), 3);
  EXPECT_EQ(output_rows(feature(), Pooling::kNone), 5);
}

TEST(KeyBatch, KeyOutOfRangeNamesTableValueAndRange) {
  auto f = feature();
  f.keys[1] = 10;
  EXPECT_EQ(validate(f, spec(), 3).message(), "table 'item': key 10 at position 1 out of range [0, 10)");
  f.keys[1] = -1;
  EXPECT_EQ(validate(f, spec(), 3).code(), StatusCode::kOutOfRange);
}

// The range check ORs every key in lanes of eight plus a scalar tail: a bad key must be found at
// every position (in a lane, in the tail), at every extreme value, and the first one named.
TEST(KeyBatch, KeyOutOfRangeFoundAtEveryPositionAndExtreme) {
  const Key bad_values[] = {-1,
                            10,
                            11,
                            std::numeric_limits<Key>::min(),
                            std::numeric_limits<Key>::max(),
                            std::numeric_limits<Key>::min() + 9,
                            Key{1} << 62};
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{37}}) {
    for (std::size_t pos = 0; pos < n; ++pos) {
      for (const Key bad : bad_values) {
        JaggedKeys f;
        f.table = "item";
        f.offsets = {0, static_cast<std::int64_t>(n)};
        for (std::size_t i = 0; i < n; ++i) f.keys.push_back(static_cast<Key>(i % 10));
        ASSERT_TRUE(validate(f, spec(), 1).is_ok());
        f.keys[pos] = bad;
        if (pos + 1 < n) f.keys[n - 1] = 10;  // a later bad key: the first is the one named
        const Status st = validate(f, spec(), 1);
        EXPECT_EQ(st.message(), "table 'item': key " + std::to_string(bad) + " at position " + std::to_string(pos) +
                                    " out of range [0, 10)")
            << "n " << n << " pos " << pos;
      }
    }
  }
  // Every valid extreme passes: 0 and rows - 1 in every position.
  JaggedKeys f;
  f.table = "item";
  f.offsets = {0, 19};
  for (int i = 0; i < 19; ++i) f.keys.push_back(i % 2 ? 9 : 0);
  EXPECT_TRUE(validate(f, spec(), 1).is_ok());
}

// int32 keys are checked in 32-bit lanes plus a scalar tail: a bad key is found at every position, at every extreme,
// against tables of few rows and of more rows than an int32 names (then only negative keys are out of range).
TEST(KeyBatch, Int32KeyOutOfRangeFoundAtEveryPositionAndExtreme) {
  const std::int32_t bad_values[] = {-1, 10, 11, std::numeric_limits<std::int32_t>::min(),
                                     std::numeric_limits<std::int32_t>::max()};
  for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{70}}) {
    for (std::size_t pos = 0; pos < n; pos += 3) {
      for (const std::int32_t bad : bad_values) {
        JaggedKeys f;
        f.table = "item";
        f.offsets = {0, static_cast<std::int64_t>(n)};
        for (std::size_t i = 0; i < n; ++i) f.keys32.push_back(static_cast<std::int32_t>(i % 10));
        ASSERT_TRUE(validate(f, spec(), 1).is_ok());
        f.keys32[pos] = bad;
        const Status st = validate(f, spec(), 1);
        EXPECT_EQ(st.message(), "table 'item': key " + std::to_string(bad) + " at position " + std::to_string(pos) +
                                    " out of range [0, 10)")
            << "n " << n << " pos " << pos;
      }
    }
  }
  TableSpec big = spec();
  big.rows = std::int64_t{1} << 40;
  JaggedKeys f;
  f.table = "item";
  f.offsets = {0, 40};
  for (int i = 0; i < 40; ++i) f.keys32.push_back(i % 2 ? std::numeric_limits<std::int32_t>::max() : 0);
  EXPECT_TRUE(validate(f, big, 1).is_ok());
  f.keys32[33] = -5;
  EXPECT_EQ(validate(f, big, 1).code(), StatusCode::kOutOfRange);
}

TEST(KeyBatch, BadOffsets) {
  auto f = feature();
  f.offsets = {0, 3, 2, 5};
  EXPECT_EQ(validate(f, spec(), 3).message(),
            "table 'item': offsets are not monotone: offsets[2] = 2 < offsets[1] = 3");
  f.offsets = {0, 2, 2, 4};
  EXPECT_EQ(validate(f, spec(), 3).message(), "table 'item': offsets end at 4 (expected the key count 5)");
  f.offsets = {1, 2, 2, 5};
  EXPECT_FALSE(validate(f, spec(), 3).is_ok());
  f = feature();
  EXPECT_NE(validate(f, spec(), 4).message().find("batch size 3"), std::string::npos);
  f.offsets.clear();
  EXPECT_FALSE(validate(f, spec(), 3).is_ok());
}

TEST(KeyBatch, Weights) {
  auto f = feature();
  f.weights = {1, 2};
  EXPECT_EQ(validate(f, spec(), 3).message(), "table 'item': 2 weights for 5 keys (expected none or one per key)");
  f.weights = {1, 2, 3, 4, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_FALSE(validate(f, spec(), 3).is_ok());
}

}  // namespace strata
