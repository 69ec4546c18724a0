// config `numa`: where `auto` puts a store's host tier (store/detail/numa_home.hpp): each rank's
// memory and arena on its GPU's node on fake topologies of 2 and 4 nodes, the fall-backs and their
// notes, the real pages of a host table and of pinned staging on this machine (move_pages, get_mempolicy), and
// StoreStats' placement of each engine and table.

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/mempolicy.h>  // MPOL_*: the kernel's UAPI header (no libnuma)
#include <linux/seccomp.h>
#include <linux/version.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu/device.hpp"
#include "host/host_table.hpp"
#include "host/page_nodes.hpp"
#include "store/detail/numa_home.hpp"
#include "store/store.hpp"

// MPOL_PREFERRED_MANY (Linux 5.15) is an enumerator, not a macro, so #ifndef cannot tell whether
// the header has it; older headers get its value.
#if LINUX_VERSION_CODE < KERNEL_VERSION(5, 15, 0)
#define MPOL_PREFERRED_MANY 5
#endif

namespace strata::detail {
namespace {

// hwloc's form of GPU i's bus id, and CUDA's (upper case) of the same device.
std::string hwloc_bus(int i) {
  char b[32];
  std::snprintf(b, sizeof b, "0000:%02x:00.0", 0x1a + 0x10 * i);
  return b;
}
std::string cuda_bus(int i) {
  char b[32];
  std::snprintf(b, sizeof b, "0000:%02X:00.0", 0x1a + 0x10 * i);
  return b;
}

StoreConfig with_numa(NumaPolicy p, int node = 0) {
  StoreConfig c;
  c.numa = p;
  c.numa_node = node;
  return c;
}

TEST(NumaHome, AutoPutsEachRanksMemoryAndArenaOnItsGpusNode) {
  // GPU i (rank i's) on node gpu_nodes[i]: two per node, not in node order.
  for (const std::vector<int>& gpu_nodes : {std::vector<int>{1, 0, 1, 0}, std::vector<int>{2, 3, 0, 1, 3, 2, 1, 0}}) {
    const int nodes = gpu_nodes.size() == 4 ? 2 : 4;
    std::vector<GpuInfo> gpus;
    for (std::size_t i = 0; i < gpu_nodes.size(); ++i)
      gpus.push_back({hwloc_bus(static_cast<int>(i)), "gpu", gpu_nodes[i]});
    const Topology topo = Topology::fake(nodes).with_gpus(gpus);
    NumaAbilities can;
    for (int n = 0; n < nodes; ++n) can.tbb_nodes.push_back(n);
    for (std::size_t rank = 0; rank < gpu_nodes.size(); ++rank) {
      SCOPED_TRACE(std::to_string(nodes) + " nodes, rank " + std::to_string(rank));
      const NumaHome h = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(static_cast<int>(rank)), can);
      EXPECT_FALSE(h.host.interleave);
      EXPECT_EQ(h.host.node, gpu_nodes[rank]);
      EXPECT_EQ(h.placement.memory_node, gpu_nodes[rank]);
      EXPECT_EQ(h.placement.thread_node, gpu_nodes[rank]);
      EXPECT_EQ(h.placement.note, "");
      // The rank's host table: every row on its GPU's node.
      TableSpec spec;
      spec.name = "t";
      spec.rows = 1000;
      spec.dim = 16;
      auto table = HostTable::create(topo, spec, h.host);
      ASSERT_TRUE(table.is_ok()) << table.status().to_string();
      for (std::int64_t r : {std::int64_t{0}, spec.rows / 2, spec.rows - 1})
        EXPECT_EQ(table->node_of(r), gpu_nodes[rank]) << "row " << r;
    }
  }
}

TEST(NumaHome, AutoFallsBackToInterleaveWithANote) {
  const Topology topo =
      Topology::fake(2).with_gpus({{hwloc_bus(0), "gpu", 1}, {hwloc_bus(1), "gpu", -1}, {hwloc_bus(3), "gpu", 5}});
  const NumaAbilities can{true, {0, 1}};
  struct Case {
    bool device;
    std::string bus, note;
  };
  for (const Case& c :
       {Case{false, "", "numa auto: the store has no device; host tier interleaved"},
        Case{true, "", "numa auto: the device has no PCI bus id (emu); host tier interleaved"},
        Case{true, cuda_bus(2),
             "numa auto: the fake topology (fake_numa_nodes) lists no GPU of PCI bus id " + cuda_bus(2) +
                 "; host tier interleaved"},
        Case{true, cuda_bus(1),
             "numa auto: hwloc does not know the NUMA node of GPU " + cuda_bus(1) + "; host tier interleaved"},
        Case{true, cuda_bus(3),
             "numa auto: hwloc puts GPU " + cuda_bus(3) +
                 " on node 5, but the topology has 2 nodes; host tier interleaved"}}) {
    const NumaHome h = resolve_numa_home(StoreConfig{}, topo, c.device, c.bus, can);
    EXPECT_TRUE(h.host.interleave) << c.note;
    EXPECT_EQ(h.placement.memory_node, -1) << c.note;
    EXPECT_EQ(h.placement.thread_node, -1) << c.note;
    EXPECT_EQ(h.placement.note, c.note);
  }
}

TEST(NumaHome, WithoutMbindPlacesByFirstTouchWithANote) {
  const Topology topo = Topology::fake(2).with_gpus({{hwloc_bus(0), "gpu", 1}});
  const std::string no_tbb =
      "; oneTBB reports no NUMA node 1 (tbbbind not loaded, or the process's CPU affinity excludes node 1): "
      "threads not constrained";
  // A kernel (or container) that refuses mbind, and oneTBB without tbbbind (it reports node -1): the
  // pages still go to the GPU's node, touched first by threads on it (NumaArena's pre-fault).
  const NumaHome h = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), NumaAbilities{false, {-1}});
  EXPECT_FALSE(h.host.interleave);
  EXPECT_EQ(h.host.node, 1);
  EXPECT_EQ(h.placement.memory_node, 1);
  EXPECT_EQ(h.placement.thread_node, -1);
  EXPECT_EQ(h.placement.note,
            "numa auto: GPU " + cuda_bus(0) + " is on node 1; placed by first touch (mbind unavailable)" + no_tbb);
  // Memory bound, threads not.
  const NumaHome m = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), NumaAbilities{true, {0}});
  EXPECT_EQ(m.placement.memory_node, 1);
  EXPECT_EQ(m.placement.thread_node, -1);
  EXPECT_EQ(m.placement.note, "numa auto: GPU " + cuda_bus(0) + " is on node 1" + no_tbb);
  // bind, the same rule.
  const NumaHome b =
      resolve_numa_home(with_numa(NumaPolicy::kBind, 1), topo, true, cuda_bus(0), NumaAbilities{false, {}});
  EXPECT_FALSE(b.host.interleave);
  EXPECT_EQ(b.host.node, 1);
  EXPECT_EQ(b.placement.memory_node, 1);
  EXPECT_EQ(b.placement.note, "numa bind: node 1 placed by first touch (mbind unavailable)");
}

TEST(NumaHome, HwlocListsNoGpuOnTheRealMachine) {
  auto real = Topology::discover();
  ASSERT_TRUE(real.is_ok()) << real.status().to_string();
  const NumaHome h = resolve_numa_home(StoreConfig{}, *real, true, cuda_bus(9), NumaAbilities{});
  EXPECT_TRUE(h.host.interleave);
  EXPECT_EQ(h.placement.note, "numa auto: hwloc lists no GPU of PCI bus id " + cuda_bus(9) + "; host tier interleaved");
}

TEST(NumaHome, AbilitiesAreProbedOnlyWhereNeeded) {
  // NumaAbilities::of probes mbind and loads tbbbind: only bind and auto with a GPU node ask.
  const Topology topo = Topology::fake(2).with_gpus({{hwloc_bus(0), "gpu", 1}});
  int calls = 0;
  const std::function<NumaAbilities()> count = [&calls] {
    ++calls;
    return NumaAbilities{true, {0, 1}};
  };
  (void)resolve_numa_home(with_numa(NumaPolicy::kInterleave), topo, true, cuda_bus(0), count);
  (void)resolve_numa_home(StoreConfig{}, topo, false, "", count);
  (void)resolve_numa_home(StoreConfig{}, topo, true, "", count);
  (void)resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(5), count);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), count).placement.thread_node, 1);
  EXPECT_EQ(calls, 1);
}

TEST(NumaHome, AutoIsAConfigValue) {
  ASSERT_TRUE(parse_numa_policy("auto").is_ok());
  EXPECT_EQ(parse_numa_policy("auto").value(), NumaPolicy::kAuto);
  EXPECT_STREQ(to_string(NumaPolicy::kAuto), "auto");
  EXPECT_EQ(parse_numa_policy("gpu").status().message(),
            "unknown numa policy 'gpu' (expected auto, interleave or bind)");
}

TEST(NumaHome, NumaNodeIsForBindOnly) {
  const std::string tables = R"("tables": [{"name": "t", "rows": 10, "dim": 4}])";
  EXPECT_EQ(parse_store_config(R"({"numa": "auto", "numa_node": 7, )" + tables + "}").status().message(),
            "numa_node 7 is the node of numa \"bind\", but numa is \"auto\" (drop numa_node, or set numa to "
            "\"bind\")");
  EXPECT_EQ(parse_store_config(R"({"numa_node": 1, )" + tables + "}").status().message(),
            "numa_node 1 is the node of numa \"bind\", but numa is \"auto\" (drop numa_node, or set numa to "
            "\"bind\")");
  StoreConfig c = parse_store_config("{" + tables + "}").value();
  c.numa = NumaPolicy::kInterleave;
  c.numa_node = 2;
  EXPECT_EQ(validate(c).message(),
            "numa_node 2 is the node of numa \"bind\", but numa is \"interleave\" (drop numa_node, or set numa "
            "to \"bind\")");
  // 0 (the default, which configs and checkpoints of earlier builds record for every policy) is accepted.
  EXPECT_TRUE(parse_store_config(R"({"numa": "interleave", "numa_node": 0, )" + tables + "}").is_ok());
  EXPECT_TRUE(parse_store_config(R"({"numa": "bind", "numa_node": 1, )" + tables + "}").is_ok());
  EXPECT_EQ(parse_store_config(R"({"numa": "bind", "numa_node": -1, )" + tables + "}").status().message(),
            "numa_node -1 must be >= 0");
}

TEST(NumaHome, InterleaveAndBindAsBefore) {
  const Topology topo = Topology::fake(2).with_gpus({{hwloc_bus(0), "gpu", 0}});
  const NumaAbilities can{true, {0, 1}};
  const NumaHome i = resolve_numa_home(with_numa(NumaPolicy::kInterleave), topo, true, cuda_bus(0), can);
  EXPECT_TRUE(i.host.interleave);
  EXPECT_EQ(i.placement.memory_node, -1);
  EXPECT_EQ(i.placement.thread_node, -1);
  const NumaHome b = resolve_numa_home(with_numa(NumaPolicy::kBind, 1), topo, true, cuda_bus(0), can);
  EXPECT_FALSE(b.host.interleave);
  EXPECT_EQ(b.host.node, 1);
  EXPECT_EQ(b.placement.memory_node, 1);
  EXPECT_EQ(b.placement.thread_node, -1);
  EXPECT_EQ(i.placement.note + b.placement.note, "");
}

TEST(NumaHome, HostTablePagesLieOnTheGpusNode) {
  auto real = Topology::discover();
  ASSERT_TRUE(real.is_ok()) << real.status().to_string();
  const int gpu_node = real->num_nodes() - 1;  // the last node of this machine (node 0 on one node)
  const Topology topo = real->with_gpus({{hwloc_bus(0), "gpu", gpu_node}});
  const NumaAbilities can = NumaAbilities::of(topo);
  const NumaHome h = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), can);
  if (!can.binds_memory) {
    EXPECT_EQ(h.placement.memory_node, -1);
    GTEST_SKIP() << "this kernel does not bind memory: " << h.placement.note;
  }
  ASSERT_EQ(h.placement.memory_node, gpu_node) << h.placement.note;
  TableSpec spec;
  spec.name = "t";
  spec.rows = 40000;  // 10 MB: arenas of its own, several huge pages
  spec.dim = 64;
  auto table = HostTable::create(topo, spec, h.host);
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();
  const int os_node = topo.nodes()[static_cast<std::size_t>(gpu_node)].os_index;
  for (std::int64_t r : {std::int64_t{0}, spec.rows / 2, spec.rows - 1}) {
    const int got = page_node(table->row(r));
    if (got == -ENOSYS || got == -EPERM) GTEST_SKIP() << "move_pages unavailable (errno " << -got << ")";
    EXPECT_EQ(got, os_node) << "row " << r;
    int mode = -1;
    unsigned long mask[16] = {};
    ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 64 * 16, table->row(r), MPOL_F_ADDR), 0);
    // Bound to the node (hwloc's non-strict bind is MPOL_PREFERRED_MANY where the kernel has it).
    EXPECT_TRUE(mode == MPOL_BIND || mode == MPOL_PREFERRED || mode == MPOL_PREFERRED_MANY)
        << "row " << r << ": mode " << mode;
    EXPECT_EQ(mask[os_node / 64], 1ul << (os_node % 64)) << "row " << r;
  }
}

// The node's OS index and the policy of the page at `p`: bound to `os_node` alone, as hwloc binds
// (its non-strict bind is MPOL_PREFERRED_MANY where the kernel has it).
void expect_bound_to(const void* p, int os_node, const std::string& what) {
  const int got = page_node(p);
  if (got == -ENOSYS || got == -EPERM) GTEST_SKIP() << "move_pages unavailable (errno " << -got << ")";
  EXPECT_EQ(got, os_node) << what;
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 64 * 16, p, MPOL_F_ADDR), 0) << what;
  EXPECT_TRUE(mode == MPOL_BIND || mode == MPOL_PREFERRED || mode == MPOL_PREFERRED_MANY) << what << ": mode " << mode;
  EXPECT_EQ(mask[os_node / 64], 1ul << (os_node % 64)) << what;
}

TEST(NumaHome, PinnedStagingGoesToTheGpusNode) {
  // A fake 2-node machine with the store's GPU on node 1: its device's pinned memory goes there.
  const Topology topo = Topology::fake(2).with_gpus({{hwloc_bus(0), "gpu", 1}});
  const NumaHome h = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), NumaAbilities{true, {0, 1}});
  auto dev = gpu::make_emu_device().value();
  place_pinned(*dev, topo, h.placement);
  EXPECT_EQ(dev->pinned_node(), 1);
  EXPECT_EQ(with_pinned(h.placement, dev.get()).pinned_node, 1);
  EXPECT_EQ(with_pinned(h.placement, dev.get()).note, "");
  // Interleaved: no one node, nothing placed.
  const NumaHome i = resolve_numa_home(with_numa(NumaPolicy::kInterleave), topo, true, cuda_bus(0), NumaAbilities{});
  place_pinned(*dev, topo, i.placement);
  EXPECT_EQ(dev->pinned_node(), -1);
}

TEST(NumaHome, PinnedStagingPagesLieOnTheHomeNode) {
  auto real = Topology::discover();
  ASSERT_TRUE(real.is_ok()) << real.status().to_string();
  if (!real->binds_memory()) GTEST_SKIP() << "this kernel does not bind memory";
  const int gpu_node = real->num_nodes() - 1;
  const Topology topo = real->with_gpus({{hwloc_bus(0), "gpu", gpu_node}});
  const int os_node = topo.nodes()[static_cast<std::size_t>(gpu_node)].os_index;
  // numa auto with a (fake) GPU on the last node, and numa bind to node 0.
  for (const auto& [config, node] : {std::pair<StoreConfig, int>{StoreConfig{}, gpu_node},
                                     std::pair<StoreConfig, int>{with_numa(NumaPolicy::kBind, 0), 0}}) {
    const NumaHome h = resolve_numa_home(config, topo, true, cuda_bus(0), NumaAbilities::of(topo));
    ASSERT_EQ(h.placement.memory_node, node) << h.placement.note;
    gpu::EmuOptions o;
    o.pinned_capacity = 384 << 10;
    auto dev = gpu::make_emu_device(o).value();
    place_pinned(*dev, topo, h.placement);
    {
      const gpu::PinnedBuffer b = dev->allocate_pinned(256 << 10).value();
      const char* p = b.as<char>();
      for (std::size_t off : {std::size_t{0}, b.bytes() / 2, b.bytes() - 1})
        expect_bound_to(p + off, node == gpu_node ? os_node : topo.nodes()[0].os_index, "byte " + std::to_string(off));
      // The same capacity as unplaced pinned memory.
      EXPECT_EQ(dev->allocate_pinned(256 << 10).status().code(), StatusCode::kResourceExhausted);
    }
    EXPECT_TRUE(dev->allocate_pinned(384 << 10).is_ok()) << "the first was freed";
    EXPECT_TRUE(dev->status().is_ok()) << dev->status().to_string();
  }
}

// A device whose pinned memory is placed on node 0 of this machine (null: the kernel does not bind).
std::unique_ptr<gpu::Device> placed_device(const Topology& topo) {
  if (!topo.binds_memory()) return nullptr;
  auto dev = gpu::make_emu_device().value();
  dev->place_pinned(topo, 0);
  return dev;
}

// As cudaFreeHost, freeing a placed block waits for the work queued on every stream before it.
TEST(NumaHome, FreeOfAPlacedPinnedBlockWaitsForTheWorkQueuedBeforeIt) {
  const Topology topo = Topology::discover().value();
  auto dev = placed_device(topo);
  if (!dev) GTEST_SKIP() << "this kernel does not bind memory";
  gpu::Stream other = dev->create_stream().value();
  auto b = dev->allocate_pinned(4096).value();
  ASSERT_EQ(dev->placed_pinned_blocks(), 1u);
  std::atomic<bool> ran{false};
  dev->host_task(other.view(), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ran = true;
  });
  b = gpu::PinnedBuffer();  // the free
  EXPECT_TRUE(ran.load()) << "the free returned while work queued before it was still running";
  EXPECT_EQ(dev->placed_pinned_blocks(), 0u);
  EXPECT_TRUE(dev->status().is_ok()) << dev->status().to_string();
}

// A placed block whose free was refused (from a host task) is parked, and unmapped with the device.
TEST(NumaHome, AParkedPlacedBlockIsUnmappedWithTheDevice) {
  const Topology topo = Topology::discover().value();
  auto dev = placed_device(topo);
  if (!dev) GTEST_SKIP() << "this kernel does not bind memory";
  auto b = dev->allocate_pinned(4096).value();
  void* p = b.data();
  gpu::Stream s = dev->create_stream().value();
  dev->host_task(s.view(), [&] { b = gpu::PinnedBuffer(); });
  EXPECT_FALSE(dev->synchronize(s.view()).is_ok()) << "the free from a host task is refused";
  ASSERT_EQ(msync(p, 4096, MS_ASYNC), 0) << "parked: still mapped";
  s = gpu::Stream();
  dev.reset();
  EXPECT_EQ(msync(p, 4096, MS_ASYNC), -1) << "still mapped after the device went";
  EXPECT_EQ(errno, ENOMEM);
}

TEST(NumaHome, StoreStatsSayWhereTheHostTierIs) {
  auto parsed = parse_store_config(
      R"({"tables": [{"name": "t", "rows": 10, "dim": 4, "placement": "offload"}], "device": {"backend": "emu"}})");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  StoreConfig c = parsed.value();
  EXPECT_EQ(c.numa, NumaPolicy::kAuto) << "the default";
  auto emu = Store::open(c);
  ASSERT_TRUE(emu.is_ok()) << emu.status().to_string();
  EXPECT_EQ(emu.value()->stats().numa.note, "numa auto: the device has no PCI bus id (emu); host tier interleaved");
  EXPECT_EQ(emu.value()->stats().numa.pinned_node, -1);
  // numa bind: the device's pinned staging on the node too.
  c.numa = NumaPolicy::kBind;
  auto staged = Store::open(c);
  ASSERT_TRUE(staged.is_ok()) << staged.status().to_string();
  EXPECT_EQ(staged.value()->stats().numa.pinned_node, Topology::discover()->binds_memory() ? 0 : -1);
  c.tables[0].placement = Placement::kCpu;
  c.numa = NumaPolicy::kBind;
  auto bound = Store::open(c);
  ASSERT_TRUE(bound.is_ok()) << bound.status().to_string();
  EXPECT_EQ(bound.value()->stats().numa.memory_node, 0);
  auto real = Topology::discover();
  ASSERT_TRUE(real.is_ok()) << real.status().to_string();
  EXPECT_EQ(bound.value()->stats().numa.note,
            real->binds_memory() ? "" : "numa bind: node 0 placed by first touch (mbind unavailable)");
}

// A store of tables in every placement that has one engine each (no world: hybrid is cached).
std::unique_ptr<Store> open_store(const std::string& numa, int fake_nodes = 0) {
  const std::string cached = R"(, "placement": "cached", "cache": {"rows": 50}})";
  auto c = parse_store_config(R"({"numa": )" + numa + R"(, "device": {"backend": "emu"}, "tables": [
      {"name": "u", "rows": 100, "dim": 4, "placement": "cpu"}, {"name": "v", "rows": 5000, "dim": 16},
      {"name": "w", "rows": 100, "dim": 4, "placement": "offload"}, {"name": "x", "rows": 100, "dim": 4)" +
                              cached + R"(, {"name": "y", "rows": 100, "dim": 4, "placement": "gpu"},
      {"name": "z", "rows": 100, "dim": 4, "placement": "hybrid", "cache": {"rows": 50}}]})");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  c->fake_numa_nodes = fake_nodes;
  auto store = Store::open(c.value());
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  return store ? std::move(store).value() : nullptr;
}

TEST(NumaHome, StoreStatsNameEachEngineAndEachTableOfHostRows) {
  auto store = open_store(R"("interleave")");
  ASSERT_TRUE(store);
  const StoreStats s = store->stats();
  // The engines in the store's order (caches first, host engines last); gpu's rows are in device memory.
  std::vector<std::string> engines;
  for (const auto& [name, placement] : s.numa_engines) engines.push_back(name);
  EXPECT_EQ(engines, (std::vector<std::string>{"cached", "gpu", "offload", "cpu"}));
  // Every table with host rows, in config order, with its placement and engine; y (gpu) has none.
  std::vector<std::string> tables;
  for (const TableNuma& t : s.numa_tables) tables.push_back(t.table + " " + t.placement + " " + t.engine);
  EXPECT_EQ(tables, (std::vector<std::string>{"u cpu cpu", "v cpu cpu", "w offload offload", "x cached cached",
                                              "z hybrid cached"}));
  for (const TableNuma& t : s.numa_tables) {
    EXPECT_EQ(t.memory_node, -1) << t.table << ": interleaved";
    EXPECT_EQ(t.thread_node, -1) << t.table;
  }
}

TEST(NumaHome, StoreStatsSampleWhereEachTablesPagesLie) {
  auto store = open_store(R"("bind")");
  ASSERT_TRUE(store);
  const StoreStats s = store->stats();
  ASSERT_EQ(s.numa_tables.size(), 5u);
  for (const TableNuma& t : s.numa_tables) {
    EXPECT_EQ(t.memory_node, 0) << t.table;
    if (!t.pages.note.empty()) GTEST_SKIP() << t.pages.note;  // no NUMA support here: "unknown"
    // Every row was written when the table was initialized: each sampled page is on this machine's node 0.
    EXPECT_GT(t.pages.sampled, 0) << t.table;
    EXPECT_LE(t.pages.sampled, 64) << t.table;
    EXPECT_EQ(t.pages.unfaulted, 0) << t.table;
    EXPECT_EQ(t.pages.nodes, (std::vector<std::pair<int, int>>{{0, t.pages.sampled}})) << t.table;
  }
  // v's records: 5000 x 64 bytes, more than 64 pages of 4 KiB: 64 sampled.
  if (sysconf(_SC_PAGESIZE) == 4096) {
    EXPECT_EQ(s.numa_tables[1].pages.sampled, 64);
  }
}

TEST(NumaHome, SampledPagesAreEvenlySpacedAndBounded) {
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t pages = 1000;
  void* m = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* bytes = static_cast<char*>(m);
  for (std::size_t i = 0; i < pages / 2; ++i) bytes[i * page] = 1;  // the first half faulted in
  const PageNodes p = sample_page_nodes({{m, pages * page}}, 64);
  munmap(m, pages * page);
  if (!p.note.empty()) GTEST_SKIP() << p.note;
  EXPECT_EQ(p.sampled, 64);
  EXPECT_EQ(p.unfaulted, 32) << "evenly spaced: half of them in the second half";
  EXPECT_EQ(p.nodes, (std::vector<std::pair<int, int>>{{0, 32}}));
  EXPECT_EQ(sample_page_nodes({}, 64).sampled, 0);
}

// Where the kernel or container has no NUMA support (move_pages fails with ENOSYS, as a seccomp filter
// makes it here, on one thread): the nodes are unknown, with a note, and nothing fails.
TEST(NumaHome, PagesOfAKernelWithoutNumaSupportAreUnknownWithANote) {
  std::vector<char> rows(1 << 16, 1);
  PageNodes got;
  int one = 0;
  bool filtered = false;
  std::thread t([&] {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_move_pages, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    // Without SECCOMP_FILTER_FLAG_TSYNC the filter holds for this thread only.
    filtered = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
    if (!filtered) return;
    got = sample_page_nodes({{rows.data(), rows.size()}});
    one = page_node(rows.data());
  });
  t.join();
  if (!filtered) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_TRUE(got.nodes.empty());
  EXPECT_EQ(got.unfaulted, 0);
  EXPECT_EQ(got.note, std::string("unknown: move_pages failed (") + std::strerror(ENOSYS) +
                          "): no NUMA support in this kernel or container");
  EXPECT_EQ(one, -ENOSYS);
}

TEST(NumaHome, StoreStatsGiveEachEnginesNodesOnAFakeTopology) {
  // Bound to node 1 of a fake 2-node machine: each engine's memory where it holds host rows, its
  // pinned staging where it has a device.
  auto store = open_store(R"("bind", "numa_node": 1)", 2);
  ASSERT_TRUE(store);
  const StoreStats s = store->stats();
  std::vector<std::string> got;
  for (const auto& [name, p] : s.numa_engines)
    got.push_back(name + " " + std::to_string(p.memory_node) + " " + std::to_string(p.thread_node) + " " +
                  std::to_string(p.pinned_node));
  EXPECT_EQ(got, (std::vector<std::string>{"cached 1 -1 1", "gpu -1 -1 1", "offload 1 -1 1", "cpu 1 -1 -1"}));
  for (const TableNuma& t : s.numa_tables) EXPECT_EQ(t.memory_node, 1) << t.table;
  // The fake node's memory is the real node 0's.
  for (const TableNuma& t : s.numa_tables) {
    if (t.pages.note.empty()) {
      EXPECT_EQ(t.pages.nodes, (std::vector<std::pair<int, int>>{{0, t.pages.sampled}})) << t.table;
    }
  }
}

TEST(NumaHome, EachEnginesThreadsOnTheGpusNodeOfAFakeTopology) {
  // numa auto, GPU on node 3 of 4: every engine's threads there, memory and staging where it has them.
  const Topology topo = Topology::fake(4).with_gpus({{hwloc_bus(0), "gpu", 3}});
  const NumaHome h = resolve_numa_home(StoreConfig{}, topo, true, cuda_bus(0), NumaAbilities{true, {0, 1, 2, 3}});
  auto dev = gpu::make_emu_device().value();
  place_pinned(*dev, topo, h.placement);
  const NumaPlacement store = with_pinned(h.placement, dev.get());
  for (const auto& [host_rows, device, memory, pinned] :
       {std::tuple<bool, bool, int, int>{true, true, 3, 3}, {false, true, -1, 3}, {true, false, 3, -1}}) {
    const NumaPlacement e = engine_placement(store, host_rows, device);
    EXPECT_EQ(e.memory_node, memory);
    EXPECT_EQ(e.thread_node, 3);
    EXPECT_EQ(e.pinned_node, pinned);
    EXPECT_EQ(e.note, "");
  }
}

}  // namespace
}  // namespace strata::detail
