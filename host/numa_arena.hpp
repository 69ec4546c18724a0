#pragma once
// NumaArena: one large allocation bound to a NUMA node, backed by transparent huge pages where the
// kernel allows, pre-faulted in parallel by threads running on that node, and registered with a
// Pinner. Move-only owner. ArenaPacker: shared arenas that many small allocations (small tables)
// are carved from, so that each does not cost a whole 2 MiB arena.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/status.hpp"
#include "host/pinner.hpp"
#include "host/topology.hpp"

namespace strata {

/// How a NumaArena is created.
struct ArenaOptions {
  int node = 0;              ///< logical NUMA node the memory is bound to
  bool huge_pages = true;    ///< madvise(MADV_HUGEPAGE): fewer TLB misses on random row gathers
  int prefault_threads = 0;  ///< threads that touch every page on `node` (0: the node's CPUs)
  Pinner* pinner = nullptr;  ///< registers the range for DMA (nullptr: NoopPinner)
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
  /// Bytes actually mapped, pre-faulted and pinned: size() rounded up to 2 MiB (0 when empty).
  std::size_t mapped_bytes() const noexcept { return base_ ? mapped_ : 0; }
  int node() const noexcept { return node_; }

  /// Bytes mapped by every NumaArena alive in this process (sum of mapped_bytes()): what the host
  /// tier holds, for memory accounting and tests. Thread-safe.
  static std::size_t live_mapped_bytes() noexcept;
  /// The rounding unit of create(): every arena maps a multiple of this (2 MiB, one huge page).
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;

 private:
  void release() noexcept;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  int node_ = 0;
  Pinner* pinner_ = nullptr;
};

/// `bytes` (> 0) of zeroed host memory, whole pages, mapped and bound to logical node `node` of `topo`
/// (Topology::bind_memory), then faulted in by the calling thread (the binding, not the thread, puts
/// the pages on the node; where binding is a no-op, as on a fake topology's nodes, they go where
/// first touch puts them), so that they are there before anyone registers them. For blocks too small for a
/// NumaArena's 2 MiB: the device layer's pinned staging (gpu/device.hpp, Device::place_pinned).
/// ResourceExhausted when the OS refuses the mapping, bind_memory's error when the binding fails;
/// nothing stays mapped then. Free with unmap_on_node. Thread-safe.
Result<void*> map_on_node(const Topology& topo, std::size_t bytes, int node);
/// Unmaps a block of map_on_node (`bytes` as given to it).
void unmap_on_node(void* p, std::size_t bytes) noexcept;

/// A region of a shared arena handed out by ArenaPacker: keeps its arena alive (the arena is unmapped
/// and unpinned when its last region and the packer have let go of it).
struct ArenaRegion {
  std::shared_ptr<NumaArena> arena;  ///< the shared arena holding the region
  std::size_t offset = 0;            ///< byte offset of the region in the arena (a multiple of kAlignment)
  std::size_t bytes = 0;             ///< bytes of the region (rounded up to kAlignment)
  /// Start of the region (host memory on the arena's node).
  void* data() const noexcept { return static_cast<char*>(arena->data()) + offset; }
};

/// Packs small allocations into shared NumaArenas of kChunkBytes (2 MiB: one huge page), so that
/// N small tables cost about the sum of their bytes instead of N x 2 MiB. Each region is
/// kAlignment (64-byte, cache line) aligned and lies in an arena created with the ArenaOptions of
/// the request (node, huge pages, pinner): arenas are never shared between different options, so a
/// region is bound to its node and pinned through its pinner exactly like an arena of its own
/// (the whole shared arena is pinned once, which covers every region in it).
///
/// Placement is first fit over the last kFitWindow arenas of those options, in creation order; a
/// request that fits in none opens a new arena. So the memory held is at most the regions' bytes
/// plus, per (options) key, up to kFitWindow partly filled arenas, plus less than `largest region`
/// of slack per arena left behind (below 50% with regions under half an arena, as HostTable packs
/// them). Space of a region whose
/// owner dies is not reused: an arena is freed when the packer and all its regions are gone (the
/// store creates its tables once, through a packer that lives only while they are created, and
/// frees them together). Thread-safe. The packer may be destroyed before the
/// regions it handed out.
class ArenaPacker {
 public:
  /// Bytes of each shared arena (2 MiB).
  static constexpr std::size_t kChunkBytes = NumaArena::kGranularity;
  /// Alignment and size granularity of regions (one cache line).
  static constexpr std::size_t kAlignment = 64;
  /// Arenas (the most recent of one key) searched for room before a new one opens.
  static constexpr std::size_t kFitWindow = 16;

  ArenaPacker() = default;
  ArenaPacker(const ArenaPacker&) = delete;
  ArenaPacker& operator=(const ArenaPacker&) = delete;

  /// A region of `bytes` (> 0, <= kChunkBytes) in a shared arena created on `topo` with `options`
  /// (the same `topo` on every call). Fails like NumaArena::create when a new arena is needed and
  /// cannot be made; then nothing changes.
  Result<ArenaRegion> allocate(const Topology& topo, std::size_t bytes, const ArenaOptions& options);

  /// Bytes mapped by the arenas this packer created (it holds each until it is destroyed).
  std::size_t mapped_bytes() const;

  /// Pure placement bookkeeping with the same rules as ArenaPacker (first fit over arenas of
  /// kChunkBytes, regions rounded to kAlignment), for estimating what a set of allocations will map
  /// without mapping anything. `key` stands for the ArenaOptions (requests with different keys never
  /// share an arena).
  class Plan {
   public:
    /// Places a region of `bytes` (> 0, <= kChunkBytes) under `key`; returns the bytes newly mapped
    /// (kChunkBytes when a new arena opens, else 0).
    std::size_t place(std::uint64_t key, std::size_t bytes);
    /// Bytes mapped by all arenas placed so far.
    std::size_t mapped_bytes() const noexcept { return mapped_; }

   private:
    std::map<std::uint64_t, std::vector<std::size_t>> used_;  // per key: bytes used per arena, creation order
    std::size_t mapped_ = 0;
  };

 private:
  struct Chunk {
    std::shared_ptr<NumaArena> arena;
    std::size_t used = 0;  // bytes handed out from the start of the arena
  };
  // Arenas by what they were created with (topology, node, huge pages, pinner), creation order.
  using Key = std::tuple<const Topology*, int, bool, Pinner*>;
  mutable std::mutex m_;
  std::map<Key, std::vector<Chunk>> chunks_;
};

}  // namespace strata
