#pragma once
// The device layer: Device, Stream, Event, DeviceBuffer, PinnedBuffer, and the device operations
// the store needs. One interface, two backends: `cuda` (the CUDA runtime and gpu/cuda/*.cu) and
// `emu` (host memory with a capacity limit; each stream runs its work in order on its own worker
// thread). Both run one kernel source, gpu/kernels/bodies.hpp: as CUDA kernels, and on the CPU
// grid of gpu/kernels/host_grid.hpp. See docs/architecture.md, "The device layer".
//
// `emu` refuses what a GPU refuses, so tests without a GPU catch the same bugs: its device
// addresses cannot be dereferenced by the host (a load or store through one dies with SIGSEGV),
// copies must name their direction right and take their host side from pinned memory, and kernels
// must be given device or pinned memory; a violation becomes the sticky error (see
// gpu/detail/emu_device.cpp). Its frees wait for the device's queued work, as cudaFree does.
//
// The caller's current device (gpu/current_device.hpp): no operation changes which device or
// context the calling thread has current; each makes its own current for its duration and restores
// the caller's (cuda: gpu/cuda/device_scope.hpp). A trainer's own stream is reached through
// wrap_stream.
//
// Conventions (as CUDA): every operation that takes a StreamView is asynchronous and ordered on
// that stream; the caller keeps its buffers alive until the work is done (synchronize, or an event
// recorded after it). Errors of asynchronous work are sticky: the device stops running work and
// the next synchronize()/status() returns the error. Owners are move-only; views are passed by value.
//
// Bit-exactness: both backends' device operations give the bits of the CPU kernels of host/ (and
// so of the reference), given -ffp-contract=off for host code and -fmad=false for CUDA code (the
// build sets both). Where it stops: a NaN made or passed on by arithmetic is the canonical NaN
// 0x7fffffff on a GPU but keeps an operand's payload (or is 0xffc00000) on x86, so NaN outputs may
// differ in their bits between backends; copies and record moves (pack/unpack) keep bits. The
// emulated device runs its kernels and stream work with the default FP environment (round to
// nearest, no flush-to-zero / denormals-are-zero), whatever the thread that made it or calls it
// set (host/fp_env.hpp), as a GPU ignores the host's.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/status.hpp"
#include "gpu/counters.hpp"
#include "gpu/types.hpp"
#include "host/pinner.hpp"

namespace strata {
class Topology;
}  // namespace strata

namespace strata::gpu {

class Device;

namespace detail {
/// Backend-defined state of a stream or an event. A stream knows its device.
struct StreamState {
  explicit StreamState(Device* d) noexcept : device(d) {}
  virtual ~StreamState() = default;
  Device* const device;  ///< the device whose work the stream runs
};
struct EventState {
  virtual ~EventState() = default;
};
}  // namespace detail

/// Non-owning handle of a stream (valid while its Stream lives).
class StreamView {
 public:
  StreamView() = default;
  explicit StreamView(detail::StreamState* s) noexcept : s_(s) {}
  detail::StreamState* state() const noexcept { return s_; }
  /// The device the stream belongs to (nullptr for an empty view). Every Device operation that
  /// takes a StreamView refuses a stream of another device (or an empty view) with this: it issues
  /// nothing and makes that the device's sticky error, naming the operation.
  Device* device() const noexcept { return s_ ? s_->device : nullptr; }

 private:
  detail::StreamState* s_ = nullptr;
};

/// An in-order queue of device work. Move-only; destroying it waits for its work, except for a
/// stream of Device::wrap_stream, whose destruction neither waits nor destroys the native stream.
class Stream {
 public:
  Stream() = default;
  explicit Stream(std::unique_ptr<detail::StreamState> s) noexcept : s_(std::move(s)) {}
  StreamView view() const noexcept { return StreamView(s_.get()); }
  explicit operator bool() const noexcept { return s_ != nullptr; }

 private:
  std::unique_ptr<detail::StreamState> s_;
};

/// Non-owning handle of an event.
class EventView {
 public:
  EventView() = default;
  explicit EventView(detail::EventState* e) noexcept : e_(e) {}
  detail::EventState* state() const noexcept { return e_; }

 private:
  detail::EventState* e_ = nullptr;
};

/// A marker in a stream that other streams and the host can wait for. Move-only.
class Event {
 public:
  Event() = default;
  explicit Event(std::unique_ptr<detail::EventState> e) noexcept : e_(std::move(e)) {}
  EventView view() const noexcept { return EventView(e_.get()); }
  explicit operator bool() const noexcept { return e_ != nullptr; }

 private:
  std::unique_ptr<detail::EventState> e_;
};

namespace detail {
/// A block from a Device, returned to it on destruction. Move-only. kPinned: page-locked host
/// memory (PinnedBuffer), else device memory (DeviceBuffer).
template <bool kPinned>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer t(std::move(o));
    swap(t);
    return *this;
  }
  ~Buffer();
  void* data() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  friend class strata::gpu::Device;
  Buffer(Device* d, void* p, std::size_t n) noexcept : dev_(d), ptr_(p), bytes_(n) {}
  void swap(Buffer& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  Device* dev_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};
}  // namespace detail

/// Device memory, freed on destruction. Move-only. The free waits for the work issued so far to
/// every stream of the device (cuda: cudaFree; emu likewise), so it must not happen in a host_task.
using DeviceBuffer = detail::Buffer<false>;
/// Page-locked host memory usable by asynchronous copies. Move-only. Freed as DeviceBuffer is
/// (cuda: cudaFreeHost).
using PinnedBuffer = detail::Buffer<true>;

/// Options of the emulated device.
struct EmuOptions {
  std::size_t capacity = std::size_t{1} << 30;  ///< bytes of "HBM"; allocating past it fails like a full GPU
  int threads = 0;                              ///< oneTBB threads for each stream's kernels (0: all cores)
  int max_delay_us = 0;              ///< > 0: sleep a random 0..max µs before every stream op (race hunting)
  std::uint64_t seed = 1;            ///< seed of the delays
  std::int64_t fail_after_ops = -1;  ///< >= 0: the op with this index (0-based, all streams) fails with a device fault
  int numa_nodes = 1;                ///< NUMA nodes for the host DRAM counters
  /// Bytes of pinned memory (allocate_pinned) the device may hand out at once; past it
  /// allocate_pinned fails with ResourceExhausted, as cudaHostAlloc does when page-locked memory
  /// runs out. Default: no limit.
  std::size_t pinned_capacity = SIZE_MAX;
};

/// A GPU, real or emulated. Thread-safe: several threads may issue work on distinct streams.
///
/// The public operations validate nothing beyond what is documented (the store validates input);
/// they count link bytes at issue time and forward to the backend.
class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const noexcept { return info_; }
  LinkCounters& counters() noexcept { return counters_; }
  /// Registers host memory for DMA (cudaHostRegister under cuda; under emu a process-wide record
  /// of the ranges, which copies and kernels check; an overlapping pin is refused and an unpin of
  /// a range that was not pinned becomes the device's sticky error).
  virtual Pinner& pinner() noexcept = 0;

  // ---- memory ----
  /// Device memory; ResourceExhausted (naming the request and what is free) past the capacity.
  /// The scratch of the hot rows (backward_update) never stands in the way: a request that does
  /// not fit frees it (after the work queued so far, as every free) and is tried again; while
  /// another thread's operation uses the scratch, the request waits for it to finish issuing (that
  /// holder waits for nothing but queued device work, which never waits for this thread: no
  /// host_task allocates).
  Result<DeviceBuffer> allocate(std::size_t bytes);
  /// Pinned host memory for staging: where place_pinned named a node, whole pages mapped and bound
  /// to it (host/numa_arena.hpp map_on_node) and then registered (cuda: cudaHostRegister, portable
  /// and mapped; emu: recorded as allocate_pinned memory), else the backend's allocation (cuda:
  /// cudaMallocHost; emu: the heap). Either way ResourceExhausted past the pinned memory there is
  /// (emu: EmuOptions::pinned_capacity), and the free waits as cudaFreeHost does.
  Result<PinnedBuffer> allocate_pinned(std::size_t bytes);
  /// Puts the memory of later allocate_pinned calls on logical NUMA node `node` of `topo` (which
  /// outlives those calls; the store's home node, store/detail/numa_home.hpp), so that the staging a
  /// GPU copies through sits on the GPU's node; node -1 undoes it. Where `topo` cannot bind memory
  /// (Topology::binds_memory false) nothing is placed and pinned_note() says so; a block that cannot
  /// be mapped and bound there, or registered (for a reason other than ResourceExhausted), is
  /// allocated as without a node, and the note says that too. Call it
  /// before the pinned allocations it is meant for (blocks already allocated stay where they are).
  /// Thread-safe.
  void place_pinned(const Topology& topo, int node);
  /// The node place_pinned put pinned memory on (-1: none, the backend's allocation; also when
  /// every block allocated since fell back to it).
  int pinned_node() const;
  /// Why pinned memory is placed less than place_pinned asked ("" when it is not; it begins
  /// "placement failed" when no block was placed and some fell back).
  std::string pinned_note() const;
  /// Live pinned blocks allocate_pinned placed on place_pinned's node.
  std::size_t placed_pinned_blocks() const;
  std::size_t bytes_in_use() const noexcept;
  std::size_t peak_bytes() const noexcept;
  /// Allocations, frees and events so far (thread-safe snapshot).
  ResourceCounts resource_counts() const noexcept;
  /// Ok when [p, p + bytes) is device memory of this device (emu: inside one live allocation of
  /// it; cuda: cudaPointerGetAttributes says device memory of this ordinal at both ends), else
  /// InvalidArgument saying what the range is instead ("pageable host memory", "device memory of
  /// emu device 3", ...). Empty ranges pass. Never touches the memory.
  virtual Status check_device_range(const void* p, std::size_t bytes) const = 0;

  // ---- streams and events ----
  virtual Result<Stream> create_stream() = 0;
  /// A Stream that issues to a native stream of this device owned by someone else (a trainer's),
  /// so that work given it is ordered after what the owner queued there. Destroying it neither
  /// waits for the work nor destroys the native stream; the owner keeps the native stream alive
  /// while the wrapper or work on it lives. Destroying the device need not wait for work issued to a
  /// wrapper either (cuda does not; emu drains its default stream): the buffers that work uses
  /// (device, pinned or registered memory) and what a host_task captures must outlive it, e.g.
  /// until the owner synchronizes its stream. A cuda host_task still queued there when the
  /// device goes runs later without touching the device.
  ///   cuda: `native` is a cudaStream_t of this device's primary context (the runtime API's, so
  ///     PyTorch's torch.cuda.current_stream().cuda_stream); nullptr and cudaStreamLegacy mean the
  ///     legacy default stream (PyTorch's default stream, which is 0). cudaStreamPerThread is
  ///     refused: Strata issues from several threads, and each would reach another stream (a
  ///     trainer built with per-thread default streams passes its stream explicitly). A stream
  ///     of another device or context is InvalidArgument, as is a handle the driver reports as
  ///     invalid (cuStreamGetCtx); a pointer that never was a stream is undefined, as in CUDA.
  ///   emu: `native` is the StreamView::state() of a live stream of this device (one it created,
  ///     or a wrapper); nullptr means the device's default stream (made on first use, lives as
  ///     long as the device). A stream of another emu device, or a pointer that is no live emu
  ///     stream, is InvalidArgument (checked without dereferencing it).
  virtual Result<Stream> wrap_stream(void* native) = 0;
  /// An event (counted in resource_counts()).
  Result<Event> create_event();
  /// Marks the current end of `s`; `e` completes when the work before it has run.
  virtual void record(EventView e, StreamView s) = 0;
  /// Work issued to `s` after this call waits for the last record() of `e` (no-op if never recorded).
  virtual void wait(StreamView s, EventView e) = 0;
  /// Blocks the host until `s` is idle; returns the device's sticky error, if any.
  virtual Status synchronize(StreamView s) = 0;
  /// Blocks the host until `e` (its last record) completed; returns the sticky error, if any.
  virtual Status synchronize(EventView e) = 0;
  /// Whether `e` completed (non-blocking).
  virtual bool ready(EventView e) = 0;
  /// Whether `s` is a stream of this device (false for an empty view and for another device's).
  bool owns(StreamView s) const noexcept { return s.device() == this; }
  /// The sticky error of asynchronous work (ok while none happened).
  virtual Status status() = 0;

  // ---- copies (asynchronous) ----
  // As cudaMemcpyAsync with an explicit kind: device pointers are memory of this device, host
  // pointers pinned (allocate_pinned or registered through pinner()). The cuda runtime copies
  // pageable memory synchronously; emu refuses it (sticky error), as it refuses a device pointer on
  // the host side, a host pointer on the device side, or a range past the end of its allocation.
  void copy_h2d(StreamView s, void* dst_device, const void* src_host, std::size_t bytes);
  void copy_d2h(StreamView s, void* dst_host, const void* src_device, std::size_t bytes);
  void copy_d2d(StreamView s, void* dst_device, const void* src_device, std::size_t bytes);
  /// Copies `bytes` from device memory of `src_device` (another Device object of the same backend:
  /// another emu device, another CUDA device, or a second Device on the same CUDA ordinal) into
  /// device memory of this device, ordered on `s` (a stream of this device). The caller orders the
  /// source's producer before the call (e.g. synchronizes it) and keeps both ranges alive until the
  /// copy is done. cuda: cudaMemcpyPeerAsync (direct over NVLink/PCIe where peer access is
  /// possible, else staged by the driver; on one ordinal a device-to-device copy). emu: a memcpy
  /// on the stream's worker after checking that `src` lies in a live allocation of `src_device`.
  /// Counts HBM writes on this device and HBM reads on `src_device` (the bytes between ranks are
  /// the communicators' to count, dispatch/communicator.hpp CommCounters). A source device of
  /// another backend, or wrong memory on either side, becomes the sticky error.
  void copy_peer(StreamView s, void* dst_device, Device& src_device, const void* src, std::size_t bytes);
  /// Runs `fn` on the host when the work before it on `s` is done; later work on `s` waits for it.
  /// `fn` must not issue device work nor allocate or free device or pinned memory, and nor may
  /// destroying what it captures (CUDA forbids CUDA calls in a stream callback; an allocation may
  /// wait for a scratch whose holder waits for `fn`, see allocate; emu makes a free on the stream's
  /// own thread the sticky error, and a free on a thread `fn` waits for, e.g. a oneTBB worker of a
  /// loop in it, hangs, as under CUDA). Emu and cuda destroy what `fn` captured before the work after
  /// it on `s` runs, so the caller's thread may free it once it synchronized `s`. Exceptions are a
  /// programmer error.
  virtual void host_task(StreamView s, std::function<void()> fn) = 0;

  // ---- device operations (one launch per call covers every feature given: table-batched) ----
  /// Pooled or unpooled lookup by slot: for each feature, out = pool(rows of `pool` at f.rows).
  void gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features);
  /// Zero-copy lookup: the device reads rows of a pinned host table (f.rows are host row ids).
  /// `table.bases` is read on the host at the call. Counts the rows' bytes as H2D and as host DRAM
  /// reads of node 0 (row ids live in device memory, so the host cannot split them by node).
  void gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features);
  /// Fused backward by slot: gradient reduction per unique slot + optimizer, in place in `pool`.
  /// Rows used more than gpu/kernels' kHotUses times are summed segment by segment into partial
  /// sums in the device's scratch (with_scratch), which grows to twice the most one call needed
  /// (or exactly that when twice does not fit) and stays (counted in bytes_in_use): (keys / 128 +
  /// keys / 257 + 1) * dim floats for each feature of `keys` > kHotUses key positions, whether or
  /// not a row is hot in this batch (so that batches of one size size it once), summed over the
  /// features of a launch (kernels::kMaxFeaturesPerLaunch of them). Without room for it the hot
  /// rows are summed as the others are, by a warp each: the same bits either way.
  void backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features);
  /// dst[i] = record of slot slots[i] (whole records: weights and state).  slots (n) device, dst (n, stride) device.
  void pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst);
  /// record of slot slots[i] = src[i].  slots (n) device, src (n, stride) device.
  void unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src);
  /// Column slices of matrix rows, as a sharded exchange sends them: packed[i] = the floats
  /// [col, col + rows.dim) of row slots[i] of `rows`, a SlotPool viewing a row-major matrix
  /// (`slots` rows of `stride` floats; state_dim unused). Bits are kept (32-bit moves).
  /// slots (n) device, packed (n, rows.dim) device. col + rows.dim <= rows.stride.
  void take_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n, float* packed);
  /// The floats [col, col + rows.dim) of row slots[i] of `rows` = packed[i] (take_columns reversed).
  void put_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n,
                   const float* packed);
  /// The reduction half of backward_update: the first sums.dim floats of record unique_slots[u] of
  /// `sums` = the summed gradient of unique row u of each feature, in backward_update's order and
  /// arithmetic (so the bits of host/kernels.hpp's reduce_unique_grads), with the same scratch and
  /// hot lists (which must be right, as there: emu checks them). The features' `step` is unused;
  /// `sums` is typically (num_unique, dim)
  /// with unique_slots 0..num_unique-1, and has no overflow region (a programmer error).
  /// Where the rows live elsewhere (dispatch sends the sums to the ranks that hold them).
  void reduce_grads(StreamView s, SlotPool sums, const std::vector<UpdateFeature>& features);
  /// record of slot slots[i] = the weights and state at rows[i] (SlotPool::row_bytes: the words
  /// core/record_layout.hpp lays them out in, without the record's padding), read by the device
  /// from host memory (zero-copy: rows are device_address()es of pinned host records). slots, rows
  /// (n) device; slots may be null for slots 0..n-1.
  void records_from_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* const* rows);
  /// the weights and state at rows[i] = those of the record of slot slots[i], written by the
  /// device into host memory (zero-copy, as records_from_host). slots, rows (n) device.
  void records_to_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows);
  /// The address under which the device reads and writes `host`, which must lie in memory
  /// registered through pinner() (cudaHostGetDevicePointer under cuda; the same address under emu).
  virtual Result<float*> device_address(float* host) = 0;
  /// totals[i] = the NaN and Inf values among ranges[i] (device memory), counted on the device;
  /// `partial` (kernels::finite_partials(ranges) int64, device) is scratch, totals (ranges.size()
  /// int64) device. Reads each float once.
  void count_nonfinite(StreamView s, const std::vector<FloatRange>& ranges, std::int64_t* partial,
                       std::int64_t* totals);
  /// Records [first_slot, first_slot + n) of `pool` = the initial rows of a table (RecordInit:
  /// init_row and init_state of core/row_math.hpp, padding zero), computed on the device.
  void init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n, const RecordInit& init);

 protected:
  Device(DeviceInfo info, int numa_nodes) : info_(std::move(info)), counters_(numa_nodes) {}

  /// Whether `s` is a stream of this device (a pointer compare). If not, makes that the sticky
  /// error (InvalidArgument naming `op` and the stream's device) and the operation must issue nothing.
  bool own_stream(StreamView s, const char* op);
  /// Keeps the first error of asynchronous work (the sticky error). Thread-safe.
  virtual void record_error(Status st) = 0;
  /// Calls `issue` with the device's scratch, at least `bytes` of device memory, for what it
  /// issues to `s`; with nullptr when `bytes` is 0 or the scratch cannot grow that far (the
  /// operation then issues without it). The scratch grows as gpu/grow_buffer.hpp does
  /// (Growth::kTwiceOrExact) and is kept, so a steady run allocates nothing, until an allocation
  /// needs its room (allocate); its event is made with the first scratch. A need that does not fit
  /// in place of the old scratch is not tried (the old one is kept), nor is one that failed, until
  /// memory was freed. Calls are serialized (`issue` must not wait for another thread's device
  /// call), and the work `issue` queues on `s` waits for the last call's (an event), whichever
  /// stream that was on.
  void with_scratch(StreamView s, std::size_t bytes, const std::function<void(void*)>& issue);
  /// Frees the scratch: the first thing a backend's destructor does (the free needs the backend).
  void free_scratch() noexcept;

  virtual Result<Event> do_create_event() = 0;
  virtual Result<void*> do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes) noexcept = 0;
  virtual Result<void*> do_allocate_pinned(std::size_t bytes) = 0;
  virtual void do_deallocate_pinned(void* p, std::size_t bytes) noexcept = 0;
  /// Makes `bytes` of host memory at `p` (mapped by allocate_pinned on place_pinned's node) pinned
  /// memory of this device, as do_allocate_pinned's: the same capacity (ResourceExhausted) and, once
  /// freed, the same waits. An error leaves it unregistered.
  virtual Status do_register_pinned(void* p, std::size_t bytes) = 0;
  /// Undoes do_register_pinned as do_deallocate_pinned frees (waits, sticky errors); false when the
  /// range must stay mapped (emu: a free refused and parked, see gpu/detail/emu_device.cpp).
  virtual bool do_unregister_pinned(void* p, std::size_t bytes) noexcept = 0;
  enum class CopyKind { kH2D, kD2H, kD2D };
  virtual void do_copy(StreamView s, void* dst, const void* src, std::size_t bytes, CopyKind kind) = 0;
  /// copy_peer after the stream and backend checks (src_device has this device's backend).
  virtual void do_copy_peer(StreamView s, void* dst, Device& src_device, const void* src, std::size_t bytes) = 0;
  virtual void do_gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features) = 0;
  virtual void do_gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features) = 0;
  virtual void do_backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features) = 0;
  virtual void do_pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) = 0;
  virtual void do_unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) = 0;
  /// take_columns (put = false) and put_columns (put = true).
  virtual void do_move_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n,
                               float* packed, bool put) = 0;
  virtual void do_reduce_grads(StreamView s, SlotPool sums, const std::vector<UpdateFeature>& features) = 0;
  virtual void do_records_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows,
                               bool to_host) = 0;
  virtual void do_init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n,
                               const RecordInit& init) = 0;
  virtual void do_count_nonfinite(StreamView s, const std::vector<FloatRange>& ranges, std::int64_t* partial,
                                  std::int64_t* totals) = 0;

 private:
  template <bool>
  friend class detail::Buffer;
  void release(void* p, std::size_t bytes) noexcept;
  void release_pinned(void* p, std::size_t bytes) noexcept;
  Result<DeviceBuffer> allocate_once(std::size_t bytes);
  /// with_scratch's growth to `bytes` (scratch_m_ held): whether the scratch holds them.
  bool grow_scratch(std::size_t bytes);

  DeviceInfo info_;
  LinkCounters counters_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::uint64_t> allocations_{0}, frees_{0}, events_{0};
  std::mutex scratch_m_;  ///< held for a with_scratch call
  DeviceBuffer scratch_;
  Event scratch_used_;  ///< recorded after the work of the last with_scratch call
  /// The least need whose growth failed (SIZE_MAX: none since the last success), and bytes_in_use
  /// then: retried only once less is in use.
  std::size_t scratch_refused_ = SIZE_MAX, scratch_refused_in_use_ = 0;
  mutable std::mutex pinned_m_;            ///< guards the six below
  const Topology* pinned_topo_ = nullptr;  ///< place_pinned's topology (null: not placed)
  int pinned_node_ = -1;
  std::string pinned_note_;
  std::unordered_set<void*> placed_;  ///< live pinned blocks of map_on_node (freed by unmapping)
  std::size_t placed_blocks_ = 0;     ///< blocks placed since place_pinned
  std::size_t unplaced_blocks_ = 0;   ///< blocks since place_pinned that fell back to do_allocate_pinned
};

/// An emulated device (always available).
Result<std::unique_ptr<Device>> make_emu_device(const EmuOptions& options = {});
/// CUDA device `ordinal`: Unavailable when the CUDA backend was not built or no GPU is visible.
/// `capacity` > 0 caps allocations below the GPU's free memory. `numa_nodes`: NUMA nodes of the
/// host tables, for the per-node host DRAM counters (as EmuOptions::numa_nodes).
Result<std::unique_ptr<Device>> make_cuda_device(int ordinal = 0, std::size_t capacity = 0, int numa_nodes = 1);
template <bool kPinned>
detail::Buffer<kPinned>::~Buffer() {
  if (!dev_ || !ptr_) return;
  if constexpr (kPinned) {
    dev_->release_pinned(ptr_, bytes_);
  } else {
    dev_->release(ptr_, bytes_);
  }
}

/// Number of visible CUDA GPUs. 0 means none here: no GPU, no NVIDIA driver installed,
/// CUDA_VISIBLE_DEVICES hides them all, or this build has no CUDA backend. Unavailable means CUDA
/// is installed but broken (a driver older than the CUDA runtime of this build, a driver that
/// fails to initialize, ...): the message names the CUDA error, the driver's and the runtime's
/// CUDA versions, and what to check. Callers must not read an error as "no GPU": `backend: auto`
/// refuses to start on it rather than fall back to emu. Thread-safe; creates no CUDA context.
Result<int> cuda_devices();
/// Whether this build contains the CUDA backend.
bool cuda_backend_built() noexcept;

}  // namespace strata::gpu
