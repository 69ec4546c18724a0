// Device::wrap_stream on the emulated device: the native handle of an emu stream is its
// StreamView::state(); nullptr is the device's default stream; anything else, and a stream of
// another device, is refused. (tests/gpu/cuda_context_test.cpp has the cuda backend's.)

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <vector>

#include "gpu/current_device.hpp"
#include "gpu/device.hpp"

namespace strata::gpu {
namespace {

std::unique_ptr<Device> emu() {
  EmuOptions o;
  o.capacity = std::size_t{1} << 20;
  o.threads = 1;
  auto d = make_emu_device(o);
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  return std::move(d).value();
}

// Appends to a list from stream tasks.
struct Log {
  std::mutex m;
  std::vector<int> v;
  void add(int x) {
    std::lock_guard<std::mutex> lock(m);
    v.push_back(x);
  }
};

// Work that holds its stream until open() and then logs `value`: what comes after it on the same
// stream cannot run before it.
class Held {
 public:
  Held(Device& dev, StreamView s, Log& log, int value) {
    dev.host_task(s, [gate = gate_, &log, value] {
      gate.wait();
      log.add(value);
    });
  }
  void open() { go_.set_value(); }

 private:
  std::promise<void> go_;
  std::shared_future<void> gate_ = go_.get_future().share();
};

TEST(EmuWrapStream, WorkOnTheWrapperIsOrderedAfterTheOwnersWork) {
  auto dev = emu();
  Stream owner = std::move(dev->create_stream()).value();
  EXPECT_EQ(owner.view().device(), dev.get());
  Log log;
  Held first(*dev, owner.view(), log, 1);
  auto wrapped = dev->wrap_stream(owner.view().state());
  ASSERT_TRUE(wrapped.is_ok()) << wrapped.status().to_string();
  EXPECT_EQ(wrapped.value().view().device(), dev.get());
  dev->host_task(wrapped.value().view(), [&] { log.add(2); });
  first.open();
  ASSERT_TRUE(dev->synchronize(wrapped.value().view()).is_ok());
  EXPECT_EQ(log.v, (std::vector<int>{1, 2}));
  // Work on the wrapper is work on the owner's stream: the owner's synchronize waits for it.
  Held third(*dev, wrapped.value().view(), log, 3);
  third.open();
  ASSERT_TRUE(dev->synchronize(owner.view()).is_ok());
  EXPECT_EQ(log.v, (std::vector<int>{1, 2, 3}));
}

TEST(EmuWrapStream, DestroyingTheWrapperLeavesTheStream) {
  auto dev = emu();
  Stream owner = std::move(dev->create_stream()).value();
  Log log;
  Held first(*dev, owner.view(), log, 1);
  {
    Stream wrapped = std::move(dev->wrap_stream(owner.view().state())).value();
    dev->host_task(wrapped.view(), [&] { log.add(2); });
  }  // returns while the work is blocked: the wrapper does not wait for it
  first.open();
  dev->host_task(owner.view(), [&] { log.add(3); });
  ASSERT_TRUE(dev->synchronize(owner.view()).is_ok());
  EXPECT_EQ(log.v, (std::vector<int>{1, 2, 3}));
  // A wrapper of a wrapper reaches the same stream.
  Stream w1 = std::move(dev->wrap_stream(owner.view().state())).value();
  auto w2 = dev->wrap_stream(w1.view().state());
  ASSERT_TRUE(w2.is_ok()) << w2.status().to_string();
  dev->host_task(w2.value().view(), [&] { log.add(4); });
  ASSERT_TRUE(dev->synchronize(owner.view()).is_ok());
  EXPECT_EQ(log.v, (std::vector<int>{1, 2, 3, 4}));
}

TEST(EmuWrapStream, NullptrIsTheDevicesDefaultStream) {
  auto dev = emu();
  Stream a = std::move(dev->wrap_stream(nullptr)).value();
  Stream b = std::move(dev->wrap_stream(nullptr)).value();
  Log log;
  Held first(*dev, a.view(), log, 1);
  dev->host_task(b.view(), [&] { log.add(2); });
  first.open();
  ASSERT_TRUE(dev->synchronize(b.view()).is_ok());
  EXPECT_EQ(log.v, (std::vector<int>{1, 2})) << "both wrappers issue to one stream";
}

TEST(EmuWrapStream, AForeignHandleIsRefused) {
  auto dev = emu();
  int not_a_stream = 0;
  auto r = dev->wrap_stream(&not_a_stream);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a live emu stream"), std::string::npos) << r.status().to_string();
  // A stream that was destroyed is no stream any more.
  void* gone = nullptr;
  {
    Stream s = std::move(dev->create_stream()).value();
    gone = s.view().state();
  }
  auto g = dev->wrap_stream(gone);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev->status().is_ok()) << "a refused wrap is no device error";
}

TEST(EmuWrapStream, AStreamOfAnotherDeviceIsRefused) {
  auto dev = emu();
  auto other = emu();
  Stream theirs = std::move(other->create_stream()).value();
  EXPECT_EQ(theirs.view().device(), other.get());
  auto r = dev->wrap_stream(theirs.view().state());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("a stream of emu device"), std::string::npos) << r.status().to_string();
  // Their default stream too.
  Stream their_default = std::move(other->wrap_stream(nullptr)).value();
  EXPECT_FALSE(dev->wrap_stream(their_default.view().state()).is_ok());
}

// The default stream lives as long as its device: destroying the device with work still queued
// there, unsynchronized, runs that work while the device is whole. The tasks reach the fault
// injector and the sticky error (op 2 faults, later ops are skipped); with the default stream
// destroyed after those members, they were used after their destruction (under ASan: the
// fault's status, written into the destroyed error, leaked).
TEST(EmuWrapStream, DestroyingTheDeviceRunsItsDefaultStreamsWorkFirst) {
  EmuOptions o;
  o.capacity = std::size_t{1} << 20;
  o.threads = 1;
  o.fail_after_ops = 2;
  auto made = make_emu_device(o);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  std::unique_ptr<Device> dev = std::move(made).value();
  std::atomic<int> ran{0};
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  {
    Stream def = std::move(dev->wrap_stream(nullptr)).value();
    dev->host_task(def.view(), [gate, &ran] {
      gate.wait();
      ++ran;
    });
    for (int i = 0; i < 8; ++i) dev->host_task(def.view(), [&ran] { ++ran; });
  }  // the wrapper does not wait
  go.set_value();
  dev.reset();  // the worker is still waking up: the tasks run inside the destructor
  EXPECT_EQ(ran.load(), 2) << "ops 0 and 1 run, op 2 faults, the rest are skipped";
}

// Every operation that takes a stream refuses one of another device: nothing runs, and the
// sticky error names the operation.
TEST(EmuWrapStream, OperationsRefuseAStreamOfAnotherDevice) {
  auto dev = emu();
  auto other = emu();
  Stream theirs = std::move(other->create_stream()).value();
  Event e = std::move(dev->create_event()).value();
  auto pinned = dev->allocate_pinned(64);
  auto buf = dev->allocate(64);
  ASSERT_TRUE(pinned.is_ok() && buf.is_ok());
  std::atomic<bool> ran{false};
  dev->host_task(theirs.view(), [&ran] { ran = true; });
  Status st = dev->status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("host_task on a stream of another device"), std::string::npos) << st.to_string();
  dev->copy_h2d(theirs.view(), buf.value().data(), pinned.value().data(), 64);
  dev->record(e.view(), theirs.view());
  dev->wait(theirs.view(), e.view());
  EXPECT_EQ(dev->synchronize(theirs.view()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(other->synchronize(theirs.view()).is_ok()) << other->status().to_string();
  EXPECT_FALSE(ran) << "the task ran on the other device's stream";
  EXPECT_EQ(dev->counters().snapshot().h2d, 0u) << "a refused copy is not counted";
  EXPECT_TRUE(other->status().is_ok()) << "the other device is not at fault";
  // Each operation names itself (a fresh device per operation: the error is sticky).
  auto third = emu();
  third->copy_d2h(theirs.view(), pinned.value().data(), buf.value().data(), 64);
  EXPECT_NE(third->status().message().find("copy_d2h on a stream of another device"), std::string::npos)
      << third->status().to_string();
  auto fourth = emu();
  fourth->init_records(StreamView(), SlotPool{}, 0, 1, RecordInit{});
  EXPECT_NE(fourth->status().message().find("init_records on an empty stream view"), std::string::npos)
      << fourth->status().to_string();
}

TEST(EmuWrapStream, LeavesTheCallersCurrentDevice) {
  auto dev = emu();
  set_emu_current_device(77);
  Stream owner = std::move(dev->create_stream()).value();
  auto w = dev->wrap_stream(owner.view().state());
  auto bad = dev->wrap_stream(&owner);
  EXPECT_TRUE(w.is_ok());
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(emu_current_device(), 77);
  set_emu_current_device(-1);
}

}  // namespace
}  // namespace strata::gpu
