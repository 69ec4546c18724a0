// The CPU kernels against naive loops, over dims, poolings, weights and NUMA layouts.
#include "host/kernels.hpp"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "host/host_table.hpp"
#include "tests/host/record_pads.hpp"
#include "tests/sanitizers.hpp"

namespace strata {
namespace {

// The bits of a float: ASSERT_EQ takes -0 and +0 as equal, and the fused optimizer must keep
// the row math's 0 + s * g, which turns a -0 gradient into +0.
std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Index of the first of `n` floats where `got` differs from `want`, or -1: by value (+0 equals -0,
// as ASSERT_EQ has it) or by bits. The exhaustive tests below compare each record in one pass and
// build a message only for a difference: an assertion per float (and a message built for each)
// took minutes of CI's sanitizer runs.
enum class Compare { kValue, kBits };
std::int64_t first_difference(const float* got, const float* want, std::int64_t n, Compare how) {
  for (std::int64_t i = 0; i < n; ++i)
    if (how == Compare::kBits ? bits_of(got[i]) != bits_of(want[i]) : !(got[i] == want[i])) return i;
  return -1;
}

// The dims of the exhaustive tests below: 1 to 272 (the compile-time dims, multiples of 16 up to
// 256, and the run-time ones between and beyond). Under ASan or TSan, which check memory and races,
// not bits (the default preset checks every dim's bits), the default preset's compile-time dims,
// the run-time dims on each side of them and a few more: every code path, in a fifth of the time
// (EveryDim... took 119 s under TSan). The sanitizer presets compile only 64 and 128 as
// compile-time dims (STRATA_FEW_KERNEL_DIMS, host/kernels.cpp); the other multiples of 16 run the
// run-time-dim instance there.
std::vector<int> exhaustive_dims() {
  std::vector<int> dims;
  if (testing::kSanitized) {
    dims = {1, 2, 3, 5, 7, 271, 272};
    for (int m = 16; m <= 256; m += 16) dims.insert(dims.end(), {m - 1, m, m + 1});
  } else {
    for (int d = 1; d <= 272; ++d) dims.push_back(d);
  }
  return dims;
}

struct Case {
  int dim;
  Pooling pooling;
  bool weighted;
  int nodes;
};

class Kernels : public ::testing::TestWithParam<Case> {};

TEST_P(Kernels, GatherAndBackwardMatchNaiveLoops) {
  const Case c = GetParam();
  TableSpec spec;
  spec.name = "k";
  spec.rows = 3000;
  spec.dim = c.dim;
  spec.pooling = c.pooling;
  spec.init.bound = 1.0f;
  spec.optimizer.learning_rate = 0.1f;
  HostTableOptions ho;
  ho.block_rows_log2 = 6;
  auto table = HostTable::create(Topology::fake(c.nodes), spec, ho);
  ASSERT_TRUE(table.is_ok());
  std::mt19937_64 rng(c.dim * 31 + c.nodes);
  const std::int64_t batch = 300;
  std::vector<std::int64_t> offsets{0};
  std::vector<Key> keys;
  std::vector<float> weights;
  for (std::int64_t b = 0; b < batch; ++b) {
    const int len = static_cast<int>(rng() % 7);  // includes empty bags
    for (int i = 0; i < len; ++i) {
      keys.push_back(static_cast<Key>(rng() % 200));  // many duplicates
      weights.push_back(static_cast<float>(rng() % 100) / 50.0f);
    }
    offsets.push_back(static_cast<std::int64_t>(keys.size()));
  }
  const std::int64_t n = static_cast<std::int64_t>(keys.size());
  BagsView bags{offsets.data(), batch, keys.data(), c.weighted ? weights.data() : nullptr};
  const std::int64_t out_rows = c.pooling == Pooling::kNone ? n : batch;
  std::vector<float> out(static_cast<std::size_t>(out_rows * c.dim), -1.0f);
  if (c.pooling == Pooling::kNone) {
    gather_rows(table->ref(), keys.data(), bags.weights, n, out.data());
  } else {
    gather_pool(table->ref(), bags, c.pooling, out.data());
  }
  auto w_of = [&](std::int64_t j) { return c.weighted ? weights[static_cast<std::size_t>(j)] : 1.0f; };
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      if (c.pooling != Pooling::kNone) continue;
      for (int d = 0; d < c.dim; ++d) ASSERT_EQ(out[j * c.dim + d], w_of(j) * table->row(keys[j])[d]);
    }
    if (c.pooling == Pooling::kNone) continue;
    const std::int64_t len = offsets[b + 1] - offsets[b];
    for (int d = 0; d < c.dim; ++d) {
      double want = 0;
      for (std::int64_t j = offsets[b]; j < offsets[b + 1]; ++j) want += w_of(j) * table->row(keys[j])[d];
      if (c.pooling == Pooling::kMean && len) want /= static_cast<double>(len);
      ASSERT_NEAR(out[b * c.dim + d], want, 1e-4) << "bag " << b << " col " << d;
    }
  }

  // Backward with SGD: each touched row moves by -lr * (sum of its scaled gradients).
  std::vector<float> grads(out.size());
  for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 100.0f;
  std::map<Key, std::vector<double>> want;
  std::map<Key, std::vector<float>> before;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = offsets[b + 1] - offsets[b];
    for (std::int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      auto& acc = want[keys[j]];
      acc.resize(static_cast<std::size_t>(c.dim));
      const float* g = grads.data() + (c.pooling == Pooling::kNone ? j : b) * c.dim;
      const double s = (c.pooling == Pooling::kMean ? 1.0 / static_cast<double>(len) : 1.0) * w_of(j);
      for (int d = 0; d < c.dim; ++d) acc[static_cast<std::size_t>(d)] += s * g[d];
    }
  }
  for (auto& [k, _] : want) before[k].assign(table->row(k), table->row(k) + c.dim);
  const float untouched = table->row(2999)[0];
  auto unique = dedup_keys(keys.data(), n);
  auto bag_of = bag_of_positions(offsets.data(), batch);
  backward_update(table->ref(), bags, c.pooling, view_of(unique), bag_of.data(), grads.data(),
                  make_optimizer_step(spec.optimizer, 1));
  for (auto& [k, acc] : want)
    for (int d = 0; d < c.dim; ++d)
      ASSERT_NEAR(table->row(k)[d], before[k][static_cast<std::size_t>(d)] - 0.1 * acc[static_cast<std::size_t>(d)],
                  1e-4);
  EXPECT_EQ(table->row(2999)[0], untouched);
}

// `batch` bags of 0..8 keys in [0, key_range), each with a weight in about [-3, 3].
struct RandomBags {
  std::vector<std::int64_t> offsets;
  std::vector<Key> keys;
  std::vector<float> weights;
};
RandomBags random_bags(std::mt19937_64& rng, std::int64_t batch, Key key_range) {
  RandomBags r;
  r.offsets.push_back(0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const int len = static_cast<int>(rng() % 9);
    for (int i = 0; i < len; ++i) {
      r.keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(key_range)));
      r.weights.push_back(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 337.0f);
    }
    r.offsets.push_back(static_cast<std::int64_t>(r.keys.size()));
  }
  return r;
}

// gather_pool has a register-accumulating path for dims that are multiples of 16 up to 256 and a
// generic one for the rest: both must give exactly what the row math gives when a bag is summed
// key by key (the reference store's loop), since every mode is compared with it bit for bit.
TEST(GatherPool, EveryDimIsBitIdenticalToTheRowMathLoop) {
  std::mt19937_64 rng(7);
  for (const int dim : exhaustive_dims()) {
    TableSpec spec;
    spec.name = "bits";
    spec.rows = 500;
    spec.dim = dim;
    spec.init.bound = 1.0f;
    auto table = HostTable::create(Topology::fake(1), spec, {});
    ASSERT_TRUE(table.is_ok());
    const std::int64_t batch = 40;
    const auto [offsets, keys, weights] = random_bags(rng, batch, 500);
    for (const Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
      for (const bool weighted : {false, true}) {
        const BagsView bags{offsets.data(), batch, keys.data(), weighted ? weights.data() : nullptr};
        std::vector<float> got(static_cast<std::size_t>(batch * dim), -1.0f), want(got.size(), 0.0f);
        gather_pool(table->ref(), bags, pooling, got.data());
        for (std::int64_t b = 0; b < batch; ++b) {
          float* o = want.data() + b * dim;
          for (std::int64_t j = offsets[b]; j < offsets[b + 1]; ++j) {
            if (weighted) {
              row_axpy(o, table->row(keys[static_cast<std::size_t>(j)]), weights[static_cast<std::size_t>(j)], dim);
            } else {
              row_add(o, table->row(keys[static_cast<std::size_t>(j)]), dim);
            }
          }
          const std::int64_t len = offsets[b + 1] - offsets[b];
          if (pooling == Pooling::kMean && len) row_scale(o, bag_scale(pooling, len), dim);
        }
        const std::int64_t i =
            first_difference(got.data(), want.data(), static_cast<std::int64_t>(got.size()), Compare::kValue);
        ASSERT_EQ(i, -1) << "dim " << dim << (weighted ? " weighted " : " ") << to_string(pooling) << " at " << i;
      }
    }
  }
}

// backward_update and backward_update_by_bag have compile-time-dim paths for multiples of 16 up
// to 256 and a run-time one for the rest: each must give exactly what the row math gives when the
// gradient is reduced in ascending position order and the optimizer applied once (the reference
// store's loop), for every optimizer, pooling and weighting, with keys used once and repeated.
// The expected result of a fused backward, by the row math alone: each unique row's gradient summed
// in segments of kGradSegment uses (each from 0, in position order, then added in order), then
// apply_optimizer on its record in `records` (rows of `rec` floats).
void row_math_update(std::vector<float>& records, std::int64_t rec, std::int32_t dim, const BagsView& bags,
                     Pooling pooling, const UniqueKeys& unique, const std::vector<std::int32_t>& bag_of,
                     const std::vector<float>& grads, const OptimizerStep& step) {
  for (std::int64_t u = 0; u < unique.size(); ++u) {
    std::vector<float> acc(static_cast<std::size_t>(dim), 0.0f), part(static_cast<std::size_t>(dim));
    for (std::int64_t s = unique.offsets[u]; s < unique.offsets[u + 1]; s += kGradSegment) {
      float* sum = s == unique.offsets[u] ? acc.data() : part.data();
      std::fill(sum, sum + dim, 0.0f);
      for (std::int64_t p = s; p < std::min(s + kGradSegment, unique.offsets[u + 1]); ++p) {
        const std::int64_t j = unique.positions[p];
        const std::int64_t b = pooling == Pooling::kNone ? j : bag_of[j];
        const std::int64_t len = pooling == Pooling::kNone ? 1 : bags.offsets[b + 1] - bags.offsets[b];
        row_axpy(sum, grads.data() + b * dim, grad_scale(pooling, len, bags.weights, j), dim);
      }
      if (sum != acc.data()) row_add(acc.data(), sum, dim);
    }
    float* w = records.data() + unique.keys[u] * rec;
    apply_optimizer(step, w, w + dim, acc.data(), dim);
  }
}

TEST(BackwardUpdate, EveryDimAndOptimizerIsBitIdenticalToTheRowMathLoop) {
  std::mt19937_64 rng(11);
  for (const int dim : exhaustive_dims()) {
    for (const OptimizerKind kind :
         {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
      TableSpec spec;
      spec.name = "bits";
      spec.rows = 300;
      spec.dim = dim;
      spec.init.bound = 1.0f;
      spec.optimizer.kind = kind;
      spec.optimizer.weight_decay = (dim % 3 == 0) ? 0.01f : 0.0f;
      spec.optimizer.initial_accumulator = 0.1f;
      const Pooling pooling =
          std::array<Pooling, 3>{Pooling::kSum, Pooling::kMean, Pooling::kNone}[static_cast<std::size_t>(dim % 3)];
      const bool weighted = (dim / 3) % 2 == 1;
      spec.pooling = pooling;
      auto table = HostTable::create(Topology::fake(1), spec, {});
      ASSERT_TRUE(table.is_ok());
      const std::int64_t batch = 30;
      const auto [offsets, keys, weights] = random_bags(rng, batch, 60);  // many duplicates
      const std::int64_t n = static_cast<std::int64_t>(keys.size());
      const std::int64_t grad_rows = pooling == Pooling::kNone ? n : batch;
      std::vector<float> grads(static_cast<std::size_t>(grad_rows * dim));
      for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f;
      const BagsView bags{offsets.data(), batch, keys.data(), weighted ? weights.data() : nullptr};
      const std::int64_t rec = dim + table->state_dim();
      // Expected: copies of every record, updated by the row math loop.
      std::vector<float> want(static_cast<std::size_t>(spec.rows * rec));
      for (std::int64_t r = 0; r < spec.rows; ++r)
        std::copy(table->row(r), table->row(r) + rec, want.begin() + r * rec);
      const UniqueKeys unique = dedup_keys(keys.data(), n);
      const std::vector<std::int32_t> bag_of = bag_of_positions(offsets.data(), batch);
      const OptimizerStep step = make_optimizer_step(spec.optimizer, 3);
      row_math_update(want, rec, dim, bags, pooling, unique, bag_of, grads, step);
      backward_update(table->ref(), bags, pooling, view_of(unique), bag_of.data(), grads.data(), step);
      // backward_update_by_bag on a second copy of the table (same initial values): the same bits.
      auto by_bag = HostTable::create(Topology::fake(1), spec, {});
      ASSERT_TRUE(by_bag.is_ok());
      Repeats repeats;
      RepeatsScratch scratch;
      find_repeats(keys.data(), n, spec.rows, repeats, scratch);
      backward_update_by_bag(by_bag->ref(), bags, pooling, repeats, bag_of.data(), grads.data(), step);
      for (std::int64_t r = 0; r < spec.rows; ++r) {
        const float* x = want.data() + r * rec;
        for (const bool bag : {false, true}) {
          const float* got = bag ? by_bag->row(r) : table->row(r);
          const std::int64_t c = first_difference(got, x, rec, Compare::kValue);
          ASSERT_EQ(c, -1) << (bag ? "by bag: " : "") << "dim " << dim << " " << to_string(kind) << " "
                           << to_string(pooling) << (weighted ? " weighted" : "") << " row " << r << " float " << c
                           << ": " << got[c] << " against " << x[c];
        }
      }
    }
  }
}

// backward_update and backward_update_by_bag apply the optimizer fused (one pass over the record,
// weight decay folded in, the gradient computed in that pass with per-sample weights, row-wise
// Adagrad's sum of squares once per bag) for compile-time dims: the same bits as the row math
// (reduction in ascending position order, then apply_optimizer) for every optimizer, with and
// without weight decay, every pooling, with and without weights, on weights, gradients and
// per-sample weights that are often +0 or -0, so that a skipped 0 + s * g shows as a sign flip.
TEST(BackwardUpdate, FusedOptimizerKeepsTheRowMathBitsWithSignedZeros) {
  std::mt19937_64 rng(23);
  auto signed_zero_or = [&rng](float x) {
    const auto r = rng() % 6;
    return r == 0 ? 0.0f : r == 1 ? -0.0f : x;
  };
  for (const int dim : {16, 32, 48, 128, 256, 20}) {
    for (const OptimizerKind kind :
         {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
      for (const float decay : {0.0f, 0.03f}) {
        for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
          for (const bool weighted : {false, true}) {
            TableSpec spec;
            spec.name = "fused";
            spec.rows = 200;
            spec.dim = dim;
            spec.init.bound = 1.0f;
            spec.pooling = pooling;
            spec.optimizer.kind = kind;
            spec.optimizer.weight_decay = decay;
            spec.optimizer.initial_accumulator = 0.1f;
            spec.optimizer.learning_rate = 0.3f;
            auto table = HostTable::create(Topology::fake(1), spec, {});
            auto by_bag = HostTable::create(Topology::fake(1), spec, {});
            ASSERT_TRUE(table.is_ok() && by_bag.is_ok());
            const std::int64_t rec = dim + table->state_dim();
            for (std::int64_t r = 0; r < spec.rows; ++r)
              for (std::int32_t c = 0; c < dim; ++c)
                table->row(r)[c] = by_bag->row(r)[c] = signed_zero_or(table->row(r)[c]);
            const std::int64_t batch = 40;
            auto [offsets, keys, weights] = random_bags(rng, batch, spec.rows);  // keys used once and repeated
            for (auto& w : weights) w = signed_zero_or(w);
            const std::int64_t n = static_cast<std::int64_t>(keys.size());
            const std::int64_t grad_rows = pooling == Pooling::kNone ? n : batch;
            std::vector<float> grads(static_cast<std::size_t>(grad_rows * dim));
            for (auto& g : grads)
              g = signed_zero_or(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f);
            const BagsView bags{offsets.data(), batch, keys.data(), weighted ? weights.data() : nullptr};
            std::vector<float> want(static_cast<std::size_t>(spec.rows * rec));
            for (std::int64_t r = 0; r < spec.rows; ++r)
              std::copy(table->row(r), table->row(r) + rec, want.begin() + r * rec);
            const UniqueKeys unique = dedup_keys(keys.data(), n);
            const std::vector<std::int32_t> bag_of = bag_of_positions(offsets.data(), batch);
            const OptimizerStep step = make_optimizer_step(spec.optimizer, 2);
            row_math_update(want, rec, dim, bags, pooling, unique, bag_of, grads, step);
            backward_update(table->ref(), bags, pooling, view_of(unique), bag_of.data(), grads.data(), step);
            Repeats repeats;
            RepeatsScratch scratch;
            find_repeats(keys.data(), n, spec.rows, repeats, scratch);
            backward_update_by_bag(by_bag->ref(), bags, pooling, repeats, bag_of.data(), grads.data(), step);
            for (std::int64_t r = 0; r < spec.rows; ++r) {
              const float* x = want.data() + r * rec;
              for (const bool bag : {false, true}) {
                const float* got = bag ? by_bag->row(r) : table->row(r);
                const std::int64_t c = first_difference(got, x, rec, Compare::kBits);
                ASSERT_EQ(c, -1) << (bag ? "by bag: " : "backward_update: ") << "dim " << dim << " " << to_string(kind)
                                 << " decay " << decay << " " << to_string(pooling) << (weighted ? " weighted" : "")
                                 << " row " << r << " float " << c << ": " << got[c] << " against " << x[c];
              }
            }
          }
        }
      }
    }
  }
}

// With a table of several key ranges (find_repeats splits keys by 2^17-row ranges for a 4 MiB L2), the repeated
// keys of every range are updated, in parallel, to the same bits as backward_update gives; run in
// arenas of 2 and 3 threads, with hot keys in every range and keys at both ends of the table.
TEST(BackwardUpdateByBag, ManyKeyRangesMatchBackwardUpdate) {
  TableSpec spec;
  spec.name = "ranges";
  spec.rows = 3 * (std::int64_t{1} << 17) + 5;
  spec.dim = 8;
  spec.init.bound = 1.0f;
  spec.optimizer.kind = OptimizerKind::kAdagrad;
  std::mt19937_64 rng(17);
  for (const int threads : {2, 3}) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      auto a = HostTable::create(Topology::fake(2), spec, {});
      auto b = HostTable::create(Topology::fake(2), spec, {});
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      const Key hot[] = {0, 1, (Key{1} << 17) - 1, Key{1} << 17, 2 * (Key{1} << 17) + 3, spec.rows - 1};
      const std::int64_t batch = 3000;
      std::vector<std::int64_t> offsets{0};
      std::vector<Key> keys;
      for (std::int64_t bag = 0; bag < batch; ++bag) {
        const int len = static_cast<int>(rng() % 17);
        for (int i = 0; i < len; ++i)
          keys.push_back(rng() % 5 == 0 ? hot[rng() % 6]
                                        : static_cast<Key>(rng() % static_cast<std::uint64_t>(spec.rows)));
        offsets.push_back(static_cast<std::int64_t>(keys.size()));
      }
      const std::int64_t n = static_cast<std::int64_t>(keys.size());
      std::vector<float> grads(static_cast<std::size_t>(batch * spec.dim));
      for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f;
      const BagsView bags{offsets.data(), batch, keys.data(), nullptr};
      const std::vector<std::int32_t> bag_of = bag_of_positions(offsets.data(), batch);
      const OptimizerStep step = make_optimizer_step(spec.optimizer, 1);
      backward_update(a->ref(), bags, Pooling::kSum, view_of(dedup_keys(keys.data(), n)), bag_of.data(), grads.data(),
                      step);
      Repeats repeats;
      RepeatsScratch scratch;
      scratch.l2_bytes = std::uint64_t{4} << 20;  // maps of 2^17 entries: 4 ranges
      find_repeats(keys.data(), n, spec.rows, repeats, scratch);
      ASSERT_EQ(repeats.ranges.size(), 4u);
      for (const auto& r : repeats.ranges) ASSERT_FALSE(r.keys.empty());
      backward_update_by_bag(b->ref(), bags, Pooling::kSum, repeats, bag_of.data(), grads.data(), step);
      for (const Key k : keys)
        for (std::int32_t c = 0; c < spec.dim + b->state_dim(); ++c)
          ASSERT_EQ(b->row(k)[c], a->row(k)[c]) << "row " << k << " float " << c;
    });
  }
}

// The table-batched kernels against the per-table ones, bit for bit: tables of different dims
// (compile-time and run-time), poolings, per-sample weights, optimizers (with and without weight
// decay) and sizes (one row, where every key repeats, to many) in one batch.
TEST(TableBatched, MixedTablesAreBitIdenticalToThePerTableKernels) {
  struct T {
    std::int64_t rows;
    std::int32_t dim;
    Pooling pooling;
    bool weighted;
    OptimizerKind opt;
    float decay;
  };
  const T shapes[] = {{1, 64, Pooling::kSum, false, OptimizerKind::kSgd, 0.0f},
                      {3, 16, Pooling::kMean, true, OptimizerKind::kAdagrad, 0.0f},
                      {5000, 64, Pooling::kSum, false, OptimizerKind::kRowwiseAdagrad, 0.0f},
                      {700, 17, Pooling::kMean, false, OptimizerKind::kAdam, 0.01f},
                      {2000, 128, Pooling::kNone, true, OptimizerKind::kSgd, 0.01f},
                      {300, 8, Pooling::kNone, false, OptimizerKind::kRowwiseAdagrad, 0.01f},
                      {40000, 32, Pooling::kSum, true, OptimizerKind::kAdam, 0.0f}};
  std::mt19937_64 rng(32);
  for (const int threads : {1, 2, 3}) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      std::vector<HostTable> a, b;
      std::vector<RandomBags> bags;
      std::vector<std::vector<float>> grads, out_a, out_b;
      std::vector<std::vector<std::int32_t>> bag_of;
      std::vector<Repeats> repeats(std::size(shapes));
      std::vector<TableBatchItem> items;
      for (const T& t : shapes) {
        TableSpec spec;
        spec.name = "t";
        spec.rows = t.rows;
        spec.dim = t.dim;
        spec.pooling = t.pooling;
        spec.init.bound = 1.0f;
        spec.optimizer.kind = t.opt;
        spec.optimizer.weight_decay = t.decay;
        auto ta = HostTable::create(Topology::fake(2), spec, {});
        auto tb = HostTable::create(Topology::fake(2), spec, {});
        ASSERT_TRUE(ta.is_ok() && tb.is_ok());
        a.push_back(std::move(ta).value());
        b.push_back(std::move(tb).value());
        bags.push_back(random_bags(rng, 700, static_cast<Key>(t.rows)));
        const std::int64_t n = static_cast<std::int64_t>(bags.back().keys.size());
        const std::int64_t out_rows = t.pooling == Pooling::kNone ? n : 700;
        std::vector<float> g(static_cast<std::size_t>(out_rows * t.dim));
        for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f;
        grads.push_back(std::move(g));
        out_a.emplace_back(static_cast<std::size_t>(out_rows * t.dim), -1.0f);
        out_b.emplace_back(static_cast<std::size_t>(out_rows * t.dim), -2.0f);
      }
      for (std::size_t i = 0; i < std::size(shapes); ++i) {
        const T& t = shapes[i];
        RandomBags& r = bags[i];
        const std::int64_t n = static_cast<std::int64_t>(r.keys.size());
        const BagsView v{r.offsets.data(), 700, r.keys.data(), t.weighted ? r.weights.data() : nullptr};
        bag_of.push_back(bag_of_positions(r.offsets.data(), 700));
        RepeatsScratch scratch;
        find_repeats(r.keys.data(), n, t.rows, repeats[i], scratch);
        const OptimizerStep step = make_optimizer_step(a[i].spec().optimizer, 3);
        // Per table.
        if (t.pooling == Pooling::kNone) {
          gather_rows(a[i].ref(), r.keys.data(), v.weights, n, out_a[i].data());
        } else {
          gather_pool(a[i].ref(), v, t.pooling, out_a[i].data());
        }
        backward_update_by_bag(a[i].ref(), v, t.pooling, repeats[i], bag_of[i].data(), grads[i].data(), step);
        TableBatchItem it;
        it.table = b[i].ref();
        it.bags = v;
        it.pooling = t.pooling;
        it.out = out_b[i].data();
        it.grads = grads[i].data();
        it.repeats = &repeats[i];
        it.bag_of = bag_of[i].data();
        it.step = step;
        items.push_back(it);
      }
      TableBatchScratch scratch;
      gather_pool_tables(items, scratch);
      backward_update_tables(items, scratch);
      for (std::size_t i = 0; i < std::size(shapes); ++i) {
        ASSERT_EQ(std::memcmp(out_a[i].data(), out_b[i].data(), out_a[i].size() * sizeof(float)), 0) << "table " << i;
        const std::int32_t rec = a[i].dim() + a[i].state_dim();
        for (std::int64_t row = 0; row < shapes[i].rows; ++row)
          ASSERT_EQ(std::memcmp(a[i].row(row), b[i].row(row), static_cast<std::size_t>(rec) * sizeof(float)), 0)
              << "table " << i << " row " << row << " (" << threads << " threads)";
      }
    });
  }
}

// Half-size rows (issue 31). Element c of `n` elements of `dtype` at `p`, widened to fp32 (naive:
// core/half.hpp's scalar conversions on the raw bits).
float element_at(const float* p, DType dtype, std::int64_t c) {
  return dtype == DType::kF32 ? p[c] : widen(dtype, testing::half_bits_at(p, c));
}

struct HalfCase {
  int dim;
  DType dtype;
  bool sr;
};

class HalfKernels : public ::testing::TestWithParam<HalfCase> {};

// Every kernel on rows of each element type, bit for bit against the naive loops on the rows
// widened with core/half.hpp: the forward is the row math on the widened rows (fp32 outputs); the
// backward is the row math's reduction and apply_optimizer on the widened record, then each
// updated element rounded as the reference rounds it (stored_value with the bits of (global row,
// step, global column, salt)). For every optimizer, fp32 and bf16 state (where allowed), every
// pooling, with and without per-sample weights, keys used once and repeated; backward_update,
// backward_update_by_bag and the table-batched forms. SR cases use a shard's row and column
// offsets, so the bits must come from global rows and columns. The records' pads stay zero bits.
TEST_P(HalfKernels, EveryKernelMatchesTheRowMathOnWidenedRowsBitForBit) {
  const HalfCase hc = GetParam();
  std::mt19937_64 rng(static_cast<std::uint64_t>(hc.dim * 7 + static_cast<int>(hc.dtype) * 3 + hc.sr));
  for (const OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
    for (const DType state_dtype : {DType::kF32, DType::kBF16}) {
      if (state_dtype != DType::kF32 && (kind == OptimizerKind::kSgd || kind == OptimizerKind::kRowwiseAdagrad))
        continue;
      for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
        for (const bool weighted : {false, true}) {
          TableSpec spec;
          spec.name = "half";
          spec.rows = 150;
          spec.dim = hc.dim;
          spec.dtype = hc.dtype;
          spec.state_dtype = state_dtype;
          spec.stochastic_rounding = hc.sr;
          spec.pooling = pooling;
          spec.init.bound = 1.0f;
          if (hc.sr) {
            spec.init.row_stride = 3;
            spec.init.row_offset = 2;
            spec.init.col_offset = 5;
          }
          spec.optimizer.kind = kind;
          spec.optimizer.learning_rate = 0.3f;
          spec.optimizer.weight_decay = weighted ? 0.02f : 0.0f;
          spec.optimizer.initial_accumulator = 0.1f;
          const std::string what = "dim " + std::to_string(hc.dim) + " " + to_string(hc.dtype) +
                                   (hc.sr ? " sr " : " rne ") + to_string(kind) + " state " + to_string(state_dtype) +
                                   " " + to_string(pooling) + (weighted ? " weighted" : "");
          auto a = HostTable::create(Topology::fake(2), spec, {});
          auto b = HostTable::create(Topology::fake(1), spec, {});
          auto c = HostTable::create(Topology::fake(1), spec, {});
          ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok()) << what << ": " << a.status().message();
          const std::int32_t dim = hc.dim, sd = a->state_dim();
          const std::int64_t rec = dim + sd;
          // The widened records.
          std::vector<float> wide(static_cast<std::size_t>(spec.rows * rec));
          for (std::int64_t r = 0; r < spec.rows; ++r) {
            for (std::int32_t k = 0; k < dim; ++k) wide[r * rec + k] = element_at(a->row(r), hc.dtype, k);
            for (std::int32_t k = 0; k < sd; ++k) wide[r * rec + dim + k] = element_at(a->state(r), state_dtype, k);
          }
          const std::int64_t batch = 40;
          const auto [offsets, keys, weights] = random_bags(rng, batch, 50);  // keys used once and repeated
          const std::int64_t n = static_cast<std::int64_t>(keys.size());
          const BagsView bags{offsets.data(), batch, keys.data(), weighted ? weights.data() : nullptr};
          // Forward: the row math on the widened rows.
          const std::int64_t out_rows = pooling == Pooling::kNone ? n : batch;
          std::vector<float> want_out(static_cast<std::size_t>(out_rows * dim), 0.0f);
          for (std::int64_t bag = 0; bag < batch; ++bag) {
            for (std::int64_t j = offsets[bag]; j < offsets[bag + 1]; ++j) {
              const float* row = wide.data() + keys[j] * rec;
              if (pooling == Pooling::kNone) {
                for (std::int32_t k = 0; k < dim; ++k) want_out[j * dim + k] = weighted ? weights[j] * row[k] : row[k];
              } else if (weighted) {
                row_axpy(want_out.data() + bag * dim, row, weights[j], dim);
              } else {
                row_add(want_out.data() + bag * dim, row, dim);
              }
            }
            const std::int64_t len = offsets[bag + 1] - offsets[bag];
            if (pooling == Pooling::kMean && len) row_scale(want_out.data() + bag * dim, bag_scale(pooling, len), dim);
          }
          std::vector<float> out(want_out.size(), -1.0f), out_c(want_out.size(), -2.0f);
          if (pooling == Pooling::kNone) {
            gather_rows(a->ref(), keys.data(), bags.weights, n, out.data());
          } else {
            gather_pool(a->ref(), bags, pooling, out.data());
          }
          for (std::size_t i = 0; i < out.size(); ++i)
            ASSERT_EQ(bits_of(out[i]), bits_of(want_out[i])) << what << ": output " << i;
          // Backward: the row math on the widened records, then each updated element rounded.
          std::vector<float> grads(want_out.size());
          for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f;
          const UniqueKeys unique = dedup_keys(keys.data(), n);
          const std::vector<std::int32_t> bag_of = bag_of_positions(offsets.data(), batch);
          const OptimizerStep step = make_optimizer_step(spec, 4);
          std::vector<float> want = wide;
          row_math_update(want, rec, dim, bags, pooling, unique, bag_of, grads, step);
          for (std::int64_t u = 0; u < unique.size(); ++u) {
            float* w = want.data() + unique.keys[u] * rec;
            const std::uint64_t key = step.round.row_key(unique.keys[u], RoundingSalt::kWeights);
            for (std::int32_t k = 0; k < dim; ++k) w[k] = stored_value(step.round, hc.dtype, key, k, w[k]);
            for (std::int32_t v = 0; v * dim < sd && state_dtype != DType::kF32; ++v) {
              const std::uint64_t skey = step.round.row_key(unique.keys[u], static_cast<RoundingSalt>(1 + v));
              for (std::int32_t k = 0; k < dim; ++k)
                w[dim + v * dim + k] = stored_value(step.round, state_dtype, skey, k, w[dim + v * dim + k]);
            }
          }
          backward_update(a->ref(), bags, pooling, view_of(unique), bag_of.data(), grads.data(), step);
          Repeats repeats;
          RepeatsScratch rs;
          find_repeats(keys.data(), n, spec.rows, repeats, rs);
          backward_update_by_bag(b->ref(), bags, pooling, repeats, bag_of.data(), grads.data(), step);
          TableBatchItem it;
          it.table = c->ref();
          it.bags = bags;
          it.pooling = pooling;
          it.out = out_c.data();
          it.grads = grads.data();
          it.repeats = &repeats;
          it.bag_of = bag_of.data();
          it.step = step;
          TableBatchScratch ts;
          gather_pool_tables({it}, ts);
          ASSERT_EQ(std::memcmp(out_c.data(), out.data(), out.size() * sizeof(float)), 0) << what;
          backward_update_tables({it}, ts);
          for (const HostTable* t : {&a.value(), &b.value(), &c.value()})
            for (std::int64_t r = 0; r < spec.rows; ++r) {
              for (std::int32_t k = 0; k < dim; ++k)
                ASSERT_EQ(bits_of(element_at(t->row(r), hc.dtype, k)), bits_of(want[r * rec + k]))
                    << what << ": table "
                    << (t == &a.value()   ? "a"
                        : t == &b.value() ? "b"
                                          : "c")
                    << " row " << r << " col " << k;
              for (std::int32_t k = 0; k < sd; ++k)
                ASSERT_EQ(bits_of(element_at(t->state(r), state_dtype, k)), bits_of(want[r * rec + dim + k]))
                    << what << ": state, row " << r << " col " << k;
              ASSERT_TRUE(testing::record_pads_are_zero(t->ref(), r)) << what;
            }
        }
      }
    }
  }
}

// Half-size outputs and gradients (TableBatchItem::out_dtype): in one table-batched call, each
// half-output item's outputs are its fp32 twin's outputs rounded to nearest even (the fp32 sums
// rounded once per output row), and writes nothing past them; its update from half gradients is
// the twin's update from those gradients widened, bit for bit. Rows fp32, bf16 and fp16; dims of
// the register kernels (16, 64, 144, 256) and the run-time ones (1, 17, 272); every pooling, with
// and without weights; every optimizer (bf16 state for some, so the run-time-dim update too).
TEST(HalfOutputs, TableBatchedKernelsRoundOutputsAndWidenGradientsBitForBit) {
  std::mt19937_64 rng(2311);
  const std::int32_t dims[] = {1, 16, 17, 64, 144, 256, 272};
  // Two runs per output dtype with complementary halves of the items in half outputs, so that every
  // item (pooling, weights, optimizer, state dtype, dim) has half outputs in one of them.
  for (const auto& run : std::vector<std::pair<DType, std::size_t>>{
           {DType::kBF16, 0}, {DType::kBF16, 1}, {DType::kF16, 0}, {DType::kF16, 1}}) {
    const DType out_dtype = run.first;
    const std::size_t half_parity = run.second;
    std::vector<HostTable> twins, halves;
    std::vector<RandomBags> bags;
    std::vector<std::vector<float>> out32, out16, g32, g16;
    std::vector<Repeats> repeats;
    std::vector<std::vector<std::int32_t>> bag_of;
    std::vector<std::string> what;
    const std::size_t n_items = 3 * std::size(dims) * 3;  // row dtypes x dims x poolings
    bags.reserve(n_items);                                // the items point into them
    repeats.resize(n_items);
    std::vector<TableBatchItem> items32, items16;
    int i = 0;
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const std::int32_t dim : dims) {
        for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
          TableSpec spec;
          spec.name = "t" + std::to_string(i);
          spec.rows = 90;
          spec.dim = dim;
          spec.dtype = dtype;
          spec.pooling = pooling;
          spec.init.bound = 1.0f;
          spec.init.seed = static_cast<std::uint64_t>(i);
          spec.optimizer.kind = static_cast<OptimizerKind>(i % 4);
          const bool state_allowed =
              spec.optimizer.kind == OptimizerKind::kAdagrad || spec.optimizer.kind == OptimizerKind::kAdam;
          if (state_allowed && i % 3 == 0) spec.state_dtype = DType::kBF16;
          spec.stochastic_rounding = dtype != DType::kF32 && i % 2 == 0;
          spec.optimizer.learning_rate = 0.3f;
          spec.optimizer.weight_decay = i % 5 == 0 ? 0.02f : 0.0f;
          spec.optimizer.initial_accumulator = 0.1f;
          const bool weighted = (i / 3) % 2 == 1;
          what.push_back(spec.name + " " + to_string(dtype) + " dim " + std::to_string(dim) + " " + to_string(pooling) +
                         (weighted ? " weighted" : "") + " -> " + to_string(out_dtype));
          auto a = HostTable::create(Topology::fake(1), spec, {});
          auto b = HostTable::create(Topology::fake(1), spec, {});
          ASSERT_TRUE(a.is_ok() && b.is_ok()) << what.back();
          twins.push_back(std::move(a).value());
          halves.push_back(std::move(b).value());
          const std::int64_t batch = 45;
          bags.push_back(random_bags(rng, batch, 60));  // keys used once and repeated; empty bags
          const RandomBags& r = bags.back();
          const std::int64_t n = static_cast<std::int64_t>(r.keys.size());
          const std::int64_t out_rows = pooling == Pooling::kNone ? n : batch;
          const auto elems = static_cast<std::size_t>(out_rows * dim);
          out32.emplace_back(elems, -1.0f);
          out16.emplace_back(elems, -3.0f);  // half elements use its first half; the rest must stay
          g16.emplace_back(elems, -3.0f);
          g32.emplace_back(elems);
          std::vector<std::uint16_t> h(elems);
          for (std::size_t k = 0; k < elems; ++k) {
            h[k] = narrow(out_dtype, static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f, false, 0);
            g32.back()[k] = widen(out_dtype, h[k]);
          }
          if (elems) std::memcpy(g16.back().data(), h.data(), elems * sizeof(std::uint16_t));
          bag_of.push_back(bag_of_positions(r.offsets.data(), batch));
          RepeatsScratch rs;
          find_repeats(r.keys.data(), n, spec.rows, repeats[static_cast<std::size_t>(i)], rs);
          TableBatchItem it;
          it.bags = BagsView{r.offsets.data(), batch, r.keys.data(), weighted ? r.weights.data() : nullptr};
          it.pooling = pooling;
          it.repeats = &repeats[static_cast<std::size_t>(i)];
          it.bag_of = bag_of.back().data();
          it.step = make_optimizer_step(spec, 2);
          items32.push_back(it);
          items16.push_back(it);
          ++i;
        }
      }
    }
    for (std::size_t k = 0; k < items32.size(); ++k) {
      items32[k].table = twins[k].ref();
      items32[k].out = out32[k].data();
      items32[k].grads = g32[k].data();
      items16[k].table = halves[k].ref();
      items16[k].out = out16[k].data();
      items16[k].grads = g16[k].data();
      items16[k].out_dtype = out_dtype;
    }
    // Half outputs in one call with fp32 ones: every other item's outputs are fp32.
    for (std::size_t k = 1 - half_parity; k < items16.size(); k += 2) {
      items16[k].out_dtype = DType::kF32;
      items16[k].grads = g32[k].data();
    }
    TableBatchScratch scratch;
    gather_pool_tables(items32, scratch);
    gather_pool_tables(items16, scratch);
    for (std::size_t k = 0; k < items16.size(); ++k) {
      const std::vector<float>& o32 = out32[k];
      if (items16[k].out_dtype == DType::kF32) {
        ASSERT_EQ(std::memcmp(out16[k].data(), o32.data(), o32.size() * sizeof(float)), 0) << what[k];
        continue;
      }
      for (std::size_t e = 0; e < o32.size(); ++e)
        ASSERT_EQ(testing::half_bits_at(out16[k].data(), static_cast<std::int64_t>(e)),
                  narrow(out_dtype, o32[e], false, 0))
            << what[k] << ": output element " << e << " of " << o32.size();
      for (std::size_t e = (o32.size() + 1) / 2; e < o32.size(); ++e)
        ASSERT_EQ(bits_of(out16[k][e]), bits_of(-3.0f)) << what[k] << ": wrote past the half outputs, float " << e;
    }
    backward_update_tables(items32, scratch);
    backward_update_tables(items16, scratch);
    for (std::size_t k = 0; k < items16.size(); ++k) {
      const RowRef a = twins[k].ref(), b = halves[k].ref();
      const std::size_t words = static_cast<std::size_t>(a.row_words() + a.state_words());
      for (std::int64_t r = 0; r < 90; ++r)
        ASSERT_EQ(std::memcmp(a.row(r), b.row(r), words * sizeof(float)), 0) << what[k] << ": row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfKernels,
                         ::testing::Values(HalfCase{1, DType::kBF16, false}, HalfCase{17, DType::kBF16, true},
                                           HalfCase{16, DType::kBF16, false}, HalfCase{64, DType::kBF16, true},
                                           HalfCase{3, DType::kF16, true}, HalfCase{48, DType::kF16, false},
                                           HalfCase{128, DType::kF16, true}, HalfCase{32, DType::kF32, false}));

INSTANTIATE_TEST_SUITE_P(Shapes, Kernels,
                         ::testing::Values(Case{1, Pooling::kSum, false, 1}, Case{3, Pooling::kMean, true, 2},
                                           Case{16, Pooling::kSum, true, 1}, Case{17, Pooling::kNone, false, 3},
                                           Case{64, Pooling::kMean, false, 2}, Case{128, Pooling::kSum, false, 1},
                                           Case{5, Pooling::kNone, true, 1}, Case{256, Pooling::kMean, true, 4}));

}  // namespace
}  // namespace strata
