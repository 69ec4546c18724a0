#include "core/row_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
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

// make_optimizer_step(TableSpec) carries the table's element types, rounding and shard origin; an
// fp32 table's step is the optimizer's step with nothing to round.
TEST(RowMath, OptimizerStepOfATableCarriesItsRounding) {
  TableSpec s;
  s.name = "user";
  s.rows = 10;
  s.dim = 4;
  s.optimizer.kind = OptimizerKind::kAdam;
  s.optimizer.learning_rate = 0.25f;
  const OptimizerStep fp32 = make_optimizer_step(s, 3);
  const OptimizerStep plain = make_optimizer_step(s.optimizer, 3);
  EXPECT_EQ(fp32.bias1, plain.bias1);
  EXPECT_EQ(fp32.bias2, plain.bias2);
  EXPECT_EQ(fp32.spec.learning_rate, 0.25f);
  EXPECT_EQ(fp32.round.dtype, DType::kF32);
  EXPECT_FALSE(fp32.round.stochastic);
  EXPECT_EQ(fp32.round.step, 3);

  s.dtype = DType::kBF16;
  s.state_dtype = DType::kBF16;
  s.stochastic_rounding = true;
  s.init.seed = 99;
  s.init.row_stride = 4;
  s.init.row_offset = 1;
  s.init.col_offset = 8;
  const Rounding r = make_optimizer_step(s, 7).round;
  EXPECT_EQ(r.dtype, DType::kBF16);
  EXPECT_EQ(r.state_dtype, DType::kBF16);
  EXPECT_TRUE(r.stochastic);
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.tseed, table_seed(99 ^ kRoundingSeed, table_name_hash("user")));
  EXPECT_EQ(r.tseed, rounding_seed(s));
  // Local row 5 of this shard is global row 21.
  EXPECT_EQ(r.row_key(5, RoundingSalt::kState1), rounding_row_key(r.tseed, 21, 7, RoundingSalt::kState1));
  EXPECT_EQ(r.bits(r.row_key(5, RoundingSalt::kWeights), 2),
            rounding_bits(rounding_row_key(r.tseed, 21, 7, RoundingSalt::kWeights), 10));
}

// store_weight rounds as core/half.hpp does, to nearest even or stochastically with the bits of
// (seed, table, global row, step, global column, salt) and nothing else; fp32 is stored as is.
TEST(RowMath, StoreWeightRoundsAsHalfDoes) {
  TableSpec s;
  s.name = "item";
  s.rows = 100;
  s.dim = 16;
  s.init.seed = 5;
  std::mt19937 gen(31);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (const bool sr : {false, true}) {
    s.stochastic_rounding = sr;
    s.dtype = DType::kBF16;
    const Rounding r = make_optimizer_step(s, 12).round;
    for (std::int64_t row = 0; row < 20; ++row) {
      for (const RoundingSalt salt : {RoundingSalt::kWeights, RoundingSalt::kState0, RoundingSalt::kState1}) {
        const std::uint64_t key = r.row_key(row, salt);
        Bf16 b[16];
        F16 h[16];
        float f[16];
        for (std::int32_t c = 0; c < 16; ++c) {
          const float w = value(gen);
          const std::uint32_t bits =
              rounding_bits(rounding_row_key(table_seed(5 ^ kRoundingSeed, table_name_hash("item")), row, 12, salt), c);
          store_weight(r, key, c, w, b);
          store_weight(r, key, c, w, h);
          store_weight(r, key, c, w, f);
          EXPECT_EQ(b[c].bits, sr ? narrow_bf16_sr(w, bits) : narrow_bf16_rne(w));
          EXPECT_EQ(h[c].bits, sr ? narrow_f16_sr(w, bits) : narrow_f16_rne(w));
          EXPECT_EQ(float_bits(f[c]), float_bits(w));
          EXPECT_EQ(float_bits(stored_value(r, DType::kBF16, key, c, w)), float_bits(widen_bf16(b[c].bits)));
          EXPECT_EQ(float_bits(stored_value(r, DType::kF16, key, c, w)), float_bits(widen_f16(h[c].bits)));
          EXPECT_EQ(float_bits(stored_value(r, DType::kF32, key, c, w)), float_bits(w));
        }
      }
    }
  }
  // The bits differ with the step, the row, the column and the salt, and are the same twice.
  s.stochastic_rounding = true;
  s.dtype = DType::kBF16;
  const Rounding a = make_optimizer_step(s, 1).round, b = make_optimizer_step(s, 2).round;
  const std::uint64_t k = a.row_key(3, RoundingSalt::kWeights);
  EXPECT_EQ(a.bits(k, 4), make_optimizer_step(s, 1).round.bits(k, 4));
  EXPECT_NE(a.bits(k, 4), b.bits(b.row_key(3, RoundingSalt::kWeights), 4));
  EXPECT_NE(a.bits(k, 4), a.bits(a.row_key(4, RoundingSalt::kWeights), 4));
  EXPECT_NE(a.bits(k, 4), a.bits(k, 5));
  EXPECT_NE(a.bits(k, 4), a.bits(a.row_key(3, RoundingSalt::kState0), 4));
  // A value between two bf16 neighbours rounds both ways over the columns: stochastic, not nearest.
  const float x = widen_bf16(0x3F80) + 0.25f * (widen_bf16(0x3F81) - widen_bf16(0x3F80));
  Bf16 row[1000];
  int up = 0;
  for (std::int32_t c = 0; c < 1000; ++c) {
    store_weight(a, k, c, x, row);
    EXPECT_EQ(row[c].bits, narrow_bf16_sr(x, a.bits(k, c)));
    up += row[c].bits == 0x3F81 ? 1 : 0;
  }
  EXPECT_GT(up, 180);
  EXPECT_LT(up, 320);
}

namespace {

// Stores w as element 0 of the half row at `words` (a record's 32-bit words, as the host tables
// hold them) between two loads of its first word. Out of line, so the compiler sees only the types.
template <class Elem>
[[gnu::noinline]] std::uint32_t store_between_loads(const Rounding& r, float* words, float w) {
  const float before = words[0];
  store_weight(r, 0, 0, w, reinterpret_cast<Elem*>(words));
  return float_bits(words[0]) ^ float_bits(before);
}

}  // namespace

// Half elements live in records of fp32 words: store_weight writes their 16 bits through a type
// that may alias the words, so a later load of the word sees them (a store through Bf16 / F16, a
// struct of a uint16_t, may be assumed by the optimizer not to touch a float).
TEST(RowMath, StoreWeightIsSeenByLoadsOfTheRecordWords) {
  const Rounding r;
  float words[2] = {0.0f, 0.0f};
  EXPECT_EQ(store_between_loads<Bf16>(r, words, 1.0f), std::uint32_t{narrow_bf16_rne(1.0f)});  // low half (LE)
  words[0] = 0.0f;
  EXPECT_EQ(store_between_loads<F16>(r, words, 1.0f), std::uint32_t{narrow_f16_rne(1.0f)});
}

TEST(RowMath, PoolingScales) {
  EXPECT_EQ(bag_scale(Pooling::kSum, 4), 1.0f);
  EXPECT_EQ(bag_scale(Pooling::kMean, 4), 0.25f);
  EXPECT_EQ(bag_scale(Pooling::kMean, 0), 1.0f);
  const float w[] = {2.0f};
  EXPECT_EQ(grad_scale(Pooling::kMean, 4, w, 0), 0.5f);
}

}  // namespace strata
