// The device ordinal of a store config: its JSON forms ("auto", "current", -1, >= 0), what bad
// input says, and which GPU each form stands for on a rank (store/detail/open_device.hpp), with
// the number of visible GPUs given, so that it runs without a GPU.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "gpu/current_device.hpp"
#include "store/detail/open_device.hpp"
#include "store/store.hpp"
#include "store/store_config.hpp"

namespace strata {
namespace {

std::string with_device(const std::string& device) {
  return R"({"device": )" + device + R"(, "tables": [{"name": "t", "rows": 10, "dim": 4}]})";
}

int parsed_ordinal(const std::string& device) {
  auto c = parse_store_config(with_device(device));
  EXPECT_TRUE(c.is_ok()) << device << ": " << c.status().to_string();
  return c.is_ok() ? c.value().device.ordinal : -100;
}

TEST(DeviceOrdinalConfig, EveryFormParses) {
  EXPECT_EQ(parse_store_config(with_device("{}")).value().device.ordinal, kDeviceOrdinalAuto) << "the default";
  EXPECT_EQ(StoreConfig{}.device.ordinal, kDeviceOrdinalAuto);
  EXPECT_EQ(parsed_ordinal(R"({"ordinal": "auto"})"), kDeviceOrdinalAuto);
  EXPECT_EQ(parsed_ordinal(R"({"ordinal": "current"})"), kDeviceOrdinalCurrent);
  EXPECT_EQ(parsed_ordinal(R"({"ordinal": -1})"), kDeviceOrdinalCurrent);
  EXPECT_EQ(parsed_ordinal(R"({"ordinal": 0})"), 0) << "an explicit 0 keeps pinning GPU 0";
  EXPECT_EQ(parsed_ordinal(R"({"ordinal": 3})"), 3);
}

TEST(DeviceOrdinalConfig, BadInputNamesTheFieldAndTheValue) {
  for (const char* bad : {R"("curent")", R"("0")", "-2", "-7", "1.5", "true", "null", "[0]", "2147483648"}) {
    auto c = parse_store_config(with_device(std::string(R"({"ordinal": )") + bad + "}"));
    ASSERT_FALSE(c.is_ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    const std::string& m = c.status().message();
    EXPECT_NE(m.find("device.ordinal"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("got ") + bad), std::string::npos) << m;
    EXPECT_NE(m.find(R"("auto", "current")"), std::string::npos) << m;
  }
  // In C++, below kDeviceOrdinalAuto.
  StoreConfig c;
  c.tables.push_back({{"t", 10, 4}});
  c.device.ordinal = -3;
  const Status st = validate(c);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("device ordinal -3"), std::string::npos) << st.to_string();
  // Nothing opens: Store::open refuses it before any table or device exists.
  auto store = Store::open(c);
  ASSERT_FALSE(store.is_ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceOrdinalConfig, RoundTripsThroughJson) {
  for (int ordinal : {kDeviceOrdinalAuto, kDeviceOrdinalCurrent, 0, 5}) {
    StoreConfig c;
    c.tables.push_back({{"t", 10, 4}});
    c.device.ordinal = ordinal;
    const std::string json = to_json(c);
    auto back = parse_store_config(json);
    ASSERT_TRUE(back.is_ok()) << json << ": " << back.status().to_string();
    EXPECT_EQ(back.value().device.ordinal, ordinal) << json;
  }
  StoreConfig c;
  c.tables.push_back({{"t", 10, 4}});
  EXPECT_NE(to_json(c).find(R"("ordinal": "auto")"), std::string::npos) << to_json(c);
  c.device.ordinal = kDeviceOrdinalCurrent;
  EXPECT_NE(to_json(c).find(R"("ordinal": "current")"), std::string::npos) << to_json(c);
}

DeviceConfig ordinal(int o) {
  DeviceConfig d;
  d.backend = BackendChoice::kCuda;
  d.ordinal = o;
  return d;
}

TEST(DeviceOrdinalChoice, OneRank) {
  EXPECT_EQ(detail::cuda_ordinal(ordinal(kDeviceOrdinalAuto), nullptr, 4).value(), 0);
  EXPECT_EQ(detail::cuda_ordinal(ordinal(3), nullptr, 4).value(), 3);
  auto hidden = detail::cuda_ordinal(ordinal(4), nullptr, 4);
  ASSERT_FALSE(hidden.is_ok());
  EXPECT_EQ(hidden.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(hidden.status().message().find("device.ordinal 4"), std::string::npos) << hidden.status().to_string();
  EXPECT_NE(hidden.status().message().find("4 CUDA GPU(s) visible"), std::string::npos);
}

TEST(DeviceOrdinalChoice, EachRankOfAWorldGetsTheGpuOfItsLocalRankUnlessPinned) {
  auto group = dispatch::make_local_group(4);
  ASSERT_TRUE(group.is_ok());
  std::vector<int> autos, pinned;
  for (const auto& comm : group.value()) {
    EXPECT_EQ(comm->local_rank(), comm->rank()) << "thread ranks share one process";
    EXPECT_EQ(comm->device(), -1) << "the local communicator works in host memory";
    autos.push_back(detail::cuda_ordinal(ordinal(kDeviceOrdinalAuto), comm.get(), 2).value());
    pinned.push_back(detail::cuda_ordinal(ordinal(1), comm.get(), 2).value());
  }
  EXPECT_EQ(autos, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(pinned, (std::vector<int>{1, 1, 1, 1}));
}

TEST(DeviceOrdinalChoice, CurrentIsTheCallingThreadsCurrentDevice) {
  auto chosen = detail::cuda_ordinal(ordinal(kDeviceOrdinalCurrent), nullptr, 1);
  auto current = gpu::cuda_current_device();
  ASSERT_EQ(chosen.is_ok(), current.is_ok()) << chosen.status().to_string() << " / " << current.status().to_string();
  if (current.is_ok()) {
    EXPECT_EQ(chosen.value(), current.value());
  } else {
    // No CUDA here: the error says which setting needed it.
    EXPECT_NE(chosen.status().message().find(R"(device.ordinal "current")"), std::string::npos)
        << chosen.status().to_string();
  }
}

}  // namespace
}  // namespace strata
