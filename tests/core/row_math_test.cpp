#include "core/row_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strata {

TEST(RowMath, InitialValuesArePureAndInRange) {
  const auto seed = table_seed(7, table_name_hash("t"));
  double sum = 0;
  for (int r = 0; r < 1000; ++r) {
    for (int c = 0; c < 8; ++c) {
      const float v = initial_value(seed, r, c, 0.5f);
      EXPECT_GE(v, -0.5f);
      EXPECT_LT(v, 0.5f);
      EXPECT_EQ(v, initial_value(seed, r, c, 0.5f));
      sum += v;
    }
  }
  EXPECT_NEAR(sum / 8000, 0.0, 0.02);
  EXPECT_NE(initial_value(seed, 1, 0, 1), initial_value(seed, 2, 0, 1));
  EXPECT_NE(initial_value(seed, 1, 0, 1), initial_value(table_seed(8, table_name_hash("t")), 1, 0, 1));
  EXPECT_NE(initial_value(seed, 1, 0, 1), initial_value(table_seed(7, table_name_hash("u")), 1, 0, 1));
}

TEST(RowMath, Sgd) {
  OptimizerSpec o;
  o.learning_rate = 0.5f;
  std::vector<float> w{1, 2}, g{2, -4}, s(4);
  apply_optimizer(make_optimizer_step(o, 1), w.data(), s.data(), g.data(), 2);
  EXPECT_FLOAT_EQ(w[0], 0.0f);
  EXPECT_FLOAT_EQ(w[1], 4.0f);
}

TEST(RowMath, AdagradAndRowwise) {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdagrad;
  o.learning_rate = 1.0f;
  o.eps = 0.0f + 1e-10f;
  std::vector<float> w{0, 0}, s{0, 0, 0, 0}, g{3, -4};
  apply_optimizer(make_optimizer_step(o, 1), w.data(), s.data(), g.data(), 2);
  EXPECT_FLOAT_EQ(s[0], 9.0f);
  EXPECT_NEAR(w[0], -1.0f, 1e-6);
  EXPECT_NEAR(w[1], 1.0f, 1e-6);

  o.kind = OptimizerKind::kRowwiseAdagrad;
  std::vector<float> w2{0, 0}, s2{0, 0, 0, 0}, g2{3, -4};
  apply_optimizer(make_optimizer_step(o, 1), w2.data(), s2.data(), g2.data(), 2);
  EXPECT_FLOAT_EQ(s2[0], 12.5f);  // mean of 9 and 16
  EXPECT_NEAR(w2[0], -3.0f / std::sqrt(12.5f), 1e-6);
}

TEST(RowMath, AdamFirstStepMovesByLearningRate) {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdam;
  o.learning_rate = 0.1f;
  std::vector<float> w{1}, s{0, 0}, g{5};
  apply_optimizer(make_optimizer_step(o, 1), w.data(), s.data(), g.data(), 1);
  EXPECT_NEAR(w[0], 0.9f, 1e-5);  // bias-corrected first step is lr * sign(g)
  EXPECT_NEAR(s[0], 0.5f, 1e-6);
  EXPECT_NEAR(s[1], 0.025f, 1e-6);
}

TEST(RowMath, WeightDecayAddsToGradient) {
  OptimizerSpec o;
  o.learning_rate = 1.0f;
  o.weight_decay = 0.5f;
  std::vector<float> w{2}, g{0}, s(2);
  apply_optimizer(make_optimizer_step(o, 1), w.data(), s.data(), g.data(), 1);
  EXPECT_FLOAT_EQ(w[0], 1.0f);
}

TEST(RowMath, PoolingScales) {
  EXPECT_EQ(bag_scale(Pooling::kSum, 4), 1.0f);
  EXPECT_EQ(bag_scale(Pooling::kMean, 4), 0.25f);
  EXPECT_EQ(bag_scale(Pooling::kMean, 0), 1.0f);
  const float w[] = {2.0f};
  EXPECT_EQ(grad_scale(Pooling::kMean, 4, w, 0), 0.5f);
}

}  // namespace strata
