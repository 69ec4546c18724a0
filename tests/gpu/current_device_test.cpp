// The emulated device's per-thread current device (gpu/current_device.hpp): every operation makes
// its device current while it runs and restores the caller's, as the cuda backend does with the
// thread's CUDA context (tests/gpu/cuda_context_test.cpp checks that one on a GPU).

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu/current_device.hpp"
#include "gpu/device.hpp"

namespace strata::gpu {
namespace {

// A trainer's "current device", as it would have selected with cudaSetDevice.
constexpr int kCallersDevice = 4242;

// Sets the calling thread's emu current device for a scope (the test's own, not the library's).
struct CallerSelects {
  explicit CallerSelects(int id) : previous(emu_current_device()) { set_emu_current_device(id); }
  ~CallerSelects() { set_emu_current_device(previous); }
  int previous;
};

std::unique_ptr<Device> emu() {
  EmuOptions o;
  o.capacity = std::size_t{16} << 20;
  o.threads = 1;
  auto d = make_emu_device(o);
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  return std::move(d).value();
}

TEST(EmuCurrentDevice, EveryThreadStartsWithNone) {
  int seen = 0;
  std::thread([&] { seen = emu_current_device(); }).join();
  EXPECT_EQ(seen, -1);
  const CallerSelects select(7);
  EXPECT_EQ(emu_current_device(), 7);
  std::thread([&] { seen = emu_current_device(); }).join();
  EXPECT_EQ(seen, -1) << "the current device is per thread";
}

// Each operation of the device interface, issued by a thread whose current device is another one
// (or none): the operations run (they find their device current: an operation that did not make it
// current would fail with a sticky error) and leave the caller's current device as it was.
void exercise_device(int callers) {
  const CallerSelects select(callers);
  auto dev = emu();
  ASSERT_EQ(emu_current_device(), callers);
  auto stream = dev->create_stream();
  ASSERT_TRUE(stream.is_ok());
  const StreamView s = stream.value().view();
  auto event = dev->create_event();
  ASSERT_TRUE(event.is_ok());
  auto device_buf = dev->allocate(256);
  auto pinned = dev->allocate_pinned(256);
  ASSERT_TRUE(device_buf.is_ok() && pinned.is_ok());
  EXPECT_EQ(emu_current_device(), callers);
  std::memset(pinned.value().data(), 7, 256);
  dev->copy_h2d(s, device_buf.value().data(), pinned.value().data(), 256);
  dev->copy_d2d(s, device_buf.value().as<char>() + 128, device_buf.value().data(), 128);
  dev->copy_d2h(s, pinned.value().data(), device_buf.value().as<char>() + 128, 128);
  EXPECT_EQ(emu_current_device(), callers);
  SlotPool pool{device_buf.value().as<float>(), 4, 16, 16, 0};
  RecordInit init;
  dev->init_records(s, pool, 0, 4, init);
  std::atomic<int> on_worker{-2};
  dev->host_task(s, [&] { on_worker = emu_current_device(); });
  dev->record(event.value().view(), s);
  dev->wait(s, event.value().view());
  EXPECT_EQ(emu_current_device(), callers);
  ASSERT_TRUE(dev->synchronize(event.value().view()).is_ok()) << dev->status().to_string();
  ASSERT_TRUE(dev->synchronize(s).is_ok()) << dev->status().to_string();
  EXPECT_TRUE(dev->ready(event.value().view()));
  EXPECT_EQ(emu_current_device(), callers);
  EXPECT_EQ(on_worker.load(), -1) << "a stream worker is a thread of its own";
  float* host_rows = pinned.value().as<float>();
  EXPECT_TRUE(dev->device_address(host_rows).is_ok());
  { const DeviceBuffer freed = std::move(device_buf).value(); }
  EXPECT_EQ(emu_current_device(), callers);
  EXPECT_TRUE(dev->status().is_ok()) << dev->status().to_string();
}

TEST(EmuCurrentDevice, OperationsLeaveTheCallersCurrentDevice) { exercise_device(kCallersDevice); }

TEST(EmuCurrentDevice, OperationsLeaveACallerWithoutCurrentDeviceWithout) { exercise_device(-1); }

TEST(EmuCurrentDevice, OperationsFromSeveralThreadsKeepEachThreadsOwn) {
  auto dev = emu();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const CallerSelects select(100 + t);
      auto stream = dev->create_stream();
      auto buf = dev->allocate(64);
      auto pinned = dev->allocate_pinned(64);
      if (!stream.is_ok() || !buf.is_ok() || !pinned.is_ok()) {
        ++wrong;
        return;
      }
      for (int i = 0; i < 50; ++i) {
        dev->copy_h2d(stream.value().view(), buf.value().data(), pinned.value().data(), 64);
        if (emu_current_device() != 100 + t) ++wrong;
      }
      if (!dev->synchronize(stream.value().view()).is_ok() || emu_current_device() != 100 + t) ++wrong;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(dev->status().is_ok()) << dev->status().to_string();
}

}  // namespace
}  // namespace strata::gpu
