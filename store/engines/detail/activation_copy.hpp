#pragma once
// The one place the store copies activations (pooled outputs, their gradients) in host memory:
// between a batch's pinned staging and a caller's host view. Every such copy goes through
// copy_activations, which counts it (gpu::LinkBytes::host_copy), so a test can tell that device
// views move none.

#include <cstddef>
#include <cstring>

#include "core/half.hpp"
#include "gpu/counters.hpp"

namespace strata::detail {

/// std::memcpy of `bytes` host bytes from `from` to `to` (both host memory, not overlapping),
/// counted in `counters` as host_copy. Thread-safe as the counters are.
inline void copy_activations(gpu::LinkCounters& counters, void* to, const void* from, std::size_t bytes) noexcept {
  if (bytes == 0) return;  // views of zero rows may be null
  std::memcpy(to, from, bytes);
  counters.add_host_copy(bytes);
}

/// The n half-size elements of `dtype` (bf16 or fp16) at `from`, widened to n fp32 values at `to` (exact), both host
/// memory, not overlapping; counted as host_copy of the fp32 bytes written.
inline void widen_activations(gpu::LinkCounters& counters, float* to, const void* from, DType dtype,
                              std::size_t n) noexcept {
  if (n == 0) return;
  const unsigned char* src = static_cast<const unsigned char*>(from);
  for (std::size_t k = 0; k < n; ++k) {
    std::uint16_t h;
    std::memcpy(&h, src + 2 * k, sizeof h);
    to[k] = widen(dtype, h);
  }
  counters.add_host_copy(n * sizeof(float));
}

}  // namespace strata::detail
