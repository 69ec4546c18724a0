// The emu device refuses what a real GPU refuses, so that tests without a GPU catch the bugs a GPU
// would expose: host access to device memory dies, copies check their direction and that their
// host side is pinned, kernels check that they can reach their pointers, and the pinner keeps
// the registered ranges as cudaHostRegister does. Frees wait for the device, as cudaFree does.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/record_layout.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "host/host_table.hpp"
#include "tests/gpu/stream_gate.hpp"

namespace strata::gpu {
namespace {

class EmuStrictTest : public testing::Test {
 protected:
  void SetUp() override {
    EmuOptions o;
    o.capacity = std::size_t{16} << 20;
    o.threads = 1;
    dev_ = make_emu_device(o).value();
    s_ = dev_->create_stream().value();
  }
  StreamView s() const { return s_.view(); }
  // The sticky error after the stream ran, expected to name every piece of `parts`.
  void expect_refused(const std::vector<std::string>& parts) {
    const Status st = dev_->synchronize(s());
    ASSERT_FALSE(st.is_ok()) << "expected the device to refuse the operation";
    EXPECT_EQ(st.code(), StatusCode::kInternal);
    for (const std::string& p : parts)
      EXPECT_NE(st.message().find(p), std::string::npos) << st.message() << "\nlacks: " << p;
  }
  std::unique_ptr<Device> dev_;
  Stream s_;
};

// Page-aligned host memory, not pinned (as a NumaArena mapping is before registration).
struct HostPages {
  explicit HostPages(std::size_t n) : bytes(n), p(static_cast<char*>(std::aligned_alloc(4096, n))) {}
  ~HostPages() { std::free(p); }
  std::size_t bytes;
  char* p;
};

TEST_F(EmuStrictTest, HostStoreThroughDevicePointerDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the device has worker threads
  auto buf = dev_->allocate(4096).value();
  EXPECT_DEATH(
      {
        volatile float* p = buf.as<float>() + 3;
        *p = 1.0f;
      },
      "");
}

TEST_F(EmuStrictTest, HostLoadAndMemcpyFromDevicePointerDie) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto buf = dev_->allocate(4096).value();
  EXPECT_DEATH(
      {
        volatile const int* p = buf.as<int>();
        std::exit(*p == 12345 ? 3 : 4);
      },
      "");
  std::vector<char> host(4096);
  EXPECT_DEATH(std::memcpy(host.data(), buf.data(), host.size()), "");
}

TEST_F(EmuStrictTest, CopiesAtOffsetsInsideAllocationsRoundTrip) {
  auto a = dev_->allocate(1000 * sizeof(int)).value();
  auto b = dev_->allocate(1000 * sizeof(int)).value();
  auto in = dev_->allocate_pinned(1000 * sizeof(int)).value();
  auto out = dev_->allocate_pinned(1000 * sizeof(int)).value();
  for (int i = 0; i < 1000; ++i) in.as<int>()[i] = 7 * i + 1;
  dev_->copy_h2d(s(), a.as<int>() + 100, in.as<int>() + 100, 900 * sizeof(int));
  dev_->copy_d2d(s(), b.as<int>(), a.as<int>() + 100, 900 * sizeof(int));
  dev_->copy_d2h(s(), out.as<int>(), b.as<int>(), 900 * sizeof(int));
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  for (int i = 0; i < 900; ++i) ASSERT_EQ(out.as<int>()[i], 7 * (i + 100) + 1);
}

TEST_F(EmuStrictTest, H2DFromPageableMemoryIsRefused) {
  auto d = dev_->allocate(4096).value();
  std::vector<char> pageable(4096, 1);
  dev_->copy_h2d(s(), d.data(), pageable.data(), 4096);
  expect_refused({"copy_h2d of 4096 bytes", "(pageable host memory)", "(device memory of this device)",
                  "the source must be pinned host memory"});
}

TEST_F(EmuStrictTest, D2HToPageableMemoryIsRefused) {
  auto d = dev_->allocate(4096).value();
  std::vector<char> pageable(4096);
  dev_->copy_d2h(s(), pageable.data(), d.data(), 4096);
  expect_refused(
      {"copy_d2h of 4096 bytes", "to 0x", "(pageable host memory)", "the destination must be pinned host memory"});
}

TEST_F(EmuStrictTest, RefusedCopyStopsLaterWork) {
  auto d = dev_->allocate(64).value();
  std::vector<char> pageable(64);
  bool ran = false;
  dev_->copy_h2d(s(), d.data(), pageable.data(), 64);
  dev_->host_task(s(), [&] { ran = true; });
  EXPECT_FALSE(dev_->synchronize(s()).is_ok());
  EXPECT_FALSE(ran);
  EXPECT_FALSE(dev_->status().is_ok());  // sticky
}

TEST_F(EmuStrictTest, H2DInTheWrongDirectionIsRefused) {
  auto d = dev_->allocate(256).value();
  auto h = dev_->allocate_pinned(256).value();
  dev_->copy_h2d(s(), h.data(), d.data(), 256);  // arguments swapped: a d2h issued as h2d
  expect_refused({"copy_h2d of 256 bytes", "(device memory of this device) to",
                  "(pinned host memory (allocate_pinned))", "the destination must be device memory of this device"});
}

TEST_F(EmuStrictTest, D2HInTheWrongDirectionIsRefused) {
  auto d = dev_->allocate(256).value();
  auto h = dev_->allocate_pinned(256).value();
  dev_->copy_d2h(s(), d.data(), h.data(), 256);
  expect_refused({"copy_d2h of 256 bytes", "the destination must be pinned host memory"});
}

TEST_F(EmuStrictTest, D2DWithAHostSideIsRefused) {
  auto d = dev_->allocate(256).value();
  auto h = dev_->allocate_pinned(256).value();
  dev_->copy_d2d(s(), d.data(), h.data(), 256);
  expect_refused({"copy_d2d of 256 bytes", "the source must be device memory of this device"});
}

TEST_F(EmuStrictTest, CopyPastTheEndOfAnAllocationIsRefused) {
  auto d = dev_->allocate(256).value();
  auto h = dev_->allocate_pinned(512).value();
  dev_->copy_h2d(s(), d.as<char>() + 128, h.data(), 256);
  expect_refused({"copy_h2d of 256 bytes", "runs past the end of its allocation"});
}

TEST_F(EmuStrictTest, CopyToFreedDeviceMemoryIsRefused) {
  void* stale = nullptr;
  {
    auto d = dev_->allocate(256).value();
    stale = d.data();
  }
  auto h = dev_->allocate_pinned(256).value();
  dev_->copy_h2d(s(), stale, h.data(), 256);
  expect_refused({"a device address in no live allocation"});
}

// Opens `gate` from another thread after a pause long enough that a free issued meanwhile by the
// test's thread finds the work behind the gate still queued; `opened` says whether it did.
class LateOpener {
 public:
  explicit LateOpener(StreamGate& gate)
      : thread_([this, &gate] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          opened_ = true;
          gate.open();
        }) {}
  ~LateOpener() { thread_.join(); }
  bool opened() const { return opened_; }

 private:
  std::atomic<bool> opened_{false};
  std::thread thread_;
};

// Bytes of a recognizable pattern, and a pinned block of the same size filled with others: made
// right after a free, it likely reuses the freed block (so that a read of freed memory differs).
std::vector<unsigned char> pattern(std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(7 * i + 1);
  return v;
}
PinnedBuffer scribble(Device& dev, std::size_t n) {
  PinnedBuffer b = dev.allocate_pinned(n).value();
  std::memset(b.data(), 0xEE, n);
  return b;
}

// As cudaFree, freeing device memory waits for the work queued on the device's streams, so that
// a stream-ordered read of a buffer freed after it was issued still reads the buffer (the emu
// device used to free at once: the copy read freed memory).
TEST_F(EmuStrictTest, FreeOfDeviceMemoryWaitsForTheWorkQueuedBeforeIt) {
  constexpr std::size_t kN = 4096;
  const std::vector<unsigned char> want = pattern(kN);
  auto in = dev_->allocate_pinned(kN).value();
  auto out = dev_->allocate_pinned(kN).value();
  std::memcpy(in.data(), want.data(), kN);
  auto d = dev_->allocate(kN).value();
  dev_->copy_h2d(s(), d.data(), in.data(), kN);
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  StreamGate gate;
  gate.hold(*dev_, s());
  dev_->copy_d2h(s(), out.data(), d.data(), kN);  // runs once the gate opens
  LateOpener opener(gate);
  d = DeviceBuffer();  // the free
  EXPECT_TRUE(opener.opened()) << "the free returned while the copy reading the buffer was still queued";
  EXPECT_EQ(std::memcmp(out.data(), want.data(), kN), 0) << "the free returned before the copy ran";
  const PinnedBuffer reuse = scribble(*dev_, kN);
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  EXPECT_EQ(std::memcmp(out.data(), want.data(), kN), 0) << "the copy read freed memory";
}

// As cudaFreeHost, freeing pinned memory waits for the work queued on every stream of the device
// (here a second one): an h2d copy from it still reads it.
TEST_F(EmuStrictTest, FreeOfPinnedMemoryWaitsForTheWorkQueuedBeforeIt) {
  constexpr std::size_t kN = 4096;
  const std::vector<unsigned char> want = pattern(kN);
  Stream other = dev_->create_stream().value();
  auto in = dev_->allocate_pinned(kN).value();
  auto out = dev_->allocate_pinned(kN).value();
  std::memcpy(in.data(), want.data(), kN);
  auto d = dev_->allocate(kN).value();
  StreamGate gate;
  gate.hold(*dev_, other.view());
  dev_->copy_h2d(other.view(), d.data(), in.data(), kN);  // runs once the gate opens
  LateOpener opener(gate);
  in = PinnedBuffer();  // the free
  EXPECT_TRUE(opener.opened()) << "the free returned while the copy reading the buffer was still queued";
  const PinnedBuffer reuse = scribble(*dev_, kN);
  dev_->copy_d2h(other.view(), out.data(), d.data(), kN);
  ASSERT_TRUE(dev_->synchronize(other.view()).is_ok());
  EXPECT_EQ(std::memcmp(out.data(), want.data(), kN), 0) << "the copy read freed memory";
}

// CUDA forbids CUDA calls in a stream callback (cudaErrorNotPermitted), and a free there would
// wait for the stream that runs it: a free from a host task is refused (the sticky error), not a
// deadlock; the block stays allocated until the device goes.
TEST_F(EmuStrictTest, FreeFromAHostTaskIsRefused) {
  auto d = dev_->allocate(256).value();
  auto h = dev_->allocate_pinned(256).value();
  dev_->host_task(s(), [&] {
    d = DeviceBuffer();
    h = PinnedBuffer();
  });
  expect_refused({"free of device memory", "(256 bytes) from a stream task", "cudaErrorNotPermitted"});
}

// What a host task captured is gone once the stream passed the task (as the cuda backend destroys
// it inside its callback): a caller that synchronized the stream and then drops its own reference
// frees the buffer on its own thread. The holder's slow destructor widens the window in which the
// worker used to still hold the captures after the stream counted the task done.
TEST_F(EmuStrictTest, AHostTasksCapturesAreGoneOnceTheStreamPassedIt) {
  struct SlowHolder {
    std::shared_ptr<PinnedBuffer> buffer;
    SlowHolder(const SlowHolder&) = default;
    explicit SlowHolder(std::shared_ptr<PinnedBuffer> b) : buffer(std::move(b)) {}
    ~SlowHolder() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
  };
  for (int i = 0; i < 10; ++i) {
    auto buffer = std::make_shared<PinnedBuffer>(dev_->allocate_pinned(256).value());
    dev_->host_task(s(), [holder = SlowHolder(buffer)] { (void)holder; });
    ASSERT_TRUE(dev_->synchronize(s()).is_ok());
    EXPECT_EQ(buffer.use_count(), 1) << "round " << i << ": the worker still holds the task's captures";
    buffer.reset();
    ASSERT_TRUE(dev_->status().is_ok()) << "round " << i << ": " << dev_->status().to_string();
  }
}

TEST_F(EmuStrictTest, MemoryOfAnotherDeviceIsRefused) {
  EmuOptions o;
  o.capacity = 1 << 20;
  auto other = make_emu_device(o).value();
  auto theirs = other->allocate(256).value();
  auto mine = dev_->allocate(256).value();
  dev_->copy_d2d(s(), mine.data(), theirs.data(), 256);
  expect_refused({"device memory of emu device", "the source must be device memory of this device"});
}

// Memory of another device is reached by copy_peer, which checks the source against that device.
TEST_F(EmuStrictTest, PeerCopiesReadAnotherDevicesMemory) {
  EmuOptions o;
  o.capacity = 1 << 20;
  auto other = make_emu_device(o).value();
  auto os = other->create_stream().value();
  auto theirs = other->allocate(256 * sizeof(int)).value();
  auto pinned = other->allocate_pinned(256 * sizeof(int)).value();
  for (int i = 0; i < 256; ++i) pinned.as<int>()[i] = 3 * i + 1;
  other->copy_h2d(os.view(), theirs.data(), pinned.data(), 256 * sizeof(int));
  ASSERT_TRUE(other->synchronize(os.view()).is_ok());
  auto mine = dev_->allocate(256 * sizeof(int)).value();
  auto out = dev_->allocate_pinned(200 * sizeof(int)).value();
  const LinkBytes mine0 = dev_->counters().snapshot(), theirs0 = other->counters().snapshot();
  dev_->copy_peer(s(), mine.data(), *other, theirs.as<int>() + 56, 200 * sizeof(int));
  const LinkBytes mine1 = dev_->counters().snapshot() - mine0, theirs1 = other->counters().snapshot() - theirs0;
  dev_->copy_d2h(s(), out.data(), mine.data(), 200 * sizeof(int));
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(out.as<int>()[i], 3 * (i + 56) + 1);
  EXPECT_EQ(mine1.hbm_write, 200 * sizeof(int));
  EXPECT_EQ(mine1.h2d + mine1.d2h + mine1.hbm_read, 0u);
  EXPECT_EQ(theirs1.hbm_read, 200 * sizeof(int));
  // The source must be memory of the device named: this device's own memory is not the other's.
  dev_->copy_peer(s(), mine.data(), *other, mine.data(), 16);
  expect_refused({"copy_peer of 16 bytes", "the source must be device memory of emu device"});
}

TEST_F(EmuStrictTest, RegisteredRangesCountAsPinned) {
  HostPages host(3 * 4096);
  auto d = dev_->allocate(4096).value();
  ASSERT_TRUE(dev_->pinner().pin(host.p, host.bytes).is_ok());
  dev_->copy_h2d(s(), d.data(), host.p + 4096 + 100, 4096);  // any sub-range of the registration
  dev_->copy_d2h(s(), host.p, d.data(), 4096);
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  dev_->pinner().unpin(host.p, host.bytes);
  ASSERT_TRUE(dev_->status().is_ok());
  dev_->copy_h2d(s(), d.data(), host.p, 4096);  // unpinned again
  expect_refused({"copy_h2d of 4096 bytes", "(pageable host memory)"});
}

TEST_F(EmuStrictTest, CopyRunningPastARegisteredRangeIsRefused) {
  HostPages host(2 * 4096);
  auto d = dev_->allocate(4096).value();
  ASSERT_TRUE(dev_->pinner().pin(host.p, 4096).is_ok());
  dev_->copy_h2d(s(), d.data(), host.p + 2048, 4096);
  expect_refused({"host memory registered through pinner(), but the range runs past the end"});
  dev_->pinner().unpin(host.p, 4096);
}

TEST_F(EmuStrictTest, OverlappingRegistrationIsRefused) {
  HostPages host(3 * 4096);
  ASSERT_TRUE(dev_->pinner().pin(host.p + 4096, 4096).is_ok());
  const Status twice = dev_->pinner().pin(host.p, 2 * 4096);
  EXPECT_EQ(twice.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(twice.message().find("overlaps the pinned range"), std::string::npos) << twice.message();
  dev_->pinner().unpin(host.p + 4096, 4096);
  EXPECT_TRUE(dev_->status().is_ok());
}

TEST_F(EmuStrictTest, UnpinOfAnUnregisteredRangeIsRefused) {
  HostPages host(4096);
  dev_->pinner().unpin(host.p, 4096);
  const Status st = dev_->status();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("emu pinner: cannot unpin"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("was never registered"), std::string::npos) << st.message();
}

TEST_F(EmuStrictTest, SecondUnpinIsRefused) {
  HostPages host(4096);
  ASSERT_TRUE(dev_->pinner().pin(host.p, 4096).is_ok());
  dev_->pinner().unpin(host.p, 4096);
  ASSERT_TRUE(dev_->status().is_ok());
  dev_->pinner().unpin(host.p, 4096);
  EXPECT_FALSE(dev_->status().is_ok());
}

TEST_F(EmuStrictTest, PinningDeviceMemoryIsRefused) {
  auto d = dev_->allocate(4096).value();
  EXPECT_FALSE(dev_->pinner().pin(d.data(), 4096).is_ok());
}

TEST_F(EmuStrictTest, KernelWritingPageableMemoryIsRefused) {
  const std::int32_t dim = 4;
  const std::int64_t stride = record_stride(dim, 0);
  auto pool_mem = dev_->allocate(static_cast<std::size_t>(8 * stride) * sizeof(float)).value();
  auto idx = dev_->allocate(64).value();
  SlotPool pool{pool_mem.as<float>(), 8, stride, dim, 0};
  std::vector<float> pageable_out(dim);
  LookupFeature f{idx.as<std::int64_t>(), 1, idx.as<Key>() + 2, nullptr, 1, Pooling::kSum, pageable_out.data()};
  dev_->gather_pool(s(), pool, {f});
  expect_refused({"gather_pool: out 0x", "(16 bytes) is pageable host memory",
                  "expected device memory of this device or pinned (mapped) host memory"});
}

// A feature of two unique rows, row 0 used kHotUses + 1 times (one bag each) and row 1 once,
// whose hot list names row 1 instead of row 0: its buffers on the device (kept in `keep`).
UpdateFeature wrong_hot_list(Device& dev, StreamView s, std::int32_t dim, std::vector<DeviceBuffer>& keep) {
  const std::int64_t uses = kernels::kHotUses + 1;
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(uses + 2));
  for (std::size_t b = 0; b < offsets.size(); ++b) offsets[b] = static_cast<std::int64_t>(b);
  std::vector<std::int32_t> positions(static_cast<std::size_t>(uses + 1)), bag_of(positions.size());
  for (std::size_t j = 0; j < positions.size(); ++j) positions[j] = bag_of[j] = static_cast<std::int32_t>(j);
  const std::vector<Key> slots = {0, 1};
  const std::vector<std::int64_t> unique_offsets = {0, uses, uses + 1};
  const std::vector<std::int64_t> hot = {1};  // row 1 is used once; row 0 is the hot one
  std::vector<float> grads(static_cast<std::size_t>((uses + 1) * dim), 0.5f);
  auto pinned = dev.allocate_pinned(1 << 16).value();
  auto put = [&](const void* src, std::size_t bytes) {
    keep.push_back(dev.allocate(bytes).value());
    std::memcpy(pinned.data(), src, bytes);
    dev.copy_h2d(s, keep.back().data(), pinned.data(), bytes);
    EXPECT_TRUE(dev.synchronize(s).is_ok());
    return keep.back().data();
  };
  UpdateFeature f;
  f.offsets = static_cast<const std::int64_t*>(put(offsets.data(), offsets.size() * 8));
  f.batch = uses + 1;
  f.num_keys = uses + 1;
  f.unique_slots = static_cast<const Key*>(put(slots.data(), slots.size() * sizeof(Key)));
  f.unique_offsets = static_cast<const std::int64_t*>(put(unique_offsets.data(), unique_offsets.size() * 8));
  f.positions = static_cast<const std::int32_t*>(put(positions.data(), positions.size() * 4));
  f.bag_of = static_cast<const std::int32_t*>(put(bag_of.data(), bag_of.size() * 4));
  f.num_unique = 2;
  f.grads = static_cast<const float*>(put(grads.data(), grads.size() * 4));
  f.step.spec.kind = OptimizerKind::kSgd;
  f.hot = static_cast<const std::int64_t*>(put(hot.data(), hot.size() * 8));
  f.num_hot = 1;
  return f;
}

// A fused backward whose hot list misses a hot row (the segment kernel searches the list alone, so
// that row would be updated from partial sums nobody wrote) is refused.
TEST_F(EmuStrictTest, BackwardWithAnIncompleteHotListIsRefused) {
  const std::int32_t dim = 4;
  const std::int64_t stride = record_stride(dim, 0);
  auto pool_mem = dev_->allocate(static_cast<std::size_t>(2 * stride) * sizeof(float)).value();
  std::vector<DeviceBuffer> keep;
  const UpdateFeature f = wrong_hot_list(*dev_, s(), dim, keep);
  dev_->backward_update(s(), SlotPool{pool_mem.as<float>(), 2, stride, dim, 0}, {f});
  expect_refused({"backward_update feature 0", "hot list misses unique row 0"});
}

// The gradient reduction reads the hot lists as the fused backward does: a wrong one is refused too.
TEST_F(EmuStrictTest, GradientReductionWithAnIncompleteHotListIsRefused) {
  const std::int32_t dim = 4;
  auto sums = dev_->allocate(static_cast<std::size_t>(2 * dim) * sizeof(float)).value();
  std::vector<DeviceBuffer> keep;
  const UpdateFeature f = wrong_hot_list(*dev_, s(), dim, keep);
  dev_->reduce_grads(s(), SlotPool{sums.as<float>(), 2, dim, dim, 0}, {f});
  expect_refused({"reduce_grads feature 0", "hot list misses unique row 0"});
}

TEST_F(EmuStrictTest, ZeroCopyGatherOfAnUnregisteredTableIsRefused) {
  TableSpec spec;
  spec.name = "t";
  spec.rows = 64;
  spec.dim = 4;
  HostTableOptions ho;
  ho.huge_pages = false;  // no pinner: the table is pageable
  auto table = HostTable::create(Topology::fake(1), spec, ho).value();
  auto idx = dev_->allocate(64).value();
  auto out = dev_->allocate(64).value();
  dev_->gather_pool_host(s(), table.ref(),
                         {{idx.as<std::int64_t>(), 1, idx.as<Key>() + 2, nullptr, 1, Pooling::kSum, out.as<float>()}});
  expect_refused({"gather_pool_host: table part", "is pageable host memory", "expected pinned host memory"});
}

// check_device_range: device memory of this device passes; host memory, another device's memory,
// a range past the end of its allocation and freed memory are named. Nothing is dereferenced.
TEST_F(EmuStrictTest, DeviceRangeCheckNamesWhatARangeIs) {
  auto buf = dev_->allocate(4096).value();
  EXPECT_TRUE(dev_->check_device_range(buf.data(), 4096).is_ok());
  EXPECT_TRUE(dev_->check_device_range(buf.as<char>() + 1024, 1024).is_ok());
  EXPECT_TRUE(dev_->check_device_range(nullptr, 0).is_ok());
  std::vector<float> host(16);
  auto pinned = dev_->allocate_pinned(64).value();
  auto other = make_emu_device().value();
  auto theirs = other->allocate(64).value();
  const struct {
    const void* p;
    std::size_t bytes;
    const char* what;
  } bad[] = {{host.data(), 64, "pageable host memory"},
             {pinned.data(), 64, "pinned host memory"},
             {theirs.data(), 64, "device memory of emu device"},
             {buf.as<char>() + 4000, 200, "runs past the end"}};
  for (const auto& b : bad) {
    const Status st = dev_->check_device_range(b.p, b.bytes);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(b.what), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("expected device memory of this device"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(dev_->status().is_ok()) << "a check is not a device error";
}

TEST_F(EmuStrictTest, OwnsOnlyItsOwnStreams) {
  EXPECT_TRUE(dev_->owns(s()));
  EXPECT_FALSE(dev_->owns(StreamView()));
  auto other = make_emu_device().value();
  Stream theirs = other->create_stream().value();
  EXPECT_FALSE(dev_->owns(theirs.view()));
}

// count_nonfinite over several ranges (across chunk boundaries, an empty one, NaN and +-Inf, and
// the largest finite float and denormals, which count as finite), in device memory only.
TEST_F(EmuStrictTest, CountNonfiniteCountsNanAndInfPerRange) {
  const std::int64_t sizes[] = {3 * kernels::kFiniteChunk + 17, 0, 5, 40};
  std::vector<std::vector<float>> host;
  std::vector<DeviceBuffer> mem;
  std::vector<FloatRange> ranges;
  std::vector<std::int64_t> expect;
  for (std::int64_t n : sizes) {
    std::vector<float> v(static_cast<std::size_t>(n), 1.0f);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; i += 4099) {
      v[static_cast<std::size_t>(i)] = (i / 4099) % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
                                       : (i / 4099) % 3 == 1 ? std::numeric_limits<float>::infinity()
                                                             : -std::numeric_limits<float>::infinity();
      ++bad;
    }
    if (n > 2) {
      v[1] = std::numeric_limits<float>::max();
      v[2] = std::numeric_limits<float>::denorm_min();
    }
    mem.push_back(dev_->allocate(static_cast<std::size_t>(n) * sizeof(float)).value());
    auto pin = dev_->allocate_pinned(static_cast<std::size_t>(n) * sizeof(float) + 4).value();
    if (n) {
      std::memcpy(pin.data(), v.data(), v.size() * sizeof(float));
      dev_->copy_h2d(s(), mem.back().data(), pin.data(), v.size() * sizeof(float));
      ASSERT_TRUE(dev_->synchronize(s()).is_ok());
    }
    ranges.push_back({mem.back().as<float>(), n});
    expect.push_back(bad);
  }
  auto partial = dev_->allocate(static_cast<std::size_t>(kernels::finite_partials(ranges)) * 8).value();
  auto totals = dev_->allocate(ranges.size() * 8).value();
  auto out = dev_->allocate_pinned(ranges.size() * 8).value();
  dev_->count_nonfinite(s(), ranges, partial.as<std::int64_t>(), totals.as<std::int64_t>());
  dev_->copy_d2h(s(), out.data(), totals.data(), ranges.size() * 8);
  ASSERT_TRUE(dev_->synchronize(s()).is_ok());
  for (std::size_t r = 0; r < ranges.size(); ++r) EXPECT_EQ(out.as<std::int64_t>()[r], expect[r]) << "range " << r;
  // Host memory handed to it as device memory is refused, as a GPU would fault.
  std::vector<float> pageable(8, 1.0f);
  dev_->count_nonfinite(s(), {{pageable.data(), 8}}, partial.as<std::int64_t>(), totals.as<std::int64_t>());
  expect_refused({"count_nonfinite", "data", "pageable host memory"});
}

}  // namespace
}  // namespace strata::gpu
