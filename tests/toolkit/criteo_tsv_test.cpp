#include "toolkit/criteo_tsv.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "/strata_criteo_" + stem + "_" + std::to_string(::getpid()) + ".tsv";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// 26 small tables with different row counts, so the modulo differs per table.
std::vector<TableSpec> tables() {
  std::vector<TableSpec> t(26);
  for (int i = 0; i < 26; ++i) {
    t[static_cast<std::size_t>(i)].name = "C" + std::to_string(i + 1);
    t[static_cast<std::size_t>(i)].rows = 1000 + 7 * i;
    t[static_cast<std::size_t>(i)].dim = 4;
  }
  return t;
}

// One line: label, 13 integers, 26 categoricals, tab-separated.
std::string line(const std::string& label, const std::vector<std::string>& ints, const std::vector<std::string>& cats) {
  std::string s = label;
  for (const auto& x : ints) s += "\t" + x;
  for (const auto& x : cats) s += "\t" + x;
  return s;
}

std::vector<std::string> ints13(const std::string& v) { return std::vector<std::string>(13, v); }

std::vector<std::string> cats_with(std::uint32_t base) {
  std::vector<std::string> c;
  for (int i = 0; i < 26; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", base + static_cast<std::uint32_t>(i) * 0x01010101u);
    c.push_back(buf);
  }
  return c;
}

// The documented hash, written out independently of the implementation.
Key expected_key(std::uint32_t v, int t, std::int64_t rows) {
  std::uint64_t z = static_cast<std::uint64_t>(v) | (static_cast<std::uint64_t>(t) << 32);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<Key>(z % static_cast<std::uint64_t>(rows));
}

TEST(CriteoKey, MatchesTheDocumentedHash) {
  for (std::uint32_t v : {0u, 1u, 0x68fd1e64u, 0xffffffffu})
    for (int t : {0, 5, 25})
      for (std::int64_t rows : {1, 3, 1000, 10131227}) {
        const Key k = criteo_key(v, t, rows);
        EXPECT_EQ(k, expected_key(v, t, rows));
        EXPECT_GE(k, 0);
        EXPECT_LT(k, rows);
      }
  EXPECT_NE(criteo_key(0x68fd1e64u, 0, 1 << 20), criteo_key(0x68fd1e64u, 1, 1 << 20));
}

TEST(CriteoTsv, ReadsBatchesWithEmptyFields) {
  const auto t = tables();
  std::vector<std::string> c1 = cats_with(0x10000000u);
  std::vector<std::string> c2 = cats_with(0x20000000u);
  c2[2] = "";   // C3 empty
  c2[25] = "";  // C26 empty (the last field of the line)
  std::vector<std::string> c3 = cats_with(0x30000000u);
  c3[0] = "A1B2C3D4";  // upper case
  c3[1] = "7";         // short hex
  std::vector<std::string> ints = ints13("");
  ints[0] = "5";
  ints[12] = "-1";
  std::vector<std::string> c4 = std::vector<std::string>(26, "");  // every categorical missing
  const std::string text = line("1", ints13("3"), c1) + "\n" +     //
                           line("0", ints, c2) + "\n" +            //
                           "\n" +                                  // blank line: skipped
                           line("1", ints13(""), c3) + "\r\n" +    // CRLF
                           line("", ints13("0"), c4) + "\n" +      // empty label too
                           line("0", ints13("1"), c1);             // no final newline
  const std::string path = temp_path("good");
  write_file(path, text);

  CriteoTsvOptions o;
  o.batch_size = 2;
  auto r = CriteoTsvReader::open(path, t, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();

  std::vector<KeyBatch> batches;
  std::vector<std::vector<float>> labels;
  KeyBatch b;
  for (;;) {
    auto more = r->next(b);
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();
    if (!*more) break;
    batches.push_back(b);
    labels.push_back(r->labels());
  }
  ASSERT_EQ(batches.size(), 3u);  // 5 samples in batches of 2, 2, 1
  EXPECT_EQ(r->samples_read(), 5);
  EXPECT_EQ(r->line_number(), 6);
  EXPECT_EQ(labels[0], (std::vector<float>{1, 0}));
  EXPECT_EQ(labels[1], (std::vector<float>{1, 0}));
  EXPECT_EQ(labels[2], (std::vector<float>{0}));

  const auto key = [&](const std::string& hex, int table) {
    return expected_key(static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16)), table,
                        t[static_cast<std::size_t>(table)].rows);
  };
  for (const KeyBatch& kb : batches) {
    ASSERT_EQ(kb.features.size(), 26u);
    for (int i = 0; i < 26; ++i) {
      const JaggedKeys& f = kb.features[static_cast<std::size_t>(i)];
      EXPECT_EQ(f.table, "C" + std::to_string(i + 1));
      EXPECT_TRUE(f.weights.empty());
      EXPECT_TRUE(validate(f, t[static_cast<std::size_t>(i)], kb.batch_size()).is_ok());
    }
  }
  // Batch 0: samples 1 and 2 (sample 2 has C3 and C26 empty).
  const KeyBatch& b0 = batches[0];
  EXPECT_EQ(b0.batch_size(), 2);
  EXPECT_EQ(b0.features[0].offsets, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(b0.features[0].keys, (std::vector<Key>{key(c1[0], 0), key(c2[0], 0)}));
  EXPECT_EQ(b0.features[2].offsets, (std::vector<std::int64_t>{0, 1, 1}));
  EXPECT_EQ(b0.features[2].keys, (std::vector<Key>{key(c1[2], 2)}));
  EXPECT_EQ(b0.features[25].offsets, (std::vector<std::int64_t>{0, 1, 1}));
  // Batch 1: sample 3 (upper case and short hex) and sample 4 (all categoricals empty).
  const KeyBatch& b1 = batches[1];
  EXPECT_EQ(b1.features[0].keys, (std::vector<Key>{key("A1B2C3D4", 0)}));
  EXPECT_EQ(b1.features[1].keys, (std::vector<Key>{key("7", 1)}));
  for (const auto& f : b1.features) EXPECT_EQ(f.offsets, (std::vector<std::int64_t>{0, 1, 1}));
  // Batch 2: the last line, without a final newline.
  EXPECT_EQ(batches[2].batch_size(), 1);
  EXPECT_EQ(batches[2].features[7].keys, (std::vector<Key>{key(c1[7], 7)}));

  o.drop_last = true;
  auto dropped = read_criteo_tsv(path, t, o);
  ASSERT_TRUE(dropped.is_ok()) << dropped.status().to_string();
  EXPECT_EQ(dropped->size(), 2u);
  auto limited = read_criteo_tsv(path, t, {2, true, false, {}}, 1);
  ASSERT_TRUE(limited.is_ok());
  EXPECT_EQ(limited->size(), 1u);
}

TEST(CriteoTsv, NoLabelColumn) {
  const std::string path = temp_path("nolabel");
  std::string l = line("", ints13("2"), cats_with(0x1u)).substr(1);  // drop the label and its tab
  write_file(path, l + "\n");
  CriteoTsvOptions o;
  o.has_label = false;
  auto b = read_criteo_tsv(path, tables(), o);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ((*b)[0].features[0].keys.size(), 1u);
  // The same line read as labelled has one field too few.
  const auto bad = read_criteo_tsv(path, tables());
  EXPECT_NE(bad.status().message().find("39 tab-separated fields (expected 40"), std::string::npos)
      << bad.status().message();
}

TEST(CriteoTsv, WrongFieldCountNamesFileAndLine) {
  const std::string path = temp_path("fields");
  std::vector<std::string> short_cats = cats_with(0x5u);
  short_cats.pop_back();
  write_file(path, line("1", ints13("1"), cats_with(0x1u)) + "\n\n" + line("0", ints13("1"), short_cats) + "\n");
  CriteoTsvOptions o;
  o.batch_size = 4;
  auto r = CriteoTsvReader::open(path, tables(), o);
  ASSERT_TRUE(r.is_ok());
  KeyBatch b;
  b.features.resize(1);
  auto res = r->next(b);
  ASSERT_FALSE(res.is_ok());
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(res.status().message(), "criteo tsv '" + path +
                                        "' line 3: 39 tab-separated fields (expected 40: label, 13 integer and 26 "
                                        "categorical features)");
  EXPECT_EQ(b.features.size(), 1u) << "out must be unchanged on an error";
  // The reader went back to the start of the batch: a retry meets the same error.
  auto again = r->next(b);
  EXPECT_EQ(again.status().message(), res.status().message());
}

TEST(CriteoTsv, BadHexNamesLineFieldAndValue) {
  const std::string path = temp_path("hex");
  std::vector<std::string> cats = cats_with(0x1u);
  cats[4] = "zz12";  // C5 = field 18 (label 0, I1..I13 = 1..13, C1 = 14)
  std::vector<std::string> long_cats = cats_with(0x1u);
  long_cats[0] = "123456789";  // 9 digits
  write_file(path, line("1", ints13("1"), cats) + "\n");
  auto r = read_criteo_tsv(path, tables());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "criteo tsv '" + path +
                                      "' line 1 field 18 (C5): 'zz12' is not a categorical value (expected 1 to 8 "
                                      "hex digits, or empty)");
  write_file(path, line("1", ints13("1"), cats_with(0x2u)) + "\n" + line("1", ints13("1"), long_cats) + "\n");
  r = read_criteo_tsv(path, tables());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("line 2 field 14 (C1): '123456789'"), std::string::npos) << r.status().message();
}

TEST(CriteoTsv, OpenErrors) {
  const std::string path = temp_path("open");
  write_file(path, "");
  auto t = tables();
  t.pop_back();
  EXPECT_NE(CriteoTsvReader::open(path, t).status().message().find("25 tables (expected 26"), std::string::npos);
  t = tables();
  t[3].rows = 0;
  EXPECT_NE(CriteoTsvReader::open(path, t).status().message().find("table 'C4': rows 0 must be > 0"),
            std::string::npos);
  CriteoTsvOptions o;
  o.batch_size = 0;
  EXPECT_EQ(CriteoTsvReader::open(path, tables(), o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CriteoTsvReader::open(temp_path("missing_file"), tables()).status().code(), StatusCode::kNotFound);
  // An empty file has no batches.
  auto empty = read_criteo_tsv(path, tables());
  ASSERT_TRUE(empty.is_ok());
  EXPECT_TRUE(empty->empty());
}

}  // namespace
}  // namespace strata::bench
