// The cuda backend never changes the calling thread's current device or context
// (gpu/cuda/device_scope.hpp). Built with the CUDA backend only; skips without a GPU
// (tests/gpu/cuda_gate.hpp).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/cuda/device_scope.hpp"
#include "gpu/current_device.hpp"
#include "gpu/device.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::gpu {
namespace {

// What the calling thread has current: its runtime device and its driver context.
struct Current {
  int device = -1;
  CUcontext context = nullptr;
  bool operator==(const Current& o) const { return device == o.device && context == o.context; }
};
Current current() {
  Current c;
  EXPECT_EQ(cudaGetDevice(&c.device), cudaSuccess);
  auto ctx = cuda_detail::current_context();
  EXPECT_TRUE(ctx.is_ok()) << ctx.status().to_string();
  if (ctx.is_ok()) c.context = ctx.value();
  return c;
}

int visible() {
  int n = 0;
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  return n;
}

// Every kind of device operation on device `ordinal`, each followed by a check that the calling
// thread's device and context are what they were before the first.
void exercise(int ordinal) {
  const Current before = current();
  auto made = make_cuda_device(ordinal, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_EQ(current(), before) << "make_cuda_device";
  auto& dev = *made.value();
  {
    auto stream = dev.create_stream();
    auto event = dev.create_event();
    auto buf = dev.allocate(1024);
    auto pinned = dev.allocate_pinned(1024);
    ASSERT_TRUE(stream.is_ok() && event.is_ok() && buf.is_ok() && pinned.is_ok());
    EXPECT_EQ(current(), before) << "create_stream, create_event, allocate, allocate_pinned";
    const StreamView s = stream.value().view();
    std::memset(pinned.value().data(), 3, 1024);
    dev.copy_h2d(s, buf.value().data(), pinned.value().data(), 1024);
    dev.copy_d2d(s, buf.value().as<char>() + 512, buf.value().data(), 512);
    dev.copy_d2h(s, pinned.value().data(), buf.value().as<char>() + 512, 512);
    SlotPool pool{buf.value().as<float>(), 16, 16, 16, 0};
    dev.init_records(s, pool, 0, 16, RecordInit{});
    dev.host_task(s, [] {});
    dev.record(event.value().view(), s);
    dev.wait(s, event.value().view());
    EXPECT_EQ(current(), before) << "copies, kernels, host tasks, events";
    EXPECT_TRUE(dev.synchronize(s).is_ok()) << dev.status().to_string();
    EXPECT_TRUE(dev.synchronize(event.value().view()).is_ok());
    (void)dev.ready(event.value().view());
    std::vector<float> host(256);
    ASSERT_TRUE(dev.pinner().pin(host.data(), host.size() * sizeof(float)).is_ok());
    EXPECT_TRUE(dev.device_address(host.data()).is_ok());
    dev.pinner().unpin(host.data(), host.size() * sizeof(float));
    EXPECT_EQ(current(), before) << "synchronize, ready, pin, device_address, unpin";
  }  // frees, destroys the stream and the event
  EXPECT_EQ(current(), before) << "frees and destruction";
  EXPECT_TRUE(dev.status().is_ok()) << dev.status().to_string();
}

TEST(CudaCurrentDevice, OperationsLeaveTheCallersDeviceAndContext) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const int n = visible();
  // The caller selected its last GPU; the store's device is its first (the same one on one GPU).
  ASSERT_EQ(cudaSetDevice(n - 1), cudaSuccess);
  exercise(0);
  auto now = cuda_current_device();
  ASSERT_TRUE(now.is_ok());
  EXPECT_EQ(now.value(), n - 1);
}

// Driver functions for tests, in their CUDA 12.0 forms (no libcuda link, as device_scope.cpp).
template <class F>
F driver_fn(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q), cudaSuccess) << name;
  EXPECT_EQ(q, cudaDriverEntryPointSuccess) << name;
  return reinterpret_cast<F>(p);
}

// On one GPU too: a caller whose current context is its own (cuCtxCreate, not the primary one)
// has it current again after every Strata operation, and a stream of that context is refused by
// wrap_stream as a stream of another context of the same device.
TEST(CudaCurrentDevice, AUserContextIsCurrentAgainAfterStrata) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  std::thread([] {
    auto ctx_create = driver_fn<CUresult(CUDAAPI*)(CUcontext*, unsigned, CUdevice)>("cuCtxCreate");
    auto ctx_destroy = driver_fn<CUresult(CUDAAPI*)(CUcontext)>("cuCtxDestroy");
    auto device_get = driver_fn<CUresult(CUDAAPI*)(CUdevice*, int)>("cuDeviceGet");
    ASSERT_TRUE(ctx_create && ctx_destroy && device_get);
    CUdevice d0 = 0;
    ASSERT_EQ(device_get(&d0, 0), CUDA_SUCCESS);
    CUcontext mine = nullptr;
    ASSERT_EQ(ctx_create(&mine, 0, d0), CUDA_SUCCESS);  // and makes it current
    ASSERT_EQ(cuda_detail::current_context().value(), mine);
    exercise(0);  // asserts after each step that the device and context are the caller's
    EXPECT_EQ(cuda_detail::current_context().value(), mine);
    {
      cudaStream_t theirs = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&theirs, cudaStreamNonBlocking), cudaSuccess);  // in `mine`
      auto made = make_cuda_device(0, std::size_t{64} << 20);
      ASSERT_TRUE(made.is_ok()) << made.status().to_string();
      auto r = made.value()->wrap_stream(theirs);
      ASSERT_FALSE(r.is_ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("CUDA device 0 in a context other than its primary context"),
                std::string::npos)
          << r.status().to_string();
      EXPECT_EQ(cuda_detail::current_context().value(), mine);
      EXPECT_EQ(cudaStreamDestroy(theirs), cudaSuccess);
    }
    EXPECT_EQ(ctx_destroy(mine), CUDA_SUCCESS);
  }).join();
}

// A thread that never used CUDA has no context current: after Strata's operations it still has
// none (a guard that restored with cudaSetDevice would leave a primary context current, and on
// CUDA 12 and later create one on device 0 when the store is elsewhere).
TEST(CudaCurrentDevice, ACallerWithoutContextKeepsNone) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const int n = visible();
  std::thread([n] {
    auto ctx = cuda_detail::current_context();
    ASSERT_TRUE(ctx.is_ok());
    ASSERT_EQ(ctx.value(), nullptr) << "a fresh thread has no current context";
    exercise(n - 1);
    EXPECT_EQ(cuda_detail::current_context().value(), nullptr);
  }).join();
}

// The guard itself: nested scopes restore in order; the caller's context comes back.
TEST(CudaCurrentDevice, ScopesNestAndRestore) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const int n = visible();
  std::thread([n] {
    auto first = cuda_detail::PrimaryContext::retain(0);
    auto last = cuda_detail::PrimaryContext::retain(n - 1);
    ASSERT_TRUE(first.is_ok() && last.is_ok());
    {
      const cuda_detail::DeviceScope a(first.value());
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      EXPECT_EQ(cuda_detail::current_context().value(), first.value().get());
      EXPECT_EQ(cuda_current_device().value(), 0);
      {
        const cuda_detail::DeviceScope b(last.value());
        ASSERT_TRUE(b.ok());
        EXPECT_EQ(cuda_detail::current_context().value(), last.value().get());
        EXPECT_EQ(cuda_current_device().value(), n - 1);
      }
      EXPECT_EQ(cuda_detail::current_context().value(), first.value().get());
    }
    EXPECT_EQ(cuda_detail::current_context().value(), nullptr);
  }).join();
}

// ---- Device::wrap_stream ----

struct Gate {
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
};
void CUDART_CB wait_gate(void* g) { static_cast<Gate*>(g)->gate.wait(); }

TEST(CudaWrapStream, WorkIsOrderedAfterTheCallersAndTheStreamOutlivesTheWrapper) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto made = make_cuda_device(0, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Device& dev = *made.value();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const Current before = current();
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  auto buf = dev.allocate(4096);
  auto pinned = dev.allocate_pinned(4096);
  ASSERT_TRUE(buf.is_ok() && pinned.is_ok());
  std::memset(pinned.value().data(), 0, 4096);
  Gate gate;
  std::mutex m;
  std::vector<int> log;
  {
    auto wrapped = dev.wrap_stream(mine);
    ASSERT_TRUE(wrapped.is_ok()) << wrapped.status().to_string();
    EXPECT_EQ(wrapped.value().view().device(), &dev);
    EXPECT_EQ(current(), before);
    // The caller's work: held back by a gate, then a memset. Strata's, on the wrapper: a log
    // entry and a copy out, which must see the memset.
    ASSERT_EQ(cudaLaunchHostFunc(mine, wait_gate, &gate), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(buf.value().data(), 0x5a, 4096, mine), cudaSuccess);
    dev.host_task(wrapped.value().view(), [&] {
      std::lock_guard<std::mutex> lock(m);
      log.push_back(2);
    });
    dev.copy_d2h(wrapped.value().view(), pinned.value().data(), buf.value().data(), 4096);
    {
      std::lock_guard<std::mutex> lock(m);
      log.push_back(1);  // before the gate opens, nothing of the wrapper's ran
    }
    gate.go.set_value();
    ASSERT_TRUE(dev.synchronize(wrapped.value().view()).is_ok()) << dev.status().to_string();
  }  // destroys the wrapper only
  EXPECT_EQ(log, (std::vector<int>{1, 2}));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(pinned.value().as<unsigned char>()[i], 0x5a) << i;
  EXPECT_EQ(cudaStreamQuery(mine), cudaSuccess) << "the caller's stream is still alive";
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
  EXPECT_TRUE(dev.status().is_ok()) << dev.status().to_string();
}

// A host task queued on a wrapped stream may run after its device is gone (the wrapper and the
// device do not wait for it): it must not read the device. The freed device's memory is reused
// and filled with 0xff first, so a task that read the device's failed flag from it would see
// "failed" and be skipped (and ASan reports the read).
TEST(CudaWrapStream, AHostTaskMayOutliveTheDevice) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  Gate gate;
  std::atomic<int> ran{0};
  {
    auto made = make_cuda_device(0, std::size_t{64} << 20);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    Device& dev = *made.value();
    auto wrapped = dev.wrap_stream(mine);
    ASSERT_TRUE(wrapped.is_ok()) << wrapped.status().to_string();
    ASSERT_EQ(cudaLaunchHostFunc(mine, wait_gate, &gate), cudaSuccess);
    dev.host_task(wrapped.value().view(), [&ran] { ++ran; });
  }  // the wrapper, then the device: neither waits
  std::vector<std::vector<unsigned char>> reuse;
  for (int round = 0; round < 4; ++round)
    for (std::size_t n = 16; n <= 4096; n += 16) reuse.emplace_back(n, 0xff);
  gate.go.set_value();
  ASSERT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
}

// The legacy default stream, not just some blocking stream: work on it waits for work queued
// before on every blocking stream (here the caller's `other`, held by a gate), which a blocking
// stream of Strata's own would not.
TEST(CudaWrapStream, NullptrIsTheLegacyDefaultStream) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto made = make_cuda_device(0, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Device& dev = *made.value();
  auto buf = dev.allocate(1024);
  auto pinned = dev.allocate_pinned(1024);
  ASSERT_TRUE(buf.is_ok() && pinned.is_ok());
  Stream legacy = std::move(dev.wrap_stream(nullptr)).value();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buf.value().data(), 0x33, 1024, cudaStreamLegacy), cudaSuccess);
  dev.copy_d2h(legacy.view(), pinned.value().data(), buf.value().data(), 1024);
  ASSERT_TRUE(dev.synchronize(legacy.view()).is_ok()) << dev.status().to_string();
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(pinned.value().as<unsigned char>()[i], 0x33) << i;
  EXPECT_TRUE(dev.wrap_stream(static_cast<void*>(cudaStreamLegacy)).is_ok());

  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);  // blocking: the legacy stream waits for it
  Gate gate;
  std::mutex m;
  std::vector<int> log;
  ASSERT_EQ(cudaLaunchHostFunc(other, wait_gate, &gate), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buf.value().data(), 0x44, 1024, other), cudaSuccess);
  dev.host_task(legacy.view(), [&] {
    std::lock_guard<std::mutex> lock(m);
    log.push_back(2);
  });
  dev.copy_d2h(legacy.view(), pinned.value().data(), buf.value().data(), 1024);
  {
    std::lock_guard<std::mutex> lock(m);
    log.push_back(1);  // the gate is still shut: nothing on the legacy stream ran
  }
  gate.go.set_value();
  ASSERT_TRUE(dev.synchronize(legacy.view()).is_ok()) << dev.status().to_string();
  EXPECT_EQ(log, (std::vector<int>{1, 2}));
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(pinned.value().as<unsigned char>()[i], 0x44) << i;
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

TEST(CudaWrapStream, PerThreadDefaultStreamIsRefused) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  auto made = make_cuda_device(0, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  auto r = made.value()->wrap_stream(static_cast<void*>(cudaStreamPerThread));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cudaStreamPerThread"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(made.value()->status().is_ok()) << "a refused wrap is no device error";
}

TEST(CudaWrapStream, AStreamOfAnotherDeviceIsRefused) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  if (visible() < 2) GTEST_SKIP() << "needs two GPUs";
  auto made = make_cuda_device(0, std::size_t{64} << 20);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t theirs = nullptr;
  ASSERT_EQ(cudaStreamCreate(&theirs), cudaSuccess);
  auto r = made.value()->wrap_stream(theirs);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("CUDA device 1"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(cuda_current_device().value(), 1);
  EXPECT_EQ(cudaStreamDestroy(theirs), cudaSuccess);
}

}  // namespace
}  // namespace strata::gpu
