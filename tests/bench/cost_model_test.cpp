// The cost model (store/model/cost_model.hpp) against hand-computed cases, and the shipped profiles.

#include "store/model/cost_model.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "host/numa_arena.hpp"
#include "host/repeats.hpp"
#include "host/topology.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

using nlohmann::json;

ProfileNumber n(double v) { return {v, "test value"}; }

// Round numbers so every case below can be computed by hand.
HardwareProfile test_profile() {
  HardwareProfile p;
  p.name = "test";
  p.description = "round numbers";
  p.gpus = n(1);
  p.hbm_gbs = n(1000);
  p.pcie_h2d_gbs = n(50);
  p.pcie_d2h_gbs = n(25);
  p.pcie_latency_us = n(10);
  p.numa_nodes = {{n(100), n(20), {}}, {n(100), n(20), {}}};  // 200 GB/s local, 40 GB/s remote in all
  p.all_to_all_gbs = n(200);
  p.kernel_launch_us = n(5);
  p.hbm_capacity_gb = n(80);
  p.host_memory_gb = n(512);
  return p;
}

double link_s(const ModelledStep& m, Link l) { return m.links[static_cast<int>(l)].seconds; }

TEST(CostModel, SingleLinkPcie) {
  StepBytes b;
  b.h2d = 1e9;
  const ModelledStep m = model_step(test_profile(), b);
  // 1e9 B / 50e9 B/s = 20 ms, plus 10 us latency.
  EXPECT_DOUBLE_EQ(link_s(m, Link::kPcieH2d), 0.02 + 10e-6);
  EXPECT_DOUBLE_EQ(m.step_s, 0.02001);
  EXPECT_DOUBLE_EQ(m.serial_s, 0.02001);
  EXPECT_EQ(m.bottleneck, "pcie_h2d");
  EXPECT_EQ(m.explanation, "PCIe H2D-bound: 1 GB per step at 50 GB/s = 20 ms of a 20 ms step (serial sum 20 ms)");
  EXPECT_DOUBLE_EQ(m.links[static_cast<int>(Link::kPcieH2d)].gbs, 50);
  EXPECT_EQ(m.links[static_cast<int>(Link::kHbm)].seconds, 0);
  EXPECT_EQ(m.links[static_cast<int>(Link::kHbm)].gbs, 0);
}

TEST(CostModel, AllLinksOverlapAndSerialSum) {
  StepBytes b;
  b.hbm_read = 4e9;
  b.hbm_write = 1e9;  // HBM: 5e9 / 1000e9 = 5 ms
  b.h2d = 1e8;        // 1e8 / 50e9 = 2 ms + 10 us
  b.d2h = 1e8;        // 1e8 / 25e9 = 4 ms + 10 us
  b.host_read = 1e9;
  b.host_write = 2e8;  // 1.2e9 / 200e9 = 6 ms
  b.all_to_all = 4e8;  // 4e8 / 200e9 = 2 ms
  b.launches = 100;    // 100 x 5 us = 0.5 ms
  const ModelledStep m = model_step(test_profile(), b);
  EXPECT_NEAR(link_s(m, Link::kHbm), 5e-3, 1e-12);
  EXPECT_NEAR(link_s(m, Link::kPcieH2d), 2.01e-3, 1e-12);
  EXPECT_NEAR(link_s(m, Link::kPcieD2h), 4.01e-3, 1e-12);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 6e-3, 1e-12);
  EXPECT_NEAR(link_s(m, Link::kAllToAll), 2e-3, 1e-12);
  EXPECT_NEAR(m.launch_s, 0.5e-3, 1e-12);
  EXPECT_NEAR(m.step_s, 6.5e-3, 1e-12);                                    // max + launches
  EXPECT_NEAR(m.serial_s, (5 + 2.01 + 4.01 + 6 + 2 + 0.5) * 1e-3, 1e-12);  // sum + launches
  EXPECT_EQ(m.bottleneck, "host_dram");
  EXPECT_EQ(m.explanation, "host DRAM-bound: 1.2 GB per step at 200 GB/s = 6 ms of a 6.5 ms step (serial sum 19.5 ms)");
}

TEST(CostModel, HostRemoteBytesAndSharedHost) {
  StepBytes b;
  b.host_read = 1e9;
  b.host_remote = 4e8;  // local 6e8 / 200e9 = 3 ms; remote 4e8 / 40e9 = 10 ms
  ModelledStep m = model_step(test_profile(), b);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 13e-3, 1e-12);
  EXPECT_NEAR(m.links[static_cast<int>(Link::kHostDram)].gbs, 1e9 / 13e-3 / 1e9, 1e-9);
  ModelOptions o;
  o.ranks_per_host = 4;  // each rank gets a quarter of the host's bandwidth
  m = model_step(test_profile(), b, o);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 52e-3, 1e-12);
  // More remote bytes than host bytes are clamped to the host bytes.
  b.host_remote = 5e9;
  m = model_step(test_profile(), b);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 25e-3, 1e-12);  // 1e9 / 40e9
}

TEST(CostModel, LaunchBoundAndIdle) {
  StepBytes b;
  b.hbm_read = 1e9;   // 1 ms
  b.launches = 1000;  // 5 ms
  ModelledStep m = model_step(test_profile(), b);
  EXPECT_NEAR(m.step_s, 6e-3, 1e-12);
  EXPECT_EQ(m.bottleneck, "launch");
  EXPECT_EQ(m.explanation, "launch-bound: 1000 kernel launches at 5 us = 5 ms of a 6 ms step");

  m = model_step(test_profile(), StepBytes{});
  EXPECT_EQ(m.step_s, 0);
  EXPECT_EQ(m.serial_s, 0);
  EXPECT_EQ(m.bottleneck, "none");
  EXPECT_EQ(m.explanation, "idle: no bytes moved and no kernel launches");

  // Negative or non-finite counts count as zero.
  StepBytes neg;
  neg.h2d = -5;
  neg.d2h = std::nan("");
  m = model_step(test_profile(), neg);
  EXPECT_EQ(m.bottleneck, "none");
}

TEST(CostModel, LinkNames) {
  EXPECT_STREQ(link_name(Link::kHbm), "hbm");
  EXPECT_STREQ(link_name(Link::kPcieH2d), "pcie_h2d");
  EXPECT_STREQ(link_name(Link::kPcieD2h), "pcie_d2h");
  EXPECT_STREQ(link_name(Link::kHostDram), "host_dram");
  EXPECT_STREQ(link_name(Link::kAllToAll), "all_to_all");
  EXPECT_STREQ(link_label(Link::kAllToAll), "all-to-all");
}

// ---------------------------------------------------------------------------------------------
// Profiles

// test_profile() with gather rates on both nodes: 64 B rows at 100 M/s, 256 B rows at 50 M/s
// locally (a quarter of that remotely).
HardwareProfile gather_profile() {
  HardwareProfile p = test_profile();
  for (auto& node : p.numa_nodes) node.gather = {{64, n(100e6), n(25e6)}, {256, n(50e6), n(12.5e6)}};
  return p;
}

TEST(CostModel, GatherRatesInterpolated) {
  const HardwareProfile p = gather_profile();
  EXPECT_TRUE(has_gather_rates(p));
  EXPECT_FALSE(has_gather_rates(test_profile()));
  EXPECT_EQ(host_gather_rows_per_s(test_profile(), 64), 0.0);
  // Summed over the two nodes.
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 64), 200e6);
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 256), 100e6);
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 256, /*remote=*/true), 25e6);
  // Below the smallest size: the smallest size's rate.
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 8), 200e6);
  // Halfway (160 B): seconds per row halfway between 1/100e6 and 1/50e6 per node.
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 160), 2.0 / (0.5 / 100e6 + 0.5 / 50e6));
  // Beyond the largest: bandwidth-bound (twice the bytes, half the rows).
  EXPECT_DOUBLE_EQ(host_gather_rows_per_s(p, 512), 50e6);
}

TEST(CostModel, GathersCostTheirRateNotSequentialBandwidth) {
  StepBytes b;
  b.host_read = 64e6 * 64 + 1e9;  // 64 M rows of 64 B gathered, plus 1 GB read sequentially
  b.host_gathers = {{64e6, 64}};
  const ModelledStep m = model_step(gather_profile(), b);
  // 64e6 rows at 200 M rows/s = 0.32 s, plus 1 GB at 200 GB/s = 5 ms.
  EXPECT_NEAR(link_s(m, Link::kHostDram), 0.32 + 0.005, 1e-12);
  EXPECT_EQ(m.gather_model, "gather rates");
  EXPECT_NE(m.explanation.find("host gathers at the profile's random-row rates"), std::string::npos) << m.explanation;

  // The same bytes on a profile without rates: all at 200 GB/s, as before, and said so.
  const ModelledStep old = model_step(test_profile(), b);
  EXPECT_NEAR(link_s(old, Link::kHostDram), b.host_read / 200e9, 1e-12);
  EXPECT_EQ(old.gather_model, "sequential bandwidth");
  EXPECT_NE(old.explanation.find("priced at sequential bandwidth (the profile has no gather rates"), std::string::npos)
      << old.explanation;

  // No gathers listed: nothing changes, nothing said.
  StepBytes plain;
  plain.host_read = b.host_read;
  const ModelledStep p = model_step(gather_profile(), plain);
  EXPECT_EQ(link_s(p, Link::kHostDram), link_s(old, Link::kHostDram));
  EXPECT_EQ(p.gather_model, "");
  EXPECT_EQ(p.explanation.find("gathers"), std::string::npos);
}

TEST(CostModel, GathersRemoteShareAndSharedHost) {
  StepBytes b;
  b.host_read = 64e6 * 64;
  b.host_remote = b.host_read / 4;  // a quarter crosses nodes
  b.host_gathers = {{64e6, 64}};
  ModelOptions o;
  o.ranks_per_host = 2;
  const ModelledStep m = model_step(gather_profile(), b, o);
  // 48e6 rows at 100 M/s (200 / 2 ranks) + 16e6 rows at 25 M/s (50 / 2).
  EXPECT_NEAR(link_s(m, Link::kHostDram), 0.48 + 0.64, 1e-12);
}

// Issue 34: numa auto puts each rank's host tier on its GPU's node, and the model prices it there.
TEST(CostModel, HostOnTheGpusNodeAtThatNodesLocalRate) {
  StepBytes b;
  b.host_read = 1e9;
  b.host_remote = 4e8;  // spread: 6e8 at 200 GB/s + 4e8 at 40 GB/s = 13 ms
  ModelOptions o;
  o.host_on_gpu_node = true;  // one rank on GPU 0, node 0: every byte local at its 100 GB/s = 10 ms
  const ModelledStep m = model_step(test_profile(), b, o);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 10e-3, 1e-12);
  EXPECT_EQ(m.host_node, 0);
  EXPECT_EQ(m.host_pricing,
            "each rank's on its GPU's NUMA node (numa auto): node 0 for GPU 0 (100 GB/s local, shared by 1 rank) (the "
            "profile has no gpu_numa_nodes: GPUs assumed spread over the nodes in order)");
  EXPECT_EQ(m.explanation,
            "host DRAM-bound: 1 GB per step at 100 GB/s = 10 ms of a 10 ms step (serial sum 10 ms); "
            "host DRAM of node 0, the GPU's");
  const ModelledStep spread = model_step(test_profile(), b);
  EXPECT_NEAR(link_s(spread, Link::kHostDram), 13e-3, 1e-12);
  EXPECT_EQ(spread.host_node, -1);
  EXPECT_EQ(spread.host_pricing, "spread over the 2 NUMA nodes (200 GB/s local in all, shared by 1 rank)");
}

TEST(CostModel, RanksSharingAGpusNodeShareItsBandwidthAndTheSlowestNodePrices) {
  HardwareProfile p = test_profile();
  p.gpus = n(4);
  p.numa_nodes[1].local_gbs = n(50);
  StepBytes b;
  b.host_read = 1e9;
  ModelOptions o;
  o.ranks_per_host = 4;
  o.host_on_gpu_node = true;
  // GPUs 0, 1 on node 0 (100 / 2 = 50 GB/s each), GPUs 2, 3 on node 1 (50 / 2 = 25 GB/s): 40 ms.
  ModelledStep m = model_step(p, b, o);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 40e-3, 1e-12);
  EXPECT_EQ(m.host_node, 1);
  EXPECT_NE(m.host_pricing.find("node 0 for GPUs 0-1 (100 GB/s local, shared by 2 ranks), node 1 for GPUs 2-3 (50 "
                                "GB/s local, shared by 2 ranks)"),
            std::string::npos)
      << m.host_pricing;
  EXPECT_NE(m.host_pricing.find("; node 1's ranks are the slowest and price the step"), std::string::npos);
  // The profile's own placement: three GPUs on node 0 (100 / 3 GB/s each, 30 ms), one on node 1 (20 ms).
  p.gpu_numa_nodes = {{0, 1, 0, 0}, "test placement"};
  m = model_step(p, b, o);
  EXPECT_NEAR(link_s(m, Link::kHostDram), 30e-3, 1e-12);
  EXPECT_EQ(m.host_node, 0);
  EXPECT_EQ(m.host_pricing,
            "each rank's on its GPU's NUMA node (numa auto): node 0 for GPUs 0, 2-3 (100 GB/s local, shared by 3 "
            "ranks), node 1 for GPU 1 (50 GB/s local, shared by 1 rank); node 0's ranks are the slowest and price the "
            "step");
  // Two ranks of the four GPUs: GPUs 0 and 1, on nodes 0 and 1 here.
  o.ranks_per_host = 2;
  EXPECT_NEAR(link_s(model_step(p, b, o), Link::kHostDram), 20e-3, 1e-12);
}

TEST(CostModel, GpuNodeOfEachGpuAndModelOptions) {
  HardwareProfile p = test_profile();
  p.gpus = n(8);
  std::vector<int> nodes;
  for (int g = 0; g < 8; ++g) nodes.push_back(gpu_numa_node(p, g));
  EXPECT_EQ(nodes, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  p.gpus = n(3);
  EXPECT_EQ(gpu_numa_node(p, 2), 1);
  EXPECT_EQ(gpu_numa_node(p, 1), 0);
  p.gpu_numa_nodes = {{1, 1, 0}, "test"};
  EXPECT_EQ(gpu_numa_node(p, 0), 1);
  EXPECT_EQ(gpu_numa_node(p, 2), 0);

  ModelOptions o = model_options(p, 8, NumaPolicy::kAuto, true);
  EXPECT_EQ(o.ranks_per_host, 3);
  EXPECT_TRUE(o.host_on_gpu_node);
  EXPECT_FALSE(model_options(p, 2, NumaPolicy::kAuto, false).host_on_gpu_node);  // no device: interleaved
  EXPECT_FALSE(model_options(p, 2, NumaPolicy::kInterleave, true).host_on_gpu_node);
  EXPECT_FALSE(model_options(p, 2, NumaPolicy::kBind, true).host_on_gpu_node);
  EXPECT_EQ(model_options(p, 2, NumaPolicy::kBind, true).ranks_per_host, 2);
}

TEST(CostModel, GathersOnTheGpusNodeAtItsLocalRate) {
  HardwareProfile p = gather_profile();
  p.gpus = n(2);
  StepBytes b;
  b.host_read = 64e6 * 64;
  b.host_remote = b.host_read / 4;  // no part crosses nodes on the GPU's node
  b.host_gathers = {{64e6, 64}};
  ModelOptions o;
  o.ranks_per_host = 2;
  o.host_on_gpu_node = true;
  // GPU 0 on node 0, GPU 1 on node 1: 64e6 rows at node 0's 100 M/s each.
  EXPECT_NEAR(link_s(model_step(p, b, o), Link::kHostDram), 0.64, 1e-12);
  EXPECT_DOUBLE_EQ(node_gather_rows_per_s(p, 1, 256, true), 12.5e6);
  EXPECT_EQ(node_gather_rows_per_s(p, 2, 256), 0.0);
}

const char* const kShipped[] = {"h200-pcie5", "a100-pcie4", "dgx-a100", "dgx-h100"};

TEST(HardwareProfile, ShippedProfilesLoad) {
  for (const char* name : kShipped) {
    const std::string path = std::string(STRATA_SOURCE_DIR) + "/bench/profiles/" + name + ".json";
    auto p = load_hardware_profile(path);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->name, name);
    EXPECT_FALSE(p->description.empty());
    EXPECT_TRUE(validate(*p).is_ok());
    for (const ProfileNumber* x : {&p->gpus, &p->hbm_gbs, &p->pcie_h2d_gbs, &p->pcie_d2h_gbs, &p->pcie_latency_us,
                                   &p->all_to_all_gbs, &p->kernel_launch_us, &p->hbm_capacity_gb, &p->host_memory_gb})
      EXPECT_GE(x->source.size(), 20u) << name << ": a source should say where the number comes from";
    // The HBM link must be faster than PCIe in every profile (a sanity check of the numbers).
    EXPECT_GT(p->hbm_gbs.value, 10 * p->pcie_h2d_gbs.value) << name;
    // Round trip through the writer.
    auto again = parse_hardware_profile(hardware_profile_to_json(*p), "<roundtrip>");
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_EQ(hardware_profile_to_json(*again), hardware_profile_to_json(*p));
  }
}

TEST(HardwareProfile, ExampleExplanationOnH200) {
  auto p = load_hardware_profile(std::string(STRATA_SOURCE_DIR) + "/bench/profiles/h200-pcie5.json");
  ASSERT_TRUE(p.is_ok());
  StepBytes b;
  b.h2d = 3.1e9;
  b.hbm_read = 3.1e9;
  const ModelledStep m = model_step(*p, b);
  EXPECT_EQ(m.bottleneck, "pcie_h2d");
  EXPECT_EQ(m.explanation.rfind("PCIe H2D-bound: 3.1 GB per step at 55 GB/s", 0), 0u) << m.explanation;
}

std::string valid_json() { return hardware_profile_to_json(test_profile()); }

std::string error_of(const json& j) {
  auto p = parse_hardware_profile(j.dump(), "my.json");
  EXPECT_FALSE(p.is_ok()) << j.dump();
  if (p.is_ok()) return "";
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  return p.status().message();
}

TEST(HardwareProfile, ParseErrors) {
  ASSERT_TRUE(parse_hardware_profile(valid_json(), "my.json").is_ok());
  const json good = json::parse(valid_json());

  json j = good;
  j["hbm_bw"] = j["hbm_gbs"];
  EXPECT_EQ(
      error_of(j).rfind("profile 'my.json': unknown field 'hbm_bw' (expected name, description, numa_nodes, gpus, "
                        "hbm_gbs,",
                        0),
      0u);

  j = good;
  j["hbm_gbs"]["units"] = "GB/s";
  EXPECT_EQ(error_of(j), "profile 'my.json': hbm_gbs: unknown field 'units' (expected value, source)");

  j = good;
  j["numa_nodes"][1]["local"] = 3;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': numa_nodes[1]: unknown field 'local' (expected local_gbs, remote_gbs, gather)");

  j = good;
  j.erase("pcie_d2h_gbs");
  EXPECT_EQ(error_of(j), "profile 'my.json': missing field 'pcie_d2h_gbs'");

  j = good;
  j["numa_nodes"][0].erase("remote_gbs");
  EXPECT_EQ(error_of(j), "profile 'my.json': numa_nodes[0]: missing field 'remote_gbs'");

  j = good;
  j["hbm_gbs"].erase("source");
  EXPECT_EQ(error_of(j), "profile 'my.json': hbm_gbs: missing field 'source'");

  j = good;
  j["hbm_gbs"]["value"] = "fast";
  EXPECT_EQ(error_of(j), "profile 'my.json': hbm_gbs.value must be a number (got string \"fast\")");

  j = good;
  j["hbm_gbs"] = 4800;
  EXPECT_NE(error_of(j).find("hbm_gbs must be an object {\"value\": number, \"source\": string}"), std::string::npos);

  j = good;
  j["pcie_h2d_gbs"]["value"] = -1;
  EXPECT_EQ(error_of(j), "profile 'my.json': pcie_h2d_gbs = -1 (expected a finite number > 0)");

  j = good;
  j["pcie_latency_us"]["value"] = 0;  // a zero latency is allowed
  EXPECT_TRUE(parse_hardware_profile(j.dump(), "my.json").is_ok());

  j = good;
  j["host_memory_gb"]["source"] = "";
  EXPECT_EQ(error_of(j), "profile 'my.json': host_memory_gb: empty source (expected where the number comes from)");

  j = good;
  j["gpus"]["value"] = 1.5;
  EXPECT_EQ(error_of(j), "profile 'my.json': gpus = 1.5 (expected an integer >= 1)");

  j = good;
  j["numa_nodes"] = json::array();
  EXPECT_EQ(error_of(j), "profile 'my.json': numa_nodes is empty (expected at least one node)");

  j = good;
  j["name"] = "";
  EXPECT_EQ(error_of(j), "profile 'my.json': empty name (expected a short id like h200-pcie5)");

  EXPECT_NE(parse_hardware_profile("{\"name\": ", "my.json").status().message().find("profile 'my.json': invalid JSON"),
            std::string::npos);
  EXPECT_EQ(parse_hardware_profile("[1]", "my.json").status().message(),
            "profile 'my.json': expected a JSON object, got array");
  EXPECT_EQ(load_hardware_profile("/nonexistent/p.json").status().code(), StatusCode::kNotFound);
}

// Issue 16: a value is quoted by a short prefix, and a deeply nested one is not dumped (the dump
// recursed once per level and overflowed the stack).
TEST(HardwareProfile, ErrorsQuoteOnlyAShortScalar) {
  json j = json::parse(valid_json());
  j["hbm_gbs"]["value"] = "@@";
  const std::string text = j.dump();
  const auto with_value = [&](const std::string& value) {
    return std::string(text).replace(text.find("\"@@\""), 4, value);
  };
  auto r = parse_hardware_profile(with_value(std::string(100000, '[') + std::string(100000, ']')), "my.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "profile 'my.json': hbm_gbs.value must be a number (got array)");
  r = parse_hardware_profile(with_value("\"" + std::string(100000, 'x') + "\""), "my.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "profile 'my.json': hbm_gbs.value must be a number (got string \"" + std::string(60, 'x') + "...)");
}

TEST(HardwareProfile, GpuNumaNodesParseValidateAndRoundTrip) {
  HardwareProfile p = test_profile();
  p.gpus = n(4);
  p.gpu_numa_nodes = {{0, 0, 1, 1}, "hwloc on the test machine"};
  const std::string text = hardware_profile_to_json(p);
  auto back = parse_hardware_profile(text, "g.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->gpu_numa_nodes.value, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(hardware_profile_to_json(*back), text);
  // Optional: a profile without it does not write it.
  EXPECT_EQ(hardware_profile_to_json(test_profile()).find("gpu_numa_nodes"), std::string::npos);

  const json good = json::parse(text);
  json j = good;
  j["gpu_numa_nodes"]["value"] = json::array({0, 0, 1});
  EXPECT_EQ(error_of(j), "profile 'my.json': gpu_numa_nodes lists 3 nodes (expected one per GPU: gpus = 4)");
  j = good;
  j["gpu_numa_nodes"]["value"][2] = 2;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': gpu_numa_nodes.value[2] = 2 (expected a node in [0, 2): the profile has 2 numa_nodes)");
  j = good;
  j["gpu_numa_nodes"]["value"][3] = -1;
  EXPECT_EQ(
      error_of(j),
      "profile 'my.json': gpu_numa_nodes.value[3] = -1 (expected a node in [0, 2): the profile has 2 numa_nodes)");
  j = good;
  j["gpu_numa_nodes"]["value"][0] = "zero";
  EXPECT_EQ(error_of(j), "profile 'my.json': gpu_numa_nodes.value[0] must be a node index (got string \"zero\")");
  j = good;
  j["gpu_numa_nodes"]["value"] = json::array();
  EXPECT_NE(error_of(j).find("gpu_numa_nodes.value is empty"), std::string::npos);
  j = good;
  j["gpu_numa_nodes"].erase("source");
  EXPECT_EQ(error_of(j), "profile 'my.json': gpu_numa_nodes: missing field 'source'");
  j = good;
  j["gpu_numa_nodes"] = json::array({0, 0, 1, 1});
  EXPECT_NE(error_of(j).find("gpu_numa_nodes must be an object"), std::string::npos);
}

TEST(HardwareProfile, ValidateNamesTheField) {
  HardwareProfile p = test_profile();
  p.hbm_gbs.value = std::nan("");
  EXPECT_EQ(validate(p).message(), "profile 'test': hbm_gbs = nan (expected a finite number > 0)");
  p = test_profile();
  p.numa_nodes[1].remote_gbs.value = 0;
  EXPECT_EQ(validate(p).message(), "profile 'test': numa_nodes[1].remote_gbs = 0 (expected a finite number > 0)");
}

// ---- host table memory (issue 16: small tables cost a 2 MiB arena each, and the estimate missed it) ----

TableConfig table(const std::string& name, std::int64_t rows, int dim, Placement placement) {
  TableConfig tc;
  tc.spec.name = name;
  tc.spec.rows = rows;
  tc.spec.dim = dim;
  tc.spec.optimizer.kind = OptimizerKind::kRowwiseAdagrad;
  tc.placement = placement;
  return tc;
}

// What Store::open maps for its host tables equals the model, for every placement and NUMA setting.
TEST(HostTableMemory, EqualsWhatTheStoreMaps) {
  std::mt19937_64 rng(3);
  const Placement placements[] = {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu,
                                  Placement::kHybrid};
  for (int round = 0; round < 6; ++round) {
    StoreConfig c;
    c.threads = 1;
    c.fake_numa_nodes = 1 + round % 3;
    c.numa = round % 2 ? NumaPolicy::kBind : NumaPolicy::kInterleave;
    c.numa_node = c.numa == NumaPolicy::kBind ? c.fake_numa_nodes - 1 : 0;  // numa_node is bind's alone
    c.device.backend = BackendChoice::kEmu;
    for (int t = 0; t < 60; ++t) {
      // Mostly tiny tables, some around the 1 MiB threshold (4096 rows of 256 bytes), a few large.
      const std::uint64_t kind = rng() % 10;
      const std::int64_t rows = kind < 7   ? 1 + static_cast<std::int64_t>(rng() % 300)
                                : kind < 9 ? 3500 + static_cast<std::int64_t>(rng() % 1500)
                                           : 9000 + static_cast<std::int64_t>(rng() % 9000);
      c.tables.push_back(table("t" + std::to_string(t), rows, 63, placements[rng() % 5]));
    }
    ASSERT_TRUE(validate(c).is_ok());
    auto model = host_table_memory(c, 0);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const std::size_t before = NumaArena::live_mapped_bytes();
    auto store = Store::open(c);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    EXPECT_EQ(static_cast<double>(NumaArena::live_mapped_bytes() - before), model->mapped_bytes) << "round " << round;
    EXPECT_GT(model->packed_tables, 0);
    EXPECT_LE(model->record_bytes, model->mapped_bytes);
  }
}

// Half-size rows (issue 31): a host table's records take the words of their elements, a bf16 row
// of dim 64 two elements to a word, beside the one fp32 word of rowwise adagrad's state, rounded up
// to 16 bytes (core/record_layout.hpp's rule for records holding half-size elements): 32 + 1 words,
// 36 words of 4 bytes; fp32 rows take 64 + 1 words rounded up to 64 bytes, 80 words. The model says
// so, and the store maps what the model says.
TEST(HostTableMemory, HalfRowsTakeHalfSizeRecordsAndTheStoreMapsThem) {
  constexpr std::int64_t kRows = 20000;  // above 1 MiB: an arena of its own, rounded up to 2 MiB
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(to_string(dtype));
    StoreConfig c;
    c.threads = 1;
    c.fake_numa_nodes = 1;
    TableConfig tc = table("t", kRows, 64, Placement::kCpu);
    tc.spec.dtype = dtype;
    c.tables.push_back(tc);
    const double record = dtype == DType::kF32 ? 80 * 4 : 36 * 4;
    auto model = host_table_memory(c, 0);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    EXPECT_EQ(model->record_bytes, kRows * record);
    EXPECT_EQ(model->mapped_bytes, std::ceil(kRows * record / (2 << 20)) * (2 << 20));
    const std::size_t before = NumaArena::live_mapped_bytes();
    auto store = Store::open(c);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    EXPECT_EQ(static_cast<double>(NumaArena::live_mapped_bytes() - before), model->mapped_bytes);
  }
}

// Over a world of thread ranks: each rank's hybrid shards (and none of the gpu ones) add up to what
// the ranks' stores map.
TEST(HostTableMemory, ShardsOfAWorld) {
  for (const int world : {2, 3}) {
    StoreConfig c;
    c.threads = 1;
    c.fake_numa_nodes = 2;
    c.device.backend = BackendChoice::kEmu;
    c.tables.push_back(table("rows", 20000, 63, Placement::kHybrid));  // 5 MB: own arenas per shard
    c.tables.push_back(table("small", 100, 63, Placement::kHybrid));
    c.tables.push_back(table("dev", 1000, 63, Placement::kGpu));
    c.tables.push_back(table("cols", 3000, 64, Placement::kHybrid));
    c.tables[1].sharding.type = dispatch::ShardingType::kReplicated;
    c.tables[2].sharding.type = dispatch::ShardingType::kColumn;
    c.tables[2].spec.optimizer.kind = OptimizerKind::kSgd;  // column sharding needs a per-element state
    c.tables[3].sharding.type = dispatch::ShardingType::kColumn;
    c.tables[3].spec.optimizer.kind = OptimizerKind::kAdagrad;
    double model = 0;
    for (int r = 0; r < world; ++r) {
      auto m = host_table_memory(c, 0, world, r);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      model += m->mapped_bytes;
    }
    const std::size_t before = NumaArena::live_mapped_bytes();
    dispatch::CommOptions co;
    co.timeout = std::chrono::milliseconds(20000);
    auto group = dispatch::make_local_group(world, co);
    ASSERT_TRUE(group.is_ok());
    std::vector<std::unique_ptr<Store>> stores(static_cast<std::size_t>(world));
    std::vector<Status> status(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        auto s = Store::open(
            c, std::shared_ptr<dispatch::Communicator>(std::move(group.value()[static_cast<std::size_t>(r)])));
        if (s)
          stores[static_cast<std::size_t>(r)] = std::move(s).value();
        else
          status[static_cast<std::size_t>(r)] = s.status();
      });
    for (auto& t : threads) t.join();
    for (const auto& s : status) ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(static_cast<double>(NumaArena::live_mapped_bytes() - before), model) << "world " << world;
    // Closing is collective for sharded stores: close them all at once.
    threads.clear();
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { stores[static_cast<std::size_t>(r)].reset(); });
    for (auto& t : threads) t.join();
  }
}

// The counts the estimate is made of: 1,000 one-row tables are one shared arena, not 1,000.
TEST(HostTableMemory, ManySmallTablesAreOneSharedArena) {
  StoreConfig c;
  c.fake_numa_nodes = 1;
  c.threads = 2;
  for (int t = 0; t < 1000; ++t) c.tables.push_back(table("t" + std::to_string(t), 1, 64, Placement::kCpu));
  auto m = host_table_memory(c, 0);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->tables, 1000);
  // One find_repeats map entry per thread and table, and the cpu engine's shared pass (HostBatch)
  // one per thread and row of its small tables: 1,000 rows.
  EXPECT_EQ(m->scratch_bytes, 1000 * 2 * 8.0 + 2 * 8.0 * 1000);
  EXPECT_EQ(m->packed_tables, 1000);
  EXPECT_EQ(m->record_bytes, 1000 * 80 * 4.0);  // 64 weights + 1 rowwise state, padded to 80 floats
  EXPECT_EQ(m->mapped_bytes, 2.0 * 1024 * 1024);
  // Tables just over the threshold each take an arena of their own: 2 MiB for 1.06 MB of rows.
  c.tables.clear();
  for (int t = 0; t < 10; ++t) c.tables.push_back(table("t" + std::to_string(t), 3300, 64, Placement::kCpu));
  m = host_table_memory(c, 0);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->packed_tables, 0);
  EXPECT_EQ(m->mapped_bytes, 10 * 2.0 * 1024 * 1024);
}

// A profile's L2 sizes the CPU optimizer's scratch of the machine it describes, not of the machine that
// plans (docs/tune.md's example printed other host figures on a machine with another L2).
TEST(HostTableMemory, ScratchFollowsTheGivenL2NotThisMachines) {
  StoreConfig c;
  c.fake_numa_nodes = 1;
  c.threads = 2;
  c.tables.push_back(table("big", 1 << 24, 16, Placement::kCpu));
  const auto at = [&](std::uint64_t l2) { return host_table_memory(c, 0, 0, 0, l2).value().scratch_bytes; };
  EXPECT_EQ(at(256 << 10), 2 * 8.0 * static_cast<double>(find_repeats_map_entries(1 << 24, 256 << 10)));
  EXPECT_EQ(at(4 << 20), 2 * 8.0 * static_cast<double>(find_repeats_map_entries(1 << 24, 4 << 20)));
  EXPECT_NE(at(256 << 10), at(4 << 20));
  EXPECT_EQ(at(0), at(Topology::l2_cache_bytes()));
}

TEST(HardwareProfile, L2CacheBytesParseValidateAndRoundTrip) {
  HardwareProfile p = test_profile();
  p.l2_cache_bytes = n(2 << 20);
  const std::string text = hardware_profile_to_json(p);
  auto back = parse_hardware_profile(text, "l2.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->l2_cache_bytes.value, 2 << 20);
  EXPECT_EQ(hardware_profile_to_json(*back), text);
  // Optional: a profile without it does not write it, and plans with this machine's L2.
  EXPECT_EQ(hardware_profile_to_json(test_profile()).find("l2_cache_bytes"), std::string::npos);
  const json good = json::parse(text);
  json j = good;
  j["l2_cache_bytes"]["value"] = 1.5;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': l2_cache_bytes = 1.5 (expected a whole number of bytes in [1, 2^40], or leave it out)");
  j["l2_cache_bytes"]["value"] = -1;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': l2_cache_bytes = -1 (expected a whole number of bytes in [1, 2^40], or leave it out)");
}

TEST(HardwareProfile, GatherRatesParseAndRoundTrip) {
  const std::string text = hardware_profile_to_json(gather_profile());
  auto p = parse_hardware_profile(text, "g.json");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->numa_nodes[1].gather.size(), 2u);
  EXPECT_EQ(p->numa_nodes[1].gather[1].row_bytes, 256);
  EXPECT_EQ(p->numa_nodes[1].gather[1].remote_rows_per_s.value, 12.5e6);
  EXPECT_EQ(hardware_profile_to_json(*p), text);

  const json good = json::parse(text);
  json j = good;
  j["numa_nodes"][0]["gather"][1]["row_bytes"] = 64;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': numa_nodes[0].gather[1].row_bytes = 64 (expected > the previous entry's 64)");
  j = good;
  j["numa_nodes"][0]["gather"][0]["local_rows_per_s"]["value"] = "fast";
  EXPECT_EQ(error_of(j),
            "profile 'my.json': numa_nodes[0].gather[0].local_rows_per_s.value must be a number (got string \"fast\")");
  j = good;
  j["numa_nodes"][0]["gather"][0].erase("remote_rows_per_s");
  EXPECT_EQ(error_of(j), "profile 'my.json': numa_nodes[0].gather[0]: missing field 'remote_rows_per_s'");
  j = good;
  j["numa_nodes"][0]["gather"][0]["row_bytes"] = 64.5;
  EXPECT_EQ(error_of(j), "profile 'my.json': numa_nodes[0].gather[0].row_bytes must be an integer (got number 64.5)");
  j = good;
  j["numa_nodes"][1].erase("gather");
  EXPECT_EQ(
      error_of(j),
      "profile 'my.json': numa_nodes[1].gather: row sizes differ from numa_nodes[0]'s (expected the same row_bytes "
      "on every node, or no gather rates on any)");
  j = good;
  j["numa_nodes"][0]["gather"][0]["remote_rows_per_s"]["value"] = 0;
  EXPECT_EQ(error_of(j),
            "profile 'my.json': numa_nodes[0].gather[0].remote_rows_per_s = 0 (expected a finite number > 0)");
}

}  // namespace
}  // namespace strata
