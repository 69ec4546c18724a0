#pragma once
// NumaArena: one large allocation bound to a NUMA node, backed by transparent huge pages where the
// kernel allows, pre-faulted in parallel by threads running on that node, and registered with a
// Pinner. Move-only owner.

#include <cstddef>
#include <cstdint>

#include "core/status.hpp"
#include "host/pinner.hpp"
#include "host/topology.hpp"

namespace strata {

/// How a NumaArena is created.
struct ArenaOptions {
  int node = 0;                    ///< logical NUMA node the memory is bound to
  bool huge_pages = true;          ///< madvise(MADV_HUGEPAGE): fewer TLB misses on random row gathers
  int prefault_threads = 0;        ///< threads that touch every page on `node` (0: the node's CPUs)
  Pinner* pinner = nullptr;        ///< registers the range for DMA (nullptr: NoopPinner)
};

/// Owns `bytes` of zeroed host memory bound to one node. Not copyable; moving keeps the address.
/// The memory is not synchronised: callers coordinate access.
class NumaArena {
 public:
  /// Maps, binds, pre-faults and pins `bytes` (> 0; rounded up to 2 MiB). Fails with
  /// kResourceExhausted when the OS refuses the mapping.
  static Result<NumaArena> create(const Topology& topo, std::size_t bytes, const ArenaOptions& options);

  NumaArena() = default;
  NumaArena(NumaArena&& o) noexcept;
  NumaArena& operator=(NumaArena&& o) noexcept;
  NumaArena(const NumaArena&) = delete;
  NumaArena& operator=(const NumaArena&) = delete;
  ~NumaArena();

  /// Base address (host, 2 MiB aligned); nullptr for an empty arena.
  void* data() const noexcept { return base_; }
  /// Usable size in bytes (as requested, before rounding).
  std::size_t size() const noexcept { return size_; }
  int node() const noexcept { return node_; }

 private:
  void release() noexcept;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  int node_ = 0;
  Pinner* pinner_ = nullptr;
};

}  // namespace strata
