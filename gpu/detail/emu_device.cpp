// The `emu` backend: device memory is host memory under a capacity limit, each stream runs its
// work in order on its own worker thread, and kernels are the `cuda` backend's kernel source
// (gpu/kernels/bodies.hpp) run by the CPU grid (gpu/kernels/host_grid.hpp) in the stream's oneTBB
// arena. Optional random delays before every stream operation shake out races;
// an injected fault makes one operation fail like a device error (sticky, as in CUDA).
//
// It refuses what a GPU refuses, so that tests without a GPU catch the same bugs:
// - Device memory is handed out as a tagged address (kDeviceTag) that the host cannot dereference:
//   a host load or store through it dies with SIGSEGV, as with a real device pointer. Pointer
//   arithmetic on it works. Only this backend's own stream work sees through the tag (emu_untag).
// - Copies check their direction and memory kinds as cudaMemcpyAsync with an explicit kind
//   would: h2d needs device memory of this device as destination and pinned host memory
//   (allocate_pinned, or a range registered through pinner()) as source; d2h the reverse; d2d
//   device memory on both sides; each range must lie inside one live allocation or registration.
// - Kernels check that every pointer they are given is device memory of this device or pinned
//   (mapped) host memory, and gather_pool_host that the table's parts are registered.
// A violation is a programming error in Strata; it becomes the device's sticky error at the call
// (as the cuda backend records a failed cudaMemcpyAsync), naming the operation, the pointers'
// kinds and the bytes, and the operation does not run.
// - Freeing device or pinned memory waits for the work issued so far to every stream of the device,
//   as cudaFree and cudaFreeHost synchronize the device, so a buffer freed while stream-ordered
//   work still reads it is freed once that work ran. A free from a stream task (host_task) is
//   refused, as CUDA forbids CUDA calls in a stream callback and the free would wait for the
//   stream that runs it: the sticky error; the block stays allocated until the device goes.
// - Each thread has a current device (gpu/current_device.hpp, the stand-in for the CUDA runtime's):
//   every operation makes its device current for its duration and restores the caller's (EmuScope,
//   as the cuda backend's DeviceScope). Stream work and allocations also check that their device
//   is current (need_current); every public operation opens its EmuScope first, so that check
//   cannot fire through the Device interface: it guards this file against an operation written
//   without its scope.

#include <tbb/task_arena.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu/current_device.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/host_grid.hpp"
#include "host/fp_env.hpp"
#include "host/numa_arena.hpp"

namespace strata::gpu {
namespace {

constexpr std::size_t kAlign = 64;

// The emu device current on this thread (its id; -1: none): see gpu/current_device.hpp.
thread_local int t_current_device = -1;
// On the worker of an emu stream: the id of the stream's device (-1 on any other thread).
thread_local int t_worker_of = -1;

// Makes emu device `id` current on the calling thread for a scope and restores the thread's
// previous current device after (the emu counterpart of gpu/cuda/device_scope.hpp).
class EmuScope {
 public:
  explicit EmuScope(int id) noexcept : previous_(t_current_device) { t_current_device = id; }
  ~EmuScope() { t_current_device = previous_; }
  EmuScope(const EmuScope&) = delete;
  EmuScope& operator=(const EmuScope&) = delete;

 private:
  int previous_;
};

// Null when the size cannot be had (including one too close to SIZE_MAX to round up, which would
// wrap to a zero-byte block).
void* aligned_bytes(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - (kAlign - 1)) return nullptr;
  return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
}

static_assert(sizeof(void*) == 8, "the emu device tags device addresses in a 64-bit pointer");

// The tag of device addresses: a bit that makes the address unusable by host loads and stores.
// x86-64: bits 63..47 (63..56 with 5-level paging) of a canonical address are equal, so bit 62
// alone makes it non-canonical and any access raises #GP (SIGSEGV). AArch64 ignores bits 63..56
// of user addresses (top-byte ignore), so there the tag is bit 55, which puts the address in the
// kernel half: a permission fault.
#if defined(__aarch64__)
constexpr std::uintptr_t kDeviceTag = std::uintptr_t{1} << 55;
#else
constexpr std::uintptr_t kDeviceTag = std::uintptr_t{1} << 62;
#endif

/// The host address behind an address an emu stream operation was given. Device memory
/// (Device::allocate) carries kDeviceTag, which this clears; host memory (pinned buffers,
/// registered ranges such as the HostTable parts of gather_pool_host) has no tag and comes back
/// unchanged, as does nullptr. Self-contained on purpose: it is the one place where the emu
/// backend sees through the tag, called by the copies and, through to_host() below, at the top
/// of every kernel op. Host code outside this file must never call it: it would hide exactly the
/// bugs the tag is there to catch.
template <class T>
T* emu_untag(T* p) noexcept {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~kDeviceTag);
}

/// The parameter structs of the kernel ops with every device address untagged (emu_untag).
inline SlotPool to_host(SlotPool p) noexcept {
  p.base = emu_untag(p.base);
  p.overflow = emu_untag(p.overflow);
  return p;
}
inline LookupFeature to_host(LookupFeature f) noexcept {
  f.offsets = emu_untag(f.offsets);
  f.rows = emu_untag(f.rows);
  f.weights = emu_untag(f.weights);
  f.out = emu_untag(f.out);
  return f;
}
inline UpdateFeature to_host(UpdateFeature f) noexcept {
  f.offsets = emu_untag(f.offsets);
  f.weights = emu_untag(f.weights);
  f.unique_slots = emu_untag(f.unique_slots);
  f.unique_rows = emu_untag(f.unique_rows);
  f.unique_offsets = emu_untag(f.unique_offsets);
  f.positions = emu_untag(f.positions);
  f.bag_of = emu_untag(f.bag_of);
  f.grads = emu_untag(f.grads);
  f.hot = emu_untag(f.hot);
  return f;
}

std::string hex(const void* p) {
  std::ostringstream o;
  o << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return o.str();
}

// What a pointer is, for the checks and their messages.
struct Where {
  enum Kind { kNull, kDevice, kDeviceUnallocated, kPinned, kRegistered, kPageable } kind = kPageable;
  int owner = -1;            // kDevice: id of the emu device that allocated it
  std::uintptr_t begin = 0;  // the allocation or registration holding it (kDevice, kPinned, kRegistered)
  std::size_t bytes = 0;
  bool fits = false;  // the whole range [p, p + n) lies inside it
};

// Process-wide registry of emu device allocations and pinned host ranges. Pinned is a property
// of the process, as under CUDA (cudaMallocHost and portable registrations serve every device).
class EmuMemory {
 public:
  enum class HostKind { kAllocated, kRegistered };

  void add_device(const void* p, std::size_t bytes, int owner) {
    std::lock_guard<std::mutex> lock(m_);
    device_[addr(p)] = Range{bytes, owner};
  }
  /// False when `p` is not the start of a live allocation of `owner` of `bytes` bytes.
  bool remove_device(const void* p, std::size_t bytes, int owner) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = device_.find(addr(p));
    if (it == device_.end() || it->second.owner != owner || it->second.bytes != bytes) return false;
    device_.erase(it);
    return true;
  }
  /// Registers [p, p + bytes) as pinned; refuses an overlap with a pinned range (CUDA:
  /// cudaErrorHostMemoryAlreadyRegistered) and device memory.
  Status add_host(const void* p, std::size_t bytes, HostKind kind) {
    const std::uintptr_t a = addr(p);
    if (a & kDeviceTag)
      return Status::invalid_argument("range " + span(a, bytes) + " is device memory, not host memory");
    std::lock_guard<std::mutex> lock(m_);
    auto next = host_.lower_bound(a);
    if (next != host_.end() && next->first < a + bytes)
      return Status::already_exists("range " + span(a, bytes) + " overlaps the pinned range " +
                                    span(next->first, next->second.bytes));
    if (next != host_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.bytes > a)
        return Status::already_exists("range " + span(a, bytes) + " overlaps the pinned range " +
                                      span(prev->first, prev->second.bytes));
    }
    host_[a] = Range{bytes, static_cast<int>(kind)};
    return Status::ok();
  }
  /// Undoes add_host; refuses a range that is not exactly one registered range of that kind.
  Status remove_host(const void* p, std::size_t bytes, HostKind kind) {
    const std::uintptr_t a = addr(p);
    std::lock_guard<std::mutex> lock(m_);
    auto it = host_.find(a);
    if (it == host_.end() || it->second.owner != static_cast<int>(kind))
      return Status::not_found("range " + span(a, bytes) + " was never registered (or was unregistered already)");
    if (it->second.bytes != bytes)
      return Status::invalid_argument("range " + span(a, bytes) + " is not the registered range " +
                                      span(a, it->second.bytes));
    host_.erase(it);
    return Status::ok();
  }

  Where find(const void* p, std::size_t bytes) {
    Where w;
    const std::uintptr_t a = addr(p);
    if (a == 0) {
      w.kind = Where::kNull;
      return w;
    }
    const bool device = (a & kDeviceTag) != 0;
    std::lock_guard<std::mutex> lock(m_);
    auto& map = device ? device_ : host_;
    auto it = map.upper_bound(a);
    if (it != map.begin()) {
      --it;
      if (a < it->first + it->second.bytes) {
        w.begin = it->first;
        w.bytes = it->second.bytes;
        w.fits = bytes <= it->first + it->second.bytes - a;
        if (device) {
          w.kind = Where::kDevice;
          w.owner = it->second.owner;
        } else {
          w.kind = it->second.owner == static_cast<int>(HostKind::kAllocated) ? Where::kPinned : Where::kRegistered;
        }
        return w;
      }
    }
    w.kind = device ? Where::kDeviceUnallocated : Where::kPageable;
    return w;
  }

  static std::string span(std::uintptr_t a, std::size_t bytes) {
    return "[" + hex(reinterpret_cast<const void*>(a)) + ", " + hex(reinterpret_cast<const void*>(a + bytes)) + ")";
  }

 private:
  struct Range {
    std::size_t bytes;
    int owner;  // device ranges: the device id; host ranges: HostKind
  };
  static std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  std::mutex m_;
  std::map<std::uintptr_t, Range> device_, host_;
};

// Constructed on first use (by the first EmuDevice), so it outlives every device.
EmuMemory& emu_memory() {
  static EmuMemory m;
  return m;
}

class EmuDevice;

// Registers host ranges as pinned (EmuMemory), refusing what cudaHostRegister/cudaHostUnregister
// refuse: overlapping registrations, device memory, unpinning a range that was not pinned.
class EmuPinner final : public Pinner {
 public:
  explicit EmuPinner(EmuDevice* dev) noexcept : dev_(dev) {}
  Status pin(void* addr, std::size_t len) override {
    if (len == 0) return Status::ok();
    Status st = emu_memory().add_host(addr, len, EmuMemory::HostKind::kRegistered);
    return st.is_ok() ? st : st.with_context("emu pinner: cannot pin");
  }
  // An unpin of a range that is not registered is a programming error: it becomes the device's
  // sticky error (defined after EmuDevice).
  void unpin(void* addr, std::size_t len) noexcept override;
  const char* name() const noexcept override { return "emu"; }

 private:
  EmuDevice* dev_;
};

// One record() of an event: its own completion state, shared by the stream task that completes it
// and the waits that captured it (as cudaStreamWaitEvent takes the record in force when it is
// issued, a later record of the same event, on any stream, never releases an earlier wait).
struct EventRecord {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  void complete() {
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done; });
  }
  bool is_done() {
    std::lock_guard<std::mutex> lock(m);
    return done;
  }
};

struct EmuEvent final : detail::EventState {
  std::mutex m;
  std::shared_ptr<EventRecord> last;  // the record in force; null before the first record()
  std::shared_ptr<EventRecord> latest() {
    std::lock_guard<std::mutex> lock(m);
    return last;
  }
};

struct Task {
  std::function<void()> fn;
  bool control = false;  // event records/waits run even after a fault, so nothing waits forever
  bool kernel = false;   // runs inside the stream's oneTBB arena (EmuStream::arena_)
};

class EmuStream;

// The owning streams of one emu device (EmuStream; wrappers share their queues), which its frees
// wait for. Shared by the device and its streams, so that a stream may outlive its device.
struct EmuStreamSet {
  std::mutex m;
  std::set<EmuStream*> live;
};

// The state behind every emu StreamView: an owning stream (EmuStream) or a wrapper of one
// (Device::wrap_stream). `queue` is the stream that runs the work. Every live one is in a
// process-wide registry, so that wrap_stream can tell an emu stream handle from any other pointer
// without dereferencing it.
class EmuStreamBase : public detail::StreamState {
 public:
  EmuStreamBase(EmuDevice* dev, EmuStream* queue);
  ~EmuStreamBase() override;
  EmuDevice* const dev;
  EmuStream* const queue;

  /// The live emu stream state at `p`, or nullptr when `p` is none.
  static EmuStreamBase* find(const void* p);
};

// Allocated once and never freed, so that a stream destroyed during exit (a static store or
// device) still finds them: a function-local static could be destroyed before it.
std::mutex& stream_registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
// Live stream states by the address StreamView::state() gives.
std::map<const void*, EmuStreamBase*>& stream_registry() {
  static auto* r = new std::map<const void*, EmuStreamBase*>;
  return *r;
}

class EmuStream final : public EmuStreamBase {
 public:
  // The worker runs with the default FP environment, not the one of the thread creating the stream;
  // the arena captures the environment it is initialized under and runs every kernel with it.
  EmuStream(EmuDevice* dev, std::shared_ptr<EmuStreamSet> set, std::uint64_t seed, int threads)
      : EmuStreamBase(dev, this),
        dev_(dev),
        set_(std::move(set)),
        rng_(seed),
        arena_(threads > 0 ? threads : tbb::task_arena::automatic) {
    {
      DefaultFpEnv fp;
      arena_.initialize();
    }
    worker_ = std::thread([this] {
      DefaultFpEnv fp;
      run();
    });
    std::lock_guard<std::mutex> lock(set_->m);
    set_->live.insert(this);
  }
  ~EmuStream() override {
    {
      // Out of the set first: a marker (see mark) queued after the worker stopped would never run.
      std::lock_guard<std::mutex> lock(set_->m);
      set_->live.erase(this);
    }
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
  /// A record completed once the work queued so far ran (a control task queued now), or nullptr
  /// when the stream is idle.
  std::shared_ptr<EventRecord> mark() {
    std::shared_ptr<EventRecord> rec;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (pending_ == 0) return nullptr;
      rec = std::make_shared<EventRecord>();
      q_.push_back({[rec] { rec->complete(); }, true});
      ++pending_;
    }
    cv_.notify_all();
    return rec;
  }

 private:
  void run();
  EmuDevice* dev_;
  std::shared_ptr<EmuStreamSet> set_;
  std::mt19937_64 rng_;
  // Kernels of this stream run in an arena of its own, which no other stream's thread enters. In
  // one arena shared by the device's streams, a oneTBB worker ran a stream's kernel in its place
  // when the arena's slots were taken, and a stream's thread waiting for its own launch ran ranges
  // of another stream's: hand-offs inside oneTBB's scheduler, which ThreadSanitizer cannot see
  // (Debian's libtbb is not instrumented), so under the tsan preset (oneTBB without workers:
  // tests/tsan_tbb_serial.cpp) kernels read what their stream had ordered before them as races.
  tbb::task_arena arena_;
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
      : Device(make_info(o), o.numa_nodes), options_(o), pinner_(this), id_(next_id()) {
    (void)emu_memory();  // constructed before this device, so destroyed after it
  }
  ~EmuDevice() override {
    free_scratch();
    default_stream_.reset();  // runs what is still queued there, which may read the blocks below
    for (const Parked& b : parked_) {
      if (b.pinned) {
        (void)emu_memory().remove_host(b.p, b.bytes, EmuMemory::HostKind::kAllocated);
      } else {
        (void)emu_memory().remove_device(b.p, b.bytes, id_);
      }
      if (b.heap) {
        std::free(emu_untag(b.p));
      } else {
        unmap_on_node(b.p, b.bytes);  // mapped by Device::allocate_pinned; the streams that used it are done
      }
    }
  }

  Pinner& pinner() noexcept override { return pinner_; }

  Result<Stream> create_stream() override {
    const EmuScope scope(id_);
    return Stream(std::make_unique<EmuStream>(this, streams_set_, next_seed(), options_.threads));
  }

  // The native handle of an emu stream is its StreamView::state() (see Device::wrap_stream).
  Result<Stream> wrap_stream(void* native) override {
    const EmuScope scope(id_);
    EmuStream* queue = nullptr;
    if (!native) {
      std::call_once(default_once_, [&] {
        default_stream_ = std::make_unique<EmuStream>(this, streams_set_, next_seed(), options_.threads);
      });
      queue = default_stream_.get();
    } else {
      EmuStreamBase* found = EmuStreamBase::find(native);
      if (!found)
        return Status::invalid_argument(name() + ": wrap_stream(" + hex(native) +
                                        "): not a live emu stream (the native handle of an emu stream is its "
                                        "StreamView::state(); nullptr is the default stream)");
      if (found->dev != this)
        return Status::invalid_argument(name() + ": wrap_stream(" + hex(native) + "): a stream of emu device " +
                                        std::to_string(found->dev->id()) + ", not of this device");
      queue = found->queue;
    }
    return Stream(std::make_unique<EmuStreamBase>(this, queue));
  }
  int id() const noexcept { return id_; }
  Result<Event> do_create_event() override {
    const EmuScope scope(id_);
    return Event(std::make_unique<EmuEvent>());
  }

  void record(EventView e, StreamView s) override {
    const EmuScope scope(id_);
    if (!own_stream(s, "record")) return;
    auto& ev = *static_cast<EmuEvent*>(e.state());
    auto rec = std::make_shared<EventRecord>();
    {
      std::lock_guard<std::mutex> lock(ev.m);
      ev.last = rec;
    }
    stream(s).push({[rec] { rec->complete(); }, true});
  }
  void wait(StreamView s, EventView e) override {
    const EmuScope scope(id_);
    if (!own_stream(s, "wait")) return;
    auto rec = static_cast<EmuEvent*>(e.state())->latest();
    if (!rec) return;
    stream(s).push({[rec] { rec->wait(); }, true});
  }
  Status synchronize(StreamView s) override {
    const EmuScope scope(id_);
    if (own_stream(s, "synchronize")) stream(s).drain();
    return status();
  }
  Status synchronize(EventView e) override {
    const EmuScope scope(id_);
    if (auto rec = static_cast<EmuEvent*>(e.state())->latest()) rec->wait();
    return status();
  }
  Status check_device_range(const void* p, std::size_t bytes) const override {
    if (bytes == 0) return Status::ok();
    const std::string bad = misuse(p, bytes, kDeviceOnly);
    if (bad.empty()) return Status::ok();
    return Status::invalid_argument(hex(p) + " (" + std::to_string(bytes) + " bytes) is " + describe(p, bytes) +
                                    " (expected " + bad + ", " + name() + ")");
  }

  bool ready(EventView e) override {
    const EmuScope scope(id_);
    auto rec = static_cast<EmuEvent*>(e.state())->latest();
    return !rec || rec->is_done();
  }
  Status status() override {
    std::lock_guard<std::mutex> lock(error_m_);
    return error_;
  }

  void host_task(StreamView s, std::function<void()> fn) override {
    const EmuScope scope(id_);
    if (!own_stream(s, "host_task")) return;
    stream(s).push({std::move(fn), false});
  }

  // Runs on a stream worker before every non-control task: the fault injector.
  bool admit() {
    const std::int64_t op = ops_.fetch_add(1);
    std::lock_guard<std::mutex> lock(error_m_);
    if (!error_.is_ok()) return false;
    if (op == options_.fail_after_ops) {
      error_ = Status::internal("emulated device fault at operation " + std::to_string(op) +
                                " (EmuOptions::fail_after_ops)");
      return false;
    }
    return true;
  }
  int max_delay_us() const noexcept { return options_.max_delay_us; }

  /// Keeps the first error (the sticky error). Thread-safe.
  void record_error(Status st) override {
    std::lock_guard<std::mutex> lock(error_m_);
    if (error_.is_ok()) error_ = std::move(st);
  }

 protected:
  Result<void*> do_allocate(std::size_t bytes) override {
    const EmuScope scope(id_);
    need_current("allocation");
    void* p = aligned_bytes(bytes);
    if (!p)
      return Status::resource_exhausted("emu device: host allocation of " + std::to_string(bytes) + " bytes failed");
    void* tagged = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | kDeviceTag);
    emu_memory().add_device(tagged, bytes, id_);
    return tagged;
  }
  void do_deallocate(void* p, std::size_t bytes) noexcept override {
    const EmuScope scope(id_);
    if (!may_free(p, bytes, false)) return;
    if (!emu_memory().remove_device(p, bytes, id_)) {
      record_error(Status::internal(name() + ": free of " + hex(p) + " (" + std::to_string(bytes) +
                                    " bytes), which is " + describe(p, bytes)));
      return;
    }
    std::free(emu_untag(p));
  }
  Result<void*> do_allocate_pinned(std::size_t bytes) override {
    const EmuScope scope(id_);
    STRATA_RETURN_IF_ERROR(reserve_pinned(bytes));
    void* p = aligned_bytes(bytes);
    if (!p) {
      pinned_in_use_.fetch_sub(bytes);
      return Status::resource_exhausted("emu device: pinned allocation of " + std::to_string(bytes) + " bytes failed");
    }
    Status st = emu_memory().add_host(p, bytes, EmuMemory::HostKind::kAllocated);
    if (!st.is_ok()) {
      std::free(p);
      pinned_in_use_.fetch_sub(bytes);
      return st.with_context(name() + ": pinned allocation");
    }
    return p;
  }
  void do_deallocate_pinned(void* p, std::size_t bytes) noexcept override {
    if (unregister_pinned(p, bytes, HeapBlock::kYes)) std::free(p);
  }
  // Memory mapped on a node (Device::place_pinned): pinned as allocate_pinned's, within the same capacity.
  Status do_register_pinned(void* p, std::size_t bytes) override {
    const EmuScope scope(id_);
    STRATA_RETURN_IF_ERROR(reserve_pinned(bytes));
    Status st = emu_memory().add_host(p, bytes, EmuMemory::HostKind::kAllocated);
    if (!st.is_ok()) {
      pinned_in_use_.fetch_sub(bytes);
      return st.with_context(name() + ": pinned allocation");
    }
    return Status::ok();
  }
  bool do_unregister_pinned(void* p, std::size_t bytes) noexcept override {
    return unregister_pinned(p, bytes, HeapBlock::kNo);
  }

  // Charges `bytes` to EmuOptions::pinned_capacity (ResourceExhausted past it).
  Status reserve_pinned(std::size_t bytes) {
    const std::size_t cap = options_.pinned_capacity;
    std::size_t used = pinned_in_use_.load();
    do {
      if (bytes > cap - used) {
        return Status::resource_exhausted("emu device: pinned allocation of " + std::to_string(bytes) +
                                          " bytes: " + std::to_string(cap - used) + " of " + std::to_string(cap) +
                                          " bytes of pinned memory free (EmuOptions::pinned_capacity)");
      }
    } while (!pinned_in_use_.compare_exchange_weak(used, used + bytes));
    return Status::ok();
  }
  // The free of pinned memory up to releasing its bytes: whether the caller may release them now
  // (false: refused and parked, or an error). A parked heap block is freed with the device.
  enum class HeapBlock { kYes, kNo };
  bool unregister_pinned(void* p, std::size_t bytes, HeapBlock heap) noexcept {
    const EmuScope scope(id_);
    if (!may_free(p, bytes, true, heap == HeapBlock::kYes)) return false;
    Status st = emu_memory().remove_host(p, bytes, EmuMemory::HostKind::kAllocated);
    if (!st.is_ok()) {
      record_error(st.with_context(name() + ": free of pinned memory"));
      return false;
    }
    pinned_in_use_.fetch_sub(bytes);
    return true;
  }

  // Before a free: waits for the work issued so far to every stream of this device, as cudaFree
  // and cudaFreeHost synchronize the device (work issued meanwhile by other threads is not waited
  // for). False on a stream worker, where CUDA forbids the call (cudaErrorNotPermitted) and the
  // wait could never end: the sticky error, and the block is parked until the device goes.
  // `heap`: the block came from aligned_bytes, and the device frees it when parked (else it only
  // unmaps it: a block mapped by Device::allocate_pinned).
  bool may_free(void* p, std::size_t bytes, bool pinned, bool heap = true) noexcept {
    if (t_worker_of >= 0) {
      record_error(Status::internal(
          name() + ": free of " + (pinned ? "pinned memory " : "device memory ") + hex(p) + " (" +
          std::to_string(bytes) + " bytes) from a stream task of emu device " + std::to_string(t_worker_of) +
          " (host_task): CUDA forbids CUDA calls in a stream callback (cudaErrorNotPermitted), and the free "
          "would wait for the stream running it; free it after the stream passed the task instead"));
      std::lock_guard<std::mutex> lock(parked_m_);
      parked_.push_back({p, bytes, pinned, heap});
      return false;
    }
    std::vector<std::shared_ptr<EventRecord>> marks;
    {
      std::lock_guard<std::mutex> lock(streams_set_->m);
      for (EmuStream* s : streams_set_->live)
        if (auto rec = s->mark()) marks.push_back(std::move(rec));
    }
    for (const auto& rec : marks) rec->wait();
    return true;
  }

  // As cudaMemcpyAsync with an explicit kind: a pointer of the wrong kind is refused at the call
  // and becomes the sticky error (see the top of this file). Zero bytes check nothing, as CUDA.
  void do_copy(StreamView s, void* dst, const void* src, std::size_t bytes, CopyKind kind) override {
    const EmuScope scope(id_);
    if (bytes) {
      const bool dst_dev = kind != CopyKind::kD2H, src_dev = kind != CopyKind::kH2D;
      const std::string bad_dst = misuse(dst, bytes, dst_dev ? kDeviceOnly : kPinnedHostOnly);
      const std::string bad_src = misuse(src, bytes, src_dev ? kDeviceOnly : kPinnedHostOnly);
      if (!bad_dst.empty() || !bad_src.empty()) {
        const char* op = kind == CopyKind::kH2D ? "copy_h2d" : kind == CopyKind::kD2H ? "copy_d2h" : "copy_d2d";
        std::string msg = name() + ": " + op + " of " + std::to_string(bytes) + " bytes from " + hex(src) + " (" +
                          describe(src, bytes) + ") to " + hex(dst) + " (" + describe(dst, bytes) + ") refused: the " +
                          (bad_dst.empty() ? "source" : "destination") + " must be " +
                          (bad_dst.empty() ? bad_src : bad_dst);
        record_error(Status::internal(std::move(msg)));
        return;
      }
    }
    push_copy(s, dst, src, bytes);
  }

  // Queues the copy of checked (tagged) addresses on stream `s`: its worker does the memcpy.
  void push_copy(StreamView s, void* dst, const void* src, std::size_t bytes) {
    dst = emu_untag(dst);
    src = emu_untag(src);
    stream(s).push({[dst, src, bytes] {
                      if (bytes) std::memcpy(dst, src, bytes);
                    },
                    false});
  }

  // From another emu device's memory (Device::copy_peer; the base checked the backend). All emu
  // devices live in this process, so the stream worker reads the source directly.
  void do_copy_peer(StreamView s, void* dst, Device& src_device, const void* src, std::size_t bytes) override {
    const EmuScope scope(id_);
    if (bytes) {
      const int peer = static_cast<EmuDevice&>(src_device).id_;
      const Where w = emu_memory().find(src, bytes);
      const bool src_ok = w.kind == Where::kDevice && w.owner == peer && w.fits;
      const std::string bad_dst = misuse(dst, bytes, kDeviceOnly);
      if (!bad_dst.empty() || !src_ok) {
        record_error(Status::internal(name() + ": copy_peer of " + std::to_string(bytes) + " bytes from " + hex(src) +
                                      " (" + describe(src, bytes) + ") to " + hex(dst) + " (" + describe(dst, bytes) +
                                      ") refused: the " + (bad_dst.empty() ? "source" : "destination") +
                                      " must be device memory of " +
                                      (bad_dst.empty() ? "emu device " + std::to_string(peer) : "this device")));
        return;
      }
    }
    push_copy(s, dst, src, bytes);
  }

  // Kernels: the shared kernel source (gpu/kernels/bodies.hpp) on the CPU grid, the launches
  // split as the cuda backend splits them. Each op first checks and untags what it was given
  // (to_host).
  void do_gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& device_features) override {
    const EmuScope scope(id_);
    std::vector<LookupFeature> features = device_features;
    if (!to_host("gather_pool", pool, features)) return;
    kernel(s, [launches = kernels::gather_launches(kernels::pool_source(pool), pool.dim, features)] {
      for (const auto& a : launches) kernels::run_gather(a);
    });
  }

  void do_gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& device_features) override {
    const EmuScope scope(id_);
    if (table.parts < 1 || table.parts > kernels::kMaxHostParts) {
      record_error(Status::invalid_argument(name() + ": gather_pool_host reads host tables of 1 to " +
                                            std::to_string(kernels::kMaxHostParts) + " parts (NUMA nodes), got " +
                                            std::to_string(table.parts)));
      return;
    }
    std::vector<LookupFeature> features = device_features;
    if (!to_host("gather_pool_host", table, features)) return;
    // Registered host tables are device-visible as they are (the bases are read here, at the call).
    kernel(s, [launches = kernels::gather_launches(kernels::host_source(table, table.bases), table.dim, features)] {
      for (const auto& a : launches) kernels::run_gather(a);
    });
  }

  void do_backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& device_features) override {
    const EmuScope scope(id_);
    std::vector<UpdateFeature> features = device_features;
    if (!to_host("backward_update", pool, features)) return;
    std::vector<kernels::UpdateArgs> launches = kernels::update_launches(pool, features);
    with_scratch(s, static_cast<std::size_t>(kernels::partial_floats(launches)) * sizeof(float),
                 [&](void* scratch) { issue_backward(s, features, launches, scratch); });
  }

  void issue_backward(StreamView s, const std::vector<UpdateFeature>& features,
                      std::vector<kernels::UpdateArgs>& launches, void* scratch) {
    kernels::with_partials(launches, emu_untag(static_cast<float*>(scratch)));
    kernel(s, [this, features, launches] {
      if (!hot_lists_ok("backward_update", features)) return;
      for (const auto& a : launches) kernels::run_update(a);
    });
  }

  // A hot list must hold exactly the rows used more than kHotUses times, ascending: the segment
  // kernel finds a hot row's segments in it alone, so a row missing from it would be summed from
  // partials nobody wrote (or past the feature's). The lists are device data (uploaded on the
  // stream), so they are checked in the kernel, when they are; a wrong one is the sticky error.
  bool hot_lists_ok(const char* op, const std::vector<UpdateFeature>& features) {
    for (std::size_t i = 0; i < features.size(); ++i) {
      const Status bad = check_hot_list(features[i]);
      if (!bad.is_ok()) {
        record_error(Status::internal(name() + ": " + op + " feature " + std::to_string(i) + ": " + bad.message()));
        return false;
      }
    }
    return true;
  }

  static Status check_hot_list(const UpdateFeature& f) {
    if (!f.hot) return Status::ok();
    std::int64_t next = 0;
    for (std::int64_t u = 0; u < f.num_unique; ++u) {
      if (f.unique_offsets[u + 1] - f.unique_offsets[u] <= kernels::kHotUses) continue;
      if (next >= f.num_hot || f.hot[next] != u)
        return Status::internal("hot list misses unique row " + std::to_string(u) + ", used " +
                                std::to_string(f.unique_offsets[u + 1] - f.unique_offsets[u]) + " times");
      ++next;
    }
    if (next != f.num_hot)
      return Status::internal("hot list holds " + std::to_string(f.num_hot) + " rows, " + std::to_string(next) +
                              " are used more than " + std::to_string(kernels::kHotUses) + " times");
    return Status::ok();
  }

  void do_pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) override {
    const EmuScope scope(id_);
    if (!to_host("pack_records", pool, slots, n, dst)) return;
    const kernels::RecordArgs a = kernels::record_args(pool, slots, n, dst);
    kernel(s, [a] { kernels::run_records(a, false); });
  }

  void do_unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) override {
    const EmuScope scope(id_);
    if (!to_host("unpack_records", pool, slots, n, src)) return;
    const kernels::RecordArgs a = kernels::record_args(pool, slots, n, const_cast<float*>(src));
    kernel(s, [a] { kernels::run_records(a, true); });
  }

  void do_move_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n, float* packed,
                       bool put) override {
    const EmuScope scope(id_);
    const char* op = put ? "put_columns" : "take_columns";
    ArgCheck c{this, op, {}};
    if (col < 0 || rows.dim < 1 || col + rows.dim > rows.stride)
      c.error = name() + ": " + op + ": columns [" + std::to_string(col) + ", " + std::to_string(col + rows.dim) +
                ") outside rows of " + std::to_string(rows.stride) + " floats";
    c("rows", rows.base, rows.slots * rows.stride * static_cast<std::int64_t>(sizeof(float)), kDeviceOnly);
    c("slots", slots, n * static_cast<std::int64_t>(sizeof(Key)));
    c("packed", packed, n * rows.dim * static_cast<std::int64_t>(sizeof(float)));
    if (!check_done(c)) return;
    const kernels::RecordArgs a{emu_untag(rows.base) + col, rows.stride, emu_untag(slots), n,
                                emu_untag(packed),          rows.dim};
    kernel(s, [a, put] { kernels::run_records(a, put); });
  }

  void do_reduce_grads(StreamView s, SlotPool sums, const std::vector<UpdateFeature>& device_features) override {
    const EmuScope scope(id_);
    std::vector<UpdateFeature> features = device_features;
    if (!to_host("reduce_grads", sums, features)) return;
    std::vector<kernels::UpdateArgs> launches = kernels::update_launches(sums, features);
    with_scratch(s, static_cast<std::size_t>(kernels::partial_floats(launches)) * sizeof(float), [&](void* scratch) {
      kernels::with_partials(launches, emu_untag(static_cast<float*>(scratch)));
      kernel(s, [this, features, launches] {
        if (!hot_lists_ok("reduce_grads", features)) return;
        for (const auto& a : launches) kernels::run_reduce(a);
      });
    });
  }

  void do_records_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows,
                       bool to_host_records) override {
    const EmuScope scope(id_);
    ArgCheck c{this, to_host_records ? "records_to_host" : "records_from_host", {}};
    check_pool(c, pool);
    c("slots", slots, n * static_cast<std::int64_t>(sizeof(Key)));
    c("rows", rows, n * static_cast<std::int64_t>(sizeof(float*)));
    if (!check_done(c)) return;
    const kernels::HostRecordArgs a =
        kernels::host_record_args(strata::gpu::to_host(pool), emu_untag(slots), n, emu_untag(rows));
    // The row addresses are device data (uploaded on the stream): checked when the kernel runs,
    // each a record of pinned host memory, as a GPU would fault on any other.
    kernel(s, [this, a, to_host_records] {
      ArgCheck rc{this, to_host_records ? "records_to_host" : "records_from_host", {}};
      for (std::int64_t i = 0; i < a.n && rc.error.empty(); ++i)
        rc("host record", a.rows[i], a.words * static_cast<std::int64_t>(sizeof(float)), kPinnedHostOnly);
      if (check_done(rc)) kernels::run_host_records(a, to_host_records);
    });
  }

  Result<float*> device_address(float* host) override {
    const EmuScope scope(id_);
    const std::string bad = misuse(host, sizeof(float), kPinnedHostOnly);
    if (!bad.empty())
      return Status::invalid_argument(name() + ": device_address of " + hex(host) + ", which is " +
                                      describe(host, sizeof(float)) + "; expected " + bad);
    return host;
  }

  void do_init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n,
                       const RecordInit& init) override {
    const EmuScope scope(id_);
    ArgCheck c{this, "init_records", {}};
    c("records", pool.base + first_slot * pool.stride, n * pool.record_bytes(), kDeviceOnly);
    if (!check_done(c)) return;
    const kernels::InitArgs a = kernels::init_args(strata::gpu::to_host(pool), first_slot, n, init);
    kernel(s, [a] { kernels::run_init(a); });
  }

  void do_count_nonfinite(StreamView s, const std::vector<FloatRange>& device_ranges, std::int64_t* partial,
                          std::int64_t* totals) override {
    const EmuScope scope(id_);
    ArgCheck c{this, "count_nonfinite", {}};
    std::vector<FloatRange> ranges = device_ranges;
    for (const FloatRange& r : ranges) c("data", r.data, r.n * element_bytes(r.dtype));
    c("partial", partial, kernels::finite_partials(ranges) * 8, kDeviceOnly);
    c("totals", totals, static_cast<std::int64_t>(ranges.size()) * 8, kDeviceOnly);
    if (!check_done(c)) return;
    for (FloatRange& r : ranges) r.data = emu_untag(r.data);
    kernel(s, [launches = kernels::finite_launches(ranges, emu_untag(partial), emu_untag(totals))] {
      for (const auto& a : launches) kernels::run_nonfinite(a);
    });
  }

 private:
  static int next_id() {
    static std::atomic<int> ids{0};
    return ids.fetch_add(1);
  }
  std::string name() const { return "emu device " + std::to_string(id_); }

  // ---- memory kinds (see the top of this file) ----
  enum Want { kDeviceOnly, kPinnedHostOnly, kDeviceOrPinned };

  // What [p, p + bytes) is, in words.
  std::string describe(const void* p, std::size_t bytes) const {
    const Where w = emu_memory().find(p, bytes);
    std::string what;
    switch (w.kind) {
      case Where::kNull:
        return "nullptr";
      case Where::kDevice:
        what =
            w.owner == id_ ? "device memory of this device" : "device memory of emu device " + std::to_string(w.owner);
        break;
      case Where::kDeviceUnallocated:
        return "a device address in no live allocation (freed?)";
      case Where::kPinned:
        what = "pinned host memory (allocate_pinned)";
        break;
      case Where::kRegistered:
        what = "host memory registered through pinner()";
        break;
      case Where::kPageable:
        return "pageable host memory";
    }
    if (!w.fits) what += ", but the range runs past the end of its allocation " + EmuMemory::span(w.begin, w.bytes);
    return what;
  }
  // Empty when [p, p + bytes) is usable as `want`, else what it must be instead.
  std::string misuse(const void* p, std::size_t bytes, Want want) const {
    const Where w = emu_memory().find(p, bytes);
    const bool device = w.kind == Where::kDevice && w.owner == id_ && w.fits;
    const bool pinned = (w.kind == Where::kPinned || w.kind == Where::kRegistered) && w.fits;
    switch (want) {
      case kDeviceOnly:
        return device ? "" : "device memory of this device";
      case kPinnedHostOnly:
        return pinned ? "" : "pinned host memory (allocate_pinned, or a range registered through pinner())";
      default:
        return device || pinned ? "" : "device memory of this device or pinned (mapped) host memory";
    }
  }

  // Checks what a kernel op is given, like a GPU that would fault on a pointer it cannot reach:
  // each range (nullptr or empty ranges excepted) must be device memory of this device or pinned
  // host memory. Accumulates the first violation.
  struct ArgCheck {
    const EmuDevice* dev;
    const char* op;
    std::string error;
    void operator()(const char* what, const void* p, std::int64_t bytes, Want want = kDeviceOrPinned) {
      if (!error.empty() || !p || bytes <= 0) return;
      const std::string bad = dev->misuse(p, static_cast<std::size_t>(bytes), want);
      if (!bad.empty())
        error = dev->name() + ": " + op + ": " + what + " " + hex(p) + " (" + std::to_string(bytes) + " bytes) is " +
                dev->describe(p, static_cast<std::size_t>(bytes)) + "; expected " + bad;
    }
  };
  bool check_done(ArgCheck& c) {
    if (c.error.empty()) return true;
    record_error(Status::internal(std::move(c.error)));
    return false;
  }
  // A slot pool's records, and its overflow region's, must be device memory of this device.
  static void check_pool(ArgCheck& c, const SlotPool& pool) {
    c("pool", pool.base, pool.slots * pool.record_bytes(), kDeviceOnly);
    c("pool overflow", pool.overflow, pool.overflow_slots * pool.record_bytes(), kDeviceOnly);
  }
  static std::int64_t out_bytes(const LookupFeature& f, std::int32_t dim) {
    return (f.pooling == Pooling::kNone ? f.num_keys : f.batch) * dim * element_bytes(f.out_dtype);
  }
  void check_lookups(ArgCheck& c, const std::vector<LookupFeature>& features, std::int32_t dim) const {
    for (const LookupFeature& f : features) {
      c("offsets", f.offsets, (f.batch + 1) * 8);
      c("rows", f.rows, f.num_keys * static_cast<std::int64_t>(sizeof(Key)));
      c("weights", f.weights, f.num_keys * 4);
      c("out", f.out, out_bytes(f, dim));
    }
  }

  // to_host(op, ...): the one call at the top of each kernel op. Checks the op's pointers
  // (ArgCheck) and, when they pass, rewrites them in place into the host addresses the CPU kernels
  // use (emu_untag); when they do not, records the sticky error and returns false: the op must
  // not run.
  bool to_host(const char* op, SlotPool& pool, std::vector<LookupFeature>& features) {
    ArgCheck c{this, op, {}};
    check_pool(c, pool);
    check_lookups(c, features, pool.dim);
    if (!check_done(c)) return false;
    pool = strata::gpu::to_host(pool);
    for (auto& f : features) f = strata::gpu::to_host(f);
    return true;
  }
  bool to_host(const char* op, const RowRef& table, std::vector<LookupFeature>& features) {
    ArgCheck c{this, op, {}};
    // Row counts of the parts are not known here: the first record of each part must be pinned.
    for (std::int32_t p = 0; p < table.parts; ++p)
      c("table part", table.bases[p], table.stride * static_cast<std::int64_t>(sizeof(float)), kPinnedHostOnly);
    check_lookups(c, features, table.dim);
    if (!check_done(c)) return false;
    for (auto& f : features) f = strata::gpu::to_host(f);
    return true;
  }
  bool to_host(const char* op, SlotPool& pool, std::vector<UpdateFeature>& features) {
    ArgCheck c{this, op, {}};
    check_pool(c, pool);
    for (const UpdateFeature& f : features) {
      const std::int64_t grad_rows = f.pooling == Pooling::kNone ? f.num_keys : f.batch;
      c("offsets", f.offsets, (f.batch + 1) * 8);
      c("weights", f.weights, f.num_keys * 4);
      c("unique_slots", f.unique_slots, f.num_unique * static_cast<std::int64_t>(sizeof(Key)));
      c("unique_rows", f.unique_rows, f.num_unique * static_cast<std::int64_t>(sizeof(Key)));
      c("unique_offsets", f.unique_offsets, (f.num_unique + 1) * 8);
      c("positions", f.positions, f.num_keys * 4);
      c("bag_of", f.bag_of, f.num_keys * 4);
      c("grads", f.grads, grad_rows * pool.dim * static_cast<std::int64_t>(sizeof(float)));
      c("hot", f.hot, f.num_hot * 8);
    }
    if (!check_done(c)) return false;
    pool = strata::gpu::to_host(pool);
    for (auto& f : features) f = strata::gpu::to_host(f);
    return true;
  }
  template <class F>  // F: float or const float
  bool to_host(const char* op, SlotPool& pool, const Key*& slots, std::int64_t n, F*& records) {
    ArgCheck c{this, op, {}};
    check_pool(c, pool);
    c("slots", slots, n * static_cast<std::int64_t>(sizeof(Key)));
    c("records", records, n * pool.record_bytes());
    if (!check_done(c)) return false;
    pool = strata::gpu::to_host(pool);
    slots = emu_untag(slots);
    records = emu_untag(records);
    return true;
  }

  static DeviceInfo make_info(const EmuOptions& o) {
    DeviceInfo info;
    info.backend = Backend::kEmu;
    info.name = "emu";
    info.capacity = o.capacity;
    return info;
  }
  // The stream work of `s` is issued to; as the CUDA runtime, it needs this device current on the
  // calling thread: an operation of this file written without its EmuScope becomes the sticky
  // error (a check of this backend's own code; callers of Device cannot trigger it).
  EmuStream& stream(StreamView s) {
    need_current("stream work");
    return *static_cast<EmuStreamBase*>(s.state())->queue;
  }
  void need_current(const char* what) {
    if (t_current_device != id_)
      record_error(Status::internal(name() + ": " + what + " issued while the calling thread's current device is " +
                                    std::to_string(t_current_device) + ", not this device " + std::to_string(id_) +
                                    " (every operation must make its device current: EmuScope)"));
  }
  // Kernels run inside their stream's arena, so they use its threads, not the caller's.
  template <class F>
  void kernel(StreamView s, F fn) {
    stream(s).push({std::move(fn), false, true});
  }

  std::uint64_t next_seed() { return options_.seed * 0x9E3779B97F4A7C15ull + streams_.fetch_add(1); }

  EmuOptions options_;
  EmuPinner pinner_;
  const int id_;
  std::atomic<std::uint64_t> streams_{0};
  const std::shared_ptr<EmuStreamSet> streams_set_ = std::make_shared<EmuStreamSet>();
  // Blocks whose free was refused (may_free): freed with the device.
  struct Parked {
    void* p;
    std::size_t bytes;
    bool pinned;
    bool heap;  // aligned_bytes' (freed with the device), else mapped by Device::allocate_pinned (unmapped)
  };
  std::mutex parked_m_;
  std::vector<Parked> parked_;
  std::once_flag default_once_;
  std::atomic<std::int64_t> ops_{0};
  std::atomic<std::size_t> pinned_in_use_{0};  // bytes of live pinned allocations (pinned_capacity)
  std::mutex error_m_;
  Status error_;
  // wrap_stream(nullptr); made on first use. Declared last, so destroyed first: its destructor
  // runs the tasks still queued, which call admit() and record_error() on the members above.
  std::unique_ptr<EmuStream> default_stream_;
};

void EmuPinner::unpin(void* addr, std::size_t len) noexcept {
  if (len == 0) return;
  Status st = emu_memory().remove_host(addr, len, EmuMemory::HostKind::kRegistered);
  if (st.is_ok()) return;
  // cudaHostUnregister fails the same way (cudaErrorHostMemoryNotRegistered); as the cuda pinner,
  // say so on stderr, and make it the device's sticky error so that tests see it.
  st = Status::internal("emu pinner: cannot unpin: " + st.message());
  std::fprintf(stderr, "strata: %s\n", st.message().c_str());
  dev_->record_error(std::move(st));
}

EmuStreamBase::EmuStreamBase(EmuDevice* d, EmuStream* q) : StreamState(d), dev(d), queue(q) {
  std::lock_guard<std::mutex> lock(stream_registry_mutex());
  stream_registry()[static_cast<const detail::StreamState*>(this)] = this;
}

EmuStreamBase::~EmuStreamBase() {
  std::lock_guard<std::mutex> lock(stream_registry_mutex());
  stream_registry().erase(static_cast<const detail::StreamState*>(this));
}

EmuStreamBase* EmuStreamBase::find(const void* p) {
  std::lock_guard<std::mutex> lock(stream_registry_mutex());
  const auto it = stream_registry().find(p);
  return it == stream_registry().end() ? nullptr : it->second;
}

void EmuStream::run() {
  t_worker_of = dev_->id();
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
    if (max_delay > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % static_cast<std::uint64_t>(max_delay + 1)));
    if (t.control || dev_->admit()) {
      if (t.kernel) {
        arena_.execute(t.fn);
      } else {
        t.fn();
      }
    }
    // What the task captured goes before the task counts as done (as CUDA destroys a host
    // function's data inside its callback): a caller that synchronized and then drops its last
    // reference to a buffer the task also held frees it on its own thread, not on this worker.
    t = Task{};
    {
      std::lock_guard<std::mutex> lock(m_);
      --pending_;
    }
    idle_.notify_all();
  }
}

}  // namespace

int emu_current_device() noexcept { return t_current_device; }
void set_emu_current_device(int id) noexcept { t_current_device = id; }

Result<std::unique_ptr<Device>> make_emu_device(const EmuOptions& options) {
  if (options.capacity == 0) return Status::invalid_argument("emu device: capacity must be > 0 bytes");
  if (options.max_delay_us < 0)
    return Status::invalid_argument("emu device: max_delay_us must be >= 0, got " +
                                    std::to_string(options.max_delay_us));
  return std::unique_ptr<Device>(std::make_unique<EmuDevice>(options));
}

}  // namespace strata::gpu
