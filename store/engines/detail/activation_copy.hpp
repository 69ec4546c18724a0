#pragma once
// The one place the store copies activations (pooled outputs, their gradients) in host memory:
// between a batch's pinned staging and a caller's host view. Every such copy goes through
// copy_activations, which counts it (gpu::LinkBytes::host_copy), so a test can tell that device
// views move none.

#include <cstddef>
#include <cstring>

#include "gpu/counters.hpp"

namespace strata::detail {

/// std::memcpy of `bytes` host bytes from `from` to `to` (both host memory, not overlapping),
/// counted in `counters` as host_copy. Thread-safe as the counters are.
inline void copy_activations(gpu::LinkCounters& counters, void* to, const void* from, std::size_t bytes) noexcept {
  if (bytes == 0) return;  // views of zero rows may be null
  std::memcpy(to, from, bytes);
  counters.add_host_copy(bytes);
}

}  // namespace strata::detail
