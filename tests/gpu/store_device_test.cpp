// A store never changes the calling thread's current device: on emu (gpu/current_device.hpp) for
// one rank and for thread ranks of a world, and on a GPU (skipped without one), where it also opens
// the caller's device with ordinal "current" and leaves the caller's device and context as they were.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "gpu/current_device.hpp"
#include "store/store.hpp"
#include "tests/gpu/cuda_gate.hpp"
#if defined(STRATA_TEST_CUDA)
#include <cuda_runtime_api.h>

#include "gpu/cuda/device_scope.hpp"
#endif

namespace strata {
namespace {

StoreConfig config(Placement placement, BackendChoice backend) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = backend;
  c.cache.max_in_flight = 2;
  TableConfig t;
  t.spec.name = "t";
  t.spec.rows = 4096;
  t.spec.dim = 16;
  t.placement = placement;
  t.spec.optimizer.kind = OptimizerKind::kAdagrad;
  if (placement == Placement::kCached) t.cache.fraction = 0.25;
  if (placement == Placement::kGpu) t.sharding.type = dispatch::ShardingType::kRow;
  c.tables.push_back(t);
  return c;
}

KeyBatch batch(int step) {
  JaggedKeys f;
  f.table = "t";
  f.offsets = {0};
  for (int b = 0; b < 8; ++b) {
    for (int k = 0; k < 4; ++k) f.keys.push_back(static_cast<Key>((step * 131 + b * 17 + k * 7) % 4096));
    f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
  }
  KeyBatch kb;
  kb.features.push_back(std::move(f));
  return kb;
}

// A few steps of training and the calls around them, each followed by `check()` (which asserts
// that the caller's current device is what it selected).
template <class Check>
void train(Store& store, Check check) {
  std::vector<float> out(8 * 16), grad(8 * 16, 0.25f);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(store.submit(step, batch(step)).is_ok());
    check("submit");
    ASSERT_TRUE(store.forward(step, {MatrixView{out.data(), 8, 16}}).is_ok());
    check("forward");
    ASSERT_TRUE(store.backward(step, {ConstMatrixView{grad.data(), 8, 16}}).is_ok());
    check("backward");
  }
  ASSERT_TRUE(store.flush().is_ok());
  check("flush");
  std::vector<float> rows(4 * 16);
  ASSERT_TRUE(store.read_rows(0, 0, 4, rows.data(), nullptr).is_ok());
  check("read_rows");
}

TEST(StoreLeavesTheCurrentDevice, EmuOneRank) {
  for (Placement p : {Placement::kCached, Placement::kOffload, Placement::kGpu}) {
    SCOPED_TRACE(to_string(p));
    gpu::set_emu_current_device(31);
    auto check = [](const char* call) { EXPECT_EQ(gpu::emu_current_device(), 31) << call; };
    {
      auto store = Store::open(config(p, BackendChoice::kEmu));
      ASSERT_TRUE(store.is_ok()) << store.status().to_string();
      check("open");
      train(*store.value(), check);
    }
    check("close");
    gpu::set_emu_current_device(-1);
  }
}

TEST(StoreLeavesTheCurrentDevice, EmuThreadRanks) {
  auto group = dispatch::make_local_group(2);
  ASSERT_TRUE(group.is_ok());
  std::vector<std::shared_ptr<dispatch::Communicator>> comms;
  for (auto& c : group.value()) comms.emplace_back(std::move(c));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const int mine = 50 + r;  // each rank's thread selected its own
      gpu::set_emu_current_device(mine);
      auto check = [mine, r](const char* call) {
        EXPECT_EQ(gpu::emu_current_device(), mine) << "rank " << r << ": " << call;
      };
      {
        auto store = Store::open(config(Placement::kGpu, BackendChoice::kEmu), comms[static_cast<std::size_t>(r)]);
        ASSERT_TRUE(store.is_ok()) << store.status().to_string();
        check("open");
        train(*store.value(), check);
      }
      check("close");
    });
  }
  for (auto& t : ranks) t.join();
}

#if defined(STRATA_TEST_CUDA)
struct CudaCurrent {
  int device = -1;
  CUcontext context = nullptr;
};
CudaCurrent cuda_current() {
  CudaCurrent c;
  EXPECT_EQ(cudaGetDevice(&c.device), cudaSuccess);
  c.context = gpu::cuda_detail::current_context().value();
  return c;
}

// The caller selects its last GPU; the store opens "current" there, trains, and leaves the
// caller's device and context as they were (also on a thread that had no context at all).
TEST(StoreLeavesTheCurrentDevice, CudaOrdinalCurrentOpensTheCallersDevice) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  std::thread([n] {
    ASSERT_EQ(cudaSetDevice(n - 1), cudaSuccess);
    const CudaCurrent before = cuda_current();
    std::size_t free_before = 0, free_after = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    StoreConfig c = config(Placement::kGpu, BackendChoice::kCuda);
    c.tables[0].spec.rows = std::int64_t{1} << 20;  // 64 MiB of weights, as much of state
    c.device.ordinal = kDeviceOrdinalCurrent;
    auto check = [&](const char* call) {
      const CudaCurrent now = cuda_current();
      EXPECT_EQ(now.device, before.device) << call;
      EXPECT_EQ(now.context, before.context) << call;
    };
    {
      auto store = Store::open(c);
      ASSERT_TRUE(store.is_ok()) << store.status().to_string();
      check("open");
      ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
      // Signed: another process freeing memory meanwhile must not wrap around into a pass.
      EXPECT_GE(static_cast<long long>(free_before) - static_cast<long long>(free_after), 64LL << 20)
          << "the table lives on the caller's GPU " << n - 1;
      train(*store.value(), check);
    }
    check("close");
  }).join();
  std::thread([] {
    ASSERT_EQ(gpu::cuda_detail::current_context().value(), nullptr);
    {
      auto store = Store::open(config(Placement::kCached, BackendChoice::kCuda));
      ASSERT_TRUE(store.is_ok()) << store.status().to_string();
      train(*store.value(),
            [](const char* call) { EXPECT_EQ(gpu::cuda_detail::current_context().value(), nullptr) << call; });
    }
    EXPECT_EQ(gpu::cuda_detail::current_context().value(), nullptr) << "close";
  }).join();
}

// Strata may be the first and only user of a GPU: a thread that never used CUDA opens a store,
// closes it, and the device's primary context stays initialized (the runtime holds it too), so
// that a store opened again runs its kernels on valid runtime state.
TEST(StoreLeavesTheCurrentDevice, CudaCloseAndReopenOnAFreshThread) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  std::thread([] {
    ASSERT_EQ(gpu::cuda_detail::current_context().value(), nullptr);
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &p, 12000, cudaEnableDefault, &q),
              cudaSuccess);
    ASSERT_EQ(q, cudaDriverEntryPointSuccess);
    auto get_state = reinterpret_cast<CUresult(CUDAAPI*)(CUdevice, unsigned*, int*)>(p);
    ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuDeviceGet", &p, 12000, cudaEnableDefault, &q), cudaSuccess);
    CUdevice d0 = 0;
    ASSERT_EQ(reinterpret_cast<CUresult(CUDAAPI*)(CUdevice*, int)>(p)(&d0, 0), CUDA_SUCCESS);
    StoreConfig c = config(Placement::kGpu, BackendChoice::kCuda);
    c.device.ordinal = 0;
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(round == 0 ? "first open" : "reopen");
      {
        auto store = Store::open(c);
        ASSERT_TRUE(store.is_ok()) << store.status().to_string();
        train(*store.value(), [](const char*) {});
      }
      unsigned flags = 0;
      int active = 0;
      ASSERT_EQ(get_state(d0, &flags, &active), CUDA_SUCCESS);
      EXPECT_EQ(active, 1) << "closing the store released the last hold of the primary context";
    }
    EXPECT_EQ(gpu::cuda_detail::current_context().value(), nullptr);
  }).join();
}
#endif

}  // namespace
}  // namespace strata
