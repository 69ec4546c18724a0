// README.md's "Outputs and gradients on the device" C++ block, run as written (the build cuts it out
// of the README: readme_device_views.cpp.in): on the emulated device, for `gpu` and `cached`
// tables (device views in place) and `offload` ones (staged through pinned memory), its outputs
// and its update equal the reference store's with host views, bit for bit. (A store of `cpu`
// tables alone has no device, which the snippet's first line says.)
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tests/store/readme_snippet.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

// The snippet's shape: 2 bags of the table "user" with dim 64.
constexpr int kBags = 2, kDim = 64;

// Reads the outputs D2H and writes known gradients H2D, both on the trainer's stream, through
// pinned memory (as a dense model's framework would; strict emu refuses pageable async copies).
class CopyModel final : public readme::DenseModel {
 public:
  explicit CopyModel(const std::vector<float>& grads) : grads_(grads) {}
  void run(gpu::Device& dev, gpu::DeviceBuffer& out, gpu::DeviceBuffer& grad, gpu::Stream& stream) override {
    const std::size_t bytes = grads_.size() * sizeof(float);
    host_out_ = dev.allocate_pinned(bytes).value();
    host_grad_ = dev.allocate_pinned(bytes).value();
    std::memcpy(host_grad_.as<float>(), grads_.data(), bytes);
    dev.copy_d2h(stream.view(), host_out_.as<float>(), out.as<float>(), bytes);
    dev.copy_h2d(stream.view(), grad.as<float>(), host_grad_.as<float>(), bytes);
    ran_ = true;
  }
  // What the model read from `out` (valid once the stream passed the copy: backward waits for it).
  std::vector<float> outputs() const {
    const float* p = host_out_.as<float>();
    return {p, p + grads_.size()};
  }
  bool ran() const { return ran_; }

 private:
  std::vector<float> grads_;
  gpu::PinnedBuffer host_out_, host_grad_;
  bool ran_ = false;
};

class ReadmeDeviceViews : public ::testing::TestWithParam<Placement> {};

TEST_P(ReadmeDeviceViews, RunsAsWrittenAndEqualsTheReferenceBitForBit) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  TableConfig t;
  t.spec.name = "user";
  t.spec.rows = 1000;
  t.spec.dim = kDim;
  t.spec.optimizer.kind = OptimizerKind::kAdagrad;
  t.spec.optimizer.learning_rate = 0.05f;
  t.placement = GetParam();
  if (t.placement == Placement::kCached) t.cache.fraction = 0.01;  // 10 rows: a miss or two
  c.tables.push_back(t);
  std::mt19937_64 rng(7);
  const KeyBatch batch = uniform_batch(rng, c, kBags, 5);
  std::vector<float> grads(kBags * kDim);
  for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;

  auto store = Store::open(c).value();
  CopyModel model(grads);
  const Status s = readme::device_views_snippet(store, batch, model);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_TRUE(model.ran());
  ASSERT_TRUE(store->flush().is_ok());

  StoreConfig ref_config = c;
  ref_config.device = {};
  auto ref = open_reference_store(ref_config).value();
  Buffers out = make_buffers(c, batch), g = make_buffers(c, batch);
  g.data[0] = grads;
  ASSERT_TRUE(ref->submit(0, batch).is_ok());
  ASSERT_TRUE(ref->forward(0, out.views).is_ok());
  ASSERT_TRUE(ref->backward(0, g.cviews).is_ok());
  Buffers got = make_buffers(c, batch);
  got.data[0] = model.outputs();
  EXPECT_TRUE(same_outputs(got, out));
  EXPECT_TRUE(same_state(snapshot(*store), snapshot(*ref)));
  EXPECT_EQ(store->step(), 1);
}

INSTANTIATE_TEST_SUITE_P(Placements, ReadmeDeviceViews,
                         ::testing::Values(Placement::kGpu, Placement::kCached, Placement::kOffload),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace strata
