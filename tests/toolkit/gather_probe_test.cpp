// The gather and update probes (toolkit/gather_probe.hpp): what they report for a small table, both
// kernel paths of each (rows of whole registers, any other width), and the inputs they refuse.

#include "toolkit/gather_probe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace strata::bench {
namespace {

// `batches` batches of `bags` bags of `pooling` uniform random rows of [0, rows).
std::vector<GatherProbeBatch> random_batches(int batches, std::int64_t bags, int pooling, std::int64_t rows) {
  std::mt19937_64 rng(3);
  std::vector<GatherProbeBatch> out(static_cast<std::size_t>(batches));
  for (auto& b : out) {
    b.offsets.push_back(0);
    for (std::int64_t i = 0; i < bags; ++i) {
      for (int k = 0; k < pooling; ++k)
        b.rows.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rows)));
      b.offsets.push_back(static_cast<std::int64_t>(b.rows.size()));
    }
  }
  return out;
}

void expect_sane(const GatherProbeResult& r, const GatherProbeSpec& spec, int repetitions) {
  EXPECT_EQ(r.dim, spec.dim);
  EXPECT_EQ(r.row_bytes, 4 * spec.dim);
  EXPECT_EQ(r.table_rows, spec.table_rows);
  EXPECT_EQ(r.table_bytes, spec.table_rows * spec.stride * 4);
  EXPECT_EQ(r.threads, spec.threads);
  EXPECT_EQ(r.repetitions, repetitions);
  EXPECT_GT(r.lookups_per_s, 0.0);
  EXPECT_GE(r.best_lookups_per_s, r.lookups_per_s);
  EXPECT_DOUBLE_EQ(r.gb_per_s, r.lookups_per_s * 4.0 * spec.dim / 1e9);
  EXPECT_TRUE(r.prefetch_distance == 24 || r.prefetch_distance == 48 || r.prefetch_distance == 96)
      << r.prefetch_distance;
}

TEST(GatherProbe, RowsOfWholeRegisters) {
  const GatherProbeSpec spec{64, 64, 20000, 2};
  auto r = measure_gather_limit(spec, random_batches(3, 256, 8, spec.table_rows), 5);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_sane(r.value(), spec, 5);
}

TEST(GatherProbe, AnyDimWithPaddedRecordsAndEmptyBags) {
  const GatherProbeSpec spec{20, 32, 5000, 3};
  auto batches = random_batches(2, 100, 3, spec.table_rows);
  batches[0].offsets.insert(batches[0].offsets.begin() + 1, 0);  // an empty first bag
  auto r = measure_gather_limit(spec, batches, 3);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_sane(r.value(), spec, 3);
}

TEST(GatherProbe, MoreThreadsThanBags) {
  const GatherProbeSpec spec{16, 16, 100, 4};
  auto r = measure_gather_limit(spec, random_batches(1, 2, 1, spec.table_rows), 1);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_sane(r.value(), spec, 1);
}

struct Bad {
  const char* name;
  GatherProbeSpec spec;
  int repetitions;
  const char* message;
};

TEST(GatherProbe, RefusesBadInput) {
  const auto good = random_batches(1, 4, 2, 10);
  for (const Bad& c : {Bad{"dim", {0, 16, 10, 1}, 1, "dim 0 (expected > 0)"},
                       Bad{"stride", {16, 8, 10, 1}, 1, "stride 8 (expected >= dim 16)"},
                       Bad{"rows", {16, 16, 0, 1}, 1, "table_rows 0 (expected > 0)"},
                       Bad{"threads", {16, 16, 10, 0}, 1, "threads 0 (expected > 0)"},
                       Bad{"repetitions", {16, 16, 10, 1}, 0, "repetitions 0 (expected > 0)"},
                       Bad{"row out of range", {16, 16, 5, 1}, 1, "outside [0, 5)"}}) {
    auto r = measure_gather_limit(c.spec, good, c.repetitions);
    ASSERT_FALSE(r.is_ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << c.name << ": " << r.status().message();
  }
  const GatherProbeSpec spec{16, 16, 10, 1};
  EXPECT_NE(measure_gather_limit(spec, {}, 1).status().message().find("no batches"), std::string::npos);
  auto bad = good;
  bad[0].offsets.back() = 3;
  EXPECT_NE(measure_gather_limit(spec, bad, 1).status().message().find("end at the row count 8"), std::string::npos);
  bad = good;
  bad[0].offsets[2] = 1;
  bad[0].offsets[1] = 3;
  EXPECT_NE(measure_gather_limit(spec, bad, 1).status().message().find("offsets decrease at bag 1"), std::string::npos);
}

// `passes` passes of `n` distinct random rows of [0, rows), in random order.
std::vector<std::vector<std::int64_t>> distinct_rows(int passes, std::int64_t n, std::int64_t rows) {
  std::mt19937_64 rng(5);
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(passes));
  for (auto& p : out) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) all[static_cast<std::size_t>(i)] = i;
    std::shuffle(all.begin(), all.end(), rng);
    p.assign(all.begin(), all.begin() + n);
  }
  return out;
}

void expect_sane(const UpdateProbeResult& r, const UpdateProbeSpec& spec, int repetitions) {
  EXPECT_EQ(r.record_floats, spec.record_floats);
  EXPECT_EQ(r.record_bytes, 4 * spec.record_floats);
  EXPECT_EQ(r.table_rows, spec.table_rows);
  EXPECT_EQ(r.table_bytes, spec.table_rows * spec.stride * 4);
  EXPECT_EQ(r.threads, spec.threads);
  EXPECT_EQ(r.repetitions, repetitions);
  EXPECT_GT(r.rows_per_s, 0.0);
  EXPECT_GE(r.best_rows_per_s, r.rows_per_s);
  EXPECT_DOUBLE_EQ(r.gb_per_s, r.rows_per_s * 8.0 * spec.record_floats / 1e9);
  EXPECT_TRUE(r.prefetch_distance == 24 || r.prefetch_distance == 48 || r.prefetch_distance == 96)
      << r.prefetch_distance;
}

TEST(UpdateProbe, RecordsOfWholeRegistersAndAnyWidth) {
  for (const UpdateProbeSpec spec :
       {UpdateProbeSpec{64, 64, 20000, 2}, UpdateProbeSpec{80, 96, 5000, 3}, UpdateProbeSpec{20, 32, 3000, 1}}) {
    auto r = measure_update_limit(spec, distinct_rows(3, 1000, spec.table_rows), 5);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    expect_sane(r.value(), spec, 5);
  }
}

TEST(UpdateProbe, MoreThreadsThanRows) {
  const UpdateProbeSpec spec{16, 16, 100, 4};
  auto r = measure_update_limit(spec, distinct_rows(1, 2, spec.table_rows), 1);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_sane(r.value(), spec, 1);
}

struct BadUpdate {
  const char* name;
  UpdateProbeSpec spec;
  int repetitions;
  const char* message;
};

TEST(UpdateProbe, RefusesBadInput) {
  const auto good = distinct_rows(1, 4, 10);
  for (const BadUpdate& c : {BadUpdate{"floats", {0, 16, 10, 1}, 1, "record_floats 0 (expected > 0)"},
                             BadUpdate{"stride", {16, 8, 10, 1}, 1, "stride 8 (expected >= record_floats 16)"},
                             BadUpdate{"rows", {16, 16, 0, 1}, 1, "table_rows 0 (expected > 0)"},
                             BadUpdate{"threads", {16, 16, 10, 0}, 1, "threads 0 (expected > 0)"},
                             BadUpdate{"repetitions", {16, 16, 10, 1}, 0, "repetitions 0 (expected > 0)"},
                             BadUpdate{"row out of range", {16, 16, 5, 1}, 1, "outside [0, 5)"}}) {
    auto r = measure_update_limit(c.spec, good, c.repetitions);
    ASSERT_FALSE(r.is_ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << c.name << ": " << r.status().message();
  }
  const UpdateProbeSpec spec{16, 16, 10, 1};
  EXPECT_NE(measure_update_limit(spec, {}, 1).status().message().find("no passes"), std::string::npos);
  EXPECT_NE(measure_update_limit(spec, {{1, 2}, {}}, 1).status().message().find("pass 1 has no rows"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::bench
