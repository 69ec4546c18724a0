#include "store/detail/numa_home.hpp"

#include <tbb/info.h>

#include <algorithm>

namespace strata::detail {
namespace {
// oneTBB loads its NUMA support (tbbbind) with RTLD_DEEPBIND, which the sanitizer runtimes refuse by
// aborting the process (google/sanitizers#611): a sanitized build treats oneTBB as without it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kTbbBindLoads = false;
#else
constexpr bool kTbbBindLoads = true;
#endif
}  // namespace

NumaAbilities NumaAbilities::of(const Topology& topo) {
  NumaAbilities can;
  can.binds_memory = topo.binds_memory();
  // oneTBB numbers nodes by hwloc's logical index, as Topology does (with tbbbind; without it, -1).
  if (!topo.is_fake() && kTbbBindLoads) can.tbb_nodes = tbb::info::numa_nodes();
  return can;
}

NumaHome resolve_numa_home(const StoreConfig& config, const Topology& topo, bool has_device,
                           const std::string& gpu_pci_bus_id, const std::function<NumaAbilities()>& abilities) {
  NumaHome home;
  home.host.huge_pages = config.huge_pages;
  home.host.interleave = config.numa != NumaPolicy::kBind;
  home.host.node = config.numa_node;
  std::string& note = home.placement.note;
  const std::string first_touch = " placed by first touch (mbind unavailable)";
  if (config.numa == NumaPolicy::kBind) {
    home.placement.memory_node = config.numa_node;
    // Without mbind, NumaArena's pre-fault (threads on the node touch every page first) places it.
    if (!abilities().binds_memory) note = "numa bind: node " + std::to_string(config.numa_node) + first_touch;
  }
  if (config.numa != NumaPolicy::kAuto) return home;

  const std::string interleaved = "; host tier interleaved";
  const GpuInfo* gpu = has_device ? topo.find_gpu(gpu_pci_bus_id) : nullptr;
  const int node = gpu ? gpu->numa_node : -1;
  if (node < 0 || node >= topo.num_nodes()) {
    if (!has_device)
      note = "numa auto: the store has no device" + interleaved;
    else if (gpu_pci_bus_id.empty())
      note = "numa auto: the device has no PCI bus id (emu)" + interleaved;
    else if (!gpu && topo.is_fake())
      note =
          "numa auto: the fake topology (fake_numa_nodes) lists no GPU of PCI bus id " + gpu_pci_bus_id + interleaved;
    else if (!gpu)
      note = "numa auto: hwloc lists no GPU of PCI bus id " + gpu_pci_bus_id + interleaved;
    else if (node >= 0)
      note = "numa auto: hwloc puts GPU " + gpu_pci_bus_id + " on node " + std::to_string(node) +
             ", but the topology has " + std::to_string(topo.num_nodes()) + " nodes" + interleaved;
    else
      note = "numa auto: hwloc does not know the NUMA node of GPU " + gpu_pci_bus_id + interleaved;
    return home;
  }
  const NumaAbilities can = abilities();
  note = "numa auto: GPU " + gpu_pci_bus_id + " is on node " + std::to_string(node);
  home.host.interleave = false;
  home.host.node = node;
  home.placement.memory_node = node;
  // Without mbind, NumaArena's pre-fault (threads on the node touch every page first) places it.
  if (!can.binds_memory) note += ";" + first_touch;
  if (std::find(can.tbb_nodes.begin(), can.tbb_nodes.end(), node) != can.tbb_nodes.end()) {
    home.placement.thread_node = node;
  } else {
    note += "; oneTBB reports no NUMA node " + std::to_string(node) +
            " (tbbbind not loaded, or the process's CPU affinity excludes node " + std::to_string(node) +
            "): threads not constrained";
  }
  // Everything as asked: no note.
  if (can.binds_memory && home.placement.thread_node == node) note.clear();
  return home;
}

void place_pinned(gpu::Device& device, const Topology& topo, const NumaPlacement& placement) {
  device.place_pinned(topo, placement.memory_node);
}

NumaPlacement engine_placement(NumaPlacement store, bool host_rows, bool device) {
  if (!host_rows) store.memory_node = -1;
  if (!device) store.pinned_node = -1;
  return store;
}

NumaPlacement with_pinned(NumaPlacement placement, const gpu::Device* device) {
  if (!device) return placement;
  placement.pinned_node = device->pinned_node();
  const std::string note = device->pinned_note();
  if (!note.empty()) placement.note += (placement.note.empty() ? "" : "; ") + note;
  return placement;
}

}  // namespace strata::detail
