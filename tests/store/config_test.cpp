#include "store/store_config.hpp"

#include <gtest/gtest.h>

namespace strata {

TEST(StoreConfig, ParsesJsonAndRoundTrips) {
  auto c = parse_store_config(R"({"threads": 2, "numa": "bind", "numa_node": 0,
    "tables": [{"name": "user", "rows": 1000, "dim": 64, "pooling": "mean",
                "init": {"bound": 0.05, "seed": 9},
                "optimizer": {"kind": "adam", "learning_rate": 0.001, "beta2": 0.99}},
               {"name": "item", "rows": 10, "dim": 8}]})");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->threads, 2);
  EXPECT_EQ(c->numa, NumaPolicy::kBind);
  ASSERT_EQ(c->tables.size(), 2u);
  EXPECT_EQ(c->tables[0].spec.pooling, Pooling::kMean);
  EXPECT_EQ(c->tables[0].spec.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(c->tables[0].spec.optimizer.beta2, 0.99f);
  EXPECT_EQ(c->tables[0].spec.init.seed, 9u);
  EXPECT_EQ(c->tables[1].spec.optimizer.kind, OptimizerKind::kSgd);
  auto again = parse_store_config(to_json(*c));
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(to_json(*again), to_json(*c));
}

TEST(StoreConfig, ErrorsNameTheFieldAndValue) {
  EXPECT_EQ(parse_store_config(R"({"tables": [{"name": "u", "rows": 0, "dim": 4}]})").status().message(),
            "table 'u': rows 0 must be > 0");
  EXPECT_NE(parse_store_config(R"({"tables": [{"name": "u", "rows": 5, "dim": 4, "dimm": 3}]})").status().message().find(
                "unknown field 'dimm'"),
            std::string::npos);
  EXPECT_NE(parse_store_config(R"({"tables": [{"name": "u", "rows": 5, "dim": 4, "placement": "disk"}]})").status().message().find(
                "unknown placement 'disk'"),
            std::string::npos);
  EXPECT_NE(parse_store_config(R"({"tables": [{"name": "u", "rows": 5, "dim": "x"}]})").status().message().find("wrong type"),
            std::string::npos);
  EXPECT_NE(parse_store_config("{").status().message().find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_store_config(R"({"tables": []})").status().message().find("no tables"), std::string::npos);
  EXPECT_NE(parse_store_config(R"({"tables": [{"name": "u", "rows": 5, "dim": 4, "optimizer": {"kind": "lion"}}]})")
                .status()
                .message()
                .find("unknown optimizer 'lion'"),
            std::string::npos);
  EXPECT_EQ(load_store_config("/nonexistent/x.json").status().code(), StatusCode::kNotFound);
}

}  // namespace strata
