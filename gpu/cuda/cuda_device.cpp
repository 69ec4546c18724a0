// The `cuda` backend: Device on the CUDA runtime. Host C++ (compiled by the host compiler); the
// kernels are in kernels.cu behind the launchers of kernels.cuh.
//
// Semantics follow the emu backend (gpu/detail/emu_device.cpp): streams are non-blocking CUDA
// streams (never the default stream), events carry no timing, and errors of issued work are
// sticky: the first one is kept and returned by status() and synchronize(), and once one is held
// copies, kernels and host tasks are no longer issued (event records and waits still are, so no
// waiter hangs), as the emulator stops running work after a fault. Faults inside kernels become
// visible at the next call that synchronizes or queries.
//
// Threads may call in on distinct streams, so every entry that touches the runtime first makes
// this device's primary context current on the calling thread, and restores the thread's own
// context when it returns (cuda_detail::DeviceScope): Strata never changes the caller's current
// device.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda/cuda_try.hpp"
#include "gpu/cuda/device_scope.hpp"
#include "gpu/cuda/kernels.cuh"
#include "gpu/detail/cuda_probe.hpp"
#include "gpu/device.hpp"

namespace strata::gpu {
namespace {

using cuda_detail::call_quietly;
using cuda_detail::cuda_status;
using cuda_detail::DeviceScope;
using cuda_detail::PrimaryContext;
using kernels::kMaxHostParts;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<std::uintptr_t>(p));
  return buf;
}

std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

// The GPU's PCI bus id, "0000:3B:00.0" ("" when CUDA does not say).
std::string pci_bus_id_of(int ordinal) {
  char bus_id[32] = {};
  if (call_quietly([&] { return cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal); }) != cudaSuccess) return "";
  return bus_id;
}

// NUMA node of the GPU's PCI device from sysfs (-1 when unknown, e.g. outside Linux or in a VM).
int numa_node_of(const std::string& bus_id) {
  if (bus_id.empty()) return -1;
  std::string id(bus_id);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream in("/sys/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

// Pins host memory with cudaHostRegister. Portable: every device (context) may use the range;
// Mapped: kernels may read it (gather_pool_host; unified addressing maps it anyway, this says so
// where it does not).
class CudaPinner final : public Pinner {
 public:
  explicit CudaPinner(const PrimaryContext& ctx) noexcept : ctx_(ctx) {}

  Status pin(void* addr, std::size_t len) override {
    if (len == 0) return Status::ok();
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    const cudaError_t err =
        call_quietly([&] { return cudaHostRegister(addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped); });
    if (err == cudaSuccess) return Status::ok();
    return cuda_status(err, "cudaHostRegister(addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped)", __FILE__,
                       __LINE__)
        .with_context("cuda pinner: cannot pin host range [" + hex(addr) + ", " + hex(static_cast<char*>(addr) + len) +
                      ") of " + std::to_string(len) + " bytes");
  }

  void unpin(void* addr, std::size_t len) noexcept override {
    if (len == 0) return;
    const DeviceScope scope(ctx_);
    if (!scope.ok()) {
      std::fprintf(stderr, "strata: cuda pinner: cannot unpin host range [%s, %s): %s\n", hex(addr).c_str(),
                   hex(static_cast<char*>(addr) + len).c_str(), scope.status().to_string().c_str());
      return;
    }
    const cudaError_t err = call_quietly([&] { return cudaHostUnregister(addr); });
    if (err != cudaSuccess) {
      std::fprintf(stderr, "strata: cuda pinner: cannot unpin host range [%s, %s): %s\n", hex(addr).c_str(),
                   hex(static_cast<char*>(addr) + len).c_str(), error_text(err).c_str());
    }
  }

  const char* name() const noexcept override { return "cuda"; }

 private:
  const PrimaryContext& ctx_;
};

class CudaDevice;

struct CudaStream final : detail::StreamState {
  CudaStream(CudaDevice* d, cudaStream_t s, bool owns) noexcept;
  ~CudaStream() override;  // an owned stream: waits for its work, as Stream promises, and destroys it
  CudaDevice* dev;
  cudaStream_t stream;
  bool owned;  // false: a wrapper (Device::wrap_stream) of a stream someone else owns
};

struct CudaEvent final : detail::EventState {
  CudaEvent(CudaDevice* d, cudaEvent_t e) noexcept : dev(d), event(e) {}
  ~CudaEvent() override;
  CudaDevice* dev;
  cudaEvent_t event;
};

// A host task in flight: owned by the runtime's callback from launch to run. It holds the
// device's failed flag, not the device: on a wrapped stream (which does not wait on destruction)
// the task may run after the device was destroyed.
struct HostTask {
  std::shared_ptr<const std::atomic<bool>> failed;
  std::function<void()> fn;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(DeviceInfo info, int numa_nodes, const cuda_detail::KernelGrids& grids, PrimaryContext ctx)
      : Device(std::move(info), numa_nodes), grids_(grids), ctx_(std::move(ctx)), pinner_(ctx_) {}
  ~CudaDevice() override { free_scratch(); }  // while the context and this backend's free live

  Pinner& pinner() noexcept override { return pinner_; }

  Result<Stream> create_stream() override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    auto state = std::make_unique<CudaStream>(this, nullptr, true);
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
    return Stream(std::move(state));
  }

  Result<Stream> wrap_stream(void* native) override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    auto s = static_cast<cudaStream_t>(native);
    const std::string what = "device " + info().name + " (CUDA device " + std::to_string(ctx_.ordinal()) +
                             "): wrap_stream(" + hex(native) + ")";
    if (s == cudaStreamPerThread)
      return Status::invalid_argument(what +
                                      ": the per-thread default stream (cudaStreamPerThread) names another stream on "
                                      "each thread, and Strata issues from several: pass a stream you created, or "
                                      "nullptr for the legacy default stream");
    if (!s) s = cudaStreamLegacy;
    Result<CUcontext> ctx = cuda_detail::stream_context(s);
    if (!ctx) return ctx.status().with_context(what);
    if (ctx.value() != ctx_.get()) {
      const Result<int> other = cuda_detail::context_device(ctx.value());
      std::string owner = other ? "CUDA device " + std::to_string(other.value()) : "another CUDA context";
      if (other && other.value() == ctx_.ordinal()) owner += " in a context other than its primary context";
      return Status::invalid_argument(what + ": the stream belongs to " + owner +
                                      "; expected a stream of this device's primary context (the runtime API's)");
    }
    return Stream(std::make_unique<CudaStream>(this, s, false));
  }

  Result<Event> do_create_event() override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    auto state = std::make_unique<CudaEvent>(this, nullptr);
    STRATA_CUDA_TRY(cudaEventCreateWithFlags(&state->event, cudaEventDisableTiming));
    return Event(std::move(state));
  }

  void record(EventView e, StreamView s) override {
    if (!own_stream(s, "record")) return;
    const DeviceScope scope(ctx_);
    if (!entered(scope)) return;
    STRATA_CUDA_RECORD(*this, cudaEventRecord(event(e), stream(s)));
  }

  void wait(StreamView s, EventView e) override {
    if (!own_stream(s, "wait")) return;
    const DeviceScope scope(ctx_);
    if (!entered(scope)) return;
    // A never-recorded event is complete for CUDA, so this is a no-op then, as the interface says.
    STRATA_CUDA_RECORD(*this, cudaStreamWaitEvent(stream(s), event(e), 0));
  }

  Status synchronize(StreamView s) override {
    if (!own_stream(s, "synchronize")) return status();
    const DeviceScope scope(ctx_);
    if (entered(scope)) STRATA_CUDA_RECORD(*this, cudaStreamSynchronize(stream(s)));
    return status();
  }

  Status synchronize(EventView e) override {
    const DeviceScope scope(ctx_);
    if (entered(scope)) STRATA_CUDA_RECORD(*this, cudaEventSynchronize(event(e)));
    return status();
  }

  // Both ends of the range must be device memory of this ordinal (a range inside one allocation
  // cannot be checked through the runtime API alone). Managed memory is refused. A CUDA error
  // other than an unknown pointer (a sticky error of the context) is reported as itself.
  Status check_device_range(const void* p, std::size_t bytes) const override {
    if (bytes == 0) return Status::ok();
    const DeviceScope scope(ctx_);
    if (!scope.ok()) return scope.status();
    for (const void* q : {p, static_cast<const void*>(static_cast<const char*>(p) + bytes - 1)}) {
      cudaPointerAttributes a{};
      const cudaError_t err = call_quietly([&] { return cudaPointerGetAttributes(&a, q); });
      if (err != cudaSuccess && err != cudaErrorInvalidValue) {
        std::ostringstream what;
        what << "cannot check the range at " << p << " (" << bytes << " bytes): cudaPointerGetAttributes(" << q
             << ") failed with " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
        return Status::internal(what.str());
      }
      const bool ok = err == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device == info().ordinal;
      if (ok) continue;
      std::ostringstream what;
      what << q << " of the range at " << p << " (" << bytes << " bytes) is ";
      if (err != cudaSuccess || a.type == cudaMemoryTypeUnregistered)
        what << "pageable host memory";
      else if (a.type == cudaMemoryTypeHost)
        what << "pinned host memory";
      else if (a.type == cudaMemoryTypeManaged)
        what << "managed memory";
      else
        what << "device memory of CUDA device " << a.device;
      what << " (expected device memory of CUDA device " << info().ordinal << ")";
      return Status::invalid_argument(what.str());
    }
    return Status::ok();
  }

  bool ready(EventView e) override {
    const DeviceScope scope(ctx_);
    if (!entered(scope)) return true;
    const cudaError_t err = cudaEventQuery(event(e));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    cuda_detail::record_if_error(*this, err, "cudaEventQuery(event)", __FILE__, __LINE__);
    // A failed device never completes the event: report it done so pollers go on to see status().
    return true;
  }

  Status status() override {
    std::lock_guard<std::mutex> lock(error_m_);
    return error_;
  }

  void host_task(StreamView s, std::function<void()> fn) override {
    if (!own_stream(s, "host_task")) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    auto task = std::make_unique<HostTask>(HostTask{failed_, std::move(fn)});
    if (STRATA_CUDA_RECORD(*this, cudaLaunchHostFunc(stream(s), &run_host_task, task.get()))) {
      (void)task.release();  // run_host_task owns it now
    }
  }

  /// Keeps the first error of asynchronous work (the sticky error). Thread-safe.
  void record_error(Status st) override {
    std::lock_guard<std::mutex> lock(error_m_);
    if (!error_.is_ok()) return;
    error_ = std::move(st);
    failed_->store(true, std::memory_order_release);
  }

  /// Whether `scope` made this device current; records its error (sticky) when not.
  bool entered(const DeviceScope& scope) {
    if (scope.ok()) return true;
    record_error(scope.status());
    return false;
  }
  const PrimaryContext& context() const noexcept { return ctx_; }

  bool failed() const noexcept { return failed_->load(std::memory_order_acquire); }

 protected:
  Result<void*> do_allocate(std::size_t bytes) override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    void* p = nullptr;
    const cudaError_t err = call_quietly([&] { return cudaMalloc(&p, bytes); });
    if (err == cudaSuccess) return p;
    if (err == cudaErrorMemoryAllocation)
      return Status::resource_exhausted("device " + info().name + ": cudaMalloc of " + std::to_string(bytes) +
                                        " bytes failed: out of device memory (" + error_text(err) + ")");
    return cuda_status(err, "cudaMalloc(&p, bytes)", __FILE__, __LINE__);
  }

  void do_deallocate(void* p, std::size_t) noexcept override {
    const DeviceScope scope(ctx_);
    if (entered(scope)) STRATA_CUDA_RECORD(*this, cudaFree(p));
  }

  Result<void*> do_allocate_pinned(std::size_t bytes) override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    void* p = nullptr;
    const cudaError_t err = call_quietly([&] { return cudaMallocHost(&p, bytes); });
    if (err == cudaSuccess) return p;
    if (err == cudaErrorMemoryAllocation)
      return Status::resource_exhausted("device " + info().name + ": cudaMallocHost of " + std::to_string(bytes) +
                                        " bytes failed: out of pinned host memory (" + error_text(err) + ")");
    return cuda_status(err, "cudaMallocHost(&p, bytes)", __FILE__, __LINE__);
  }

  void do_deallocate_pinned(void* p, std::size_t) noexcept override {
    const DeviceScope scope(ctx_);
    if (entered(scope)) STRATA_CUDA_RECORD(*this, cudaFreeHost(p));
  }

  // Memory mapped on a node (Device::place_pinned), registered as the pinner registers host tables.
  Status do_register_pinned(void* p, std::size_t bytes) override {
    const DeviceScope scope(ctx_);
    STRATA_RETURN_IF_ERROR(scope.status());
    const cudaError_t err =
        call_quietly([&] { return cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped); });
    if (err == cudaSuccess) return Status::ok();
    if (err == cudaErrorMemoryAllocation)
      return Status::resource_exhausted("device " + info().name + ": cudaHostRegister of " + std::to_string(bytes) +
                                        " bytes failed: out of pinned host memory (" + error_text(err) + ")");
    return cuda_status(err, "cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped)", __FILE__,
                       __LINE__);
  }

  // cudaFreeHost waits for the device's work; cudaHostUnregister is not documented to, so the wait is explicit.
  // False on any failure (recorded): the range may still be registered or in DMA, so it stays mapped.
  bool do_unregister_pinned(void* p, std::size_t) noexcept override {
    const DeviceScope scope(ctx_);
    if (!entered(scope)) return false;
    return STRATA_CUDA_RECORD(*this, cudaDeviceSynchronize()) && STRATA_CUDA_RECORD(*this, cudaHostUnregister(p));
  }

  void do_copy(StreamView s, void* dst, const void* src, std::size_t bytes, CopyKind kind) override {
    if (bytes == 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const cudaMemcpyKind k = kind == CopyKind::kH2D   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kD2H ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
    STRATA_CUDA_RECORD(*this, cudaMemcpyAsync(dst, src, bytes, k, stream(s)));
  }

  // cudaMemcpyPeerAsync: direct where the two GPUs can reach each other and peer access is on
  // (enable_peer_access), staged through host memory by the driver where not, a device-to-device
  // copy when both Device objects are the same ordinal.
  void do_copy_peer(StreamView s, void* dst, Device& src_device, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const int peer = src_device.info().ordinal;
    enable_peer_access(peer);
    STRATA_CUDA_RECORD(*this, cudaMemcpyPeerAsync(dst, ctx_.ordinal(), src, peer, bytes, stream(s)));
  }

  void do_gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features) override {
    if (features.empty()) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    issue_gathers(s, kernels::gather_launches(kernels::pool_source(pool), pool.dim, features));
  }

  void do_gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features) override {
    if (features.empty()) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    if (table.parts < 1 || table.parts > kMaxHostParts) {
      record_error(Status::invalid_argument("device " + info().name + ": gather_pool_host reads host tables of 1 to " +
                                            std::to_string(kMaxHostParts) + " parts (NUMA nodes), got " +
                                            std::to_string(table.parts)));
      return;
    }
    float* mapped[kMaxHostParts] = {};
    for (std::int32_t p = 0; p < table.parts; ++p) {
      // Every part must be registered (mapped) through pinner(): asked of the driver even where
      // the host address is the device address (cudaDevAttrCanUseHostPointerForRegisteredMem),
      // so that an unregistered table is an error here, not an illegal address in the kernel
      // that would poison the context.
      void* m = nullptr;
      if (!STRATA_CUDA_RECORD(*this, cudaHostGetDevicePointer(&m, table.bases[p], 0))) return;
      mapped[p] = static_cast<float*>(m);
    }
    issue_gathers(s, kernels::gather_launches(kernels::host_source(table, mapped), table.dim, features));
  }

  void do_backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features) override {
    if (features.empty()) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    issue_updates(s, kernels::update_launches(pool, features), cuda_detail::launch_update);
  }

  // The launches of a backward or gradient reduction with the device's scratch for their hot rows.
  void issue_updates(StreamView s, std::vector<kernels::UpdateArgs> launches,
                     cudaError_t (*launcher)(const kernels::UpdateArgs&, cudaStream_t,
                                             const cuda_detail::KernelGrids&)) {
    with_scratch(s, static_cast<std::size_t>(kernels::partial_floats(launches)) * sizeof(float), [&](void* scratch) {
      kernels::with_partials(launches, static_cast<float*>(scratch));
      for (const auto& a : launches)
        if (!STRATA_CUDA_RECORD(*this, launcher(a, stream(s), grids_))) return;
    });
  }

  void do_pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) override {
    if (n <= 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const kernels::RecordArgs a = kernels::record_args(pool, slots, n, dst);
    STRATA_CUDA_RECORD(*this, cuda_detail::launch_records(a, false, stream(s), grids_));
  }

  void do_unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) override {
    if (n <= 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const kernels::RecordArgs a = kernels::record_args(pool, slots, n, const_cast<float*>(src));
    STRATA_CUDA_RECORD(*this, cuda_detail::launch_records(a, true, stream(s), grids_));
  }

  void do_move_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n, float* packed,
                       bool put) override {
    if (n <= 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const kernels::RecordArgs a{rows.base + col, rows.stride, slots, n, packed, rows.dim};
    STRATA_CUDA_RECORD(*this, cuda_detail::launch_records(a, put, stream(s), grids_));
  }

  void do_reduce_grads(StreamView s, SlotPool sums, const std::vector<UpdateFeature>& features) override {
    if (features.empty()) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    issue_updates(s, kernels::update_launches(sums, features), cuda_detail::launch_reduce);
  }

  void do_records_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows,
                       bool to_host) override {
    if (n <= 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const kernels::HostRecordArgs a = kernels::host_record_args(pool, slots, n, rows);
    STRATA_CUDA_RECORD(*this, cuda_detail::launch_host_records(a, to_host, stream(s), grids_));
  }

  Result<float*> device_address(float* host) override {
    const DeviceScope scope(ctx_);
    if (!scope.ok()) return scope.status().with_context("device " + info().name + ": cannot make it current");
    void* mapped = nullptr;
    const cudaError_t err = call_quietly([&] { return cudaHostGetDevicePointer(&mapped, host, 0); });
    if (err != cudaSuccess) {
      return cuda_status(err, "cudaHostGetDevicePointer(&mapped, host, 0) (is the memory registered?)", __FILE__,
                         __LINE__);
    }
    return static_cast<float*>(mapped);
  }

  void do_init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n,
                       const RecordInit& init) override {
    if (n <= 0) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    const kernels::InitArgs a = kernels::init_args(pool, first_slot, n, init);
    STRATA_CUDA_RECORD(*this, cuda_detail::launch_init(a, stream(s), grids_));
  }

  void do_count_nonfinite(StreamView s, const std::vector<FloatRange>& ranges, std::int64_t* partial,
                          std::int64_t* totals) override {
    if (ranges.empty()) return;
    const DeviceScope scope(ctx_);
    if (!begin_issue(scope)) return;
    for (const auto& a : kernels::finite_launches(ranges, partial, totals))
      if (!STRATA_CUDA_RECORD(*this, cuda_detail::launch_nonfinite(a, stream(s), grids_))) return;
  }

 private:
  static cudaStream_t stream(StreamView s) {
    STRATA_CHECK(s.state() != nullptr);  // an empty StreamView would mean the default stream
    return static_cast<CudaStream*>(s.state())->stream;
  }
  static cudaEvent_t event(EventView e) {
    STRATA_CHECK(e.state() != nullptr);
    return static_cast<CudaEvent*>(e.state())->event;
  }

  // Peer access from this GPU to `peer`'s memory, which CUDA leaves off (without it peer copies are
  // staged through host memory): turned on at the first copy from `peer` where the GPUs allow it
  // (cudaDeviceCanAccessPeer), once; this device must be current. It is a property of this GPU's
  // primary context, which a trainer on the GPU shares (PyTorch turns it on the same way); one
  // that the trainer turned on already is left so. Errors only mean staged copies: not recorded.
  void enable_peer_access(int peer) {
    const int self = ctx_.ordinal();
    if (peer == self || peer < 0 || peer >= 64) return;
    std::lock_guard<std::mutex> lock(peers_m_);
    const std::uint64_t bit = std::uint64_t{1} << peer;
    if (peers_tried_ & bit) return;
    peers_tried_ |= bit;
    int can = 0;
    if (cuda_detail::call_quietly([&] { return cudaDeviceCanAccessPeer(&can, self, peer); }) != cudaSuccess || !can)
      return;
    (void)cuda_detail::call_quietly([&] { return cudaDeviceEnablePeerAccess(peer, 0); });
  }

  // Whether to issue a copy, kernel or host task: not after a sticky error (as emu), and only
  // while this device is current (`scope`).
  bool begin_issue(const DeviceScope& scope) { return !failed() && entered(scope); }

  void issue_gathers(StreamView s, const std::vector<kernels::GatherArgs>& launches) {
    for (const auto& a : launches)
      if (!STRATA_CUDA_RECORD(*this, cuda_detail::launch_gather(a, stream(s), grids_))) return;
  }

  // Runs on a CUDA runtime thread once the work before it is done, possibly after this device
  // was destroyed (wrapped streams): it reads only the task. Skips the task after a sticky error,
  // as emu does. It must not call CUDA (the runtime forbids it; so does host_task's contract).
  static void CUDART_CB run_host_task(void* p) {
    std::unique_ptr<HostTask> task(static_cast<HostTask*>(p));
    if (!task->failed->load(std::memory_order_acquire)) task->fn();
  }

  const cuda_detail::KernelGrids grids_;  // each kernel's grid cap on this GPU (occupancy at creation)
  const PrimaryContext ctx_;              // this device's primary context, retained while the device lives
  CudaPinner pinner_;
  std::mutex error_m_;
  Status error_;
  std::mutex peers_m_;
  std::uint64_t peers_tried_ = 0;  // bit p: enable_peer_access(p) ran
  // Shared with the host tasks in flight, which may outlive the device (HostTask).
  const std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

CudaStream::CudaStream(CudaDevice* d, cudaStream_t s, bool owns) noexcept
    : StreamState(d), dev(d), stream(s), owned(owns) {}

CudaStream::~CudaStream() {
  if (!stream || !owned) return;
  const DeviceScope scope(dev->context());
  if (dev->entered(scope)) {
    STRATA_CUDA_RECORD(*dev, cudaStreamSynchronize(stream));
    STRATA_CUDA_RECORD(*dev, cudaStreamDestroy(stream));
  }
}

CudaEvent::~CudaEvent() {
  if (!event) return;
  const DeviceScope scope(dev->context());
  if (dev->entered(scope)) STRATA_CUDA_RECORD(*dev, cudaEventDestroy(event));
}

}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(int ordinal, std::size_t capacity, int numa_nodes) {
  STRATA_ASSIGN_OR_RETURN(const int count, cuda_devices());
  if (count == 0) return Status::unavailable("no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)");
  if (ordinal < 0 || ordinal >= count)
    return Status::unavailable("CUDA device " + std::to_string(ordinal) + " is not visible: " + std::to_string(count) +
                               " GPU(s) visible, ordinals [0, " + std::to_string(count) + ")");
  // The device's primary context, made current only while it is queried: the caller's current
  // device stays as it was.
  STRATA_ASSIGN_OR_RETURN(PrimaryContext ctx, PrimaryContext::retain(ordinal));
  const DeviceScope scope(ctx);
  STRATA_RETURN_IF_ERROR(scope.status());
  cudaDeviceProp prop{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal));
  std::size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  int sm_count = 0;
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, ordinal));
  // Each kernel's grid: as many blocks as the GPU holds at once, from its registers and shared memory.
  cuda_detail::KernelGrids grids;
  STRATA_CUDA_TRY(call_quietly([&] { return cuda_detail::query_kernel_grids(sm_count, &grids); }));
  for (int k = 0; k < cuda_detail::kKernelCount; ++k) {
    if (grids.blocks_per_sm[k] > 0) continue;
    const auto kernel = static_cast<cuda_detail::Kernel>(k);
    return Status::internal("CUDA device " + std::to_string(ordinal) + " (" + prop.name + ", sm_" +
                            std::to_string(prop.major) + std::to_string(prop.minor) + "): kernel " +
                            cuda_detail::kernel_name(kernel) + " cannot run there: no block of " +
                            std::to_string(cuda_detail::kernel_block(kernel)) +
                            " threads fits a multiprocessor (cudaOccupancyMaxActiveBlocksPerMultiprocessor is 0; "
                            "gpu/cuda/kernel_resources_sm90.txt lists each kernel's registers and shared memory)");
  }

  DeviceInfo info;
  info.backend = Backend::kCuda;
  info.name = prop.name;
  info.ordinal = ordinal;
  info.capacity = capacity > 0 ? std::min(free_bytes, capacity) : free_bytes;
  info.pci_bus_id = pci_bus_id_of(ordinal);
  info.numa_node = numa_node_of(info.pci_bus_id);
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(std::move(info), numa_nodes, grids, std::move(ctx)));
}

static_assert(cudaSuccess == detail::kCudaSuccess && cudaErrorNoDevice == detail::kCudaErrorNoDevice &&
                  cudaErrorInsufficientDriver == detail::kCudaErrorInsufficientDriver,
              "gpu/detail/cuda_probe.hpp: the cudaError_t values differ from this CUDA runtime's");

Result<int> cuda_devices() {
  detail::CudaProbe p;
  const cudaError_t err = cuda_detail::call_quietly([&] { return cudaGetDeviceCount(&p.count); });
  if (err == cudaSuccess) return detail::classify_cuda_probe(p);
  p.error = static_cast<int>(err);
  p.error_name = cudaGetErrorName(err);
  p.error_text = cudaGetErrorString(err);
  // Both work without a driver: the driver version is then 0.
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  if (cudaRuntimeGetVersion(&p.runtime_version) != cudaSuccess) p.runtime_version = 0;
  return detail::classify_cuda_probe(p);
}

bool cuda_backend_built() noexcept { return true; }

}  // namespace strata::gpu
