// Runs the built strata-devbench (STRATA_DEVBENCH_BIN) on the emulated device with tiny sizes: the
// JSON holds every figure the GPU targets need, with the byte counts the bandwidths are made of;
// and bad input fails with a message naming the flag and the value, before any timing.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <string>

#include "tests/bench/run_program.hpp"

namespace {

using nlohmann::json;
using strata::testing::RunOutput;

constexpr const char* kTiny = "--copy-mib 4 --slots 4096 --bags 64 --pooling 4 --fill-rows 16,100 --reps 2 --iters 2";

RunOutput run_devbench(const std::string& args) {
  return strata::testing::run_program(std::string(STRATA_DEVBENCH_BIN) + " --no-progress " + args);
}

TEST(DevbenchCli, EmuRunWritesEveryTargetFigure) {
  const std::string path = ::testing::TempDir() + "/devbench_" + std::to_string(::getpid()) + ".json";
  const RunOutput r = run_devbench(std::string("--backend emu ") + kTiny + " --dim 16 --state-dim 16 --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("of D2D (target 70%)"), std::string::npos) << r.output;
  const json j = json::parse(strata::testing::read_file(path));
  EXPECT_EQ(j["device"]["backend"], "emu");
  for (const char* k : {"d2d_hbm_gbs", "h2d_gbs", "d2h_gbs"}) EXPECT_GT(j["copies"][k].get<double>(), 0) << k;
  const json& g = j["gather_pool"];
  EXPECT_EQ(g["rows_read_bytes"].get<double>(), 64.0 * 4 * 16 * 4);  // bags x pooling x dim x 4 bytes
  EXPECT_EQ(g["out_written_bytes"].get<double>(), 64.0 * 16 * 4);
  EXPECT_GT(g["hbm_gbs"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(g["fraction_of_d2d"].get<double>(),
                   g["hbm_gbs"].get<double>() / j["copies"]["d2d_hbm_gbs"].get<double>());
  ASSERT_EQ(j["fill_upload"].size(), 2u);
  const std::int64_t rows[] = {16, 100};
  for (std::size_t i = 0; i < 2; ++i) {
    const json& f = j["fill_upload"][i];
    EXPECT_EQ(f["rows"].get<std::int64_t>(), rows[i]);
    EXPECT_EQ(f["bytes"].get<std::int64_t>(), rows[i] * (32 * 4 + 8));  // record of dim 16 + state 16, and its slot id
    EXPECT_GT(f["gbs"].get<double>(), 0);
    EXPECT_GT(f["same_size_h2d_gbs"].get<double>(), 0);
  }
  EXPECT_EQ(j["targets"]["gather_pool_fraction_of_d2d"]["target"].get<double>(), 0.70);
  EXPECT_EQ(j["targets"]["fill_upload_fraction_of_h2d_worst"]["target"].get<double>(), 0.85);
  // The gather sweep: every dim x keys per bag, the same number of keys each.
  ASSERT_EQ(j["gather_sweep"].size(), 4u * 2u);
  for (const json& x : j["gather_sweep"]) {
    EXPECT_EQ(x["bags"].get<std::int64_t>() * x["keys_per_bag"].get<std::int64_t>(), 64 * 4);
    EXPECT_GT(x["hbm_gbs"].get<double>(), 0);
    EXPECT_GE(x["issue_s"].get<double>(), 0);
  }
  EXPECT_EQ(j["targets"]["gather_dim128_fraction_of_d2d"]["target"].get<double>(), 0.70);
  EXPECT_EQ(j["targets"]["gather_dim32_fraction_of_d2d"]["target"].get<double>(), 0.50);
  // The backward: zipf keys make hot rows (256 keys over 4096 rows: the hottest is used far more
  // than any uniform one), and the ratio is the one the target reads.
  const json& bw = j["backward"];
  EXPECT_GT(bw["zipf"]["most_uses"].get<std::int64_t>(), bw["uniform"]["most_uses"].get<std::int64_t>());
  EXPECT_DOUBLE_EQ(bw["zipf_over_uniform"].get<double>(),
                   bw["zipf"]["s"].get<double>() / bw["uniform"]["s"].get<double>());
  EXPECT_EQ(j["targets"]["backward_zipf_over_uniform"]["target"].get<double>(), 2.0);
  EXPECT_NE(j["command"].get<std::string>().find("--backend emu"), std::string::npos);
  ::unlink(path.c_str());
}

TEST(DevbenchCli, BadInputNamesTheFlagAndTheValue) {
  RunOutput r = run_devbench(std::string("--backend emu ") + kTiny + " --fill-rows 16,0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--fill-rows: 0"), std::string::npos) << r.output;
  r = run_devbench("--backend emu --copy-mib 4 --slots 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--slots: 0 (expected >= 1)"), std::string::npos) << r.output;
  r = run_devbench(std::string("--backend tpu ") + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("tpu"), std::string::npos) << r.output;
}

TEST(DevbenchCli, CudaWithoutAGpuSaysSo) {
  const RunOutput r = run_devbench(std::string("--backend cuda ") + kTiny);
  if (r.exit_code == 0) GTEST_SKIP() << "a CUDA device is visible: the run itself is the check";
  EXPECT_NE(r.output.find("cuda"), std::string::npos) << r.output;
}

}  // namespace
