// strata-tune calibrate's library (tune/calibrate.hpp): a small real measurement gives a
// profile that validates, parses back, and names the source of every number.

#include "tune/calibrate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::tune {
namespace {

ProfileNumber n(double v) { return {v, "spec sheet"}; }

CalibrateOptions small_options() {
  CalibrateOptions o;
  o.base.name = "base";
  o.base.description = "a base profile";
  o.base.gpus = n(1);
  o.base.hbm_gbs = n(1000);
  o.base.pcie_h2d_gbs = n(50);
  o.base.pcie_d2h_gbs = n(50);
  o.base.pcie_latency_us = n(5);
  o.base.numa_nodes = {{n(100), n(100), {}}};
  o.base.all_to_all_gbs = n(100);
  o.base.kernel_launch_us = n(5);
  o.base.hbm_capacity_gb = n(80);
  o.base.host_memory_gb = n(256);
  o.base_path = "base.json";
  o.name = "here";
  o.row_bytes = {64, 256};
  o.table_bytes = std::size_t{2} << 20;
  o.lookups = 4096;
  o.threads = 1;
  o.command = "strata-tune calibrate --test";
  o.date = "2026-11-24";
  return o;
}

TEST(TuneCalibrate, ProfileParsesValidatesAndNamesEverySource) {
  const CalibrateOptions o = small_options();
  auto p = calibrate(o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(validate(*p).is_ok());
  EXPECT_TRUE(has_gather_rates(*p));
  auto again = parse_hardware_profile(hardware_profile_to_json(*p), "<calibrated>");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(hardware_profile_to_json(*again), hardware_profile_to_json(*p));
  EXPECT_EQ(p->name, "here");

  const std::string here = "measured here on 2026-11-24 by `strata-tune calibrate --test`: ";
  const std::string from = "from profile 'base' (base.json): spec sheet";
  for (const ProfileNumber* x : {&p->gpus, &p->hbm_gbs, &p->pcie_h2d_gbs, &p->pcie_d2h_gbs, &p->pcie_latency_us,
                                 &p->all_to_all_gbs, &p->kernel_launch_us, &p->hbm_capacity_gb}) {
    EXPECT_EQ(x->source, from);
  }
  EXPECT_EQ(p->hbm_gbs.value, 1000);
  EXPECT_EQ(p->host_memory_gb.source.rfind(here + "MemTotal", 0), 0u) << p->host_memory_gb.source;
  ASSERT_FALSE(p->numa_nodes.empty());
  for (const NumaNodeProfile& node : p->numa_nodes) {
    EXPECT_GT(node.local_gbs.value, 0);
    EXPECT_EQ(node.local_gbs.source.rfind(here + "sequential read of 2 MiB by 1 thread on node", 0), 0u)
        << node.local_gbs.source;
    ASSERT_EQ(node.gather.size(), 2u);
    EXPECT_EQ(node.gather[0].row_bytes, 64);
    EXPECT_EQ(node.gather[1].row_bytes, 256);
    for (const GatherRate& g : node.gather) {
      EXPECT_GT(g.local_rows_per_s.value, 0);
      EXPECT_EQ(g.local_rows_per_s.source.rfind(here + "gather of uniformly random " + std::to_string(g.row_bytes), 0),
                0u)
          << g.local_rows_per_s.source;
    }
    if (p->numa_nodes.size() == 1) {
      EXPECT_EQ(node.remote_gbs.value, node.local_gbs.value);
      EXPECT_NE(node.remote_gbs.source.find("single NUMA node"), std::string::npos);
    }
  }
}

// Issue 34: the node of each GPU, from hwloc's locality, in PCI bus id order; nothing when hwloc
// lists another number of GPUs or does not know a node.
TEST(TuneCalibrate, GpuNumaNodesFromHwlocLocality) {
  const Topology topo =
      Topology::fake(2).with_gpus({{"0000:3b:00.0", "", 1}, {"0000:1a:00.0", "", 0}, {"0000:5e:00.0", "", 1}});
  const GpuNumaNodes g = gpu_numa_nodes_of(topo, 3, "measured here: ");
  EXPECT_EQ(g.value, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(g.source,
            "measured here: hwloc's NUMA locality of the GPUs in PCI bus id order: 0000:1a:00.0 on node 0, "
            "0000:3b:00.0 on node 1, 0000:5e:00.0 on node 1");
  EXPECT_TRUE(gpu_numa_nodes_of(topo, 2, "").value.empty());  // the profile has 2 GPUs, hwloc 3
  EXPECT_TRUE(gpu_numa_nodes_of(Topology::fake(2).with_gpus({{"0000:1a:00.0", "", -1}}), 1, "").value.empty());
  EXPECT_TRUE(gpu_numa_nodes_of(Topology::fake(1).with_gpus({{"0000:1a:00.0", "", 1}}), 1, "").value.empty());
}

TEST(TuneCalibrate, BadOptionsNameTheField) {
  CalibrateOptions o = small_options();
  o.row_bytes = {64, 62};
  EXPECT_EQ(validate(o).message(), "--row-bytes: 62 (expected multiples of 4 bytes, ascending, at most 4 MiB)");
  o = small_options();
  o.table_bytes = 1000;
  EXPECT_NE(validate(o).message().find("--probe-mib: 0 MiB"), std::string::npos);
  o = small_options();
  o.base.hbm_gbs.value = -1;
  EXPECT_EQ(validate(o).message(), "profile 'base': hbm_gbs = -1 (expected a finite number > 0)");
  EXPECT_FALSE(calibrate(o).is_ok());
}

// Issue 29: a count the machine cannot hold is refused before anything is allocated or started.
TEST(TuneCalibrate, CountsBeyondTheMachineAreRefusedBeforeAnyProbe) {
  CalibrateOptions o = small_options();
  EXPECT_TRUE(check_fits_machine(o).is_ok()) << check_fits_machine(o).to_string();
  // Keys and offsets of two batches, and one batch's output of the largest rows.
  EXPECT_EQ(calibrate_peak_bytes(o), (2 << 20) + 2.0 * (4096 + 256 + 1) * 8 + 256.0 * 256);
  o.lookups = std::int64_t{1} << 50;
  const Status s = check_fits_machine(o);
  EXPECT_NE(s.message().find("--probe-mib 2 --lookups 1125899906842624: the probes hold up to "), std::string::npos)
      << s.to_string();
  EXPECT_NE(s.message().find("this machine can use"), std::string::npos) << s.to_string();
  // calibrate() refuses with the same check, whose MemAvailable, read again, may have moved (a
  // loaded machine once gave 21172 MiB, then 21168 MiB).
  const auto without_available = [](std::string m) {
    const std::size_t at = m.find("more than "), end = m.find(" MiB this machine can use");
    if (at != std::string::npos && end != std::string::npos && at < end) m.replace(at, end - at, "more than N");
    return m;
  };
  EXPECT_EQ(without_available(calibrate(o).status().message()), without_available(s.message()));
  o = small_options();
  o.threads = 1 << 30;
  EXPECT_NE(check_fits_machine(o).message().find("--threads 1073741824 is more than 4 x the "), std::string::npos)
      << check_fits_machine(o).to_string();
  EXPECT_FALSE(calibrate(o).is_ok());
}

}  // namespace
}  // namespace strata::tune
