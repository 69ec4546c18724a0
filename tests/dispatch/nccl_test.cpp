// The `nccl` communicator: the conformance suite with one rank on one GPU (bootstrapped through
// an id file), and the factories' errors. Skips when the build has no NCCL or no GPU is visible
// (tests/gpu/cuda_gate.hpp: fails instead when CUDA is broken or STRATA_REQUIRE_GPU=1).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "dispatch/local_communicator.hpp"
#include "dispatch/nccl_communicator.hpp"
#include "gpu/device.hpp"
#include "tests/dispatch/conformance.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::HasSubstr;

std::string fresh_id_path() {
  static std::atomic<int> counter{0};
  return "/tmp/strata-nccl-id-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

class NcclWorld final : public World {
 public:
  std::string name() const override { return "nccl1"; }
  std::string kind() const override { return "nccl"; }
  int size() const override { return 1; }
  std::string skip_reason() const override {
    if (!nccl_built()) return "this build has no NCCL";
    const ::strata::testing::CudaGate gate = ::strata::testing::cuda_gate();
    if (gate.fail) ADD_FAILURE() << gate.why;  // the skip that follows then reads as a failure
    return gate.why;
  }

  void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) override {
    const std::string id_path = fresh_id_path();
    char dir[] = "/tmp/strata-nccl-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    NcclOptions o;
    o.comm = options;
    {
      auto made = make_nccl_communicator_from_file(id_path, 0, 1, o);
      ASSERT_TRUE(made.is_ok()) << made.status().to_string();
      RankEnv env{*made.value(), [] {}, dir};
      body(env);
    }
    std::remove(id_path.c_str());
    std::filesystem::remove_all(dir);
  }
};

INSTANTIATE_TEST_SUITE_P(Nccl, Conformance, ::testing::Values(make_world<NcclWorld>()), world_name);

TEST(NcclCommunicator, FactoriesSayWhyTheyCannotRun) {
  auto made = make_nccl_communicator_from_file(fresh_id_path(), 0, 1);
  const Result<int> gpus = gpu::cuda_devices();
  if (!nccl_built()) {
    EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(made.status().message(), HasSubstr("no NCCL support"));
  } else if (!gpus.is_ok()) {
    EXPECT_EQ(made.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(made.status().message(), HasSubstr(gpus.status().message()));
  } else if (gpus.value() == 0) {
    EXPECT_EQ(made.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(made.status().message(), HasSubstr("no CUDA GPU is visible"));
  } else {
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  }
  auto bad_rank = make_nccl_communicator_from_file(fresh_id_path(), 2, 2);
  if (nccl_built()) {
    EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad_rank.status().message(), HasSubstr("rank 2 out of range [0, 2)"));
  }
}

// The bootstrap through a communicator: rank 0's id travels over a local group of one.
TEST(NcclCommunicator, BootstrapsThroughAnotherCommunicator) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto boot = make_local_group(1).value();
  auto made = make_nccl_communicator(*boot[0]);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  std::int64_t v = 41;
  ASSERT_TRUE(made.value()->all_reduce(&v, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
  EXPECT_EQ(v, 41);
}

// Thread ranks under a launcher (srun sets SLURM_LOCALID for the whole process): each rank's local
// rank, and so its GPU, is its bootstrap's, not the launcher's one local rank of the process
// (which gave every thread rank the same GPU: NCCL's "Duplicate GPU").
TEST(NcclCommunicator, ThreadRanksUnderALauncherTakeTheBootstrapsLocalRank) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const char* saved = std::getenv("SLURM_LOCALID");
  const std::string old = saved ? saved : "";
  ASSERT_EQ(::setenv("SLURM_LOCALID", "5", 1), 0);
  auto boot = make_local_group(1).value();
  auto made = make_nccl_communicator(*boot[0]);
  if (saved) {
    ::setenv("SLURM_LOCALID", old.c_str(), 1);
  } else {
    ::unsetenv("SLURM_LOCALID");
  }
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_EQ(made.value()->local_rank(), 0) << "the local bootstrap's rank, not SLURM_LOCALID";
  EXPECT_EQ(made.value()->device(), 0);
}

// A second rank that never comes: the id file is never written, and rank 1 says so.
TEST(NcclCommunicator, MissingIdFileTimesOut) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  NcclOptions o;
  o.comm.timeout = std::chrono::milliseconds(200);
  auto made = make_nccl_communicator_from_file(fresh_id_path(), 1, 2, o);
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(made.status().message(), HasSubstr("did not appear within 200 ms"));
}

}  // namespace
}  // namespace strata::dispatch::testing
