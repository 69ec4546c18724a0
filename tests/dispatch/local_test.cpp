// The `local` communicator: the conformance suite with 1 to 4 thread ranks, and what only the
// local group has (closing a rank, factory errors). Also runs under ThreadSanitizer (tsan preset).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/agreement.hpp"
#include "dispatch/comm_factory.hpp"
#include "dispatch/local_communicator.hpp"
#include "gpu/device.hpp"
#include "tests/dispatch/conformance.hpp"
#include "tests/dispatch/thread_world.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

class LocalWorld final : public World {
 public:
  explicit LocalWorld(int n) : n_(n) {}
  std::string name() const override { return "local" + std::to_string(n_); }
  std::string kind() const override { return "local"; }
  int size() const override { return n_; }

  void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) override {
    auto made = make_local_group(n_, options);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    run_thread_world(made.value(), "local", body);
  }

 private:
  const int n_;
};

INSTANTIATE_TEST_SUITE_P(Local, Conformance,
                         ::testing::Values(make_world<LocalWorld>(1), make_world<LocalWorld>(2),
                                           make_world<LocalWorld>(3), make_world<LocalWorld>(4)),
                         world_name);

TEST(LocalGroup, RejectsBadSizesAndTimeouts) {
  auto a = make_local_group(0);
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("size 0 must be at least 1"));
  CommOptions o;
  o.timeout = std::chrono::milliseconds(0);
  auto b = make_local_group(2, o);
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("timeout 0 ms must be positive"));
}

// A rank whose communicator is destroyed can never arrive: the others fail at once, also while
// they are already waiting, instead of waiting out a long timeout.
TEST(LocalGroup, ClosingARankFailsItsPeersWithoutWaitingForTheTimeout) {
  CommOptions o;
  o.timeout = std::chrono::hours(1);
  auto comms = make_local_group(3, o).value();
  std::vector<Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { got[r] = comms[r]->barrier(); });
  comms[2].reset();
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kUnavailable) << got[r].to_string();
    EXPECT_THAT(got[r].message(), HasSubstr("rank 2 of 3 closed its local communicator"));
  }
  EXPECT_FALSE(comms[0]->barrier().is_ok());
}

// agree(): a rank whose local step failed makes every rank fail it, its peers with its code (the
// first failed rank's), DataLoss and IoError too. Regression: those two reached the peers as
// FailedPrecondition.
TEST(Agree, ThePeersGetTheFailedRanksCode) {
  for (const Status& failure : {Status::data_loss("checkpoint 'c1': table 'user': crc mismatch"),
                                Status::io_error("cannot read 'c1/user.rows': No such file"),
                                Status::resource_exhausted("table 'user': no free slot")}) {
    auto comms = make_local_group(3).value();
    std::vector<Status> got(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        got[r] = agree(*comms[r], Step{"load", 1, 0, 0}, r == 2 ? failure : Status::ok());
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(got[2].to_string(), failure.to_string());
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(got[r].code(), failure.code()) << got[r].to_string();
      EXPECT_EQ(got[r].message(), "load(1) failed on another rank (rank 2: " + failure.message() + ")");
    }
  }
}

// agree(): a failed rank's message longer than the record holds reaches its peers cut at a
// character boundary and marked as cut ("\u2026"), not silently shortened.
TEST(Agree, ALongMessageReachesThePeersMarkedAsCut) {
  const std::string long_text = "table 'user': " + std::string(300, 'x') + " (expected y)";
  auto comms = make_local_group(2).value();
  std::vector<Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      got[r] = agree(*comms[r], Step{"load", 1, 0, 0}, r == 1 ? Status::io_error(long_text) : Status::ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[1].message(), long_text);
  EXPECT_EQ(got[0].code(), StatusCode::kIoError);
  const std::string& m = got[0].message();
  EXPECT_NE(m.find("(rank 1: table 'user': xxx"), std::string::npos) << m;
  EXPECT_NE(m.find("x\u2026)"), std::string::npos) << m;
  EXPECT_EQ(m.find("(expected y)"), std::string::npos) << m;
}

// Destroying every communicator right after the last collective, in any order, is fine: a peer
// still returning from that collective must not see the group as broken.
TEST(LocalGroup, RanksMayCloseAsSoonAsTheirLastCallReturns) {
  for (int repeat = 0; repeat < 200; ++repeat) {
    auto comms = make_local_group(4).value();
    std::vector<Status> got(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        std::int64_t v = r;
        got[r] = comms[r]->all_reduce(&v, 1, DataType::kInt64, ReduceOp::kSum);
        if (got[r].is_ok() && v != 6) got[r] = Status::internal("wrong sum " + std::to_string(v));
        if (got[r].is_ok()) got[r] = comms[r]->barrier();
        comms[r].reset();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r)
      ASSERT_TRUE(got[r].is_ok()) << "repeat " << repeat << " rank " << r << ": " << got[r].to_string();
  }
}

// Thread ranks read each other's buffers: a rank with host buffers and one with device buffers
// in the same collective cannot both be served, so every rank gets the same error.
TEST(LocalGroup, RanksPassingDifferentMemorySpacesFailEveryRank) {
  auto comms = make_local_group(2).value();
  auto dev = gpu::make_emu_device().value();
  auto stream = dev->create_stream().value();
  auto d = dev->allocate(16).value();
  std::vector<std::uint8_t> host(16, 1);
  std::vector<Status> got(2);
  std::thread t1([&] { got[1] = comms[1]->broadcast(d.data(), 16, 0, BufferSpace::on(*dev, stream.view())); });
  got[0] = comms[0]->broadcast(host.data(), 16, 0);
  t1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << got[r].to_string();
    EXPECT_THAT(got[r].message(), HasSubstr("rank 0 passed host memory and rank 1 device memory"));
  }
}

// Device buffers of thread ranks move by peer copies: each rank's device counts what it wrote
// (HBM writes) and what its peers read from it (HBM reads); no byte crosses PCIe.
TEST(LocalGroup, DeviceBuffersMoveByPeerCopiesWithoutCrossingPcie) {
  constexpr int kRanks = 3;
  constexpr std::int64_t kPart = 1000;
  auto comms = make_local_group(kRanks).value();
  std::vector<std::unique_ptr<gpu::Device>> devs;
  std::vector<gpu::Stream> streams;
  std::vector<gpu::DeviceBuffer> send, recv;
  for (int r = 0; r < kRanks; ++r) {
    devs.push_back(gpu::make_emu_device().value());
    streams.push_back(devs[r]->create_stream().value());
    send.push_back(devs[r]->allocate(kPart * kRanks).value());
    recv.push_back(devs[r]->allocate(kPart * kRanks).value());
  }
  std::vector<gpu::LinkBytes> before;
  for (auto& d : devs) before.push_back(d->counters().snapshot());
  const std::vector<std::int64_t> counts(kRanks, kPart), displs{0, kPart, 2 * kPart};
  std::vector<Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      got[r] = comms[r]->all_to_all_v(send[r].data(), counts.data(), displs.data(), recv[r].data(), counts.data(),
                                      displs.data(), BufferSpace::on(*devs[r], streams[r].view()));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].is_ok()) << got[r].to_string();
    const gpu::LinkBytes b = devs[r]->counters().snapshot() - before[r];
    EXPECT_EQ(b.h2d, 0u);
    EXPECT_EQ(b.d2h, 0u);
    EXPECT_EQ(b.hbm_write, static_cast<std::uint64_t>(kPart * kRanks)) << "every part, its own included";
    EXPECT_EQ(b.hbm_read, static_cast<std::uint64_t>(kPart * kRanks)) << "every part read once, by its receiver";
  }
}

TEST(CommFactory, MakesLocalGroupsAndRejectsUnknownKinds) {
  auto local = make_communicators("local", 3);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  ASSERT_EQ(local->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*local)[r]->rank(), r);
    EXPECT_EQ((*local)[r]->size(), 3);
    EXPECT_STREQ((*local)[r]->kind(), "local");
  }
  auto unknown = make_communicators("gloo", 1);
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("unknown communicator kind 'gloo' (expected one of: local, mpi, nccl)"));
  auto mpi_threads = make_communicators("mpi", 2);
  EXPECT_EQ(mpi_threads.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mpi_threads.status().message(), HasSubstr("one rank per process"));
  auto none = make_communicators("local", 0);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::dispatch::testing
