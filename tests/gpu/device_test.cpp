// Conformance suite of the device layer: every backend (emu, emu with random delays, and cuda when
// a GPU is visible) must pass the same tests.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "core/record_layout.hpp"
#include "gpu/detail/cuda_probe.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "gpu/staging.hpp"
#include "host/dedup.hpp"
#include "host/fp_env.hpp"
#include "host/host_table.hpp"
#include "host/kernels.hpp"
#include "tests/bench/run_program.hpp"
#include "tests/gpu/cuda_gate.hpp"

namespace strata::gpu {
namespace {

enum class Kind { kEmu, kEmuDelays, kCuda };

std::string kind_name(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kEmu:
      return "emu";
    case Kind::kEmuDelays:
      return "emu_delays";
    default:
      return "cuda";
  }
}

class DeviceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kCuda) {
      STRATA_SKIP_WITHOUT_CUDA_GPU();
      auto d = make_cuda_device(0, std::size_t{1} << 30);
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      dev_ = std::move(d).value();
    } else {
      EmuOptions o;
      o.capacity = std::size_t{64} << 20;
      o.max_delay_us = GetParam() == Kind::kEmuDelays ? 200 : 0;
      o.threads = 2;
      auto d = make_emu_device(o);
      ASSERT_TRUE(d.is_ok());
      dev_ = std::move(d).value();
    }
  }
  template <class T>
  DeviceBuffer upload(const std::vector<T>& v, StreamView s) {
    auto b = dev_->allocate(std::max<std::size_t>(1, v.size() * sizeof(T)));
    EXPECT_TRUE(b.is_ok());
    auto pinned = dev_->allocate_pinned(std::max<std::size_t>(1, v.size() * sizeof(T)));
    EXPECT_TRUE(pinned.is_ok());
    if (!v.empty()) std::memcpy(pinned.value().data(), v.data(), v.size() * sizeof(T));
    dev_->copy_h2d(s, b.value().data(), pinned.value().data(), v.size() * sizeof(T));
    EXPECT_TRUE(dev_->synchronize(s).is_ok());
    return std::move(b).value();
  }
  template <class T>
  std::vector<T> download(const DeviceBuffer& b, std::size_t n, StreamView s) {
    auto pinned = dev_->allocate_pinned(std::max<std::size_t>(1, n * sizeof(T)));
    EXPECT_TRUE(pinned.is_ok());
    dev_->copy_d2h(s, pinned.value().data(), b.data(), n * sizeof(T));
    EXPECT_TRUE(dev_->synchronize(s).is_ok());
    std::vector<T> out(n);
    if (n) std::memcpy(out.data(), pinned.value().data(), n * sizeof(T));
    return out;
  }
  std::unique_ptr<Device> dev_;
};

TEST_P(DeviceTest, AllocationPastCapacityFailsAndFreesReturnCapacity) {
  const std::size_t cap = dev_->info().capacity;
  auto big = dev_->allocate(cap + 1);
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("cannot allocate"), std::string::npos);
  {
    auto half = dev_->allocate(cap / 2);
    ASSERT_TRUE(half.is_ok());
    EXPECT_GE(dev_->bytes_in_use(), cap / 2);
    EXPECT_FALSE(dev_->allocate(cap / 2 + cap / 4).is_ok());
  }
  EXPECT_EQ(dev_->bytes_in_use(), 0u);
  EXPECT_TRUE(dev_->allocate(cap / 2 + cap / 4).is_ok());
}

TEST_P(DeviceTest, CopiesRoundTripAndAreCounted) {
  auto s = dev_->create_stream().value();
  std::vector<std::uint32_t> v(100000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const LinkBytes before = dev_->counters().snapshot();
  DeviceBuffer a = upload(v, s.view());
  auto b = dev_->allocate(v.size() * 4).value();
  dev_->copy_d2d(s.view(), b.data(), a.data(), v.size() * 4);
  EXPECT_EQ(download<std::uint32_t>(b, v.size(), s.view()), v);
  const LinkBytes d = dev_->counters().snapshot() - before;
  EXPECT_EQ(d.h2d, v.size() * 4);
  EXPECT_EQ(d.d2h, v.size() * 4);
  EXPECT_EQ(d.hbm_read, 2 * v.size() * 4);
  EXPECT_EQ(d.hbm_write, 2 * v.size() * 4);
}

TEST_P(DeviceTest, EventsOrderWorkAcrossStreams) {
  auto s1 = dev_->create_stream().value();
  auto s2 = dev_->create_stream().value();
  auto e = dev_->create_event().value();
  EXPECT_TRUE(dev_->ready(e.view()));  // never recorded
  for (int round = 0; round < 20; ++round) {
    std::vector<int> log;
    std::mutex m;
    dev_->host_task(s1.view(), [&] {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      std::lock_guard<std::mutex> lock(m);
      log.push_back(1);
    });
    dev_->record(e.view(), s1.view());
    dev_->wait(s2.view(), e.view());
    dev_->host_task(s2.view(), [&] {
      std::lock_guard<std::mutex> lock(m);
      log.push_back(2);
    });
    ASSERT_TRUE(dev_->synchronize(s2.view()).is_ok());
    ASSERT_TRUE(dev_->synchronize(e.view()).is_ok());
    EXPECT_TRUE(dev_->ready(e.view()));
    ASSERT_EQ(log, (std::vector<int>{1, 2}));
  }
}

TEST_P(DeviceTest, StreamRunsWorkInOrder) {
  auto s = dev_->create_stream().value();
  std::vector<int> log;
  for (int i = 0; i < 200; ++i) dev_->host_task(s.view(), [&log, i] { log.push_back(i); });
  ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
  ASSERT_EQ(log.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(log[static_cast<std::size_t>(i)], i);
}

struct PoolFixture {
  std::int32_t dim, state_dim;
  std::int64_t slots, stride;
  std::vector<float> records;  // (slots, stride) host copy
};

PoolFixture make_pool_data(std::int32_t dim, std::int32_t state_dim, std::int64_t slots, std::uint64_t seed) {
  PoolFixture p{dim, state_dim, slots, record_stride(dim, state_dim), {}};
  p.records.resize(static_cast<std::size_t>(slots * p.stride));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : p.records) x = u(rng);
  for (std::int64_t s = 0; s < slots; ++s)
    for (std::int32_t c = 0; c < state_dim; ++c)
      p.records[static_cast<std::size_t>(s * p.stride + dim + c)] =
          std::abs(p.records[static_cast<std::size_t>(s * p.stride + dim + c)]);
  return p;
}

RowRef host_ref(PoolFixture& p, float** base) {
  *base = p.records.data();
  RowRef r;
  r.bases = base;
  r.stride = p.stride;
  r.dim = p.dim;
  r.state_dim = p.state_dim;
  return r;
}

TEST_P(DeviceTest, GatherPoolAndBackwardMatchHostKernelsBitForBit) {
  auto s = dev_->create_stream().value();
  std::mt19937_64 rng(7);
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (std::int32_t dim : {1, 7, 64, 128}) {
      OptimizerSpec opt;
      opt.kind = OptimizerKind::kAdagrad;
      opt.learning_rate = 0.1f;
      const std::int32_t sd = optimizer_state_dim(opt.kind, dim);
      PoolFixture host = make_pool_data(dim, sd, 300, rng());
      // Two features in one launch.
      const std::int64_t batch = 50;
      std::vector<std::vector<std::int64_t>> offs(2);
      std::vector<std::vector<Key>> rows(2);
      std::vector<std::vector<float>> wts(2);
      for (int f = 0; f < 2; ++f) {
        offs[f].push_back(0);
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t len = static_cast<std::int64_t>(rng() % 6);  // includes empty bags
          for (std::int64_t j = 0; j < len; ++j) {
            rows[f].push_back(static_cast<Key>(rng() % 40 + f * 40));  // duplicates
            wts[f].push_back(static_cast<float>(rng() % 100) / 50.0f);
          }
          offs[f].push_back(static_cast<std::int64_t>(rows[f].size()));
        }
      }
      auto pool_buf = upload(host.records, s.view());
      SlotPool pool{pool_buf.as<float>(), host.slots, host.stride, dim, sd};
      std::vector<DeviceBuffer> keep;
      std::vector<LookupFeature> lf(2);
      std::vector<DeviceBuffer> outs;
      for (int f = 0; f < 2; ++f) {
        keep.push_back(upload(offs[f], s.view()));
        keep.push_back(upload(rows[f], s.view()));
        keep.push_back(upload(wts[f], s.view()));
        const std::int64_t out_rows = pooling == Pooling::kNone ? static_cast<std::int64_t>(rows[f].size()) : batch;
        outs.push_back(dev_->allocate(static_cast<std::size_t>(std::max<std::int64_t>(1, out_rows * dim)) * 4).value());
        lf[f] = {keep[keep.size() - 3].as<std::int64_t>(),
                 batch,
                 keep[keep.size() - 2].as<Key>(),
                 f == 1 ? keep.back().as<float>() : nullptr,
                 static_cast<std::int64_t>(rows[f].size()),
                 pooling,
                 outs.back().as<float>()};
      }
      dev_->gather_pool(s.view(), pool, lf);
      float* base;
      RowRef ref = host_ref(host, &base);
      std::vector<UpdateFeature> uf(2);
      std::vector<std::vector<float>> grads(2);
      std::vector<UniqueKeys> uniq(2);
      for (int f = 0; f < 2; ++f) {
        const std::int64_t out_rows = pooling == Pooling::kNone ? static_cast<std::int64_t>(rows[f].size()) : batch;
        std::vector<float> expect(static_cast<std::size_t>(out_rows * dim));
        const float* w = f == 1 ? wts[f].data() : nullptr;
        if (pooling == Pooling::kNone) {
          gather_rows(ref, rows[f].data(), w, out_rows, expect.data());
        } else {
          gather_pool(ref, BagsView{offs[f].data(), batch, rows[f].data(), w}, pooling, expect.data());
        }
        EXPECT_EQ(download<float>(outs[static_cast<std::size_t>(f)], expect.size(), s.view()), expect)
            << "pooling " << to_string(pooling) << " dim " << dim << " feature " << f;
        grads[f].resize(expect.size());
        for (auto& g : grads[f]) g = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 64.0f;
        uniq[f] = dedup_keys(rows[f].data(), static_cast<std::int64_t>(rows[f].size()));
        auto bag_of = bag_of_positions(offs[f].data(), batch);
        keep.push_back(upload(uniq[f].keys, s.view()));
        keep.push_back(upload(uniq[f].offsets, s.view()));
        keep.push_back(upload(uniq[f].positions, s.view()));
        keep.push_back(upload(bag_of, s.view()));
        keep.push_back(upload(grads[f], s.view()));
        const std::size_t k = keep.size();
        uf[f].offsets = lf[f].offsets;
        uf[f].batch = batch;
        uf[f].weights = lf[f].weights;
        uf[f].num_keys = lf[f].num_keys;
        uf[f].pooling = pooling;
        uf[f].unique_slots = keep[k - 5].as<Key>();
        uf[f].unique_offsets = keep[k - 4].as<std::int64_t>();
        uf[f].positions = keep[k - 3].as<std::int32_t>();
        uf[f].bag_of = keep[k - 2].as<std::int32_t>();
        uf[f].num_unique = uniq[f].size();
        uf[f].grads = keep[k - 1].as<float>();
        uf[f].step = make_optimizer_step(opt, 1);
        backward_update(ref, BagsView{offs[f].data(), batch, rows[f].data(), w}, pooling, view_of(uniq[f]),
                        bag_of.data(), grads[f].data(), uf[f].step);
      }
      dev_->backward_update(s.view(), pool, uf);
      EXPECT_EQ(download<float>(pool_buf, host.records.size(), s.view()), host.records)
          << "pooling " << to_string(pooling) << " dim " << dim;
    }
  }
}

// Half-size rows of a shard (row_stride 3, row_offset 2, col_offset 5, as host kernels_test's
// HalfKernels), each pair of element types, rounded to nearest and stochastically: the fused
// backward on the device gives the bits of the host's backward_update on a HostTable of the same
// spec, and init_records those of HostTable::reset. The slots are a permutation of the rows, so
// the bits must be keyed by unique_rows through the shard's global rows and columns (a key of the
// slot, the local row or the local column moves about half the stochastically rounded elements).
TEST_P(DeviceTest, HalfRowsOfAShardMatchHostKernelsBitForBit) {
  auto st = dev_->create_stream().value();
  const StreamView s = st.view();
  std::mt19937_64 rng(13);
  const std::int32_t dim = 7;  // odd: a half row ends in a pad element
  const std::int64_t rows = 60, batch = 30;
  std::vector<Key> slot_of(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) slot_of[r] = static_cast<Key>((r * 7 + 11) % rows);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const DType state_dtype : {DType::kF32, DType::kBF16}) {
      for (const bool sr : {false, true}) {
        for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kRowwiseAdagrad}) {
          if ((dtype == DType::kF32 && state_dtype == DType::kF32) ||
              (state_dtype != DType::kF32 && kind == OptimizerKind::kRowwiseAdagrad))
            continue;
          TableSpec spec;
          spec.name = "shard";
          spec.rows = rows;
          spec.dim = dim;
          spec.dtype = dtype;
          spec.state_dtype = state_dtype;
          spec.stochastic_rounding = sr;
          spec.init.bound = 1.0f;
          spec.init.row_stride = 3;
          spec.init.row_offset = 2;
          spec.init.col_offset = 5;
          spec.optimizer.kind = kind;
          spec.optimizer.learning_rate = 0.3f;
          spec.optimizer.initial_accumulator = 0.1f;
          const std::string what = std::string(to_string(dtype)) + " state " + to_string(state_dtype) +
                                   (sr ? " sr " : " rne ") + to_string(kind);
          auto table = HostTable::create(Topology::fake(1), spec, {});
          ASSERT_TRUE(table.is_ok()) << what << ": " << table.status().to_string();
          HostTable& host = table.value();
          const std::int64_t stride = host.stride();
          const std::size_t words = static_cast<std::size_t>(rows * stride);
          const SlotPool pool{nullptr, rows, stride, dim, host.state_dim(), nullptr, 0, dtype, state_dtype};
          // init_records: the initial records of the shard's rows, slot r holding row r.
          DeviceBuffer mem = upload(std::vector<float>(words, -7.0f), s);
          SlotPool p = pool;
          p.base = mem.as<float>();
          dev_->init_records(s, p, 0, rows, record_init(spec));
          std::vector<float> got = download<float>(mem, words, s);
          ASSERT_EQ(0, std::memcmp(got.data(), host.row(0), words * sizeof(float))) << what << ": init_records";
          // The same records at permuted slots, then one fused backward on each side.
          std::vector<float> records(words);
          for (std::int64_t r = 0; r < rows; ++r)
            std::memcpy(records.data() + slot_of[r] * stride, host.row(r), static_cast<std::size_t>(stride) * 4);
          mem = upload(records, s);
          p.base = mem.as<float>();
          std::vector<std::int64_t> offs = {0};
          std::vector<Key> keys;
          std::vector<float> wts;
          for (std::int64_t b = 0; b < batch; ++b) {
            for (std::int64_t j = static_cast<std::int64_t>(rng() % 4); j > 0; --j) {
              keys.push_back(static_cast<Key>(rng() % rows));
              wts.push_back(static_cast<float>(rng() % 100) / 50.0f);
            }
            offs.push_back(static_cast<std::int64_t>(keys.size()));
          }
          const std::int64_t n = static_cast<std::int64_t>(keys.size());
          std::vector<float> grads(static_cast<std::size_t>(batch * dim));
          for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 613.0f;
          const UniqueKeys uniq = dedup_keys(keys.data(), n);
          const std::vector<std::int32_t> bag_of = bag_of_positions(offs.data(), batch);
          std::vector<Key> slots;
          for (const Key k : uniq.keys) slots.push_back(slot_of[k]);
          const OptimizerStep step = make_optimizer_step(spec, 4);
          backward_update(host.ref(), BagsView{offs.data(), batch, keys.data(), wts.data()}, Pooling::kSum,
                          view_of(uniq), bag_of.data(), grads.data(), step);
          const std::vector<DeviceBuffer> keep = [&] {
            std::vector<DeviceBuffer> k;
            k.push_back(upload(offs, s));
            k.push_back(upload(wts, s));
            k.push_back(upload(slots, s));
            k.push_back(upload(uniq.keys, s));
            k.push_back(upload(uniq.offsets, s));
            k.push_back(upload(uniq.positions, s));
            k.push_back(upload(bag_of, s));
            k.push_back(upload(grads, s));
            return k;
          }();
          UpdateFeature f;
          f.offsets = keep[0].as<std::int64_t>();
          f.batch = batch;
          f.weights = keep[1].as<float>();
          f.num_keys = n;
          f.unique_slots = keep[2].as<Key>();
          f.unique_rows = keep[3].as<Key>();
          f.unique_offsets = keep[4].as<std::int64_t>();
          f.positions = keep[5].as<std::int32_t>();
          f.bag_of = keep[6].as<std::int32_t>();
          f.num_unique = uniq.size();
          f.grads = keep[7].as<float>();
          f.step = step;
          dev_->backward_update(s, p, {f});
          got = download<float>(mem, words, s);
          ASSERT_TRUE(dev_->status().is_ok()) << what << ": " << dev_->status().to_string();
          for (std::int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(0,
                      std::memcmp(got.data() + slot_of[r] * stride, host.row(r), static_cast<std::size_t>(stride) * 4))
                << what << ": row " << r;
        }
      }
    }
  }
}

// A fused backward of half elements rounded stochastically without unique_rows is refused by both
// backends (Device::backward_update): the kernels would give every row row 0's rounding bits.
// The same feature with its rows runs.
TEST_P(DeviceTest, StochasticHalfBackwardWithoutUniqueRowsIsRefused) {
  auto st = dev_->create_stream().value();
  const StreamView s = st.view();
  const std::int32_t dim = 4;
  const RecordShape shape{dim, DType::kBF16, 0, DType::kF32};
  const std::int64_t stride = record_words(shape);
  DeviceBuffer pool_mem = upload(std::vector<float>(static_cast<std::size_t>(2 * stride), 0.5f), s);
  const SlotPool pool{pool_mem.as<float>(), 2, stride, dim, 0, nullptr, 0, DType::kBF16, DType::kF32};
  const DeviceBuffer offs = upload(std::vector<std::int64_t>{0, 1}, s);
  const DeviceBuffer slots = upload(std::vector<Key>{1}, s);
  const DeviceBuffer uoffs = upload(std::vector<std::int64_t>{0, 1}, s);
  const DeviceBuffer zeros = upload(std::vector<std::int32_t>{0}, s);
  const DeviceBuffer grads = upload(std::vector<float>(dim, 0.25f), s);
  UpdateFeature f;
  f.offsets = offs.as<std::int64_t>();
  f.batch = 1;
  f.num_keys = 1;
  f.unique_slots = slots.as<Key>();
  f.unique_rows = slots.as<Key>();
  f.unique_offsets = uoffs.as<std::int64_t>();
  f.positions = zeros.as<std::int32_t>();
  f.bag_of = zeros.as<std::int32_t>();
  f.num_unique = 1;
  f.grads = grads.as<float>();
  f.step.spec.kind = OptimizerKind::kSgd;
  f.step.spec.learning_rate = 0.1f;
  f.step.round.dtype = DType::kBF16;
  f.step.round.stochastic = true;
  f.step.round.step = 1;
  dev_->backward_update(s, pool, {f});
  ASSERT_TRUE(dev_->synchronize(s).is_ok()) << dev_->status().to_string();
  f.unique_rows = nullptr;
  dev_->backward_update(s, pool, {UpdateFeature{}, f});
  const Status refused = dev_->synchronize(s);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find("backward_update feature 1: half elements rounded stochastically need "
                                   "unique_rows"),
            std::string::npos)
      << refused.message();
}

// A slot pool with an overflow region (SlotPool::overflow: slot s >= slots is its record s - slots)
// behaves as one pool holding all the records: the gather (with weights, empty bags, two hot rows
// used more than kHotUses times, one of them in the overflow region), the fused update (segment
// and row kernels) and the record moves give the same bits as on a whole pool of the same records.
TEST_P(DeviceTest, OverflowSlotsActAsSlotsOfOnePool) {
  auto s = dev_->create_stream().value();
  std::mt19937_64 rng(11);
  for (Pooling pooling : {Pooling::kSum, Pooling::kNone}) {
    const std::int32_t dim = 33;
    OptimizerSpec opt;
    opt.kind = OptimizerKind::kAdam;
    opt.learning_rate = 0.1f;
    const std::int32_t sd = optimizer_state_dim(opt.kind, dim);
    const std::int64_t slots = 300, kept = 100;  // slots [kept, slots) in the overflow region
    PoolFixture host = make_pool_data(dim, sd, slots, rng());
    const auto split_at = host.records.begin() + kept * host.stride;
    auto whole_buf = upload(host.records, s.view());
    auto head_buf = upload(std::vector<float>(host.records.begin(), split_at), s.view());
    auto tail_buf = upload(std::vector<float>(split_at, host.records.end()), s.view());
    const SlotPool whole{whole_buf.as<float>(), slots, host.stride, dim, sd};
    const SlotPool split{head_buf.as<float>(), kept, host.stride, dim, sd, tail_buf.as<float>(), slots - kept};
    std::vector<std::int64_t> offs = {0};
    std::vector<Key> rows;
    std::vector<float> wts;
    const std::int64_t batch = 1200;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t len = static_cast<std::int64_t>(rng() % 4);  // includes empty bags
      for (std::int64_t j = 0; j < len; ++j) {
        rows.push_back(j == 0 ? (b % 2 ? 7 : 250) : static_cast<Key>(rng() % slots));  // rows 7 and 250: hot
        wts.push_back(static_cast<float>(rng() % 100) / 50.0f);
      }
      offs.push_back(static_cast<std::int64_t>(rows.size()));
    }
    const auto d_offs = upload(offs, s.view());
    const auto d_rows = upload(rows, s.view());
    const auto d_wts = upload(wts, s.view());
    const std::int64_t out_rows = pooling == Pooling::kNone ? static_cast<std::int64_t>(rows.size()) : batch;
    std::vector<DeviceBuffer> outs;
    for (int i = 0; i < 2; ++i) outs.push_back(dev_->allocate(static_cast<std::size_t>(out_rows * dim) * 4).value());
    const auto lookup = [&](int i) {
      return std::vector<LookupFeature>{{d_offs.as<std::int64_t>(), batch, d_rows.as<Key>(), d_wts.as<float>(),
                                         static_cast<std::int64_t>(rows.size()), pooling, outs[i].as<float>()}};
    };
    dev_->gather_pool(s.view(), whole, lookup(0));
    dev_->gather_pool(s.view(), split, lookup(1));
    const std::size_t out_floats = static_cast<std::size_t>(out_rows * dim);
    const std::vector<float> want = download<float>(outs[0], out_floats, s.view());
    const std::vector<float> got = download<float>(outs[1], out_floats, s.view());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), out_floats * 4), 0) << "gather, pooling " << to_string(pooling);

    const UniqueKeys u = dedup_keys(rows.data(), static_cast<std::int64_t>(rows.size()));
    std::int64_t hot = 0;
    for (std::int64_t r = 0; r < u.size(); ++r) {
      const std::int64_t uses = u.offsets[static_cast<std::size_t>(r) + 1] - u.offsets[static_cast<std::size_t>(r)];
      hot += uses > kernels::kHotUses;
    }
    ASSERT_EQ(hot, 2);
    std::vector<float> grads(out_floats);
    for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 64.0f;
    const auto d_slots = upload(u.keys, s.view());  // slot = row
    const auto d_uoffs = upload(u.offsets, s.view());
    const auto d_pos = upload(u.positions, s.view());
    const auto d_bag = upload(bag_of_positions(offs.data(), batch), s.view());
    const auto d_grads = upload(grads, s.view());
    UpdateFeature uf;
    uf.offsets = d_offs.as<std::int64_t>();
    uf.batch = batch;
    uf.weights = d_wts.as<float>();
    uf.num_keys = static_cast<std::int64_t>(rows.size());
    uf.pooling = pooling;
    uf.unique_slots = d_slots.as<Key>();
    uf.unique_offsets = d_uoffs.as<std::int64_t>();
    uf.positions = d_pos.as<std::int32_t>();
    uf.bag_of = d_bag.as<std::int32_t>();
    uf.num_unique = u.size();
    uf.grads = d_grads.as<float>();
    uf.step = make_optimizer_step(opt, 3);
    dev_->backward_update(s.view(), whole, {uf});
    dev_->backward_update(s.view(), split, {uf});
    const std::vector<float> updated = download<float>(whole_buf, host.records.size(), s.view());
    std::vector<float> parts = download<float>(head_buf, static_cast<std::size_t>(kept * host.stride), s.view());
    const std::vector<float> tail =
        download<float>(tail_buf, static_cast<std::size_t>((slots - kept) * host.stride), s.view());
    parts.insert(parts.end(), tail.begin(), tail.end());
    ASSERT_EQ(parts.size(), updated.size());
    EXPECT_EQ(std::memcmp(parts.data(), updated.data(), updated.size() * 4), 0)
        << "update, pooling " << to_string(pooling);
    EXPECT_NE(std::memcmp(updated.data(), host.records.data(), updated.size() * 4), 0);  // it did update

    // Pack and unpack through overflow slots: records 250 and 5 swap places, as in the whole pool.
    const auto d_pair = upload(std::vector<Key>{250, 5}, s.view());
    const auto d_swap = upload(std::vector<Key>{5, 250}, s.view());
    auto packed = dev_->allocate(2 * static_cast<std::size_t>(host.stride) * 4).value();
    for (const SlotPool& p : {whole, split}) {
      dev_->pack_records(s.view(), p, d_pair.as<Key>(), 2, packed.as<float>());
      dev_->unpack_records(s.view(), p, d_swap.as<Key>(), 2, packed.as<float>());
    }
    std::vector<float> moved = download<float>(head_buf, static_cast<std::size_t>(kept * host.stride), s.view());
    const std::vector<float> moved_tail =
        download<float>(tail_buf, static_cast<std::size_t>((slots - kept) * host.stride), s.view());
    moved.insert(moved.end(), moved_tail.begin(), moved_tail.end());
    EXPECT_EQ(moved, download<float>(whole_buf, host.records.size(), s.view()));
    EXPECT_EQ(moved[static_cast<std::size_t>(5 * host.stride)], updated[static_cast<std::size_t>(250 * host.stride)]);
  }
  EXPECT_TRUE(dev_->status().is_ok()) << dev_->status().to_string();
}

TEST_P(DeviceTest, PackUnpackMoveWholeRecords) {
  auto s = dev_->create_stream().value();
  PoolFixture host = make_pool_data(5, 5, 64, 3);
  auto pool_buf = upload(host.records, s.view());
  SlotPool pool{pool_buf.as<float>(), host.slots, host.stride, 5, 5};
  std::vector<Key> slots = {9, 3, 63, 0};
  auto d_slots = upload(slots, s.view());
  auto packed = dev_->allocate(slots.size() * static_cast<std::size_t>(host.stride) * 4).value();
  dev_->pack_records(s.view(), pool, d_slots.as<Key>(), 4, packed.as<float>());
  auto got = download<float>(packed, slots.size() * static_cast<std::size_t>(host.stride), s.view());
  for (std::size_t i = 0; i < slots.size(); ++i)
    for (std::int64_t c = 0; c < 10; ++c)
      EXPECT_EQ(got[i * static_cast<std::size_t>(host.stride) + static_cast<std::size_t>(c)],
                host.records[static_cast<std::size_t>(slots[i] * host.stride + c)]);
  std::vector<Key> dst = {1, 2, 4, 8};
  auto d_dst = upload(dst, s.view());
  dev_->unpack_records(s.view(), pool, d_dst.as<Key>(), 4, packed.as<float>());
  auto after = download<float>(pool_buf, host.records.size(), s.view());
  for (std::size_t i = 0; i < dst.size(); ++i)
    for (std::int64_t c = 0; c < 10; ++c)
      EXPECT_EQ(after[static_cast<std::size_t>(dst[i] * host.stride + c)],
                host.records[static_cast<std::size_t>(slots[i] * host.stride + c)]);
}

// Column slices move between matrix rows and packed rows bit for bit, and nothing else changes.
TEST_P(DeviceTest, TakeAndPutColumnsMoveSlicesOfRows) {
  auto s = dev_->create_stream().value();
  constexpr std::int64_t kRows = 20, kStride = 11, kCol = 3, kWidth = 5;
  std::vector<float> m(kRows * kStride);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) * 0.5f;
  m[4 * kStride + kCol] = std::numeric_limits<float>::quiet_NaN();  // bits kept, payload included
  auto d_m = upload(m, s.view());
  const SlotPool rows{d_m.as<float>(), kRows, kStride, static_cast<std::int32_t>(kWidth), 0};
  const std::vector<Key> take = {4, 19, 0, 4};
  auto d_take = upload(take, s.view());
  auto packed = dev_->allocate(take.size() * kWidth * 4).value();
  dev_->take_columns(s.view(), rows, kCol, d_take.as<Key>(), 4, packed.as<float>());
  const auto got = download<float>(packed, take.size() * kWidth, s.view());
  for (std::size_t i = 0; i < take.size(); ++i)
    for (std::int64_t c = 0; c < kWidth; ++c)
      EXPECT_EQ(std::memcmp(&got[i * kWidth + c], &m[take[i] * kStride + kCol + c], 4), 0) << i << " " << c;
  const std::vector<Key> put = {1, 2, 7, 9};
  auto d_put = upload(put, s.view());
  dev_->put_columns(s.view(), rows, kCol, d_put.as<Key>(), 4, packed.as<float>());
  const auto after = download<float>(d_m, m.size(), s.view());
  std::vector<float> expect = m;
  for (std::size_t i = 0; i < put.size(); ++i)
    for (std::int64_t c = 0; c < kWidth; ++c) expect[put[i] * kStride + kCol + c] = m[take[i] * kStride + kCol + c];
  EXPECT_EQ(std::memcmp(after.data(), expect.data(), after.size() * 4), 0);
  EXPECT_TRUE(dev_->status().is_ok());
}

// reduce_grads gives the bits of the host's reduce_unique_grads: every pooling, weights, rows used
// more often than kHotUses (summed segment by segment into partials first), several features.
TEST_P(DeviceTest, ReduceGradsMatchHostReduceUniqueGradsBitForBit) {
  auto s = dev_->create_stream().value();
  std::mt19937_64 rng(11);
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (std::int32_t dim : {1, 7, 40, 130}) {
      const std::int64_t batch = 600;
      std::vector<std::vector<std::int64_t>> offs(2);
      std::vector<std::vector<Key>> rows(2);
      std::vector<std::vector<float>> wts(2), grads(2), expect(2);
      std::vector<UniqueKeys> uniq(2);
      std::vector<DeviceBuffer> keep;
      std::vector<UpdateFeature> uf(2);
      std::vector<std::int64_t> first(3, 0);
      for (int f = 0; f < 2; ++f) {
        offs[f].push_back(0);
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t len = static_cast<std::int64_t>(rng() % 5);
          for (std::int64_t j = 0; j < len; ++j) {
            rows[f].push_back(rng() % 3 == 0 ? 5 : static_cast<Key>(rng() % 60));  // key 5 is hot
            wts[f].push_back(static_cast<float>(rng() % 100) / 37.0f);
          }
          offs[f].push_back(static_cast<std::int64_t>(rows[f].size()));
        }
        const std::int64_t keys = static_cast<std::int64_t>(rows[f].size());
        grads[f].resize(static_cast<std::size_t>((pooling == Pooling::kNone ? keys : batch) * dim));
        for (auto& g : grads[f]) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 77.0f;
        uniq[f] = dedup_keys(rows[f].data(), keys);
        std::int64_t most = 0;
        for (std::int64_t u = 0; u < uniq[f].size(); ++u)
          most = std::max(most, uniq[f].offsets[u + 1] - uniq[f].offsets[u]);
        ASSERT_GT(most, kernels::kHotUses) << "the test wants a hot row";
        const auto bag_of = bag_of_positions(offs[f].data(), batch);
        const float* w = f == 1 ? wts[f].data() : nullptr;
        expect[f].resize(static_cast<std::size_t>(uniq[f].size() * dim));
        reduce_unique_grads(BagsView{offs[f].data(), batch, rows[f].data(), w}, pooling, view_of(uniq[f]),
                            bag_of.data(), grads[f].data(), dim, expect[f].data());
        // The sums of both features in one buffer: feature 1's after feature 0's.
        first[f + 1] = first[f] + uniq[f].size();
        std::vector<Key> slots(static_cast<std::size_t>(uniq[f].size()));
        for (std::size_t u = 0; u < slots.size(); ++u) slots[u] = first[f] + static_cast<Key>(u);
        keep.push_back(upload(offs[f], s.view()));
        keep.push_back(upload(wts[f], s.view()));
        keep.push_back(upload(slots, s.view()));
        keep.push_back(upload(uniq[f].offsets, s.view()));
        keep.push_back(upload(uniq[f].positions, s.view()));
        keep.push_back(upload(bag_of, s.view()));
        keep.push_back(upload(grads[f], s.view()));
        const std::size_t k = keep.size();
        uf[f].offsets = keep[k - 7].as<std::int64_t>();
        uf[f].batch = batch;
        uf[f].weights = f == 1 ? keep[k - 6].as<float>() : nullptr;
        uf[f].num_keys = keys;
        uf[f].pooling = pooling;
        uf[f].unique_slots = keep[k - 5].as<Key>();
        uf[f].unique_offsets = keep[k - 4].as<std::int64_t>();
        uf[f].positions = keep[k - 3].as<std::int32_t>();
        uf[f].bag_of = keep[k - 2].as<std::int32_t>();
        uf[f].num_unique = uniq[f].size();
        uf[f].grads = keep[k - 1].as<float>();
      }
      auto sums = dev_->allocate(static_cast<std::size_t>(first[2] * dim) * 4).value();
      dev_->reduce_grads(s.view(), SlotPool{sums.as<float>(), first[2], dim, dim, 0}, uf);
      const auto got = download<float>(sums, static_cast<std::size_t>(first[2] * dim), s.view());
      for (int f = 0; f < 2; ++f) {
        EXPECT_EQ(std::memcmp(got.data() + first[f] * dim, expect[f].data(), expect[f].size() * 4), 0)
            << "pooling " << to_string(pooling) << " dim " << dim << " feature " << f;
      }
    }
  }
}

// ---- hot rows: rows used thousands of times a batch ----

// One feature of the hot-row tests (host data): a row used 5000 times and others over the hot
// threshold (kHotUses + 1 uses, the fewest a hot row has, and exactly kHotUses, which is not hot),
// cold rows, and rows in a pool's overflow region (slots >= kHotKept), shuffled into bags of 0 to 8
// keys (empty bags too). Feature f's row r is slot 3 r + f: the features of one launch update
// distinct slots, as a store's do.
constexpr std::int64_t kHotSlots = 1200, kHotKept = 900;
struct HotFeature {
  std::vector<std::int64_t> offs = {0};
  std::vector<Key> rows;
  std::vector<float> wts;
  std::vector<float> grads;
  UniqueKeys uniq;
  std::vector<std::int32_t> bag_of;
  std::int64_t batch = 0;
  std::vector<std::int64_t> hot;  ///< unique rows used more than kHotUses times, ascending
};

HotFeature make_hot_feature(std::mt19937_64& rng, int f, Pooling pooling, std::int32_t dim) {
  HotFeature h;
  const struct {
    Key row;
    std::int64_t uses;
  } uses[] = {{7, f == 1 ? 9000 : 5000},
              {350, 1300},  // an overflow slot
              {20, kernels::kHotUses + 1},
              {30, kernels::kHotUses},  // not hot
              {40, 3 * kGradSegment}};
  const auto slot = [&](Key r) { return r * 3 + f; };
  for (const auto& u : uses)
    for (std::int64_t i = 0; i < u.uses; ++i) h.rows.push_back(slot(u.row));
  for (int i = 0; i < 3000; ++i) {  // cold: used a few times each, some in the overflow region
    const Key r = static_cast<Key>(100 + rng() % (kHotSlots / 3 - 100));
    if (r != 350) h.rows.push_back(slot(r));
  }
  std::shuffle(h.rows.begin(), h.rows.end(), rng);
  for (std::size_t k = 0; k < h.rows.size();) {
    k = std::min(h.rows.size(), k + static_cast<std::size_t>(rng() % 9));
    h.offs.push_back(static_cast<std::int64_t>(k));
  }
  h.batch = static_cast<std::int64_t>(h.offs.size()) - 1;
  for (std::size_t k = 0; k < h.rows.size(); ++k) h.wts.push_back(static_cast<float>(rng() % 1000) / 377.0f);
  const std::int64_t keys = static_cast<std::int64_t>(h.rows.size());
  h.grads.resize(static_cast<std::size_t>((pooling == Pooling::kNone ? keys : h.batch) * dim));
  for (auto& g : h.grads) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 77.0f;
  h.uniq = dedup_keys(h.rows.data(), keys);
  h.bag_of = bag_of_positions(h.offs.data(), h.batch);
  for (std::int64_t u = 0; u < h.uniq.size(); ++u)
    if (h.uniq.offsets[u + 1] - h.uniq.offsets[u] > kernels::kHotUses) h.hot.push_back(u);
  return h;
}

// The hot-row tests' features on a device: their buffers and the UpdateFeatures over them.
struct HotOnDevice {
  std::vector<DeviceBuffer> keep;
  std::vector<UpdateFeature> uf;
};

// Three features in one launch (feature 1 weighted); `lists`: with hot lists. Slots are rows.
template <class Upload>
HotOnDevice hot_on_device(const std::vector<HotFeature>& hf, Pooling pooling, const OptimizerSpec& opt, bool lists,
                          Upload upload) {
  HotOnDevice d;
  for (std::size_t f = 0; f < hf.size(); ++f) {
    const HotFeature& h = hf[f];
    UpdateFeature u;
    d.keep.push_back(upload(h.offs));
    u.offsets = d.keep.back().as<std::int64_t>();
    u.batch = h.batch;
    d.keep.push_back(upload(h.wts));
    u.weights = f == 1 ? d.keep.back().as<float>() : nullptr;
    u.num_keys = static_cast<std::int64_t>(h.rows.size());
    u.pooling = pooling;
    d.keep.push_back(upload(h.uniq.keys));
    u.unique_slots = d.keep.back().as<Key>();
    d.keep.push_back(upload(h.uniq.offsets));
    u.unique_offsets = d.keep.back().as<std::int64_t>();
    d.keep.push_back(upload(h.uniq.positions));
    u.positions = d.keep.back().as<std::int32_t>();
    d.keep.push_back(upload(h.bag_of));
    u.bag_of = d.keep.back().as<std::int32_t>();
    u.num_unique = h.uniq.size();
    d.keep.push_back(upload(h.grads));
    u.grads = d.keep.back().as<float>();
    u.step = make_optimizer_step(opt, 2);
    if (lists) {
      d.keep.push_back(upload(h.hot));
      u.hot = d.keep.back().as<std::int64_t>();
      u.num_hot = static_cast<std::int64_t>(h.hot.size());
    }
    d.uf.push_back(u);
  }
  return d;
}

// The host kernels' results for the hot-row tests: the records after backward_update, and each
// feature's reduce_unique_grads.
std::vector<float> host_backward(PoolFixture host, const std::vector<HotFeature>& hf,
                                 const std::vector<UpdateFeature>& uf, Pooling pooling) {
  float* base;
  const RowRef ref = host_ref(host, &base);
  for (std::size_t f = 0; f < hf.size(); ++f) {
    const HotFeature& h = hf[f];
    const BagsView bags{h.offs.data(), h.batch, h.rows.data(), f == 1 ? h.wts.data() : nullptr};
    backward_update(ref, bags, pooling, view_of(h.uniq), h.bag_of.data(), h.grads.data(), uf[f].step);
  }
  return host.records;
}

// Rows used thousands of times a batch, several hot rows per feature among cold ones, three
// features in one launch, weights, every pooling, dims of one and two chunks, the element-wise and
// the row-wise optimizers, slots of a pool's overflow region, with and without hot lists: the fused
// update and the gradient reduction, which sum the hot rows segment by segment into partials in
// the device's scratch and add them in segment order, give the host kernels' bits.
TEST_P(DeviceTest, HotRowsUsedThousandsOfTimesMatchHostKernelsBitForBit) {
  auto s = dev_->create_stream().value();
  const auto up = [&](const auto& v) { return upload(v, s.view()); };
  std::mt19937_64 rng(23);
  bool first = true;
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (std::int32_t dim : {1, 33, 130}) {
      OptimizerSpec opt;
      opt.kind = dim == 1 ? OptimizerKind::kAdagrad : dim == 33 ? OptimizerKind::kAdam : OptimizerKind::kRowwiseAdagrad;
      opt.learning_rate = 0.05f;
      opt.weight_decay = dim == 130 ? 0.01f : 0.0f;
      const std::int32_t sd = optimizer_state_dim(opt.kind, dim);
      const PoolFixture host = make_pool_data(dim, sd, kHotSlots, rng());
      std::vector<HotFeature> hf;
      hf.reserve(3);
      for (int f = 0; f < 3; ++f) hf.push_back(make_hot_feature(rng, f, pooling, dim));
      for (const HotFeature& h : hf) {
        std::int64_t most = 0;
        for (std::int64_t u = 0; u < h.uniq.size(); ++u)
          most = std::max(most, h.uniq.offsets[u + 1] - h.uniq.offsets[u]);
        ASSERT_GE(most, 5000);
        ASSERT_EQ(h.hot.size(), 4u);
      }
      const HotOnDevice d = hot_on_device(hf, pooling, opt, dim != 1, up);
      const std::vector<float> want = host_backward(host, hf, d.uf, pooling);
      const std::string where = std::string("pooling ") + to_string(pooling) + " dim " + std::to_string(dim);

      // The fused update, in a whole pool and in one with an overflow region.
      const auto split_at = host.records.begin() + kHotKept * host.stride;
      auto whole_buf = up(host.records);
      auto head_buf = up(std::vector<float>(host.records.begin(), split_at));
      auto tail_buf = up(std::vector<float>(split_at, host.records.end()));
      const SlotPool whole{whole_buf.as<float>(), kHotSlots, host.stride, dim, sd};
      const SlotPool split{head_buf.as<float>(), kHotKept, host.stride, dim, sd, tail_buf.as<float>(),
                           kHotSlots - kHotKept};
      const std::size_t in_use = dev_->bytes_in_use();
      dev_->backward_update(s.view(), whole, d.uf);
      if (first) {  // the partials took scratch (kept for the next calls)
        const auto scratch = kernels::partial_floats(kernels::update_launches(whole, d.uf)) * 4;
        EXPECT_GE(dev_->bytes_in_use(), in_use + static_cast<std::size_t>(scratch)) << where;
        first = false;
      }
      dev_->backward_update(s.view(), split, d.uf);
      EXPECT_EQ(download<float>(whole_buf, want.size(), s.view()), want) << where;
      std::vector<float> parts = download<float>(head_buf, static_cast<std::size_t>(kHotKept * host.stride), s.view());
      const auto tail = download<float>(tail_buf, want.size() - parts.size(), s.view());
      parts.insert(parts.end(), tail.begin(), tail.end());
      EXPECT_EQ(parts, want) << where << ", overflow region";

      // The gradient reduction: every feature's sums in one buffer, feature f's from first[f] on.
      std::vector<std::int64_t> first_sum = {0};
      std::vector<DeviceBuffer> sum_slots;
      std::vector<UpdateFeature> rf;
      for (std::size_t f = 0; f < hf.size(); ++f) {
        first_sum.push_back(first_sum.back() + hf[f].uniq.size());
        std::vector<Key> slots(static_cast<std::size_t>(hf[f].uniq.size()));
        for (std::size_t u = 0; u < slots.size(); ++u) slots[u] = first_sum[f] + static_cast<Key>(u);
        sum_slots.push_back(up(slots));
        rf.push_back(d.uf[f]);
        rf.back().unique_slots = sum_slots.back().as<Key>();
      }
      auto sums = dev_->allocate(static_cast<std::size_t>(first_sum.back() * dim) * 4).value();
      dev_->reduce_grads(s.view(), SlotPool{sums.as<float>(), first_sum.back(), dim, dim, 0}, rf);
      const auto got = download<float>(sums, static_cast<std::size_t>(first_sum.back() * dim), s.view());
      for (std::size_t f = 0; f < hf.size(); ++f) {
        const HotFeature& h = hf[f];
        std::vector<float> expect(static_cast<std::size_t>(h.uniq.size() * dim));
        const BagsView bags{h.offs.data(), h.batch, h.rows.data(), f == 1 ? h.wts.data() : nullptr};
        reduce_unique_grads(bags, pooling, view_of(h.uniq), h.bag_of.data(), h.grads.data(), dim, expect.data());
        EXPECT_EQ(std::memcmp(got.data() + first_sum[f] * dim, expect.data(), expect.size() * 4), 0)
            << where << ", reduce_grads feature " << f;
      }
    }
  }
  EXPECT_TRUE(dev_->status().is_ok()) << dev_->status().to_string();
}

// The scratch tests' setup: a pool of kHotSlots records of dim 40 (adagrad, `host`'s) and three
// hot features of mean pooling with hot lists.
struct HotScratchSetup {
  PoolFixture host;
  std::vector<HotFeature> hf;
  HotOnDevice d;
  DeviceBuffer pool_buf;
  SlotPool pool;
};
template <class Upload>
HotScratchSetup hot_scratch_setup(std::uint64_t seed, Upload up) {
  std::mt19937_64 rng(seed);
  const std::int32_t dim = 40;
  OptimizerSpec opt;
  opt.kind = OptimizerKind::kAdagrad;
  opt.learning_rate = 0.05f;
  const std::int32_t sd = optimizer_state_dim(opt.kind, dim);
  HotScratchSetup h;
  h.host = make_pool_data(dim, sd, kHotSlots, rng());
  for (int f = 0; f < 3; ++f) h.hf.push_back(make_hot_feature(rng, f, Pooling::kMean, dim));
  h.d = hot_on_device(h.hf, Pooling::kMean, opt, true, up);
  h.pool_buf = up(h.host.records);
  h.pool = SlotPool{h.pool_buf.as<float>(), kHotSlots, h.host.stride, dim, sd};
  return h;
}

// Without room for the partials' scratch the hot rows are summed by a warp each: the same bits,
// and nothing allocated; with room again, the next call takes the scratch, which gives way to an
// allocation that does not fit beside it.
TEST_P(DeviceTest, HotRowsWithoutRoomForScratchKeepTheirBitsAndTheScratchGivesWay) {
  if (GetParam() == Kind::kCuda) GTEST_SKIP() << "fills the emulated device";
  auto s = dev_->create_stream().value();
  const auto up = [&](const auto& v) { return upload(v, s.view()); };
  const Pooling pooling = Pooling::kMean;
  HotScratchSetup h = hot_scratch_setup(29, up);
  const PoolFixture& host = h.host;
  const std::vector<HotFeature>& hf = h.hf;
  const HotOnDevice& d = h.d;
  const std::int32_t dim = h.pool.dim, sd = h.pool.state_dim;
  std::vector<float> want = host_backward(host, hf, d.uf, pooling);
  DeviceBuffer& pool_buf = h.pool_buf;
  const SlotPool pool = h.pool;
  const auto scratch = static_cast<std::size_t>(kernels::partial_floats(kernels::update_launches(pool, d.uf)) * 4);
  ASSERT_GT(scratch, 0u);
  auto filled = dev_->allocate(dev_->info().capacity - dev_->bytes_in_use() - scratch / 2);
  ASSERT_TRUE(filled.is_ok());
  DeviceBuffer filler = std::move(filled).value();
  const std::size_t full = dev_->bytes_in_use();
  dev_->backward_update(s.view(), pool, d.uf);
  EXPECT_EQ(download<float>(pool_buf, want.size(), s.view()), want);
  EXPECT_EQ(dev_->bytes_in_use(), full) << "no scratch";
  filler = DeviceBuffer();
  // Once more from the host's new records, now with the scratch.
  auto again = up(want);
  const SlotPool pool2{again.as<float>(), kHotSlots, host.stride, dim, sd};
  PoolFixture after = host;
  after.records = want;
  want = host_backward(after, hf, d.uf, pooling);
  const std::size_t before = dev_->bytes_in_use();
  dev_->backward_update(s.view(), pool2, d.uf);
  EXPECT_EQ(download<float>(again, want.size(), s.view()), want);
  EXPECT_GE(dev_->bytes_in_use(), before + scratch) << "the scratch";
  auto beside = dev_->allocate(dev_->info().capacity - before);  // fits only where the scratch was
  ASSERT_TRUE(beside.is_ok()) << beside.status().to_string();
  EXPECT_EQ(dev_->bytes_in_use(), dev_->info().capacity);
  EXPECT_TRUE(dev_->status().is_ok()) << dev_->status().to_string();
}

// With room for the partials' scratch but not for twice it, the scratch takes exactly what the
// call needs, and the next calls allocate nothing; with room for neither it keeps the scratch it
// has, and calls after calls allocate, free and create nothing (no free of the old scratch, failed
// growth and allocation of it again each time).
TEST_P(DeviceTest, TheScratchTakesWhatFitsAndDoesNotRetryWhatCannot) {
  if (GetParam() == Kind::kCuda) GTEST_SKIP() << "fills the emulated device";
  auto s = dev_->create_stream().value();
  const HotScratchSetup h = hot_scratch_setup(31, [&](const auto& v) { return upload(v, s.view()); });
  const std::vector<UpdateFeature> one(h.d.uf.begin(), h.d.uf.begin() + 1);
  const auto need = [&](const std::vector<UpdateFeature>& uf) {
    return static_cast<std::size_t>(kernels::partial_floats(kernels::update_launches(h.pool, uf)) * 4);
  };
  const std::size_t small = need(one), all = need(h.d.uf), capacity = dev_->info().capacity;
  ASSERT_GT(small, 64u);
  ASSERT_LT(small, all);
  {
    auto filler = dev_->allocate(capacity - dev_->bytes_in_use() - small);
    ASSERT_TRUE(filler.is_ok());
    dev_->backward_update(s.view(), h.pool, one);
    ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
    EXPECT_EQ(dev_->bytes_in_use(), capacity) << "the scratch, exactly one call's need";
    const ResourceCounts before = dev_->resource_counts();
    dev_->backward_update(s.view(), h.pool, one);
    ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
    const ResourceCounts made = dev_->resource_counts() - before;
    EXPECT_EQ(made.allocations + made.frees + made.events, 0u);
  }
  // The scratch of `small` stays; all the rest is taken: `all` fits nowhere.
  auto filler = dev_->allocate(capacity - dev_->bytes_in_use());
  ASSERT_TRUE(filler.is_ok());
  const ResourceCounts before = dev_->resource_counts();
  for (int i = 0; i < 3; ++i) dev_->backward_update(s.view(), h.pool, h.d.uf);
  ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
  const ResourceCounts made = dev_->resource_counts() - before;
  EXPECT_EQ(made.allocations, 0u);
  EXPECT_EQ(made.frees, 0u);
  EXPECT_EQ(made.events, 0u);
  EXPECT_EQ(dev_->bytes_in_use(), capacity) << "the old scratch is kept";
}

// An allocation that fits only without the scratch, made while another thread's backward holds
// the scratch (here: growing it, whose free of the old one waits for a stream parked in a host
// task), waits for that backward and then takes the scratch's room, rather than failing.
TEST_P(DeviceTest, AnAllocationWaitsForTheScratchThatAnotherThreadHolds) {
  if (GetParam() == Kind::kCuda) GTEST_SKIP() << "fills the emulated device";
  auto s = dev_->create_stream().value();
  auto parked = dev_->create_stream().value();
  const HotScratchSetup h = hot_scratch_setup(31, [&](const auto& v) { return upload(v, s.view()); });
  const std::vector<UpdateFeature> one(h.d.uf.begin(), h.d.uf.begin() + 1);
  ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
  const std::size_t others = dev_->bytes_in_use();
  dev_->backward_update(s.view(), h.pool, one);  // a scratch for one feature
  ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
  ASSERT_GT(dev_->bytes_in_use(), others);
  std::promise<void> open;
  dev_->host_task(parked.view(), [gate = open.get_future().share()] { gate.wait(); });
  std::thread grow([&] { dev_->backward_update(s.view(), h.pool, h.d.uf); });  // holds the scratch, parked
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Result<DeviceBuffer> got = Status::internal("not run");
  std::thread take([&] { got = dev_->allocate(dev_->info().capacity - others); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  open.set_value();
  grow.join();
  take.join();
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(dev_->bytes_in_use(), dev_->info().capacity);
  EXPECT_TRUE(dev_->status().is_ok()) << dev_->status().to_string();
}

// Rows of fp32, bf16 and fp16 tables interleaved over two nodes (half rows widened as read, as the
// CPU kernels widen them).
TEST_P(DeviceTest, ZeroCopyGatherReadsPinnedHostTable) {
  auto s = dev_->create_stream().value();
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    TableSpec spec;
    spec.name = "t";
    spec.rows = 10000;
    spec.dim = 16;
    spec.dtype = dtype;
    HostTableOptions ho;
    ho.huge_pages = false;
    ho.pinner = &dev_->pinner();
    auto table = HostTable::create(Topology::fake(2), spec, ho);
    ASSERT_TRUE(table.is_ok()) << table.status().to_string();
    ASSERT_GT(table.value().ref().parts, 1);
    std::vector<std::int64_t> offs = {0, 3, 3, 5};
    std::vector<Key> keys = {9999, 0, 4097, 12, 12};
    auto d_offs = upload(offs, s.view());
    auto d_keys = upload(keys, s.view());
    auto out = dev_->allocate(3 * 16 * 4).value();
    const LinkBytes before = dev_->counters().snapshot();
    dev_->gather_pool_host(
        s.view(), table.value().ref(),
        {{d_offs.as<std::int64_t>(), 3, d_keys.as<Key>(), nullptr, 5, Pooling::kSum, out.as<float>()}});
    ASSERT_TRUE(dev_->synchronize(s.view()).is_ok());
    EXPECT_EQ((dev_->counters().snapshot() - before).h2d, 5u * 16 * static_cast<unsigned>(element_bytes(dtype)));
    std::vector<float> expect(3 * 16);
    gather_pool(table.value().ref(), BagsView{offs.data(), 3, keys.data(), nullptr}, Pooling::kSum, expect.data());
    EXPECT_EQ(download<float>(out, expect.size(), s.view()), expect) << to_string(dtype);
  }
}

TEST_P(DeviceTest, InitRecordsWritesEachTablesInitialRowsAndZeroPadding) {
  auto st = dev_->create_stream();
  ASSERT_TRUE(st.is_ok());
  const StreamView s = st.value().view();
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
    const std::int32_t dim = 37, sd = optimizer_state_dim(kind, dim);
    const std::int64_t stride = record_stride(dim, sd), slots = 300, first = 41, n = 200;
    std::vector<float> sentinel(static_cast<std::size_t>(slots * stride), -7.0f);
    DeviceBuffer mem = upload(sentinel, s);
    const SlotPool pool{mem.as<float>(), slots, stride, dim, sd};
    RecordInit init;
    init.table_seed = 12345;
    init.bound = 0.25f;
    init.row0 = 3;  // a shard's origin: rows 3, 7, 11, ... of the whole table, columns 5..
    init.row_stride = 4;
    init.col_offset = 5;
    init.optimizer.kind = kind;
    init.optimizer.initial_accumulator = 0.125f;
    dev_->init_records(s, pool, first, n, init);
    const std::vector<float> got = download<float>(mem, sentinel.size(), s);
    std::vector<float> want = sentinel;
    for (std::int64_t i = 0; i < n; ++i) {
      float* rec = want.data() + (first + i) * stride;
      std::fill(rec, rec + stride, 0.0f);
      init_row(rec, init.table_seed, init.row0 + i * init.row_stride, dim, init.bound, init.col_offset);
      init_state(rec + dim, init.optimizer, sd);
    }
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << "optimizer " << static_cast<int>(kind);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest, ::testing::Values(Kind::kEmu, Kind::kEmuDelays, Kind::kCuda), kind_name);

TEST(EmuDevice, InjectedFaultIsStickyAndSkipsLaterWork) {
  EmuOptions o;
  o.capacity = 1 << 20;
  o.fail_after_ops = 1;
  auto dev = make_emu_device(o).value();
  auto s = dev->create_stream().value();
  auto e = dev->create_event().value();
  std::atomic<int> ran{0};
  dev->host_task(s.view(), [&] { ++ran; });  // op 0 runs
  dev->host_task(s.view(), [&] { ++ran; });  // op 1 faults
  dev->host_task(s.view(), [&] { ++ran; });  // skipped
  dev->record(e.view(), s.view());           // control work still completes
  Status st = dev->synchronize(e.view());
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("emulated device fault"), std::string::npos);
  EXPECT_EQ(dev->synchronize(s.view()).code(), StatusCode::kInternal);
  EXPECT_EQ(ran.load(), 1);
}

// Pinned memory has a limit of its own (EmuOptions::pinned_capacity), apart from device memory:
// a test can make a pinned allocation fail, as cudaHostAlloc does when page-locked memory runs out.
TEST(EmuDevice, PinnedCapacityLimitsLivePinnedMemory) {
  EmuOptions o;
  o.capacity = 1 << 20;
  o.pinned_capacity = 100 << 10;
  auto dev = make_emu_device(o).value();
  {
    const PinnedBuffer a = dev->allocate_pinned(60 << 10).value();
    const Result<PinnedBuffer> b = dev->allocate_pinned(60 << 10);
    EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(b.status().message(),
              "emu device: pinned allocation of 61440 bytes: 40960 of 102400 bytes of pinned memory free "
              "(EmuOptions::pinned_capacity)");
    EXPECT_TRUE(dev->allocate(600 << 10).is_ok()) << "device memory is not pinned memory";
  }
  const Result<PinnedBuffer> all = dev->allocate_pinned(100 << 10);  // the first was freed
  EXPECT_TRUE(all.is_ok()) << all.status().to_string();
}

// A size too close to SIZE_MAX to round up to the alignment is refused like any size the device
// cannot have (it used to wrap to a zero-byte block charged as almost SIZE_MAX bytes).
TEST(EmuDevice, SizesNearTheTopOfSizeTAreRefused) {
  EmuOptions o;
  o.capacity = 1 << 20;
  auto dev = make_emu_device(o).value();
  for (const std::size_t bytes :
       {std::numeric_limits<std::size_t>::max() - 10, std::numeric_limits<std::size_t>::max()}) {
    EXPECT_EQ(dev->allocate_pinned(bytes).status().code(), StatusCode::kResourceExhausted) << bytes;
    EXPECT_EQ(dev->allocate(bytes).status().code(), StatusCode::kResourceExhausted) << bytes;
  }
  EXPECT_TRUE(dev->status().is_ok());
  EXPECT_TRUE(dev->allocate_pinned(1 << 10).is_ok()) << "nothing was charged";
}

TEST(EmuDevice, RejectsBadOptions) {
  EmuOptions o;
  o.capacity = 0;
  EXPECT_EQ(make_emu_device(o).status().code(), StatusCode::kInvalidArgument);
  const Result<int> gpus = cuda_devices();
  EXPECT_FALSE(make_cuda_device(0).is_ok() && !(gpus.is_ok() && gpus.value() > 0));
}

#if defined(__x86_64__) || defined(__i386__)
// Sum-pooled bags of two rows of denormal weights (1e-40 apart), on an emulated device made,
// used and synchronized by this thread: the bits of the pooled output.
std::vector<std::uint32_t> pooled_denormals() {
  EmuOptions o;
  o.capacity = std::size_t{1} << 20;
  o.threads = 2;
  auto made = make_emu_device(o);
  EXPECT_TRUE(made.is_ok());
  if (!made.is_ok()) return {};
  Device& dev = *made.value();
  auto s = dev.create_stream().value();
  const std::int32_t dim = 4;
  const std::int64_t slots = 8, batch = 4;
  std::vector<float> records(static_cast<std::size_t>(slots * dim));
  // Denormals made from their bits: integer work, whatever FP environment the caller runs in (a
  // product such as (i + 1) * 1e-40f would itself be flushed to zero under DAZ).
  for (std::size_t i = 0; i < records.size(); ++i) {
    const std::uint32_t bits = 70000u * static_cast<std::uint32_t>(i + 1);  // about 1e-40 * (i + 1)
    std::memcpy(&records[i], &bits, sizeof bits);
  }
  const std::vector<std::int64_t> offsets = {0, 2, 4, 6, 8};
  const std::vector<Key> rows = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::size_t out_floats = static_cast<std::size_t>(batch * dim);
  PinnedBuffer staging = dev.allocate_pinned(4096).value();
  DeviceBuffer pool = dev.allocate(records.size() * 4).value();
  DeviceBuffer offs = dev.allocate(offsets.size() * 8).value();
  DeviceBuffer keys = dev.allocate(rows.size() * sizeof(Key)).value();
  DeviceBuffer out = dev.allocate(out_floats * 4).value();
  const auto put = [&](DeviceBuffer& dst, const void* src, std::size_t bytes) {
    std::memcpy(staging.data(), src, bytes);
    dev.copy_h2d(s.view(), dst.data(), staging.data(), bytes);
    EXPECT_TRUE(dev.synchronize(s.view()).is_ok());
  };
  put(pool, records.data(), records.size() * 4);
  put(offs, offsets.data(), offsets.size() * 8);
  put(keys, rows.data(), rows.size() * sizeof(Key));
  LookupFeature f{offs.as<std::int64_t>(), batch, keys.as<Key>(), nullptr, 8, Pooling::kSum, out.as<float>()};
  dev.gather_pool(s.view(), SlotPool{pool.as<float>(), slots, dim, dim, 0}, {f});
  dev.copy_d2h(s.view(), staging.data(), out.data(), out_floats * 4);
  EXPECT_TRUE(dev.synchronize(s.view()).is_ok());
  std::vector<std::uint32_t> bits(out_floats);
  std::memcpy(bits.data(), staging.data(), out_floats * 4);
  return bits;
}

// The emulated device's kernels run with the default FP environment (host/fp_env.hpp), whatever
// the thread that made the device set: under its flush-to-zero and denormals-are-zero, these
// sums of denormals would be 0.
TEST(EmuDevice, KernelsRunWithTheDefaultFpEnvironmentWhateverTheCallerSet) {
  const std::vector<std::uint32_t> expect = pooled_denormals();
  ASSERT_EQ(expect.size(), 16u);
  for (std::uint32_t b : expect) {
    float x;
    std::memcpy(&x, &b, 4);
    ASSERT_EQ(std::fpclassify(x), FP_SUBNORMAL) << x;
  }
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  const std::vector<std::uint32_t> got = pooled_denormals();
  const unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  EXPECT_EQ(got, expect);
  EXPECT_EQ(after & 0x8040u, 0x8040u) << "the caller's FTZ/DAZ must survive";
}

// DefaultFpEnv sets the default environment and gives the thread its own back.
TEST(DefaultFpEnv, SetsTheDefaultAndRestoresTheCallersEnvironment) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr((saved | 0x8040 | 0x6000) & ~0x3fu);  // FTZ, DAZ, round toward zero, no flags
  const unsigned caller = _mm_getcsr();
  {
    DefaultFpEnv fp;
    EXPECT_EQ(_mm_getcsr(), DefaultFpEnv::kDefaultMxcsr);
    EXPECT_EQ(std::fegetround(), FE_TONEAREST);
  }
  EXPECT_EQ(_mm_getcsr(), caller);
  _mm_setcsr(saved);
}
#endif

// ---- cuda_devices: "no GPU" and "CUDA is broken" are different answers ----

detail::CudaProbe failed_probe(int error, const char* name, int driver, int runtime) {
  detail::CudaProbe p;
  p.error = error;
  p.error_name = name;
  p.error_text = "text of " + std::string(name);
  p.driver_version = driver;
  p.runtime_version = runtime;
  return p;
}

TEST(CudaProbe, NoDeviceNoDriverAndACountOfZeroAreNoGpu) {
  detail::CudaProbe ok;
  ok.count = 3;
  EXPECT_EQ(detail::classify_cuda_probe(ok).value(), 3);
  ok.count = 0;
  EXPECT_EQ(detail::classify_cuda_probe(ok).value(), 0);
  // CUDA_VISIBLE_DEVICES="" or no GPU on a machine with a driver.
  EXPECT_EQ(
      detail::classify_cuda_probe(failed_probe(detail::kCudaErrorNoDevice, "cudaErrorNoDevice", 12040, 13000)).value(),
      0);
  // No NVIDIA driver installed at all (this is what a machine without a GPU driver answers).
  EXPECT_EQ(detail::classify_cuda_probe(
                failed_probe(detail::kCudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", 0, 13000))
                .value(),
            0);
}

TEST(CudaProbe, ADriverOlderThanTheRuntimeIsAnErrorThatNamesBothVersions) {
  const Result<int> r = detail::classify_cuda_probe(
      failed_probe(detail::kCudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", 12040, 13000));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  const std::string& m = r.status().message();
  for (const char* part :
       {"cudaErrorInsufficientDriver", "text of cudaErrorInsufficientDriver", "driver supports CUDA 12.4",
        "runtime is CUDA 13.0", "install a driver that supports CUDA 13.0"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
}

TEST(CudaProbe, OtherRuntimeErrorsAreErrorsThatSayWhatToCheck) {
  // cudaErrorInitializationError (3), cudaErrorStubLibrary (34), cudaErrorDevicesUnavailable (46),
  // cudaErrorSystemDriverMismatch (803), cudaErrorUnknown (999)
  for (int error : {3, 34, 46, 803, 999}) {
    const Result<int> r = detail::classify_cuda_probe(failed_probe(error, "cudaErrorSomething", 13000, 13000));
    ASSERT_FALSE(r.is_ok()) << error;
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    const std::string& m = r.status().message();
    for (const char* part : {"CUDA is installed but unusable", "cudaErrorSomething", "driver supports CUDA 13.0",
                             "nvidia-smi", "CUDA_VISIBLE_DEVICES"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
  // An error other than "insufficient driver" with no driver found is still an error.
  const Result<int> r = detail::classify_cuda_probe(failed_probe(3, "cudaErrorInitializationError", 0, 13000));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("no CUDA version (no driver found)"), std::string::npos) << r.status().message();
}

TEST(CudaProbe, ThisMachineAnswers) {
  const Result<int> gpus = cuda_devices();
  ASSERT_TRUE(gpus.is_ok()) << gpus.status().to_string();
  if (!cuda_backend_built()) {
    EXPECT_EQ(gpus.value(), 0);
  }
  std::printf("cuda_devices() = %d\n", gpus.value());
}

// The gate of the CUDA tests (tests/gpu/cuda_gate.hpp), seen from outside: one CUDA test of this
// binary, run as a child process. Without a GPU it skips and passes, unless STRATA_REQUIRE_GPU=1,
// which turns the skip into a failure; with a GPU it runs and passes either way.
TEST(CudaGate, RequireGpuTurnsTheSkipIntoAFailure) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  const std::string run =
      std::string("'") + self + "' --gtest_filter=Backends/DeviceTest.CopiesRoundTripAndAreCounted/cuda";
  const Result<int> gpus = cuda_devices();
  ASSERT_TRUE(gpus.is_ok()) << gpus.status().to_string();
  const bool gpu = gpus.value() > 0;

  const strata::testing::RunOutput optional = strata::testing::run_program("STRATA_REQUIRE_GPU=0 " + run);
  EXPECT_EQ(optional.exit_code, 0) << optional.output;
  if (!gpu) {
    EXPECT_NE(optional.output.find("[  SKIPPED ]"), std::string::npos) << optional.output;
  }

  const strata::testing::RunOutput required = strata::testing::run_program("STRATA_REQUIRE_GPU=1 " + run);
  if (gpu) {
    EXPECT_EQ(required.exit_code, 0) << required.output;
  } else {
    EXPECT_EQ(required.exit_code, 1) << required.output;
    EXPECT_NE(required.output.find("[  FAILED  ]"), std::string::npos) << required.output;
    EXPECT_NE(required.output.find("STRATA_REQUIRE_GPU=1 requires one"), std::string::npos) << required.output;
  }

  const strata::testing::RunOutput typo = strata::testing::run_program("STRATA_REQUIRE_GPU=yes " + run);
  EXPECT_EQ(typo.exit_code, 1) << typo.output;
  EXPECT_NE(typo.output.find("STRATA_REQUIRE_GPU='yes' (expected 0 or 1)"), std::string::npos) << typo.output;
}

}  // namespace
}  // namespace strata::gpu

namespace strata::gpu {
namespace {

// Regression: growing by a quarter used to leave the mirrored region an odd size, so host-only and
// device-only allocations after it were misaligned (UBSan: misaligned float loads in gather_pool).
TEST(Staging, AllocationsStayAlignedAcrossGrowth) {
  auto dev = make_emu_device().value();
  auto st = Staging::create(*dev).value();
  for (std::size_t n = 1; n < 4000; n = n * 5 / 4 + 1) {
    ASSERT_TRUE(
        st.reserve(Staging::bytes_for<float>(n), Staging::bytes_for<float>(n), Staging::bytes_for<float>(n)).is_ok());
    auto m = st.mirrored<float>(n);
    float* h = st.host_only<float>(n);
    float* d = st.dev_only<float>(n);
    for (const void* p : {static_cast<const void*>(m.host), static_cast<const void*>(m.dev),
                          static_cast<const void*>(h), static_cast<const void*>(d)})
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % Staging::kAlign, 0u) << "n " << n;
  }
}

// Takes `n` entries for `want` at once (so the pool holds n), then gives them all back.
Status take_round(StagingRing& pool, const StagingSizes& want, int n) {
  std::vector<std::unique_ptr<Staging>> taken;
  for (int i = 0; i < n; ++i) {
    STRATA_ASSIGN_OR_RETURN(auto st, pool.take(want));
    taken.push_back(std::move(st));
  }
  for (auto& st : taken) pool.give_back(std::move(st));
  return Status::ok();
}

// Regression: on a device with room for an entry's batch but not for twice it, the entry falls
// back to exactly the batch's size, and that has to stick: it used to be forgotten (the fallback
// was tested on a copy), so every later take freed the entry and made it again (under cuda a
// device-wide sync per step).
TEST(StagingRing, AnEntryThatFitsOnlyWithoutHeadroomAllocatesOnce) {
  EmuOptions o;
  o.capacity = std::size_t{96} << 10;  // one 64 KiB device region fits, 128 KiB does not
  auto dev = make_emu_device(o).value();
  StagingRing pool(*dev);
  const StagingSizes want{4096, std::size_t{16} << 10, std::size_t{60} << 10};
  ASSERT_TRUE(take_round(pool, want, 1).is_ok());
  // The ring's reservation stays where it was: a floor no entry can reach would make every other
  // entry free and remake its buffers when next taken.
  EXPECT_EQ(pool.reservation().dev_only, 0u);
  const ResourceCounts before = dev->resource_counts();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(take_round(pool, want, 1).is_ok());
  const ResourceCounts during = dev->resource_counts() - before;
  EXPECT_EQ(during.allocations, 0u);
  EXPECT_EQ(during.frees, 0u);
}

// Regression: the fallback asked for the request and the old capacity too (the larger of each
// region), after freeing the old buffers, so a batch that fits alone was refused when an earlier
// batch had made the entry large, and its next attempt (on the emptied entry) succeeded.
TEST(StagingRing, TheFallbackAsksForTheRequestAlone) {
  EmuOptions o;
  o.capacity = std::size_t{150} << 10;
  auto dev = make_emu_device(o).value();
  StagingRing pool(*dev);
  // 8 KiB mirrored + 120 KiB device-only with headroom: 128 KiB of the 150 on the device.
  ASSERT_TRUE(take_round(pool, {4096, 0, std::size_t{60} << 10}, 1).is_ok());
  // With headroom 80 + 120 KiB, with the old capacity 40 + 120 KiB: neither fits; 40 + 4 KiB does.
  const Status second = take_round(pool, {std::size_t{40} << 10, 0, 4096}, 1);
  EXPECT_TRUE(second.is_ok()) << second.to_string();
}

// Regression: a batch whose staging cannot be had used to raise the ring's reservation anyway, to
// twice its size, so that every entry reallocated when next taken (and, with the fallback above
// forgotten, at every take). It leaves the reservation as it was; only the entry it emptied is
// made again, once.
TEST(StagingRing, AFailedOversizedRequestLeavesTheReservationAsItWas) {
  EmuOptions o;
  o.capacity = std::size_t{1} << 20;
  auto dev = make_emu_device(o).value();
  StagingRing pool(*dev);
  const StagingSizes want{4096, std::size_t{64} << 10, std::size_t{64} << 10};
  ASSERT_TRUE(take_round(pool, want, 3).is_ok());
  const StagingSizes reserved = pool.reservation();
  const StagingSizes oversized{4096, std::size_t{64} << 10, std::size_t{2} << 20};
  auto failed = pool.take(oversized);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.reservation().fits_in(reserved) && reserved.fits_in(pool.reservation()));

  ResourceCounts before = dev->resource_counts();
  ASSERT_TRUE(take_round(pool, want, 3).is_ok());
  ResourceCounts during = dev->resource_counts() - before;
  EXPECT_EQ(during.allocations, 2u) << "only the entry the failure emptied (pinned and device) is made again";
  EXPECT_EQ(during.frees, 0u);
  before = dev->resource_counts();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(take_round(pool, want, 3).is_ok());
  during = dev->resource_counts() - before;
  EXPECT_EQ(during.allocations, 0u);
  EXPECT_EQ(during.frees, 0u);
}

}  // namespace
}  // namespace strata::gpu
