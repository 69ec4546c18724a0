// Features separate from tables (issue 35): a table looked up by several features, each with its own
// bags, pooling, weights and output, all sharing the table's rows and optimizer. The config's
// features in C++ and JSON and their refusals; one step worked by hand (a row two features use gets
// the sum of both gradients in one update, in the order the reference defines), in the cpu store and
// the reference; batches naming unknown features refused with nothing changed. The randomized
// equivalence of every placement is ModeEquivalence's features_ cases and ShardedEquivalence's.
#include <gtest/gtest.h>

#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

// One table "item" (8 x 4, SGD at 0.5) looked up by "clicked" (the table's sum) and "bought" (mean).
StoreConfig item_config() {
  StoreConfig c;
  c.threads = 2;
  TableConfig t;
  t.spec.name = "item";
  t.spec.rows = 8;
  t.spec.dim = 4;
  t.spec.init.bound = 0.5f;
  t.spec.optimizer.kind = OptimizerKind::kSgd;
  t.spec.optimizer.learning_rate = 0.5f;
  t.features = {{"clicked", std::nullopt}, {"bought", Pooling::kMean}};
  c.tables.push_back(t);
  return c;
}

Status config_error(const std::string& json) { return parse_store_config(json).status(); }

TEST(Features, ParseWriteAndRoundTrip) {
  auto c = parse_store_config(R"({"tables": [{"name": "item", "rows": 10, "dim": 4, "pooling": "sum",
      "features": ["clicked", {"name": "bought", "pooling": "mean"}, {"name": "seen"}]},
      {"name": "user", "rows": 5, "dim": 4}]})");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const auto& f = c.value().tables[0].features;
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].name, "clicked");
  EXPECT_FALSE(f[0].pooling.has_value());
  EXPECT_EQ(f[1].name, "bought");
  EXPECT_EQ(f[1].pooling, Pooling::kMean);
  EXPECT_FALSE(f[2].pooling.has_value());
  EXPECT_TRUE(c.value().tables[1].features.empty());
  const std::string j = to_json(c.value());
  auto again = parse_store_config(j);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(to_json(again.value()), j);
  EXPECT_EQ(j.find("\"features\"", j.find("\"user\"")), std::string::npos);  // a table without features writes none
}

TEST(Features, BadConfigsAreRefusedNamingTheFeatureAndTheTables) {
  const std::string head = R"({"tables": [{"name": "item", "rows": 10, "dim": 4, "features": )";
  EXPECT_NE(config_error(head + R"([]}]})").message().find("table 'item': features: empty"), std::string::npos);
  EXPECT_NE(config_error(head + R"(["a", "a"]}]})").message().find("feature 'a' is listed twice"), std::string::npos);
  EXPECT_NE(config_error(head + R"([""]}]})").message().find("empty name"), std::string::npos);
  EXPECT_NE(config_error(head + R"([7]}]})").message().find("features[0]: expected a name or an object"),
            std::string::npos);
  EXPECT_NE(config_error(head + R"([{"pooling": "sum"}]}]})").message().find("features[0]: name is required"),
            std::string::npos);
  EXPECT_NE(config_error(head + R"([{"name": "a", "pool": "sum"}]}]})").message().find("unknown field 'pool'"),
            std::string::npos);
  EXPECT_NE(config_error(head + R"([{"name": "a", "pooling": "max"}]}]})").message().find("max"), std::string::npos);
  // A feature in two tables, also where the other table's feature is its own name.
  const Status twice = config_error(head + R"(["a"]}, {"name": "user", "rows": 5, "dim": 4, "features": ["a"]}]})");
  EXPECT_NE(twice.message().find("feature 'a' looks up table 'item' and table 'user'"), std::string::npos)
      << twice.to_string();
  const Status named = config_error(head + R"(["user"]}, {"name": "user", "rows": 5, "dim": 4}]})");
  EXPECT_NE(named.message().find("table 'item': feature 'user' is named as another table"), std::string::npos)
      << named.to_string();
  // Also where that table lists features of its own (a batch entry "user" would look up "item", read_rows "user").
  const Status other = config_error(head + R"(["user"]}, {"name": "user", "rows": 5, "dim": 4, "features": ["x"]}]})");
  EXPECT_NE(other.message().find("feature 'user' is named as another table"), std::string::npos) << other.to_string();
  // A table listed twice.
  EXPECT_NE(config_error(R"({"tables": [{"name": "t", "rows": 1, "dim": 4}, {"name": "t", "rows": 1, "dim": 4}]})")
                .message()
                .find("table 't' is defined twice"),
            std::string::npos);
  // The C++ config is validated alike (a cast pooling outside the enum).
  StoreConfig c = item_config();
  c.tables[0].features[1].pooling = static_cast<Pooling>(9);
  EXPECT_NE(validate(c).message().find("feature 'bought': pooling 9 is out of range"), std::string::npos)
      << validate(c).to_string();
}

using Opener = Result<std::unique_ptr<Store>> (*)(const StoreConfig&);

// The store of item_config() with its table in placement P (on the emu device).
template <Placement P>
Result<std::unique_ptr<Store>> open_in(const StoreConfig& config) {
  StoreConfig c = config;
  c.device.backend = BackendChoice::kEmu;
  for (TableConfig& t : c.tables) {
    t.placement = P;
    if (P == Placement::kCached || P == Placement::kHybrid) t.cache.rows = 2;  // evicts
  }
  return Store::open(c);
}

class FeatureStep : public ::testing::TestWithParam<Opener> {};

// Row 3 is used by both features in bag 0 (once by clicked, twice by bought) and by clicked in bag 1.
TEST_P(FeatureStep, ARowTwoFeaturesUseGetsBothGradientsInOneUpdate) {
  auto opened = GetParam()(item_config());
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  Store& s = **opened;
  std::vector<float> rows(8 * 4);
  ASSERT_TRUE(s.read_rows(0, 0, 8, rows.data(), nullptr).is_ok());
  const auto row = [&](int r, int c) { return rows[static_cast<std::size_t>(r * 4 + c)]; };
  KeyBatch kb;
  kb.features.push_back({"bought", {0, 2, 2}, {3, 3}, {}});  // given before clicked: the table's order decides
  kb.features.push_back({"clicked", {0, 1, 3}, {3, 3, 5}, {}});
  ASSERT_TRUE(s.submit(1, kb).is_ok());
  std::vector<float> bought(2 * 4), clicked(2 * 4);
  ASSERT_TRUE(s.forward(1, {{bought.data(), 2, 4}, {clicked.data(), 2, 4}}).is_ok());
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(clicked[static_cast<std::size_t>(c)], 0.0f + row(3, c));
    EXPECT_EQ(clicked[static_cast<std::size_t>(4 + c)], (0.0f + row(3, c)) + row(5, c));
    EXPECT_EQ(bought[static_cast<std::size_t>(c)], ((0.0f + row(3, c)) + row(3, c)) * 0.5f);
    EXPECT_EQ(bought[static_cast<std::size_t>(4 + c)], 0.0f);  // an empty bag
  }
  std::vector<float> g_bought(2 * 4), g_clicked(2 * 4);
  for (std::size_t k = 0; k < 8; ++k) {
    g_bought[k] = 0.25f * static_cast<float>(k + 1);
    g_clicked[k] = -0.125f * static_cast<float>(k + 3);
  }
  // The rate in force reaches the table however it is served (set_learning_rate after the config's 0.5).
  ASSERT_TRUE(s.set_learning_rate("item", 0.25f).is_ok());
  ASSERT_TRUE(s.backward(1, {{g_bought.data(), 2, 4}, {g_clicked.data(), 2, 4}}).is_ok());
  std::vector<float> after(8 * 4);
  ASSERT_TRUE(s.read_rows(0, 0, 8, after.data(), nullptr).is_ok());
  for (int c = 0; c < 4; ++c) {
    const auto gc = [&](int b) { return g_clicked[static_cast<std::size_t>(b * 4 + c)]; };
    const float gb0 = g_bought[static_cast<std::size_t>(c)];
    // Bag by bag; in a bag, the table's features in their order (clicked, bought), each in key order.
    const float sum3 = (((0.0f + gc(0)) + 0.5f * gb0) + 0.5f * gb0) + gc(1);
    EXPECT_EQ(after[static_cast<std::size_t>(3 * 4 + c)], row(3, c) - 0.25f * sum3) << c;
    EXPECT_EQ(after[static_cast<std::size_t>(5 * 4 + c)], row(5, c) - 0.25f * (0.0f + gc(1))) << c;
    EXPECT_EQ(after[static_cast<std::size_t>(0 * 4 + c)], row(0, c));  // unused
  }
}

TEST_P(FeatureStep, BatchesNamingTablesOrUnknownFeaturesAreRefusedWithNothingChanged) {
  auto opened = GetParam()(item_config());
  ASSERT_TRUE(opened.is_ok());
  Store& s = **opened;
  KeyBatch by_table;
  by_table.features.push_back({"item", {0, 1}, {3}, {}});
  const Status table = s.submit(1, by_table);
  EXPECT_EQ(table.code(), StatusCode::kNotFound);
  EXPECT_NE(table.message().find("unknown feature 'item'"), std::string::npos) << table.to_string();
  KeyBatch twice;
  twice.features.push_back({"clicked", {0, 1}, {3}, {}});
  twice.features.push_back({"clicked", {0, 1}, {4}, {}});
  EXPECT_NE(s.submit(1, twice).message().find("feature 'clicked' appears twice"), std::string::npos);
  KeyBatch out_of_range;
  out_of_range.features.push_back({"clicked", {0, 1}, {3}, {}});
  out_of_range.features.push_back({"bought", {0, 1}, {8}, {}});
  // The message names the feature and its table.
  EXPECT_EQ(s.submit(1, out_of_range).message(),
            "batch 1: table 'item' feature 'bought': key 8 at position 0 out of range [0, 8)");
  KeyBatch sizes;  // features of one table with different batch sizes
  sizes.features.push_back({"clicked", {0, 1}, {3}, {}});
  sizes.features.push_back({"bought", {0, 1, 1}, {3}, {}});
  EXPECT_FALSE(s.submit(1, sizes).is_ok());
  EXPECT_EQ(s.in_flight(), 0);
  // Views shaped by the feature's pooling: bought is mean (2 rows), not its rows' count.
  KeyBatch good;
  good.features.push_back({"bought", {0, 3}, {1, 2, 3}, {}});
  ASSERT_TRUE(s.submit(2, good).is_ok());
  std::vector<float> out(3 * 4);
  EXPECT_FALSE(s.forward(2, {{out.data(), 3, 4}}).is_ok());
  EXPECT_TRUE(s.forward(2, {{out.data(), 1, 4}}).is_ok());
}

// int32 keys and offsets with features through previews, a discard and a step of a cached table planned with the
// lookahead policy: as the reference takes the batch in int64.
TEST(Features, Int32BatchesArePreviewedDiscardedAndTrainedAsTheReference) {
  StoreConfig c = item_config();
  c.device.backend = BackendChoice::kEmu;
  c.cache.policy = cache::Policy::kLookahead;
  c.cache.preview = 2;
  c.tables[0].placement = Placement::kCached;
  c.tables[0].cache.rows = 3;
  auto opened = Store::open(c);
  auto reference = open_reference_store(c);
  ASSERT_TRUE(opened.is_ok() && reference.is_ok()) << opened.status().to_string();
  Store& s = **opened;
  KeyBatch wide;
  wide.features.push_back({"clicked", {0, 2, 5}, {3, 1, 3, 5, 7}, {}});
  wide.features.push_back({"bought", {0, 1, 3}, {3, 6, 3}, {0.5f, 2.0f, 1.0f}});
  KeyBatch narrow = wide;
  narrow.features[0].keys32 = {3, 1, 3, 5, 7};
  narrow.features[0].keys.clear();
  narrow.features[1].offsets32 = {0, 1, 3};
  narrow.features[1].offsets.clear();
  ASSERT_TRUE(s.preview(1, narrow).is_ok());
  ASSERT_TRUE(s.preview(2, narrow).is_ok());
  ASSERT_TRUE(s.submit(1, narrow).is_ok());
  std::vector<float> a(2 * 4), b(2 * 4);
  ASSERT_TRUE(s.forward(1, {{a.data(), 2, 4}, {b.data(), 2, 4}}).is_ok());
  ASSERT_TRUE(s.discard(1).is_ok());
  EXPECT_EQ(s.in_flight(), 0);
  ASSERT_TRUE(s.submit(2, narrow).is_ok());
  ASSERT_TRUE((*reference)->submit(2, wide).is_ok());
  Buffers out = make_buffers(c, wide), want = make_buffers(c, wide), grads = make_buffers(c, wide);
  std::mt19937_64 rng(9);
  fill_random(rng, grads);
  ASSERT_TRUE(s.forward(2, out.views).is_ok());
  ASSERT_TRUE((*reference)->forward(2, want.views).is_ok());
  EXPECT_EQ(out.data, want.data);
  ASSERT_TRUE(s.backward(2, grads.cviews).is_ok());
  ASSERT_TRUE((*reference)->backward(2, grads.cviews).is_ok());
  EXPECT_TRUE(same_state(snapshot(s), snapshot(**reference)));
}

std::string store_name(const ::testing::TestParamInfo<Opener>& i) {
  static const char* const kNames[] = {"reference", "cpu", "offload", "cached", "gpu", "hybrid"};
  return kNames[i.index];
}

INSTANTIATE_TEST_SUITE_P(Stores, FeatureStep,
                         ::testing::Values(static_cast<Opener>(&open_reference_store), &open_in<Placement::kCpu>,
                                           &open_in<Placement::kOffload>, &open_in<Placement::kCached>,
                                           &open_in<Placement::kGpu>, &open_in<Placement::kHybrid>),
                         store_name);

}  // namespace
}  // namespace strata
