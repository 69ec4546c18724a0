#pragma once
// Staging: a reusable pair of buffers for one batch in flight: pinned host memory and device
// memory. A "mirrored" region has the same offsets on both sides (fill it on the host, then one
// upload() copies it H2D); host-only and device-only regions follow. Buffers grow when a batch
// needs more (reallocation happens only in reserve(), which the caller calls when the previous
// batch using this staging is done: see done()). Not thread-safe.

#include <cstddef>
#include <deque>
#include <memory>

#include "gpu/device.hpp"

namespace strata::gpu {

class Staging {
 public:
  static constexpr std::size_t kAlign = 64;
  /// Bytes one allocation of n T takes (rounded up to kAlign); sum these for reserve().
  template <class T>
  static constexpr std::size_t bytes_for(std::size_t n) noexcept {
    return (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  }

  /// Creates empty buffers and the done event on `device` (which must outlive this).
  static Result<Staging> create(Device& device);

  /// Makes room for the given region sizes (growing the buffers, old contents lost) and resets the
  /// allocation cursors. The caller must know that no work still uses the buffers.
  Status reserve(std::size_t mirrored, std::size_t host_only, std::size_t dev_only);

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
  /// Recorded by the user after the last work that uses these buffers.
  EventView done() const noexcept { return done_.view(); }

 private:
  explicit Staging(Device& d) : dev_ptr_(&d) {}
  static std::size_t take(std::size_t& used, std::size_t cap, std::size_t bytes);
  Device* dev_ptr_;
  PinnedBuffer host_;
  DeviceBuffer dev_;
  Event done_;
  std::size_t mirrored_cap_ = 0, host_cap_ = 0, dev_cap_ = 0;
  std::size_t mirrored_used_ = 0, host_used_ = 0, dev_used_ = 0;
};

/// Reusable Staging entries of one device, handed out oldest first so that waiting for an entry's
/// last use (Staging::done) rarely blocks. Not thread-safe.
class StagingPool {
 public:
  explicit StagingPool(Device& device) : dev_(&device) {}
  /// A free entry, once its last use has finished (a host sync point), or a new one. Errors: the
  /// device's sticky error, or event creation failing.
  Result<std::unique_ptr<Staging>> take();
  /// Returns an entry; the caller has recorded its done() event after the entry's last use.
  void give_back(std::unique_ptr<Staging> s);

 private:
  Device* dev_;
  std::deque<std::unique_ptr<Staging>> free_;
};

}  // namespace strata::gpu
