// The reference store with half-size elements (issue 31): bf16 and fp16 rows, bf16 optimizer state,
// stochastic rounding and half-size outputs, and every placement of one rank against it: `cpu` and
// `offload` with the CPU gather (the host kernels), `gpu`, `cached`, `hybrid` and `offload` with the
// device gather (the shared device kernels, on the emu device). Sharded tables: sharded_harness.hpp.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "dispatch/local_communicator.hpp"
#include "gpu/device.hpp"
#include "store/store.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/half_tables.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using testing::Buffers;
using testing::half_config;
using testing::mixed_dtypes_config;
using testing::Snapshot;

// `c` with every table's outputs and gradients of `out`.
StoreConfig with_output_dtype(StoreConfig c, DType out) {
  for (TableConfig& t : c.tables) t.spec.output_dtype = out;
  return c;
}

std::unique_ptr<Store> open_reference(const StoreConfig& c) {
  auto s = open_reference_store(c);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Whether every weight and state element of `s` is a value of its table's element type.
::testing::AssertionResult representable(const StoreConfig& c, const Snapshot& s) {
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    const TableSpec& spec = c.tables[t].spec;
    for (float w : s.weights[t])
      if (!same_bits(rounded(spec.dtype, w, false, 0), w))
        return ::testing::AssertionFailure()
               << "table " << spec.name << ": weight " << w << " is no " << to_string(spec.dtype);
    for (float v : s.state[t])
      if (!same_bits(rounded(spec.state_dtype, v, false, 0), v))
        return ::testing::AssertionFailure()
               << "table " << spec.name << ": state " << v << " is no " << to_string(spec.state_dtype);
  }
  return ::testing::AssertionSuccess();
}

// Trains `steps` random batches (seeded by `seed`) and returns the final rows and state, checking
// after every step that they are values of their element types.
Snapshot train(const StoreConfig& c, std::uint64_t seed, int steps) {
  auto store = open_reference(c);
  if (!store) return {};
  std::mt19937_64 rng(seed);
  for (int step = 1; step <= steps; ++step) {
    const KeyBatch kb = testing::random_batch(rng, c, 6);
    Buffers b = testing::make_buffers(c, kb);
    EXPECT_TRUE(store->submit(step, kb).is_ok());
    EXPECT_TRUE(store->forward(step, b.views).is_ok());
    testing::fill_random(rng, b);
    EXPECT_TRUE(store->backward(step, b.cviews).is_ok());
    EXPECT_TRUE(representable(c, testing::snapshot(*store))) << "after step " << step;
  }
  return testing::snapshot(*store);
}

}  // namespace

// A half-size table starts as the fp32 table rounded to nearest, optimizer state included (an
// initial_accumulator of 0.1 is no bf16).
TEST(ReferenceHalf, InitialRowsAreTheFp32RowsRoundedToNearest) {
  std::mt19937_64 rng(131);
  const StoreConfig fp32 = testing::random_config(rng, 6);
  auto base = open_reference(fp32);
  ASSERT_TRUE(base);
  const Snapshot want = testing::snapshot(*base);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const StoreConfig c = half_config(fp32, dtype, false);
    auto half = open_reference(c);
    ASSERT_TRUE(half);
    const Snapshot got = testing::snapshot(*half);
    for (std::size_t t = 0; t < c.tables.size(); ++t) {
      const TableSpec& spec = c.tables[t].spec;
      for (std::size_t i = 0; i < want.weights[t].size(); ++i)
        ASSERT_TRUE(same_bits(got.weights[t][i], widen(dtype, narrow(dtype, want.weights[t][i], false, 0))))
            << spec.name << " weight " << i;
      for (std::size_t i = 0; i < want.state[t].size(); ++i)
        ASSERT_TRUE(same_bits(got.state[t][i], rounded(spec.state_dtype, want.state[t][i], false, 0)))
            << spec.name << " state " << i;
    }
  }
}

// Updates are rounded into the element types after every step; the rounding bits are a pure
// function of the config and the batches, so a second run gives the same bits, and stochastic
// rounding gives other rows than rounding to nearest.
TEST(ReferenceHalf, UpdatedRowsStayRepresentableAndRepeatBitForBit) {
  std::mt19937_64 rng(7);
  const StoreConfig fp32 = testing::random_config(rng, 5);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const StoreConfig rne = half_config(fp32, dtype, false), sr = half_config(fp32, dtype, true);
    const Snapshot a = train(sr, 99, 6), b = train(sr, 99, 6), n = train(rne, 99, 6);
    EXPECT_TRUE(testing::same_state(a, b)) << to_string(dtype);
    EXPECT_FALSE(testing::same_state(a, n)) << to_string(dtype) << ": stochastic rounding changed nothing";
  }
}

// Updates smaller than half a bf16 step: rounding to nearest puts every weight back where it was
// (a bias of the whole update), stochastic rounding moves it by the update on average.
TEST(ReferenceHalf, StochasticRoundingIsUnbiasedWhereRoundingToNearestStalls) {
  StoreConfig c;
  TableConfig t;
  t.spec.name = "slow";
  t.spec.rows = 16;
  t.spec.dim = 64;
  t.spec.dtype = DType::kBF16;
  t.spec.optimizer.learning_rate = 1.0f / 1024;  // bf16 steps below 1.0 are 2^-8: a quarter of one
  c.tables.push_back(t);
  KeyBatch kb;
  JaggedKeys& f = kb.features.emplace_back();
  f.table = "slow";
  for (Key k = 0; k < 16; ++k) {
    f.offsets.push_back(k);
    f.keys.push_back(k);
  }
  f.offsets.push_back(16);
  constexpr int kSteps = 64;
  for (const bool sr : {false, true}) {
    c.tables[0].spec.stochastic_rounding = sr;
    auto store = open_reference(c);
    ASSERT_TRUE(store);
    const std::vector<float> ones(16 * 64, 1.0f);
    ASSERT_TRUE(store->write_rows(0, 0, 16, ones.data(), nullptr).is_ok());
    for (int step = 1; step <= kSteps; ++step) {
      Buffers b = testing::make_buffers(c, kb);
      ASSERT_TRUE(store->submit(step, kb).is_ok());
      ASSERT_TRUE(store->forward(step, b.views).is_ok());
      for (auto& g : b.data) g.assign(g.size(), 1.0f);
      ASSERT_TRUE(store->backward(step, b.cviews).is_ok());
    }
    const Snapshot s = testing::snapshot(*store);
    double sum = 0;
    for (float w : s.weights[0]) sum += w;
    const double mean = sum / static_cast<double>(s.weights[0].size());
    const double exact = 1.0 - kSteps / 1024.0;  // 0.9375
    if (sr)
      EXPECT_NEAR(mean, exact, 0.004);
    else
      EXPECT_EQ(mean, 1.0);
  }
}

// The TableSpec of feature f of kb in c.
const TableSpec& spec_of(const StoreConfig& c, const JaggedKeys& f) {
  for (const TableConfig& t : c.tables)
    if (t.spec.name == f.table) return t.spec;
  return c.tables.front().spec;
}

// make_buffers with each view of its table's output_dtype (a half-size view uses the first half of
// its fp32 buffer; the rest stays zero, so a store writing past it is seen).
Buffers typed_buffers(const StoreConfig& c, const KeyBatch& kb) {
  Buffers b = testing::make_buffers(c, kb);
  for (std::size_t i = 0; i < kb.features.size(); ++i) {
    b.views[i].dtype = spec_of(c, kb.features[i]).output_dtype;
    b.cviews[i].dtype = b.views[i].dtype;
  }
  return b;
}

// fill_random, then each half-size view's elements the random values rounded to nearest, packed.
void fill_gradients(std::mt19937_64& rng, const StoreConfig& c, const KeyBatch& kb, Buffers& b) {
  testing::fill_random(rng, b);
  for (std::size_t i = 0; i < kb.features.size(); ++i) {
    const DType out = spec_of(c, kb.features[i]).output_dtype;
    if (out == DType::kF32) continue;
    std::vector<float>& d = b.data[i];
    std::vector<std::uint16_t> bits(d.size());
    for (std::size_t k = 0; k < d.size(); ++k) bits[k] = narrow(out, d[k], false, 0);
    std::fill(d.begin(), d.end(), 0.0f);
    if (!bits.empty()) std::memcpy(d.data(), bits.data(), bits.size() * sizeof(std::uint16_t));
  }
}

// How the store under test takes its outputs and gradients (the reference's: host views, synchronous calls).
enum class Views { kHost, kDevice, kDeviceOrdered };
const char* to_string(Views v) {
  return v == Views::kHost ? "host views" : v == Views::kDevice ? "device views" : "device views, stream-ordered";
}

// Runs `steps` random batches (seeded by `seed`) through the reference and a store of config `c` (its
// tables' placements) side by side: the outputs of every step and the rows and state at the end
// must be the same bits. Views are of their tables' output_dtype (the store's as `views` says:
// testing::run_step); batches of `bags` bags.
::testing::AssertionResult store_matches_reference(const StoreConfig& c, std::uint64_t seed, int steps,
                                                   std::int64_t bags = 6, Views views = Views::kHost) {
  auto ref = open_reference(c);
  auto opened = Store::open(c);
  if (!ref || !opened.is_ok()) return ::testing::AssertionFailure() << "open: " << opened.status().to_string();
  Store& store = *opened.value();
  testing::StepMode mode;
  mode.device = views != Views::kHost;
  gpu::Stream stream;
  if (views == Views::kDeviceOrdered) {
    auto made = store.device()->create_stream();
    if (!made.is_ok()) return ::testing::AssertionFailure() << made.status().to_string();
    stream = std::move(made).value();
    mode.stream = stream.view();
  }
  std::mt19937_64 batches(seed);
  for (int step = 1; step <= steps; ++step) {
    const KeyBatch kb = testing::random_batch(batches, c, bags);
    Buffers a = typed_buffers(c, kb), b = typed_buffers(c, kb), g = typed_buffers(c, kb);
    fill_gradients(batches, c, kb, g);
    if (!ref->submit(step, kb).is_ok() || !store.submit(step, kb).is_ok() || !ref->forward(step, a.views).is_ok())
      return ::testing::AssertionFailure() << "step " << step << ": submit or forward failed";
    const Status ra = ref->backward(step, g.cviews), rb = testing::run_step(store, step, g, b, mode);
    if (!ra.is_ok() || !rb.is_ok())
      return ::testing::AssertionFailure()
             << "step " << step << ": a step failed: " << ra.to_string() << " / " << rb.to_string();
    const auto outputs = testing::same_outputs(a, b);
    if (!outputs) return ::testing::AssertionFailure() << "step " << step << " outputs: " << outputs.message();
  }
  return testing::same_state(testing::snapshot(*ref), testing::snapshot(store));
}

// A `cpu` store of half-size tables (bf16 state where the optimizer allows it; rounding to nearest
// and stochastic) gives the reference's bits: the outputs of every step, the rows and state at the
// end (the host kernels widen, compute in fp32 and round as the reference does).
TEST(ReferenceHalf, CpuStoreMatchesTheReferenceBitForBit) {
  std::mt19937_64 rng(57);
  StoreConfig fp32 = testing::random_config(rng, 6);
  for (TableConfig& t : fp32.tables) t.placement = Placement::kCpu;
  for (const DType dtype : {DType::kBF16, DType::kF16})
    for (const bool sr : {false, true})
      EXPECT_TRUE(store_matches_reference(half_config(fp32, dtype, sr), 5, 5)) << to_string(dtype) << (sr ? " sr" : "");
}

// Those tables in a `cpu` store give the reference's bits.
TEST(ReferenceHalf, CpuStoreOfFp32AndHalfTablesInOneBatchMatchesTheReference) {
  EXPECT_TRUE(store_matches_reference(mixed_dtypes_config(Placement::kCpu), 9, 6));
}

// `offload` with the CPU gather pools and updates its host rows with the `cpu` placement's host
// kernels: half-size rows and state (rounding to nearest and stochastic, alone and beside fp32
// tables of other dims) give the reference's bits. Its outputs and gradients stay fp32 (pinned
// staging, then H2D into device views).
TEST(ReferenceHalf, OffloadWithTheCpuGatherMatchesTheReferenceBitForBit) {
  std::mt19937_64 rng(57);
  StoreConfig fp32 = testing::random_config(rng, 6);
  fp32.device.backend = BackendChoice::kEmu;
  fp32.offload_gather = OffloadGather::kCpu;
  for (TableConfig& t : fp32.tables) t.placement = Placement::kOffload;
  for (const DType dtype : {DType::kBF16, DType::kF16})
    for (const bool sr : {false, true})
      EXPECT_TRUE(store_matches_reference(half_config(fp32, dtype, sr), 5, 5)) << to_string(dtype) << (sr ? " sr" : "");
  StoreConfig mixed = mixed_dtypes_config(Placement::kOffload);
  mixed.device.backend = BackendChoice::kEmu;
  mixed.offload_gather = OffloadGather::kCpu;
  EXPECT_TRUE(store_matches_reference(mixed, 9, 6));
}

// `cpu` tables of half-size outputs and gradients (bf16, fp16) beside fp32 ones, of fp32, bf16 and
// fp16 rows, of dims that take the register kernels (multiples of 16 up to 256) and the run-time
// ones (odd, and above 256), every pooling, with and without per-sample weights, empty bags and
// repeated keys: every forward and backward is one table-batched call over all of them, and gives
// the reference's bits (outputs rounded to nearest from the fp32 sums once per bag, gradients
// widened where read).
TEST(ReferenceHalf, CpuStoreOfHalfOutputsMatchesTheReferenceBitForBit) {
  std::mt19937_64 rng(113);
  StoreConfig c = testing::random_config(rng, 27);
  const std::int32_t dims[] = {16, 7,  64, 48, 128, 31,  3, 1,   32, 144, 256, 130, 272, 33,
                               80, 96, 2,  17, 160, 240, 5, 112, 8,  208, 63,  176, 224};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (std::size_t i = 0; i < c.tables.size(); ++i) {  // every (rows, pooling, outputs) triple
    TableSpec& s = c.tables[i].spec;
    c.tables[i].placement = Placement::kCpu;
    s.dim = dims[i];
    s.dtype = dtypes[i % 3];
    s.pooling = static_cast<Pooling>((i / 3) % 3);
    s.output_dtype = dtypes[(i / 9 + 1) % 3];
    s.optimizer.kind = static_cast<OptimizerKind>((i / 2) % 4);
    const bool state_allowed = s.optimizer.kind == OptimizerKind::kAdagrad || s.optimizer.kind == OptimizerKind::kAdam;
    if (state_allowed && i % 4 == 1) s.state_dtype = DType::kBF16;
    s.stochastic_rounding = (s.dtype != DType::kF32 || s.state_dtype != DType::kF32) && i % 5 < 2;
  }
  EXPECT_TRUE(store_matches_reference(c, 17, 6));
  // Batches of more bags: the kernels' chunks and tasks split them.
  for (TableConfig& t : c.tables) t.spec.rows = 2000;
  EXPECT_TRUE(store_matches_reference(c, 29, 3, 700));
}

// A `cpu` store of half-size outputs refuses output and gradient views of another dtype, naming the
// table and both dtypes, and a half-size gradient holding -Inf, and changes nothing.
TEST(ReferenceHalf, CpuStoreRefusesViewsOfAnotherDtype) {
  std::mt19937_64 rng(37);
  StoreConfig c = testing::random_config(rng, 2);
  for (TableConfig& t : c.tables) {
    t.placement = Placement::kCpu;
    t.spec.output_dtype = DType::kBF16;
  }
  auto cpu = Store::open(c);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  Store& store = *cpu.value();
  const KeyBatch kb = testing::random_batch(rng, c, 4);
  Buffers b = typed_buffers(c, kb);
  ASSERT_TRUE(store.submit(1, kb).is_ok());
  const Snapshot before = testing::snapshot(store);
  b.views[0].dtype = DType::kF32;
  const Status f = store.forward(1, b.views);
  EXPECT_EQ(f.code(), StatusCode::kInvalidArgument);
  const std::string table = "table '" + kb.features[0].table + "'";
  EXPECT_NE(f.message().find(table), std::string::npos) << f.message();
  EXPECT_NE(f.message().find("output view dtype fp32 (expected bf16: the table's output_dtype)"), std::string::npos)
      << f.message();
  b.views[0].dtype = DType::kBF16;
  ASSERT_TRUE(store.forward(1, b.views).is_ok());
  std::fill(b.data[0].begin(), b.data[0].end(), 0.0f);
  b.cviews[0].dtype = DType::kF16;
  const Status g = store.backward(1, b.cviews);
  EXPECT_EQ(g.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.message().find(table), std::string::npos) << g.message();
  EXPECT_NE(g.message().find("gradient view dtype fp16 (expected bf16: the table's output_dtype)"), std::string::npos)
      << g.message();
  EXPECT_TRUE(testing::same_state(testing::snapshot(store), before));
  // A bf16 gradient holding -Inf (the host finite check reads half-size views) is refused too.
  b.cviews[0].dtype = DType::kBF16;
  const std::int64_t last = b.cviews[0].rows * b.cviews[0].cols - 1;
  ASSERT_GE(last, 0);
  const std::uint16_t minus_inf = 0xff80u;
  std::memcpy(reinterpret_cast<unsigned char*>(b.data[0].data()) + 2 * last, &minus_inf, sizeof minus_inf);
  const Status n = store.backward(1, b.cviews);
  EXPECT_EQ(n.code(), StatusCode::kInvalidArgument) << n.to_string();
  EXPECT_NE(n.message().find(table + ": gradient of "), std::string::npos) << n.message();
  EXPECT_NE(n.message().find(" is -inf"), std::string::npos) << n.message();
  EXPECT_TRUE(testing::same_state(testing::snapshot(store), before));
  std::fill(b.data[0].begin(), b.data[0].end(), 0.0f);
  const Status ok = store.backward(1, b.cviews);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
}

// A learning rate of 0 keeps half-size rows as they are, bit for bit (a -0.0 weight included),
// whether the update is the fused one (dims of multiples of 16) or the widened one, rounding to
// nearest or stochastically; the state still advances, as the reference's does.
TEST(ReferenceHalf, CpuLearningRateZeroKeepsHalfRowsBitForBit) {
  std::mt19937_64 rng(83);
  StoreConfig fp32 = testing::random_config(rng, 8);
  const std::int32_t dims[] = {16, 7, 64, 3, 128, 32, 48, 1};
  for (std::size_t i = 0; i < fp32.tables.size(); ++i) {
    fp32.tables[i].placement = Placement::kCpu;
    fp32.tables[i].spec.dim = dims[i];
    fp32.tables[i].spec.optimizer.kind = static_cast<OptimizerKind>(i % 4);
    fp32.tables[i].spec.optimizer.learning_rate = 0.0f;
  }
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const bool sr : {false, true}) {
      StoreConfig c = half_config(fp32, dtype, sr);
      c.tables[5].spec.state_dtype = DType::kF32;  // adagrad, dim 32: the fused update
      const std::string what = std::string(to_string(dtype)) + (sr ? " sr" : " rne");
      auto ref = open_reference(c);
      auto cpu = Store::open(c);
      ASSERT_TRUE(ref && cpu.is_ok()) << what << ": " << cpu.status().to_string();
      for (std::size_t t = 0; t < c.tables.size(); ++t) {  // row 0 all -0.0
        const std::vector<float> zeros(static_cast<std::size_t>(c.tables[t].spec.dim), -0.0f);
        ASSERT_TRUE(ref->write_rows(static_cast<int>(t), 0, 1, zeros.data(), nullptr).is_ok());
        ASSERT_TRUE(cpu.value()->write_rows(static_cast<int>(t), 0, 1, zeros.data(), nullptr).is_ok());
      }
      const Snapshot before = testing::snapshot(*cpu.value());
      std::mt19937_64 batches(3);
      for (int step = 1; step <= 4; ++step) {
        const KeyBatch kb = testing::random_batch(batches, c, 6);
        Buffers a = testing::make_buffers(c, kb), b = testing::make_buffers(c, kb);
        ASSERT_TRUE(ref->submit(step, kb).is_ok() && cpu.value()->submit(step, kb).is_ok());
        ASSERT_TRUE(ref->forward(step, a.views).is_ok() && cpu.value()->forward(step, b.views).is_ok());
        testing::fill_random(batches, a);
        for (std::size_t i = 0; i < a.data.size(); ++i)
          std::copy(a.data[i].begin(), a.data[i].end(), b.data[i].begin());
        ASSERT_TRUE(ref->backward(step, a.cviews).is_ok() && cpu.value()->backward(step, b.cviews).is_ok());
      }
      Snapshot after = testing::snapshot(*cpu.value());
      for (std::size_t t = 0; t < c.tables.size(); ++t)
        for (std::size_t i = 0; i < before.weights[t].size(); ++i)
          ASSERT_TRUE(same_bits(after.weights[t][i], before.weights[t][i]))
              << what << " table " << c.tables[t].spec.name << " weight " << i << ": " << before.weights[t][i]
              << " became " << after.weights[t][i];
      EXPECT_TRUE(testing::same_state(testing::snapshot(*ref), after)) << what;
    }
  }
}

// write_rows into a `cpu` store's half-size tables rounds each value to nearest even (weights and
// a bf16 state), as the reference's does, and read_rows gives the stored values widened.
TEST(ReferenceHalf, CpuWriteRowsRoundsToNearestAndReadRowsWidens) {
  std::mt19937_64 rng(91);
  StoreConfig fp32 = testing::random_config(rng, 6);
  for (TableConfig& t : fp32.tables) t.placement = Placement::kCpu;
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const StoreConfig c = half_config(fp32, dtype, true);
    auto ref = open_reference(c);
    auto cpu = Store::open(c);
    ASSERT_TRUE(ref && cpu.is_ok()) << cpu.status().to_string();
    std::vector<std::vector<float>> weights, state;
    for (std::size_t t = 0; t < c.tables.size(); ++t) {
      const TableSpec& spec = c.tables[t].spec;
      const std::int64_t n = std::min<std::int64_t>(spec.rows, 5), row0 = spec.rows - n;
      const std::int32_t sd = optimizer_state_dim(spec.optimizer.kind, spec.dim);
      weights.emplace_back(static_cast<std::size_t>(n * spec.dim));
      state.emplace_back(static_cast<std::size_t>(n * sd));
      for (float& w : weights.back()) w = value(rng);
      for (float& v : state.back()) v = std::abs(value(rng));
      const float* st = sd ? state.back().data() : nullptr;
      ASSERT_TRUE(ref->write_rows(static_cast<int>(t), row0, n, weights.back().data(), st).is_ok());
      ASSERT_TRUE(cpu.value()->write_rows(static_cast<int>(t), row0, n, weights.back().data(), st).is_ok());
      std::vector<float> w(weights.back().size()), s(state.back().size());
      ASSERT_TRUE(cpu.value()->read_rows(static_cast<int>(t), row0, n, w.data(), sd ? s.data() : nullptr).is_ok());
      for (std::size_t i = 0; i < w.size(); ++i)
        ASSERT_TRUE(same_bits(w[i], rounded(dtype, weights.back()[i], false, 0)))
            << to_string(dtype) << " table " << spec.name << " weight " << i << ": wrote " << weights.back()[i]
            << ", read " << w[i];
      for (std::size_t i = 0; i < s.size(); ++i)
        ASSERT_TRUE(same_bits(s[i], rounded(spec.state_dtype, state.back()[i], false, 0)))
            << to_string(dtype) << " table " << spec.name << " state " << i;
    }
    EXPECT_TRUE(testing::same_state(testing::snapshot(*ref), testing::snapshot(*cpu.value()))) << to_string(dtype);
  }
}

// Every placement opens tables of half-size rows and of half-size outputs and gradients: `cpu`,
// `offload` (both gathers), `cached`, `gpu` and `hybrid` without a communicator, and `gpu` and
// `hybrid` with one (the sharded engine, even a world of one).
TEST(ReferenceHalf, EveryPlacementOpensHalfRowsAndHalfOutputs) {
  StoreConfig c;
  c.device.backend = BackendChoice::kEmu;
  c.tables.resize(1);
  c.tables[0].spec.name = "clicks";
  c.tables[0].spec.rows = 8;
  c.tables[0].spec.dim = 4;
  for (const Placement p : {Placement::kGpu, Placement::kHybrid})
    for (const DType out : {DType::kBF16, DType::kF16}) {
      std::shared_ptr<dispatch::Communicator> comm = std::move(dispatch::make_local_group(1).value().front());
      c.tables[0].placement = p;
      c.tables[0].spec.output_dtype = out;
      const auto s = Store::open(c, comm);
      EXPECT_TRUE(s.is_ok()) << to_string(p) << " " << to_string(out) << ": " << s.status().to_string();
    }
  for (const Placement p :
       {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu, Placement::kHybrid})
    for (const OffloadGather g : {OffloadGather::kDevice, OffloadGather::kCpu})
      for (const DType out : {DType::kBF16, DType::kF16})
        for (const bool rows : {false, true}) {
          c.tables[0].placement = p;
          c.offload_gather = g;
          c.tables[0].spec.dtype = rows ? out : DType::kF32;
          c.tables[0].spec.output_dtype = rows ? DType::kF32 : out;
          const auto s = Store::open(c);
          EXPECT_TRUE(s.is_ok()) << to_string(p) << " " << to_string(out) << (rows ? " rows: " : " outputs: ")
                                 << s.status().to_string();
        }
}

// `c` on the emu device with every table in `placement`: `offload` with the device gather, `cached`
// and `hybrid` with caches of 12 rows, which batches of up to 30 distinct rows overflow (rows served
// outside the cache) and rows are evicted and written back every step.
StoreConfig on_device(StoreConfig c, Placement placement) {
  c.device.backend = BackendChoice::kEmu;
  c.offload_gather = OffloadGather::kDevice;
  for (TableConfig& t : c.tables) {
    t.placement = placement;
    if (placement == Placement::kCached || placement == Placement::kHybrid)
      t.cache.rows = std::min<std::int64_t>(t.spec.rows, 12);
  }
  return c;
}

// The device placements store half-size rows and state in their slots and the offload device
// gather reads them from host memory (the shared kernels widen, compute in fp32 and round once, as
// the reference does): `gpu`, `cached` (small caches), `hybrid` (a world of one: on one rank the
// store serves it with the `cached` engine, so this iteration repeats `cached`'s; the sharded
// half cases of tests/store/sharded_harness.hpp run `hybrid`'s own) and `offload` with
// the device gather give the reference's bits, every table half (bf16 and fp16, rounding to nearest
// and stochastic, bf16 state where the optimizer allows it), and fp32 and half tables of several
// dims in one table-batched call.
TEST(ReferenceHalf, DevicePlacementsMatchTheReferenceBitForBit) {
  for (const Placement p : {Placement::kGpu, Placement::kCached, Placement::kHybrid, Placement::kOffload}) {
    std::mt19937_64 rng(57);
    const StoreConfig fp32 = on_device(testing::random_config(rng, 6), p);
    for (const DType dtype : {DType::kBF16, DType::kF16})
      for (const bool sr : {false, true})
        EXPECT_TRUE(store_matches_reference(half_config(fp32, dtype, sr), 5, 4))
            << to_string(p) << " " << to_string(dtype) << (sr ? " sr" : "");
    EXPECT_TRUE(store_matches_reference(on_device(mixed_dtypes_config(p), p), 9, 4)) << to_string(p);
  }
}

// Rows used more than gpu/kernels' kHotUses times in a batch: their gradients are summed in
// segments by warps of their own (hot-row partials, fp32) before the half rows are updated; the
// same bits as the reference.
TEST(ReferenceHalf, HotHalfRowsOnTheDeviceMatchTheReference) {
  for (const Placement p : {Placement::kGpu, Placement::kCached}) {
    StoreConfig c = on_device(mixed_dtypes_config(p), p);
    for (TableConfig& t : c.tables) t.spec.rows = 2;  // 300 bags: some 375 uses of each row
    EXPECT_TRUE(store_matches_reference(c, 5, 2, 300)) << to_string(p);
  }
}

// A checkpoint of half-size tables in `gpu` and `cached` (fp32 and half tables, small caches whose
// dirty rows the save writes back): save, train on, load: the rows and state saved, bit for bit.
TEST(ReferenceHalf, CheckpointsOfHalfTablesOnTheDeviceRoundTrip) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_half_ckpt_" + std::to_string(::getpid()));
  for (const Placement p : {Placement::kGpu, Placement::kCached}) {
    const StoreConfig c = on_device(mixed_dtypes_config(p), p);
    auto s = Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    Store& store = *s.value();
    std::mt19937_64 rng(5);
    auto train = [&](int first, int steps) {
      for (int step = first; step < first + steps; ++step) {
        const KeyBatch kb = testing::random_batch(rng, c, 6);
        Buffers b = testing::make_buffers(c, kb);
        ASSERT_TRUE(store.submit(step, kb).is_ok());
        ASSERT_TRUE(store.forward(step, b.views).is_ok());
        testing::fill_random(rng, b);
        ASSERT_TRUE(store.backward(step, b.cviews).is_ok());
      }
    };
    ASSERT_NO_FATAL_FAILURE(train(1, 3)) << to_string(p);  // an ASSERT in train returns from train alone
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(store.save(dir.string()).is_ok()) << to_string(p);
    const Snapshot saved = testing::snapshot(store);
    ASSERT_NO_FATAL_FAILURE(train(4, 3)) << to_string(p);
    ASSERT_FALSE(testing::same_state(testing::snapshot(store), saved)) << to_string(p) << ": training changed nothing";
    const Status load = store.load(dir.string());
    ASSERT_TRUE(load.is_ok()) << load.to_string();
    EXPECT_TRUE(testing::same_state(testing::snapshot(store), saved)) << to_string(p);
  }
  std::filesystem::remove_all(dir);
}

// Half-size outputs are the fp32 outputs rounded to nearest; half-size gradients are widened, so a
// store fed them trains as an fp32-output store fed their widened values.
TEST(ReferenceHalf, HalfOutputsAreRoundedOutputsAndHalfGradientsAreWidened) {
  std::mt19937_64 rng(23);
  StoreConfig wide = testing::random_config(rng, 4);
  for (const DType out : {DType::kBF16, DType::kF16}) {
    const StoreConfig half = with_output_dtype(wide, out);
    auto a = open_reference(wide), b = open_reference(half);
    ASSERT_TRUE(a && b);
    for (int step = 1; step <= 4; ++step) {
      const KeyBatch kb = testing::random_batch(rng, wide, 5);
      Buffers fa = testing::make_buffers(wide, kb), fb = testing::make_buffers(half, kb);
      for (MatrixView& v : fb.views) v.dtype = out;
      for (ConstMatrixView& v : fb.cviews) v.dtype = out;
      ASSERT_TRUE(a->submit(step, kb).is_ok());
      ASSERT_TRUE(b->submit(step, kb).is_ok());
      ASSERT_TRUE(a->forward(step, fa.views).is_ok());
      ASSERT_TRUE(b->forward(step, fb.views).is_ok());
      for (std::size_t i = 0; i < fa.data.size(); ++i) {
        std::vector<std::uint16_t> got(fa.data[i].size());
        std::memcpy(got.data(), fb.data[i].data(), got.size() * sizeof(std::uint16_t));
        for (std::size_t k = 0; k < got.size(); ++k)
          ASSERT_EQ(got[k], narrow(out, fa.data[i][k], false, 0)) << "feature " << i << " element " << k;
      }
      testing::fill_random(rng, fa);
      for (std::size_t i = 0; i < fa.data.size(); ++i) {
        std::vector<std::uint16_t> g(fa.data[i].size());
        for (std::size_t k = 0; k < g.size(); ++k) {
          g[k] = narrow(out, fa.data[i][k], false, 0);
          fa.data[i][k] = widen(out, g[k]);
        }
        std::memcpy(fb.data[i].data(), g.data(), g.size() * sizeof(std::uint16_t));
      }
      ASSERT_TRUE(a->backward(step, fa.cviews).is_ok());
      ASSERT_TRUE(b->backward(step, fb.cviews).is_ok());
    }
    EXPECT_TRUE(testing::same_state(testing::snapshot(*a), testing::snapshot(*b))) << to_string(out);
  }
}

// Tables of half-size outputs and gradients (bf16, fp16) beside fp32 ones, of fp32, bf16 and fp16
// rows, dims of less than a lane's columns to more than a warp's chunk, every pooling, with and
// without per-sample weights: in `gpu`, in `cached` and `hybrid` (caches of 12 rows: rows served
// outside the cache, evictions; `hybrid` on one rank is the cached engine), and `cpu`, `gpu` and
// `cached` tables in one store (the `cpu` tables' device views bounced through pinned memory), on
// the emu device, and in `offload` with the device gather (the same kernels over rows read from host
// memory) and with the CPU gather (the host kernels; device views go through its pinned outputs and
// gradients), with host views, device views and stream-ordered device views (also without the
// finiteness check, accept_nonfinite_gradients): the reference's bits (the kernels round each fp32
// pooled sum to nearest once, and widen gradients as read).
TEST(ReferenceHalf, DevicePlacementsOfHalfOutputsMatchTheReferenceBitForBit) {
  std::mt19937_64 rng(131);
  StoreConfig c = testing::random_config(rng, 9);
  const std::int32_t dims[] = {16, 7, 130, 48, 1, 33, 272, 8, 64};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (std::size_t i = 0; i < c.tables.size(); ++i) {  // every (pooling, outputs) pair
    TableSpec& s = c.tables[i].spec;
    s.dim = dims[i];
    s.dtype = dtypes[(i + i / 3) % 3];
    s.pooling = static_cast<Pooling>(i / 3);
    s.output_dtype = dtypes[i % 3];
  }
  const Placement mixed[] = {Placement::kCpu, Placement::kGpu, Placement::kCached};
  for (const Placement p :
       {Placement::kGpu, Placement::kCached, Placement::kHybrid, Placement::kOffload, Placement::kCpu})
    for (const OffloadGather g : {OffloadGather::kDevice, OffloadGather::kCpu}) {
      if (g == OffloadGather::kCpu && p != Placement::kOffload) continue;
      StoreConfig d = on_device(c, p == Placement::kCpu ? Placement::kCached : p);
      d.offload_gather = g;
      if (p == Placement::kCpu)  // the mixed store
        for (std::size_t i = 0; i < d.tables.size(); ++i) {
          d.tables[i].placement = mixed[i % 3];
          if (mixed[i % 3] != Placement::kCached) d.tables[i].cache = TableConfig{}.cache;
        }
      const std::string name = p == Placement::kCpu       ? std::string("cpu, gpu and cached")
                               : p == Placement::kOffload ? std::string("offload, ") + to_string(g) + " gather"
                                                          : std::string(to_string(p));
      for (const Views v : {Views::kHost, Views::kDevice, Views::kDeviceOrdered})
        EXPECT_TRUE(store_matches_reference(d, 7, 3, 6, v)) << name << ", " << to_string(v);
      // Without the finiteness check, whose host wait for the caller's stream would hide a missing
      // wait of an engine's, and the caller's stream late (random delays before each of its
      // operations): gradients read before the caller's upload lands are NaN, and reach the tables.
      d.accept_nonfinite_gradients = true;
      d.device.emu_max_delay_us = 50;
      EXPECT_TRUE(store_matches_reference(d, 7, 3, 6, Views::kDeviceOrdered))
          << name << ", " << to_string(Views::kDeviceOrdered) << ", accept_nonfinite_gradients";
    }
}

// A half-size gradient holding NaN or Inf is refused, naming the table, the bag, the column and the
// value, and changes nothing; a view whose dtype is not the table's output_dtype is refused naming
// both, in a store of half-size outputs and in an fp32 one.
TEST(ReferenceHalf, NonFiniteHalfGradientsAndViewsOfAnotherDtypeAreRefused) {
  std::mt19937_64 rng(31);
  StoreConfig wide = testing::random_config(rng, 3);
  for (const DType out : {DType::kBF16, DType::kF16}) {
    const StoreConfig half = with_output_dtype(wide, out);
    auto store = open_reference(half);
    ASSERT_TRUE(store);
    KeyBatch kb;
    do kb = testing::random_batch(rng, half, 5);
    while (kb.features[1].num_keys() == 0);
    Buffers b = testing::make_buffers(half, kb);
    for (MatrixView& v : b.views) v.dtype = out;
    for (ConstMatrixView& v : b.cviews) v.dtype = out;
    ASSERT_TRUE(store->submit(1, kb).is_ok());
    ASSERT_TRUE(store->forward(1, b.views).is_ok());
    for (auto& d : b.data) std::fill(d.begin(), d.end(), 0.0f);  // two half-size zeros per float
    const Snapshot before = testing::snapshot(*store);
    const TableSpec* spec = nullptr;  // feature 1's table
    for (const TableConfig& t : half.tables)
      if (t.spec.name == kb.features[1].table) spec = &t.spec;
    ASSERT_NE(spec, nullptr);
    const std::int32_t col = spec->dim - 1;
    const std::uint16_t inf = out == DType::kBF16 ? 0x7f80u : 0x7c00u;
    std::memcpy(reinterpret_cast<unsigned char*>(b.data[1].data()) + 2 * col, &inf, sizeof inf);  // bag 0
    const Status s = store->backward(1, b.cviews);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("table '" + spec->name + "': gradient of "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(", column " + std::to_string(col) + " is inf"), std::string::npos) << s.message();
    EXPECT_TRUE(testing::same_state(testing::snapshot(*store), before));
    // Gradients labelled fp32 in a store of half outputs: refused, naming both dtypes.
    for (ConstMatrixView& v : b.cviews) v.dtype = DType::kF32;
    const Status w = store->backward(1, b.cviews);
    EXPECT_EQ(w.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(w.message().find("gradient view dtype fp32 (expected " + std::string(to_string(out)) +
                               ": the table's output_dtype)"),
              std::string::npos)
        << w.message();
    EXPECT_TRUE(testing::same_state(testing::snapshot(*store), before));
  }
  // An fp32 store refuses output views labelled half-size (their buffers would be half as large).
  auto store = open_reference(wide);
  ASSERT_TRUE(store);
  const KeyBatch kb = testing::random_batch(rng, wide, 4);
  Buffers b = testing::make_buffers(wide, kb);
  b.views[0].dtype = DType::kBF16;
  ASSERT_TRUE(store->submit(1, kb).is_ok());
  const Status s = store->forward(1, b.views);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("output view dtype bf16 (expected fp32: the table's output_dtype)"), std::string::npos)
      << s.message();
}

}  // namespace strata
