// The steady state of a training loop makes no device allocation, frees nothing and creates no
// event: under cuda a free synchronizes the whole device (and an allocation may), which would
// stall every stream once per step. The engines size their staging and events from the batches
// of the first steps (gpu/staging.hpp); the emu device counts what a step makes
// (Device::resource_counts, StoreStats::device_resources).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

struct Mode {
  const char* name;
  Placement placement;
  CacheTransfer transfer = CacheTransfer::kStaged;
  std::int64_t flush_every = 0;
  OffloadGather gather = OffloadGather::kDevice;
};

// Two tables of different shapes, caches of a tenth of their rows (evictions and dirty
// write-backs every step once warm), lookahead planning.
StoreConfig steady_config(const Mode& m) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  c.device.emu_max_delay_us = 20;
  c.cache.policy = cache::Policy::kLookahead;
  c.cache.lookahead = 2;
  c.cache.max_in_flight = 6;
  c.cache.transfer = m.transfer;
  c.cache.flush_every = m.flush_every;
  c.offload_gather = m.gather;
  const int dims[] = {16, 8};
  for (int t = 0; t < 2; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = 4000;
    tc.spec.dim = dims[t];
    tc.spec.pooling = t == 0 ? Pooling::kSum : Pooling::kMean;
    tc.spec.optimizer.kind = t == 0 ? OptimizerKind::kAdagrad : OptimizerKind::kRowwiseAdagrad;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.placement = m.placement;
    if (m.placement == Placement::kCached || m.placement == Placement::kHybrid) tc.cache.fraction = 0.1;
    c.tables.push_back(tc);
  }
  return c;
}

// 64 bags of 0 to 7 keys (jagged: every batch has a different number of keys and unique rows),
// half of them from a hot range.
KeyBatch jagged_batch(std::mt19937_64& rng, const StoreConfig& c) {
  KeyBatch kb;
  for (const auto& t : c.tables) {
    JaggedKeys f;
    f.table = t.spec.name;
    f.offsets.push_back(0);
    for (int b = 0; b < 64; ++b) {
      const int len = static_cast<int>(rng() % 8);
      for (int i = 0; i < len; ++i) {
        const std::uint64_t range = rng() % 2 ? 200 : static_cast<std::uint64_t>(t.spec.rows);
        f.keys.push_back(static_cast<Key>(rng() % range));
      }
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    kb.features.push_back(std::move(f));
  }
  return kb;
}

TEST(SteadyState, ATrainingLoopAllocatesNothingAfterWarmUp) {
  const Mode modes[] = {
      {"cached staged", Placement::kCached},
      {"cached zero_copy", Placement::kCached, CacheTransfer::kZeroCopy},
      {"cached flush_every 3", Placement::kCached, CacheTransfer::kStaged, 3},
      {"hybrid", Placement::kHybrid},
      {"gpu", Placement::kGpu},
      {"offload device gather", Placement::kOffload},
  };
  const int depth = 3, warm_up = 12, steady = 40;
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    const StoreConfig c = steady_config(m);
    auto s = Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    Store& store = **s;
    std::mt19937_64 rng(7);
    std::vector<KeyBatch> batches;
    for (int i = 0; i < warm_up + steady + depth; ++i) batches.push_back(jagged_batch(rng, c));
    for (int i = 0; i < depth; ++i) ASSERT_TRUE(store.submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
    gpu::ResourceCounts before;
    for (int i = 0; i < warm_up + steady; ++i) {
      if (i == warm_up) before = store.stats().device_resources;
      const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
      Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
      fill_random(rng, grads);
      ASSERT_TRUE(store.forward(i, out.views).is_ok()) << "step " << i;
      ASSERT_TRUE(store.backward(i, grads.cviews).is_ok()) << "step " << i;
      ASSERT_TRUE(store.submit(i + depth, batches[static_cast<std::size_t>(i + depth)]).is_ok()) << "step " << i;
    }
    const gpu::ResourceCounts during = store.stats().device_resources - before;
    EXPECT_EQ(during.allocations, 0u);
    EXPECT_EQ(during.frees, 0u);
    EXPECT_EQ(during.events, 0u);
    if (m.placement == Placement::kCached) {
      const StoreStats st = store.stats();
      EXPECT_GT(st.cache[0].second.writebacks, 100) << "the cache is too large to write back every step";
    }
  }
}

}  // namespace
}  // namespace strata
