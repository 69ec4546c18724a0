// Bounded input of the benchmark programs (toolkit/bounded_input.hpp) and the limits the workload
// parser applies with it (issue 16): depth-limited JSON, short quotes of long values, files that
// are not regular or are too large, and table counts checked before any table is built.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "toolkit/bounded_input.hpp"
#include "toolkit/workload.hpp"

namespace strata::bench {
namespace {

using nlohmann::json;

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']');
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/bounded_input_" + std::to_string(::getpid()) + "_" + name;
}

TEST(ParseJsonLimited, AcceptsTheDepthLimitAndRefusesOneMore) {
  auto ok = parse_json_limited(nested(kMaxJsonDepth), "doc");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto deep = parse_json_limited(nested(kMaxJsonDepth + 1), "doc");
  ASSERT_FALSE(deep.is_ok());
  EXPECT_EQ(deep.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.status().message(),
            "doc: JSON nested deeper than 32 levels (expected at most 32 levels of arrays "
            "and objects)");
  // Objects count as levels too, and a hostile depth costs no stack.
  std::string objects;
  for (int i = 0; i < 200000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(200000, '}');
  EXPECT_NE(parse_json_limited(objects, "doc").status().message().find("nested deeper than 32"), std::string::npos);
  EXPECT_FALSE(parse_json_limited(nested(1000000), "doc").is_ok());
}

TEST(ParseJsonLimited, InvalidJsonQuotesABoundedParserMessage) {
  auto r = parse_json_limited("\"" + std::string(100000, 'a'), "doc");  // an unterminated string
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind("doc: invalid JSON: ", 0), 0u) << r.status().message();
  EXPECT_LE(r.status().message().size(), 300u);
}

// Issue 29: a key given twice in a workload or profile was taken silently (the last value won).
TEST(ParseJsonLimited, AKeyGivenTwiceInOneObjectIsRefused) {
  const auto r = parse_json_limited(R"({"tables": 2, "seed": 1, "tables": 4})", "workload");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "workload: key 'tables' is given twice (expected each key at most once in an object)");
  // The same key in different objects is fine, at any depth.
  EXPECT_TRUE(parse_json_limited(R"({"a": {"x": 1}, "b": {"x": 2}, "x": [{"x": 3}, {"x": 4}]})", "doc").is_ok());
  // Named by its path, in the words the store uses for a config's key.
  EXPECT_EQ(parse_json_limited(R"({"a": [1, {"y": [2]}, {"x": 3, "x": 4}]})", "doc").status().message(),
            "doc: key 'a[2].x' is given twice (expected each key at most once in an object)");
}

TEST(JsonExcerpt, QuotesShortValuesWholeAndLongOnesByAPrefix) {
  EXPECT_EQ(json_excerpt(json::parse(R"({"a": [1, 2], "b": "x"})")), R"({"a":[1,2],"b":"x"})");
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string e = json_excerpt(big, 20);
  EXPECT_EQ(e, "[0,1,2,3,4,5,6,7,...");
  EXPECT_EQ(json_excerpt(json(std::string(100000, 'x')), 10), "\"xxxxxx...");
  // Nesting beyond 8 levels is elided, so the walk stays shallow.
  EXPECT_EQ(json_excerpt(json::parse(nested(12)), 100), "[[[[[[[[[...]]]]]]]]]");
  // Cut at a character boundary: "é" is two bytes.
  EXPECT_EQ(quote_prefix("ab\xc3\xa9zzzzzz", 6), "ab...");
  EXPECT_EQ(quote_prefix("short", 64), "short");
}

TEST(ReadInputFile, RefusesDevicesDirectoriesAndLargeFilesUnread) {
  auto dev = read_input_file("/dev/zero", "workload file");
  ASSERT_FALSE(dev.is_ok());
  EXPECT_EQ(dev.status().message(),
            "workload file '/dev/zero' is a character device, not a regular file (expected a JSON file of at most "
            "4 MiB)");
  auto dir = read_input_file("/tmp", "workload file");
  ASSERT_FALSE(dir.is_ok());
  EXPECT_NE(dir.status().message().find("'/tmp' is a directory"), std::string::npos);
  auto missing = read_input_file("/nonexistent/w.json", "workload file");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "cannot open workload file '/nonexistent/w.json': No such file or directory");

  const std::string path = temp_path("big.json");
  { std::ofstream(path) << "{}"; }
  ASSERT_EQ(::truncate(path.c_str(), 1001), 0);
  auto big = read_input_file(path, "profile file", 1000);
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().message(),
            "profile file '" + path + "' has 1001 bytes, over the limit of 1000 bytes for an input file");
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  auto fits = read_input_file(path, "profile file", 1000);
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  EXPECT_EQ(fits->size(), 1000u);
  EXPECT_EQ(fits->substr(0, 2), "{}");
  ::unlink(path.c_str());
}

TEST(ReadInputFile, RefusesAFifoWithoutBlocking) {
  const std::string path = temp_path("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto r = read_input_file(path, "workload file");  // opening it would wait for a writer
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("is a FIFO, not a regular file"), std::string::npos);
  ::unlink(path.c_str());
}

// ---- the workload parser with these limits ----

TEST(WorkloadLimits, DeepJsonIsRefusedOnParse) {
  for (const std::string& text : {"{\"tables\": " + nested(100000) + "}", "{\"tables\": [" + nested(100000) + "]}",
                                  "{\"dist\": " + nested(100000) + "}"}) {
    auto w = parse_workload_json(text);
    ASSERT_FALSE(w.is_ok());
    EXPECT_NE(w.status().message().find("workload: JSON nested deeper than 32 levels"), std::string::npos)
        << w.status().message();
  }
}

TEST(WorkloadLimits, ErrorsQuoteAShortPrefixOfTheValue) {
  std::string long_array = "[1";
  for (int i = 0; i < 20000; ++i) long_array += ",1";
  long_array += "]";
  for (const std::string key : {"dist", "bag_dist", "rows", "tables"}) {
    auto w = parse_workload_json("{\"" + key + "\": " + (key == "tables" ? "{\"a\": " + long_array + "}" : long_array) +
                                 "}");
    ASSERT_FALSE(w.is_ok()) << key;
    EXPECT_LT(w.status().message().size(), 300u) << w.status().message().substr(0, 400);
    EXPECT_NE(w.status().message().find("..."), std::string::npos) << w.status().message();
  }
  auto t = parse_workload_json("{\"tables\": [" + long_array + "]}");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("workload key 'tables[0]' must be an object {\"name\", \"rows\", \"dim\"} (got "
                                      "array [1,1,1,"),
            std::string::npos)
      << t.status().message().substr(0, 400);
  EXPECT_LT(t.status().message().size(), 300u);
}

TEST(WorkloadLimits, TableCountsAreCheckedBeforeAnyTableIsBuilt) {
  WorkloadSpec w;
  const WorkloadSpec before = w;
  Status s = apply_table_set(w, "100000000");
  EXPECT_EQ(s.message(), "table set '100000000': 100000000 tables, over the limit of 65536 (expected 1..65536)");
  EXPECT_EQ(workload_to_json(w), workload_to_json(before));
  // A count beyond int is a count too, not one table of that many rows.
  EXPECT_NE(apply_table_set(w, "99999999999").message().find("99999999999 tables, over the limit"), std::string::npos);
  EXPECT_TRUE(apply_table_set(w, "65536").is_ok());
  EXPECT_TRUE(validate(w).is_ok());
  std::string list = "1";
  for (int i = 0; i < 65536; ++i) list += ",1";
  EXPECT_NE(apply_table_set(w, list).message().find("table list of 65537 items: over the limit of 65536 tables"),
            std::string::npos);

  auto j = parse_workload_json(R"({"tables": 100000000})");
  ASSERT_FALSE(j.is_ok());
  EXPECT_EQ(j.status().message(), "workload: tables 100000000 is over the limit of 65536 (expected 1..65536)");
  std::string array = "[{\"rows\": 1}";
  for (int i = 0; i < 65536; ++i) array += ",{\"rows\": 1}";
  auto a = parse_workload_json("{\"tables\": " + array + "]}");
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().message(), "workload key 'tables': the array has 65537 tables, over the limit of 65536");
  WorkloadSpec many;
  many.tables = kMaxWorkloadTables + 1;
  EXPECT_FALSE(validate(many).is_ok());
}

}  // namespace
}  // namespace strata::bench
