#pragma once
// LinkBytes and ResourceCounts: plain snapshots of a device's link counters and of its resources
// (gpu/counters.hpp counts them), in a header of their own so that StoreStats reports them without
// pulling the counters.

#include <cstdint>
#include <vector>

namespace strata::gpu {

/// A snapshot of the counters (plain numbers; subtract two snapshots for a step's traffic).
struct LinkBytes {
  std::uint64_t hbm_read = 0;             ///< device memory read by kernels and D2H/D2D copies
  std::uint64_t hbm_write = 0;            ///< device memory written by kernels and H2D/D2D copies
  std::uint64_t h2d = 0;                  ///< PCIe host -> device (copies and zero-copy reads of host rows)
  std::uint64_t d2h = 0;                  ///< PCIe device -> host
  std::vector<std::uint64_t> host_read;   ///< (nodes) host DRAM read by host-side staging work
  std::vector<std::uint64_t> host_write;  ///< (nodes) host DRAM written by host-side staging work
  /// Activations (pooled outputs and their gradients) the store copied host to host, between its
  /// pinned staging and the caller's host views (store/engines/detail/activation_copy.hpp). Not part of
  /// host_read/host_write nor of the cost model: it shows whether a mode moves activations through
  /// host memory at all (device views in a device mode: none).
  std::uint64_t host_copy = 0;

  /// Field-wise difference (this - earlier).
  LinkBytes operator-(const LinkBytes& earlier) const;
  /// Field-wise sum.
  LinkBytes& operator+=(const LinkBytes& other);
  std::uint64_t host_read_total() const noexcept;
  std::uint64_t host_write_total() const noexcept;
};

/// Device resources made and released since a Device was created (plain numbers: subtract two
/// snapshots). Under cuda each free (cudaFree, cudaFreeHost) synchronizes the whole device and an
/// allocation may as well, so a steady-state training step should change none of these: the
/// engines reserve their buffers and events up front or grow them outside the steady state.
struct ResourceCounts {
  std::uint64_t allocations = 0;  ///< successful allocate() and allocate_pinned() calls
  std::uint64_t frees = 0;        ///< DeviceBuffers and PinnedBuffers released
  std::uint64_t events = 0;       ///< successful create_event() calls

  /// Field-wise difference (this - earlier).
  ResourceCounts operator-(const ResourceCounts& earlier) const noexcept {
    return {allocations - earlier.allocations, frees - earlier.frees, events - earlier.events};
  }
  bool operator==(const ResourceCounts& o) const noexcept {
    return allocations == o.allocations && frees == o.frees && events == o.events;
  }
};

}  // namespace strata::gpu
