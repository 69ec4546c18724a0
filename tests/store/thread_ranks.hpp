#pragma once
// Thread ranks for tests of sharded stores: a world of the local communicator, one thread per rank.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"

namespace strata::testing {

/// Runs body(rank, comm) on `world` thread ranks, whose collectives time out after `timeout_ms`,
/// and returns when every rank returned.
template <class Body>
void on_ranks(int world, int timeout_ms, Body body) {
  dispatch::CommOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto group = dispatch::make_local_group(world, o);
  ASSERT_TRUE(group.is_ok());
  std::vector<std::shared_ptr<dispatch::Communicator>> comms;
  for (auto& c : group.value()) comms.emplace_back(std::move(c));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, comms[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
}

}  // namespace strata::testing
