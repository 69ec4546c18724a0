// The steady state of a training loop makes no device allocation, frees nothing and creates no
// event: under cuda a free synchronizes the whole device (and an allocation may), which would
// stall every stream once per step. The engines size their staging and events from the batches
// of the first steps (gpu/staging.hpp); the emu device counts what a step makes
// (Device::resource_counts, StoreStats::device_resources).
// One thing may still be made, by design: a staging ring makes a new entry (its pinned and device
// buffers and its three events) rather than block the host when its oldest free entry's device work
// is still running, up to StagingRing::kMaxBusyFree free entries. A loop whose device falls further
// behind than it did during warm-up gets up to kMaxBusyFree - 1 more per ring then. The emu device
// here delays its work at random, and under ThreadSanitizer (serial oneTBB, every access checked) it
// can fall behind at any step: the tests count what the device made against the entries the rings
// made ahead of the device (StoreStats::staging and activation_staging's `ahead`), and anything
// else, an entry the batches needed among them, fails them.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "gpu/staging.hpp"
#include "tests/store/device_views.hpp"
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

// Batch `i` of a loop's batches (steady_loop).
using BatchMaker = std::function<KeyBatch(std::mt19937_64& rng, const StoreConfig& c, int i)>;

// Trains `warm_up` steps and then `steady` more with `depth` batches submitted ahead (every
// rank of a world calls it with the same seed); returns what the device made during the steady
// steps, or the first error. With `device_views`, outputs and gradients live in device buffers
// that the trainer allocated once, and the calls are stream-ordered on the trainer's stream.
// `links`, when given, receives the bytes per link of the steady steps. `make` gives the batches
// (jagged_batch by default; every batch must have 64 bags per table).
// What the device made during a loop's steady steps; the staging entries the store gained then, and
// those its rings made ahead of the device.
struct Made {
  gpu::ResourceCounts counts;
  std::size_t new_entries = 0, ahead = 0;
};

// The free staging entries of a store (the same number of batches is in flight at each point
// steady_loop looks: `depth` submitted ahead of the step).
std::size_t staging_entries(const StoreStats& st) { return st.staging.entries + st.activation_staging.entries; }
std::size_t made_ahead(const StoreStats& st) { return st.staging.ahead + st.activation_staging.ahead; }

Result<Made> steady_loop(Store& store, const StoreConfig& c, int warm_up, int steady, bool device_views = false,
                         gpu::LinkBytes* links = nullptr, const BatchMaker& make = nullptr) {
  const int depth = 3;
  std::mt19937_64 rng(7);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < warm_up + steady + depth; ++i) batches.push_back(make ? make(rng, c, i) : jagged_batch(rng, c));
  for (int i = 0; i < depth; ++i) STRATA_RETURN_IF_ERROR(store.submit(i, batches[static_cast<std::size_t>(i)]));
  // Every batch has 64 bags of pooled tables: one set of device buffers fits them all.
  gpu::Stream trainer;
  DeviceViews dev_out, dev_grads;
  StepMode mode;
  if (device_views) {
    const Buffers shape = make_buffers(c, batches[0]);
    STRATA_ASSIGN_OR_RETURN(trainer, store.device()->create_stream());
    dev_out = make_device_views(*store.device(), shape);
    dev_grads = make_device_views(*store.device(), shape);
    mode.device = true;
    mode.stream = trainer.view();
    mode.outputs = &dev_out;
    mode.grads = &dev_grads;
  }
  StoreStats before;
  for (int i = 0; i < warm_up + steady; ++i) {
    if (i == warm_up) before = store.stats();
    const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
    Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
    fill_random(rng, grads);
    STRATA_RETURN_IF_ERROR(run_step(store, i, grads, out, mode));
    STRATA_RETURN_IF_ERROR(store.submit(i + depth, batches[static_cast<std::size_t>(i + depth)]));
  }
  if (device_views) STRATA_RETURN_IF_ERROR(store.device()->synchronize(trainer.view()));
  const StoreStats after = store.stats();
  if (links) *links = after.links - before.links;
  const std::size_t entries_before = staging_entries(before), entries_after = staging_entries(after);
  if (entries_after < entries_before)
    return Status::internal("the store lost staging entries: " + std::to_string(entries_before) + " -> " +
                            std::to_string(entries_after));
  return Made{after.device_resources - before.device_resources, entries_after - entries_before,
              made_ahead(after) - made_ahead(before)};
}

// Nothing freed, and nothing made but staging entries made ahead of the device (at most two buffers
// and exactly three events each): none that the batches needed. A ring makes at most
// kMaxBusyFree - 1 of those beyond the most its engine has taken at once, which warm-up reached;
// each engine (at most one per table here) has two rings, for batches and for activations.
void expect_none(const Made& during, const StoreConfig& c) {
  EXPECT_EQ(during.new_entries, during.ahead) << "entries the batches needed after warm-up";
  EXPECT_LE(during.ahead, 2 * (gpu::StagingRing::kMaxBusyFree - 1) * c.tables.size());
  EXPECT_EQ(during.counts.frees, 0u);
  EXPECT_LE(during.counts.allocations, 2 * during.ahead);
  EXPECT_EQ(during.counts.events, 3 * during.ahead);
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
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    const StoreConfig c = steady_config(m);
    auto s = Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const Result<Made> during = steady_loop(**s, c, 12, 40);
    ASSERT_TRUE(during.is_ok()) << during.status().to_string();
    expect_none(during.value(), c);
    if (m.placement == Placement::kCached) {
      const StoreStats st = (*s)->stats();
      EXPECT_GT(st.cache[0].second.writebacks, 100) << "the cache is too large to write back every step";
    }
  }
}

// Rows that turn hot after warm-up: every batch has 64 bags of 8 keys per table (512 key
// positions, more than kHotUses), drawn uniformly during warm-up (no row used more than kHotUses
// times) and from then on with 300 of them on one row. The device's scratch for the hot rows'
// partial sums is sized by the key positions, so the warm-up sized it already.
TEST(SteadyState, RowsTurningHotAfterWarmUpAllocateNothing) {
  const int warm_up = 12;
  const BatchMaker late_hot = [&](std::mt19937_64& rng, const StoreConfig& c, int i) {
    KeyBatch kb;
    for (const auto& t : c.tables) {
      JaggedKeys f;
      f.table = t.spec.name;
      for (int k = 0; k < 512; ++k) f.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(t.spec.rows)));
      if (i >= warm_up) std::fill(f.keys.begin(), f.keys.begin() + 300, Key{5});
      std::shuffle(f.keys.begin(), f.keys.end(), rng);
      for (int b = 0; b <= 64; ++b) f.offsets.push_back(8 * b);
      kb.features.push_back(std::move(f));
    }
    return kb;
  };
  const Mode modes[] = {
      {"cached staged", Placement::kCached},
      {"hybrid", Placement::kHybrid},
      {"gpu", Placement::kGpu},
      {"offload device gather", Placement::kOffload},
  };
  for (const Mode& m : modes) {
    for (bool device_views : {false, true}) {
      SCOPED_TRACE(std::string(m.name) + (device_views ? ", device views" : ""));
      const StoreConfig c = steady_config(m);
      auto s = Store::open(c);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      const Result<Made> during = steady_loop(**s, c, warm_up, 10, device_views, nullptr, late_hot);
      ASSERT_TRUE(during.is_ok()) << during.status().to_string();
      expect_none(during.value(), c);
    }
  }
}

// StoreStats::staging counts what a cached store holds between calls, the flush's entry with the
// batches': a flush (explicit, or every cache.flush_every steps) grows it once, to the largest
// chunk, and later flushes reuse it.
TEST(SteadyState, TheFlushStagingIsCountedWithTheBatches) {
  const StoreConfig c = steady_config({"cached", Placement::kCached});
  auto s = Store::open(c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_TRUE(steady_loop(**s, c, 12, 0).is_ok());
  const StagingBytes before = (*s)->stats().staging;
  ASSERT_TRUE((*s)->flush().is_ok());
  const StagingBytes after = (*s)->stats().staging;
  EXPECT_EQ(after.entries, before.entries + 1);
  // At least the dirty rows' records on each side (staged: host and device copies of each row).
  EXPECT_GT(after.pinned, before.pinned);
  EXPECT_GT(after.device, before.device);
  ASSERT_TRUE((*s)->flush().is_ok());
  const StagingBytes again = (*s)->stats().staging;
  EXPECT_EQ(again.entries, after.entries);
  EXPECT_EQ(again.pinned, after.pinned);
  EXPECT_EQ(again.device, after.device);
}

// The same with outputs and gradients in device buffers and stream-ordered calls: the events that
// order a call after the trainer's stream and the trainer's stream after the call are reused, the
// staging of the adaptor (cpu) and of the finiteness check only grows, and offload copies its
// gradients into staging entries it reuses.
TEST(SteadyState, AStreamOrderedLoopWithDeviceViewsAllocatesNothingAfterWarmUp) {
  const Mode modes[] = {
      {"cached staged", Placement::kCached},
      {"hybrid", Placement::kHybrid},
      {"gpu", Placement::kGpu},
      {"offload device gather", Placement::kOffload},
      {"offload cpu gather", Placement::kOffload, CacheTransfer::kStaged, 0, OffloadGather::kCpu},
      {"cpu beside a gpu table", Placement::kCpu},
  };
  for (const Mode& m : modes) {
    for (bool accept : {false, true}) {
      SCOPED_TRACE(std::string(m.name) + (accept ? ", accept_nonfinite_gradients" : ""));
      StoreConfig c = steady_config(m);
      c.accept_nonfinite_gradients = accept;
      if (m.placement == Placement::kCpu) c.tables[1].placement = Placement::kGpu;  // a store with a device
      auto s = Store::open(c);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      const Result<Made> during = steady_loop(**s, c, 12, 30, true);
      ASSERT_TRUE(during.is_ok()) << during.status().to_string();
      expect_none(during.value(), c);
    }
  }
}

// The same over a world of two thread ranks (row-sharded `hybrid` and `gpu` tables): each rank's
// device makes nothing in the steady state either.
TEST(SteadyState, EveryRankOfAWorldAllocatesNothingAfterWarmUp) {
  for (bool device_views : {false, true})
    for (Placement placement : {Placement::kHybrid, Placement::kGpu}) {
      SCOPED_TRACE(std::string(to_string(placement)) + (device_views ? ", device views" : ", host views"));
      StoreConfig c = steady_config({"world", placement});
      // No finiteness check: its counts come back D2H, and the test below wants to see none.
      c.accept_nonfinite_gradients = true;
      for (auto& t : c.tables) t.sharding.type = dispatch::ShardingType::kRow;
      auto group = dispatch::make_local_group(2);
      ASSERT_TRUE(group.is_ok()) << group.status().to_string();
      std::vector<Result<Made>> during(2, Status::internal("not run"));
      std::vector<gpu::LinkBytes> links(2);
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r) {
        ranks.emplace_back([&, r] {
          auto s = Store::open(c, std::shared_ptr<dispatch::Communicator>(std::move(group.value()[r])));
          if (!s.is_ok()) {
            during[static_cast<std::size_t>(r)] = s.status();
            return;
          }
          during[static_cast<std::size_t>(r)] =
              steady_loop(**s, c, 12, 30, device_views, &links[static_cast<std::size_t>(r)]);
        });
      }
      for (auto& t : ranks) t.join();
      for (int r = 0; r < 2; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        ASSERT_TRUE(during[static_cast<std::size_t>(r)].is_ok())
            << during[static_cast<std::size_t>(r)].status().to_string();
        expect_none(during[static_cast<std::size_t>(r)].value(), c);
        // Rows and gradients stay on the device: with the trainer's buffers there, a sharded `gpu`
        // table moves nothing D2H but what the test itself downloads, its 64 pooled outputs of
        // dims 16 and 8 per step (a `hybrid` shard also writes its cache's dirty rows back).
        if (device_views && placement == Placement::kGpu) {
          EXPECT_EQ(links[static_cast<std::size_t>(r)].d2h, 30u * 64u * (16u + 8u) * sizeof(float));
        }
        // Activations copied in host memory: none with device views; with host views each step's
        // outputs and gradients once (links.host_copy counts what the engines memcpy).
        EXPECT_EQ(links[static_cast<std::size_t>(r)].host_copy,
                  device_views ? 0u : 30u * 2u * 64u * (16u + 8u) * sizeof(float));
      }
    }
}

}  // namespace
}  // namespace strata
