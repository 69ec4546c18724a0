// The `nccl` communicator: the conformance suite with one rank on one GPU (bootstrapped through
// an id file), the factories' errors, the rule by which a rank picks its GPU, and what a failed
// collective leaves behind. Skips when the build has no NCCL or no GPU is visible
// (tests/gpu/cuda_gate.hpp: fails instead when CUDA is broken or STRATA_REQUIRE_GPU=1).
//
// With NCCL (STRATA_TEST_NCCL), this binary interposes three NCCL functions (ncclAllGather,
// ncclCommGetAsyncError, ncclCommAbort): they call the real ones (dlsym RTLD_NEXT) and, only while
// a test arms them, stand in for a peer that died mid-collective (FailedPeer below).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(STRATA_TEST_NCCL)
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

#include "dispatch/local_communicator.hpp"
#include "dispatch/nccl_communicator.hpp"
#include "gpu/device.hpp"
#include "tests/dispatch/conformance.hpp"
#include "tests/gpu/cuda_gate.hpp"

#if defined(STRATA_TEST_NCCL)
// A peer that died mid-collective, as this rank sees it: the armed all-gather leaves work on the
// communicator's stream that does not end (a host function spinning, standing in for NCCL's
// kernels waiting for the peer) until the communicator is aborted, and the next poll of the
// communicator reports a remote error. Every step is logged, in order.
namespace strata::dispatch::testing {
struct FailedPeer {
  std::atomic<bool> armed{false};
  std::atomic<bool> released{false};
  std::mutex m;
  std::vector<std::string> log;
  void note(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    log.push_back(what);
  }
};
FailedPeer g_failed_peer;

template <class F>
F real(const char* name) {
  static_assert(sizeof(F) == sizeof(void*), "a function pointer");
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}
}  // namespace strata::dispatch::testing

using strata::dispatch::testing::g_failed_peer;
using strata::dispatch::testing::real;

extern "C" {
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  static const auto fn =
      real<ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)>("ncclAllGather");
  const ncclResult_t r = fn(send, recv, count, type, comm, stream);
  if (g_failed_peer.armed.load()) {
    g_failed_peer.note("collective issued");
    (void)cudaLaunchHostFunc(
        stream,
        [](void*) {
          while (!g_failed_peer.released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        },
        nullptr);
  }
  return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  static const auto fn = real<ncclResult_t (*)(ncclComm_t, ncclResult_t*)>("ncclCommGetAsyncError");
  if (g_failed_peer.armed.load()) {
    g_failed_peer.note("remote error");
    *state = ncclRemoteError;
    return ncclSuccess;
  }
  return fn(comm, state);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  static const auto fn = real<ncclResult_t (*)(ncclComm_t)>("ncclCommAbort");
  if (g_failed_peer.armed.exchange(false)) g_failed_peer.note("abort");
  g_failed_peer.released.store(true);  // an abort ends the communicator's work on the GPU
  return fn(comm);
}
}  // extern "C"
#endif  // STRATA_TEST_NCCL

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

// The rule each rank picks its GPU by (no GPU needed): the configured device, else its local rank
// modulo the GPUs it sees. A process that sees one GPU (CUDA_VISIBLE_DEVICES=$LOCAL_RANK, srun
// --gpu-bind) takes that one whatever its local rank, and so does a rank of a world over several
// hosts that has only its global rank; whether two ranks share a GPU is decided later, by all ranks.
TEST(NcclDevice, ARankTakesItsLocalRankModuloTheVisibleGpus) {
  EXPECT_EQ(detail::nccl_device_for_rank(7, 1, -1).value(), 0) << "local rank 7 of a process that sees one GPU";
  EXPECT_EQ(detail::nccl_device_for_rank(9, 8, -1).value(), 1) << "global rank 9 on the second host of 8 GPUs";
  EXPECT_EQ(detail::nccl_device_for_rank(1, 2, -1).value(), 1);
  EXPECT_EQ(detail::nccl_device_for_rank(5, 2, 1).value(), 1) << "a chosen device is taken";
  const Result<int> out = detail::nccl_device_for_rank(0, 2, 2);
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("device 2 out of range [0, 2)"));
  EXPECT_EQ(detail::nccl_device_for_rank(0, 0, -1).status().code(), StatusCode::kUnavailable);
}

// Two ranks on one GPU are refused from the all-gathered (host, GPU UUID) of every rank, whatever
// put them there: more ranks than GPUs on a host (local_rank % GPUs), or NcclOptions::device.
TEST(NcclDevice, AHostWithMoreRanksThanGpusIsRefused) {
  using P = detail::NcclPlacement;
  // Three ranks on a host with two GPUs: rank 2 wraps around onto rank 0's GPU.
  const Status three_on_two = detail::nccl_one_rank_per_gpu(
      {P{"boot id a", "GPU-0", 0}, P{"boot id a", "GPU-1", 1}, P{"boot id a", "GPU-0", 0}});
  EXPECT_EQ(three_on_two.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(three_on_two.message(),
              HasSubstr("ranks 0 and 2 of 3 are on one GPU, GPU-0 (device 0 of rank 0, device 0 of rank 2, host boot "
                        "id a), and NCCL runs one rank per GPU"));
  // One GPU per process (CUDA_VISIBLE_DEVICES): every rank's device 0, distinct UUIDs.
  EXPECT_TRUE(detail::nccl_one_rank_per_gpu({P{"h", "GPU-0", 0}, P{"h", "GPU-1", 0}, P{"h", "GPU-2", 0}}).is_ok());
  // Two hosts, one GPU each, the same ordinal: not shared.
  EXPECT_TRUE(detail::nccl_one_rank_per_gpu({P{"h1", "GPU-0", 0}, P{"h2", "GPU-9", 0}}).is_ok());
  EXPECT_TRUE(detail::nccl_one_rank_per_gpu({P{"h1", "GPU-0", 0}, P{"h2", "GPU-0", 0}}).is_ok())
      << "one UUID on two hosts is two GPUs as far as this check goes";
  // The same physical GPU under two ordinals (different CUDA_VISIBLE_DEVICES, or NcclOptions::device).
  const Status configured = detail::nccl_one_rank_per_gpu({P{"h", "GPU-1", 1}, P{"h", "GPU-0", 0}, P{"h", "GPU-1", 0}});
  EXPECT_EQ(configured.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(configured.message(),
              HasSubstr("ranks 0 and 2 of 3 are on one GPU, GPU-1 (device 1 of rank 0, device 0 of rank 2"));
  EXPECT_TRUE(detail::nccl_one_rank_per_gpu({}).is_ok());
}

// On a GPU: one thread rank more than there are GPUs. Every rank fails at once (no rank waits in
// NCCL's initialization), each naming the two ranks on one GPU.
TEST(NcclCommunicator, MoreThreadRanksThanGpusFailTogetherAtOnce) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const int gpus = gpu::cuda_devices().value();
  CommOptions o;
  o.timeout = std::chrono::milliseconds(30000);
  auto boot = make_local_group(gpus + 1, o).value();
  std::vector<Status> got(static_cast<std::size_t>(gpus + 1));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r <= gpus; ++r) {
    ranks.emplace_back([&, r] {
      NcclOptions n;
      n.comm = o;
      got[static_cast<std::size_t>(r)] = make_nccl_communicator(*boot[static_cast<std::size_t>(r)], n).status();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (int r = 0; r <= gpus; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)].code(), StatusCode::kFailedPrecondition) << r;
    EXPECT_THAT(
        got[static_cast<std::size_t>(r)].message(),
        HasSubstr("ranks 0 and " + std::to_string(gpus) + " of " + std::to_string(gpus + 1) + " are on one GPU, GPU-"));
  }
}

// On a GPU: two thread ranks that chose the same device (NcclOptions::device) are refused alike.
TEST(NcclCommunicator, TwoRanksConfiguredOntoOneGpuAreRefused) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto boot = make_local_group(2).value();
  std::vector<Status> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      NcclOptions n;
      n.device = 0;
      got[static_cast<std::size_t>(r)] = make_nccl_communicator(*boot[static_cast<std::size_t>(r)], n).status();
    });
  }
  for (auto& t : ranks) t.join();
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("ranks 0 and 1 of 2 are on one GPU"));
  }
}

#if defined(STRATA_TEST_NCCL)
// A peer dies mid-collective (FailedPeer): the call fails, the communicator is aborted right away
// (before the caller can free anything), and a cudaFree afterwards, as a store closing its engines
// does while the communicator still exists, returns instead of waiting forever for NCCL's work.
TEST(NcclCommunicator, AFailedCollectiveAbortsBeforeAnyFree) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* engine_memory = nullptr;
  ASSERT_EQ(cudaMalloc(&engine_memory, 1 << 20), cudaSuccess);
  auto made = make_nccl_communicator_from_file(fresh_id_path(), 0, 1);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  g_failed_peer.log.clear();
  g_failed_peer.released.store(false);
  g_failed_peer.armed.store(true);
  std::int64_t v = 1;
  const Status s = made.value()->all_reduce(&v, 1, DataType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  auto freed = std::async(std::launch::async, [&] {
    const cudaError_t e = cudaFree(engine_memory);
    g_failed_peer.note("free returned");
    return e;
  });
  if (freed.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "cudaFree still waits 20 s after the failed collective: the communicator was not aborted";
    g_failed_peer.released.store(true);  // let it return
  }
  EXPECT_EQ(freed.get(), cudaSuccess);
  g_failed_peer.armed.store(false);
  EXPECT_THAT(g_failed_peer.log, ::testing::ElementsAre("collective issued", "remote error", "abort", "free returned"));
  // Broken for good: later calls return the first error, and the destructor has nothing left to abort.
  EXPECT_EQ(made.value()->barrier().code(), StatusCode::kUnavailable);
  made.value().reset();
  EXPECT_THAT(g_failed_peer.log, ::testing::ElementsAre("collective issued", "remote error", "abort", "free returned"));
}
#endif

}  // namespace
}  // namespace strata::dispatch::testing
