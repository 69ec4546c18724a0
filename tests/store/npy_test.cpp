#include "store/io/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "store/io/file_io.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::vector<float> matrix(std::int64_t rows, std::int64_t cols) {
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) * 0.25f - 3.0f;
  return m;
}

// The file's contents, or the error text.
std::string contents_of(const std::string& p) {
  auto r = detail::read_file(p);
  return r.is_ok() ? *r : "<" + r.status().to_string() + ">";
}

// Builds a .npy file image from a dict literal, padded like numpy does.
std::string npy_bytes(const std::string& dict, int major = 1, const std::string& data = "") {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = header.size();
  out += static_cast<char>(len & 0xFF);
  out += static_cast<char>((len >> 8) & 0xFF);
  if (major != 1) {
    out += static_cast<char>((len >> 16) & 0xFF);
    out += static_cast<char>((len >> 24) & 0xFF);
  }
  return out + header + data;
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "strata_npy_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  void write_raw(const std::string& name, const std::string& bytes) const {
    ASSERT_TRUE(detail::write_file_atomic(path(name), bytes).is_ok());
  }
  std::string dir_;
};

// ---- round trips ----

class NpyRoundTrip : public NpyTest, public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(NpyRoundTrip, WriteThenRead) {
  const auto [rows, cols] = GetParam();
  const auto m = matrix(rows, cols);
  const std::string p = path("m.npy");
  ASSERT_TRUE(write_npy(p, m.data(), rows, cols).is_ok());
  auto back = read_npy_matrix(p, rows, cols);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, m);

  auto bytes = detail::read_file(p);
  ASSERT_TRUE(bytes.is_ok());
  auto h = parse_npy_header(*bytes);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->descr, "<f4");
  EXPECT_FALSE(h->fortran_order);
  EXPECT_EQ(h->shape, (std::vector<std::int64_t>{rows, cols}));
  EXPECT_EQ(h->data_offset % 64, 0u);
  EXPECT_EQ(bytes->size(), h->data_offset + m.size() * 4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, NpyRoundTrip,
                         ::testing::Values(std::pair{1, 1}, std::pair{3, 4}, std::pair{7, 13}, std::pair{0, 8},
                                           std::pair{5, 0}, std::pair{1000, 128}, std::pair{123456789, 0}));

TEST_F(NpyTest, HeaderIsExactlyWhatNumpyWrites) {
  const auto m = matrix(3, 4);
  ASSERT_TRUE(write_npy(path("m.npy"), m.data(), 3, 4).is_ok());
  const std::string bytes = contents_of(path("m.npy"));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
  std::string expected = npy_bytes(dict);
  ASSERT_EQ(expected.size(), 128u);
  EXPECT_EQ(bytes.substr(0, 128), expected);
}

TEST_F(NpyTest, SpecialFloatsRoundTripBitExactly) {
  const std::vector<float> m = {0.0f,
                                -0.0f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::denorm_min()};
  ASSERT_TRUE(write_npy(path("s.npy"), m.data(), 2, 3).is_ok());
  auto back = read_npy_matrix(path("s.npy"), 2, 3);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(std::memcmp(back->data(), m.data(), m.size() * 4), 0);
}

TEST_F(NpyTest, WriteRejectsBadArguments) {
  EXPECT_EQ(write_npy(path("x.npy"), nullptr, -1, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(write_npy(path("x.npy"), nullptr, 2, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(write_npy(path("x.npy"), nullptr, std::numeric_limits<std::int64_t>::max(), 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(write_npy(path("x.npy"), nullptr, 0, 3).is_ok());
  const Status s = write_npy(path("no/dir/x.npy"), nullptr, 0, 3);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(path("no/dir/x.npy")), std::string::npos) << s.to_string();
}

TEST_F(NpyTest, InjectedFaultKeepsThePreviousFile) {
  const auto v1 = matrix(64, 32);
  ASSERT_TRUE(write_npy(path("t.npy"), v1.data(), 64, 32).is_ok());
  auto v2 = v1;
  for (auto& x : v2) x += 1.0f;
  detail::set_fault_after_bytes(1000);
  const Status s = write_npy(path("t.npy"), v2.data(), 64, 32);
  detail::set_fault_after_bytes(-1);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("injected fault"), std::string::npos);
  auto back = read_npy_matrix(path("t.npy"), 64, 32);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, v1);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// ---- header parsing ----

TEST_F(NpyTest, ParsesHeaderVariantsNumpyProduces) {
  struct Case {
    std::string dict;
    int major;
    std::vector<std::int64_t> shape;
    bool fortran;
    std::string descr;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 1, {3, 4}, false, "<f4"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, {5}, false, "<f4"},
      {"{'descr': '<f8', 'fortran_order': True, 'shape': (), }", 1, {}, true, "<f8"},
      {"{'fortran_order': False, 'shape': (2, 3), 'descr': '<f4'}", 1, {2, 3}, false, "<f4"},
      {"{ 'shape' :(2,3,) ,'descr':\"<f4\",'fortran_order':False }", 1, {2, 3}, false, "<f4"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }", 1, {3, 4}, false, "<f4"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", 2, {2, 3, 4}, false, "<f4"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (7, 1), }", 3, {7, 1}, false, "<f4"},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (0, 9), }", 1, {0, 9}, false, "|u1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dict + " v" + std::to_string(c.major));
    const std::string bytes = npy_bytes(c.dict, c.major, "trailing data is ignored");
    auto h = parse_npy_header(bytes);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    EXPECT_EQ(h->descr, c.descr);
    EXPECT_EQ(h->fortran_order, c.fortran);
    EXPECT_EQ(h->shape, c.shape);
    EXPECT_EQ(h->data_offset, bytes.size() - std::strlen("trailing data is ignored"));
  }
}

TEST_F(NpyTest, RejectsMalformedHeaders) {
  struct Case {
    std::string bytes;
    StatusCode code;
    std::string needle;  // must appear in the message
  };
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
  std::string bad_version = npy_bytes(ok);
  bad_version[6] = 4;
  std::string bad_minor = npy_bytes(ok);
  bad_minor[7] = 1;
  std::string long_len = npy_bytes(ok);
  long_len[8] = '\xFF';
  long_len[9] = '\x7F';
  std::string huge_v2 = npy_bytes(ok, 2);
  huge_v2[11] = '\x7F';
  const std::vector<Case> cases = {
      {"", StatusCode::kDataLoss, "too short"},
      {"\x93NUMP", StatusCode::kDataLoss, "too short"},
      {"GARBAGE_NOT_NPY_AT_ALL", StatusCode::kDataLoss, "not an npy file: starts with 'GARBAG'"},
      {"PK\x03\x04 zip file.......", StatusCode::kDataLoss, "expected '\\x93NUMPY'"},
      {bad_version, StatusCode::kInvalidArgument, "version 4.0 (expected 1.0, 2.0 or 3.0)"},
      {bad_minor, StatusCode::kInvalidArgument, "version 1.1"},
      {long_len, StatusCode::kDataLoss, "truncated npy header"},
      {huge_v2, StatusCode::kDataLoss, "implausible"},
      {npy_bytes(ok).substr(0, 11), StatusCode::kDataLoss, "truncated npy header"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False}"), StatusCode::kDataLoss, "lacks 'shape'"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'extra': 1}"), StatusCode::kDataLoss,
       "unknown key 'extra'"},
      {npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"), StatusCode::kDataLoss,
       "repeats key 'descr'"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': false, 'shape': (3, 4)}"), StatusCode::kDataLoss, "True or False"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3, 4)}"), StatusCode::kDataLoss, "True or False"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -4)}"), StatusCode::kDataLoss,
       "negative dimension"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3 4)}"), StatusCode::kDataLoss, "',' or ')'"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5)}"), StatusCode::kDataLoss, "only dimension"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': [3, 4]}"), StatusCode::kDataLoss, "'('"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"), StatusCode::kDataLoss,
       "overflows"},
      {npy_bytes("{'descr': '<f4, 'fortran_order': False, 'shape': (3, 4)}"), StatusCode::kDataLoss, "malformed"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)"), StatusCode::kDataLoss, "',' or '}'"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)} junk"), StatusCode::kDataLoss,
       "only padding after '}'"},
      {npy_bytes("['descr', '<f4']"), StatusCode::kDataLoss, "expected '{'"},
      {npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}"), StatusCode::kInvalidArgument,
       "structured dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needle);
    auto h = parse_npy_header(c.bytes);
    ASSERT_FALSE(h.is_ok());
    EXPECT_EQ(h.status().code(), c.code) << h.status().to_string();
    EXPECT_NE(h.status().message().find(c.needle), std::string::npos) << h.status().to_string();
  }
}

// ---- read_npy_matrix errors ----

TEST_F(NpyTest, WrongDtypeIsRejectedNamingBoth) {
  std::vector<double> d(12, 1.0);
  write_raw("d.npy", npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }", 1,
                               std::string(reinterpret_cast<const char*>(d.data()), d.size() * 8)));
  auto r = read_npy_matrix(path("d.npy"), 3, 4);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            path("d.npy") +
                ": dtype '<f8' is not supported (expected '<f4', little-endian float32, or '<f2', "
                "little-endian float16)");
}

TEST_F(NpyTest, BigEndianFloatIsRejected) {
  write_raw("b.npy", npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1, 1), }", 1, "abcd"));
  auto r = read_npy_matrix(path("b.npy"), 1, 1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'>f4'"), std::string::npos) << r.status().to_string();
}

TEST_F(NpyTest, FortranOrderIsRejected) {
  write_raw("f.npy",
            npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", 1, float_bytes(matrix(3, 4))));
  auto r = read_npy_matrix(path("f.npy"), 3, 4);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind(path("f.npy") + ": fortran_order is True", 0), 0u) << r.status().to_string();
}

TEST_F(NpyTest, WrongShapeNamesBothShapes) {
  const auto m = matrix(3, 4);
  ASSERT_TRUE(write_npy(path("x.npy"), m.data(), 3, 4).is_ok());
  auto r = read_npy_matrix(path("x.npy"), 3, 5);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), path("x.npy") + ": shape (3, 4) does not match the table (expected (3, 5))");

  write_raw("v.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (12,), }", 1, float_bytes(m)));
  auto v = read_npy_matrix(path("v.npy"), 3, 4);
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().message(), path("v.npy") + ": shape (12,) does not match the table (expected (3, 4))");
}

TEST_F(NpyTest, TruncatedDataNamesByteCounts) {
  const auto m = matrix(3, 4);
  ASSERT_TRUE(write_npy(path("x.npy"), m.data(), 3, 4).is_ok());
  const std::string full = contents_of(path("x.npy"));
  write_raw("t.npy", full.substr(0, full.size() - 8));
  auto r = read_npy_matrix(path("t.npy"), 3, 4);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message().rfind(path("t.npy") + ": truncated: 40 data bytes found, expected 48", 0), 0u)
      << r.status().to_string();

  write_raw("long.npy", full + "xyz");
  auto l = read_npy_matrix(path("long.npy"), 3, 4);
  ASSERT_FALSE(l.is_ok());
  EXPECT_EQ(l.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(l.status().message().find("51 data bytes found, expected 48"), std::string::npos) << l.status().to_string();
}

TEST_F(NpyTest, TruncatedHeaderAndGarbageMagic) {
  const auto m = matrix(3, 4);
  ASSERT_TRUE(write_npy(path("x.npy"), m.data(), 3, 4).is_ok());
  const std::string full = contents_of(path("x.npy"));
  for (std::size_t n : {0, 5, 9, 10, 60, 127}) {
    write_raw("h.npy", full.substr(0, n));
    auto r = read_npy_matrix(path("h.npy"), 3, 4);
    ASSERT_FALSE(r.is_ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    EXPECT_EQ(r.status().message().rfind(path("h.npy") + ": ", 0), 0u) << r.status().to_string();
  }
  std::string garbage = full;
  garbage[0] = 'X';
  write_raw("g.npy", garbage);
  auto g = read_npy_matrix(path("g.npy"), 3, 4);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(g.status().message(), path("g.npy") + ": not an npy file: starts with 'XNUMPY' (expected '\\x93NUMPY')");
}

TEST_F(NpyTest, MissingFileIsNotFound) {
  auto r = read_npy_matrix(path("missing.npy"), 1, 1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message().rfind(path("missing.npy"), 0), 0u);
  EXPECT_EQ(read_npy_matrix(path("missing.npy"), -1, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(NpyTest, ReadsVersion2And3Files) {
  const auto m = matrix(4, 6);
  for (int major : {2, 3}) {
    write_raw("v.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }", major, float_bytes(m)));
    auto r = read_npy_matrix(path("v.npy"), 4, 6);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(*r, m);
  }
}

// ---- interop with the real numpy ----

bool have_numpy() {
  static const bool have = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return have;
}

int run_python(const std::string& script) {
  const std::string cmd = "/usr/bin/python3 -c \"" + script + "\"";
  return std::system(cmd.c_str());
}

TEST_F(NpyTest, ReadsWhatNumpyWrites) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not available";
  const std::string p = path("np.npy");
  ASSERT_EQ(run_python("import numpy as np; a = (np.arange(35 * 17, dtype=np.float32) * 0.25 - 3.0)"
                       ".reshape(35, 17); np.save('" +
                       p + "', a)"),
            0);
  auto r = read_npy_matrix(p, 35, 17);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, matrix(35, 17));
}

TEST_F(NpyTest, ReadsNumpyVersion2And3Files) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not available";
  for (const char* version : {"(2, 0)", "(3, 0)"}) {
    SCOPED_TRACE(version);
    const std::string p = path("np_v.npy");
    ASSERT_EQ(run_python(std::string("import numpy as np; a = (np.arange(6 * 5, dtype=np.float32) * 0.25 - 3.0)"
                                     ".reshape(6, 5); f = open('") +
                         p + "', 'wb'); np.lib.format.write_array(f, a, version=" + version + "); f.close()"),
              0);
    auto r = read_npy_matrix(p, 6, 5);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(*r, matrix(6, 5));
  }
}

TEST_F(NpyTest, NumpyReadsWhatWeWrite) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not available";
  const auto m = matrix(23, 9);
  const std::string p = path("ours.npy");
  ASSERT_TRUE(write_npy(p, m.data(), 23, 9).is_ok());
  EXPECT_EQ(run_python("import numpy as np, sys; a = np.load('" + p +
                       "'); e = (np.arange(23 * 9, dtype=np.float32) * 0.25 - 3.0).reshape(23, 9); "
                       "sys.exit(0 if a.dtype == np.float32 and a.shape == (23, 9) and a.flags.c_contiguous "
                       "and np.array_equal(a, e) else 1)"),
            0);
  ASSERT_TRUE(write_npy(p, nullptr, 0, 4).is_ok());
  EXPECT_EQ(run_python("import numpy as np, sys; a = np.load('" + p + "'); sys.exit(0 if a.shape == (0, 4) else 1)"),
            0);
}

// float16 both ways: numpy reads our '<f2' as its float16 values and we read numpy's, widened
// exactly (matrix() values are multiples of 0.25 that float16 holds); more elements than one chunk
// of the reader's conversion.
TEST_F(NpyTest, Float16FilesRoundTripWithNumpy) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not available";
  const std::int64_t rows = 70000, cols = 3;  // 210,000 elements
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = narrow_f16_rne(static_cast<float>(i % 1000) * 0.25f - 3.0f);
  const std::string ours = path("ours16.npy"), theirs = path("np16.npy");
  ASSERT_TRUE(write_npy_f16(ours, bits.data(), rows, cols).is_ok());
  ASSERT_EQ(run_python("import numpy as np, sys; a = np.load('" + ours +
                       "'); e = ((np.arange(70000 * 3) % 1000) * 0.25 - 3.0).astype(np.float16).reshape(70000, 3); "
                       "np.save('" +
                       theirs +
                       "', e); sys.exit(0 if a.dtype == np.float16 and np.array_equal(a, e) "
                       "else 1)"),
            0);
  auto r = read_npy_matrix(theirs, rows, cols);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  for (std::size_t i = 0; i < bits.size(); ++i)
    ASSERT_EQ((*r)[i], static_cast<float>(i % 1000) * 0.25f - 3.0f) << "element " << i;
}

TEST_F(NpyTest, NumpyFilesWithWrongLayoutAreRejected) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not available";
  const std::string f8 = path("f8.npy"), fo = path("fortran.npy"), v1 = path("vec.npy");
  ASSERT_EQ(
      run_python("import numpy as np; a = np.ones((3, 4)); np.save('" + f8 + "', a); np.save('" + fo +
                 "', np.asfortranarray(a.astype(np.float32))); np.save('" + v1 + "', np.ones(12, dtype=np.float32))"),
      0);
  auto a = read_npy_matrix(f8, 3, 4);
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("'<f8'"), std::string::npos) << a.status().to_string();
  auto b = read_npy_matrix(fo, 3, 4);
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("fortran_order"), std::string::npos) << b.status().to_string();
  auto c = read_npy_matrix(v1, 3, 4);
  EXPECT_EQ(c.status().message(), v1 + ": shape (12,) does not match the table (expected (3, 4))");
}

}  // namespace
}  // namespace strata
