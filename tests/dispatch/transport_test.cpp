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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/detail/comm_check.hpp"
#include "dispatch/transport_communicator.hpp"
#include "gpu/device.hpp"
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

// Communicator::timeout() of a transport communicator is its Transport's (what its operations wait), which local
// work of the store's collectives (world checkpoints) measures stalls against.
TEST(TransportCommunicator, ItsTimeoutIsTheTransports) {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(1234);
  TransportGroup g = make_transport_group(2, false, options);
  for (const auto& c : g.comms) EXPECT_EQ(c->timeout(), std::chrono::milliseconds(1234));
  EXPECT_EQ(make_local_group(1, options).value()[0]->timeout(), std::chrono::milliseconds(1234));
}

// Something else on the transport's world (a trainer's own collective on the process group) met
// one of Strata's: the rank whose bytes carry no strata header is named on every rank, and the
// communicator is broken (broken() says so, with that error).
TEST(TransportCommunicator, AHeaderWithoutTheMagicIsNamedOnEveryRank) {
  TransportGroup g = make_transport_group(3, false);
  g.transports[1]->tamper = [](char* send, std::int64_t) { send[0] = 'X'; };
  std::vector<Status> got(3);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(g.comms[r]->broken().is_ok());
  on_ranks(3, [&](int r) { got[r] = g.comms[r]->barrier(); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kFailedPrecondition) << got[r].to_string();
    EXPECT_THAT(got[r].message(), HasSubstr("barrier: rank 1 of 3 sent no strata header"));
    EXPECT_EQ(g.comms[r]->broken().to_string(), got[r].to_string()) << "broken() is not the breaking error";
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
    std::memcpy(send + offsetof(detail::WireHeader, seq), &seq, sizeof(seq));
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

// One rank's emulated device and a stream on it (fail_after_ops: the op index that fails, -1 none).
struct EmuRank {
  explicit EmuRank(std::int64_t fail_after_ops = -1) {
    gpu::EmuOptions o;
    o.capacity = 1 << 20;
    o.threads = 1;
    o.fail_after_ops = fail_after_ops;
    dev = gpu::make_emu_device(o).value();
    stream = dev->create_stream().value();
  }
  BufferSpace space() { return BufferSpace::on(*dev, stream.view()); }
  std::unique_ptr<gpu::Device> dev;
  gpu::Stream stream;
};

// A device fault in the own share of a direct all_to_all_v that moves nothing between ranks (the
// Transport gets no call) fails the call on that rank and leaves the communicator usable, as a
// fault in the staged path's own share does: the peers are in step, no rank waits.
TEST(TransportCommunicator, ADeviceFaultInTheOwnShareLeavesEveryRankInStep) {
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "staged");
    CommOptions o;
    o.timeout = std::chrono::seconds(10);
    TransportGroup g = make_transport_group(2, direct, o);
    std::vector<Status> got(2), after(2);
    on_ranks(2, [&](int r) {
      EmuRank er(r == 0 ? 0 : -1);
      {
        auto send = er.dev->allocate(64).value(), recv = er.dev->allocate(64).value();
        std::vector<std::int64_t> counts(2, 0), displs(2, 0);
        counts[r] = 8;
        displs[1] = counts[0];
        got[r] = g.comms[r]->all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(),
                                          displs.data(), er.space());
      }
      after[r] = g.comms[r]->barrier();
      g.comms[r]->forget_device(*er.dev);
    });
    EXPECT_EQ(got[0].code(), StatusCode::kInternal) << got[0].to_string();
    EXPECT_THAT(got[0].message(), HasSubstr("emulated device fault"));
    EXPECT_TRUE(got[1].is_ok()) << got[1].to_string();
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(after[r].is_ok()) << "rank " << r << ": " << after[r].to_string();
  }
}

// A device all_gather whose receive bytes (bytes * size) would pass int64 is refused on every rank
// before anything computes them (undefined behaviour: UBSan aborts) or touches a device.
TEST(TransportCommunicator, ADeviceAllGatherPastInt64IsRefusedBeforeItsSizeIsComputed) {
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "staged");
    TransportGroup g = make_transport_group(2, direct);
    std::vector<Status> got(2);
    on_ranks(2, [&](int r) {
      EmuRank er;
      {
        auto send = er.dev->allocate(64).value(), recv = er.dev->allocate(64).value();
        got[r] = g.comms[r]->all_gather(send.data(), std::numeric_limits<std::int64_t>::max() / 2 + 1, recv.data(),
                                        er.space());
      }
      g.comms[r]->forget_device(*er.dev);
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << got[r].to_string();
      EXPECT_THAT(got[r].message(), HasSubstr("from each of 2 ranks add up past int64"));
    }
  }
}

// A Transport whose device operation only orders its work on the stream (returns before it ran):
// the communicator waits for the stream before the call returns (a device collective is synchronous
// for the host), so a fault in that work fails the call on that rank, and leaves the ranks in step.
TEST(TransportCommunicator, ADirectDeviceCollectiveWaitsForTheTransportsQueuedWork) {
  TransportGroup g = make_transport_group(2, true);
  std::vector<Status> got(2), after(2);
  std::vector<int> device_ops(2);
  g.transports[0]->queue_after = [](const DeviceBuffers& dev) {
    // Past the end of the allocation: emu's sticky error, seen at the next synchronize.
    dev.space.device->copy_d2d(dev.space.stream, dev.recv, dev.send, std::size_t{1} << 30);
  };
  on_ranks(2, [&](int r) {
    EmuRank er;
    {
      auto send = er.dev->allocate(64).value(), recv = er.dev->allocate(128).value();
      got[r] = g.comms[r]->all_gather(send.data(), 64, recv.data(), er.space());
    }
    after[r] = g.comms[r]->barrier();
    device_ops[r] = g.transports[r]->device_ops;
    g.comms[r]->forget_device(*er.dev);
  });
  EXPECT_FALSE(got[0].is_ok());
  EXPECT_THAT(got[0].message(), HasSubstr("all_gather: "));
  EXPECT_TRUE(got[1].is_ok()) << got[1].to_string();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(after[r].is_ok()) << "rank " << r << ": " << after[r].to_string();
    EXPECT_EQ(device_ops[r], 1);
  }
}

// Ranks whose device buffers take different paths (rank 0's Transport takes them, rank 1's stages
// them through host memory: a host operation against a device one, which a real process group
// cannot match) are refused on every rank before any data moves, naming the ranks.
TEST(TransportCommunicator, RanksThatMixDirectAndStagedDeviceBuffersAreRefused) {
  auto locals = make_local_group(2).value();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 2; ++r) {
    comms.push_back(make_transport_communicator(
                        std::make_unique<ThreadTransport>(std::move(locals[static_cast<std::size_t>(r)]), r == 0))
                        .value());
  }
  std::vector<Status> got(2);
  on_ranks(2, [&](int r) {
    EmuRank er;
    {
      auto send = er.dev->allocate(8).value(), recv = er.dev->allocate(16).value();
      got[r] = comms[r]->all_gather(send.data(), 8, recv.data(), er.space());
    }
    comms[r]->forget_device(*er.dev);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << got[r].to_string();
    EXPECT_THAT(got[r].message(), HasSubstr("all_gather: ranks disagree on the device path: rank 0: direct"));
    EXPECT_THAT(got[r].message(), HasSubstr("rank 1: staged"));
  }
}

// A broken communicator does no device work for a device collective: no pinned staging grows, no
// copy is queued (the device's first operation would fault); the call returns the first error.
TEST(TransportCommunicator, ABrokenCommunicatorDoesNoDeviceWork) {
  TransportGroup g = make_transport_group(2, false);
  g.transports[1]->tamper = [](char* send, std::int64_t) { send[0] = 'X'; };
  on_ranks(2, [&](int r) {
    Communicator& c = *g.comms[r];
    ASSERT_EQ(c.barrier().code(), StatusCode::kFailedPrecondition);
    EmuRank er(0);
    {
      auto send = er.dev->allocate(16).value(), recv = er.dev->allocate(32).value();
      const std::vector<std::int64_t> counts{8, 8}, displs{0, 8};
      const gpu::ResourceCounts before = er.dev->resource_counts();
      for (const Status& s :
           {c.all_gather(send.data(), 8, recv.data(), er.space()), c.broadcast(recv.data(), 8, 0, er.space()),
            c.all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                           er.space())}) {
        EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
        EXPECT_THAT(s.message(), HasSubstr("communicator broken by an earlier failure"));
      }
      EXPECT_TRUE(er.dev->resource_counts() - before == gpu::ResourceCounts{}) << "rank " << r;
      EXPECT_TRUE(er.dev->status().is_ok()) << "rank " << r << ": " << er.dev->status().to_string();
    }
    c.forget_device(*er.dev);
  });
}

// The direct worlds reach the Transport's device operations: a packed device all_to_all_v (the
// layout of dispatch::exchange), an all_gather and a broadcast each give it the caller's buffers.
TEST(TransportCommunicator, DirectWorldsGiveDeviceBuffersToTheTransport) {
  for (int n : {2, 3}) {
    TransportGroup g = make_transport_group(n, true);
    on_ranks(n, [&](int r) {
      Communicator& c = *g.comms[r];
      EmuRank er;
      {
        auto send = er.dev->allocate(8 * n).value(), recv = er.dev->allocate(8 * n).value();
        std::vector<std::int64_t> counts(n, 8), displs(n);
        for (int p = 0; p < n; ++p) displs[p] = 8 * p;
        EXPECT_TRUE(c.all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                                   er.space())
                        .is_ok());
        EXPECT_TRUE(c.all_gather(send.data(), 8, recv.data(), er.space()).is_ok());
        EXPECT_TRUE(c.broadcast(recv.data(), 8, 0, er.space()).is_ok());
      }
      EXPECT_EQ(g.transports[r]->device_ops, 3) << "rank " << r;
      c.forget_device(*er.dev);
    });
  }
}

}  // namespace
}  // namespace strata::dispatch::testing
