// Hot rows and small rows in every placement, bit for bit against the reference: a one-row table
// that every bag uses (a row used more often than kHotUses, so the device kernels sum it segment by
// segment into partial sums and add them in segment order), zipf keys (hot rows of every size),
// and small dims (several bags per warp in the gather). With the emu backend this runs the cuda backend's kernel source
// on the CPU grid; with a GPU, the kernels themselves. The `tiny` cases give cached tables caches of 1 or 2 rows, so
// hot rows too are read and updated outside the cache (bypass).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "host/dedup.hpp"
#include "store/engines/cpu_engine.hpp"
#include "tests/gpu/cuda_gate.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

struct HotCase {
  Placement placement;
  std::int32_t dim;
  bool cuda;
  bool tiny = false;  ///< caches of 1 or 2 rows; "one" has two rows, both hot, one bypasses the cache
  bool many = false;  ///< batches of 5000 to 6000 bags: the hot rows are used thousands of times
};

// Zipf(s) over [0, n) by inverse CDF.
class Zipf {
 public:
  Zipf(std::int64_t n, double s) : cdf_(static_cast<std::size_t>(n)) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) cdf_[static_cast<std::size_t>(i)] = sum += 1.0 / std::pow(i + 1.0, s);
    for (double& c : cdf_) c /= sum;
  }
  Key operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return static_cast<Key>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

StoreConfig hot_config(const HotCase& c) {
  StoreConfig config;
  config.threads = 2;
  config.device.backend = c.cuda ? BackendChoice::kCuda : BackendChoice::kEmu;
  config.offload_gather = OffloadGather::kDevice;  // the zero-copy gather kernel
  // Cache fills and write-backs: zero-copy kernels at dims 4 and 160, staged at 16 and 48.
  config.cache.transfer = c.dim % 32 == 16 ? CacheTransfer::kStaged : CacheTransfer::kZeroCopy;
  const struct {
    const char* name;
    std::int64_t rows;
    Pooling pooling;
    OptimizerKind optimizer;
    float decay;
  } tables[] = {
      {"one", 1, Pooling::kSum, OptimizerKind::kRowwiseAdagrad, 0.01f},
      {"zipf", 3000, Pooling::kMean, OptimizerKind::kAdam, 0.0f},
      {"zipf_sgd", 2000, Pooling::kSum, OptimizerKind::kSgd, 0.01f},
      {"unpooled", 500, Pooling::kNone, OptimizerKind::kAdagrad, 0.0f},
  };
  for (const auto& t : tables) {
    TableConfig tc;
    tc.spec.name = t.name;
    tc.spec.rows = c.tiny && t.rows == 1 ? 2 : t.rows;
    tc.spec.dim = c.dim;
    tc.spec.pooling = t.pooling;
    tc.spec.init.bound = 0.5f;
    tc.spec.init.seed = 7;
    tc.spec.optimizer.kind = t.optimizer;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.spec.optimizer.weight_decay = t.decay;
    tc.spec.optimizer.initial_accumulator = 0.1f;
    tc.placement = c.placement;
    config.tables.push_back(tc);
  }
  return config;
}

// A batch of `bags` bags: "one" in every bag (twice in some; uniform over its two rows when `tiny`),
// zipf:1.05 keys elsewhere, weights on the zipf_sgd table. `wide`: 2 to 6 keys in each bag of the
// unpooled table, so that in batches of 5000 bags it has more keys than the cpu and offload engines'
// shared repeated-keys pass takes (detail::HostBatch::kSharedRepeatsKeys) while the other tables join it.
KeyBatch hot_batch(std::mt19937_64& rng, const StoreConfig& config, std::int64_t bags, bool wide) {
  KeyBatch kb;
  for (const auto& t : config.tables) {
    JaggedKeys f;
    f.table = t.spec.name;
    f.offsets.push_back(0);
    const Zipf zipf(t.spec.rows, 1.05);
    for (std::int64_t b = 0; b < bags; ++b) {
      const int len = t.spec.rows <= 2                           ? 1 + static_cast<int>(rng() % 2)
                      : wide && t.spec.pooling == Pooling::kNone ? 2 + static_cast<int>(rng() % 5)
                                                                 : static_cast<int>(rng() % 5);
      for (int i = 0; i < len; ++i) {
        f.keys.push_back(t.spec.rows == 2 ? static_cast<Key>(rng() % 2) : zipf(rng));
        if (t.spec.name == "zipf_sgd") f.weights.push_back(static_cast<float>(rng() % 1000) / 500.0f);
      }
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    kb.features.push_back(std::move(f));
  }
  return kb;
}

class HotRows : public ::testing::TestWithParam<HotCase> {};

TEST_P(HotRows, EqualTheReferenceBitForBit) {
  const HotCase c = GetParam();
  if (c.cuda) STRATA_SKIP_WITHOUT_CUDA_GPU();
  std::mt19937_64 rng(static_cast<std::uint64_t>(c.dim) * 101 + static_cast<std::uint64_t>(c.placement));
  StoreConfig config = hot_config(c);
  const int steps = 3;
  std::vector<KeyBatch> batches;
  for (int i = 0; i < steps; ++i)
    batches.push_back(hot_batch(rng, config, (c.many ? 5000 : 400) + static_cast<std::int64_t>(rng() % 200), c.many));
  // The one-row table's row is hot in every batch (used thousands of times in the `many` cases),
  // and there the unpooled table's keys are found repeated on their own, the others' in one pass.
  for (const auto& kb : batches) {
    ASSERT_GT(kb.features[0].num_keys(), c.many ? std::int64_t{5000} : gpu::kernels::kHotUses);
    if (!c.many) continue;
    ASSERT_LE(kb.features[0].num_keys(), detail::HostBatch::kSharedRepeatsKeys);
    ASSERT_GT(kb.features[3].num_keys(), detail::HostBatch::kSharedRepeatsKeys);
  }
  for (auto& t : config.tables) {
    if (t.placement != Placement::kCached && t.placement != Placement::kHybrid) continue;
    std::int64_t max_unique = 1;
    for (const auto& kb : batches)
      for (const auto& f : kb.features)
        if (f.table == t.spec.name) max_unique = std::max(max_unique, dedup_keys(f.keys.data(), f.num_keys()).size());
    t.cache.rows = std::min(t.spec.rows, max_unique + 2);  // rows are evicted between batches
    if (c.tiny) t.cache.rows = t.spec.rows == 2 ? 1 : 2;
  }
  auto dev = Store::open(config);
  auto ref = open_reference_store(config);
  ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
  ASSERT_TRUE(ref.is_ok());
  for (int i = 0; i < steps; ++i) {
    const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
    for (auto* s : {&*dev, &*ref}) ASSERT_TRUE((*s)->submit(i, kb).is_ok());
    Buffers out_dev = make_buffers(config, kb), out_ref = make_buffers(config, kb);
    ASSERT_TRUE((*dev)->forward(i, out_dev.views).is_ok());
    ASSERT_TRUE((*ref)->forward(i, out_ref.views).is_ok());
    ASSERT_TRUE(same_outputs(out_dev, out_ref)) << "step " << i;
    Buffers grads = make_buffers(config, kb);
    fill_random(rng, grads);
    ASSERT_TRUE((*dev)->backward(i, grads.cviews).is_ok());
    ASSERT_TRUE((*ref)->backward(i, grads.cviews).is_ok());
  }
  EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref)));
  if (c.tiny) {
    // Both rows of "one" are used more than kHotUses times in every batch; its cache holds one, the
    // other is summed segment by segment outside the cache.
    for (const auto& kb : batches)
      for (const Key row : {Key{0}, Key{1}}) {
        const auto& keys = kb.features[0].keys;
        ASSERT_GT(std::count(keys.begin(), keys.end(), row), gpu::kernels::kHotUses);
      }
    for (const auto& [name, st] : (*dev)->stats().cache)
      if (name == "one") {
        EXPECT_EQ(st.bypassed, steps);
      }
  }
}

std::vector<HotCase> hot_cases() {
  std::vector<HotCase> v;
  for (bool cuda : {false, true})
    for (Placement p : {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu, Placement::kHybrid})
      for (std::int32_t dim : {4, 16, 48, 160}) v.push_back({p, dim, cuda});
  for (bool cuda : {false, true})
    for (Placement p : {Placement::kCached, Placement::kHybrid})
      for (std::int32_t dim : {4, 48, 160}) v.push_back({p, dim, cuda, true});
  for (bool cuda : {false, true})
    for (Placement p : {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu})
      for (std::int32_t dim : {16, 160}) v.push_back({p, dim, cuda, false, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Placements, HotRows, ::testing::ValuesIn(hot_cases()),
                         [](const ::testing::TestParamInfo<HotCase>& i) {
                           return std::string(i.param.cuda ? "cuda_" : "emu_") + to_string(i.param.placement) + "_dim" +
                                  std::to_string(i.param.dim) + (i.param.tiny ? "_tiny" : "") +
                                  (i.param.many ? "_many" : "");
                         });

}  // namespace
}  // namespace strata
