// Outputs and gradients in device memory (MemorySpace::kDevice) and stream-ordered calls: what
// crosses PCIe in a steady-state step, and every bad input of the new calls (a clear Status naming
// the table and view, nothing changed, the batch still in flight).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "store/model/cost_model.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/store_test_util.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata {
namespace {

using namespace strata::testing;

// Two pooled tables of different shapes, 64 bags a batch (so every batch has the same output
// shapes), caches of a tenth of the rows for `cached`.
StoreConfig two_tables(Placement p) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  c.cache.policy = cache::Policy::kLookahead;
  c.cache.lookahead = 2;
  c.cache.max_in_flight = 4;
  const int dims[] = {16, 8};
  for (int t = 0; t < 2; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = 2000;
    tc.spec.dim = dims[t];
    tc.spec.pooling = t == 0 ? Pooling::kSum : Pooling::kMean;
    tc.spec.optimizer.kind = OptimizerKind::kAdagrad;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.placement = p;
    if (p == Placement::kCached) tc.cache.fraction = 0.1;
    c.tables.push_back(tc);
  }
  return c;
}

// Bytes over PCIe during `steady` steps after `warm` (batches submitted 2 ahead), with host views
// and synchronous calls, or device views on a stream (or, unless `ordered`, synchronous calls).
// The gradients are uploaded once, before.
struct Traffic {
  std::uint64_t h2d = 0, d2h = 0, activation_bytes = 0;  // activation_bytes: outputs of the steady steps
  std::uint64_t host_copy = 0;                           // activations memcpy'd in host memory
};
Result<Traffic> measure(const StoreConfig& c, bool device, int warm, int steady, bool ordered = true) {
  STRATA_ASSIGN_OR_RETURN(auto store, Store::open(c));
  std::mt19937_64 rng(5);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < warm + steady + 2; ++i) batches.push_back(uniform_batch(rng, c, 64, 3));
  Buffers out = make_buffers(c, batches[0]), grads = make_buffers(c, batches[0]);
  fill_random(rng, grads);
  gpu::Device& dev = *store->device();
  DeviceViews o = make_device_views(dev, out), g = make_device_views(dev, grads);
  STRATA_ASSIGN_OR_RETURN(gpu::Stream trainer, dev.create_stream());
  upload(dev, trainer.view(), grads, g);
  STRATA_RETURN_IF_ERROR(dev.synchronize(trainer.view()));
  for (int i = 0; i < 2; ++i) STRATA_RETURN_IF_ERROR(store->submit(i, batches[static_cast<std::size_t>(i)]));
  Traffic t;
  gpu::LinkBytes before;
  for (int i = 0; i < warm + steady; ++i) {
    if (i == warm) {
      STRATA_RETURN_IF_ERROR(dev.synchronize(trainer.view()));
      before = store->stats().links;
    }
    if (device && ordered) {
      STRATA_RETURN_IF_ERROR(store->forward(i, o.views, trainer.view()));
      STRATA_RETURN_IF_ERROR(store->backward(i, g.cviews, trainer.view()));
    } else if (device) {
      STRATA_RETURN_IF_ERROR(store->forward(i, o.views));
      STRATA_RETURN_IF_ERROR(store->backward(i, g.cviews));
    } else {
      STRATA_RETURN_IF_ERROR(store->forward(i, out.views));
      STRATA_RETURN_IF_ERROR(store->backward(i, grads.cviews));
    }
    STRATA_RETURN_IF_ERROR(store->submit(i + 2, batches[static_cast<std::size_t>(i + 2)]));
    if (i >= warm)
      for (const auto& d : out.data) t.activation_bytes += d.size() * sizeof(float);
  }
  STRATA_RETURN_IF_ERROR(dev.synchronize(trainer.view()));
  const gpu::LinkBytes after = store->stats().links;
  t.h2d = after.h2d - before.h2d;
  t.d2h = after.d2h - before.d2h;
  t.host_copy = after.host_copy - before.host_copy;
  return t;
}

// `gpu` with device views: a step moves only the plan metadata H2D (no outputs D2H, no gradients
// H2D) and, with the finiteness check on, the 8-byte count of each gradient view D2H. `cached`:
// exactly the host run's bytes less the outputs and the gradients: missed rows and metadata H2D,
// dirty write-backs D2H. (Same batches, so the same plans, fills and write-backs.)
TEST(DeviceViews, AStepMovesNoOutputsOrGradientsOverPcie) {
  for (Placement p : {Placement::kGpu, Placement::kCached}) {
    for (bool accept : {false, true}) {
      SCOPED_TRACE(std::string(to_string(p)) + (accept ? ", accept_nonfinite_gradients" : ""));
      StoreConfig c = two_tables(p);
      c.accept_nonfinite_gradients = accept;
      const int warm = 6, steady = 20;
      auto host = measure(c, false, warm, steady);
      auto dev = measure(c, true, warm, steady);
      ASSERT_TRUE(host.is_ok()) << host.status().to_string();
      ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
      const std::uint64_t bytes = host.value().activation_bytes;  // outputs, and as many gradients
      const std::uint64_t counts = accept ? 0 : static_cast<std::uint64_t>(steady) * 2 * sizeof(std::int64_t);
      EXPECT_EQ(dev.value().h2d, host.value().h2d - bytes);
      EXPECT_EQ(dev.value().d2h, host.value().d2h - bytes + counts);
      if (p == Placement::kGpu) {
        EXPECT_EQ(dev.value().d2h, counts);  // nothing else comes back
      } else {
        EXPECT_GT(dev.value().d2h, counts) << "no dirty write-backs: the cache is too large for the test";
      }
    }
  }
}

// `offload` takes device views itself: the device gather writes the outputs into the trainer's
// buffers (no outputs over PCIe), the CPU gather's outputs go H2D once, straight into them, and
// each gradient view crosses D2H once, into the engine's staging, where the CPU optimizer reads
// it. Against host views and synchronous calls with the same batches: the device gather's same
// H2D (metadata and the distinct rows read zero-copy); the CPU gather's outputs H2D, where host
// views take nothing over PCIe (CPU threads pool into them in place); and D2H exactly the
// gradients and the 8-byte NaN/Inf count of each view (the host run's D2H is the device gather's
// outputs, or nothing).
TEST(DeviceViews, OffloadMovesEachGradientOnceAndNoOutputsOverPcie) {
  for (OffloadGather gather : {OffloadGather::kDevice, OffloadGather::kCpu}) {
    for (bool ordered : {true, false}) {
      for (bool accept : {false, true}) {
        SCOPED_TRACE(std::string("offload_gather ") + to_string(gather) +
                     (ordered ? ", stream-ordered" : ", synchronous") + (accept ? ", accept_nonfinite_gradients" : ""));
        StoreConfig c = two_tables(Placement::kOffload);
        c.offload_gather = gather;
        c.accept_nonfinite_gradients = accept;
        const int warm = 4, steady = 12;
        auto host = measure(c, false, warm, steady);
        auto dev = measure(c, true, warm, steady, ordered);
        ASSERT_TRUE(host.is_ok()) << host.status().to_string();
        ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
        const std::uint64_t bytes = host.value().activation_bytes;  // outputs, and as many gradients
        const std::uint64_t counts = accept ? 0 : static_cast<std::uint64_t>(steady) * 2 * sizeof(std::int64_t);
        EXPECT_EQ(host.value().d2h, gather == OffloadGather::kDevice ? bytes : 0);
        if (gather == OffloadGather::kDevice) {
          EXPECT_EQ(dev.value().h2d, host.value().h2d);
        } else {
          EXPECT_EQ(host.value().h2d, 0u);
          EXPECT_EQ(dev.value().h2d, bytes);  // the outputs, once
        }
        EXPECT_EQ(dev.value().d2h, bytes + counts);
      }
    }
  }
}

// No activation goes through host memory with device views: `gpu`, `cached` and `offload` (either
// gather) memcpy no outputs or gradients in a steady-state step, synchronous or stream-ordered.
// With host views the counter is live: `gpu` and `cached` copy every output out of their pinned
// staging and every gradient into it; `offload`'s device gather copies the outputs (its CPU
// optimizer reads host gradients where they are), and its CPU gather copies nothing (it pools
// into the views).
TEST(DeviceViews, NoActivationIsCopiedInHostMemory) {
  struct Mode {
    Placement p;
    OffloadGather gather;
  };
  for (Mode m : {Mode{Placement::kGpu, OffloadGather::kDevice}, Mode{Placement::kCached, OffloadGather::kDevice},
                 Mode{Placement::kOffload, OffloadGather::kDevice}, Mode{Placement::kOffload, OffloadGather::kCpu}}) {
    SCOPED_TRACE(std::string(to_string(m.p)) + ", offload_gather " + to_string(m.gather));
    StoreConfig c = two_tables(m.p);
    c.offload_gather = m.gather;
    const int warm = 4, steady = 8;
    auto host = measure(c, false, warm, steady);
    ASSERT_TRUE(host.is_ok()) << host.status().to_string();
    const std::uint64_t bytes = host.value().activation_bytes;  // outputs, and as many gradients
    ASSERT_GT(bytes, 0u);
    EXPECT_EQ(host.value().host_copy, m.p != Placement::kOffload           ? 2 * bytes
                                      : m.gather == OffloadGather::kDevice ? bytes
                                                                           : 0);
    for (bool ordered : {true, false}) {
      auto dev = measure(c, true, warm, steady, ordered);
      ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
      EXPECT_EQ(dev.value().host_copy, 0u) << (ordered ? "stream-ordered" : "synchronous");
    }
  }
}

// Staging for outputs and gradients is taken only for host views: a store that only ever sees
// device views holds none (no pinned or device bytes, no entry), after warm-up and with no batch
// in flight; the same loop with host views holds at least one batch's outputs and gradients
// (`offload`'s device gather: its outputs on the device; its pinned outputs stay in the batch's
// staging, where device gradients land; its CPU gather: none, it pools into the host views).
TEST(DeviceViews, DeviceViewsReserveNoOutputOrGradientStaging) {
  struct Mode {
    Placement p;
    OffloadGather gather;
  };
  for (Mode m : {Mode{Placement::kGpu, OffloadGather::kDevice}, Mode{Placement::kCached, OffloadGather::kDevice},
                 Mode{Placement::kOffload, OffloadGather::kDevice}, Mode{Placement::kOffload, OffloadGather::kCpu}}) {
    for (bool device : {true, false}) {
      SCOPED_TRACE(std::string(to_string(m.p)) + ", offload_gather " + to_string(m.gather) +
                   (device ? ", device views" : ", host views"));
      StoreConfig c = two_tables(m.p);
      c.offload_gather = m.gather;
      auto store = Store::open(c);
      ASSERT_TRUE(store.is_ok()) << store.status().to_string();
      Store& st = *store.value();
      std::mt19937_64 rng(9);
      std::vector<KeyBatch> batches;
      for (int i = 0; i < 8; ++i) batches.push_back(uniform_batch(rng, c, 64, 3));
      Buffers out = make_buffers(c, batches[0]), grads = make_buffers(c, batches[0]);
      fill_random(rng, grads);
      gpu::Device& dev = *st.device();
      DeviceViews o = make_device_views(dev, out), g = make_device_views(dev, grads);
      auto trainer = dev.create_stream();
      ASSERT_TRUE(trainer.is_ok());
      upload(dev, trainer.value().view(), grads, g);
      ASSERT_TRUE(dev.synchronize(trainer.value().view()).is_ok());
      for (int i = 0; i < 2; ++i) ASSERT_TRUE(st.submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
      for (int i = 0; i < 8; ++i) {
        if (device) {
          ASSERT_TRUE(st.forward(i, o.views, trainer.value().view()).is_ok());
          ASSERT_TRUE(st.backward(i, g.cviews, trainer.value().view()).is_ok());
        } else {
          ASSERT_TRUE(st.forward(i, out.views).is_ok());
          ASSERT_TRUE(st.backward(i, grads.cviews).is_ok());
        }
        if (i + 2 < 8) {
          ASSERT_TRUE(st.submit(i + 2, batches[static_cast<std::size_t>(i + 2)]).is_ok());
        }
      }
      ASSERT_TRUE(dev.synchronize(trainer.value().view()).is_ok());
      ASSERT_EQ(st.in_flight(), 0);
      const StoreStats stats = st.stats();
      std::size_t outputs = 0;  // one batch's outputs (as many gradients)
      for (const auto& d : out.data) outputs += d.size() * sizeof(float);
      EXPECT_GT(stats.staging.entries, 0u);
      if (device) {
        EXPECT_EQ(stats.activation_staging.entries, 0u);
        EXPECT_EQ(stats.activation_staging.pinned, 0u);
        EXPECT_EQ(stats.activation_staging.device, 0u);
        // `gpu`: nothing but the batches' arguments, on both sides (mirrored): each entry at most
        // twice the largest batch's (the pool's headroom), where outputs and gradients took twice
        // a batch's outputs more on each side (four times with the headroom).
        if (m.p == Placement::kGpu) {
          std::size_t largest = 0;
          for (const KeyBatch& kb : batches) {
            std::size_t bytes = 0;
            for (const JaggedKeys& k : kb.features) {
              const std::set<Key> distinct(k.keys.begin(), k.keys.end());
              bytes += static_cast<std::size_t>(EngineStaging::gpu_feature(k.batch_size(), k.num_keys(),
                                                                           static_cast<std::int64_t>(k.weights.size()),
                                                                           static_cast<std::int64_t>(distinct.size())));
            }
            largest = std::max(largest, bytes);
          }
          EXPECT_EQ(stats.staging.pinned, stats.staging.device);
          EXPECT_LE(stats.staging.pinned, stats.staging.entries * 2 * largest);
        }
      } else if (m.gather == OffloadGather::kCpu) {
        // CPU threads pool into the host views: nothing staged for the outputs on either side.
        EXPECT_EQ(stats.activation_staging.entries, 0u);
        EXPECT_EQ(stats.activation_staging.pinned, 0u);
        EXPECT_EQ(stats.activation_staging.device, 0u);
      } else {
        EXPECT_GT(stats.activation_staging.entries, 0u);
        if (m.p == Placement::kOffload) {
          EXPECT_EQ(stats.activation_staging.pinned, 0u);
          EXPECT_GE(stats.activation_staging.device, outputs);
        } else {
          EXPECT_GE(stats.activation_staging.pinned, 2 * outputs);
          EXPECT_GE(stats.activation_staging.device, 2 * outputs);
        }
      }
    }
  }
}

// Sharded tables over a world of thread ranks take device views through the store's pinned adaptor:
// every rank's outputs and final rows equal those of the same world trained with host views.
TEST(DeviceViews, AShardedWorldWithDeviceViewsEqualsItWithHostViews) {
  for (Placement p : {Placement::kGpu, Placement::kHybrid}) {
    SCOPED_TRACE(to_string(p));
    StoreConfig c = two_tables(p);
    for (auto& t : c.tables) t.sharding.type = dispatch::ShardingType::kRow;
    std::mt19937_64 rng(3);
    std::vector<KeyBatch> batches;
    for (int i = 0; i < 8; ++i) batches.push_back(uniform_batch(rng, c, 16, 3));
    Buffers grads = make_buffers(c, batches[0]);
    fill_random(rng, grads);
    // [device views][rank]: the outputs of every step, then every table's rows.
    std::vector<std::vector<std::vector<float>>> seen(2, std::vector<std::vector<float>>(2));
    for (int device = 0; device < 2; ++device) {
      on_ranks(2, 60000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
        auto store = Store::open(c, std::move(comm));
        ASSERT_TRUE(store.is_ok()) << store.status().to_string();
        gpu::Stream trainer = (*store)->device()->create_stream().value();
        auto& out = seen[static_cast<std::size_t>(device)][static_cast<std::size_t>(r)];
        for (int i = 0; i < 8; ++i) {
          ASSERT_TRUE((*store)->submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
          Buffers o = make_buffers(c, batches[static_cast<std::size_t>(i)]);
          StepMode m;
          m.device = device == 1;
          if (m.device && i % 2) m.stream = trainer.view();
          const Status st = run_step(**store, i, grads, o, m);
          ASSERT_TRUE(st.is_ok()) << st.to_string();
          for (const auto& d : o.data) out.insert(out.end(), d.begin(), d.end());
        }
        const Snapshot snap = snapshot(**store);  // a collective
        for (const auto& w : snap.weights) out.insert(out.end(), w.begin(), w.end());
      });
      if (HasFatalFailure()) return;
    }
    for (int r = 0; r < 2; ++r) {
      const auto& a = seen[0][static_cast<std::size_t>(r)];
      const auto& b = seen[1][static_cast<std::size_t>(r)];
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rank " << r;
    }
  }
}

// ---- bad input: each refused with a clear Status, nothing changed, the batch still in flight ----

struct Fixture {
  StoreConfig c;
  std::unique_ptr<Store> store, ref;
  KeyBatch kb;
  Buffers out, grads;
};

void open_fixture(Fixture& f, const StoreConfig& c) {
  f.c = c;
  auto s = Store::open(f.c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  f.store = std::move(s).value();
  f.ref = open_reference_store(f.c).value();
  std::mt19937_64 rng(9);
  f.kb = uniform_batch(rng, f.c, 64, 3);
  f.out = make_buffers(f.c, f.kb);
  f.grads = make_buffers(f.c, f.kb);
  fill_random(rng, f.grads);
  ASSERT_TRUE(f.store->submit(1, f.kb).is_ok());
  ASSERT_TRUE(f.ref->submit(1, f.kb).is_ok());
}

// Finishes batch 1 correctly on both stores and compares everything.
void finish_and_compare(Fixture& f) {
  ASSERT_EQ(f.store->in_flight(), 1) << "the refused call retired the batch";
  Buffers ref_out = make_buffers(f.c, f.kb);
  ASSERT_TRUE(f.ref->forward(1, ref_out.views).is_ok());
  ASSERT_TRUE(f.ref->backward(1, f.grads.cviews).is_ok());
  StepMode m;
  m.device = f.store->device() != nullptr;
  const Status st = run_step(*f.store, 1, f.grads, f.out, m);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(same_outputs(f.out, ref_out));
  EXPECT_TRUE(same_state(snapshot(*f.store), snapshot(*f.ref)));
}

void expect_refused(const Status& st, const std::vector<std::string>& words) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  for (const auto& w : words) EXPECT_NE(st.message().find(w), std::string::npos) << st.message() << "\n  misses: " << w;
}

std::vector<MatrixView> as_device(std::vector<MatrixView> v) {
  for (auto& x : v) x.space = MemorySpace::kDevice;
  return v;
}

TEST(DeviceViews, ADeviceViewOnAStoreWithoutADeviceIsRefused) {
  Fixture f;
  open_fixture(f, two_tables(Placement::kCpu));
  ASSERT_EQ(f.store->device(), nullptr);
  for (Store* s : {f.store.get(), f.ref.get()}) {
    expect_refused(s->forward(1, as_device(f.out.views)),
                   {"batch 1", "table 't0'", "output view 0", "no device", "expected a host view"});
  }
  finish_and_compare(f);
}

TEST(DeviceViews, AHostPointerPassedAsDeviceIsRefused) {
  for (Placement p : {Placement::kGpu, Placement::kCached, Placement::kCpu, Placement::kOffload}) {
    SCOPED_TRACE(to_string(p));
    Fixture f;
    StoreConfig c = two_tables(p);
    if (p == Placement::kCpu) c.tables[1].placement = Placement::kGpu;  // a store with a device
    open_fixture(f, c);
    expect_refused(f.store->forward(1, as_device(f.out.views)),
                   {"batch 1", "table 't0'", "output view 0", "pageable host memory", "expected device memory"});
    // Gradients: forward with device views first, then host memory marked as device.
    gpu::Device& dev = *f.store->device();
    DeviceViews o = make_device_views(dev, f.out), g = make_device_views(dev, f.grads);
    ASSERT_TRUE(f.store->forward(1, o.views).is_ok());
    std::vector<ConstMatrixView> bad = g.cviews;
    bad[1].data = f.grads.data[1].data();
    expect_refused(f.store->backward(1, bad), {"table 't1'", "gradient view 1", "pageable host memory"});
    // Pinned host memory is not device memory either.
    bad[1].data = o.pinned[1].as<float>();
    expect_refused(f.store->backward(1, bad), {"gradient view 1", "pinned host memory"});
    ASSERT_EQ(f.store->in_flight(), 1);
    gpu::Stream s = dev.create_stream().value();
    upload(dev, s.view(), f.grads, g);
    ASSERT_TRUE(dev.synchronize(s.view()).is_ok());
    ASSERT_TRUE(f.store->backward(1, g.cviews).is_ok());
  }
}

TEST(DeviceViews, DeviceMemoryOfAnotherDeviceIsRefused) {
  Fixture f;
  open_fixture(f, two_tables(Placement::kGpu));
  auto other = gpu::make_emu_device();
  ASSERT_TRUE(other.is_ok());
  DeviceViews o = make_device_views(*other.value(), f.out);
  expect_refused(f.store->forward(1, o.views), {"table 't0'", "output view 0", "device memory of emu device"});
  // A view running past the end of its allocation.
  DeviceViews mine = make_device_views(*f.store->device(), f.out);
  std::vector<MatrixView> past = mine.views;
  past[0].data += 1;
  expect_refused(f.store->forward(1, past), {"output view 0", "runs past the end"});
  finish_and_compare(f);
}

TEST(DeviceViews, GradientsInAnotherSpaceThanForwardsOutputsAreRefused) {
  for (Placement p : {Placement::kGpu, Placement::kCached, Placement::kOffload}) {
    SCOPED_TRACE(to_string(p));
    Fixture f;
    open_fixture(f, two_tables(p));
    gpu::Device& dev = *f.store->device();
    DeviceViews o = make_device_views(dev, f.out), g = make_device_views(dev, f.grads);
    // Forward on the host, gradients on the device.
    ASSERT_TRUE(f.store->forward(1, f.out.views).is_ok());
    expect_refused(f.store->backward(1, g.cviews),
                   {"batch 1", "table 't0'", "gradient view 0", "is device memory", "forward's output was host"});
    ASSERT_EQ(f.store->in_flight(), 1);
    // Forward again on the device (a repeated forward is allowed), gradients on the host.
    ASSERT_TRUE(f.store->forward(1, o.views).is_ok());
    expect_refused(f.store->backward(1, f.grads.cviews), {"gradient view 0", "is host memory", "was device"});
    // A gradient shape that differs from forward's.
    std::vector<ConstMatrixView> shape = g.cviews;
    shape[1].rows -= 1;
    Status st = f.store->backward(1, shape);
    expect_refused(st, {"table 't1'", "gradient shape"});
    finish_and_compare(f);
  }
}

TEST(DeviceViews, BadStreamsAreRefused) {
  Fixture f;
  open_fixture(f, two_tables(Placement::kCached));
  gpu::Device& dev = *f.store->device();
  DeviceViews o = make_device_views(dev, f.out);
  expect_refused(f.store->forward(1, o.views, gpu::StreamView()), {"forward of batch 1", "stream is null"});
  auto other = gpu::make_emu_device();
  gpu::Stream foreign = other.value()->create_stream().value();
  expect_refused(f.store->forward(1, o.views, foreign.view()), {"forward of batch 1", "another device"});
  ASSERT_TRUE(f.store->forward(1, o.views).is_ok());
  DeviceViews g = make_device_views(dev, f.grads);
  expect_refused(f.store->backward(1, g.cviews, foreign.view()), {"backward of batch 1", "another device"});
  // A store without a device takes no stream.
  Fixture cpu;
  open_fixture(cpu, two_tables(Placement::kCpu));
  expect_refused(cpu.store->forward(1, cpu.out.views, foreign.view()), {"forward of batch 1", "no device"});
  expect_refused(cpu.ref->forward(1, cpu.out.views, foreign.view()), {"forward of batch 1", "no device"});
  finish_and_compare(cpu);
  // The refused backward changed nothing: the batch finishes as if it had not happened.
  Buffers ref_out = make_buffers(f.c, f.kb);
  ASSERT_TRUE(f.ref->forward(1, ref_out.views).is_ok());
  ASSERT_TRUE(f.ref->backward(1, f.grads.cviews).is_ok());
  gpu::Stream s = dev.create_stream().value();
  upload(dev, s.view(), f.grads, g);
  ASSERT_TRUE(f.store->backward(1, g.cviews, s.view()).is_ok());
  ASSERT_TRUE(download(dev, s.view(), o, f.out).is_ok());
  EXPECT_TRUE(same_outputs(f.out, ref_out));
  EXPECT_TRUE(same_state(snapshot(*f.store), snapshot(*f.ref)));
}

// A NaN or Inf in a device gradient is found on the device and refused before anything changes,
// named as the host check names it; synchronous and stream-ordered.
TEST(DeviceViews, NonFiniteDeviceGradientsAreRefusedByTableBagAndColumn) {
  for (Placement p : {Placement::kGpu, Placement::kCached, Placement::kCpu}) {
    for (bool ordered : {false, true}) {
      SCOPED_TRACE(std::string(to_string(p)) + (ordered ? " stream-ordered" : " synchronous"));
      Fixture f;
      StoreConfig c = two_tables(p);
      if (p == Placement::kCpu) c.tables[0].placement = Placement::kGpu;  // a store with a device
      open_fixture(f, c);
      gpu::Device& dev = *f.store->device();
      gpu::Stream s = dev.create_stream().value();
      DeviceViews o = make_device_views(dev, f.out), g = make_device_views(dev, f.grads);
      ASSERT_TRUE(f.store->forward(1, o.views).is_ok());
      Buffers bad = f.grads;
      bad.data[1][static_cast<std::size_t>(37 * 8 + 5)] = std::numeric_limits<float>::infinity();
      upload(dev, s.view(), bad, g);
      if (!ordered) {
        ASSERT_TRUE(dev.synchronize(s.view()).is_ok());
      }
      const Status st = ordered ? f.store->backward(1, g.cviews, s.view()) : f.store->backward(1, g.cviews);
      expect_refused(st, {"batch 1", "table 't1'", "bag 37", "column 5", "inf", "accept_nonfinite_gradients"});
      ASSERT_EQ(f.store->in_flight(), 1);
      ASSERT_EQ(f.store->step(), 0);
      // The same batch then trains with finite gradients, as if nothing had happened.
      upload(dev, s.view(), f.grads, g);
      ASSERT_TRUE(dev.synchronize(s.view()).is_ok());
      ASSERT_TRUE(f.store->backward(1, g.cviews).is_ok());
      Buffers ref_out = make_buffers(f.c, f.kb);
      ASSERT_TRUE(f.ref->forward(1, ref_out.views).is_ok());
      ASSERT_TRUE(f.ref->backward(1, f.grads.cviews).is_ok());
      ASSERT_TRUE(download(dev, s.view(), o, f.out).is_ok());
      EXPECT_TRUE(same_outputs(f.out, ref_out));
      EXPECT_TRUE(same_state(snapshot(*f.store), snapshot(*f.ref)));
    }
  }
}

}  // namespace
}  // namespace strata
