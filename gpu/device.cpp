#include "gpu/device.hpp"

#include <cstdint>
#include <string>

#include "gpu/grow_buffer.hpp"
#include "host/numa_arena.hpp"

namespace strata::gpu {

const char* to_string(Backend b) noexcept { return b == Backend::kCuda ? "cuda" : "emu"; }

namespace {
// The device whose with_scratch call this thread is in (its scratch_m_ is held here), if any.
thread_local const Device* t_in_scratch = nullptr;
}  // namespace

Result<DeviceBuffer> Device::allocate(std::size_t bytes) {
  Result<DeviceBuffer> b = allocate_once(bytes);
  if (b || b.status().code() != StatusCode::kResourceExhausted) return b;
  // The scratch yields, unless this thread's with_scratch call holds it (the scratch's own growth).
  // Another thread's call is waited for: it waits on nothing but queued device work (its growth's
  // free), which never waits for an allocating thread (a host task may not allocate).
  if (t_in_scratch == this) return b;
  std::unique_lock<std::mutex> lock(scratch_m_);
  scratch_ = DeviceBuffer();
  lock.unlock();
  return allocate_once(bytes);
}

Result<DeviceBuffer> Device::allocate_once(std::size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  std::size_t used = in_use_.load();
  do {
    if (used + bytes > info_.capacity)
      return Status::resource_exhausted("device " + info_.name + ": cannot allocate " + std::to_string(bytes) +
                                        " bytes; " + std::to_string(info_.capacity - used) + " of " +
                                        std::to_string(info_.capacity) + " bytes free");
  } while (!in_use_.compare_exchange_weak(used, used + bytes));
  Result<void*> p = do_allocate(bytes);
  if (!p) {
    in_use_.fetch_sub(bytes);
    return p.status();
  }
  std::size_t now = used + bytes, peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  return DeviceBuffer(this, p.value(), bytes);
}

Result<PinnedBuffer> Device::allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return PinnedBuffer();
  const Topology* topo = nullptr;
  int node = -1;
  {
    std::lock_guard<std::mutex> lock(pinned_m_);
    topo = pinned_topo_;
    node = pinned_node_;
  }
  void* p = nullptr;
  std::string unplaced;  // why a block meant for `node` was not put there
  if (topo) {
    // Bound before it is registered: registration faults the pages in, under the binding.
    Result<void*> m = map_on_node(*topo, bytes, node);
    if (m) {
      if (Status st = do_register_pinned(m.value(), bytes); st.is_ok()) {
        p = m.value();
        std::lock_guard<std::mutex> lock(pinned_m_);
        placed_.insert(p);
        ++placed_blocks_;
      } else {
        unmap_on_node(m.value(), bytes);
        // Out of pinned memory is so for the backend's allocation too; any other failure falls back.
        if (st.code() == StatusCode::kResourceExhausted) return st;
        unplaced = st.message();
      }
    } else {
      unplaced = m.status().message();
    }
  }
  if (!p) {
    STRATA_ASSIGN_OR_RETURN(p, do_allocate_pinned(bytes));
    if (!unplaced.empty()) {
      std::lock_guard<std::mutex> lock(pinned_m_);
      ++unplaced_blocks_;
      if (pinned_note_.empty())
        pinned_note_ = "pinned staging: a block of " + std::to_string(bytes) + " bytes not placed on node " +
                       std::to_string(node) + " (" + unplaced + ")";
    }
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  return PinnedBuffer(this, p, bytes);
}

void Device::place_pinned(const Topology& topo, int node) {
  STRATA_CHECK(node < topo.num_nodes());
  const bool binds = node < 0 || topo.binds_memory();
  std::lock_guard<std::mutex> lock(pinned_m_);
  pinned_topo_ = node >= 0 && binds ? &topo : nullptr;
  pinned_node_ = pinned_topo_ ? node : -1;
  pinned_note_ = binds ? "" : "pinned staging not placed on node " + std::to_string(node) + " (mbind unavailable)";
  placed_blocks_ = unplaced_blocks_ = 0;
}

int Device::pinned_node() const {
  std::lock_guard<std::mutex> lock(pinned_m_);
  return unplaced_blocks_ > 0 && placed_blocks_ == 0 ? -1 : pinned_node_;
}

std::string Device::pinned_note() const {
  std::lock_guard<std::mutex> lock(pinned_m_);
  if (unplaced_blocks_ > 0 && placed_blocks_ == 0)
    return "placement failed: no pinned block placed on node " + std::to_string(pinned_node_) + "; " + pinned_note_;
  return pinned_note_;
}

std::size_t Device::placed_pinned_blocks() const {
  std::lock_guard<std::mutex> lock(pinned_m_);
  return placed_.size();
}

Result<Event> Device::create_event() {
  STRATA_ASSIGN_OR_RETURN(Event e, do_create_event());
  events_.fetch_add(1, std::memory_order_relaxed);
  return e;
}

ResourceCounts Device::resource_counts() const noexcept {
  return {allocations_.load(std::memory_order_relaxed), frees_.load(std::memory_order_relaxed),
          events_.load(std::memory_order_relaxed)};
}

std::size_t Device::bytes_in_use() const noexcept { return in_use_.load(); }
std::size_t Device::peak_bytes() const noexcept { return peak_.load(); }

void Device::with_scratch(StreamView s, std::size_t bytes, const std::function<void(void*)>& issue) {
  if (bytes == 0) {
    issue(nullptr);
    return;
  }
  const std::lock_guard<std::mutex> lock(scratch_m_);
  struct InScratch {
    explicit InScratch(const Device* d) noexcept : previous(t_in_scratch) { t_in_scratch = d; }
    ~InScratch() { t_in_scratch = previous; }
    const Device* previous;
  } in_scratch(this);
  if (!scratch_used_) {  // once, with the first scratch
    Result<Event> e = create_event();
    if (e) scratch_used_ = std::move(e).value();
  }
  if (!scratch_used_ || !grow_scratch(bytes)) {
    issue(nullptr);
    return;
  }
  wait(s, scratch_used_.view());
  issue(scratch_.data());
  record(scratch_used_.view(), s);
}

bool Device::grow_scratch(std::size_t bytes) {
  if (scratch_.bytes() >= bytes) return true;
  // Nothing to try when the need does not fit even in place of the old scratch (allocate_once's
  // test): the old one is kept, with no free (a device-wide sync) nor allocation.
  const std::size_t in_use = in_use_.load();
  if (bytes > info_.capacity - (in_use - scratch_.bytes())) return false;
  // Nor when a need no larger than this one failed and nothing was freed since.
  if (bytes >= scratch_refused_ && in_use >= scratch_refused_in_use_) return false;
  // Growing frees the old scratch first, which waits for the device's queued work (its last user's too).
  if (grow_buffer(scratch_, bytes, *this, Growth::kTwiceOrExact).is_ok()) {
    scratch_refused_ = SIZE_MAX;
    return true;
  }
  scratch_refused_ = bytes;
  scratch_refused_in_use_ = in_use_.load();
  return false;
}

void Device::free_scratch() noexcept {
  const std::lock_guard<std::mutex> lock(scratch_m_);
  scratch_ = DeviceBuffer();
  scratch_used_ = Event();
  scratch_refused_ = SIZE_MAX;
}

void Device::release(void* p, std::size_t bytes) noexcept {
  do_deallocate(p, bytes);
  in_use_.fetch_sub(bytes);
  frees_.fetch_add(1, std::memory_order_relaxed);
}
void Device::release_pinned(void* p, std::size_t bytes) noexcept {
  bool placed = false;
  {
    std::lock_guard<std::mutex> lock(pinned_m_);
    placed = placed_.erase(p) > 0;
  }
  if (!placed) {
    do_deallocate_pinned(p, bytes);
  } else if (do_unregister_pinned(p, bytes)) {
    unmap_on_node(p, bytes);
  }
  frees_.fetch_add(1, std::memory_order_relaxed);
}

namespace {
// "emu", "NVIDIA H100 (CUDA device 1)": a device as messages name it.
std::string describe(const DeviceInfo& d) {
  return d.backend == Backend::kCuda ? d.name + " (CUDA device " + std::to_string(d.ordinal) + ")" : d.name;
}
}  // namespace

bool Device::own_stream(StreamView s, const char* op) {
  if (s.device() == this) return true;
  const Device* other = s.device();
  record_error(Status::invalid_argument(
      "device " + describe(info_) + ": " + op + " on " +
      (other ? "a stream of another device, " + describe(other->info()) : std::string("an empty stream view")) +
      "; a device runs work only on the streams it created or wrapped"));
  return false;
}

void Device::copy_h2d(StreamView s, void* dst, const void* src, std::size_t bytes) {
  if (!own_stream(s, "copy_h2d")) return;
  counters_.add_h2d(bytes);
  counters_.add_hbm_write(bytes);
  do_copy(s, dst, src, bytes, CopyKind::kH2D);
}
void Device::copy_d2h(StreamView s, void* dst, const void* src, std::size_t bytes) {
  if (!own_stream(s, "copy_d2h")) return;
  counters_.add_d2h(bytes);
  counters_.add_hbm_read(bytes);
  do_copy(s, dst, src, bytes, CopyKind::kD2H);
}
void Device::copy_d2d(StreamView s, void* dst, const void* src, std::size_t bytes) {
  if (!own_stream(s, "copy_d2d")) return;
  counters_.add_hbm_read(bytes);
  counters_.add_hbm_write(bytes);
  do_copy(s, dst, src, bytes, CopyKind::kD2D);
}
void Device::copy_peer(StreamView s, void* dst, Device& src_device, const void* src, std::size_t bytes) {
  if (!own_stream(s, "copy_peer")) return;
  if (src_device.info().backend != info_.backend) {
    record_error(Status::invalid_argument("device " + describe(info_) + ": copy_peer of " + std::to_string(bytes) +
                                          " bytes from device " + describe(src_device.info()) +
                                          ": both devices must have the same backend"));
    return;
  }
  counters_.add_hbm_write(bytes);
  src_device.counters().add_hbm_read(bytes);
  do_copy_peer(s, dst, src_device, src, bytes);
}

namespace {
constexpr std::uint64_t kF = sizeof(float);

// Index bytes a lookup reads besides the rows: offsets, row ids, weights.
std::uint64_t index_bytes(const LookupFeature& f) {
  return static_cast<std::uint64_t>(f.batch + 1) * 8 +
         static_cast<std::uint64_t>(f.num_keys) * (8 + (f.weights ? kF : 0));
}
std::uint64_t out_rows(const LookupFeature& f) {
  return static_cast<std::uint64_t>(f.pooling == Pooling::kNone ? f.num_keys : f.batch);
}
}  // namespace

void Device::gather_pool(StreamView s, SlotPool pool, const std::vector<LookupFeature>& features) {
  if (!own_stream(s, "gather_pool")) return;
  for (const auto& f : features) {
    counters_.add_hbm_read(static_cast<std::uint64_t>(f.num_keys) * pool.dim * element_bytes(pool.dtype) +
                           index_bytes(f));
    counters_.add_hbm_write(out_rows(f) * pool.dim * element_bytes(f.out_dtype));
  }
  do_gather_pool(s, pool, features);
}

void Device::gather_pool_host(StreamView s, RowRef table, const std::vector<LookupFeature>& features) {
  if (!own_stream(s, "gather_pool_host")) return;
  for (const auto& f : features) {
    const std::uint64_t rows = static_cast<std::uint64_t>(f.num_keys) * table.dim * element_bytes(table.dtype);
    counters_.add_h2d(rows);
    counters_.add_host_read(0, rows);
    counters_.add_hbm_read(index_bytes(f));
    counters_.add_hbm_write(out_rows(f) * table.dim * element_bytes(f.out_dtype));
  }
  do_gather_pool_host(s, table, features);
}

void Device::backward_update(StreamView s, SlotPool pool, const std::vector<UpdateFeature>& features) {
  if (!own_stream(s, "backward_update")) return;
  // Half elements rounded stochastically draw their bits by row: without the rows the kernels
  // (which cannot tell) would give every row the bits of row 0. Both backends refuse it alike.
  const bool half = pool.dtype != DType::kF32 || pool.state_dtype != DType::kF32;
  for (std::size_t i = 0; i < features.size(); ++i) {
    const UpdateFeature& f = features[i];
    if (half && f.step.round.stochastic && f.num_unique > 0 && f.unique_rows == nullptr) {
      record_error(Status::invalid_argument("device " + describe(info_) + ": backward_update feature " +
                                            std::to_string(i) +
                                            ": half elements rounded stochastically need unique_rows (their table "
                                            "rows key the rounding bits), got nullptr"));
      return;
    }
  }
  for (const auto& f : features) {
    const std::uint64_t grad_rows = static_cast<std::uint64_t>(f.pooling == Pooling::kNone ? f.num_keys : f.batch);
    const std::uint64_t rec = static_cast<std::uint64_t>(pool.row_bytes());
    counters_.add_hbm_read(grad_rows * pool.dim * kF + static_cast<std::uint64_t>(f.num_unique) * (rec + 16) +
                           static_cast<std::uint64_t>(f.num_keys) * 8);
    counters_.add_hbm_write(static_cast<std::uint64_t>(f.num_unique) * rec);
  }
  do_backward_update(s, pool, features);
}

void Device::pack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* dst) {
  if (!own_stream(s, "pack_records")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(pool.record_bytes());
  counters_.add_hbm_read(b + static_cast<std::uint64_t>(n) * 8);
  counters_.add_hbm_write(b);
  do_pack_records(s, pool, slots, n, dst);
}

void Device::unpack_records(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, const float* src) {
  if (!own_stream(s, "unpack_records")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(pool.record_bytes());
  counters_.add_hbm_read(b + static_cast<std::uint64_t>(n) * 8);
  counters_.add_hbm_write(b);
  do_unpack_records(s, pool, slots, n, src);
}

void Device::take_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n,
                          float* packed) {
  if (!own_stream(s, "take_columns")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(rows.dim) * kF;
  counters_.add_hbm_read(b + static_cast<std::uint64_t>(n) * 8);
  counters_.add_hbm_write(b);
  do_move_columns(s, rows, col, slots, n, packed, false);
}

void Device::put_columns(StreamView s, SlotPool rows, std::int64_t col, const Key* slots, std::int64_t n,
                         const float* packed) {
  if (!own_stream(s, "put_columns")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(rows.dim) * kF;
  counters_.add_hbm_read(b + static_cast<std::uint64_t>(n) * 8);
  counters_.add_hbm_write(b);
  do_move_columns(s, rows, col, slots, n, const_cast<float*>(packed), true);
}

void Device::reduce_grads(StreamView s, SlotPool sums, const std::vector<UpdateFeature>& features) {
  STRATA_CHECK(sums.overflow == nullptr && "reduce_grads: sums have no overflow region");
  if (!own_stream(s, "reduce_grads")) return;
  for (const auto& f : features) {
    const std::uint64_t grad_rows = static_cast<std::uint64_t>(f.pooling == Pooling::kNone ? f.num_keys : f.batch);
    const std::uint64_t row = static_cast<std::uint64_t>(sums.dim) * kF;
    counters_.add_hbm_read(grad_rows * row + static_cast<std::uint64_t>(f.num_unique) * 16 +
                           static_cast<std::uint64_t>(f.num_keys) * 8);
    counters_.add_hbm_write(static_cast<std::uint64_t>(f.num_unique) * row);
  }
  do_reduce_grads(s, sums, features);
}

void Device::records_from_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n,
                               const float* const* rows) {
  if (n <= 0) return;
  if (!own_stream(s, "records_from_host")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(pool.row_bytes());
  counters_.add_h2d(b);
  counters_.add_hbm_read(static_cast<std::uint64_t>(n) * 16);
  counters_.add_hbm_write(b);
  do_records_host(s, pool, slots, n, const_cast<float* const*>(rows), false);
}

void Device::records_to_host(StreamView s, SlotPool pool, const Key* slots, std::int64_t n, float* const* rows) {
  if (n <= 0) return;
  if (!own_stream(s, "records_to_host")) return;
  const std::uint64_t b = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(pool.row_bytes());
  counters_.add_d2h(b);
  counters_.add_hbm_read(b + static_cast<std::uint64_t>(n) * 16);
  do_records_host(s, pool, slots, n, rows, true);
}

void Device::init_records(StreamView s, SlotPool pool, std::int64_t first_slot, std::int64_t n,
                          const RecordInit& init) {
  if (n <= 0) return;
  if (!own_stream(s, "init_records")) return;
  counters_.add_hbm_write(static_cast<std::uint64_t>(n * pool.record_bytes()));
  do_init_records(s, pool, first_slot, n, init);
}

void Device::count_nonfinite(StreamView s, const std::vector<FloatRange>& ranges, std::int64_t* partial,
                             std::int64_t* totals) {
  if (ranges.empty()) return;
  for (const FloatRange& r : ranges)
    counters_.add_hbm_read(static_cast<std::uint64_t>(r.n) * static_cast<std::uint64_t>(element_bytes(r.dtype)));
  counters_.add_hbm_write(ranges.size() * 8);
  do_count_nonfinite(s, ranges, partial, totals);
}

}  // namespace strata::gpu
