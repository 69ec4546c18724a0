#include "toolkit/trace.hpp"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

std::string temp_dir() {
  static const std::string dir = [] {
    std::string d = ::testing::TempDir() + "/strata_trace_test_" + std::to_string(::getpid());
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  return dir;
}

std::string temp_path(const std::string& stem) { return temp_dir() + "/" + stem + ".trace"; }

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, std::size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

JaggedKeys feature(const std::string& table, std::vector<std::int64_t> offsets, std::vector<Key> keys,
                   std::vector<float> weights = {}) {
  JaggedKeys f;
  f.table = table;
  f.offsets = std::move(offsets);
  f.keys = std::move(keys);
  f.weights = std::move(weights);
  return f;
}

const std::vector<TraceTable> kTables = {{"user", 100}, {"item", 50}, {"ctx", 7}};

// Three batches: weights on one table, empty bags, a batch with only some tables in another order,
// and a batch of zero bags.
std::vector<KeyBatch> sample_batches() {
  std::vector<KeyBatch> b(4);
  b[0].features = {feature("user", {0, 2, 2, 5}, {1, 99, 3, 3, 0}), feature("item", {0, 1, 1, 1}, {49}, {0.5f}),
                   feature("ctx", {0, 0, 0, 0}, {})};
  b[1].features = {feature("ctx", {0, 1, 3}, {6, 0, 1}, {-1.25f, 2.0f, 1e-30f}), feature("user", {0, 0, 1}, {42})};
  b[2].features = {feature("item", {0, 4}, {1, 2, 3, 4})};
  b[3].features = {feature("user", {0}, {})};
  return b;
}

void expect_same(const std::vector<KeyBatch>& a, const std::vector<KeyBatch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].features.size(), b[i].features.size()) << "batch " << i;
    for (std::size_t f = 0; f < a[i].features.size(); ++f) {
      const JaggedKeys& x = a[i].features[f];
      const JaggedKeys& y = b[i].features[f];
      EXPECT_EQ(x.table, y.table) << "batch " << i << " feature " << f;
      EXPECT_EQ(x.offsets, y.offsets) << "batch " << i << " feature " << f;
      EXPECT_EQ(x.keys, y.keys) << "batch " << i << " feature " << f;
      ASSERT_EQ(x.weights.size(), y.weights.size());
      if (!x.weights.empty()) {
        EXPECT_EQ(0, std::memcmp(x.weights.data(), y.weights.data(), 4 * x.weights.size()));
      }
    }
  }
}

std::string small_trace(const std::string& stem) {
  const std::string path = temp_path(stem);
  const Status st = write_trace(path, kTables, sample_batches());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return path;
}

TEST(TraceCrc, KnownValue) {
  EXPECT_EQ(trace_crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(trace_crc32c("6789", 4, trace_crc32c("12345", 5)), 0xE3069283u);
  EXPECT_EQ(trace_crc32c(nullptr, 0), 0u);
}

TEST(Trace, RoundTrip) {
  const std::string path = small_trace("roundtrip");
  auto t = read_trace(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->tables.size(), kTables.size());
  for (std::size_t i = 0; i < kTables.size(); ++i) {
    EXPECT_EQ(t->tables[i].name, kTables[i].name);
    EXPECT_EQ(t->tables[i].rows, kTables[i].rows);
  }
  expect_same(t->batches, sample_batches());
}

// A batch of int32 keys and offsets (JaggedKeys::keys32, offsets32) is written as its int64 form is (issue 35).
TEST(Trace, Int32KeysAndOffsetsAreWrittenAsTheirValues) {
  std::vector<KeyBatch> narrow = sample_batches();
  for (KeyBatch& kb : narrow)
    for (JaggedKeys& f : kb.features) {
      f.keys32.assign(f.keys.begin(), f.keys.end());
      f.keys.clear();
      f.offsets32.assign(f.offsets.begin(), f.offsets.end());
      f.offsets.clear();
    }
  const std::string path = temp_path("int32");
  ASSERT_TRUE(write_trace(path, kTables, narrow).is_ok());
  auto t = read_trace(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  expect_same(t->batches, sample_batches());
}

TEST(Trace, ReaderApiAndRewind) {
  const std::string path = small_trace("reader_api");
  auto r = TraceReader::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->num_batches(), 4u);
  EXPECT_EQ(r->path(), path);
  std::vector<KeyBatch> got;
  KeyBatch b;
  for (;;) {
    auto more = r->next(b);
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();
    if (!*more) break;
    got.push_back(b);
  }
  EXPECT_EQ(r->batches_read(), 4u);
  expect_same(got, sample_batches());
  auto again = r->next(b);  // still the end
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(*again);

  ASSERT_TRUE(r->rewind().is_ok());
  auto first = r->next(b);
  ASSERT_TRUE(first.is_ok() && *first);
  expect_same({b}, {sample_batches()[0]});
}

TEST(Trace, EmptyTraceHasHeaderOnly) {
  const std::string path = temp_path("empty");
  ASSERT_TRUE(write_trace(path, kTables, {}).is_ok());
  auto t = read_trace(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t->batches.empty());
  EXPECT_EQ(t->tables.size(), 3u);
}

TEST(TraceWriter, AtomicTempAndRename) {
  const std::string dir = temp_dir() + "/atomic";
  ::mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/t.trace";
  {
    auto w = TraceWriter::create(path, kTables);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->append(sample_batches()[0]).is_ok());
    EXPECT_FALSE(std::ifstream(path).good()) << "the final name must not exist before close()";
    EXPECT_EQ(dir_entries(dir).size(), 1u);  // the temporary file
  }
  // Abandoned without close(): nothing is left behind.
  EXPECT_TRUE(dir_entries(dir).empty());

  auto w = TraceWriter::create(path, kTables);
  ASSERT_TRUE(w.is_ok());
  for (const auto& b : sample_batches()) ASSERT_TRUE(w->append(b).is_ok());
  EXPECT_EQ(w->batches_written(), 4u);
  ASSERT_TRUE(w->close().is_ok());
  EXPECT_EQ(dir_entries(dir), std::vector<std::string>{"t.trace"});
  EXPECT_EQ(w->close().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->append(sample_batches()[0]).code(), StatusCode::kFailedPrecondition);
}

TEST(TraceWriter, RejectsBadBatchesAndWritesNothing) {
  const std::string path = temp_path("rejects");
  auto w = TraceWriter::create(path, kTables);
  ASSERT_TRUE(w.is_ok());

  KeyBatch unknown;
  unknown.features = {feature("nope", {0, 1}, {0})};
  Status st = w->append(unknown);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("names table 'nope', which is not in the trace header"), std::string::npos)
      << st.message();

  KeyBatch out_of_range;
  out_of_range.features = {feature("ctx", {0, 1}, {7})};
  st = w->append(out_of_range);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("table 'ctx': key 7"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("batch 0"), std::string::npos) << st.message();

  KeyBatch twice;
  twice.features = {feature("ctx", {0, 1}, {1}), feature("ctx", {0, 1}, {1})};
  EXPECT_NE(w->append(twice).message().find("appears twice"), std::string::npos);

  KeyBatch sizes;
  sizes.features = {feature("user", {0, 1}, {1}), feature("item", {0, 1, 2}, {1, 2})};
  EXPECT_NE(w->append(sizes).message().find("differs from the batch size"), std::string::npos);

  EXPECT_NE(w->append(KeyBatch{}).message().find("no features"), std::string::npos);

  KeyBatch weights;
  weights.features = {feature("user", {0, 2}, {1, 2}, {1.0f})};
  EXPECT_EQ(w->append(weights).code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(w->batches_written(), 0u);
  ASSERT_TRUE(w->close().is_ok());
  auto t = read_trace(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t->batches.empty());
}

TEST(TraceWriter, RejectsBadTables) {
  EXPECT_EQ(TraceWriter::create(temp_path("bad_tables"), {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(TraceWriter::create(temp_path("bad_tables"), {{"a", 0}}).status().message().find("rows 0 must be > 0"),
            std::string::npos);
  EXPECT_NE(TraceWriter::create(temp_path("bad_tables"), {{"a", 1}, {"a", 2}}).status().message().find("twice"),
            std::string::npos);
  EXPECT_NE(TraceWriter::create(temp_path("bad_tables"), {{"", 1}}).status().message().find("empty name"),
            std::string::npos);
  EXPECT_EQ(TraceWriter::create("/nonexistent-dir/x.trace", kTables).status().code(), StatusCode::kIoError);
}

TEST(TraceReader, MissingFile) {
  const auto r = TraceReader::open(temp_path("does_not_exist"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("does_not_exist"), std::string::npos);
}

TEST(TraceReader, TruncatedAtEveryByte) {
  const std::string path = small_trace("full");
  const std::vector<unsigned char> bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 100u);
  const std::string cut = temp_path("cut");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(cut, bytes, n);
    const auto t = read_trace(cut);
    ASSERT_FALSE(t.is_ok()) << "a trace cut to " << n << " of " << bytes.size() << " bytes was accepted";
    EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << n << ": " << t.status().to_string();
    const std::string& m = t.status().message();
    EXPECT_NE(m.find("trace '" + cut + "' at byte "), std::string::npos) << m;
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  }
  write_bytes(cut, bytes, bytes.size());
  EXPECT_TRUE(read_trace(cut).is_ok());
}

TEST(TraceReader, EveryFlippedBitIsDetected) {
  const std::string path = small_trace("flip_src");
  const std::vector<unsigned char> bytes = read_bytes(path);
  const std::string bad = temp_path("flipped");
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (const unsigned char mask : {0x01, 0x80}) {
      std::vector<unsigned char> b = bytes;
      b[i] ^= mask;
      write_bytes(bad, b, b.size());
      const auto t = read_trace(bad);
      ASSERT_FALSE(t.is_ok()) << "flipping byte " << i << " by " << int(mask) << " was not detected";
      EXPECT_NE(t.status().message().find("byte "), std::string::npos) << t.status().message();
      if (i >= 12) {
        EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << i << ": " << t.status().to_string();
      }
    }
  }
}

TEST(TraceReader, CorruptPayloadNamesChecksumAndOffset) {
  const std::string path = small_trace("payload_src");
  std::vector<unsigned char> b = read_bytes(path);
  b[b.size() - 10] ^= 0xff;  // inside the last batch's payload
  const std::string bad = temp_path("payload_bad");
  write_bytes(bad, b, b.size());
  auto r = TraceReader::open(bad);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  KeyBatch kb;
  Status st;
  for (;;) {
    auto more = r->next(kb);
    if (!more.is_ok()) {
      st = more.status();
      break;
    }
    ASSERT_TRUE(*more) << "reached the end without an error";
  }
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("batch 3: checksum 0x"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("does not match the CRC-32C"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("trace '" + bad + "' at byte "), std::string::npos) << st.message();
}

TEST(TraceReader, WrongVersion) {
  const std::string path = small_trace("version_src");
  std::vector<unsigned char> b = read_bytes(path);
  b[8] = 2;  // u32 version, little-endian
  const std::string bad = temp_path("version_bad");
  write_bytes(bad, b, b.size());
  const auto r = TraceReader::open(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "trace '" + bad + "' at byte 8: version 2 (expected 1; this program reads only version 1)");
}

TEST(TraceReader, WrongMagic) {
  const std::string path = small_trace("magic_src");
  std::vector<unsigned char> b = read_bytes(path);
  std::memcpy(b.data(), "STRKEYS1", 8);  // the older raw format
  const std::string bad = temp_path("magic_bad");
  write_bytes(bad, b, b.size());
  const auto r = TraceReader::open(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "trace '" + bad + "' at byte 0: magic 'STRKEYS1' (expected 'STRTRACE': not a Strata trace file)");
}

TEST(TraceReader, TrailingBytes) {
  const std::string path = small_trace("trailing_src");
  std::vector<unsigned char> b = read_bytes(path);
  const std::size_t size = b.size();
  b.push_back(0);
  const std::string bad = temp_path("trailing_bad");
  write_bytes(bad, b, b.size());
  const auto t = read_trace(bad);
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find("at byte " + std::to_string(size) + ": 1 trailing bytes"), std::string::npos)
      << t.status().message();
}

TEST(TraceReader, HeaderLayoutIsAsDocumented) {
  // docs/trace-format.md: magic, version, flags, num_tables, num_batches, then the table entries.
  const std::string path = small_trace("layout");
  const std::vector<unsigned char> b = read_bytes(path);
  ASSERT_GE(b.size(), 40u);
  EXPECT_EQ(0, std::memcmp(b.data(), "STRTRACE", 8));
  EXPECT_EQ(b[8], 1);   // version
  EXPECT_EQ(b[12], 0);  // flags
  EXPECT_EQ(b[16], 3);  // num_tables
  EXPECT_EQ(b[20], 4);  // num_batches
  EXPECT_EQ(b[28], 4);  // name_len of "user"
  EXPECT_EQ(0, std::memcmp(b.data() + 32, "user", 4));
  EXPECT_EQ(b[36], 100);  // rows of "user"
  // Header: 28 fixed + (4 + 4 + 8) + (4 + 4 + 8) + (4 + 3 + 8) + 4 checksum = 79; then record 0.
  EXPECT_EQ(0, std::memcmp(b.data() + 79, "BTCH", 4));
}

// skip() steps over records without reading their payloads: it counts the batches, finds a
// truncated file and trailing bytes, and leaves next() where it would be.
TEST(TraceReaderSkip, StepsOverRecordsAndFindsTruncation) {
  std::vector<KeyBatch> batches(5);
  for (int i = 0; i < 5; ++i) batches[static_cast<std::size_t>(i)].features.push_back({"a", {0, 1}, {i}, {}});
  const std::string path = temp_path("skip");
  ASSERT_TRUE(write_trace(path, {{"a", 10}}, batches).is_ok());
  auto r = TraceReader::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  KeyBatch b;
  ASSERT_TRUE(r->next(b).value());
  int skipped = 0;
  for (;;) {
    auto more = r->skip();
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();
    if (!more.value()) break;
    ++skipped;
  }
  EXPECT_EQ(skipped, 4);
  ASSERT_TRUE(r->rewind().is_ok());
  ASSERT_TRUE(r->skip().value());
  ASSERT_TRUE(r->next(b).value());
  EXPECT_EQ(b.features[0].keys[0], 1);

  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string& bad : {text.substr(0, text.size() - 3), text + "x"}) {
    const std::string cut = temp_path("skip_bad");
    std::ofstream(cut, std::ios::binary) << bad;
    auto t = TraceReader::open(cut);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    Result<bool> more = true;
    while (more.is_ok() && more.value()) more = t->skip();
    ASSERT_FALSE(more.is_ok());
    EXPECT_EQ(more.status().code(), StatusCode::kDataLoss) << more.status().to_string();
    EXPECT_NE(more.status().message().find(cut), std::string::npos) << more.status().to_string();
  }
}

}  // namespace
}  // namespace strata::bench
