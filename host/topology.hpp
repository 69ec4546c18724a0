#pragma once
// Topology: NUMA nodes, their cores and memory, which node each GPU hangs off, and the size of a
// core's L2 cache, read from hwloc. A fake topology with N nodes lets tests exercise NUMA placement
// on a one-node machine.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace strata {

/// One NUMA node as seen by the store.
struct NumaNode {
  int id = 0;                      ///< logical node index in [0, nodes)
  int os_index = 0;                ///< the operating system's node number (what membind uses)
  std::vector<int> cpus;           ///< OS indices of the processing units (hyperthreads) on it
  std::uint64_t memory_bytes = 0;  ///< local memory (0 when unknown)
};

/// A PCI GPU found by hwloc, with the node it is attached to (-1 when hwloc does not know).
struct GpuInfo {
  std::string pci_bus_id;  ///< "0000:3b:00.0"
  std::string name;        ///< device name when known
  int numa_node = -1;      ///< logical NUMA node, or -1
};

/// L2 size assumed when hwloc reports no L2 cache (a VM that hides its caches, an unknown CPU): 512
/// KiB, the smallest per-core L2 of current x86 server cores.
inline constexpr std::uint64_t kDefaultL2Bytes = std::uint64_t{512} << 10;

/// The machine's NUMA layout. Move-only; all methods are const and thread-safe after creation.
class Topology {
 public:
  /// Reads the real machine through hwloc (with I/O devices, to find GPUs). The hwloc topology is
  /// loaded once per process and shared by every Topology (loading takes tens of milliseconds, and
  /// hwloc's PCI plugin leaks when it is unloaded). Thread-safe.
  static Result<Topology> discover();
  /// A pretend machine with `nodes` nodes that splits the real CPUs round-robin among them and
  /// binds every fake node's memory to real node 0 (so it runs anywhere). For tests.
  static Topology fake(int nodes);
  /// A copy of this topology that lists `gpus` (each on its given node) instead of the GPUs found:
  /// a GPU on a given node of a fake or of the real machine, for tests.
  Topology with_gpus(std::vector<GpuInfo> gpus) const;

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  const std::vector<NumaNode>& nodes() const noexcept { return nodes_; }
  int num_nodes() const noexcept { return static_cast<int>(nodes_.size()); }
  const std::vector<GpuInfo>& gpus() const noexcept { return gpus_; }
  bool is_fake() const noexcept { return fake_; }
  /// The GPU listed here whose PCI bus id is `pci_bus_id` (as CUDA writes it, "0000:3B:00.0"; case
  /// does not matter), or nullptr.
  const GpuInfo* find_gpu(const std::string& pci_bus_id) const;
  /// Whether the kernel binds memory to nodes (mbind works: not a kernel without NUMA support nor a
  /// container that forbids it); always true for a fake topology (nothing real to bind). Probed once
  /// per process. bind_memory() succeeds without binding where this is false.
  bool binds_memory() const;
  /// Bytes of one core's L2 cache (data or unified): the smallest L2 hwloc reports on this
  /// machine, or kDefaultL2Bytes when it reports none or cannot load. A property of the real
  /// machine (the same for a fake topology); computed once per process. Thread-safe.
  static std::uint64_t l2_cache_bytes() noexcept;
  /// Total processing units over all nodes.
  int num_cpus() const noexcept;
  /// One-line summary: "1 NUMA node(s): node0 cpus=2 mem=23.4GiB; gpus: none".
  std::string describe() const;

  /// Binds `len` bytes at `addr` to logical node `node` (no-op for a fake topology's missing nodes).
  /// The range must be page aligned. Thread-safe.
  Status bind_memory(void* addr, std::size_t len, int node) const;
  /// Binds the calling thread to the CPUs of logical node `node`. Thread-safe.
  Status bind_current_thread(int node) const;

 private:
  Topology() = default;
  struct Handle;  // the process-wide hwloc topology (null for fake)
  std::shared_ptr<const Handle> handle_;
  std::vector<NumaNode> nodes_;
  std::vector<GpuInfo> gpus_;
  bool fake_ = false;
};

}  // namespace strata
