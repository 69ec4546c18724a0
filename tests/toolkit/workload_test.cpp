#include "toolkit/workload.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

// Pearson chi-square statistic of observed counts against expected counts.
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  double x = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double d = observed[i] - expected[i];
    x += d * d / expected[i];
  }
  return x;
}

// A generous upper bound for a chi-square variable with `df` degrees of freedom (mean df,
// sd sqrt(2 df)): 6 standard deviations, so a correct sampler essentially never fails it.
double chi_square_bound(double df) { return df + 6.0 * std::sqrt(2.0 * df); }

// Generalized harmonic number H(n, a) = sum_{r=1..n} r^-a: exact sum of the head, Euler-Maclaurin
// for the tail (error far below what the tests resolve).
double harmonic(std::int64_t n, double a) {
  const std::int64_t m = std::min<std::int64_t>(n, 100000);
  double sum = 0.0;
  for (std::int64_t r = m; r >= 1; --r) sum += std::pow(static_cast<double>(r), -a);
  if (n == m) return sum;
  const double lo = static_cast<double>(m + 1);
  const double hi = static_cast<double>(n);
  const auto f = [a](double x) { return std::pow(x, -a); };
  const auto df = [a](double x) { return -a * std::pow(x, -a - 1.0); };
  const double integral = a == 1.0 ? std::log(hi / lo) : (std::pow(hi, 1.0 - a) - std::pow(lo, 1.0 - a)) / (1.0 - a);
  return sum + integral + 0.5 * (f(lo) + f(hi)) + (df(hi) - df(lo)) / 12.0;
}

KeySampler make_sampler(const std::string& dist, std::int64_t rows, std::uint64_t seed) {
  auto s = KeySampler::create(dist, rows, seed);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "/" + stem + "_" + std::to_string(::getpid()) + ".bin";
}

// ---------------------------------------------------------------------------------------------
// Distributions and specs

TEST(ParseDistribution, AcceptsUniformAndZipf) {
  auto u = parse_distribution("uniform");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->kind, Distribution::Kind::kUniform);
  auto z = parse_distribution("zipf:1.05");
  ASSERT_TRUE(z.is_ok());
  EXPECT_EQ(z->kind, Distribution::Kind::kZipf);
  EXPECT_DOUBLE_EQ(z->alpha, 1.05);
  EXPECT_TRUE(parse_distribution("zipf:0.5").is_ok());
  EXPECT_TRUE(parse_distribution("zipf:2").is_ok());
}

TEST(ParseDistribution, RejectsBadInput) {
  for (const char* bad : {"", "Uniform", "zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:abc", "zipf:1.0x", "zipf:inf",
                          "zipf:nan", "zipf:1e999", "pareto:1", "uniform "}) {
    auto d = parse_distribution(bad);
    ASSERT_FALSE(d.is_ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message(),
              std::string("unknown distribution '") + bad + "' (expected uniform, zipf:ALPHA or drift:ALPHA:N)");
  }
}

TEST(WorkloadJson, EmptyObjectGivesDefaults) {
  auto s = parse_workload_json("{}");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const WorkloadSpec d;
  EXPECT_EQ(s->tables, d.tables);
  EXPECT_EQ(s->rows, d.rows);
  EXPECT_EQ(s->dim, d.dim);
  EXPECT_EQ(s->batch, d.batch);
  EXPECT_EQ(s->bag_size, d.bag_size);
  EXPECT_EQ(s->dist, d.dist);
  EXPECT_EQ(s->seed, d.seed);
  EXPECT_EQ(s->distinct_batches, d.distinct_batches);
}

TEST(WorkloadJson, ReadsEveryField) {
  auto s = parse_workload_json(
      R"({"tables": 3, "rows": 1e8, "dim": 64, "batch": 1024, "bag_size": 0, "dist": "zipf:1.2",
          "seed": 18446744073709551615, "distinct_batches": 2})");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->tables, 3);
  EXPECT_EQ(s->rows, 100000000);
  EXPECT_EQ(s->dim, 64);
  EXPECT_EQ(s->batch, 1024);
  EXPECT_EQ(s->bag_size, 0);
  EXPECT_EQ(s->dist, "zipf:1.2");
  EXPECT_EQ(s->seed, std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(s->distinct_batches, 2);
}

TEST(WorkloadJson, RoundTripsThroughWorkloadToJson) {
  WorkloadSpec w;
  w.tables = 4;
  w.rows = 12345;
  w.dist = "zipf:0.9";
  w.seed = 7;
  auto s = parse_workload_json(workload_to_json(w));
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(workload_to_json(*s), workload_to_json(w));
}

TEST(WorkloadJson, Errors) {
  const auto error_of = [](const std::string& text) {
    auto s = parse_workload_json(text);
    EXPECT_FALSE(s.is_ok()) << text;
    return s.is_ok() ? std::string() : s.status().message();
  };
  EXPECT_NE(error_of("{\"rows\": ").find("invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"rowz": 5})").find("unknown workload key 'rowz'"), std::string::npos);
  EXPECT_NE(error_of(R"({"rows": "many"})").find("'rows' must be an integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"dim": 1.5})").find("'dim' must be an integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"dim": 4294967296})").find("'dim'"), std::string::npos);
  EXPECT_NE(error_of(R"({"dist": 3})").find("'dist' must be a string"), std::string::npos);
  EXPECT_NE(error_of(R"({"seed": -1})").find("'seed'"), std::string::npos);
  EXPECT_NE(error_of(R"({"rows": 0})").find("rows 0 must be > 0"), std::string::npos);
  EXPECT_NE(error_of(R"({"dim": -3})").find("dim -3 must be > 0"), std::string::npos);
  EXPECT_NE(error_of(R"({"batch": 0})").find("batch 0 must be > 0"), std::string::npos);
  EXPECT_NE(error_of(R"({"bag_size": -1})").find("bag_size -1 must be >= 0"), std::string::npos);
  EXPECT_NE(error_of(R"({"tables": 0})").find("tables 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of(R"({"distinct_batches": 0})").find("distinct_batches 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of(R"({"dist": "zipf:0"})")
                .find("unknown distribution 'zipf:0' (expected uniform, zipf:ALPHA or drift:ALPHA:N)"),
            std::string::npos);
}

TEST(WorkloadValidate, AcceptsDefaultsAndChecksRanges) {
  EXPECT_TRUE(validate(WorkloadSpec{}).is_ok());
  WorkloadSpec s;
  s.dist = "gauss";
  const Status st = validate(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unknown distribution 'gauss'"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// RowPermutation

TEST(RowPermutation, IsABijectionExhaustively) {
  for (std::int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1000, 1023, 1024, 1025, 65537, 300001}) {
    for (std::uint64_t seed : {0ull, 1ull, 42ull}) {
      const RowPermutation p(n, seed);
      ASSERT_EQ(p.size(), n);
      std::vector<char> seen(static_cast<std::size_t>(n), 0);
      for (std::int64_t x = 0; x < n; ++x) {
        const std::int64_t y = p(x);
        ASSERT_GE(y, 0) << "n=" << n;
        ASSERT_LT(y, n) << "n=" << n;
        ASSERT_FALSE(seen[static_cast<std::size_t>(y)]) << "n=" << n << " seed=" << seed << " y=" << y;
        seen[static_cast<std::size_t>(y)] = 1;
      }
    }
  }
}

TEST(RowPermutation, ScattersAndDependsOnSeed) {
  const std::int64_t n = 100000000;
  const RowPermutation a(n, 1), b(n, 2);
  int low = 0, same = 0;
  for (std::int64_t x = 0; x < 1000; ++x) {
    const std::int64_t y = a(x);
    EXPECT_GE(y, 0);
    EXPECT_LT(y, n);
    if (y < n / 10) ++low;
    if (y == b(x)) ++same;
  }
  // About 10% of the images of the first ranks should land in the lowest tenth of the table.
  EXPECT_GT(low, 50);
  EXPECT_LT(low, 160);
  EXPECT_LT(same, 5);
  // Huge domains work too.
  const RowPermutation big(std::numeric_limits<std::int64_t>::max(), 3);
  for (std::int64_t x = 0; x < 100; ++x) EXPECT_GE(big(x), 0);
}

// ---------------------------------------------------------------------------------------------
// Uniform sampling

TEST(UniformSampler, KeysInRangeAndChiSquare) {
  const std::int64_t rows = 1000;
  KeySampler s = make_sampler("uniform", rows, 7);
  const int n = 1000000;
  std::vector<double> counts(rows, 0.0);
  for (int i = 0; i < n; ++i) {
    const Key k = s.next();
    ASSERT_GE(k, 0);
    ASSERT_LT(k, rows);
    counts[static_cast<std::size_t>(k)] += 1.0;
  }
  const std::vector<double> expected(rows, static_cast<double>(n) / rows);
  EXPECT_LT(chi_square(counts, expected), chi_square_bound(rows - 1));
}

TEST(UniformSampler, OddAndExtremeRanges) {
  {
    KeySampler s = make_sampler("uniform", 1, 1);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.next(), 0);
  }
  {
    // A range just above a power of two is where a biased reduction shows most.
    const std::int64_t rows = 3;
    KeySampler s = make_sampler("uniform", rows, 2);
    std::vector<double> counts(rows, 0.0);
    const int n = 300000;
    for (int i = 0; i < n; ++i) counts[static_cast<std::size_t>(s.next())] += 1.0;
    EXPECT_LT(chi_square(counts, std::vector<double>(rows, n / 3.0)), chi_square_bound(rows - 1));
  }
  for (std::int64_t rows :
       {std::int64_t{100000000}, (std::int64_t{1} << 62) + 1, std::numeric_limits<std::int64_t>::max()}) {
    KeySampler s = make_sampler("uniform", rows, 3);
    double mean = 0.0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const Key k = s.next();
      ASSERT_GE(k, 0);
      ASSERT_LT(k, rows);
      mean += static_cast<double>(k) / static_cast<double>(rows) / n;
    }
    // Mean of U(0,1) is 0.5 with sd 1/sqrt(12 n) ~ 6.5e-4.
    EXPECT_NEAR(mean, 0.5, 0.005) << rows;
  }
}

TEST(KeySampler, CreateRejectsBadArguments) {
  EXPECT_FALSE(KeySampler::create("uniform", 0, 1).is_ok());
  EXPECT_FALSE(KeySampler::create("zipf:1", -5, 1).is_ok());
  auto bad = KeySampler::create("zipf:x", 10, 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("unknown distribution 'zipf:x'"), std::string::npos);
}

TEST(KeySampler, DeterministicBySeedAndStream) {
  for (const char* dist : {"uniform", "zipf:1.05"}) {
    KeySampler a = make_sampler(dist, 1000000, 42);
    KeySampler b = make_sampler(dist, 1000000, 42);
    KeySampler c = make_sampler(dist, 1000000, 43);
    std::vector<Key> va(1000), vb(1000), vc(1000);
    a.fill(va.data(), 1000);
    b.fill(vb.data(), 1000);
    c.fill(vc.data(), 1000);
    EXPECT_EQ(va, vb) << dist;
    EXPECT_NE(va, vc) << dist;

    // set_stream(0) restarts the sequence; another stream differs.
    a.set_stream(0);
    std::vector<Key> again(1000);
    a.fill(again.data(), 1000);
    EXPECT_EQ(again, va) << dist;
    a.set_stream(1);
    std::vector<Key> other(1000);
    a.fill(other.data(), 1000);
    EXPECT_NE(other, va) << dist;
  }
}

TEST(KeySampler, NextIsRankToRowOfNextRank) {
  KeySampler a = make_sampler("zipf:1.1", 5000, 9);
  KeySampler b = a;
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(a.next(), b.rank_to_row(b.next_rank()));
  // The hot rows are not the low row ids.
  std::int64_t max_top = 0;
  for (std::int64_t r = 0; r < 10; ++r) max_top = std::max(max_top, a.rank_to_row(r));
  EXPECT_GT(max_top, 100);
}

// ---------------------------------------------------------------------------------------------
// Zipf sampling: rank frequencies against the exact law P(r) = r^-a / H(rows, a).

struct ZipfCase {
  double alpha;
  std::int64_t rows;
};

void PrintTo(const ZipfCase& c, std::ostream* os) { *os << "zipf:" << c.alpha << " rows=" << c.rows; }

class ZipfTest : public ::testing::TestWithParam<ZipfCase> {};

TEST_P(ZipfTest, RankFrequenciesFollowPowerLaw) {
  const double a = GetParam().alpha;
  const std::int64_t rows = GetParam().rows;
  char dist[32];
  std::snprintf(dist, sizeof(dist), "zipf:%g", a);
  KeySampler s = make_sampler(dist, rows, 1234);

  const int n = 2000000;
  const std::int64_t head = std::min<std::int64_t>(rows, 1000);
  std::vector<double> counts(static_cast<std::size_t>(head), 0.0);
  for (int i = 0; i < n; ++i) {
    const std::int64_t r = s.next_rank();
    ASSERT_GE(r, 0);
    ASSERT_LT(r, rows);
    if (r < head) counts[static_cast<std::size_t>(r)] += 1.0;
  }
  const double norm = harmonic(rows, a);
  const auto p = [&](std::int64_t rank1) { return std::pow(static_cast<double>(rank1), -a) / norm; };

  // Rank 1 vs rank 2: ratio 2^a; the log of a ratio of counts has sd ~ sqrt(1/c1 + 1/c2).
  if (rows >= 2) {
    const double c1 = counts[0], c2 = counts[1];
    ASSERT_GT(c2, 0.0);
    const double sd = std::sqrt(1.0 / c1 + 1.0 / c2);
    EXPECT_NEAR(std::log(c1 / c2), a * std::log(2.0), 5.0 * sd + 1e-3) << "c1=" << c1 << " c2=" << c2;
  }

  // Mass of the top k ranks against the exact sum, within 5 binomial standard deviations.
  for (std::int64_t k : {1, 10, 100, 1000}) {
    if (k >= rows) continue;  // the whole table has mass 1: nothing to test
    double exact = 0.0, observed = 0.0;
    for (std::int64_t r = 1; r <= k; ++r) {
      exact += p(r);
      observed += counts[static_cast<std::size_t>(r - 1)];
    }
    observed /= n;
    const double sd = std::sqrt(exact * (1.0 - exact) / n);
    EXPECT_NEAR(observed, exact, 5.0 * sd + 1e-4) << "top-" << k << " mass";
  }

  // Small tables: the whole distribution, by chi-square.
  if (rows == head) {
    std::vector<double> expected(static_cast<std::size_t>(rows));
    for (std::int64_t r = 1; r <= rows; ++r) expected[static_cast<std::size_t>(r - 1)] = p(r) * n;
    EXPECT_LT(chi_square(counts, expected), chi_square_bound(static_cast<double>(rows - 1)));
  }
}

std::string zipf_case_name(const ::testing::TestParamInfo<ZipfCase>& info) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "alpha%03d_rows%lld", static_cast<int>(std::lround(info.param.alpha * 100)),
                static_cast<long long>(info.param.rows));
  return buf;
}

INSTANTIATE_TEST_SUITE_P(Alphas, ZipfTest,
                         ::testing::Values(ZipfCase{0.5, 1000}, ZipfCase{0.9, 1000}, ZipfCase{1.0, 1000},
                                           ZipfCase{1.05, 1000}, ZipfCase{1.2, 1000}, ZipfCase{2.0, 1000},
                                           ZipfCase{0.5, 100000000}, ZipfCase{0.9, 100000000}, ZipfCase{1.0, 100000000},
                                           ZipfCase{1.05, 100000000}, ZipfCase{1.2, 100000000},
                                           ZipfCase{2.0, 100000000}),
                         zipf_case_name);

TEST(ZipfSampler, TinyTables) {
  KeySampler one = make_sampler("zipf:1.2", 1, 5);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.next(), 0);
  KeySampler two = make_sampler("zipf:1", 2, 5);
  double c0 = 0;
  const int n = 300000;
  for (int i = 0; i < n; ++i) {
    const std::int64_t r = two.next_rank();
    ASSERT_TRUE(r == 0 || r == 1);
    c0 += r == 0;
  }
  EXPECT_NEAR(c0 / n, 2.0 / 3.0, 0.005);
}

// ---------------------------------------------------------------------------------------------
// Batches and the raw trace

TEST(MakeBatches, ShapeAndRange) {
  WorkloadSpec w;
  w.tables = 2;
  w.rows = 5000;
  w.batch = 2500;  // not a multiple of the chunk size
  w.bag_size = 3;
  w.distinct_batches = 3;
  const std::vector<std::string> names = {"user", "item"};
  const auto batches = make_batches(w, names);
  ASSERT_EQ(batches.size(), 3u);
  TableSpec spec;
  spec.rows = w.rows;
  spec.dim = w.dim;
  for (const KeyBatch& b : batches) {
    ASSERT_EQ(b.features.size(), 2u);
    EXPECT_EQ(b.batch_size(), w.batch);
    EXPECT_EQ(b.total_keys(), 2 * w.batch * w.bag_size);
    for (std::size_t t = 0; t < names.size(); ++t) {
      const JaggedKeys& f = b.features[t];
      EXPECT_EQ(f.table, names[t]);
      EXPECT_TRUE(f.weights.empty());
      spec.name = names[t];
      EXPECT_TRUE(validate(f, spec, w.batch).is_ok()) << validate(f, spec, w.batch).to_string();
      for (std::int64_t i = 0; i <= w.batch; ++i) ASSERT_EQ(f.offsets[static_cast<std::size_t>(i)], i * w.bag_size);
    }
  }
  EXPECT_NE(batches[0].features[0].keys, batches[1].features[0].keys);
  EXPECT_NE(batches[0].features[0].keys, batches[0].features[1].keys);
}

TEST(MakeBatches, EmptyBags) {
  WorkloadSpec w;
  w.rows = 10;
  w.batch = 5;
  w.bag_size = 0;
  w.distinct_batches = 1;
  const auto batches = make_batches(w, {"t"});
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].features[0].offsets, std::vector<std::int64_t>(6, 0));
  EXPECT_TRUE(batches[0].features[0].keys.empty());
}

TEST(MakeBatches, DeterministicAndIndependentOfThreadCount) {
  WorkloadSpec w;
  w.tables = 2;
  w.rows = 1000000;
  w.batch = 5000;
  w.bag_size = 4;
  w.dist = "zipf:1.05";
  w.distinct_batches = 3;
  const std::vector<std::string> names = {"a", "b"};
  const auto one = make_batches(w, names, 1);
  for (int threads : {2, 3, 7, 0}) {
    const auto many = make_batches(w, names, threads);
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t b = 0; b < one.size(); ++b)
      for (std::size_t t = 0; t < names.size(); ++t)
        ASSERT_EQ(many[b].features[t].keys, one[b].features[t].keys) << "threads=" << threads;
  }
  w.seed = 43;
  EXPECT_NE(make_batches(w, names, 1)[0].features[0].keys, one[0].features[0].keys);
}

TEST(MakeBatches, ZipfHotRowIsStableAcrossBatches) {
  WorkloadSpec w;
  w.rows = 10000000;
  w.batch = 4096;
  w.bag_size = 8;
  w.dist = "zipf:1.2";
  w.distinct_batches = 3;
  const auto batches = make_batches(w, {"t"});
  std::vector<Key> hottest;
  for (const KeyBatch& b : batches) {
    std::map<Key, int> freq;
    for (Key k : b.features[0].keys) ++freq[k];
    const auto it =
        std::max_element(freq.begin(), freq.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
    hottest.push_back(it->first);
  }
  EXPECT_EQ(hottest[0], hottest[1]);
  EXPECT_EQ(hottest[0], hottest[2]);
}

TEST(WriteBatchesRaw, SizeAndContents) {
  WorkloadSpec w;
  w.tables = 2;
  w.rows = 100;
  w.batch = 7;
  w.bag_size = 5;
  w.distinct_batches = 3;
  const auto batches = make_batches(w, {"x", "y"});
  const std::string path = temp_path("strkeys");
  ASSERT_TRUE(write_batches_raw(path, batches).is_ok());

  std::ifstream in(path, std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t expected = 8 + 4 + 4 + 4;  // magic, version, num_batches, num_tables
  for (const auto& b : batches)
    for (const auto& f : b.features) expected += 8 + 8 * f.offsets.size() + 8 + 8 * f.keys.size();
  EXPECT_EQ(bytes.size(), expected);
  EXPECT_EQ(expected, 20u + 3 * 2 * (8 + 8 * 8 + 8 + 8 * 35));

  const auto u32_at = [&](std::size_t pos) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | bytes[pos + static_cast<std::size_t>(i)];
    return v;
  };
  const auto u64_at = [&](std::size_t pos) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | bytes[pos + static_cast<std::size_t>(i)];
    return v;
  };
  ASSERT_GE(bytes.size(), 20u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "STRKEYS1");
  EXPECT_EQ(u32_at(8), 1u);
  EXPECT_EQ(u32_at(12), 3u);
  EXPECT_EQ(u32_at(16), 2u);
  // Walk the whole file and compare every value.
  std::size_t pos = 20;
  for (const auto& b : batches) {
    for (const auto& f : b.features) {
      ASSERT_EQ(u64_at(pos), f.offsets.size());
      pos += 8;
      for (auto o : f.offsets) {
        ASSERT_EQ(static_cast<std::int64_t>(u64_at(pos)), o);
        pos += 8;
      }
      ASSERT_EQ(u64_at(pos), f.keys.size());
      pos += 8;
      for (auto k : f.keys) {
        ASSERT_EQ(static_cast<std::int64_t>(u64_at(pos)), k);
        pos += 8;
      }
    }
  }
  EXPECT_EQ(pos, bytes.size());
  std::remove(path.c_str());
}

TEST(WriteBatchesRaw, Errors) {
  std::vector<KeyBatch> batches(2);
  batches[0].features.resize(2);
  batches[1].features.resize(1);
  const Status mismatch = write_batches_raw(temp_path("mismatch"), batches);
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("batch 1 has 1 features (expected 2"), std::string::npos);

  const Status io = write_batches_raw("/nonexistent-strata-dir/trace.bin", {});
  EXPECT_EQ(io.code(), StatusCode::kIoError);
  EXPECT_NE(io.message().find("/nonexistent-strata-dir/trace.bin"), std::string::npos);
}

TEST(WriteBatchesRaw, EmptyTraceIsJustTheHeader) {
  const std::string path = temp_path("empty");
  ASSERT_TRUE(write_batches_raw(path, {}).is_ok());
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<long long>(in.tellg()), 20);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// Bandwidth probe

TEST(ReadBandwidth, ReturnsAPlausibleNumber) {
  const double gbs = measure_read_bandwidth_gbs(std::size_t{16} << 20, 2);
  EXPECT_GT(gbs, 0.1);
  EXPECT_LT(gbs, 100000.0);
  // Tiny and odd sizes are rounded, not rejected.
  EXPECT_GT(measure_read_bandwidth_gbs(1000, 3), 0.0);
}

}  // namespace
}  // namespace strata::bench
