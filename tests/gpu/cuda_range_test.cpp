// Device::check_device_range under cuda: only device memory of the device's own ordinal passes;
// pinned (cudaMallocHost), registered (cudaHostRegister), managed and pageable host memory, and
// memory of another GPU are refused, saying what they are. Skips without a GPU
// (tests/gpu/cuda_gate.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::gpu {
namespace {

void expect_refused(const Status& st, const std::string& what) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message() << "\n  misses: " << what;
}

TEST(CudaCheckDeviceRange, OnlyDeviceMemoryOfItsOrdinalPasses) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto made = make_cuda_device(0, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Device& dev = *made.value();
  auto buf = dev.allocate(4096);
  ASSERT_TRUE(buf.is_ok()) << buf.status().to_string();
  EXPECT_TRUE(dev.check_device_range(buf->data(), 4096).is_ok());
  EXPECT_TRUE(dev.check_device_range(buf->as<char>() + 1024, 1024).is_ok());

  std::vector<float> pageable(1024);
  expect_refused(dev.check_device_range(pageable.data(), 4096), "pageable host memory");

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  expect_refused(dev.check_device_range(pinned, 4096), "pinned host memory");
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);

  std::vector<float> registered(1024);
  ASSERT_EQ(cudaHostRegister(registered.data(), 4096, cudaHostRegisterDefault), cudaSuccess);
  expect_refused(dev.check_device_range(registered.data(), 4096), "pinned host memory");
  EXPECT_EQ(cudaHostUnregister(registered.data()), cudaSuccess);

  void* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 4096), cudaSuccess);
  expect_refused(dev.check_device_range(managed, 4096), "managed memory");
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
}

TEST(CudaCheckDeviceRange, MemoryOfAnotherGpuIsRefused) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "needs two GPUs";
  auto first = make_cuda_device(0, std::size_t{64} << 20);
  auto second = make_cuda_device(1, std::size_t{64} << 20);
  ASSERT_TRUE(first.is_ok() && second.is_ok());
  auto buf = second.value()->allocate(4096);
  ASSERT_TRUE(buf.is_ok()) << buf.status().to_string();
  expect_refused(first.value()->check_device_range(buf->data(), 4096), "device memory of CUDA device 1");
}

}  // namespace
}  // namespace strata::gpu
