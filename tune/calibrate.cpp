#include "tune/calibrate.hpp"

#include <hwloc.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <utility>

#include "host/topology.hpp"
#include "toolkit/gather_probe.hpp"
#include "toolkit/machine_info.hpp"
#include "toolkit/workload.hpp"

namespace strata::tune {
namespace {

// Memory policy of the calling thread (inherited by the threads it starts): bound to `os_node`.
// Returns false where the OS cannot bind (containers), which the sources then say.
bool bind_thread_memory(int os_node) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return false;
  bool ok = hwloc_topology_load(topo) == 0;
  if (ok) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, static_cast<unsigned>(os_node));
    ok = hwloc_set_membind(topo, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0;
    hwloc_bitmap_free(set);
  }
  hwloc_topology_destroy(topo);
  return ok;
}

// One reader node against one memory node.
struct Measured {
  double seq_gbs = 0;
  std::vector<double> rows_per_s;  // per row size
  std::string how;                 // binding note for the sources
};

std::vector<bench::GatherProbeBatch> random_batches(std::int64_t table_rows, std::int64_t lookups) {
  std::vector<bench::GatherProbeBatch> out(2);
  std::mt19937_64 rng(20261124);
  for (auto& b : out) {
    const std::int64_t bags = lookups / kCalibrateBagKeys;
    for (std::int64_t i = 0; i <= bags; ++i) b.offsets.push_back(i * kCalibrateBagKeys);
    b.rows.resize(static_cast<std::size_t>(bags * kCalibrateBagKeys));
    for (auto& r : b.rows) r = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(table_rows));
  }
  return out;
}

Result<Measured> measure_pair(const Topology& topo, int reader, int memory, int threads, const CalibrateOptions& o,
                              const ProgressFn& progress) {
  Measured m;
  Status status;
  // A thread of its own, so its CPU and memory bindings (inherited by the probes' threads) end with it.
  std::thread worker([&] {
    const bool several = topo.num_nodes() > 1;
    if (several) {
      (void)topo.bind_current_thread(reader);
      const bool bound = bind_thread_memory(topo.nodes()[static_cast<std::size_t>(memory)].os_index);
      m.how = bound ? "" : " (the OS refused the memory binding: first touch placed the pages)";
    }
    const std::string pair = "node " + std::to_string(reader) + " from node " + std::to_string(memory) + "'s memory";
    if (progress) progress("sequential read, " + pair);
    m.seq_gbs = bench::measure_read_bandwidth_gbs(o.table_bytes, threads);
    if (m.seq_gbs <= 0) {
      status = Status::resource_exhausted("calibrate: cannot allocate " + std::to_string(o.table_bytes) +
                                          " bytes for the read probe (lower --probe-mib)");
      return;
    }
    for (const std::int64_t bytes : o.row_bytes) {
      if (progress) progress("gather of " + std::to_string(bytes) + " B rows, " + pair);
      bench::GatherProbeSpec spec;
      spec.dim = static_cast<std::int32_t>(bytes / 4);
      spec.stride = spec.dim;
      spec.table_rows = static_cast<std::int64_t>(o.table_bytes) / bytes;
      spec.threads = threads;
      auto r = bench::measure_gather_limit(spec, random_batches(spec.table_rows, o.lookups), 5);
      if (!r) {
        status = r.status().with_context("calibrate: gather of " + std::to_string(bytes) + " B rows");
        return;
      }
      m.rows_per_s.push_back(r->lookups_per_s);
    }
  });
  worker.join();
  if (!status.is_ok()) return status;
  return m;
}

ProfileNumber from_base(const ProfileNumber& n, const CalibrateOptions& o) {
  return {n.value, "from profile '" + o.base.name + "' (" + o.base_path + "): " + n.source};
}

}  // namespace

Status validate(const CalibrateOptions& o) {
  STRATA_RETURN_IF_ERROR(validate(o.base));
  if (o.name.empty()) return Status::invalid_argument("--name is empty (expected a short id for the profile)");
  if (o.row_bytes.empty()) return Status::invalid_argument("--row-bytes is empty (expected sizes like 64,128,256)");
  for (std::size_t i = 0; i < o.row_bytes.size(); ++i) {
    const std::int64_t b = o.row_bytes[i];
    if (b <= 0 || b % 4 != 0 || (i > 0 && b <= o.row_bytes[i - 1]) || b > kMaxCalibrateRowBytes)
      return Status::invalid_argument("--row-bytes: " + std::to_string(b) +
                                      " (expected multiples of 4 bytes, ascending, at most 4 MiB)");
  }
  if (o.table_bytes < (std::size_t{1} << 20) || o.table_bytes < static_cast<std::size_t>(o.row_bytes.back()) * 1024)
    return Status::invalid_argument("--probe-mib: " + std::to_string(o.table_bytes >> 20) +
                                    " MiB (expected at least 1 MiB and 1024 rows of the largest size)");
  if (o.lookups < kCalibrateBagKeys)
    return Status::invalid_argument("--lookups " + std::to_string(o.lookups) +
                                    " (expected >= " + std::to_string(kCalibrateBagKeys) + ")");
  if (o.threads < 0) return Status::invalid_argument("--threads " + std::to_string(o.threads) + " (expected >= 0)");
  return Status::ok();
}

double calibrate_peak_bytes(const CalibrateOptions& o) {
  const double bags = std::floor(static_cast<double>(o.lookups) / kCalibrateBagKeys);  // random_batches' bags
  const double keys = 2.0 * (bags * kCalibrateBagKeys + bags + 1.0) * 8.0;             // two batches
  const double output = bags * static_cast<double>(o.row_bytes.empty() ? 0 : o.row_bytes.back());
  return static_cast<double>(o.table_bytes) + keys + output;
}

Status check_fits_machine(const CalibrateOptions& o) {
  STRATA_RETURN_IF_ERROR(bench::check_thread_count("--threads", o.threads, 0));
  const double usable = bench::usable_memory_bytes(bench::describe_machine());
  const double peak = calibrate_peak_bytes(o);
  if (usable > 0 && peak > usable)
    return Status::invalid_argument(
        "--probe-mib " + std::to_string(o.table_bytes >> 20) + " --lookups " + std::to_string(o.lookups) +
        ": the probes hold up to " + std::to_string(std::llround(peak / 1048576.0)) + " MiB at once (a probe table, " +
        "the keys of two batches of --lookups rows and a batch of the largest --row-bytes output), more than the " +
        std::to_string(std::llround(usable / 1048576.0)) + " MiB this machine can use (" + bench::usable_memory_note() +
        "); lower --probe-mib or --lookups");
  return Status::ok();
}

GpuNumaNodes gpu_numa_nodes_of(const Topology& topo, int gpus, const std::string& source) {
  std::vector<GpuInfo> found = topo.gpus();
  if (gpus < 1 || found.size() != static_cast<std::size_t>(gpus)) return {};
  std::sort(found.begin(), found.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.pci_bus_id < b.pci_bus_id; });
  GpuNumaNodes out;
  std::string where;
  for (const GpuInfo& g : found) {
    if (g.numa_node < 0 || g.numa_node >= topo.num_nodes()) return {};
    out.value.push_back(g.numa_node);
    where += (where.empty() ? "" : ", ") + g.pci_bus_id + " on node " + std::to_string(g.numa_node);
  }
  out.source = source + "hwloc's NUMA locality of the GPUs in PCI bus id order: " + where;
  return out;
}

Result<HardwareProfile> calibrate(const CalibrateOptions& o, const ProgressFn& progress) {
  STRATA_RETURN_IF_ERROR(validate(o));
  STRATA_RETURN_IF_ERROR(check_fits_machine(o));
  STRATA_ASSIGN_OR_RETURN(const Topology topo, Topology::discover());
  const bench::MachineInfo machine = bench::describe_machine();
  const int nodes = std::max(1, topo.num_nodes());
  const std::string here = "measured here on " + o.date + " by `" + o.command + "`: ";

  HardwareProfile p;
  p.name = o.name;
  p.description = "Host memory of " + machine.cpu_model + " (" + std::to_string(machine.cores) + " hardware threads, " +
                  std::to_string(nodes) + " NUMA node" + (nodes == 1 ? "" : "s") +
                  ") measured by strata-tune calibrate on " + o.date + "; GPU and link numbers from profile '" +
                  o.base.name + "'.";
  p.gpus = from_base(o.base.gpus, o);
  p.hbm_gbs = from_base(o.base.hbm_gbs, o);
  p.pcie_h2d_gbs = from_base(o.base.pcie_h2d_gbs, o);
  p.pcie_d2h_gbs = from_base(o.base.pcie_d2h_gbs, o);
  p.pcie_latency_us = from_base(o.base.pcie_latency_us, o);
  p.all_to_all_gbs = from_base(o.base.all_to_all_gbs, o);
  p.kernel_launch_us = from_base(o.base.kernel_launch_us, o);
  p.hbm_capacity_gb = from_base(o.base.hbm_capacity_gb, o);
  p.host_memory_gb = {static_cast<double>(machine.memory_total_bytes) / 1e9,
                      here + "MemTotal of /proc/meminfo (" + std::to_string(machine.memory_total_bytes) + " bytes)"};
  if (machine.memory_total_bytes == 0) p.host_memory_gb = from_base(o.base.host_memory_gb, o);
  if (const std::uint64_t l2 = Topology::l2_cache_bytes(); l2 > 0)
    p.l2_cache_bytes = {static_cast<double>(l2), here + "the smallest L2 cache hwloc lists (Topology::l2_cache_bytes)"};

  for (int node = 0; node < nodes; ++node) {
    const auto& cpus = topo.nodes()[static_cast<std::size_t>(node)].cpus;
    const int threads = o.threads > 0
                            ? o.threads
                            : (cpus.empty() ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                                            : static_cast<int>(cpus.size()));
    STRATA_ASSIGN_OR_RETURN(const Measured local, measure_pair(topo, node, node, threads, o, progress));
    Measured remote;
    const bool several = nodes > 1;
    if (several) {
      STRATA_ASSIGN_OR_RETURN(remote, measure_pair(topo, (node + 1) % nodes, node, threads, o, progress));
    }
    const std::string mib = std::to_string(o.table_bytes >> 20) + " MiB";
    const std::string who = std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
    const std::string local_what = who + " on node " + std::to_string(node) + " from its own memory" + local.how;
    const std::string remote_what = who + " on node " + std::to_string((node + 1) % nodes) + " from node " +
                                    std::to_string(node) + "'s memory" + remote.how;
    const std::string single = "single NUMA node: there is no remote memory; set equal to local so it never matters";
    NumaNodeProfile n;
    n.local_gbs = {local.seq_gbs, here + "sequential read of " + mib + " by " + local_what + ", median of 5 passes"};
    n.remote_gbs = several ? ProfileNumber{remote.seq_gbs, here + "sequential read of " + mib + " by " + remote_what +
                                                               ", median of 5 passes"}
                           : ProfileNumber{local.seq_gbs, single};
    for (std::size_t i = 0; i < o.row_bytes.size(); ++i) {
      GatherRate g;
      g.row_bytes = o.row_bytes[i];
      const std::string what = "gather of uniformly random " + std::to_string(g.row_bytes) + " B rows from a " + mib +
                               " table, bags of " + std::to_string(kCalibrateBagKeys) + " keys, " +
                               std::to_string(o.lookups) +
                               " rows per pass, median of 5 passes at the best prefetch distance, by ";
      g.local_rows_per_s = {local.rows_per_s[i], here + what + local_what};
      g.remote_rows_per_s = several ? ProfileNumber{remote.rows_per_s[i], here + what + remote_what}
                                    : ProfileNumber{local.rows_per_s[i], single};
      n.gather.push_back(std::move(g));
    }
    p.numa_nodes.push_back(std::move(n));
  }
  p.gpu_numa_nodes = gpu_numa_nodes_of(topo, static_cast<int>(p.gpus.value), here);
  STRATA_RETURN_IF_ERROR(validate(p));
  return p;
}

}  // namespace strata::tune
