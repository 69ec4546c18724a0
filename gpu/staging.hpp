#pragma once
// Staging: a reusable pair of buffers for one batch in flight: pinned host memory and device
// memory. A "mirrored" region has the same offsets on both sides (fill it on the host, then one
// upload() copies it H2D); host-only and device-only regions follow. Buffers grow when a batch
// needs more, and then to twice what it needs (reallocation happens only in reserve(), which the
// caller calls when the work that used the entry is done: StagingRing::take waits for it). Each
// entry owns the events of the batch that uses it, so a step creates none. Not thread-safe.

#include <cstddef>
#include <deque>
#include <memory>

#include "gpu/device.hpp"

namespace strata::gpu {

/// Bytes of the three regions of a Staging (sums of Staging::bytes_for).
struct StagingSizes {
  std::size_t mirrored = 0;   ///< same offsets in the pinned and the device buffer
  std::size_t host_only = 0;  ///< pinned host memory
  std::size_t dev_only = 0;   ///< device memory
  /// Whether every region of this fits in `cap`.
  bool fits_in(const StagingSizes& cap) const noexcept {
    return mirrored <= cap.mirrored && host_only <= cap.host_only && dev_only <= cap.dev_only;
  }
};

class Staging {
 public:
  static constexpr std::size_t kAlign = 64;
  /// Bytes one allocation of n T takes (rounded up to kAlign); sum these for reserve().
  template <class T>
  static constexpr std::size_t bytes_for(std::size_t n) noexcept {
    return (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  }

  /// Creates empty buffers and the entry's events on `device` (which must outlive this).
  static Result<Staging> create(Device& device);

  /// Makes room for `want` and resets the allocation cursors. When a region is too small for
  /// `want` or `floor`, the buffers are reallocated (old contents lost) with every region at least
  /// twice its size in `want` and at least `floor`, so that batches of slowly varying size do not
  /// reallocate again; when the device has no room for that, exactly `want` (and then `floor` is
  /// no reason to reallocate again). On failure the buffers are gone (they were freed to make
  /// room) and the next reserve allocates. The caller must know that no work still uses them.
  Status reserve(const StagingSizes& want, const StagingSizes& floor = {});
  Status reserve(std::size_t mirrored, std::size_t host_only, std::size_t dev_only) {
    return reserve(StagingSizes{mirrored, host_only, dev_only});
  }
  /// The region sizes the buffers hold now.
  StagingSizes capacity() const noexcept { return {mirrored_cap_, host_cap_, dev_cap_}; }
  /// Whether the last reallocation fell back to exactly the request (no room for the headroom).
  bool tight() const noexcept { return tight_; }

  template <class T>
  struct Pair {
    T* host;
    T* dev;
  };
  /// n T at the same offset in the pinned and the device buffer.
  template <class T>
  Pair<T> mirrored(std::size_t n) {
    const std::size_t off = take(mirrored_used_, mirrored_cap_, bytes_for<T>(n));
    return {reinterpret_cast<T*>(host_.as<char>() + off), reinterpret_cast<T*>(dev_.as<char>() + off)};
  }
  /// n T of pinned host memory.
  template <class T>
  T* host_only(std::size_t n) {
    return reinterpret_cast<T*>(host_.as<char>() + mirrored_cap_ + take(host_used_, host_cap_, bytes_for<T>(n)));
  }
  /// n T of device memory.
  template <class T>
  T* dev_only(std::size_t n) {
    return reinterpret_cast<T*>(dev_.as<char>() + mirrored_cap_ + take(dev_used_, dev_cap_, bytes_for<T>(n)));
  }
  /// Copies the mirrored bytes allocated so far host -> device on `s`.
  void upload(StreamView s);
  /// Recorded by the user when the batch's inputs are on the device (its consumer waits for it).
  EventView ready() const noexcept { return ready_.view(); }
  /// Recorded by the user after the last work of the consumer stream that uses these buffers.
  EventView done() const noexcept { return done_.view(); }
  /// Recorded by the user after the last work of a second stream that uses these buffers (the
  /// cache's write-backs); an entry whose batch had none never records it.
  EventView drained() const noexcept { return drained_.view(); }
  /// Blocks the host until done() and drained() completed; the device's sticky error, if any.
  Status wait_idle();

 private:
  explicit Staging(Device& d) : dev_ptr_(&d) {}
  static std::size_t take(std::size_t& used, std::size_t cap, std::size_t bytes);
  Device* dev_ptr_;
  PinnedBuffer host_;
  DeviceBuffer dev_;
  Event ready_, done_, drained_;
  bool tight_ = false;  // the last reallocation had no room for the headroom
  std::size_t mirrored_cap_ = 0, host_cap_ = 0, dev_cap_ = 0;
  std::size_t mirrored_used_ = 0, host_used_ = 0, dev_used_ = 0;
};

/// Reusable Staging entries of one device, handed out oldest first so that waiting for an entry's
/// last use rarely blocks. When the oldest free entry's done() has not completed (under
/// stream-ordered calls it follows the caller's stream, e.g. its dense backward) and fewer than
/// kMaxBusyFree entries are free, a new entry is made instead of waiting: the host runs up to that
/// many batches ahead of the device without a host sync, and then waits for the oldest. In a loop
/// that keeps up, this growth happens during warm-up only. The ring keeps one reservation for all its entries: a
/// request larger than it raises it to twice the request (once an entry could be reserved for it with that headroom; a
/// request that fails, or fits only without the headroom, leaves it as it was), and every entry grows to it when next
/// taken (or, on a device without room for it, to what its batch needs, once). So after each entry has been taken once
/// since the largest batch, batches up to twice that one's size allocate nothing (and create no event): the steady
/// state of a training loop. Not thread-safe.
class StagingRing {
 public:
  explicit StagingRing(Device& device) : dev_(&device) {}
  /// Free entries whose done() may still be pending before take() makes a new one.
  static constexpr std::size_t kMaxBusyFree = 3;
  /// A free entry, once its last uses finished (Staging::wait_idle, a host sync point on two
  /// events, never the whole device), or a new one when there is none or the oldest is still in
  /// use and fewer than kMaxBusyFree are free; reserved for `want` (Staging::reserve).
  /// Errors: the device's sticky error, event creation or the reservation failing (the entry then
  /// stays in the ring).
  Result<std::unique_ptr<Staging>> take(const StagingSizes& want);
  /// Returns an entry; the caller has recorded its done() (and drained(), if the entry was used on
  /// a second stream) after the entry's last use.
  void give_back(std::unique_ptr<Staging> s);
  /// The region sizes every entry is grown to.
  const StagingSizes& reservation() const noexcept { return reserved_; }
  /// The free entries (those not taken): their number and their region sizes summed.
  std::size_t free_entries() const noexcept { return free_.size(); }
  /// The entries made so far rather than wait for the oldest free one (the host ran ahead of the
  /// device; timing decides how many, never more than kMaxBusyFree - 1 beyond the most taken at once).
  std::size_t made_ahead() const noexcept { return made_ahead_; }
  StagingSizes free_capacity() const noexcept;

 private:
  Device* dev_;
  std::deque<std::unique_ptr<Staging>> free_;
  StagingSizes reserved_;
  std::size_t made_ahead_ = 0;
};

}  // namespace strata::gpu
