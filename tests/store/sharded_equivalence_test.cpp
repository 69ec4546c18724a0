// `gpu` and `hybrid` tables sharded over 1..4 thread ranks (the local communicator, one emulated
// device per rank) against the single-rank reference, for every sharding type: see
// sharded_harness.hpp for the workloads and the comparison. A few of them over the `transport`
// communicator too, against the local world bit for bit. Half cases: bf16 and fp16 tables beside
// fp32 ones over 1..3 ranks (issue 31).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "tests/store/sharded_harness.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata::testing {
namespace {

class ShardedEquivalence : public ::testing::TestWithParam<ShardCase> {};

/// Runs `body(comm)` on `world` thread ranks of communicator `kind`; returns the ranks' messages joined.
template <class Body>
std::string on_ranks(int world, Body body, ThreadComm kind = ThreadComm::kLocal) {
  const std::vector<std::shared_ptr<dispatch::Communicator>> comms = thread_comms(world, 20000, kind);
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
  // Half-size tables (bf16, fp16 and fp32 tables in one batch; every sharding type, gpu and hybrid)
  // over 1..3 ranks, three worlds of each (i < 9): one of them with accept_nonfinite_gradients (no
  // finiteness check waits for the caller's stream), one of tables of several features; and hot
  // half rows over 2 (i == 9).
  for (int i = 0; i < 10; ++i) {
    ShardCase c;
    c.half = true;
    c.accept = i < 9 && i % 3 == 1;
    c.features = i < 9 && i % 3 == 2;
    c.hot = i == 9;
    c.world = c.hot ? 2 : 1 + i / 3;
    c.steps = c.hot ? 3 : 5;
    c.seed = seed++;
    out.push_back(c);
  }
  // Tables of several features (issue 35): the all-to-all dedups across a table's features, over 1..4 ranks.
  for (int world = 1; world <= 4; ++world)
    for (int repeat = 0; repeat < 2; ++repeat) {
      ShardCase c;
      c.world = world;
      c.features = true;
      c.seed = seed++;
      c.steps = 4;
      out.push_back(c);
    }
  // int32 keys and offsets over 1..4 ranks (issue 35), features in half of them.
  for (int world = 1; world <= 4; ++world) {
    ShardCase c;
    c.world = world;
    c.int32 = true;
    c.features = world % 2 == 0;
    c.seed = seed++;
    c.steps = 4;
    out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedEquivalence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ShardCase>& i) { return case_name(i.param); });

// The same workloads over worlds of the `transport` communicator (thread-rank Transports that
// stage device buffers through host memory, as a gloo process group, or take them, as NCCL): a
// store opened with Store::open(config, comm) on it equals the reference as a `local` world does
// (bit for bit with one rank), and its outputs and final tables are the `local` world's bit for
// bit: the communicators differ only in how the bytes move.
struct TransportCase {
  ShardCase shard;
  ThreadComm kind = ThreadComm::kTransport;
};

class TransportWorlds : public ::testing::TestWithParam<TransportCase> {};

TEST_P(TransportWorlds, OutputsAndFinalTablesAreTheLocalWorldsBitForBit) {
  const ShardCase c = GetParam().shard;
  const auto n = static_cast<std::size_t>(c.world);
  std::vector<std::vector<float>> local(n), transport(n);
  const auto run = [&](std::vector<std::vector<float>>& traces, ThreadComm kind) {
    return on_ranks(
        c.world,
        [&](std::shared_ptr<dispatch::Communicator> comm) {
          const auto r = static_cast<std::size_t>(comm->rank());
          return run_sharded_rank(c, std::move(comm), &traces[r]);
        },
        kind);
  };
  ASSERT_EQ(run(local, ThreadComm::kLocal), "");
  ASSERT_EQ(run(transport, GetParam().kind), "");
  for (std::size_t r = 0; r < n; ++r) {
    ASSERT_FALSE(local[r].empty());
    ASSERT_EQ(transport[r].size(), local[r].size()) << "rank " << r;
    std::size_t first = 0;
    while (first < local[r].size() && std::memcmp(&local[r][first], &transport[r][first], sizeof(float)) == 0) ++first;
    EXPECT_EQ(first, local[r].size()) << "rank " << r << ": value " << first << " is " << transport[r][first]
                                      << " over the transport, " << local[r][first] << " over local";
  }
}

std::vector<TransportCase> transport_cases() {
  std::vector<TransportCase> out;
  std::uint64_t seed = 9001;
  for (int world : {1, 2, 3, 4}) {  // every type and placement, mixed per table
    TransportCase t;
    t.shard.world = world;
    t.shard.seed = seed++;
    t.shard.steps = 4;
    out.push_back(t);
  }
  TransportCase tight;  // deferred plans of hybrid caches, with a batch submitted ahead
  tight.shard.world = 3;
  tight.shard.placement = static_cast<int>(Placement::kHybrid);
  tight.shard.seed = seed++;
  tight.shard.steps = 4;
  tight.shard.tight = true;
  out.push_back(tight);
  TransportCase tiny = tight;  // rows bypassing caches of 1..10 rows
  tiny.shard.world = 2;
  tiny.shard.seed = seed++;
  tiny.shard.tight = false;
  tiny.shard.tiny = true;
  out.push_back(tiny);
  for (int world : {2, 3}) {  // device buffers given to the Transport
    TransportCase t;
    t.shard.world = world;
    t.shard.seed = seed++;
    t.shard.steps = 4;
    t.kind = ThreadComm::kTransportDirect;
    out.push_back(t);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Transport, TransportWorlds, ::testing::ValuesIn(transport_cases()),
                         [](const ::testing::TestParamInfo<TransportCase>& i) {
                           return case_name(i.param.shard) +
                                  (i.param.kind == ThreadComm::kTransportDirect ? "_direct" : "_staged");
                         });

}  // namespace
}  // namespace strata::testing
