// Store::set_learning_rate: a rate set between steps (or while a batch is in flight) is used from
// the next backward on, in every placement mode, bit for bit as a store opened with that rate;
// bad rates and unknown tables are refused without change.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "dispatch/local_communicator.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

struct Mode {
  const char* name;
  Placement placement;
  bool world;      // opened as a rank of a world of one (the sharded engine)
  bool reference;  // the oracle itself
};

StoreConfig config_for(const Mode& m) {
  std::mt19937_64 rng(5);
  StoreConfig c = random_config(rng, 3);
  c.device.backend = BackendChoice::kEmu;
  for (auto& t : c.tables) {
    // Adam's bias correction depends on the store's step, which a store opened from copied rows
    // does not share; the rate enters every optimizer the same way (make_optimizer_step).
    if (t.spec.optimizer.kind == OptimizerKind::kAdam) t.spec.optimizer.kind = OptimizerKind::kAdagrad;
    t.placement = m.placement;
    // Small enough to evict over the run: one batch has at most 8 bags x 5 keys.
    if (m.placement == Placement::kCached || m.placement == Placement::kHybrid)
      t.cache.rows = std::min<std::int64_t>(t.spec.rows, 48);
  }
  return c;
}

Result<std::unique_ptr<Store>> open_mode(const Mode& m, const StoreConfig& c) {
  if (m.reference) return open_reference_store(c);
  if (!m.world) return Store::open(c);
  auto group = dispatch::make_local_group(1);
  if (!group) return group.status();
  return Store::open(c, std::shared_ptr<dispatch::Communicator>(std::move(group.value()[0])));
}

// One step of batch `id`; the rate change (when given) happens between forward and backward.
void step(Store& s, const StoreConfig& c, const KeyBatch& kb, std::int64_t id, std::mt19937_64& grad_rng,
          const std::function<void()>& between = {}) {
  Buffers out = make_buffers(c, kb);
  ASSERT_TRUE(s.submit(id, kb).is_ok());
  ASSERT_TRUE(s.forward(id, out.views).is_ok());
  if (between) between();
  fill_random(grad_rng, out);
  ASSERT_TRUE(s.backward(id, out.cviews).is_ok());
}

class LearningRate : public ::testing::TestWithParam<Mode> {};

TEST_P(LearningRate, SetBetweenStepsEqualsAStoreOpenedWithTheNewRate) {
  const Mode m = GetParam();
  const StoreConfig c = config_for(m);
  std::mt19937_64 rng(7);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 8; ++i) batches.push_back(random_batch(rng, c, 8));

  auto a = open_mode(m, c);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  Store& s = **a;
  std::mt19937_64 grads_a(9);
  for (int i = 0; i < 4; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads_a);
  // Batch 4 is in flight (forwarded) when the rates change: its backward uses the new ones.
  step(s, c, batches[4], 4, grads_a, [&] {
    ASSERT_TRUE(s.set_learning_rate(0.3f).is_ok());
    ASSERT_TRUE(s.set_learning_rate(c.tables[0].spec.name, 0.2f).is_ok());
  });
  for (int i = 5; i < 8; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads_a);
  EXPECT_EQ(s.learning_rate(c.tables[0].spec.name).value(), 0.2f);
  EXPECT_EQ(s.learning_rate(c.tables[1].spec.name).value(), 0.3f);
  EXPECT_EQ(s.config().tables[2].spec.optimizer.learning_rate, 0.3f);

  // The oracle: the reference at the old rate for 4 steps, its rows copied into a reference
  // opened with the new rates, which takes the rest.
  auto before = open_reference_store(c);
  std::mt19937_64 grads_r(9);
  for (int i = 0; i < 4; ++i) step(**before, c, batches[static_cast<std::size_t>(i)], i, grads_r);
  StoreConfig after_config = c;
  for (auto& t : after_config.tables) t.spec.optimizer.learning_rate = 0.3f;
  after_config.tables[0].spec.optimizer.learning_rate = 0.2f;
  auto after = open_reference_store(after_config);
  const Snapshot mid = snapshot(**before);
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    ASSERT_TRUE((*after)
                    ->write_rows(static_cast<int>(t), 0, c.tables[t].spec.rows, mid.weights[t].data(),
                                 mid.state[t].empty() ? nullptr : mid.state[t].data())
                    .is_ok());
  for (int i = 4; i < 8; ++i) step(**after, after_config, batches[static_cast<std::size_t>(i)], i, grads_r);
  EXPECT_TRUE(same_state(snapshot(**after), snapshot(s)));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, LearningRate,
    ::testing::Values(Mode{"reference", Placement::kCpu, false, true}, Mode{"cpu", Placement::kCpu, false, false},
                      Mode{"offload", Placement::kOffload, false, false},
                      Mode{"cached", Placement::kCached, false, false}, Mode{"gpu", Placement::kGpu, false, false},
                      Mode{"hybrid", Placement::kHybrid, false, false}, Mode{"gpu_world", Placement::kGpu, true, false},
                      Mode{"hybrid_world", Placement::kHybrid, true, false}),
    [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

TEST(LearningRateBadInput, RefusedNamingTableAndValueWithoutChange) {
  std::mt19937_64 rng(3);
  const StoreConfig c = random_config(rng, 2);
  auto opened = Store::open(c);
  ASSERT_TRUE(opened.is_ok());
  Store& s = **opened;
  const std::string name = c.tables[1].spec.name;
  for (float bad : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    const Status one = s.set_learning_rate(name, bad);
    EXPECT_EQ(one.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(one.message().find("set_learning_rate: table '" + name + "': learning_rate "), std::string::npos)
        << one.message();
    EXPECT_NE(one.message().find("(expected a finite number > 0)"), std::string::npos) << one.message();
    const Status all = s.set_learning_rate(bad);
    EXPECT_EQ(all.code(), StatusCode::kInvalidArgument) << bad;
    for (const auto& t : c.tables) EXPECT_EQ(s.learning_rate(t.spec.name).value(), 0.05f);
  }
  EXPECT_NE(s.set_learning_rate(name, -0.5f).message().find("learning_rate -0.5 "), std::string::npos);
  const Status unknown = s.set_learning_rate("nope", 0.1f);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("set_learning_rate: unknown table 'nope'"), std::string::npos) << unknown.message();
  EXPECT_EQ(s.learning_rate("nope").status().code(), StatusCode::kNotFound);
  for (const auto& t : c.tables) EXPECT_EQ(s.learning_rate(t.spec.name).value(), 0.05f);
  // A tiny rate is a rate.
  EXPECT_TRUE(s.set_learning_rate(name, 1e-30f).is_ok());
  EXPECT_EQ(s.learning_rate(name).value(), 1e-30f);
}

}  // namespace
}  // namespace strata
