#pragma once
// LinkCounters: bytes that crossed each link, counted by the device layer when work is issued (so
// both backends count the same way) and by host-side code (host DRAM per NUMA node). They feed the
// cost model and strata-bench's "bytes per link per step". ResourceCounts: the allocations, frees
// and events of a device (Device::resource_counts).

#include <algorithm>
#include <array>
#include <atomic>
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

/// Host DRAM bytes per NUMA node summed by one thread (plain numbers), for code that moves many
/// rows: LinkCounters::add_host_reads/add_host_writes then costs one atomic add per node, not
/// one per row.
struct NodeBytes {
  static constexpr int kMaxNodes = 16;
  std::array<std::uint64_t, kMaxNodes> bytes{};
  /// Adds `b` bytes of node `node` (nodes beyond kMaxNodes - 1 are folded into the last).
  void add(int node, std::uint64_t b) noexcept {
    bytes[static_cast<std::size_t>(std::clamp(node, 0, kMaxNodes - 1))] += b;
  }
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

/// Thread-safe counters (relaxed atomics). Nodes beyond kMaxNodes are folded into the last one.
class LinkCounters {
 public:
  static constexpr int kMaxNodes = NodeBytes::kMaxNodes;
  explicit LinkCounters(int numa_nodes = 1) noexcept;

  void add_hbm_read(std::uint64_t b) noexcept { hbm_read_.fetch_add(b, std::memory_order_relaxed); }
  void add_hbm_write(std::uint64_t b) noexcept { hbm_write_.fetch_add(b, std::memory_order_relaxed); }
  void add_h2d(std::uint64_t b) noexcept { h2d_.fetch_add(b, std::memory_order_relaxed); }
  void add_d2h(std::uint64_t b) noexcept { d2h_.fetch_add(b, std::memory_order_relaxed); }
  void add_host_copy(std::uint64_t b) noexcept { host_copy_.fetch_add(b, std::memory_order_relaxed); }
  void add_host_read(int node, std::uint64_t b) noexcept {
    host_read_[clamp(node)].fetch_add(b, std::memory_order_relaxed);
  }
  void add_host_write(int node, std::uint64_t b) noexcept {
    host_write_[clamp(node)].fetch_add(b, std::memory_order_relaxed);
  }
  /// Every node's bytes of `b` at once (the same as add_host_read / add_host_write per node).
  void add_host_reads(const NodeBytes& b) noexcept;
  void add_host_writes(const NodeBytes& b) noexcept;

  int numa_nodes() const noexcept { return nodes_; }
  LinkBytes snapshot() const;

 private:
  std::size_t clamp(int node) const noexcept;
  int nodes_;
  std::atomic<std::uint64_t> hbm_read_{0}, hbm_write_{0}, h2d_{0}, d2h_{0}, host_copy_{0};
  std::array<std::atomic<std::uint64_t>, kMaxNodes> host_read_{}, host_write_{};
};

}  // namespace strata::gpu
