// What backward refuses, and what a backward that fails leaves behind: NaN and Inf gradients are
// refused in every mode (naming the table and the bag) unless the config accepts them, and a device
// that fails during a backward of a store mixing placements changes none of the tables that live in
// host memory, nor the step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "store/detail/batch_checks.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

StoreConfig one_table(Placement placement, Pooling pooling) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  TableConfig t;
  t.spec.name = "user";
  t.spec.rows = 100;
  t.spec.dim = 4;
  t.spec.pooling = pooling;
  t.spec.init.bound = 0.5f;
  t.spec.optimizer.kind = OptimizerKind::kAdagrad;
  t.placement = placement;
  if (placement == Placement::kCached || placement == Placement::kHybrid) t.cache.rows = 50;
  c.tables.push_back(t);
  return c;
}

KeyBatch three_bags() {
  KeyBatch kb;
  kb.features.push_back({"user", {0, 2, 2, 5}, {1, 2, 7, 8, 9}, {}});
  return kb;
}

class NonFiniteGradients : public ::testing::TestWithParam<Placement> {};

TEST_P(NonFiniteGradients, AreRefusedNamingTheTableAndTheBagAndChangeNothing) {
  for (const Pooling pooling : {Pooling::kSum, Pooling::kNone}) {
    const StoreConfig c = one_table(GetParam(), pooling);
    auto dev = Store::open(c);
    auto ref = open_reference_store(c);
    ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
    for (auto* s : {&*dev, &*ref}) {
      const Snapshot before = snapshot(**s);
      const KeyBatch kb = three_bags();
      Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
      ASSERT_TRUE((*s)->submit(1, kb).is_ok());
      ASSERT_TRUE((*s)->forward(1, out.views).is_ok());
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()}) {
        std::fill(grads.data[0].begin(), grads.data[0].end(), 0.25f);
        // Row 2 of the gradient: bag 2 when pooled; key position 2 (the first key of bag 2) when not.
        grads.data[0][2 * 4 + 3] = bad;
        Status st = (*s)->backward(1, grads.cviews);
        ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
        const std::string where = pooling == Pooling::kNone ? "key position 2 (bag 2)" : "bag 2";
        EXPECT_NE(st.message().find("table 'user': gradient of " + where + ", column 3 is"), std::string::npos)
            << st.message();
        EXPECT_NE(st.message().find("accept_nonfinite_gradients"), std::string::npos) << st.message();
        EXPECT_EQ((*s)->step(), 0);
        EXPECT_EQ((*s)->in_flight(), 1);
      }
      EXPECT_TRUE(same_state(before, snapshot(**s)));
      // The batch is still in flight: finite gradients apply.
      grads.data[0][2 * 4 + 3] = 0.5f;
      ASSERT_TRUE((*s)->backward(1, grads.cviews).is_ok());
      EXPECT_EQ((*s)->step(), 1);
    }
    EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
  }
}

TEST_P(NonFiniteGradients, AreAppliedWhenTheConfigAcceptsThem) {
  StoreConfig c = one_table(GetParam(), Pooling::kSum);
  c.accept_nonfinite_gradients = true;
  auto s = Store::open(c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const KeyBatch kb = three_bags();
  Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
  ASSERT_TRUE((*s)->submit(1, kb).is_ok());
  ASSERT_TRUE((*s)->forward(1, out.views).is_ok());
  grads.data[0][2 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE((*s)->backward(1, grads.cviews).is_ok());
  std::vector<float> row(4);
  ASSERT_TRUE((*s)->read_rows(0, 8, 1, row.data(), nullptr).is_ok());  // key 8 is in bag 2
  EXPECT_TRUE(std::isnan(row[3]));
}

// Gradients larger than one chunk of the parallel check (16384 floats): 6000 bags of dim 4 over two
// features is 24,000 floats each. A NaN or Inf in any chunk, the last float included, is found and
// named as in the small case, and nothing changes.
TEST(NonFiniteGradients, AreFoundInEveryChunkOfLargeGradients) {
  StoreConfig c = one_table(Placement::kCpu, Pooling::kSum);
  c.tables.push_back(c.tables[0]);
  c.tables[1].spec.name = "item";
  KeyBatch kb;
  for (const char* table : {"user", "item"}) {
    JaggedKeys f;
    f.table = table;
    f.offsets = {0};
    for (int b = 0; b < 6000; ++b) {
      f.keys.push_back(b % 100);
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    kb.features.push_back(f);
  }
  auto s = Store::open(c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Snapshot before = snapshot(**s);
  Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
  ASSERT_TRUE((*s)->submit(1, kb).is_ok());
  ASSERT_TRUE((*s)->forward(1, out.views).is_ok());
  struct Bad {
    std::size_t feature;
    std::int64_t at;  // float index in the feature's gradient
  };
  for (const Bad bad : {Bad{0, 0}, Bad{0, 16384 + 5}, Bad{1, 6000 * 4 - 1}, Bad{1, 12345}}) {
    for (auto& g : grads.data) std::fill(g.begin(), g.end(), 0.25f);
    grads.data[bad.feature][static_cast<std::size_t>(bad.at)] = std::numeric_limits<float>::infinity();
    Status st = (*s)->backward(1, grads.cviews);
    ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    const std::string want = std::string("table '") + (bad.feature == 0 ? "user" : "item") + "': gradient of bag " +
                             std::to_string(bad.at / 4) + ", column " + std::to_string(bad.at % 4) + " is inf";
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
    EXPECT_EQ((*s)->step(), 0);
  }
  EXPECT_TRUE(same_state(before, snapshot(**s)));
  for (auto& g : grads.data) std::fill(g.begin(), g.end(), 0.25f);
  ASSERT_TRUE((*s)->backward(1, grads.cviews).is_ok());
  EXPECT_EQ((*s)->step(), 1);
}

// check_finite_gradients itself, on gradients whose length is not a multiple of any vector width
// (3 bags of dim 37): a NaN, +Inf or -Inf at every float, in a register's lanes or in the tail, is
// found and named by bag and column; the finite values at the edges (the largest, the smallest
// subnormal, -0) pass.
TEST(NonFiniteGradients, CheckFindsEveryPositionAndPassesFiniteEdges) {
  StoreConfig c = one_table(Placement::kCpu, Pooling::kSum);
  c.tables[0].spec.dim = 37;
  const KeyBatch kb = three_bags();
  const std::vector<int> tables = {0};
  std::vector<float> g(3 * 37, 0.25f);
  const std::vector<ConstMatrixView> views = {{g.data(), 3, 37, MemorySpace::kHost}};
  for (const float fine : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(), -0.0f}) {
    std::fill(g.begin(), g.end(), fine);
    EXPECT_TRUE(detail::check_finite_gradients(1, kb, tables, c, views).is_ok()) << fine;
  }
  std::fill(g.begin(), g.end(), 0.25f);
  for (std::size_t at = 0; at < g.size(); ++at) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      g[at] = bad;
      const Status st = detail::check_finite_gradients(1, kb, tables, c, views);
      ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << "float " << at << ": " << st.to_string();
      const std::string want = "gradient of bag " + std::to_string(at / 37) + ", column " + std::to_string(at % 37);
      EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
    }
    g[at] = 0.25f;
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, NonFiniteGradients,
                         ::testing::Values(Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu,
                                           Placement::kHybrid),
                         [](const ::testing::TestParamInfo<Placement>& i) { return std::string(to_string(i.param)); });

// A store with cpu, offload, cached and gpu tables on an emulated device that fails at op N, for
// every N over a few steps: a backward that fails leaves the cpu and offload tables as they were
// before it (equal to a reference that never applied that batch) and the step where it was. With
// device views (`device`), synchronous or on a trainer's stream (`ordered`), the offload table's
// gradients come D2H in Engine::prepare_backward, before any engine applies anything. The cached
// table reads as the reference has it or refuses with DataLoss, never a mix. With `tiny_cache` the
// cached table's cache holds 2 rows and the test flushes after every step, so every batch bypasses
// the cache and the call that fails in the gpu engine (after the cached one) has sent its overflow
// rows home already (issue 29 review: that call used to read back OK, with the rows of a step the
// store says it never took).
void expect_failed_backwards_change_no_host_table(bool device, bool ordered, bool tiny_cache = false) {
  std::mt19937_64 rng(11);
  StoreConfig base = random_config(rng, 4);
  const Placement placements[] = {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu};
  for (std::size_t t = 0; t < base.tables.size(); ++t) {
    base.tables[t].placement = placements[t];
    if (placements[t] == Placement::kCached) base.tables[t].cache.rows = tiny_cache ? 2 : base.tables[t].spec.rows;
  }
  base.device.backend = BackendChoice::kEmu;
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 4; ++i) {
    KeyBatch kb;
    for (const auto& t : base.tables) {  // every table in every batch
      JaggedKeys f;
      f.table = t.spec.name;
      f.offsets = {0};
      for (int b = 0; b < 6; ++b) {
        for (int k = 0; k < 3; ++k) f.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(t.spec.rows)));
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      kb.features.push_back(std::move(f));
    }
    batches.push_back(std::move(kb));
  }
  int failed_backwards = 0;
  for (std::int64_t fail_at = 0; fail_at < (tiny_cache ? 200 : device ? 160 : 120); ++fail_at) {
    StoreConfig c = base;
    c.device.emu_fail_after_ops = fail_at;
    auto s = Store::open(c);
    if (!s.is_ok()) continue;  // the fault hit open (allocating or uploading the gpu table)
    auto ref = open_reference_store(c);
    gpu::Device* dev = (*s)->device();
    gpu::Stream trainer;
    if (device) {
      auto made = dev->create_stream();
      ASSERT_TRUE(made.is_ok());
      trainer = std::move(made).value();
    }
    for (int i = 0; i < 4; ++i) {
      const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
      Buffers out = make_buffers(c, kb), out_ref = make_buffers(c, kb), grads = make_buffers(c, kb);
      fill_random(rng, grads);
      DeviceViews o, g;
      if (device) {
        o = make_device_views(*dev, out);
        g = make_device_views(*dev, grads);
      }
      // Device views stay in use until the trainer's stream has run the store's work on them.
      auto step_done = [&] {
        if (device) (void)dev->synchronize(trainer.view());
      };
      Status fwd = (*s)->submit(i, kb);
      if (fwd.is_ok())
        fwd = !device   ? (*s)->forward(i, out.views)
              : ordered ? (*s)->forward(i, o.views, trainer.view())
                        : (*s)->forward(i, o.views);
      if (!fwd.is_ok()) {
        step_done();
        break;
      }
      ASSERT_TRUE((*ref)->submit(i, kb).is_ok());
      ASSERT_TRUE((*ref)->forward(i, out_ref.views).is_ok());
      const std::int64_t step = (*s)->step();
      Status bwd;
      if (!device) {
        bwd = (*s)->backward(i, grads.cviews);
      } else {
        upload(*dev, trainer.view(), grads, g);
        if (!ordered) (void)dev->synchronize(trainer.view());
        bwd = ordered ? (*s)->backward(i, g.cviews, trainer.view()) : (*s)->backward(i, g.cviews);
      }
      step_done();
      if (!bwd.is_ok()) {
        ++failed_backwards;
        EXPECT_EQ((*s)->step(), step) << "fail_at " << fail_at;
        for (int t : {0, 1}) {  // the cpu and the offload table
          const TableSpec& spec = c.tables[static_cast<std::size_t>(t)].spec;
          const auto sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
          std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim)), w_ref(w.size());
          std::vector<float> st(static_cast<std::size_t>(spec.rows * sd) + 1), st_ref(st.size());
          ASSERT_TRUE((*s)->read_rows(t, 0, spec.rows, w.data(), sd ? st.data() : nullptr).is_ok())
              << "fail_at " << fail_at;
          ASSERT_TRUE((*ref)->read_rows(t, 0, spec.rows, w_ref.data(), sd ? st_ref.data() : nullptr).is_ok());
          EXPECT_EQ(w, w_ref) << "table " << spec.name << " ("
                              << to_string(c.tables[static_cast<std::size_t>(t)].placement)
                              << ") changed by a failed backward, fail_at " << fail_at;
          EXPECT_EQ(st, st_ref) << "fail_at " << fail_at;
        }
        {  // the cached table: as the reference, or DataLoss
          const int t = 2;
          const TableSpec& spec = c.tables[static_cast<std::size_t>(t)].spec;
          const auto sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
          std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim)), w_ref(w.size());
          std::vector<float> st(static_cast<std::size_t>(spec.rows * sd) + 1), st_ref(st.size());
          const Status read = (*s)->read_rows(t, 0, spec.rows, w.data(), sd ? st.data() : nullptr);
          ASSERT_TRUE((*ref)->read_rows(t, 0, spec.rows, w_ref.data(), sd ? st_ref.data() : nullptr).is_ok());
          if (read.is_ok()) {
            EXPECT_EQ(w, w_ref) << "the cached table read OK but differs from the reference, fail_at " << fail_at;
            EXPECT_EQ(st, st_ref) << "fail_at " << fail_at;
          } else {
            EXPECT_EQ(read.code(), StatusCode::kDataLoss) << read.message();
          }
        }
        break;
      }
      ASSERT_TRUE((*ref)->backward(i, grads.cviews).is_ok());
      // tiny_cache: host memory holds every applied step before the next one (a flush of its own,
      // not cache.flush_every, whose failure would fail the backward call after it applied).
      if (tiny_cache && !(*s)->flush().is_ok()) break;
    }
  }
  EXPECT_GT(failed_backwards, 0) << "no fault landed in a backward: the sweep tests nothing";
}

TEST(MixedPlacementFaults, AFailedBackwardChangesNoHostTableNorTheStep) {
  expect_failed_backwards_change_no_host_table(false, false);
}

TEST(MixedPlacementFaults, AFailedBackwardWithBypassedRowsReadsAsTheReferenceOrDataLoss) {
  expect_failed_backwards_change_no_host_table(false, false, /*tiny_cache=*/true);
}

TEST(MixedPlacementFaults, AFailedBackwardOfDeviceGradientsChangesNoHostTableNorTheStep) {
  for (bool ordered : {false, true}) {
    SCOPED_TRACE(ordered ? "stream-ordered" : "synchronous");
    expect_failed_backwards_change_no_host_table(true, ordered);
  }
}

// A fault in a backward with device gradients of a store of offload and cached tables (no NaN/Inf
// count, so the call's device work is the offload table's gradient copy, then the cached table's
// update) fails the call before any engine applied, wherever it lands: even the cached table reads
// as the last flush wrote it (cache.flush_every = 1), as the reference has it. (Had the offload
// engine copied its gradients in its own backward, after the cached engine's, a fault on that copy
// would leave the cached table with an applied backward since its flush: DataLoss.)
TEST(MixedPlacementFaults, AFaultOnOffloadsGradientCopyRefusesTheCallBeforeAnyEngineApplies) {
  std::mt19937_64 rng(12);
  StoreConfig base = random_config(rng, 3);
  const Placement placements[] = {Placement::kOffload, Placement::kOffload, Placement::kCached};
  for (std::size_t t = 0; t < base.tables.size(); ++t) {
    base.tables[t].placement = placements[t];
    if (placements[t] == Placement::kCached) base.tables[t].cache.rows = base.tables[t].spec.rows;
  }
  base.device.backend = BackendChoice::kEmu;
  base.cache.flush_every = 1;
  base.accept_nonfinite_gradients = true;
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 3; ++i) {
    KeyBatch kb;
    for (const auto& t : base.tables) {
      JaggedKeys f;
      f.table = t.spec.name;
      f.offsets = {0};
      for (int b = 0; b < 6; ++b) {
        for (int k = 0; k < 3; ++k) f.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(t.spec.rows)));
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      kb.features.push_back(std::move(f));
    }
    batches.push_back(std::move(kb));
  }
  int failed_backwards = 0;
  for (std::int64_t fail_at = 0; fail_at < 120; ++fail_at) {
    StoreConfig c = base;
    c.device.emu_fail_after_ops = fail_at;
    auto s = Store::open(c);
    if (!s.is_ok()) continue;
    auto ref = open_reference_store(c);
    gpu::Device& dev = *(*s)->device();
    auto trainer = dev.create_stream();
    ASSERT_TRUE(trainer.is_ok());
    for (int i = 0; i < 3; ++i) {
      const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
      Buffers out = make_buffers(c, kb), out_ref = make_buffers(c, kb), grads = make_buffers(c, kb);
      fill_random(rng, grads);
      DeviceViews o = make_device_views(dev, out), g = make_device_views(dev, grads);
      upload(dev, trainer->view(), grads, g);
      const bool ready = dev.synchronize(trainer->view()).is_ok();
      // Synchronous calls: the store's device work of this batch before backward is done.
      if (!ready || !(*s)->submit(i, kb).is_ok() || !(*s)->forward(i, o.views).is_ok()) break;
      ASSERT_TRUE((*ref)->submit(i, kb).is_ok());
      ASSERT_TRUE((*ref)->forward(i, out_ref.views).is_ok());
      if (!dev.status().is_ok()) break;  // the fault is not in this backward's work
      const std::int64_t step = (*s)->step();
      if (!(*s)->backward(i, g.cviews).is_ok()) {
        if ((*s)->step() > step) break;  // applied, then its periodic flush failed
        ++failed_backwards;
        for (int t = 0; t < 3; ++t) {
          const TableSpec& spec = c.tables[static_cast<std::size_t>(t)].spec;
          std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim)), w_ref(w.size());
          const Status read = (*s)->read_rows(t, 0, spec.rows, w.data(), nullptr);
          ASSERT_TRUE(read.is_ok()) << "table " << spec.name << ": " << read.to_string() << ", fail_at " << fail_at;
          ASSERT_TRUE((*ref)->read_rows(t, 0, spec.rows, w_ref.data(), nullptr).is_ok());
          EXPECT_EQ(w, w_ref) << "table " << spec.name << " changed by a failed backward, fail_at " << fail_at;
        }
        break;
      }
      ASSERT_TRUE((*ref)->backward(i, grads.cviews).is_ok());
    }
  }
  EXPECT_GT(failed_backwards, 0) << "no fault landed in a backward: the sweep tests nothing";
}

}  // namespace
}  // namespace strata
