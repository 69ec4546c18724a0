// `gpu` and `hybrid` tables sharded over 1..4 thread ranks (the local communicator, one emulated
// device per rank) against the single-rank reference, for every sharding type: see
// sharded_harness.hpp for the workloads and the comparison.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "dispatch/local_communicator.hpp"
#include "tests/store/sharded_harness.hpp"

namespace strata::testing {
namespace {

class ShardedEquivalence : public ::testing::TestWithParam<ShardCase> {};

/// Runs `body(rank, comm)` on `world` thread ranks; returns the ranks' messages joined.
template <class Body>
std::string on_ranks(int world, Body body) {
  dispatch::CommOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  auto group = dispatch::make_local_group(world, o);
  if (!group) return group.status().to_string();
  std::vector<std::shared_ptr<dispatch::Communicator>> comms;
  for (auto& c : group.value()) comms.emplace_back(std::move(c));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] { errors[static_cast<std::size_t>(r)] = body(comms[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& e : errors) all += e;
  return all;
}

TEST_P(ShardedEquivalence, OutputsAndFinalTablesEqualTheReference) {
  const ShardCase c = GetParam();
  if (c.hot) {  // some row is used thousands of times in a global batch
    const StoreConfig cfg = sharded_config(c);
    std::int64_t most = 0;
    for (int step = 0; step < c.steps; ++step)
      for (const auto& f : make_step(c, cfg, step).global.features)
        for (const Key k : std::set<Key>(f.keys.begin(), f.keys.end()))
          most = std::max<std::int64_t>(most, std::count(f.keys.begin(), f.keys.end(), k));
    ASSERT_GT(most, 1000);
  }
  EXPECT_EQ(on_ranks(c.world, [&](std::shared_ptr<dispatch::Communicator> comm) { return run_sharded_rank(c, comm); }),
            "");
}

std::vector<ShardCase> cases() {
  std::vector<ShardCase> out;
  std::uint64_t seed = 1;
  for (int world = 1; world <= 4; ++world)
    for (int type = -1; type < 4; ++type)
      for (int placement : {static_cast<int>(Placement::kGpu), static_cast<int>(Placement::kHybrid), -1})
        for (int repeat = 0; repeat < 3; ++repeat) {
          ShardCase c;
          c.world = world;
          c.type = type;
          c.placement = placement;
          c.seed = seed++;
          c.steps = 6;
          out.push_back(c);
        }
  // Caches that hold one batch, with a batch submitted ahead: deferred plans over 1..4 ranks.
  for (int world = 1; world <= 4; ++world)
    for (int repeat = 0; repeat < 4; ++repeat) {
      ShardCase c;
      c.world = world;
      c.placement = static_cast<int>(Placement::kHybrid);
      c.seed = seed++;
      c.steps = 6;
      c.tight = true;
      out.push_back(c);
    }
  // Caches of 1..10 rows against batches of hundreds of rows: rows bypass the caches, over 1..4 ranks.
  for (int world = 1; world <= 4; ++world)
    for (int repeat = 0; repeat < 2; ++repeat) {
      ShardCase c;
      c.world = world;
      c.placement = static_cast<int>(Placement::kHybrid);
      c.seed = seed++;
      c.steps = 4;
      c.tiny = true;
      out.push_back(c);
    }
  // Rows used thousands of times a batch (hot rows) over 1, 2 and 4 ranks.
  for (int world : {1, 2, 4})
    for (int repeat = 0; repeat < 2; ++repeat) {
      ShardCase c;
      c.world = world;
      c.seed = seed++;
      c.steps = 3;
      c.hot = true;
      out.push_back(c);
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedEquivalence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ShardCase>& i) { return case_name(i.param); });

}  // namespace
}  // namespace strata::testing
