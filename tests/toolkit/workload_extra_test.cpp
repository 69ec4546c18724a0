// Workload additions: the drifting Zipf distribution, variable bag lengths and the built-in
// Criteo-shaped table set.

#include "toolkit/workload.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

KeySampler make_sampler(const std::string& dist, std::int64_t rows, std::uint64_t seed) {
  auto s = KeySampler::create(dist, rows, seed);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

// The `n` most frequent keys of `keys`.
std::set<Key> top_keys(const std::vector<Key>& keys, std::size_t n) {
  std::map<Key, int> freq;
  for (Key k : keys) ++freq[k];
  std::vector<std::pair<int, Key>> v;
  for (const auto& [k, c] : freq) v.emplace_back(c, k);
  std::sort(v.rbegin(), v.rend());
  std::set<Key> out;
  for (std::size_t i = 0; i < std::min(n, v.size()); ++i) out.insert(v[i].second);
  return out;
}

std::size_t overlap(const std::set<Key>& a, const std::set<Key>& b) {
  std::size_t n = 0;
  for (Key k : a) n += b.count(k);
  return n;
}

// ---------------------------------------------------------------------------------------------
// drift:ALPHA:N

TEST(DriftDistribution, Parses) {
  auto d = parse_distribution("drift:1.05:250");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(d->kind, Distribution::Kind::kDrift);
  EXPECT_DOUBLE_EQ(d->alpha, 1.05);
  EXPECT_EQ(d->drift_steps, 250);
  for (const char* bad : {"drift", "drift:", "drift:1.1", "drift:1.1:", "drift::5", "drift:0:5", "drift:-1:5",
                          "drift:1.1:0", "drift:1.1:-3", "drift:1.1:+3", "drift:1.1:5x", "drift:1.1:5:6", "drift:nan:5",
                          "drift:1.1:99999999999999999999", "zipf:1.1:5"}) {
    auto bad_d = parse_distribution(bad);
    ASSERT_FALSE(bad_d.is_ok()) << bad;
    EXPECT_EQ(bad_d.status().message(),
              std::string("unknown distribution '") + bad + "' (expected uniform, zipf:ALPHA or drift:ALPHA:N)");
  }
  WorkloadSpec w;
  w.dist = "drift:1.2:10";
  EXPECT_TRUE(validate(w).is_ok());
}

TEST(DriftDistribution, HotSetMovesEveryNSteps) {
  constexpr std::int64_t kRows = 1000000;
  KeySampler s = make_sampler("drift:1.2:10", kRows, 7);
  const auto draw = [&](std::int64_t step) {
    s.set_step(step);
    s.set_stream(static_cast<std::uint64_t>(step));
    std::vector<Key> keys(50000);
    s.fill(keys.data(), static_cast<std::int64_t>(keys.size()));
    return keys;
  };
  const std::set<Key> epoch0 = top_keys(draw(0), 10);
  const std::set<Key> epoch0_late = top_keys(draw(9), 10);
  EXPECT_EQ(s.epoch(), 0);
  const std::set<Key> epoch1 = top_keys(draw(10), 10);
  EXPECT_EQ(s.epoch(), 1);
  const std::set<Key> epoch1_late = top_keys(draw(19), 10);
  const std::set<Key> epoch2 = top_keys(draw(25), 10);
  EXPECT_EQ(s.epoch(), 2);

  // Within an epoch the hot set stays; across epochs it moves (with 1e6 rows, a chance overlap of
  // the top 10 is essentially impossible).
  EXPECT_GE(overlap(epoch0, epoch0_late), 8u);
  EXPECT_GE(overlap(epoch1, epoch1_late), 8u);
  EXPECT_LE(overlap(epoch0, epoch1), 1u);
  EXPECT_LE(overlap(epoch1, epoch2), 1u);

  // The hottest rank maps to the hottest key of its epoch.
  s.set_step(0);
  EXPECT_TRUE(epoch0.count(s.rank_to_row(0)));
  s.set_step(10);
  EXPECT_TRUE(epoch1.count(s.rank_to_row(0)));
  // Going back to an earlier epoch restores its permutation.
  s.set_step(3);
  EXPECT_TRUE(epoch0.count(s.rank_to_row(0)));
}

TEST(DriftDistribution, EpochZeroIsZipf) {
  KeySampler z = make_sampler("zipf:1.2", 5000, 11);
  KeySampler d = make_sampler("drift:1.2:4", 5000, 11);
  for (std::int64_t r = 0; r < 5000; r += 37) EXPECT_EQ(z.rank_to_row(r), d.rank_to_row(r));
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(z.next(), d.next());
  // set_step is a no-op for zipf and uniform.
  z.set_step(1000);
  EXPECT_EQ(z.epoch(), 0);
  d.set_step(1000);
  EXPECT_EQ(d.epoch(), 250);
  EXPECT_NE(z.rank_to_row(0), d.rank_to_row(0));
}

TEST(DriftDistribution, MakeBatchesMovesTheHotSetEveryNBatches) {
  WorkloadSpec w;
  w.rows = 2000000;
  w.batch = 4096;
  w.bag_size = 8;
  w.dist = "drift:1.2:2";
  w.distinct_batches = 6;
  const auto batches = make_batches(w, {"t"}, 2);
  std::vector<std::set<Key>> hot;
  for (const KeyBatch& b : batches) hot.push_back(top_keys(b.features[0].keys, 5));
  EXPECT_GE(overlap(hot[0], hot[1]), 4u);  // epoch 0
  EXPECT_GE(overlap(hot[2], hot[3]), 4u);  // epoch 1
  EXPECT_GE(overlap(hot[4], hot[5]), 4u);  // epoch 2
  EXPECT_LE(overlap(hot[1], hot[2]), 1u);
  EXPECT_LE(overlap(hot[3], hot[4]), 1u);
  // Independent of the thread count.
  const auto one = make_batches(w, {"t"}, 1);
  for (std::size_t b = 0; b < batches.size(); ++b) EXPECT_EQ(one[b].features[0].keys, batches[b].features[0].keys);
}

// ---------------------------------------------------------------------------------------------
// Bag lengths

TEST(BagDist, ParsesAndValidates) {
  EXPECT_EQ(*parse_bag_dist("fixed"), BagDist::kFixed);
  EXPECT_EQ(*parse_bag_dist("uniform"), BagDist::kUniform);
  EXPECT_EQ(parse_bag_dist("poisson").status().message(),
            "unknown bag length distribution 'poisson' (expected fixed or uniform)");
  WorkloadSpec w;
  w.bag_dist = "poisson";
  EXPECT_NE(validate(w).message().find("unknown bag length distribution 'poisson'"), std::string::npos);

  auto j = parse_workload_json(R"({"bag_dist": "uniform", "bag_size": 3})");
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  EXPECT_EQ(j->bag_dist, "uniform");
  EXPECT_NE(parse_workload_json(R"({"bag_dist": 3})").status().message().find("'bag_dist' must be a string"),
            std::string::npos);
  auto round = parse_workload_json(workload_to_json(*j));
  ASSERT_TRUE(round.is_ok());
  EXPECT_EQ(round->bag_dist, "uniform");
}

TEST(BagDist, UniformLengthsAreVariableAndValid) {
  WorkloadSpec w;
  w.tables = 2;
  w.rows = 1000;
  w.batch = 3000;
  w.bag_size = 5;
  w.bag_dist = "uniform";
  w.distinct_batches = 3;
  const std::vector<std::string> names = {"a", "b"};
  const auto batches = make_batches(w, names, 3);
  TableSpec spec;
  spec.rows = w.rows;
  spec.dim = 4;
  std::vector<int> hist(11, 0);
  std::int64_t total = 0, bags = 0;
  for (const KeyBatch& b : batches) {
    for (std::size_t t = 0; t < names.size(); ++t) {
      const JaggedKeys& f = b.features[t];
      spec.name = names[t];
      ASSERT_TRUE(validate(f, spec, w.batch).is_ok()) << validate(f, spec, w.batch).to_string();
      for (std::int64_t i = 0; i < w.batch; ++i) {
        const std::int64_t len = f.offsets[static_cast<std::size_t>(i) + 1] - f.offsets[static_cast<std::size_t>(i)];
        ASSERT_GE(len, 0);
        ASSERT_LE(len, 2 * w.bag_size);
        ++hist[static_cast<std::size_t>(len)];
        total += len;
        ++bags;
      }
    }
  }
  for (int len = 0; len <= 10; ++len) EXPECT_GT(hist[static_cast<std::size_t>(len)], 0) << "length " << len;
  EXPECT_NEAR(static_cast<double>(total) / static_cast<double>(bags), 5.0, 0.15);
  // Deterministic, independent of the thread count, and different per table and batch.
  const auto again = make_batches(w, names, 1);
  for (std::size_t b = 0; b < batches.size(); ++b)
    for (std::size_t t = 0; t < names.size(); ++t) {
      EXPECT_EQ(again[b].features[t].offsets, batches[b].features[t].offsets);
      EXPECT_EQ(again[b].features[t].keys, batches[b].features[t].keys);
    }
  EXPECT_NE(batches[0].features[0].offsets, batches[1].features[0].offsets);
  EXPECT_NE(batches[0].features[0].offsets, batches[0].features[1].offsets);
}

TEST(BagDist, FixedIsTheDefaultAndUnchanged) {
  WorkloadSpec w;
  w.rows = 500;
  w.batch = 100;
  w.bag_size = 3;
  w.distinct_batches = 2;
  EXPECT_EQ(w.bag_dist, "fixed");
  const auto a = make_batches(w, {"t"});
  for (const KeyBatch& b : a)
    for (std::int64_t i = 0; i <= w.batch; ++i) ASSERT_EQ(b.features[0].offsets[static_cast<std::size_t>(i)], 3 * i);
  // Uniform lengths with bag_size 0 give only empty bags.
  w.bag_size = 0;
  w.bag_dist = "uniform";
  const auto e = make_batches(w, {"t"});
  EXPECT_EQ(e[0].features[0].offsets, std::vector<std::int64_t>(101, 0));
}

// ---------------------------------------------------------------------------------------------
// The built-in Criteo table set

TEST(CriteoTables, RowCountsAreTheKaggleOnes) {
  const std::int64_t total =
      std::accumulate(std::begin(kCriteoKaggleRows), std::end(kCriteoKaggleRows), std::int64_t{0});
  EXPECT_EQ(total, 33762577);  // "total_rows" of criteo_kaggle in the shared data file
  EXPECT_EQ(kCriteoKaggleRows[2], 10131227);
  EXPECT_EQ(kCriteoKaggleRows[8], 3);
  EXPECT_EQ(kCriteoKaggleRows[25], 142572);
}

TEST(CriteoTables, ScalingRuleHandComputed) {
  // Fits: unchanged.
  EXPECT_EQ(*scale_table_rows({100, 10, 1}, 1000), (std::vector<std::int64_t>{100, 10, 1}));
  EXPECT_EQ(*scale_table_rows({100, 10, 1}, 111), (std::vector<std::int64_t>{100, 10, 1}));
  // Total 1111 into 111: s = 111/1111 floors the two small tables to 0, so they are pinned at 1;
  // then s = (111 - 2) / 1100 = 0.0991: 1000 -> 99, 100 -> 9. Sum 110 <= 111.
  EXPECT_EQ(*scale_table_rows({1000, 100, 10, 1}, 111), (std::vector<std::int64_t>{99, 9, 1, 1}));
  // Halving: floors of exact halves.
  EXPECT_EQ(*scale_table_rows({400, 200, 100}, 350), (std::vector<std::int64_t>{200, 100, 50}));
  // Everything pinned.
  EXPECT_EQ(*scale_table_rows({5, 5}, 2), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(*scale_table_rows({1000000}, 1), (std::vector<std::int64_t>{1}));
  // Errors.
  EXPECT_EQ(scale_table_rows({5, 5, 5}, 2).status().message(),
            "scale_table_rows: max_total_rows 2 is below one row for each of the 3 tables");
  EXPECT_NE(scale_table_rows({5, 0}, 10).status().message().find("table 1 has 0 rows (expected > 0)"),
            std::string::npos);
  EXPECT_FALSE(scale_table_rows({}, 10).is_ok());
}

TEST(CriteoTables, DefaultSetFitsAndKeepsShape) {
  auto t = criteo_default_tables();
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 26u);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < 26; ++i) {
    const TableSpec& s = (*t)[i];
    EXPECT_EQ(s.name, "C" + std::to_string(i + 1));
    EXPECT_EQ(s.dim, 64);
    EXPECT_GE(s.rows, 1);
    EXPECT_LE(s.rows, kCriteoKaggleRows[i]);
    EXPECT_TRUE(validate(s).is_ok()) << validate(s).to_string();
    sum += s.rows;
  }
  EXPECT_LE(sum, kCriteoDefaultMaxRows);
  EXPECT_GT(sum, kCriteoDefaultMaxRows - 26);  // the budget is used, not wasted
  // At dim 64 fp32 with Adam state (weights + 2 moments) the set is at most 1.5 GB.
  EXPECT_LE(static_cast<double>(sum) * 64 * 4 * 3, 1.5e9);
  // Order is kept, and the large tables keep their relative sizes within 1%.
  const double s = static_cast<double>((*t)[2].rows) / static_cast<double>(kCriteoKaggleRows[2]);
  for (std::size_t i = 0; i < 26; ++i) {
    for (std::size_t j = 0; j < 26; ++j) {
      if (kCriteoKaggleRows[i] <= kCriteoKaggleRows[j]) {
        EXPECT_LE((*t)[i].rows, (*t)[j].rows) << i << " " << j;
      }
    }
    if ((*t)[i].rows >= 100) {
      EXPECT_NEAR(static_cast<double>((*t)[i].rows) / static_cast<double>(kCriteoKaggleRows[i]) / s, 1.0, 0.01) << i;
    }
  }
  // Other budgets and dims; a budget above the full size keeps the real counts.
  auto full = criteo_default_tables(40000000, 16);
  ASSERT_TRUE(full.is_ok());
  for (std::size_t i = 0; i < 26; ++i) EXPECT_EQ((*full)[i].rows, kCriteoKaggleRows[i]);
  EXPECT_EQ((*full)[0].dim, 16);
  EXPECT_FALSE(criteo_default_tables(25).is_ok());
  EXPECT_FALSE(criteo_default_tables(1000, 0).is_ok());
}

}  // namespace
}  // namespace strata::bench
