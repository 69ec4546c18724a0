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

// The table of with_device's configs, every other field its default.
TableConfig table_t() {
  TableConfig t;
  t.spec.name = "t";
  t.spec.rows = 10;
  t.spec.dim = 4;
  return t;
}

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
  c.tables.push_back(table_t());
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
    c.tables.push_back(table_t());
    c.device.ordinal = ordinal;
    const std::string json = to_json(c);
    auto back = parse_store_config(json);
    ASSERT_TRUE(back.is_ok()) << json << ": " << back.status().to_string();
    EXPECT_EQ(back.value().device.ordinal, ordinal) << json;
  }
  StoreConfig c;
  c.tables.push_back(table_t());
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

// A rank whose communicator runs on a GPU (as nccl does), with no transport: cuda_ordinal only
// asks it for its rank, kind, local rank and device.
class GpuRank final : public dispatch::Communicator {
 public:
  GpuRank(int rank, int local_rank, int device) : rank_(rank), local_rank_(local_rank), device_(device) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return 8; }
  const char* kind() const noexcept override { return "nccl"; }
  int local_rank() const noexcept override { return local_rank_; }
  int device() const noexcept override { return device_; }
  Status all_reduce(void*, std::int64_t, dispatch::DataType, dispatch::ReduceOp) override { return unused(); }
  Status barrier() override { return unused(); }
  dispatch::CommCounters counters() const noexcept override { return {}; }

 private:
  Status do_all_to_all_v(const void*, const std::int64_t*, const std::int64_t*, void*, const std::int64_t*,
                         const std::int64_t*, const dispatch::BufferSpace&) override {
    return unused();
  }
  Status do_all_gather(const void*, std::int64_t, void*, const dispatch::BufferSpace&) override { return unused(); }
  Status do_broadcast(void*, std::int64_t, int, const dispatch::BufferSpace&) override { return unused(); }
  static Status unused() { return Status::internal("GpuRank has no transport"); }
  int rank_, local_rank_, device_;
};

// "auto" opens the communicator's GPU, not the one of its local rank.
TEST(DeviceOrdinalChoice, AutoFollowsTheCommunicatorsGpu) {
  const GpuRank r3(3, 3, 1);  // local rank 3 would be GPU 3 of 4
  EXPECT_EQ(detail::cuda_ordinal(ordinal(kDeviceOrdinalAuto), &r3, 4).value(), 1);
  const GpuRank r0(0, 0, 2);
  EXPECT_EQ(detail::cuda_ordinal(ordinal(kDeviceOrdinalAuto), &r0, 4).value(), 2);
}

// A pinned ordinal that is not the communicator's GPU is refused, naming the field, the value and
// the communicator's device; the same GPU is accepted.
TEST(DeviceOrdinalChoice, APinnedOrdinalOtherThanTheCommunicatorsGpuIsRefused) {
  const GpuRank r1(1, 1, 1);
  EXPECT_EQ(detail::cuda_ordinal(ordinal(1), &r1, 4).value(), 1);
  auto other = detail::cuda_ordinal(ordinal(0), &r1, 4);
  ASSERT_FALSE(other.is_ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = other.status().message();
  EXPECT_NE(msg.find("device.ordinal 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nccl communicator, CUDA device 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  // Not visible stays the first complaint.
  auto hidden = detail::cuda_ordinal(ordinal(7), &r1, 4);
  ASSERT_FALSE(hidden.is_ok());
  EXPECT_NE(hidden.status().message().find("is not a visible GPU"), std::string::npos);
}

// "current" on a rank with a GPU must be that GPU (without CUDA it fails as it does without a world).
TEST(DeviceOrdinalChoice, CurrentOtherThanTheCommunicatorsGpuIsRefused) {
  auto current = gpu::cuda_current_device();
  const int mine = current.is_ok() ? current.value() : 0;
  const GpuRank same(0, 0, mine), other(0, 0, mine + 1);
  auto ok = detail::cuda_ordinal(ordinal(kDeviceOrdinalCurrent), &same, mine + 2);
  auto bad = detail::cuda_ordinal(ordinal(kDeviceOrdinalCurrent), &other, mine + 2);
  if (!current.is_ok()) {
    EXPECT_FALSE(ok.is_ok());
    EXPECT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find(R"(device.ordinal "current")"), std::string::npos)
        << bad.status().to_string();
    return;
  }
  EXPECT_EQ(ok.value(), mine);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("CUDA device " + std::to_string(mine + 1)), std::string::npos)
      << bad.status().to_string();
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
