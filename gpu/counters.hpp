#pragma once
// LinkCounters: bytes that crossed each link, counted by the device layer when work is issued (so
// both backends count the same way) and by host-side code (host DRAM per NUMA node). They feed the
// cost model and strata-bench's "bytes per link per step" as LinkBytes snapshots (gpu/link_bytes.hpp,
// with ResourceCounts: the allocations, frees and events of a device, Device::resource_counts).

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "gpu/link_bytes.hpp"

namespace strata::gpu {

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
