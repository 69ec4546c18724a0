#pragma once
// Shared by the dynamic table tests (dynamic_test.cpp, dynamic_checkpoint_test.cpp): a config of a dynamic table beside
// a dense one and a second dynamic table, random batches over a key space several times the capacity, and a bitwise
// comparison of a dynamic table in two stores.

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "tests/store/store_test_util.hpp"

namespace strata::testing {

struct Case {
  const char* name;
  std::int64_t admit_after;
  Eviction eviction;
  std::int64_t ttl;
  Unseen unseen;
  DType dtype;
  OptimizerKind optimizer;
  bool two_features;
};

inline std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

inline StoreConfig config_of(const Case& k) {
  StoreConfig c;
  c.threads = 2;
  TableConfig user;
  user.spec.name = "user";
  user.spec.rows = 10;  // the capacity
  user.spec.dim = 8;
  user.spec.init.bound = 0.5f;
  user.spec.dtype = k.dtype;
  user.spec.stochastic_rounding = k.dtype != DType::kF32;
  user.spec.optimizer.kind = k.optimizer;
  user.spec.optimizer.learning_rate = 0.25f;
  user.dynamic = DynamicSpec{k.admit_after, k.eviction, k.ttl, k.unseen};
  if (k.two_features) user.features = {{"clicked", std::nullopt}, {"bought", Pooling::kMean}};
  c.tables.push_back(user);
  TableConfig item;
  item.spec.name = "item";
  item.spec.rows = 6;
  item.spec.dim = 4;
  item.spec.optimizer.kind = OptimizerKind::kAdagrad;
  c.tables.push_back(item);
  // A second dynamic table, in some batches only: every training submit ticks its clock (and its TTL) all the same.
  // It shares item's slot pool in `cached` and `hybrid`.
  TableConfig ad;
  ad.spec.name = "ad";
  ad.spec.rows = 4;
  ad.spec.dim = 4;
  ad.spec.optimizer.kind = OptimizerKind::kAdagrad;  // item's record shape: one slot pool for both
  ad.dynamic = DynamicSpec{1, k.eviction, k.ttl, Unseen::kInitial};
  c.tables.push_back(ad);
  return c;
}

// Every table of config_of(k) in `placement` on the emu device, with random delays before its stream operations (so
// that a missing wait shows); a cache of 3 rows a table (of 11, 7 and 5 served), so that rows given to new keys are
// often cached, dirty or on their way home: `cached` with staged transfers, `hybrid` (one rank: the cached engine)
// with the lookahead policy, two planner partitions and zero-copy transfers.
inline StoreConfig config_of(const Case& k, Placement placement) {
  StoreConfig c = config_of(k);
  c.device.backend = BackendChoice::kEmu;
  c.device.emu_max_delay_us = 20;
  for (TableConfig& t : c.tables) {
    t.placement = placement;
    if (placement == Placement::kCached || placement == Placement::kHybrid) t.cache.rows = 3;
  }
  c.cache.transfer = placement == Placement::kHybrid ? CacheTransfer::kZeroCopy : CacheTransfer::kStaged;
  if (placement == Placement::kHybrid) {
    c.cache.policy = cache::Policy::kLookahead;
    c.cache.lookahead = 1;
    c.cache.planner_partitions = 2;
  }
  return c;
}

// 30 keys: the ends of int64, -1, 0 and random ones; drawn skewed (low indexes more often).
inline std::vector<Key> key_space(std::mt19937_64& rng) {
  std::vector<Key> keys = {std::numeric_limits<Key>::min(), std::numeric_limits<Key>::max(), -1, 0};
  while (keys.size() < 30) keys.push_back(static_cast<Key>(rng()));
  return keys;
}

inline JaggedKeys random_feature(std::mt19937_64& rng, const std::string& name, int bags,
                                 const std::vector<Key>& space) {
  JaggedKeys f;
  f.table = name;
  f.offsets.push_back(0);
  for (int b = 0; b < bags; ++b) {
    const int n = static_cast<int>(rng() % 4);  // empty bags too
    for (int j = 0; j < n; ++j) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      f.keys.push_back(space[static_cast<std::size_t>(u * u * static_cast<double>(space.size()))]);
    }
    f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
  }
  return f;
}

inline KeyBatch random_batch(std::mt19937_64& rng, const StoreConfig& c, const std::vector<Key>& space) {
  KeyBatch kb;
  const int bags = 3;
  for (const std::string& name : feature_names(c.tables[0]))
    kb.features.push_back(random_feature(rng, name, bags, space));
  JaggedKeys item;
  item.table = "item";
  item.offsets = {0, 1, 1, 2};
  item.keys = {static_cast<Key>(rng() % 6), static_cast<Key>(rng() % 6)};
  if (rng() % 2) kb.features.push_back(item);
  if (rng() % 3 == 0) kb.features.push_back(random_feature(rng, "ad", bags, space));
  return kb;
}

// Table `t` (dynamic) of two stores: the same keys, rows, state and (`counters`) counters.
inline ::testing::AssertionResult same_table(Store& a, Store& b, int t, bool counters = true) {
  auto ka = a.keys_held(t), kb = b.keys_held(t);
  if (!ka.is_ok() || !kb.is_ok()) return ::testing::AssertionFailure() << ka.status().to_string();
  if (ka.value() != kb.value()) return ::testing::AssertionFailure() << "different keys held";
  const TableSpec& spec = a.config().tables[static_cast<std::size_t>(t)].spec;
  const auto sd = static_cast<std::size_t>(optimizer_state_dim(spec.optimizer.kind, spec.dim));
  const std::size_t n = ka.value().size(), dim = static_cast<std::size_t>(spec.dim);
  std::vector<float> wa(n * dim), wb(n * dim), sa(n * sd + 1), sb(n * sd + 1);
  if (!a.read_keys(t, ka.value(), wa.data(), sd ? sa.data() : nullptr).is_ok() ||
      !b.read_keys(t, kb.value(), wb.data(), sd ? sb.data() : nullptr).is_ok())
    return ::testing::AssertionFailure() << "read_keys failed";
  if ((!wa.empty() && std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)) != 0) ||
      std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "rows differ";
  if (!counters) return ::testing::AssertionSuccess();
  const std::size_t at = t == 0 ? 0 : 1;  // stats().dynamic lists the dynamic tables in config order
  const DynamicStats x = a.stats().dynamic.at(at).second, y = b.stats().dynamic.at(at).second;
  if (x.rows != y.rows || x.admissions != y.admissions || x.evictions != y.evictions ||
      x.expirations != y.expirations || x.not_admitted != y.not_admitted || x.unseen != y.unseen)
    return ::testing::AssertionFailure() << "counters differ: rows " << x.rows << "/" << y.rows << ", admissions "
                                         << x.admissions << "/" << y.admissions << ", evictions " << x.evictions << "/"
                                         << y.evictions << ", expirations " << x.expirations << "/" << y.expirations
                                         << ", not admitted " << x.not_admitted << "/" << y.not_admitted << ", unseen "
                                         << x.unseen << "/" << y.unseen;
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
