// The `mpi` communicator: the conformance suite with one rank per process. Run by CTest as
// `mpirun -np N dispatch_mpi_test` for N = 1, 2, 4. Every process runs every test in the same
// order; each test gets a fresh communicator (a new duplicate of MPI_COMM_WORLD), so a test that
// breaks its communicator leaves nothing behind for the next. Test control (sync, the shared
// directory, the final verdict) goes over a separate duplicate and is polled with a deadline: a
// rank that fails or stalls makes the job abort with a message, never hang.
//
// Only rank 0 prints GoogleTest's usual output; the other ranks print their failures prefixed
// with their rank. The exit status is the same on every rank: failed if any rank failed.

#include <mpi.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/mpi_communicator.hpp"
#include "gpu/device.hpp"
#include "tests/dispatch/conformance.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

MPI_Comm g_control = MPI_COMM_NULL;
int g_rank = 0;
int g_size = 1;

constexpr auto kControlDeadline = std::chrono::seconds(120);

// Waits for a non-blocking operation on the control communicator; aborts the job (with the
// reason) when it does not complete: the ranks are out of step and cannot recover.
void finish(MPI_Request& req, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + kControlDeadline;
  for (;;) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "[rank %d] test control: %s did not complete within 120 s; aborting the job\n", g_rank,
                   what);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void control_barrier() {
  MPI_Request req;
  MPI_Ibarrier(g_control, &req);
  finish(req, "a barrier");
}

class MpiWorld final : public World {
 public:
  std::string name() const override { return "mpi" + std::to_string(g_size); }
  std::string kind() const override { return "mpi"; }
  int size() const override { return g_size; }

  void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) override {
    // A directory for the whole world: rank 0 makes it and tells the others its name.
    char dir[256] = {};
    if (g_rank == 0) {
      std::snprintf(dir, sizeof(dir), "/tmp/strata-mpi-XXXXXX");
      if (!mkdtemp(dir)) dir[0] = '\0';
    }
    MPI_Request req;
    MPI_Ibcast(dir, sizeof(dir), MPI_CHAR, 0, g_control, &req);
    finish(req, "sharing the test directory");
    ASSERT_NE(dir[0], '\0') << "rank 0 could not make a temporary directory";
    {
      auto made = make_mpi_communicator(options);
      EXPECT_TRUE(made.is_ok()) << made.status().to_string();
      if (made.is_ok()) {
        RankEnv env{*made.value(), control_barrier, dir};
        body(env);
      }
      control_barrier();  // every rank is done with the world before it goes
    }
    if (g_rank == 0) std::filesystem::remove_all(dir);
  }
};

INSTANTIATE_TEST_SUITE_P(Mpi, Conformance, ::testing::Values(make_world<MpiWorld>()), world_name);

TEST(MpiCommunicator, FactoryErrors) {
  auto null_comm = make_mpi_communicator_over(nullptr);
  EXPECT_EQ(null_comm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(null_comm.status().message(), HasSubstr("mpi_comm is null"));
  CommOptions o;
  o.timeout = std::chrono::milliseconds(-1);
  auto bad_timeout = make_mpi_communicator(o);
  EXPECT_EQ(bad_timeout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ensure_mpi_initialized().is_ok());  // idempotent
  EXPECT_TRUE(launched_by_mpi());
}

TEST(MpiCommunicator, PlaceMatchesTheWorld) {
  auto place = mpi_place();
  ASSERT_TRUE(place.is_ok()) << place.status().to_string();
  EXPECT_EQ(place->rank, g_rank);
  EXPECT_EQ(place->size, g_size);
  EXPECT_GE(place->local_rank, 0);
  EXPECT_LT(place->local_rank, g_size);
}

// A communicator over a sub-communicator: the even ranks only.
TEST(MpiCommunicator, WorksOverAGivenCommunicator) {
  MPI_Comm half = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &half), MPI_SUCCESS);
  {
    auto made = make_mpi_communicator_over(&half);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    Communicator& c = *made.value();
    EXPECT_EQ(c.size(), (g_size + 1 - g_rank % 2) / 2);
    EXPECT_EQ(c.rank(), g_rank / 2);
    std::int64_t v = g_rank;
    ASSERT_TRUE(c.all_reduce(&v, 1, DataType::kInt64, ReduceOp::kMax).is_ok());
    // The largest world rank of the same parity.
    const int top = (g_size - 1) % 2 == g_rank % 2 ? g_size - 1 : g_size - 2;
    EXPECT_EQ(v, top);
  }
  MPI_Comm_free(&half);
  control_barrier();
}

// When the pinned staging of device buffers cannot be allocated (here on rank 0, whose emulated
// device has 1 MiB of pinned memory, and whose ranges start 600 KiB into its send or its receive
// buffer: a stage of twice that), every rank fails the call with that error, for the send stage
// and for the receive stage alike, and the communicator stays usable (nothing moved). Regressions:
// the stage that failed to grow was passed on as a null buffer, and every rank was told "send is
// null ..." or "recv is null ..." instead; then it was an argument error, which broke the
// communicator.
TEST(MpiCommunicator, DeviceBuffersWhosePinnedStagingCannotBeAllocatedFailEveryRank) {
  constexpr std::int64_t kCount = 64, kGap = 600 << 10;
  for (const bool send_side : {true, false}) {
    SCOPED_TRACE(send_side ? "the send stage" : "the receive stage");
    CommOptions options;
    options.timeout = std::chrono::milliseconds(20000);
    MpiWorld().run(options, [&](RankEnv& env) {
      Communicator& c = env.comm;
      gpu::EmuOptions o;
      o.capacity = std::size_t{16} << 20;
      o.threads = 1;
      if (g_rank == 0) o.pinned_capacity = std::size_t{1} << 20;
      auto dev = gpu::make_emu_device(o).value();
      auto stream = dev->create_stream().value();
      const std::int64_t send_gap = g_rank == 0 && send_side ? kGap : 0;
      const std::int64_t recv_gap = g_rank == 0 && !send_side ? kGap : 0;
      std::vector<std::int64_t> counts(g_size, kCount), sd(g_size), rd(g_size);
      for (int r = 0; r < g_size; ++r) {
        sd[r] = send_gap + kCount * r;
        rd[r] = recv_gap + kCount * r;
      }
      {
        const gpu::DeviceBuffer send = dev->allocate(send_gap + kCount * g_size).value();
        const gpu::DeviceBuffer recv = dev->allocate(recv_gap + kCount * g_size).value();
        const Status s = c.all_to_all_v(send.data(), counts.data(), sd.data(), recv.data(), counts.data(), rd.data(),
                                        BufferSpace::on(*dev, stream.view()));
        EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
        EXPECT_THAT(s.message(), HasSubstr("all_to_all_v: rank 0: pinned staging of device buffers: emu device: "
                                           "pinned allocation of "));
        EXPECT_THAT(s.message(), HasSubstr("(EmuOptions::pinned_capacity)"));
      }
      const Status met = c.barrier();
      EXPECT_TRUE(met.is_ok()) << "the communicator broke: " << met.to_string();
      EXPECT_TRUE(dev->status().is_ok()) << dev->status().to_string();
      c.forget_device(*dev);
    });
  }
}

// Rank 0's `text`, on every rank (over the test control communicator).
std::string rank0_text(const std::string& text) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  MPI_Request req;
  MPI_Ibcast(&n, 1, MPI_INT64_T, 0, g_control, &req);
  finish(req, "sharing a text's length");
  std::string out = g_rank == 0 ? text : std::string(static_cast<std::size_t>(n), '\0');
  MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, g_control, &req);
  finish(req, "sharing a text");
  return out;
}

// A device error longer than the header carries (here an emu copy refused with both addresses
// described) reads the same on every rank, the failed one too: every rank judges the header as
// it went on the wire, cut with "…". Regression: the failed rank judged its own call from its
// full message and its peers from the cut one, so the ranks returned different errors.
TEST(MpiCommunicator, ALongDeviceErrorReadsTheSameOnEveryRank) {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(20000);
  MpiWorld().run(options, [&](RankEnv& env) {
    Communicator& c = env.comm;
    gpu::EmuOptions o;
    o.capacity = std::size_t{1} << 20;
    o.threads = 1;
    auto dev = gpu::make_emu_device(o).value();
    auto stream = dev->create_stream().value();
    const gpu::DeviceBuffer send = dev->allocate(8).value();
    const gpu::DeviceBuffer recv = dev->allocate(8 * static_cast<std::size_t>(g_size)).value();
    if (g_rank == g_size - 1) {
      // A copy from pageable memory: refused, the device's sticky error.
      const std::vector<char> pageable(8);
      dev->copy_h2d(stream.view(), send.data(), pageable.data(), 8);
      const Status sticky = dev->synchronize(stream.view());
      EXPECT_GT(sticky.message().size(), 220u) << sticky.to_string();  // past what a header carries
    }
    const Status s = c.all_gather(send.data(), 8, recv.data(), BufferSpace::on(*dev, stream.view()));
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.to_string();
    EXPECT_THAT(s.message(), HasSubstr("all_gather: rank " + std::to_string(g_size - 1) + ": device emu failed"));
    EXPECT_THAT(s.message(), HasSubstr("… (no data moved; the communicator stays usable)"));
    EXPECT_EQ(s.message(), rank0_text(s.message())) << "rank " << g_rank;
    const Status met = c.barrier();
    EXPECT_TRUE(met.is_ok()) << "the communicator broke: " << met.to_string();
    c.forget_device(*dev);
  });
}

// Prints the failures of ranks other than 0 (whose GoogleTest output is silenced), with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", g_rank, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", g_rank, info.test_suite_name(), info.name());
  }
};

}  // namespace
}  // namespace strata::dispatch::testing

int main(int argc, char** argv) {
  using namespace strata::dispatch::testing;
  // MPI first: the tests' names (registered by InitGoogleTest) contain the world size.
  const strata::Status init = strata::dispatch::ensure_mpi_initialized();  // finalized at exit
  if (!init.is_ok()) {
    std::fprintf(stderr, "dispatch_mpi_test: %s\n", init.to_string().c_str());
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_control);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter);
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = failed;
  MPI_Request req;
  MPI_Iallreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, g_control, &req);
  finish(req, "agreeing on the result");
  if (g_rank == 0 && any_failed && !failed)
    std::fprintf(stderr, "dispatch_mpi_test: tests failed on other ranks (see above)\n");
  MPI_Comm_free(&g_control);
  return any_failed;
}
