// The gather probe (bench/gather_probe.hpp): what it reports for a small table, both kernel paths
// (rows of whole registers, any other dim), and the inputs it refuses.

#include "bench/gather_probe.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace strata::bench
