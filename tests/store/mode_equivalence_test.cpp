// Invariant 1 (same function) for the device modes: stores mixing `cpu`, `offload`, `cached`, `gpu`
// and `hybrid` tables on the emu device (and cuda when a GPU is visible) against the reference, on randomized
// multi-table workloads: caches sized to a few batches so rows are evicted and written back all the
// time, every policy, lookahead depths 0..8, pools planned in 1..4 partitions, duplicate keys, empty
// bags, random stream delays, and flush/save/load in the middle of training; caches too small
// for the batches in flight, whose plans wait for batches to retire (CacheStats::deferred); caches
// of 1..10 rows against batches of hundreds of distinct rows, which bypass them (CacheStats::bypassed); outputs
// and gradients in host or device memory, passed by synchronous or stream-ordered calls (the strict
// emu device kills a host dereference of device memory). Results must be bit-exact. Half cases give
// the tables bf16 and fp16 rows beside fp32 ones, bf16 optimizer state and stochastic rounding (issue 31).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "gpu/device.hpp"
#include "host/dedup.hpp"
#include "tests/gpu/cuda_gate.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/half_tables.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

struct ModeCase {
  int seed;
  bool cuda;
  bool overflow = false;  // caches hold one batch, not `depth`: plans are deferred
  bool bypass = false;    // caches of 1..10 rows, batches of hundreds of rows: rows bypass the caches
  bool half = false;      // tables of bf16, fp16 or fp32 rows, bf16 state, stochastic rounding or not
  bool features = false;  // tables looked up by two or three features each, of their own poolings (issue 35)
  bool int32 = false;     // the store gets some features' keys and offsets as int32, the reference int64 (issue 35)
};

class ModeEquivalence : public ::testing::TestWithParam<ModeCase> {};

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("strata_mode_eq_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

TEST_P(ModeEquivalence, OutputsAndFinalStateEqualTheReference) {
  const ModeCase mc = GetParam();
  if (mc.cuda) STRATA_SKIP_WITHOUT_CUDA_GPU();
  std::mt19937_64 rng(static_cast<std::uint64_t>(mc.seed) * 7919 + 13);
  StoreConfig config = random_config(rng, 1 + static_cast<int>(rng() % 4));
  // Feature cases draw from a generator of their own, so the other cases stay as they were.
  std::mt19937_64 feature_rng(static_cast<std::uint64_t>(mc.seed) * 113 + 17);
  if (mc.features) random_features(feature_rng, config);
  // Bypass cases draw from a generator of their own too: tables of hundreds of rows, batches of
  // hundreds of keys, caches of a few rows.
  std::mt19937_64 bypass_rng(static_cast<std::uint64_t>(mc.seed) * 71 + 29);
  if (mc.bypass)
    for (auto& t : config.tables) t.spec.rows = 200 + static_cast<std::int64_t>(bypass_rng() % 800);
  const int steps = 8;
  // Overflow cases draw from a generator of their own, so the other cases stay as they were.
  std::mt19937_64 overflow_rng(static_cast<std::uint64_t>(mc.seed) * 131 + 3);
  const int drawn_depth = 1 + static_cast<int>(rng() % 3);
  // batches submitted ahead of forward; overflow: several, so that plans meet pinned rows
  const int depth = mc.overflow ? 2 + static_cast<int>(overflow_rng() % 3) : drawn_depth;
  std::vector<KeyBatch> batches;
  for (int i = 0; i < steps; ++i)
    batches.push_back(random_batch(
        rng, config,
        (mc.bypass ? 60 + static_cast<std::int64_t>(bypass_rng() % 100) : 1) + static_cast<std::int64_t>(rng() % 40)));

  // Placement per table; cached tables get a cache just big enough for `depth` batches in flight.
  config.cache.policy = static_cast<cache::Policy>(rng() % 3);
  config.cache.lookahead = static_cast<int>(rng() % 9);  // 0..8
  if (mc.overflow)
    config.cache.lookahead =
        static_cast<int>(overflow_rng() % static_cast<std::uint64_t>(depth));  // plans before forward
  config.cache.max_in_flight = std::max(depth, config.cache.lookahead + 1);
  config.offload_gather = rng() % 2 ? OffloadGather::kDevice : OffloadGather::kCpu;
  config.device.backend = mc.cuda ? BackendChoice::kCuda : BackendChoice::kEmu;
  config.device.emu_max_delay_us = rng() % 2 ? 30 : 0;
  for (auto& t : config.tables) {
    // Every placement of one rank: cpu, offload, cached, gpu (all rows in HBM) and hybrid (a world
    // of one: its shard is the whole table, cached).
    t.placement = static_cast<Placement>(rng() % 5);
    if (mc.overflow && &t == &config.tables[0])
      t.placement = overflow_rng() % 2 ? Placement::kCached : Placement::kHybrid;
    if (mc.bypass && (&t == &config.tables[0] || bypass_rng() % 2))
      t.placement = bypass_rng() % 2 ? Placement::kCached : Placement::kHybrid;
    if (t.placement != Placement::kCached && t.placement != Placement::kHybrid) continue;
    std::int64_t max_unique = 1;
    const std::vector<std::string> names = feature_names(t);
    for (const auto& kb : batches) {
      std::vector<Key> keys;  // of all the table's features
      for (const auto& f : kb.features)
        if (std::find(names.begin(), names.end(), f.table) != names.end())
          keys.insert(keys.end(), f.keys.begin(), f.keys.end());
      max_unique = std::max(max_unique, dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size())).size());
    }
    t.cache.rows = std::min(t.spec.rows, max_unique * (mc.overflow ? 1 : depth) + static_cast<std::int64_t>(rng() % 3));
    t.cache.cap = rng() % 4 == 0;
    if (mc.bypass) t.cache.rows = 1 + static_cast<std::int64_t>(bypass_rng() % 10);
  }
  // Half the stores plan each slot pool in 2..4 partitions (cache/partitioned_planner.hpp), drawn from a
  // generator of their own so the other draws stay as they were. A shard holds 1/S of the slots
  // (and of a capped table's cap) and any of the rows may hash to it, so a sharded store's caches
  // are S times as large, which gives every shard room for all the batches in flight (rows are
  // still evicted over the run; tests/cache/partitioned_planner_test.cpp evicts within partitions hard).
  // Tables too small for that are planned whole.
  std::mt19937_64 partition_rng(static_cast<std::uint64_t>(mc.seed) * 31 + 7);
  config.cache.planner_partitions = partition_rng() % 2 ? 2 + static_cast<int>(partition_rng() % 3) : 1;
  for (auto& t : config.tables)
    if ((t.placement == Placement::kCached || t.placement == Placement::kHybrid) &&
        config.cache.planner_partitions * t.cache.rows > t.spec.rows)
      config.cache.planner_partitions = 1;
  for (auto& t : config.tables)
    if (t.placement == Placement::kCached || t.placement == Placement::kHybrid)
      t.cache.rows *= config.cache.planner_partitions;
  // Half cases: each table's rows fp32, bf16 or fp16, a bf16 state where the optimizer allows it
  // (half the time), rounding to nearest or stochastic (own generator, as above).
  std::mt19937_64 half_rng(static_cast<std::uint64_t>(mc.seed) * 97 + 1);
  if (mc.half)
    for (auto& t : config.tables) random_dtypes(half_rng, t.spec);
  // Fills and write-backs staged, zero-copy, or measured (own generator, as above).
  std::mt19937_64 transfer_rng(static_cast<std::uint64_t>(mc.seed) * 17 + 5);
  config.cache.transfer = static_cast<CacheTransfer>(transfer_rng() % 3);
  SCOPED_TRACE("transfer " + std::string(to_string(config.cache.transfer)));
  // Host or device views, synchronous or stream-ordered calls, per step; half the seeds let
  // non-finite gradients through, which makes a stream-ordered backward fully asynchronous (own
  // generator, as above).
  std::mt19937_64 view_rng(static_cast<std::uint64_t>(mc.seed) * 53 + 11);
  config.accept_nonfinite_gradients = view_rng() % 2 == 0;
  SCOPED_TRACE("policy " + std::string(cache::to_string(config.cache.policy)) + " lookahead " +
               std::to_string(config.cache.lookahead) + " depth " + std::to_string(depth) + " planner partitions " +
               std::to_string(config.cache.planner_partitions));

  auto dev = Store::open(config);
  auto ref = open_reference_store(config);
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  ASSERT_TRUE(ref.is_ok());
  const int mid = 1 + static_cast<int>(rng() % (steps - 1));
  const std::string ckpt_dev = temp_dir("dev" + std::to_string(mc.seed)),
                    ckpt_ref = temp_dir("ref" + std::to_string(mc.seed));

  // Feature cases give a batch's features in any order (the table's feature order decides how a row's uses are summed).
  if (mc.features)
    for (KeyBatch& kb : batches) std::shuffle(kb.features.begin(), kb.features.end(), feature_rng);
  // int32 cases: the store's batches with some keys and offsets as int32 (own generator, as above).
  std::mt19937_64 int32_rng(static_cast<std::uint64_t>(mc.seed) * 59 + 23);
  std::vector<KeyBatch> dev_batches = batches;
  if (mc.int32)
    for (KeyBatch& kb : dev_batches) kb = with_int32(int32_rng, kb);
  for (int i = 0; i < std::min(depth, steps); ++i) {
    ASSERT_TRUE((*dev)->submit(i, dev_batches[static_cast<std::size_t>(i)]).is_ok());
    ASSERT_TRUE((*ref)->submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
  }
  gpu::Stream trainer;  // the trainer's stream, for stream-ordered calls
  if ((*dev)->device()) {
    auto s = (*dev)->device()->create_stream();
    ASSERT_TRUE(s.is_ok());
    trainer = std::move(s).value();
  }
  for (int i = 0; i < steps; ++i) {
    const auto& kb = batches[static_cast<std::size_t>(i)];
    Buffers out_dev = make_buffers(config, kb), out_ref = make_buffers(config, kb);
    ASSERT_TRUE((*ref)->forward(i, out_ref.views).is_ok());
    Buffers grads = make_buffers(config, kb);
    fill_random(rng, grads);
    StepMode mode;
    mode.device = trainer && view_rng() % 2;
    if (trainer && view_rng() % 2) mode.stream = trainer.view();
    SCOPED_TRACE(std::string("step ") + std::to_string(i) + (mode.device ? " device" : " host") + " views, " +
                 (mode.ordered() ? "stream-ordered" : "synchronous"));
    Status st = run_step(**dev, i, grads, out_dev, mode);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_TRUE(same_outputs(out_dev, out_ref)) << "step " << i;
    ASSERT_TRUE((*ref)->backward(i, grads.cviews).is_ok());
    if (i == mid) {
      // Mid-training, with batches still in flight: reads see every applied update, and saves
      // write back dirty cached rows first.
      ASSERT_TRUE((*dev)->flush().is_ok());
      ASSERT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
      ASSERT_TRUE((*dev)->save(ckpt_dev).is_ok());
      ASSERT_TRUE((*ref)->save(ckpt_ref).is_ok());
    }
    if (i + depth < steps) {
      Status ss = (*dev)->submit(i + depth, dev_batches[static_cast<std::size_t>(i + depth)]);
      ASSERT_TRUE(ss.is_ok()) << ss.to_string();
      ASSERT_TRUE((*ref)->submit(i + depth, batches[static_cast<std::size_t>(i + depth)]).is_ok());
    }
  }
  EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
  // Loading the mid-training checkpoint replaces cached rows too.
  ASSERT_TRUE((*dev)->load(ckpt_dev).is_ok());
  ASSERT_TRUE((*ref)->load(ckpt_ref).is_ok());
  EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
  // ...and training continues correctly from there.
  const KeyBatch kb = batches[0];
  Buffers out_dev = make_buffers(config, kb), out_ref = make_buffers(config, kb), grads = make_buffers(config, kb);
  fill_random(rng, grads);
  for (auto* s : {&*dev, &*ref}) {
    ASSERT_TRUE((*s)->submit(100, kb).is_ok());
    ASSERT_TRUE((*s)->forward(100, s == &*dev ? out_dev.views : out_ref.views).is_ok());
    ASSERT_TRUE((*s)->backward(100, grads.cviews).is_ok());
  }
  EXPECT_EQ(out_dev.data, out_ref.data);
  EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
  if (mc.bypass) {
    std::int64_t bypassed = 0;
    for (const auto& [name, st] : (*dev)->stats().cache) bypassed += st.bypassed;
    EXPECT_GT(bypassed, 0);
  }
  std::filesystem::remove_all(ckpt_dev);
  std::filesystem::remove_all(ckpt_ref);
}

std::vector<ModeCase> cases() {
  std::vector<ModeCase> v;
  for (int s = 0; s < 80; ++s) v.push_back({s, false});
  for (int s = 0; s < 10; ++s) v.push_back({s, true});
  for (int s = 80; s < 120; ++s) v.push_back({s, false, true});
  for (int s = 10; s < 14; ++s) v.push_back({s, true, true});
  for (int s = 120; s < 144; ++s) v.push_back({s, false, false, true});
  for (int s = 14; s < 17; ++s) v.push_back({s, true, false, true});
  for (int s = 144; s < 168; ++s) v.push_back({s, false, false, false, true});
  for (int s = 168; s < 172; ++s) v.push_back({s, false, true, false, true});
  for (int s = 172; s < 176; ++s) v.push_back({s, false, false, true, true});
  for (int s = 17; s < 20; ++s) v.push_back({s, true, false, false, true});
  for (int s = 176; s < 200; ++s) v.push_back({s, false, false, false, s % 3 == 0, true});
  for (int s = 200; s < 206; ++s) v.push_back({s, false, s % 2 == 0, s % 2 == 1, false, true});
  for (int s = 20; s < 22; ++s) v.push_back({s, true, false, false, s % 2 == 0, true});
  for (int s = 206; s < 222; ++s) v.push_back({s, false, s % 4 == 1, s % 4 == 3, s % 3 == 0, s % 2 == 0, true});
  for (int s = 22; s < 24; ++s) v.push_back({s, true, false, false, false, s % 2 == 0, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Seeds, ModeEquivalence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ModeCase>& i) {
                           return std::string(i.param.cuda ? "cuda_" : "emu_") + (i.param.half ? "half_" : "") +
                                  (i.param.features ? "features_" : "") + (i.param.int32 ? "int32_" : "") +
                                  (i.param.overflow ? "overflow_" : "") + (i.param.bypass ? "bypass_" : "") +
                                  std::to_string(i.param.seed);
                         });

}  // namespace
}  // namespace strata
