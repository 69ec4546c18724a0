// Invariant 1 (same function): the `cpu` mode against the reference on randomized workloads, over
// many seeds: several tables, dims 1..256, empty bags, duplicate keys, weights, every optimizer and
// pooling, several batches in flight, interleaved NUMA layouts.
#include <gtest/gtest.h>

#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

class CpuEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(CpuEquivalence, OutputsAndFinalStateEqualTheReference) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(GetParam()));
  const StoreConfig config = random_config(rng, 1 + static_cast<int>(rng() % 4));
  auto cpu = Store::open(config);
  auto ref = open_reference_store(config);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  ASSERT_TRUE(ref.is_ok());
  ASSERT_TRUE(same_state(snapshot(**cpu), snapshot(**ref)));

  const int steps = 6;
  const int depth = 1 + static_cast<int>(rng() % 3);  // batches submitted ahead of forward
  std::vector<KeyBatch> batches;
  for (int i = 0; i < steps; ++i)
    batches.push_back(random_batch(rng, config, 1 + static_cast<std::int64_t>(rng() % 40)));
  for (int i = 0; i < std::min(depth, steps); ++i) {
    ASSERT_TRUE((*cpu)->submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
    ASSERT_TRUE((*ref)->submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
  }
  for (int i = 0; i < steps; ++i) {
    const auto& kb = batches[static_cast<std::size_t>(i)];
    Buffers out_cpu = make_buffers(config, kb), out_ref = make_buffers(config, kb);
    ASSERT_TRUE((*cpu)->forward(i, out_cpu.views).is_ok());
    ASSERT_TRUE((*ref)->forward(i, out_ref.views).is_ok());
    for (std::size_t f = 0; f < out_cpu.data.size(); ++f)
      for (std::size_t k = 0; k < out_cpu.data[f].size(); ++k)
        ASSERT_EQ(out_cpu.data[f][k], out_ref.data[f][k]) << "step " << i << " feature " << f << " element " << k;
    Buffers grads = make_buffers(config, kb);
    fill_random(rng, grads);
    ASSERT_TRUE((*cpu)->backward(i, grads.cviews).is_ok());
    ASSERT_TRUE((*ref)->backward(i, grads.cviews).is_ok());
    if (i + depth < steps) {
      ASSERT_TRUE((*cpu)->submit(i + depth, batches[static_cast<std::size_t>(i + depth)]).is_ok());
      ASSERT_TRUE((*ref)->submit(i + depth, batches[static_cast<std::size_t>(i + depth)]).is_ok());
    }
  }
  ASSERT_TRUE((*cpu)->flush().is_ok());
  EXPECT_EQ((*cpu)->step(), steps);
  EXPECT_TRUE(same_state(snapshot(**cpu), snapshot(**ref)));
}

INSTANTIATE_TEST_SUITE_P(Seeds, CpuEquivalence, ::testing::Range(0, 60));

TEST(CpuEquivalence, DiscardLeavesRowsUntouched) {
  std::mt19937_64 rng(99);
  const StoreConfig config = random_config(rng, 2);
  auto cpu = Store::open(config);
  ASSERT_TRUE(cpu.is_ok());
  const Snapshot before = snapshot(**cpu);
  const KeyBatch kb = random_batch(rng, config, 16);
  Buffers out = make_buffers(config, kb);
  ASSERT_TRUE((*cpu)->submit(1, kb).is_ok());
  ASSERT_TRUE((*cpu)->forward(1, out.views).is_ok());
  EXPECT_EQ((*cpu)->in_flight(), 1);
  ASSERT_TRUE((*cpu)->discard(1).is_ok());
  EXPECT_EQ((*cpu)->in_flight(), 0);
  EXPECT_TRUE(same_state(before, snapshot(**cpu)));
}

}  // namespace
}  // namespace strata
