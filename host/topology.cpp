#include "host/topology.hpp"

#include <hwloc.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

namespace strata {

struct Topology::Handle {
  hwloc_topology_t topo = nullptr;
  ~Handle() {
    if (topo) hwloc_topology_destroy(topo);
  }
};

Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

namespace {

std::vector<int> cpus_of(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  unsigned i = 0;
  hwloc_bitmap_foreach_begin(i, set) { cpus.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  return cpus;
}

}  // namespace

Result<Topology> Topology::discover() {
  // Loaded once and never destroyed (see the header); hwloc is thread-safe for the read-only
  // queries and binding calls made here.
  static std::mutex mutex;
  static std::shared_ptr<const Handle>* shared = nullptr;
  std::shared_ptr<const Handle> handle;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!shared) {
      auto h = std::make_shared<Handle>();
      if (hwloc_topology_init(&h->topo) != 0) return Status::internal("hwloc_topology_init failed");
      hwloc_topology_set_io_types_filter(h->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
      if (hwloc_topology_load(h->topo) != 0) return Status::internal("hwloc_topology_load failed");
      shared = new std::shared_ptr<const Handle>(std::move(h));  // intentionally immortal
    }
    handle = *shared;
  }
  hwloc_topology_t t = handle->topo;

  Topology topo;
  const int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode node;
    node.id = i;
    node.os_index = static_cast<int>(obj->os_index);
    node.cpus = cpus_of(obj->cpuset);
    node.memory_bytes = obj->attr ? obj->attr->numanode.local_memory : 0;
    topo.nodes_.push_back(std::move(node));
  }
  if (topo.nodes_.empty()) {  // hwloc always reports one node, but be safe
    NumaNode node;
    node.cpus = cpus_of(hwloc_topology_get_topology_cpuset(t));
    topo.nodes_.push_back(std::move(node));
  }
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(t, nullptr); pci; pci = hwloc_get_next_pcidev(t, pci)) {
    // class 0x03xx is display controllers; vendor 0x10de NVIDIA, 0x1002 AMD.
    if ((pci->attr->pcidev.class_id >> 8) != 0x03) continue;
    if (pci->attr->pcidev.vendor_id != 0x10de && pci->attr->pcidev.vendor_id != 0x1002) continue;
    GpuInfo g;
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                  pci->attr->pcidev.dev, pci->attr->pcidev.func);
    g.pci_bus_id = bus;
    if (const char* name = hwloc_obj_get_info_by_name(pci, "PCIDevice")) g.name = name;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, pci);
    if (anc && anc->nodeset) {
      for (const NumaNode& node : topo.nodes_) {
        if (hwloc_bitmap_isset(anc->nodeset, static_cast<unsigned>(node.os_index)) &&
            hwloc_bitmap_weight(anc->nodeset) == 1) {
          g.numa_node = node.id;
        }
      }
    }
    topo.gpus_.push_back(std::move(g));
  }
  topo.handle_ = std::move(handle);
  return topo;
}

std::uint64_t Topology::l2_cache_bytes() noexcept {
  // A topology of its own, CPUs and caches only: no I/O discovery, so no hwloc plugin (PCI, CUDA,
  // NVML) is loaded from whichever thread asks first (a kernel's worker thread); with I/O
  // discovery, LeakSanitizer's exit-time tracer crashed in processes that had only fake
  // topologies before.
  static const std::uint64_t bytes = [] {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) return kDefaultL2Bytes;
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
    std::uint64_t smallest = 0;
    if (hwloc_topology_load(t) == 0) {
      const int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_L2CACHE);
      for (int i = 0; i < n; ++i) {
        const hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_L2CACHE, static_cast<unsigned>(i));
        if (!obj->attr || obj->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION) continue;
        const std::uint64_t size = obj->attr->cache.size;
        if (size > 0 && (smallest == 0 || size < smallest)) smallest = size;
      }
    }
    hwloc_topology_destroy(t);
    return smallest > 0 ? smallest : kDefaultL2Bytes;
  }();
  return bytes;
}

Topology Topology::fake(int nodes) {
  STRATA_CHECK(nodes >= 1);
  Topology topo;
  topo.fake_ = true;
  const int ncpu = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < nodes; ++i) {
    NumaNode node;
    node.id = i;
    node.os_index = 0;
    topo.nodes_.push_back(std::move(node));
  }
  for (int c = 0; c < ncpu; ++c) topo.nodes_[static_cast<std::size_t>(c % nodes)].cpus.push_back(c);
  return topo;
}

Topology Topology::with_gpus(std::vector<GpuInfo> gpus) const {
  Topology copy;
  copy.handle_ = handle_;
  copy.nodes_ = nodes_;
  copy.gpus_ = std::move(gpus);
  copy.fake_ = fake_;
  return copy;
}

const GpuInfo* Topology::find_gpu(const std::string& pci_bus_id) const {
  const auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string id = lower(pci_bus_id);
  for (const GpuInfo& g : gpus_)
    if (!id.empty() && lower(g.pci_bus_id) == id) return &g;
  return nullptr;
}

bool Topology::binds_memory() const {
  if (!handle_) return true;
  // One page bound to the first node the process may use: ENOSYS (no NUMA in the kernel), EPERM
  // (a seccomp profile) or EXDEV say that binding is not available here.
  static const bool binds = [t = handle_->topo] {
    const long page = sysconf(_SC_PAGESIZE);
    void* p = mmap(nullptr, static_cast<std::size_t>(page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    const int rc = hwloc_set_area_membind(t, p, static_cast<std::size_t>(page), hwloc_topology_get_allowed_nodeset(t),
                                          HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
    munmap(p, static_cast<std::size_t>(page));
    return rc == 0;
  }();
  return binds;
}

int Topology::num_cpus() const noexcept {
  int n = 0;
  for (const auto& node : nodes_) n += static_cast<int>(node.cpus.size());
  return n;
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << nodes_.size() << " NUMA node(s)" << (fake_ ? " (fake)" : "") << ":";
  for (const auto& n : nodes_) {
    os << " node" << n.id << " cpus=" << n.cpus.size();
    if (n.memory_bytes) os << " mem=" << (static_cast<double>(n.memory_bytes) / (1ull << 30)) << "GiB";
    os << ";";
  }
  os << " gpus:";
  if (gpus_.empty()) os << " none";
  for (const auto& g : gpus_) os << " " << g.pci_bus_id << "@node" << g.numa_node;
  return os.str();
}

Status Topology::bind_memory(void* addr, std::size_t len, int node) const {
  if (node < 0 || node >= num_nodes())
    return Status::invalid_argument("NUMA node " + std::to_string(node) + " out of range [0, " +
                                    std::to_string(num_nodes()) + ")");
  if (!handle_ || len == 0) return Status::ok();  // fake topology: nothing real to bind
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_only(set, static_cast<unsigned>(nodes_[static_cast<std::size_t>(node)].os_index));
  const int rc = hwloc_set_area_membind(handle_->topo, addr, len, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
  const int err = errno;
  hwloc_bitmap_free(set);
  // ENOSYS/EXDEV: the OS cannot bind (containers without mbind); memory is still usable.
  if (rc != 0 && err != ENOSYS && err != EXDEV && err != EPERM)
    return Status::internal(std::string("hwloc_set_area_membind to node ") + std::to_string(node) +
                            " failed: " + std::strerror(err));
  return Status::ok();
}

Status Topology::bind_current_thread(int node) const {
  if (node < 0 || node >= num_nodes())
    return Status::invalid_argument("NUMA node " + std::to_string(node) + " out of range [0, " +
                                    std::to_string(num_nodes()) + ")");
  if (!handle_) return Status::ok();
  const auto& cpus = nodes_[static_cast<std::size_t>(node)].cpus;
  if (cpus.empty()) return Status::ok();
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int c : cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
  const int rc = hwloc_set_cpubind(handle_->topo, set, HWLOC_CPUBIND_THREAD);
  const int err = errno;
  hwloc_bitmap_free(set);
  if (rc != 0 && err != ENOSYS && err != EXDEV && err != EPERM)
    return Status::internal(std::string("hwloc_set_cpubind to node ") + std::to_string(node) +
                            " failed: " + std::strerror(err));
  return Status::ok();
}

}  // namespace strata
