// The cost model (store/cost_model.hpp) against hand-computed cases, and the shipped profiles.

#include "store/cost_model.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

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
  p.numa_nodes = {{n(100), n(20)}, {n(100), n(20)}};  // 200 GB/s local, 40 GB/s remote in all
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
  EXPECT_EQ(error_of(j), "profile 'my.json': numa_nodes[1]: unknown field 'local' (expected local_gbs, remote_gbs)");

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

TEST(HardwareProfile, ValidateNamesTheField) {
  HardwareProfile p = test_profile();
  p.hbm_gbs.value = std::nan("");
  EXPECT_EQ(validate(p).message(), "profile 'test': hbm_gbs = nan (expected a finite number > 0)");
  p = test_profile();
  p.numa_nodes[1].remote_gbs.value = 0;
  EXPECT_EQ(validate(p).message(), "profile 'test': numa_nodes[1].remote_gbs = 0 (expected a finite number > 0)");
}

}  // namespace
}  // namespace strata
