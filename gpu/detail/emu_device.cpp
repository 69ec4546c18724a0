// The `emu` backend: device memory is host memory under a capacity limit, each stream runs its
// work in order on its own worker thread, and kernels are the CPU kernels of host/ run in the
// device's oneTBB arena. Optional random delays before every stream operation shake out races;
// an injected fault makes one operation fail like a device error (sticky, as in CUDA).

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
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
#include "host/fp_env.hpp"
#include "host/kernels.hpp"

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

  void do_gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features) override {
    kernel(s, [this, pool, features] {
      float* base = pool.base;
      const RowRef ref = pool_ref(pool, &base);
      run_lookups(ref, features);
    });
  }

  void do_gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features) override {
    std::vector<float*> bases(table.bases, table.bases + table.parts);
    kernel(s, [this, table, bases = std::move(bases), features] {
      RowRef ref = table;
      ref.bases = bases.data();
      run_lookups(ref, features);
    });
  }

  void do_backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features) override {
    kernel(s, [pool, features] {
      float* base = pool.base;
      const RowRef ref = pool_ref(pool, &base);
      tbb::parallel_for(std::size_t{0}, features.size(), [&](std::size_t i) {
        const UpdateFeature& f = features[i];
        BagsView bags{f.offsets, f.batch, nullptr, f.weights};
        UniqueView u{f.unique_slots, f.unique_offsets, f.positions, f.num_unique};
        strata::backward_update(ref, bags, f.pooling, u, f.bag_of, f.grads, f.step);
      });
    });
  }

  void do_pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) override {
    kernel(s, [pool, slots, n, dst] {
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, 256), [&](const tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t i = r.begin(); i < r.end(); ++i)
          std::memcpy(dst + i * pool.stride, pool.base + slots[i] * pool.stride, static_cast<std::size_t>(pool.record_bytes()));
      });
    });
  }

  void do_unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) override {
    kernel(s, [pool, slots, n, src] {
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, 256), [&](const tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t i = r.begin(); i < r.end(); ++i)
          std::memcpy(pool.base + slots[i] * pool.stride, src + i * pool.stride, static_cast<std::size_t>(pool.record_bytes()));
      });
    });
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
  static RowRef pool_ref(const SlotPool& pool, float** base) {
    RowRef ref;
    ref.bases = base;
    ref.parts = 1;
    ref.stride = pool.stride;
    ref.dim = pool.dim;
    ref.state_dim = pool.state_dim;
    return ref;
  }
  static void run_lookups(const RowRef& ref, const std::vector<LookupFeature>& features) {
    tbb::parallel_for(std::size_t{0}, features.size(), [&](std::size_t i) {
      const LookupFeature& f = features[i];
      if (f.pooling == Pooling::kNone) {
        gather_rows(ref, f.rows, f.weights, f.num_keys, f.out);
      } else {
        strata::gather_pool(ref, BagsView{f.offsets, f.batch, f.rows, f.weights}, f.pooling, f.out);
      }
    });
  }
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
