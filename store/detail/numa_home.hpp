#pragma once
// Where a store's host tier lives (config `numa`): the NUMA node of its host tables and the node its
// oneTBB arena (the threads of the host kernels) is constrained to. `auto` follows the store's GPU:
// hwloc's locality of the device, found by PCI bus id.

#include <string>
#include <vector>

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
/// bus id `gpu_pci_bus_id` ("" for emu; `has_device` false for a store without one). interleave:
/// unbound; bind: memory on numa_node, threads unconstrained (as before `auto`); auto with a GPU that
/// `topo` places on node N: memory on N, threads on N when `can.tbb_nodes` lists it. Every other
/// case of auto falls back to interleave (or, when memory cannot be bound, to no binding), with a
/// note saying why. Never an error.
NumaHome resolve_numa_home(const StoreConfig& config, const Topology& topo, bool has_device,
                           const std::string& gpu_pci_bus_id, const NumaAbilities& can);

}  // namespace strata::detail
