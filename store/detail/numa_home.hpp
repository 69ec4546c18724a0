#pragma once
// Where a store's host tier lives (config `numa`): the NUMA node of its host tables and the node its
// oneTBB arena (the threads of the host kernels) is constrained to. `auto` follows the store's GPU:
// hwloc's locality of the device, found by PCI bus id.

#include <functional>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "host/topology.hpp"
#include "store/stats.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// What the machine can do, beside its Topology (a parameter, so that tests describe machines).
struct NumaAbilities {
  bool binds_memory = true;    ///< Topology::binds_memory()
  std::vector<int> tbb_nodes;  ///< tbb::info::numa_nodes(): the ids an arena may be constrained to
  /// This machine's: a fake topology's nodes are no real nodes, so it lists no TBB node for them.
  static NumaAbilities of(const Topology& topo);
};

/// The resolved placement: `host` for the host tables (and shards), `placement` for StoreStats (its
/// thread_node, >= 0, is what the store's arena is constrained to).
struct NumaHome {
  HostTableOptions host;
  NumaPlacement placement;
};

/// Resolves config.numa (numa_node already checked against `topo`) for a store whose device has PCI
/// bus id `gpu_pci_bus_id` ("" for emu; `has_device` false for a store without one).
/// interleave: row blocks dealt over the nodes (memory_node -1), threads unconstrained.
/// bind: memory on numa_node, threads unconstrained (as before `auto`).
/// auto with a GPU that `topo` places on node N (< topo.num_nodes()): memory on N, threads on N when
/// the abilities' tbb_nodes list it. Every other case of auto falls back to interleave, with a note
/// saying why. Where the machine cannot mbind (bind, or auto on node N), the tables are still placed
/// on the node by first touch (NumaArena pre-faults with threads on it), with a note. `abilities`
/// is called only for bind and for auto with a GPU node (it probes mbind and loads tbbbind). Never an
/// error.
NumaHome resolve_numa_home(const StoreConfig& config, const Topology& topo, bool has_device,
                           const std::string& gpu_pci_bus_id, const std::function<NumaAbilities()>& abilities);
/// The same with abilities given (tests describe machines this way).
inline NumaHome resolve_numa_home(const StoreConfig& config, const Topology& topo, bool has_device,
                                  const std::string& gpu_pci_bus_id, const NumaAbilities& can) {
  return resolve_numa_home(config, topo, has_device, gpu_pci_bus_id, [&can] { return can; });
}

/// Puts the pinned memory `device` allocates from now on on placement.memory_node of `topo` (which
/// outlives the device; nothing placed when it is -1, an interleaved host tier), before the store's
/// engines allocate their staging.
void place_pinned(gpu::Device& device, const Topology& topo, const NumaPlacement& placement);
/// The store's placement (with_pinned's) as it applies to one of its engines (StoreStats::numa_engines): memory_node
/// where it holds host rows, pinned_node where it has a device, else -1; thread_node and note the store's.
NumaPlacement engine_placement(NumaPlacement store, bool host_rows, bool device);

/// `placement` with where `device` (nullptr: none) put its pinned memory (pinned_node) and why that
/// is less than asked (its note appended).
NumaPlacement with_pinned(NumaPlacement placement, const gpu::Device* device);

}  // namespace strata::detail
