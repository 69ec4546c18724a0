// Tests of the cuda backend alone: every device operation against the emu backend on the same
// random data, bit for bit (the emu backend runs the same kernel source on the CPU grid, so this is
// "GPU == CPU grid"; tests/gpu/device_test.cpp holds both to the host kernels), and
// what only the CUDA backend has: cudaHostRegister pinning, zero-copy reads of a NUMA-interleaved
// host table, sticky errors, factory errors. Skips when no GPU is visible.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/record_layout.hpp"
#include "gpu/device.hpp"
#include "host/dedup.hpp"
#include "host/host_table.hpp"
#include "host/topology.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::gpu {
namespace {

constexpr std::size_t kCudaCapacity = std::size_t{1} << 30;

// One backend with a stream and the buffers of the current test (kept alive until the end).
struct Side {
  std::unique_ptr<Device> dev;
  Stream stream;
  std::vector<DeviceBuffer> keep;

  StreamView s() const { return stream.view(); }

  void sync() { ASSERT_TRUE(dev->synchronize(s()).is_ok()) << dev->status().to_string(); }

  // Copies `v` into fresh device memory (through pinned memory, as the cuda backend requires).
  template <class T>
  T* upload(const std::vector<T>& v) {
    const std::size_t bytes = std::max<std::size_t>(1, v.size() * sizeof(T));
    auto buf = dev->allocate(bytes);
    EXPECT_TRUE(buf.is_ok()) << buf.status().to_string();
    auto pinned = dev->allocate_pinned(bytes);
    EXPECT_TRUE(pinned.is_ok()) << pinned.status().to_string();
    if (!v.empty()) std::memcpy(pinned.value().data(), v.data(), v.size() * sizeof(T));
    dev->copy_h2d(s(), buf.value().data(), pinned.value().data(), v.size() * sizeof(T));
    sync();  // the pinned staging buffer dies here
    keep.push_back(std::move(buf).value());
    return keep.back().as<T>();
  }

  template <class T>
  std::vector<T> download(const T* p, std::size_t n) {
    auto pinned = dev->allocate_pinned(std::max<std::size_t>(1, n * sizeof(T)));
    EXPECT_TRUE(pinned.is_ok()) << pinned.status().to_string();
    dev->copy_d2h(s(), pinned.value().data(), p, n * sizeof(T));
    sync();
    std::vector<T> out(n);
    if (n) std::memcpy(out.data(), pinned.value().data(), n * sizeof(T));
    return out;
  }
};

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

std::string hex_bits(float f) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", static_cast<unsigned>(bits_of(f)));
  return buf;
}

// Bitwise equality (distinguishes -0 from +0 and NaN payloads), reporting the first difference.
::testing::AssertionResult same_bits(const std::vector<float>& cuda, const std::vector<float>& emu) {
  if (cuda.size() != emu.size())
    return ::testing::AssertionFailure() << "sizes differ: cuda " << cuda.size() << ", emu " << emu.size();
  std::size_t diffs = 0, first = 0;
  for (std::size_t i = 0; i < cuda.size(); ++i) {
    if (bits_of(cuda[i]) != bits_of(emu[i]) && diffs++ == 0) first = i;
  }
  if (diffs == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << diffs << " of " << cuda.size() << " floats differ; first at " << first
                                       << ": cuda " << cuda[first] << " (" << hex_bits(cuda[first]) << "), emu "
                                       << emu[first] << " (" << hex_bits(emu[first]) << ")";
}

// Output buffers start as different NaNs on the two sides, so an element a kernel forgot to
// write shows up as a difference.
constexpr std::uint32_t kCudaFill = 0x7fc0dead;
constexpr std::uint32_t kEmuFill = 0x7fc0beef;

class CudaVsEmu : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_SKIP_WITHOUT_CUDA_GPU();
    auto c = make_cuda_device(0, kCudaCapacity);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    cuda_.dev = std::move(c).value();
    EmuOptions o;
    o.capacity = std::size_t{1} << 30;
    o.threads = 2;
    auto e = make_emu_device(o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    emu_.dev = std::move(e).value();
    for (Side* side : {&cuda_, &emu_}) {
      auto st = side->dev->create_stream();
      ASSERT_TRUE(st.is_ok()) << st.status().to_string();
      side->stream = std::move(st).value();
    }
  }

  // Uploads the same data to both sides.
  template <class T>
  std::pair<T*, T*> upload_both(const std::vector<T>& v) {
    return {cuda_.upload(v), emu_.upload(v)};
  }
  // n floats per side, pre-filled with that side's NaN.
  std::pair<float*, float*> output_both(std::size_t n) {
    return {cuda_.upload(std::vector<float>(n, float_of(kCudaFill))),
            emu_.upload(std::vector<float>(n, float_of(kEmuFill)))};
  }

  Side cuda_;
  Side emu_;
};

// Random records; optimizer state kept non-negative (adagrad accumulators, adam's v).
std::vector<float> random_records(std::int64_t slots, std::int64_t stride, std::int32_t dim, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> r(static_cast<std::size_t>(slots * stride));
  for (std::int64_t s = 0; s < slots; ++s)
    for (std::int64_t c = 0; c < stride; ++c) {
      const float x = u(rng);
      r[static_cast<std::size_t>(s * stride + c)] = c < dim ? x : std::abs(x);
    }
  return r;
}

// Weights that exercise the sign of zero as well as ordinary values.
float random_weight(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0:
      return 0.0f;
    case 1:
      return -0.0f;
    default:
      return std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  }
}

// One feature's keys: `batch` bags of 0..max_len keys drawn from [lo, lo + range) (with repeats).
struct Bags {
  std::vector<std::int64_t> offsets{0};
  std::vector<Key> keys;
  std::vector<float> weights;
};
Bags random_bags(std::int64_t batch, int max_len, Key lo, Key range, std::mt19937_64& rng) {
  Bags b;
  for (std::int64_t i = 0; i < batch; ++i) {
    const int len = static_cast<int>(rng() % static_cast<std::uint64_t>(max_len + 1));
    for (int j = 0; j < len; ++j) {
      b.keys.push_back(lo + static_cast<Key>(rng() % static_cast<std::uint64_t>(range)));
      b.weights.push_back(random_weight(rng));
    }
    b.offsets.push_back(static_cast<std::int64_t>(b.keys.size()));
  }
  return b;
}

Pooling pooling_of(int f) { return static_cast<Pooling>(f % 3); }

// ---- gather_pool ----------------------------------------------------------------------------

class GatherPool : public CudaVsEmu, public ::testing::WithParamInterface<std::int32_t> {};

TEST_P(GatherPool, MatchesEmuBitForBit) {
  const std::int32_t dim = GetParam();
  std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(dim));
  const std::int32_t state_dim = 2 * dim;  // records wider than the weights, as with adam
  const std::int64_t slots = 500, stride = record_stride(dim, state_dim);
  const std::vector<float> records = random_records(slots, stride, dim, rng);
  auto [cpool, epool] = upload_both(records);

  // 21 features: more than one launch (16 per launch); every pooling, weighted or not, empty
  // bags, one feature with no bags and one with a long bag.
  const int kFeatures = 21;
  std::vector<LookupFeature> cf, ef;
  std::vector<std::pair<float*, float*>> outs;
  std::vector<std::size_t> out_sizes;
  for (int f = 0; f < kFeatures; ++f) {
    const std::int64_t batch = f == 5 ? 0 : static_cast<std::int64_t>(1 + rng() % 64);
    Bags b = random_bags(batch, f == 7 ? 300 : 9, 0, slots, rng);
    const Pooling pooling = pooling_of(f);
    const bool weighted = (f / 3) % 2 == 1;
    const std::size_t out_rows = pooling == Pooling::kNone ? b.keys.size() : static_cast<std::size_t>(batch);
    outs.push_back(output_both(out_rows * static_cast<std::size_t>(dim)));
    out_sizes.push_back(out_rows * static_cast<std::size_t>(dim));
    auto [co, eo] = upload_both(b.offsets);
    auto [ck, ek] = upload_both(b.keys);
    auto [cw, ew] = upload_both(b.weights);
    const auto n = static_cast<std::int64_t>(b.keys.size());
    cf.push_back({co, batch, ck, weighted ? cw : nullptr, n, pooling, outs.back().first});
    ef.push_back({eo, batch, ek, weighted ? ew : nullptr, n, pooling, outs.back().second});
  }
  SlotPool cp{cpool, slots, stride, dim, state_dim};
  SlotPool ep{epool, slots, stride, dim, state_dim};
  cuda_.dev->gather_pool(cuda_.s(), cp, cf);
  emu_.dev->gather_pool(emu_.s(), ep, ef);
  for (int f = 0; f < kFeatures; ++f) {
    const auto i = static_cast<std::size_t>(f);
    EXPECT_TRUE(same_bits(cuda_.download(outs[i].first, out_sizes[i]), emu_.download(outs[i].second, out_sizes[i])))
        << "feature " << f << " pooling " << to_string(cf[i].pooling) << (cf[i].weights ? " weighted" : "");
  }
  // Reads only: the pools are unchanged.
  EXPECT_TRUE(same_bits(cuda_.download(cpool, records.size()), records));
}

INSTANTIATE_TEST_SUITE_P(CudaDims, GatherPool, ::testing::Values(1, 7, 32, 100, 128, 129, 300, 1000));

// ---- backward_update ------------------------------------------------------------------------

// One backward_update case: the optimizer, dim and decay, and the records' element types and
// rounding (fp32 records, or one of the five half (dtype, state_dtype) pairs rounded to nearest or
// stochastically: every instance of the half-size update kernel).
struct BackwardCase {
  OptimizerKind kind = OptimizerKind::kSgd;
  std::int32_t dim = 1;
  bool decay = false;
  DType dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  bool sr = false;
};

class BackwardUpdate : public CudaVsEmu, public ::testing::WithParamInterface<BackwardCase> {};

TEST_P(BackwardUpdate, MatchesEmuBitForBit) {
  const BackwardCase bc = GetParam();
  const OptimizerKind kind = bc.kind;
  const std::int32_t dim = bc.dim;
  const bool decay = bc.decay;
  std::mt19937_64 rng(2000 + static_cast<std::uint64_t>(dim) * 8 + static_cast<std::uint64_t>(kind) * 2 + decay +
                      static_cast<std::uint64_t>(bc.dtype) * 1000 + static_cast<std::uint64_t>(bc.state_dtype) * 3000 +
                      bc.sr * 9000);
  OptimizerSpec spec;
  spec.kind = kind;
  spec.learning_rate = 0.05f;
  spec.weight_decay = decay ? 0.01f : 0.0f;
  spec.initial_accumulator = 0.1f;
  OptimizerStep step = make_optimizer_step(spec, 3);
  Rounding& round = step.round;  // a shard's origin: the bits come from global rows and columns
  round.dtype = bc.dtype;
  round.state_dtype = bc.state_dtype;
  round.stochastic = bc.sr;
  round.tseed = 0x5EED;
  round.row_stride = 3;
  round.row_offset = 2;
  round.col_offset = 5;
  const std::int32_t state_dim = optimizer_state_dim(kind, dim);
  const RecordShape shape{dim, bc.dtype, state_dim, bc.state_dtype};

  // Each feature updates its own range of slots (features of one launch never share a slot).
  const int kFeatures = 19;
  const Key kSlotsPerFeature = 40;
  const std::int64_t slots = kFeatures * kSlotsPerFeature, stride = record_words(shape);
  std::vector<float> records = random_records(slots, stride, dim, rng);
  if (bc.dtype != DType::kF32 || bc.state_dtype != DType::kF32) {  // random values rounded to nearest, pads zero
    std::fill(records.begin(), records.end(), 0.0f);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(static_cast<std::size_t>(dim)), state(static_cast<std::size_t>(state_dim));
    for (std::int64_t s = 0; s < slots; ++s) {
      for (float& x : w) x = u(rng);
      for (float& x : state) x = std::abs(u(rng));
      write_record(records.data() + s * stride, shape, w.data(), state.data());
    }
  }
  auto [cpool, epool] = upload_both(records);

  std::vector<UpdateFeature> cf, ef;
  for (int f = 0; f < kFeatures; ++f) {
    const std::int64_t batch = f == 4 ? 0 : static_cast<std::int64_t>(1 + rng() % 48);
    Bags b = random_bags(batch, f == 9 ? 200 : 8, f * kSlotsPerFeature, kSlotsPerFeature, rng);
    const Pooling pooling = pooling_of(f);
    const bool weighted = (f / 3) % 2 == 0;
    const UniqueKeys u = dedup_keys(b.keys.data(), static_cast<std::int64_t>(b.keys.size()));
    const std::vector<std::int32_t> bag_of = bag_of_positions(b.offsets.data(), batch);
    const std::size_t grad_rows = pooling == Pooling::kNone ? b.keys.size() : static_cast<std::size_t>(batch);
    std::vector<float> grads(grad_rows * static_cast<std::size_t>(dim));
    std::uniform_real_distribution<float> g(-1.0f, 1.0f);
    for (auto& x : grads) x = g(rng);
    std::vector<Key> rows(u.keys.size());  // table rows of the slots: not the slots
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = u.keys[i] * 7 + 1;

    UpdateFeature base;
    base.batch = batch;
    base.num_keys = static_cast<std::int64_t>(b.keys.size());
    base.pooling = pooling;
    base.num_unique = u.size();
    base.step = step;
    UpdateFeature c = base, e = base;
    std::tie(c.offsets, e.offsets) = upload_both(b.offsets);
    std::tie(c.weights, e.weights) = upload_both(b.weights);
    if (!weighted) c.weights = e.weights = nullptr;
    std::tie(c.unique_slots, e.unique_slots) = upload_both(u.keys);
    std::tie(c.unique_rows, e.unique_rows) = upload_both(rows);
    std::tie(c.unique_offsets, e.unique_offsets) = upload_both(u.offsets);
    std::tie(c.positions, e.positions) = upload_both(u.positions);
    std::tie(c.bag_of, e.bag_of) = upload_both(bag_of);
    std::tie(c.grads, e.grads) = upload_both(grads);
    cf.push_back(c);
    ef.push_back(e);
  }
  SlotPool cp{cpool, slots, stride, dim, state_dim, nullptr, 0, bc.dtype, bc.state_dtype};
  SlotPool ep{epool, slots, stride, dim, state_dim, nullptr, 0, bc.dtype, bc.state_dtype};
  cuda_.dev->backward_update(cuda_.s(), cp, cf);
  emu_.dev->backward_update(emu_.s(), ep, ef);
  const std::vector<float> after = cuda_.download(cpool, records.size());
  EXPECT_TRUE(same_bits(after, emu_.download(epool, records.size())));
  EXPECT_FALSE(same_bits(after, records)) << "the update changed nothing: the test checks nothing";
}

std::string backward_name(const ::testing::TestParamInfo<BackwardCase>& info) {
  const BackwardCase& c = info.param;
  std::string name = std::string(to_string(c.kind)) + "_dim" + std::to_string(c.dim) + (c.decay ? "_decay" : "");
  if (c.dtype != DType::kF32 || c.state_dtype != DType::kF32)
    name += std::string("_") + to_string(c.dtype) + "_state_" + to_string(c.state_dtype) + (c.sr ? "_sr" : "_rne");
  return name;
}

// fp32 records: every optimizer, dims of each kernel path, with and without decay.
std::vector<BackwardCase> fp32_backward_cases() {
  std::vector<BackwardCase> out;
  for (const OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam})
    for (const std::int32_t dim : {1, 5, 32, 128, 129, 300})
      for (const bool decay : {false, true}) out.push_back({kind, dim, decay});
  return out;
}

// Half records: each of the five (dtype, state_dtype) pairs, each rounding, every optimizer that
// allows the state (a bf16 state: adagrad and adam), odd and even dims, with decay.
std::vector<BackwardCase> half_backward_cases() {
  std::vector<BackwardCase> out;
  const std::pair<DType, DType> pairs[] = {{DType::kBF16, DType::kF32},
                                           {DType::kF16, DType::kF32},
                                           {DType::kF32, DType::kBF16},
                                           {DType::kBF16, DType::kBF16},
                                           {DType::kF16, DType::kBF16}};
  for (const auto& [dtype, state_dtype] : pairs)
    for (const bool sr : {false, true})
      for (const OptimizerKind kind :
           {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
        const bool state_allowed = kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kAdam;
        if (state_dtype != DType::kF32 && !state_allowed) continue;
        for (const std::int32_t dim : {5, 129}) out.push_back({kind, dim, true, dtype, state_dtype, sr});
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(CudaOptimizers, BackwardUpdate, ::testing::ValuesIn(fp32_backward_cases()), backward_name);
INSTANTIATE_TEST_SUITE_P(CudaHalf, BackwardUpdate, ::testing::ValuesIn(half_backward_cases()), backward_name);

// ---- pack / unpack ----------------------------------------------------------------------------

TEST_F(CudaVsEmu, PackUnpackMatchEmuBitForBit) {
  std::mt19937_64 rng(3);
  const std::int32_t dim = 13, state_dim = 13;
  const std::int64_t slots = 3000, stride = record_stride(dim, state_dim);
  std::vector<float> records = random_records(slots, stride, dim, rng);
  // NaN payloads and signed zeros must survive the move.
  for (std::size_t i = 0; i < records.size(); i += 97)
    records[i] = float_of(0x7fa00000u + static_cast<std::uint32_t>(i % 1000));
  for (std::size_t i = 5; i < records.size(); i += 89) records[i] = -0.0f;
  auto [cpool, epool] = upload_both(records);

  std::vector<Key> perm(static_cast<std::size_t>(slots));
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<Key>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::int64_t n = 1200;
  const std::vector<Key> from(perm.begin(), perm.begin() + n);
  const std::vector<Key> to(perm.begin() + n, perm.begin() + 2 * n);  // distinct destinations
  auto [cfrom, efrom] = upload_both(from);
  auto [cto, eto] = upload_both(to);
  auto [cpacked, epacked] = output_both(static_cast<std::size_t>(n * stride));

  SlotPool cp{cpool, slots, stride, dim, state_dim};
  SlotPool ep{epool, slots, stride, dim, state_dim};
  cuda_.dev->pack_records(cuda_.s(), cp, cfrom, n, cpacked);
  emu_.dev->pack_records(emu_.s(), ep, efrom, n, epacked);
  const std::vector<float> packed = cuda_.download(cpacked, static_cast<std::size_t>(n * stride));
  EXPECT_TRUE(same_bits(packed, emu_.download(epacked, static_cast<std::size_t>(n * stride))));
  for (std::int64_t i = 0; i < n; i += 101)
    EXPECT_EQ(bits_of(packed[static_cast<std::size_t>(i * stride + 3)]),
              bits_of(records[static_cast<std::size_t>(from[static_cast<std::size_t>(i)] * stride + 3)]));

  cuda_.dev->unpack_records(cuda_.s(), cp, cto, n, cpacked);
  emu_.dev->unpack_records(emu_.s(), ep, eto, n, epacked);
  EXPECT_TRUE(same_bits(cuda_.download(cpool, records.size()), emu_.download(epool, records.size())));

  // n == 0 launches nothing and is not an error.
  cuda_.dev->pack_records(cuda_.s(), cp, cfrom, 0, cpacked);
  cuda_.sync();
}

// ---- gather_pool_host (zero-copy) -------------------------------------------------------------

// Over tables of fp32, bf16 and fp16 rows with an fp32 or a bf16 state (the records' stride; the
// gather's instances are by row dtype alone, and it rounds nothing).
class ZeroCopyGather : public CudaVsEmu, public ::testing::WithParamInterface<std::pair<DType, DType>> {};

TEST_P(ZeroCopyGather, OfInterleavedHostTableMatchesEmu) {
  std::mt19937_64 rng(4);
  for (int nodes : {1, 3}) {
    TableSpec spec;
    spec.name = "zc";
    spec.rows = 5000;
    spec.dim = 37;
    spec.optimizer.kind = OptimizerKind::kAdam;  // records wider than the weights
    spec.dtype = GetParam().first;
    spec.state_dtype = GetParam().second;
    HostTableOptions ho;
    ho.huge_pages = false;
    ho.block_rows_log2 = 5;  // 32-row blocks dealt over the nodes: rows cross parts often
    ho.pinner = &cuda_.dev->pinner();
    auto table = HostTable::create(Topology::fake(nodes), spec, ho);
    ASSERT_TRUE(table.is_ok()) << table.status().to_string();
    const RowRef ref = table.value().ref();
    ASSERT_EQ(ref.parts, nodes);

    std::vector<LookupFeature> cf, ef;
    std::vector<std::pair<float*, float*>> outs;
    std::vector<std::size_t> sizes;
    for (int f = 0; f < 18; ++f) {
      const std::int64_t batch = static_cast<std::int64_t>(1 + rng() % 40);
      Bags b = random_bags(batch, 6, 0, spec.rows, rng);
      const Pooling pooling = pooling_of(f);
      const std::size_t rows = pooling == Pooling::kNone ? b.keys.size() : static_cast<std::size_t>(batch);
      sizes.push_back(rows * static_cast<std::size_t>(spec.dim));
      outs.push_back(output_both(sizes.back()));
      auto [co, eo] = upload_both(b.offsets);
      auto [ck, ek] = upload_both(b.keys);
      auto [cw, ew] = upload_both(b.weights);
      const bool weighted = f % 2 == 1;
      const auto n = static_cast<std::int64_t>(b.keys.size());
      cf.push_back({co, batch, ck, weighted ? cw : nullptr, n, pooling, outs.back().first});
      ef.push_back({eo, batch, ek, weighted ? ew : nullptr, n, pooling, outs.back().second});
    }
    cuda_.dev->gather_pool_host(cuda_.s(), ref, cf);
    emu_.dev->gather_pool_host(emu_.s(), ref, ef);
    for (std::size_t i = 0; i < cf.size(); ++i)
      EXPECT_TRUE(same_bits(cuda_.download(outs[i].first, sizes[i]), emu_.download(outs[i].second, sizes[i])))
          << nodes << " nodes, feature " << i;
    // The table (and its pinned registration) must outlive the reads.
    cuda_.sync();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ZeroCopyGather,
                         ::testing::Values(std::pair(DType::kF32, DType::kF32), std::pair(DType::kBF16, DType::kF32),
                                           std::pair(DType::kF16, DType::kF32), std::pair(DType::kF32, DType::kBF16),
                                           std::pair(DType::kBF16, DType::kBF16), std::pair(DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::pair<DType, DType>>& i) {
                           return std::string(to_string(i.param.first)) + "_state_" + to_string(i.param.second);
                         });

// Zero-copy gathers of one row of a 4-wide host table that is not set up right; their Status.
class CudaZeroCopyFaults : public CudaVsEmu {
 protected:
  Status gather_one(std::vector<float*> bases) {
    RowRef ref;
    ref.bases = bases.data();
    ref.parts = static_cast<std::int32_t>(bases.size());
    ref.block_shift = 0;
    ref.stride = 4;
    ref.dim = 4;
    auto [co, eo] = upload_both(std::vector<std::int64_t>{0, 1});
    auto [ck, ek] = upload_both(std::vector<Key>{0});
    auto [out, unused] = output_both(4);
    (void)eo;
    (void)ek;
    (void)unused;
    cuda_.dev->gather_pool_host(cuda_.s(), ref, {{co, 1, ck, nullptr, 1, Pooling::kSum, out}});
    return cuda_.dev->synchronize(cuda_.s());
  }
  std::vector<float> host_ = std::vector<float>(64, 1.0f);  // never registered
};

// A host table that was never registered through the device's pinner: the driver is asked for its
// device address before the launch, so this is a Status, not an illegal address in the kernel.
TEST_F(CudaZeroCopyFaults, UnregisteredHostMemoryIsAnError) {
  const Status st = gather_one({host_.data()});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cudaHostGetDevicePointer"), std::string::npos) << st.to_string();
}

TEST_F(CudaZeroCopyFaults, TooManyPartsIsAStickyError) {
  const Status st = gather_one(std::vector<float*>(65, host_.data()));  // one more than kMaxHostParts
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("got 65"), std::string::npos) << st.to_string();
  // Sticky: later work is not run and the error stays.
  std::atomic<bool> ran{false};
  cuda_.dev->host_task(cuda_.s(), [&] { ran = true; });
  EXPECT_EQ(cuda_.dev->synchronize(cuda_.s()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_.dev->status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ran.load());
}

// ---- streams, events, host tasks, memory, pinning, factory ------------------------------------

TEST_F(CudaVsEmu, EventIsNotReadyUntilTheWorkBeforeItRan) {
  auto e = cuda_.dev->create_event();
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_TRUE(cuda_.dev->ready(e.value().view()));  // never recorded
  std::atomic<bool> release{false};
  cuda_.dev->host_task(cuda_.s(), [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  cuda_.dev->record(e.value().view(), cuda_.s());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(cuda_.dev->ready(e.value().view()));
  release = true;
  EXPECT_TRUE(cuda_.dev->synchronize(e.value().view()).is_ok());
  EXPECT_TRUE(cuda_.dev->ready(e.value().view()));
  EXPECT_TRUE(cuda_.dev->status().is_ok());
}

TEST_F(CudaVsEmu, CrossStreamWaitOrdersCopies) {
  auto s2 = cuda_.dev->create_stream().value();
  auto e = cuda_.dev->create_event().value();
  std::vector<std::uint32_t> v(1 << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint32_t>(i * 2654435761u);
  auto src = cuda_.dev->allocate_pinned(v.size() * 4).value();
  auto back = cuda_.dev->allocate_pinned(v.size() * 4).value();
  std::memcpy(src.data(), v.data(), v.size() * 4);
  auto a = cuda_.dev->allocate(v.size() * 4).value();
  auto b = cuda_.dev->allocate(v.size() * 4).value();
  std::atomic<bool> release{false};
  // s1 is held until the host releases it, so without the wait s2 would copy stale memory.
  cuda_.dev->host_task(cuda_.s(), [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  cuda_.dev->copy_h2d(cuda_.s(), a.data(), src.data(), v.size() * 4);
  cuda_.dev->record(e.view(), cuda_.s());
  cuda_.dev->wait(s2.view(), e.view());
  cuda_.dev->copy_d2d(s2.view(), b.data(), a.data(), v.size() * 4);
  cuda_.dev->copy_d2h(s2.view(), back.data(), b.data(), v.size() * 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  release = true;
  ASSERT_TRUE(cuda_.dev->synchronize(s2.view()).is_ok());
  EXPECT_EQ(std::memcmp(back.data(), v.data(), v.size() * 4), 0);
}

TEST_F(CudaVsEmu, DestroyingAStreamWaitsForItsWork) {
  std::atomic<bool> done{false};
  {
    auto s = cuda_.dev->create_stream().value();
    cuda_.dev->host_task(s.view(), [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      done = true;
    });
  }
  EXPECT_TRUE(done.load());
}

TEST_F(CudaVsEmu, InfoMemoryAndPinner) {
  const DeviceInfo& info = cuda_.dev->info();
  EXPECT_EQ(info.backend, Backend::kCuda);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.capacity, 0u);
  EXPECT_LE(info.capacity, kCudaCapacity);
  EXPECT_STREQ(cuda_.dev->pinner().name(), "cuda");
  EXPECT_TRUE(cuda_backend_built());

  // Past the capacity: ResourceExhausted from the base class, before cudaMalloc.
  auto big = cuda_.dev->allocate(info.capacity + 1);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);

  // Pinning: a page-aligned range pins and unpins; pinning it twice is refused with the range named.
  const std::size_t len = std::size_t{1} << 20;
  void* p = std::aligned_alloc(4096, len);
  ASSERT_NE(p, nullptr);
  Pinner& pinner = cuda_.dev->pinner();
  ASSERT_TRUE(pinner.pin(p, len).is_ok());
  const Status again = pinner.pin(p, len);
  EXPECT_FALSE(again.is_ok());
  EXPECT_NE(again.message().find("cannot pin host range"), std::string::npos) << again.to_string();
  pinner.unpin(p, len);
  std::free(p);
  EXPECT_TRUE(cuda_.dev->status().is_ok());  // a refused pin is not a device error
}

TEST(CudaFactory, RejectsOrdinalsOutOfRange) {
  STRATA_SKIP_WITHOUT_CUDA_GPU();
  const int count = cuda_devices().value();
  for (int bad : {-1, count}) {
    auto d = make_cuda_device(bad);
    ASSERT_FALSE(d.is_ok());
    EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(d.status().message().find("not visible"), std::string::npos) << d.status().to_string();
  }
}

}  // namespace
}  // namespace strata::gpu
