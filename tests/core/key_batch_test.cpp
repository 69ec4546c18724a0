#include "core/key_batch.hpp"

#include <gtest/gtest.h>

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

TEST(KeyBatch, BadOffsets) {
  auto f = feature();
  f.offsets = {0, 3, 2, 5};
  EXPECT_EQ(validate(f, spec(), 3).message(), "table 'item': offsets are not monotone: offsets[2] = 2 < offsets[1] = 3");
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
