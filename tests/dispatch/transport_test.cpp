// The `transport` communicator (dispatch/transport_communicator.hpp): the conformance suite over a
// TransportCommunicator whose Transport is ThreadTransport (thread_transport.hpp): the ranks are
// threads, and it moves its bytes over a `local` group. Two kinds of worlds: one whose Transport takes
// no device buffers (staged through pinned memory, as a gloo process group) and one that takes
// them (as NCCL: the caller's device pointers go to the Transport). Then what only this
// communicator has: headers from something else, ranks out of step, no Transport call when
// nothing moves, a Transport error breaking the communicator.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/transport_communicator.hpp"
#include "tests/dispatch/conformance.hpp"
#include "tests/dispatch/thread_transport.hpp"
#include "tests/dispatch/thread_world.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

class TransportWorld final : public World {
 public:
  TransportWorld(int n, bool direct) : n_(n), direct_(direct) {}
  std::string name() const override { return std::string(direct_ ? "direct" : "staged") + std::to_string(n_); }
  std::string kind() const override { return "threads"; }
  int size() const override { return n_; }

  void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) override {
    run_thread_world(make_transport_group(n_, direct_, options).comms, "transport", body);
  }

 private:
  const int n_;
  const bool direct_;
};

INSTANTIATE_TEST_SUITE_P(Transport, Conformance,
                         ::testing::Values(make_world<TransportWorld>(1, false), make_world<TransportWorld>(2, false),
                                           make_world<TransportWorld>(3, false), make_world<TransportWorld>(4, false),
                                           make_world<TransportWorld>(2, true), make_world<TransportWorld>(3, true)),
                         world_name);

// Runs body(rank) on n threads at once.
void on_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

TEST(TransportCommunicator, RefusesANullTransportAndABadWorld) {
  auto none = make_transport_communicator(nullptr);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("transport is null"));
  struct Bad final : Transport {
    int rank() const noexcept override { return 2; }
    int size() const noexcept override { return 2; }
    int local_rank() const noexcept override { return 0; }
    const char* kind() const noexcept override { return "bad"; }
    Result<HostStage> host_stage(std::int64_t, std::int64_t) override { return HostStage{}; }
    Status all_gather(std::int64_t, const DeviceBuffers*) override { return Status::ok(); }
    Status all_to_all(const std::int64_t*, const std::int64_t*, const DeviceBuffers*) override { return Status::ok(); }
    Status broadcast(std::int64_t, int, const DeviceBuffers*) override { return Status::ok(); }
  };
  auto bad = make_transport_communicator(std::make_unique<Bad>());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("rank 2 of size 2 is not a world (expected 0 <= rank < size)"));
}

// Something else on the transport's world (a trainer's own collective on the process group) met
// one of Strata's: the rank whose bytes carry no strata header is named on every rank, and the
// communicator is broken.
TEST(TransportCommunicator, AHeaderWithoutTheMagicIsNamedOnEveryRank) {
  TransportGroup g = make_transport_group(3, false);
  g.transports[1]->tamper = [](char* send, std::int64_t) { send[0] = 'X'; };
  std::vector<Status> got(3);
  on_ranks(3, [&](int r) { got[r] = g.comms[r]->barrier(); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kFailedPrecondition) << got[r].to_string();
    EXPECT_THAT(got[r].message(), HasSubstr("barrier: rank 1 of 3 sent no strata header"));
    const int gathers = g.transports[r]->gathers;
    EXPECT_EQ(g.comms[r]->barrier().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(g.transports[r]->gathers, gathers) << "a broken communicator called its transport";
  }
}

// Ranks whose call numbers differ (they are out of step) are refused with every rank's number.
TEST(TransportCommunicator, RanksOutOfStepAreNamedWithTheirCallNumbers) {
  TransportGroup g = make_transport_group(2, false);
  g.transports[1]->tamper = [](char* send, std::int64_t) {
    const std::uint64_t seq = 7;
    std::memcpy(send + 8, &seq, sizeof(seq));  // WireHeader::seq follows the 8-byte magic
  };
  std::vector<Status> got(2);
  on_ranks(2, [&](int r) { got[r] = g.comms[r]->barrier(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kFailedPrecondition) << got[r].to_string();
    EXPECT_EQ(got[r].message(), "barrier: ranks are out of step: rank 0 at call 0, rank 1 at call 7");
  }
}

// An all_to_all_v in which no rank sends a byte to another rank (only own shares) costs the header
// alone: the Transport gets no all_to_all; barrier is the header alone too.
TEST(TransportCommunicator, NoTransportCallWhenNoRankMovesAByte) {
  TransportGroup g = make_transport_group(3, false);
  on_ranks(3, [&](int r) {
    Communicator& c = *g.comms[r];
    std::vector<std::int64_t> counts(3, 0), displs(3, 0);
    counts[r] = 4;
    std::vector<std::uint8_t> send(4, static_cast<std::uint8_t>(r)), recv(4, 0);
    ASSERT_TRUE(
        c.all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data()).is_ok());
    EXPECT_EQ(recv, send);
    ASSERT_TRUE(c.barrier().is_ok());
    std::uint8_t none = 0;
    ASSERT_TRUE(c.all_gather(&none, 0, &none).is_ok());
    EXPECT_EQ(g.transports[r]->exchanges, 0);
    EXPECT_EQ(g.transports[r]->gathers, 3) << "the three headers only";
    EXPECT_EQ(c.counters().calls, 3);
  });
}

// A Transport error in the data phase fails the call with the collective's name and the
// Transport's code, breaks the communicator (later calls never reach the Transport) and writes
// nothing; the peer, left waiting in its operation, times out.
TEST(TransportCommunicator, ATransportErrorBreaksTheCommunicator) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(500);
  TransportGroup g = make_transport_group(2, false, o);
  g.transports[0]->fail = [](const char* operation) {
    return std::strcmp(operation, "all_to_all") == 0
               ? Status::unavailable("a peer left the process group (its process exited or was killed)")
               : Status::ok();
  };
  std::vector<Status> got(2);
  std::vector<std::vector<std::uint8_t>> recv(2, std::vector<std::uint8_t>(16, 0xEE));
  on_ranks(2, [&](int r) {
    const std::vector<std::int64_t> counts{8, 8}, displs{0, 8};
    const std::vector<std::uint8_t> send(16, 1);
    got[r] = g.comms[r]->all_to_all_v(send.data(), counts.data(), displs.data(), recv[r].data(), counts.data(),
                                      displs.data());
  });
  EXPECT_EQ(got[0].code(), StatusCode::kUnavailable);
  EXPECT_EQ(got[0].message(), "all_to_all_v: a peer left the process group (its process exited or was killed)");
  EXPECT_EQ(got[1].code(), StatusCode::kUnavailable);
  EXPECT_THAT(got[1].message(), HasSubstr("all_to_all_v: timed out after 500 ms"));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(recv[r], std::vector<std::uint8_t>(16, 0xEE)) << "rank " << r << ": a failed call wrote";
    EXPECT_EQ(g.comms[r]->counters().sent_bytes, 0);
  }
  const int gathers = g.transports[0]->gathers;
  const Status again = g.comms[0]->barrier();
  EXPECT_EQ(again.code(), StatusCode::kUnavailable);
  EXPECT_THAT(again.message(), HasSubstr("a peer left the process group"));
  EXPECT_EQ(g.transports[0]->gathers, gathers);
}

}  // namespace
}  // namespace strata::dispatch::testing
