#include "core/table_spec.hpp"

#include <gtest/gtest.h>

namespace strata {

TableSpec good() {
  TableSpec s;
  s.name = "user";
  s.rows = 100;
  s.dim = 8;
  return s;
}

TEST(TableSpec, ValidSpecPasses) { EXPECT_TRUE(validate(good()).is_ok()); }

TEST(TableSpec, BadFieldsNameTableAndValue) {
  auto s = good();
  s.rows = 0;
  EXPECT_EQ(validate(s).message(), "table 'user': rows 0 must be > 0");
  s = good();
  s.dim = -3;
  EXPECT_EQ(validate(s).message(), "table 'user': dim -3 must be > 0");
  s = good();
  s.name = "";
  EXPECT_FALSE(validate(s).is_ok());
  s = good();
  s.name = "a/b";
  EXPECT_FALSE(validate(s).is_ok());
  s = good();
  s.dtype = DType::kF16;
  EXPECT_NE(validate(s).message().find("fp16"), std::string::npos);
  s = good();
  s.optimizer.learning_rate = 0;
  EXPECT_NE(validate(s).message().find("learning_rate"), std::string::npos);
  s = good();
  s.optimizer.beta1 = 1.0f;
  EXPECT_NE(validate(s).message().find("beta1"), std::string::npos);
}

TEST(TableSpec, StateDims) {
  EXPECT_EQ(optimizer_state_dim(OptimizerKind::kSgd, 16), 0);
  EXPECT_EQ(optimizer_state_dim(OptimizerKind::kAdagrad, 16), 16);
  EXPECT_EQ(optimizer_state_dim(OptimizerKind::kRowwiseAdagrad, 16), 1);
  EXPECT_EQ(optimizer_state_dim(OptimizerKind::kAdam, 16), 32);
}

TEST(TableSpec, NamesRoundTrip) {
  for (auto k : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam})
    EXPECT_EQ(parse_optimizer(to_string(k)).value(), k);
  for (auto p : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) EXPECT_EQ(parse_pooling(to_string(p)).value(), p);
  EXPECT_EQ(parse_dtype("fp32").value(), DType::kF32);
  EXPECT_EQ(parse_optimizer("adamw").status().message(),
            "unknown optimizer 'adamw' (expected sgd, adagrad, rowwise_adagrad or adam)");
  EXPECT_FALSE(parse_pooling("max").is_ok());
}

TEST(TableSpec, NameHashIsStableAndDistinct) {
  EXPECT_EQ(table_name_hash("user"), table_name_hash("user"));
  EXPECT_NE(table_name_hash("user"), table_name_hash("item"));
  EXPECT_EQ(table_name_hash(""), 1469598103934665603ull);  // FNV-1a offset basis
}

}  // namespace strata
