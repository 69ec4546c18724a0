#pragma once
// Random workloads for store tests: configs with several tables, dims, poolings and optimizers;
// batches with empty bags, duplicate keys and optional weights; and a full-state comparison.

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "store/store.hpp"

namespace strata::testing {

inline StoreConfig random_config(std::mt19937_64& rng, int tables) {
  StoreConfig c;
  c.threads = 2;
  c.fake_numa_nodes = 1 + static_cast<int>(rng() % 3);
  const int dims[] = {1, 2, 3, 4, 7, 8, 16, 31, 64, 128, 256};
  for (int t = 0; t < tables; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = 1 + static_cast<std::int64_t>(rng() % 400);
    tc.spec.dim = dims[rng() % (sizeof dims / sizeof dims[0])];
    tc.spec.pooling = static_cast<Pooling>(rng() % 3);
    tc.spec.init.bound = 0.5f;
    tc.spec.init.seed = rng() % 1000;
    tc.spec.optimizer.kind = static_cast<OptimizerKind>(rng() % 4);
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.spec.optimizer.weight_decay = (rng() % 2) ? 0.01f : 0.0f;
    tc.spec.optimizer.initial_accumulator = 0.1f;
    c.tables.push_back(tc);
  }
  return c;
}

/// Gives about half the tables of `c` (at least one) two or three features named "<table>.<letter>", each with the
/// table's pooling or one of its own.
inline void random_features(std::mt19937_64& rng, StoreConfig& c) {
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    if (t > 0 && rng() % 2) continue;
    TableConfig& tc = c.tables[t];
    const int n = 2 + static_cast<int>(rng() % 2);
    for (int i = 0; i < n; ++i) {
      FeatureConfig f{tc.spec.name + "." + static_cast<char>('a' + i), std::nullopt};
      if (rng() % 2) f.pooling = static_cast<Pooling>(rng() % 3);
      tc.features.push_back(f);
    }
  }
}

/// The names a batch of `t` goes by: its features, or its own name when it lists none.
inline std::vector<std::string> feature_names(const TableConfig& t) {
  std::vector<std::string> names;
  for (const FeatureConfig& f : t.features) names.push_back(f.name);
  if (names.empty()) names.push_back(t.spec.name);
  return names;
}

/// The spec of the table of the feature `name`, pooled as the feature (an unknown feature: an empty spec).
inline TableSpec feature_spec(const StoreConfig& c, const std::string& name) {
  const Result<std::pair<int, Pooling>> f = find_feature(c, name);
  if (!f) return TableSpec{};
  TableSpec s = c.tables[static_cast<std::size_t>(f.value().first)].spec;
  s.pooling = f.value().second;
  return s;
}

/// A batch over a random subset of the features (at least one), batch size `batch`. The features of one table share
/// its hot range, so that they often look up the same rows.
inline KeyBatch random_batch(std::mt19937_64& rng, const StoreConfig& c, std::int64_t batch) {
  KeyBatch kb;
  for (const auto& t : c.tables) {
    std::int64_t hot = 0;
    for (const std::string& name : feature_names(t)) {
      if (c.tables.size() + t.features.size() > 1 && rng() % 4 == 0) continue;
      JaggedKeys f;
      f.table = name;
      f.offsets.push_back(0);
      const bool weighted = rng() % 3 == 0;
      if (hot == 0 || t.features.empty())
        hot = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(t.spec.rows));
      for (std::int64_t b = 0; b < batch; ++b) {
        const int len = static_cast<int>(rng() % 6);  // 0: empty bag
        for (int i = 0; i < len; ++i) {
          // A small hot range makes duplicate keys (within and across bags) common.
          const std::int64_t range = (rng() % 2) ? hot : t.spec.rows;
          f.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(range)));
          if (weighted) f.weights.push_back(static_cast<float>(rng() % 1000) / 500.0f);
        }
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      kb.features.push_back(std::move(f));
    }
  }
  if (kb.features.empty()) return random_batch(rng, c, batch);
  return kb;
}

/// A batch of `bags` bags of `keys` uniform keys for every table of `c`.
inline KeyBatch uniform_batch(std::mt19937_64& rng, const StoreConfig& c, int bags, int keys) {
  KeyBatch kb;
  for (const auto& t : c.tables) {
    JaggedKeys f;
    f.table = t.spec.name;
    f.offsets.push_back(0);
    for (int b = 0; b < bags; ++b) {
      for (int k = 0; k < keys; ++k)
        f.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(t.spec.rows)));
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    kb.features.push_back(std::move(f));
  }
  return kb;
}

/// The batch with some features' keys and offsets (each drawn apart) as int32 (JaggedKeys::keys32, offsets32): the
/// same batch to the store, which must give the same results as for the int64 one.
inline KeyBatch with_int32(std::mt19937_64& rng, KeyBatch kb) {
  for (JaggedKeys& f : kb.features) {
    if (rng() % 2) {
      f.keys32.assign(f.keys.begin(), f.keys.end());
      f.keys.clear();
    }
    if (rng() % 2) {
      f.offsets32.assign(f.offsets.begin(), f.offsets.end());
      f.offsets.clear();
    }
  }
  return kb;
}

/// Output/gradient buffers shaped for a batch.
struct Buffers {
  std::vector<std::vector<float>> data;
  std::vector<MatrixView> views;
  std::vector<ConstMatrixView> cviews;
};
inline Buffers make_buffers(const StoreConfig& c, const KeyBatch& kb) {
  Buffers b;
  for (const auto& f : kb.features) {
    const TableSpec spec = feature_spec(c, f.table);
    const std::int64_t rows = output_rows(f, spec.pooling);
    b.data.emplace_back(static_cast<std::size_t>(rows * spec.dim), 0.0f);
  }
  for (std::size_t i = 0; i < b.data.size(); ++i) {
    const std::int64_t cols = feature_spec(c, kb.features[i].table).dim;
    const std::int64_t rows = cols ? static_cast<std::int64_t>(b.data[i].size()) / cols : 0;
    b.views.push_back({b.data[i].data(), rows, cols});
    b.cviews.push_back({b.data[i].data(), rows, cols});
  }
  return b;
}
inline void fill_random(std::mt19937_64& rng, Buffers& b) {
  for (auto& d : b.data)
    for (auto& x : d) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
}

/// Every row and optimizer state of every table, flattened.
struct Snapshot {
  std::vector<std::vector<float>> weights, state;
};
inline Snapshot snapshot(Store& s) {
  Snapshot snap;
  for (std::size_t t = 0; t < s.config().tables.size(); ++t) {
    const auto& spec = s.config().tables[t].spec;
    const auto sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
    snap.weights.emplace_back(static_cast<std::size_t>(spec.rows * spec.dim));
    snap.state.emplace_back(static_cast<std::size_t>(spec.rows * sd));
    const Status read = s.read_rows(static_cast<int>(t), 0, spec.rows, snap.weights.back().data(),
                                    sd ? snap.state.back().data() : nullptr);
    EXPECT_TRUE(read.is_ok()) << "table " << t << ": " << read.to_string();
  }
  return snap;
}
/// Bitwise comparison of two stores' outputs of one batch (make_buffers shapes).
inline ::testing::AssertionResult same_outputs(const Buffers& a, const Buffers& b) {
  for (std::size_t f = 0; f < a.data.size(); ++f)
    for (std::size_t k = 0; k < a.data[f].size(); ++k)
      if (std::memcmp(&a.data[f][k], &b.data[f][k], sizeof(float)) != 0)
        return ::testing::AssertionFailure()
               << "feature " << f << " element " << k << ": " << a.data[f][k] << " vs " << b.data[f][k];
  return ::testing::AssertionSuccess();
}

/// Bitwise comparison: every mode must reproduce the oracle bit for bit on the CPU (the sign of a
/// zero and NaN payloads included, which `==` would not see).
inline ::testing::AssertionResult same_state(const Snapshot& a, const Snapshot& b) {
  const auto same = [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; };
  for (std::size_t t = 0; t < a.weights.size(); ++t) {
    for (std::size_t i = 0; i < a.weights[t].size(); ++i)
      if (!same(a.weights[t][i], b.weights[t][i]))
        return ::testing::AssertionFailure()
               << "table " << t << " weight " << i << ": " << a.weights[t][i] << " vs " << b.weights[t][i];
    for (std::size_t i = 0; i < a.state[t].size(); ++i)
      if (!same(a.state[t][i], b.state[t][i]))
        return ::testing::AssertionFailure()
               << "table " << t << " state " << i << ": " << a.state[t][i] << " vs " << b.state[t][i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
