// The `emu` backend: device memory is host memory under a capacity limit, each stream runs its
// work in order on its own worker thread, and kernels are the `cuda` backend's kernel source
// (gpu/kernels/bodies.hpp) run by the CPU grid (gpu/kernels/host_grid.hpp) in the device's oneTBB
// arena. Optional random delays before every stream operation shake out races;
// an injected fault makes one operation fail like a device error (sticky, as in CUDA).

#include <tbb/task_arena.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "gpu/device.hpp"
#include "gpu/kernels/host_grid.hpp"
#include "host/fp_env.hpp"

namespace strata::gpu {
namespace {

constexpr std::size_t kAlign = 64;

void* aligned_bytes(std::size_t bytes) {
  return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
}

class EmuPinner final : public Pinner {
 public:
  Status pin(void*, std::size_t len) override {
    pinned_.fetch_add(len);
    return Status::ok();
  }
  void unpin(void*, std::size_t len) noexcept override { pinned_.fetch_sub(len); }
  const char* name() const noexcept override { return "emu"; }

 private:
  std::atomic<std::size_t> pinned_{0};
};

// Shared by the Event owner and the stream tasks that complete or wait for it.
struct EventCore {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // generation of the last record() call
  std::uint64_t completed = 0;  // highest generation that ran
  void wait_for(std::uint64_t g) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return completed >= g; });
  }
};

struct EmuEvent final : detail::EventState {
  std::shared_ptr<EventCore> core = std::make_shared<EventCore>();
};

class EmuDevice;

struct Task {
  std::function<void()> fn;
  bool control = false;  // event records/waits run even after a fault, so nothing waits forever
};

class EmuStream final : public detail::StreamState {
 public:
  // The worker runs with the default FP environment, not the one of the thread creating the stream.
  EmuStream(EmuDevice* dev, std::uint64_t seed) : dev_(dev), rng_(seed) {
    worker_ = std::thread([this] {
      DefaultFpEnv fp;
      run();
    });
  }
  ~EmuStream() override {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void push(Task t) {
    {
      std::lock_guard<std::mutex> lock(m_);
      q_.push_back(std::move(t));
      ++pending_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(m_);
    idle_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void run();
  EmuDevice* dev_;
  std::mt19937_64 rng_;
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<Task> q_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

class EmuDevice final : public Device {
 public:
  explicit EmuDevice(const EmuOptions& o)
      : Device(make_info(o), o.numa_nodes),
        options_(o),
        arena_(o.threads > 0 ? o.threads : tbb::task_arena::automatic) {
    // The arena captures the FP environment it is initialized under and runs every kernel with it.
    DefaultFpEnv fp;
    arena_.initialize();
  }

  Pinner& pinner() noexcept override { return pinner_; }

  Result<Stream> create_stream() override {
    return Stream(std::make_unique<EmuStream>(this, options_.seed * 0x9E3779B97F4A7C15ull + streams_.fetch_add(1)));
  }
  Result<Event> create_event() override { return Event(std::make_unique<EmuEvent>()); }

  void record(EventView e, StreamView s) override {
    auto core = static_cast<EmuEvent*>(e.state())->core;
    std::uint64_t g;
    {
      std::lock_guard<std::mutex> lock(core->m);
      g = ++core->recorded;
    }
    stream(s).push({[core, g] {
                      {
                        std::lock_guard<std::mutex> lock(core->m);
                        if (g > core->completed) core->completed = g;
                      }
                      core->cv.notify_all();
                    },
                    true});
  }
  void wait(StreamView s, EventView e) override {
    auto core = static_cast<EmuEvent*>(e.state())->core;
    std::uint64_t g;
    {
      std::lock_guard<std::mutex> lock(core->m);
      g = core->recorded;
    }
    if (g == 0) return;
    stream(s).push({[core, g] { core->wait_for(g); }, true});
  }
  Status synchronize(StreamView s) override {
    stream(s).drain();
    return status();
  }
  Status synchronize(EventView e) override {
    auto& core = *static_cast<EmuEvent*>(e.state())->core;
    std::uint64_t g;
    {
      std::lock_guard<std::mutex> lock(core.m);
      g = core.recorded;
    }
    core.wait_for(g);
    return status();
  }
  bool ready(EventView e) override {
    auto& core = *static_cast<EmuEvent*>(e.state())->core;
    std::lock_guard<std::mutex> lock(core.m);
    return core.completed >= core.recorded;
  }
  Status status() override {
    std::lock_guard<std::mutex> lock(error_m_);
    return error_;
  }

  void host_task(StreamView s, std::function<void()> fn) override { stream(s).push({std::move(fn), false}); }

  // Runs on a stream worker before every non-control task: the fault injector.
  bool admit() {
    const std::int64_t op = ops_.fetch_add(1);
    std::lock_guard<std::mutex> lock(error_m_);
    if (!error_.is_ok()) return false;
    if (op == options_.fail_after_ops) {
      error_ = Status::internal("emulated device fault at operation " + std::to_string(op) + " (EmuOptions::fail_after_ops)");
      return false;
    }
    return true;
  }
  int max_delay_us() const noexcept { return options_.max_delay_us; }
  // Makes `s` the sticky error (the first one stays), as an invalid launch does on a GPU.
  void fail(Status s) {
    std::lock_guard<std::mutex> lock(error_m_);
    if (error_.is_ok()) error_ = std::move(s);
  }

 protected:
  Result<void*> do_allocate(std::size_t bytes) override {
    void* p = aligned_bytes(bytes);
    if (!p) return Status::resource_exhausted("emu device: host allocation of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  void do_deallocate(void* p, std::size_t) noexcept override { std::free(p); }
  Result<void*> do_allocate_pinned(std::size_t bytes) override {
    void* p = aligned_bytes(bytes);
    if (!p) return Status::resource_exhausted("emu device: pinned allocation of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  void do_deallocate_pinned(void* p, std::size_t) noexcept override { std::free(p); }

  void do_copy(StreamView s, void* dst, const void* src, std::size_t bytes, CopyKind) override {
    stream(s).push({[dst, src, bytes] {
                      if (bytes) std::memcpy(dst, src, bytes);
                    },
                    false});
  }

  // Kernels: the shared kernel source (gpu/kernels/bodies.hpp) on the CPU grid, the launches
  // split as the cuda backend splits them.
  void do_gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features) override {
    kernel(s, [launches = kernels::gather_launches(kernels::pool_source(pool), pool.dim, features)] {
      for (const auto& a : launches) kernels::run_gather(a);
    });
  }

  void do_gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features) override {
    if (table.parts < 1 || table.parts > kernels::kMaxHostParts) {
      fail(Status::invalid_argument("device emu: gather_pool_host reads host tables of 1 to " +
                                    std::to_string(kernels::kMaxHostParts) + " parts (NUMA nodes), got " +
                                    std::to_string(table.parts)));
      return;
    }
    // Host tables are device-visible as they are (the bases are read here, at the call).
    kernel(s, [launches = kernels::gather_launches(kernels::host_source(table, table.bases), table.dim, features)] {
      for (const auto& a : launches) kernels::run_gather(a);
    });
  }

  void do_backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features) override {
    kernel(s, [launches = kernels::update_launches(pool, features)] {
      for (const auto& a : launches) kernels::run_update(a);
    });
  }

  void do_pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) override {
    const kernels::RecordArgs a{pool.base, pool.stride, slots, n, dst};
    kernel(s, [a] { kernels::run_records(a, false); });
  }

  void do_unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) override {
    const kernels::RecordArgs a{pool.base, pool.stride, slots, n, const_cast<float*>(src)};
    kernel(s, [a] { kernels::run_records(a, true); });
  }

  void do_records_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows,
                       bool to_host) override {
    const kernels::HostRecordArgs a{pool.base, pool.stride, pool.dim + pool.state_dim, slots, rows, n};
    kernel(s, [a, to_host] { kernels::run_host_records(a, to_host); });
  }

  Result<float*> device_address(float* host) override { return host; }

  void do_init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n,
                       const RecordInit& init) override {
    const kernels::InitArgs a{pool.base, pool.stride, pool.dim, pool.state_dim, first_slot, n, init};
    kernel(s, [a] { kernels::run_init(a); });
  }

 private:
  static DeviceInfo make_info(const EmuOptions& o) {
    DeviceInfo info;
    info.backend = Backend::kEmu;
    info.name = "emu";
    info.capacity = o.capacity;
    return info;
  }
  static EmuStream& stream(StreamView s) { return *static_cast<EmuStream*>(s.state()); }
  // Kernels run inside the device's arena, so they use its threads, not the caller's.
  template <class F>
  void kernel(StreamView s, F fn) {
    stream(s).push({[this, fn = std::move(fn)] { arena_.execute(fn); }, false});
  }

  EmuOptions options_;
  tbb::task_arena arena_;
  EmuPinner pinner_;
  std::atomic<std::uint64_t> streams_{0};
  std::atomic<std::int64_t> ops_{0};
  std::mutex error_m_;
  Status error_;
};

void EmuStream::run() {
  const int max_delay = dev_->max_delay_us();
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop requested and drained
      t = std::move(q_.front());
      q_.pop_front();
    }
    if (max_delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng_() % static_cast<std::uint64_t>(max_delay + 1)));
    if (t.control || dev_->admit()) t.fn();
    {
      std::lock_guard<std::mutex> lock(m_);
      --pending_;
    }
    idle_.notify_all();
  }
}

}  // namespace

Result<std::unique_ptr<Device>> make_emu_device(const EmuOptions& options) {
  if (options.capacity == 0) return Status::invalid_argument("emu device: capacity must be > 0 bytes");
  if (options.max_delay_us < 0) return Status::invalid_argument("emu device: max_delay_us must be >= 0, got " + std::to_string(options.max_delay_us));
  return std::unique_ptr<Device>(std::make_unique<EmuDevice>(options));
}

}  // namespace strata::gpu
