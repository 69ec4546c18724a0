// Results compared bit for bit (memcmp: the sign of a zero counts), where `==` would not see a
// difference: Pooling::kNone outputs of signed zeros, and hot rows (used more than kHotUses times,
// so the device kernels reduce them with a block) under every optimizer, pooling, weights and
// weight decay, at dims around a kernel chunk. And cache.transfer is a per-rank setting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "store/detail/config_agreement.hpp"
#include "tests/sanitizers.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {
using namespace strata::testing;

// Pooling::kNone output of a row holding -0.0 (or +0.0 times a negative weight) is -0.0 in every
// mode: the row, or the product, never 0.0f + w * row.
TEST(Bitwise, PoolingNoneKeepsTheSignOfZeroAsTheReference) {
  for (Placement p : {Placement::kCpu, Placement::kCached, Placement::kGpu}) {
    for (bool weighted : {false, true}) {
      StoreConfig config;
      config.threads = 2;
      config.device.backend = BackendChoice::kEmu;
      TableConfig tc;
      tc.spec.name = "t";
      tc.spec.rows = 4;
      tc.spec.dim = 8;
      tc.spec.pooling = Pooling::kNone;
      tc.placement = p;
      config.tables.push_back(tc);
      auto dev = Store::open(config);
      auto ref = open_reference_store(config);
      ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
      ASSERT_TRUE(ref.is_ok());
      // Row 1: -0.0 (unweighted case) or +0.0 (weighted by -1).
      std::vector<float> row(8, weighted ? 0.0f : -0.0f);
      for (auto* s : {&*dev, &*ref}) ASSERT_TRUE((*s)->write_rows(0, 1, 1, row.data(), nullptr).is_ok());
      KeyBatch kb;
      JaggedKeys f;
      f.table = "t";
      f.offsets = {0, 1};
      f.keys = {1};
      if (weighted) f.weights = {-1.0f};
      kb.features.push_back(f);
      std::vector<float> out_dev(8, 5.0f), out_ref(8, 5.0f);
      for (auto* s : {&*dev, &*ref}) ASSERT_TRUE((*s)->submit(0, kb).is_ok());
      ASSERT_TRUE((*dev)->forward(0, {{out_dev.data(), 1, 8}}).is_ok());
      ASSERT_TRUE((*ref)->forward(0, {{out_ref.data(), 1, 8}}).is_ok());
      EXPECT_EQ(0, std::memcmp(out_dev.data(), out_ref.data(), 8 * sizeof(float)))
          << to_string(p) << (weighted ? " weighted" : " unweighted") << ": " << (std::signbit(out_dev[0]) ? "-" : "+")
          << "0 vs reference " << (std::signbit(out_ref[0]) ? "-" : "+") << "0";
    }
  }
}

// cache.transfer changes no result (it only picks how rows move), like offload_gather and
// cache.policy: ranks may differ in it.
TEST(Bitwise, CacheTransferIsPerRank) {
  StoreConfig a;
  TableConfig tc;
  tc.spec.name = "t";
  tc.spec.rows = 10;
  tc.spec.dim = 4;
  tc.placement = Placement::kHybrid;
  a.tables.push_back(tc);
  StoreConfig b = a;
  b.offload_gather = OffloadGather::kCpu;
  EXPECT_EQ(detail::shared_config(a), detail::shared_config(b));  // per rank, as documented
  b = a;
  a.cache.transfer = CacheTransfer::kStaged;
  b.cache.transfer = CacheTransfer::kZeroCopy;
  EXPECT_EQ(detail::shared_config(a), detail::shared_config(b))
      << detail::config_difference(detail::shared_config(b), detail::shared_config(a));
}

// Hot rows (> kHotUses uses) for every optimizer and pooling, weights and decay, dims around kChunk:
// state compared bit for bit (memcmp, so the sign of zero counts too). Under ASan and TSan, dims 3
// (less than a vector) and 129 (a chunk and a tail) alone: the five dims took 98 s under TSan in a
// CI rehearsal, most of it writing the test's own buffers (0.3 s in the default preset).
TEST(Bitwise, HotRowsEveryOptimizerPoolingAndDim) {
  const std::vector<std::int32_t> dims =
      kSanitized ? std::vector<std::int32_t>{3, 129} : std::vector<std::int32_t>{3, 40, 128, 129, 300};
  for (Placement p : {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu}) {
    for (std::int32_t dim : dims) {
      StoreConfig config;
      config.threads = 2;
      config.device.backend = BackendChoice::kEmu;
      config.cache.transfer = dim % 2 ? CacheTransfer::kZeroCopy : CacheTransfer::kStaged;
      int n = 0;
      for (OptimizerKind k :
           {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam})
        for (Pooling pool : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
          TableConfig tc;
          tc.spec.name = "t" + std::to_string(n++);
          tc.spec.rows = 3;
          tc.spec.dim = dim;
          tc.spec.pooling = pool;
          tc.spec.init.bound = 0.5f;
          tc.spec.optimizer.kind = k;
          tc.spec.optimizer.learning_rate = 0.05f;
          tc.spec.optimizer.weight_decay = n % 2 ? 0.01f : 0.0f;
          tc.spec.optimizer.initial_accumulator = 0.1f;
          tc.placement = p;
          if (p == Placement::kCached) tc.cache.rows = 3;
          config.tables.push_back(tc);
        }
      auto dev = Store::open(config);
      auto ref = open_reference_store(config);
      ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
      ASSERT_TRUE(ref.is_ok());
      std::mt19937_64 rng(dim);
      for (int step = 0; step < 3; ++step) {
        KeyBatch kb;
        for (const auto& t : config.tables) {
          JaggedKeys f;
          f.table = t.spec.name;
          f.offsets.push_back(0);
          const bool weighted = rng() % 2;
          for (int b = 0; b < 700; ++b) {
            const int len = 1 + static_cast<int>(rng() % 2);
            for (int i = 0; i < len; ++i) {
              f.keys.push_back(rng() % 4 == 0 ? 1 + static_cast<Key>(rng() % 2) : 0);  // row 0: ~800 uses
              if (weighted) f.weights.push_back(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 500.0f);
            }
            f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
          }
          kb.features.push_back(std::move(f));
        }
        for (auto* s : {&*dev, &*ref}) ASSERT_TRUE((*s)->submit(step, kb).is_ok());
        Buffers od = make_buffers(config, kb), orf = make_buffers(config, kb);
        ASSERT_TRUE((*dev)->forward(step, od.views).is_ok());
        ASSERT_TRUE((*ref)->forward(step, orf.views).is_ok());
        ASSERT_TRUE(same_outputs(od, orf)) << to_string(p) << " dim " << dim << " step " << step;
        Buffers g = make_buffers(config, kb);
        fill_random(rng, g);
        ASSERT_TRUE((*dev)->backward(step, g.cviews).is_ok());
        ASSERT_TRUE((*ref)->backward(step, g.cviews).is_ok());
      }
      EXPECT_TRUE(same_state(snapshot(**dev), snapshot(**ref))) << to_string(p) << " dim " << dim;
    }
  }
}

}  // namespace
}  // namespace strata
