// The `transport` communicator (dispatch/transport_communicator.hpp): the conformance suite over a
// TransportCommunicator whose Transport is written here, ThreadTransport: the ranks are threads,
// and it moves its bytes over a `local` group (whose error texts it passes on without local's
// "<collective>: " prefix, as the contract says). Two kinds of worlds: one whose Transport takes
// no device buffers (staged through pinned memory, as a gloo process group) and one that takes
// them (as NCCL: the caller's device pointers go to the Transport). Then what only this
// communicator has: headers from something else, ranks out of step, no Transport call when
// nothing moves, a Transport error breaking the communicator.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "dispatch/transport_communicator.hpp"
#include "tests/dispatch/conformance.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

// A Transport whose ranks are threads of this process, over a `local` group.
class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::unique_ptr<Communicator> comm, bool direct) : comm_(std::move(comm)), direct_(direct) {}

  int rank() const noexcept override { return comm_->rank(); }
  int size() const noexcept override { return comm_->size(); }
  int local_rank() const noexcept override { return comm_->local_rank(); }
  const char* kind() const noexcept override { return "threads"; }
  bool takes_device(const BufferSpace& /*space*/) const noexcept override { return direct_; }

  Result<HostStage> host_stage(std::int64_t send_bytes, std::int64_t recv_bytes) override {
    ++stages;
    if (send_.size() < static_cast<std::size_t>(send_bytes)) send_.resize(static_cast<std::size_t>(send_bytes));
    if (recv_.size() < static_cast<std::size_t>(recv_bytes)) recv_.resize(static_cast<std::size_t>(recv_bytes));
    send_bytes_ = send_bytes;
    return HostStage{send_.data(), recv_.data()};
  }

  Status all_gather(std::int64_t bytes, const DeviceBuffers* dev) override {
    ++gathers;
    if (!dev && tamper) tamper(send_.data(), send_bytes_);
    return strip(dev ? comm_->all_gather(dev->send, bytes, dev->recv, dev->space)
                     : comm_->all_gather(send_.data(), bytes, recv_.data()));
  }

  Status all_to_all(const std::int64_t* send_splits, const std::int64_t* recv_splits,
                    const DeviceBuffers* dev) override {
    ++exchanges;
    if (fail_exchange) return fail_exchange();
    const int n = size();
    std::vector<std::int64_t> sd(n), rd(n);
    for (int r = 1; r < n; ++r) {
      sd[r] = sd[r - 1] + send_splits[r - 1];
      rd[r] = rd[r - 1] + recv_splits[r - 1];
    }
    return strip(
        dev ? comm_->all_to_all_v(dev->send, send_splits, sd.data(), dev->recv, recv_splits, rd.data(), dev->space)
            : comm_->all_to_all_v(send_.data(), send_splits, sd.data(), recv_.data(), recv_splits, rd.data()));
  }

  Status broadcast(std::int64_t bytes, int root, const DeviceBuffers* dev) override {
    ++broadcasts;
    if (dev) return strip(comm_->broadcast(dev->recv, bytes, root, dev->space));
    return strip(comm_->broadcast(rank() == root ? send_.data() : recv_.data(), bytes, root));
  }

  // What the tests watch and change (the owning thread only).
  int stages = 0, gathers = 0, exchanges = 0, broadcasts = 0;
  std::function<void(char* send, std::int64_t bytes)> tamper;  // changes what a host all_gather sends
  std::function<Status()> fail_exchange;                       // all_to_all fails with this

 private:
  // local's messages start with the collective's name; a Transport's do not.
  static Status strip(const Status& s) {
    if (s.is_ok()) return s;
    for (const char* op : {"all_gather: ", "all_to_all_v: ", "broadcast: "}) {
      if (s.message().rfind(op, 0) == 0) return Status::from_code(s.code(), s.message().substr(std::strlen(op)));
    }
    return s;
  }

  std::unique_ptr<Communicator> comm_;
  const bool direct_;
  std::vector<char> send_, recv_;
  std::int64_t send_bytes_ = 0;
};

// n transport communicators over a fresh local group, and their transports (owned by them).
struct TransportGroup {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<ThreadTransport*> transports;
};

TransportGroup make_group(int n, bool direct, const CommOptions& options = {}) {
  TransportGroup g;
  auto locals = make_local_group(n, options).value();
  for (int r = 0; r < n; ++r) {
    auto t = std::make_unique<ThreadTransport>(std::move(locals[r]), direct);
    g.transports.push_back(t.get());
    g.comms.push_back(make_transport_communicator(std::move(t)).value());
  }
  return g;
}

// A barrier for the test threads themselves (not under test). Fails the test instead of hanging.
class ThreadSync {
 public:
  explicit ThreadSync(int n) : n_(n) {}
  void arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != gen; })) {
      ADD_FAILURE() << "test sync: not every rank arrived within 60 s";
    }
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  std::uint64_t generation_ = 0;
};

class TransportWorld final : public World {
 public:
  TransportWorld(int n, bool direct) : n_(n), direct_(direct) {}
  std::string name() const override { return std::string(direct_ ? "direct" : "staged") + std::to_string(n_); }
  std::string kind() const override { return "threads"; }
  int size() const override { return n_; }

  void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) override {
    TransportGroup g = make_group(n_, direct_, options);
    char tmpl[] = "/tmp/strata-transport-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    ThreadSync sync(n_);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) {
      threads.emplace_back([&, r] {
        RankEnv env{*g.comms[r], [&] { sync.arrive(); }, dir};
        body(env);
      });
    }
    for (auto& t : threads) t.join();
    std::filesystem::remove_all(dir);
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
  TransportGroup g = make_group(3, false);
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
  TransportGroup g = make_group(2, false);
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
  TransportGroup g = make_group(3, false);
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
  TransportGroup g = make_group(2, false, o);
  g.transports[0]->fail_exchange = [] {
    return Status::unavailable("a peer left the process group (its process exited or was killed)");
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
