#pragma once
// grow_buffer: scratch that only grows, for buffers refilled by every call that uses them.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "gpu/device.hpp"

namespace strata::gpu {

/// How grow_buffer sizes a buffer that must grow.
enum class Growth {
  kTwice,         ///< twice the need, or an error (the engines' scratch, which the memory model counts twice)
  kTwiceOrExact,  ///< twice the need, else exactly the need (the device's scratch, Device::with_scratch)
};

/// Grows `b` (a DeviceBuffer or PinnedBuffer of `dev`) to hold at least `bytes`, allocating twice
/// that so that slowly growing requests reallocate rarely (with Growth::kTwiceOrExact, exactly
/// `bytes` when twice does not fit). The contents are not kept, the capacity is: the old buffer is
/// freed first (no two at once), and when the growth fails the old size is allocated again, so work
/// that fits the old capacity (reserved earlier) still runs. The caller must know that no queued
/// work uses `b` when it grows. Errors: the (last) allocation's.
template <class B>
Status grow_buffer(B& b, std::size_t bytes, Device& dev, Growth growth = Growth::kTwice) {
  static_assert(std::is_same_v<B, DeviceBuffer> || std::is_same_v<B, PinnedBuffer>);
  if (b.bytes() >= bytes) return Status::ok();
  const auto allocate = [&](std::size_t n) {
    if constexpr (std::is_same_v<B, PinnedBuffer>) {
      return dev.allocate_pinned(n);
    } else {
      return dev.allocate(n);
    }
  };
  const std::size_t old = b.bytes();
  b = B{};
  auto bigger = allocate(std::max<std::size_t>(2 * bytes, 64));
  if (!bigger && growth == Growth::kTwiceOrExact) bigger = allocate(bytes);
  if (!bigger) {
    if (old > 0) {
      if (auto back = allocate(old)) b = std::move(back).value();
    }
    return bigger.status();
  }
  b = std::move(bigger).value();
  return Status::ok();
}

}  // namespace strata::gpu
