// Heterogeneous table sets of a workload: apply_table_set (the --tables syntax), "tables" in the
// workload JSON, validation, and batches whose keys stay inside each table's own rows.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "toolkit/workload.hpp"

namespace strata::bench {
namespace {

std::string error_of(WorkloadSpec spec, const std::string& set) {
  const Status s = apply_table_set(spec, set);
  EXPECT_FALSE(s.is_ok()) << set;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << set;
  return s.message();
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(TableSet, CountKeepsTheHomogeneousShape) {
  WorkloadSpec w;
  w.rows = 1000;
  w.dim = 8;
  ASSERT_TRUE(apply_table_set(w, "3").is_ok());
  EXPECT_EQ(w.tables, 3);
  EXPECT_TRUE(w.table_list.empty());
  const auto t = workload_tables(w);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].name, "t2");
  EXPECT_EQ(t[2].rows, 1000);
  EXPECT_EQ(t[2].dim, 8);
  // A count after a list clears the list.
  ASSERT_TRUE(apply_table_set(w, "5x4").is_ok());
  ASSERT_TRUE(apply_table_set(w, "2").is_ok());
  EXPECT_TRUE(w.table_list.empty());
  EXPECT_EQ(workload_tables(w).size(), 2u);
}

TEST(TableSet, ListWithNamesRowsAndDims) {
  WorkloadSpec w;
  w.dim = 32;
  ASSERT_TRUE(apply_table_set(w, "user=1000000x128,item=5000,300x16").is_ok());
  const auto t = workload_tables(w);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(w.tables, 3);
  EXPECT_EQ(t[0].name, "user");
  EXPECT_EQ(t[0].rows, 1000000);
  EXPECT_EQ(t[0].dim, 128);
  EXPECT_EQ(t[1].name, "item");
  EXPECT_EQ(t[1].rows, 5000);
  EXPECT_EQ(t[1].dim, 32);     // the default dim
  EXPECT_EQ(t[2].name, "t2");  // unnamed: by position
  EXPECT_EQ(t[2].rows, 300);
  EXPECT_EQ(t[2].dim, 16);
  EXPECT_TRUE(validate(w).is_ok());
}

TEST(TableSet, CriteoIsTheBuiltInSet) {
  WorkloadSpec w;
  w.dim = 16;
  ASSERT_TRUE(apply_table_set(w, "criteo").is_ok());
  auto expected = criteo_default_tables(kCriteoDefaultMaxRows, 16);
  ASSERT_TRUE(expected.is_ok());
  const auto t = workload_tables(w);
  ASSERT_EQ(t.size(), 26u);
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, (*expected)[i].name);
    EXPECT_EQ(t[i].rows, (*expected)[i].rows);
    EXPECT_EQ(t[i].dim, 16);
  }
  ASSERT_TRUE(apply_table_set(w, "criteo:1000").is_ok());
  std::int64_t total = 0;
  for (const auto& s : workload_tables(w)) total += s.rows;
  EXPECT_LE(total, 1000);
  EXPECT_GT(total, 1000 - 26);
}

TEST(TableSet, MalformedListsNameTheItem) {
  WorkloadSpec w;
  EXPECT_TRUE(contains(error_of(w, ""), "empty table set"));
  EXPECT_EQ(error_of(w, "100,x64"),
            "table list item 1 'x64': rows '' is not a positive integer (expected [NAME=]ROWS[xDIM], e.g. "
            "user=1000000x128)");
  EXPECT_TRUE(contains(error_of(w, "100x"), "item 0 '100x': dim '' is not a positive integer"));
  EXPECT_TRUE(contains(error_of(w, "100x0"), "dim '0' is not a positive integer"));
  EXPECT_TRUE(contains(error_of(w, "0"), "item 0 '0': rows '0' is not a positive integer"));
  EXPECT_TRUE(contains(error_of(w, "-5"), "rows '-5'"));
  EXPECT_TRUE(contains(error_of(w, "1e6"), "rows '1e6'"));
  EXPECT_TRUE(contains(error_of(w, "100,,200"), "item 1 ''"));
  EXPECT_TRUE(contains(error_of(w, "100,"), "item 1 ''"));
  EXPECT_TRUE(contains(error_of(w, "a b=100"), "table 'a b': name holds ' ' at byte 1"));
  EXPECT_TRUE(contains(error_of(w, "=100"), "table name is empty"));
  EXPECT_TRUE(contains(error_of(w, "a=10,a=20"), "table name 'a' used twice"));
  EXPECT_TRUE(contains(error_of(w, "t1=10,20"), "item 1 '20': table name 't1' used twice"));
  EXPECT_TRUE(contains(error_of(w, "criteo:"), "TOTAL_ROWS '' is not a positive integer"));
  EXPECT_TRUE(contains(error_of(w, "criteo:abc"), "TOTAL_ROWS 'abc'"));
  EXPECT_TRUE(contains(error_of(w, "criteo:10"), "below one row for each of the 26 tables"));
  EXPECT_TRUE(contains(error_of(w, "99999999999999999999"), "rows '99999999999999999999'"));
  // On error the spec is unchanged.
  WorkloadSpec before;
  before.tables = 4;
  WorkloadSpec after = before;
  EXPECT_FALSE(apply_table_set(after, "1,2,x").is_ok());
  EXPECT_EQ(after.tables, 4);
  EXPECT_TRUE(after.table_list.empty());
}

// Issue 29: a name of 5,000 characters was accepted; names follow the store's rule
// (validate_table_name: kMaxTableNameBytes, no leading '.'), and a message quotes only the start of one.
TEST(TableSet, TableNamesAreBounded) {
  const std::string longest(kMaxTableNameBytes, 'n'), over(kMaxTableNameBytes + 1, 'n');
  WorkloadSpec w;
  ASSERT_TRUE(apply_table_set(w, longest + "=10").is_ok());
  EXPECT_TRUE(validate(w).is_ok());
  const std::string e = error_of(w, std::string(5000, 'n') + "=10");
  EXPECT_TRUE(contains(e, "name is 5000 bytes long (expected 1 to 128 bytes")) << e;
  EXPECT_LT(e.size(), 400u) << e;
  EXPECT_TRUE(contains(error_of(w, over + "=10"), "name is 129 bytes long (expected 1 to 128 bytes"));
  EXPECT_TRUE(contains(error_of(w, ".hidden=10"), "starts with '.'"));
  w.table_list = {{over, 10, 4}};
  EXPECT_TRUE(contains(validate(w).message(), "name is 129 bytes long (expected 1 to 128 bytes"));
  EXPECT_LT(validate(w).message().size(), 400u);
}

TEST(TableSet, ValidateChecksEveryListEntry) {
  WorkloadSpec w;
  w.table_list = {{"a", 10, 4}, {"b", 0, 4}};
  EXPECT_EQ(validate(w).message(), "workload: table 1 'b': rows 0 must be > 0");
  w.table_list = {{"a", 10, 4}, {"a", 5, 4}};
  EXPECT_EQ(validate(w).message(), "workload: table 1 'a': name used twice (expected unique names)");
  w.table_list = {{"a", 10, -1}};
  EXPECT_EQ(validate(w).message(), "workload: table 0 'a': dim -1 must be > 0");
  w.table_list = {{"", 10, 4}};
  EXPECT_TRUE(contains(validate(w).message(), "table name is empty"));
  // With a list, the homogeneous fields are unused and not checked.
  w.table_list = {{"a", 10, 4}};
  w.rows = 0;
  w.tables = 0;
  EXPECT_TRUE(validate(w).is_ok());
}

TEST(WorkloadJsonTables, ArrayStringAndCount) {
  auto a = parse_workload_json(R"({"dim": 8, "tables": [{"name": "user", "rows": 1e6, "dim": 64}, {"rows": 50}]})");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_EQ(a->table_list.size(), 2u);
  EXPECT_EQ(a->table_list[0].name, "user");
  EXPECT_EQ(a->table_list[0].rows, 1000000);
  EXPECT_EQ(a->table_list[0].dim, 64);
  EXPECT_EQ(a->table_list[1].name, "t1");
  EXPECT_EQ(a->table_list[1].dim, 8);  // "dim" is the default, wherever it appears

  auto s = parse_workload_json(R"({"tables": "a=100x4,b=200", "dim": 2})");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_EQ(s->table_list.size(), 2u);
  EXPECT_EQ(s->table_list[1].rows, 200);
  EXPECT_EQ(s->table_list[1].dim, 2);

  auto c = parse_workload_json(R"({"tables": "criteo:5000", "dim": 16})");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->table_list.size(), 26u);
  EXPECT_EQ(c->table_list[25].dim, 16);

  auto n = parse_workload_json(R"({"tables": 3, "rows": 10})");
  ASSERT_TRUE(n.is_ok());
  EXPECT_TRUE(n->table_list.empty());
  EXPECT_EQ(workload_tables(*n).size(), 3u);
}

TEST(WorkloadJsonTables, ErrorsNameTheKey) {
  const auto message = [](const std::string& text) {
    auto s = parse_workload_json(text);
    EXPECT_FALSE(s.is_ok()) << text;
    return s.is_ok() ? std::string() : s.status().message();
  };
  EXPECT_TRUE(contains(message(R"({"tables": []})"), "the array is empty"));
  EXPECT_TRUE(contains(message(R"({"tables": [5]})"), "'tables[0]' must be an object"));
  EXPECT_TRUE(contains(message(R"({"tables": [{"name": "a"}]})"), "'tables[0]' has no \"rows\""));
  EXPECT_TRUE(contains(message(R"({"tables": [{"rows": 5, "width": 3}]})"), "unknown workload key 'tables[0].width'"));
  EXPECT_TRUE(contains(message(R"({"tables": [{"rows": "5"}]})"), "'tables[0].rows' must be an integer"));
  EXPECT_TRUE(contains(message(R"({"tables": [{"rows": 5, "name": 7}]})"), "'tables[0].name' must be a string"));
  EXPECT_TRUE(contains(message(R"({"tables": [{"rows": 5}, {"rows": 0}]})"), "table 1 't1': rows 0 must be > 0"));
  EXPECT_TRUE(contains(message(R"({"tables": [{"name": "a", "rows": 5}, {"name": "a", "rows": 6}]})"), "used twice"));
  EXPECT_TRUE(contains(message(R"({"tables": "10,x"})"), "workload key 'tables': table list item 1 'x'"));
  EXPECT_TRUE(contains(message(R"({"tables": "a=5", "rows": 10})"), "'rows' is unused"));
  EXPECT_TRUE(contains(message(R"({"tables": true})"), "must be an integer, a string or an array"));
}

TEST(WorkloadJsonTables, RoundTripKeepsTheList) {
  WorkloadSpec w;
  ASSERT_TRUE(apply_table_set(w, "user=1000x16,item=20x4").is_ok());
  w.dist = "zipf:0.9";
  auto back = parse_workload_json(workload_to_json(w));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(workload_to_json(*back), workload_to_json(w));
  ASSERT_EQ(back->table_list.size(), 2u);
  EXPECT_EQ(back->table_list[0].name, "user");
  EXPECT_EQ(back->table_list[1].dim, 4);
}

TEST(MakeBatchesTables, KeysStayInEachTablesRows) {
  WorkloadSpec w;
  w.batch = 300;
  w.bag_size = 3;
  w.distinct_batches = 3;
  w.dist = "zipf:0.9";
  ASSERT_TRUE(apply_table_set(w, "big=100000x8,small=7x4,one=1x2").is_ok());
  const auto batches = make_batches(w, 2);
  ASSERT_EQ(batches.size(), 3u);
  const std::vector<std::int64_t> rows = {100000, 7, 1};
  const std::vector<std::string> names = {"big", "small", "one"};
  for (const auto& b : batches) {
    ASSERT_EQ(b.features.size(), 3u);
    for (std::size_t t = 0; t < 3; ++t) {
      const auto& f = b.features[t];
      EXPECT_EQ(f.table, names[t]);
      EXPECT_EQ(f.keys.size(), 900u);
      for (const Key k : f.keys) {
        ASSERT_GE(k, 0);
        ASSERT_LT(k, rows[t]) << names[t];
      }
    }
  }
  // The big table's keys use more than the small tables' range.
  const auto& big = batches[0].features[0].keys;
  EXPECT_GT(*std::max_element(big.begin(), big.end()), 7);
  // The same as naming the tables explicitly, and independent of the thread count.
  const auto named = make_batches(w, names, 1);
  EXPECT_EQ(named[1].features[0].keys, batches[1].features[0].keys);
  EXPECT_EQ(named[2].features[1].keys, batches[2].features[1].keys);
}

}  // namespace
}  // namespace strata::bench
