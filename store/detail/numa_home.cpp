#include "store/detail/numa_home.hpp"

#include <tbb/info.h>

#include <algorithm>

namespace strata::detail {

NumaAbilities NumaAbilities::of(const Topology& topo) {
  NumaAbilities can;
  can.binds_memory = topo.binds_memory();
  // oneTBB numbers nodes by hwloc's logical index, as Topology does (with tbbbind; without it, -1).
  if (!topo.is_fake()) can.tbb_nodes = tbb::info::numa_nodes();
  return can;
}

NumaHome resolve_numa_home(const StoreConfig& config, const Topology& topo, bool has_device,
                           const std::string& gpu_pci_bus_id, const NumaAbilities& can) {
  NumaHome home;
  home.host.huge_pages = config.huge_pages;
  home.host.interleave = config.numa != NumaPolicy::kBind;
  home.host.node = config.numa_node;
  if (config.numa == NumaPolicy::kBind) home.placement.memory_node = config.numa_node;
  if (config.numa != NumaPolicy::kAuto) return home;

  const std::string interleaved = "; host tier interleaved";
  std::string& note = home.placement.note;
  const GpuInfo* gpu = has_device ? topo.find_gpu(gpu_pci_bus_id) : nullptr;
  const int node = gpu ? gpu->numa_node : -1;
  if (node < 0) {
    if (!has_device)
      note = "numa auto: the store has no device" + interleaved;
    else if (gpu_pci_bus_id.empty())
      note = "numa auto: the device has no PCI bus id (emu)" + interleaved;
    else if (!gpu)
      note = "numa auto: hwloc lists no GPU of PCI bus id " + gpu_pci_bus_id + interleaved;
    else
      note = "numa auto: hwloc does not know the NUMA node of GPU " + gpu_pci_bus_id + interleaved;
    return home;
  }
  const std::string on = "numa auto: GPU " + gpu_pci_bus_id + " is on node " + std::to_string(node);
  if (can.binds_memory) {
    home.host.interleave = false;
    home.host.node = node;
    home.placement.memory_node = node;
  } else {
    note =
        on + ", but the kernel does not bind memory (no NUMA support, or a container forbids mbind): memory not bound";
  }
  if (std::find(can.tbb_nodes.begin(), can.tbb_nodes.end(), node) != can.tbb_nodes.end()) {
    home.placement.thread_node = node;
  } else {
    note = (note.empty() ? on : note) + "; oneTBB reports no NUMA node " + std::to_string(node) +
           " (tbbbind not loaded?): threads not constrained";
  }
  return home;
}

}  // namespace strata::detail
