#include "core/table_spec.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace strata {

TableSpec good() {
  TableSpec s;
  s.name = "user";
  s.rows = 100;
  s.dim = 8;
  return s;
}

TEST(TableSpec, ValidSpecPasses) { EXPECT_TRUE(validate(good()).is_ok()); }

// Hyper-parameters must be finite (an infinite weight_decay turned every row it touched to -inf
// with finite gradients, and did not round-trip through JSON; from a review), and sizes must keep
// every byte count within 64 bits (2 * dim for adam overflowed int32 at dim 2^30, and rows x record
// wrapped size_t: both wrote past a table's memory).
TEST(TableSpec, InfiniteHyperParametersAndSizesBeyondAddressingAreRefused) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int field = 0; field < 3; ++field) {
    auto s = good();
    float& f = field == 0 ? s.optimizer.eps : field == 1 ? s.optimizer.weight_decay : s.optimizer.initial_accumulator;
    f = inf;
    EXPECT_FALSE(validate(s).is_ok()) << "field " << field;
  }
  auto s = good();
  s.dim = 1 << 30;
  s.optimizer.kind = OptimizerKind::kAdam;
  EXPECT_NE(validate(s).message().find("above the widest row"), std::string::npos) << validate(s).message();
  s = good();
  s.dim = 16;
  s.rows = (std::int64_t{1} << 58) + 1;  // x 64-byte records: 2^64 + 64 bytes
  EXPECT_NE(validate(s).message().find("exceed the most a table may hold"), std::string::npos) << validate(s).message();
  s.rows = (std::int64_t{1} << 48) / 64;  // exactly 2^48 bytes
  EXPECT_TRUE(validate(s).is_ok()) << validate(s).message();
}

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
  s.optimizer.learning_rate = 0;  // a schedule that decays to 0 ends there (issue 37)
  EXPECT_TRUE(validate(s).is_ok());
  s.optimizer.learning_rate = -0.5f;
  EXPECT_NE(validate(s).message().find("learning_rate -0.5"), std::string::npos);
  s.optimizer.learning_rate = std::numeric_limits<float>::infinity();
  EXPECT_NE(validate(s).message().find("learning_rate"), std::string::npos);
  s = good();
  s.optimizer.beta1 = 1.0f;
  EXPECT_NE(validate(s).message().find("beta1"), std::string::npos);
}

// A table name becomes part of its checkpoint files' names ("<name>.<generation>.tbl", written
// as "<name>.<generation>.tbl.tmp-<pid>-<n>" first): a name of 300 characters opened and trained,
// then save failed with "File name too long" (issue 29). The rule is checked in one place,
// validate_table_name, and the errors name the table, what is wrong and the rule.
TEST(TableSpec, NamesThatCannotBecomeFileNamesAreRefused) {
  const std::string rule = " (expected 1 to 128 bytes of letters, digits, '_', '-' and '.', not starting with '.')";
  EXPECT_EQ(kMaxTableNameBytes, 128u);
  for (const std::string& name : {std::string("user"), std::string("C26"), std::string("t0"), std::string("a.b-c_D9"),
                                  std::string("x."), std::string("-x"), std::string(128, 'n')}) {
    EXPECT_TRUE(validate_table_name(name).is_ok()) << name << ": " << validate_table_name(name).message();
    auto s = good();
    s.name = name;
    EXPECT_TRUE(validate(s).is_ok()) << name << ": " << validate(s).message();
  }
  const std::pair<std::string, std::string> cases[] = {
      {"", "table name is empty" + rule},
      {std::string(129, 'n'), "table '" + std::string(32, 'n') + "...': name is 129 bytes long" + rule},
      {std::string(300, 'x'), "table '" + std::string(32, 'x') + "...': name is 300 bytes long" + rule},
      {std::string(5000, 'x'), "table '" + std::string(32, 'x') + "...': name is 5000 bytes long" + rule},
      {".user", "table '.user': name starts with '.'" + rule},
      {".", "table '.': name starts with '.'" + rule},
      {"..", "table '..': name starts with '.'" + rule},
      {"a/b", "table 'a/b': name holds '/' at byte 1" + rule},
      {"user id", "table 'user id': name holds ' ' at byte 4" + rule},
      {std::string("a\0b", 3), "table 'a\\x00b': name holds byte 0x00 at byte 1" + rule},
      {"a\nb", "table 'a\\x0ab': name holds byte 0x0a at byte 1" + rule},
      {"caf\xc3\xa9", "table 'caf\\xc3\\xa9': name holds byte 0xc3 at byte 3" + rule},
  };
  for (const auto& [name, message] : cases) {
    EXPECT_EQ(validate_table_name(name).code(), StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(validate_table_name(name).message(), message);
    auto s = good();
    s.name = name;
    EXPECT_EQ(validate(s).message(), message);
  }
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
