// Which features of a file look up which table (toolkit/feature_tables.hpp): the --tables mapping
// form, its errors, and the tables it makes of a trace's features and of Criteo's columns.

#include "toolkit/feature_tables.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "toolkit/criteo_tsv.hpp"

namespace strata::bench {
namespace {

void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(FeatureTables, MappingOrTableSet) {
  EXPECT_TRUE(is_table_mapping("item=clicked+bought,user=user_id"));
  EXPECT_TRUE(is_table_mapping("item=C1"));
  EXPECT_FALSE(is_table_mapping("criteo:1000"));
  EXPECT_FALSE(is_table_mapping("user=1000x64,item=300"));
  EXPECT_FALSE(is_table_mapping("3"));
  auto m = parse_table_mapping("item=clicked+bought,user=user_id");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].table, "item");
  EXPECT_EQ((*m)[0].features, (std::vector<std::string>{"clicked", "bought"}));
  EXPECT_EQ((*m)[1].features, (std::vector<std::string>{"user_id"}));
}

TEST(FeatureTables, BadMappingsNameTheValue) {
  expect_error(parse_table_mapping("item=a,item=b").status(),
               "item 2 'item=b': table 'item' is listed twice (expected each table once");
  expect_error(parse_table_mapping("x=a+b,y=b").status(),
               "feature 'b' is mapped to table 'x' and to table 'y' (expected one table per feature)");
  expect_error(parse_table_mapping("x=a+a").status(), "feature 'a' is listed twice in table 'x'");
  expect_error(parse_table_mapping("x=a+").status(), "a feature is empty");
  expect_error(parse_table_mapping("xa").status(), "item 1 'xa': no '='");
  expect_error(parse_table_mapping("a b=c").status(), "table 'a b'");
  expect_error(parse_table_mapping("").status(), "no tables");
  const std::vector<TraceTable> features{{"clicked", 100}, {"bought", 80}, {"user", 5}};
  const auto tables = [&](const std::string& text) {
    return map_features(parse_table_mapping(text).value(), features, "trace t.strtrace", MappedRows::kMax).status();
  };
  expect_error(tables("item=clicked+clickd"),
               "table 'item': feature 'clickd' is not in trace t.strtrace (its features: clicked, bought, user)");
  // Table 'user' is also the trace's feature 'user', which the mapping leaves out.
  expect_error(tables("user=clicked"), "table 'user' is listed twice: in the mapping and as feature 'user'");
  EXPECT_TRUE(tables("user=user+clicked").is_ok());
}

TEST(FeatureTables, TablesOfATracesFeatures) {
  const std::vector<TraceTable> features{{"clicked", 100}, {"user", 5}, {"bought", 80}};
  auto t = map_features(parse_table_mapping("item=bought+clicked").value(), features, "trace", MappedRows::kMax);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 2u);
  // In the order of their first feature; a table of several has the most rows of its features.
  EXPECT_EQ((*t)[0].name, "item");
  EXPECT_EQ((*t)[0].rows, 100);
  EXPECT_EQ((*t)[0].features, (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(feature_names((*t)[0], features), (std::vector<std::string>{"bought", "clicked"}));
  EXPECT_EQ((*t)[1].name, "user");
  EXPECT_TRUE(feature_names((*t)[1], features).empty());
  // No mapping: every feature its own table.
  t = map_features({}, features, "trace", MappedRows::kMax);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->size(), 3u);
}

TEST(FeatureTables, CriteoColumnsOfOneTableKeyAValueToOneRow) {
  std::vector<TableSpec> set;
  for (int c = 1; c <= kCriteoSparseFeatures; ++c) {
    TableSpec s;
    s.name = "C" + std::to_string(c);
    s.rows = 10 * c;
    s.dim = 4;
    set.push_back(s);
  }
  auto c = map_criteo_columns(parse_table_mapping("pair=C4+C2").value(), set);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_EQ(c->tables.size(), 25u);
  EXPECT_EQ(c->tables[1].name, "pair");  // at C2, its first column
  EXPECT_EQ(c->tables[1].rows, 60);      // the rows of C2 and C4
  EXPECT_EQ(c->columns[1].rows, 60);
  EXPECT_EQ(c->columns[3].rows, 60);
  EXPECT_EQ(c->key_columns[1], 1);
  EXPECT_EQ(c->key_columns[3], 1);  // C4 keyed as C2
  EXPECT_EQ(c->key_columns[4], 4);
  expect_error(map_criteo_columns(parse_table_mapping("x=C27").value(), set).status(),
               "feature 'C27' is not in a Criteo file (its columns: C1..C26");
}

}  // namespace
}  // namespace strata::bench
