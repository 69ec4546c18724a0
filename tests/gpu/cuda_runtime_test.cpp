// The cuda backend and the CUDA runtime's state (gpu/cuda/kernels.cu, cuda_device.cpp): a C++
// trainer that links the same static CUDA runtime reads its own errors with cudaGetLastError, so a
// launch must neither clear an error the trainer left pending nor leave its own behind; each
// kernel's grid comes from its occupancy on the GPU; a copy between two GPUs turns peer access on
// where they allow it. Built with the CUDA backend; needs a GPU (two for peer access). Without a
// GPU nothing here can be tested: with no driver the runtime's error (cudaErrorInsufficientDriver)
// is sticky, so no call clears it, and a launch that left its error behind looks the same as one
// that did not.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gpu/cuda/kernels.cuh"
#include "gpu/device.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::gpu {
namespace {

using cuda_detail::Kernel;
using cuda_detail::KernelGrids;

// On a GPU: the caller's pending error survives kernels that run, and their results are right.
TEST(CudaLaunch, KernelsKeepTheCallersPendingError) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto made = make_cuda_device(0);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Device& dev = *made.value();
  auto stream = dev.create_stream();
  ASSERT_TRUE(stream.is_ok());
  auto buf = dev.allocate(16 * 16 * sizeof(float));
  ASSERT_TRUE(buf.is_ok());
  ASSERT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);  // the caller's failed call
  ASSERT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  const SlotPool pool{buf.value().as<float>(), 16, 16, 16, 0};
  dev.init_records(stream.value().view(), pool, 0, 16, RecordInit{});
  EXPECT_TRUE(dev.synchronize(stream.value().view()).is_ok()) << dev.status().to_string();
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice) << "a launch cleared the caller's pending error";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

// On a GPU: every kernel fits at least one block per multiprocessor, at most as many as its
// threads allow (2048 a multiprocessor on sm_80 and sm_90); the figures go to the test's XML.
TEST(CudaLaunch, GridsComeFromEachKernelsOccupancy) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  int before = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int sms = 0, threads = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, 0), cudaSuccess);
  KernelGrids grids;
  ASSERT_EQ(cuda_detail::query_kernel_grids(sms, &grids), cudaSuccess);
  EXPECT_EQ(grids.sm_count, sms);
  for (int k = 0; k < cuda_detail::kKernelCount; ++k) {
    const auto kernel = static_cast<Kernel>(k);
    const int blocks = grids.blocks_per_sm[k];
    ::testing::Test::RecordProperty(std::string("blocks_per_sm:") + cuda_detail::kernel_name(kernel), blocks);
    EXPECT_GE(blocks, 1) << cuda_detail::kernel_name(kernel);
    EXPECT_LE(blocks * cuda_detail::kernel_block(kernel), threads) << cuda_detail::kernel_name(kernel);
    EXPECT_EQ(grids.max_blocks(kernel), static_cast<long long>(blocks) * sms);
  }
  ASSERT_EQ(cudaSetDevice(before), cudaSuccess);
}

// Two GPUs that can reach each other: the first copy between them turns peer access on (so it is
// direct, not staged through host memory), and the bytes arrive.
TEST(CudaPeerAccess, APeerCopyTurnsItOnWhereTheGpusAllowIt) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  if (cuda_devices().value() < 2) GTEST_SKIP() << "needs two GPUs";
  int can = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  if (!can) GTEST_SKIP() << "GPU 0 cannot reach GPU 1's memory (cudaDeviceCanAccessPeer)";
  auto dev0 = make_cuda_device(0), dev1 = make_cuda_device(1);
  ASSERT_TRUE(dev0.is_ok() && dev1.is_ok());
  auto s0 = dev0.value()->create_stream(), s1 = dev1.value()->create_stream();
  ASSERT_TRUE(s0.is_ok() && s1.is_ok());
  constexpr std::size_t kBytes = 1 << 20;
  auto dst = dev0.value()->allocate(kBytes), src = dev1.value()->allocate(kBytes);
  auto host = dev1.value()->allocate_pinned(kBytes);
  ASSERT_TRUE(dst.is_ok() && src.is_ok() && host.is_ok());
  std::memset(host.value().data(), 0x5a, kBytes);
  dev1.value()->copy_h2d(s1.value().view(), src.value().data(), host.value().data(), kBytes);
  ASSERT_TRUE(dev1.value()->synchronize(s1.value().view()).is_ok());
  std::memset(host.value().data(), 0, kBytes);
  dev0.value()->copy_peer(s0.value().view(), dst.value().data(), *dev1.value(), src.value().data(), kBytes);
  ASSERT_TRUE(dev0.value()->synchronize(s0.value().view()).is_ok()) << dev0.value()->status().to_string();
  dev1.value()->copy_d2h(s1.value().view(), host.value().data(), src.value().data(), kBytes);
  ASSERT_TRUE(dev1.value()->synchronize(s1.value().view()).is_ok());
  std::vector<unsigned char> want(kBytes, 0x5a);
  EXPECT_EQ(std::memcmp(host.value().data(), want.data(), kBytes), 0);
  int before = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // GPU 0's primary context, which the device uses
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled) << "the copy left peer access off";
  (void)cudaGetLastError();
  ASSERT_EQ(cudaSetDevice(before), cudaSuccess);
}

}  // namespace
}  // namespace strata::gpu
