#pragma once
// Thread ranks for tests of sharded stores: a world of the `local` communicator, or of the
// `transport` communicator over thread-rank Transports (tests/dispatch/thread_transport.hpp: what a
// torch.distributed process group is to a Python trainer), one thread per rank.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "tests/dispatch/thread_transport.hpp"

namespace strata::testing {

/// Which communicator a world of thread ranks has.
enum class ThreadComm {
  kLocal,            ///< dispatch::make_local_group
  kTransport,        ///< transport communicators over ThreadTransports that take no device buffers (as gloo's)
  kTransportDirect,  ///< ... over ThreadTransports that take the device buffers (as NCCL's)
};

/// The `world` communicators of a fresh world whose collectives time out after `timeout_ms`.
inline std::vector<std::shared_ptr<dispatch::Communicator>> thread_comms(int world, int timeout_ms,
                                                                         ThreadComm kind = ThreadComm::kLocal) {
  dispatch::CommOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  std::vector<std::unique_ptr<dispatch::Communicator>> made =
      kind == ThreadComm::kLocal
          ? dispatch::make_local_group(world, o).value()
          : dispatch::testing::make_transport_group(world, kind == ThreadComm::kTransportDirect, o).comms;
  return {std::make_move_iterator(made.begin()), std::make_move_iterator(made.end())};
}

/// Runs body(rank, comm) on `world` thread ranks, whose collectives time out after `timeout_ms`,
/// and returns when every rank returned.
template <class Body>
void on_ranks(int world, int timeout_ms, Body body) {
  const std::vector<std::shared_ptr<dispatch::Communicator>> comms = thread_comms(world, timeout_ms);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, comms[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
}

}  // namespace strata::testing
