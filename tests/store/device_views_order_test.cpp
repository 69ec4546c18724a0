// Stream-ordered calls with device views as a trainer really issues them: two caller streams,
// forward's work still pending when backward is called, the trainer's stream held back by a gate
// (a host task blocked on a future, never a timed wait) while the store's calls return.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/stream_gate.hpp"
#include "tests/store/device_views.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

StoreConfig config(Placement p, int tables = 1) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  c.cache.max_in_flight = 4;
  for (int t = 0; t < tables; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = 1000;
    tc.spec.dim = 8 + 4 * (t % 3);
    tc.spec.pooling = Pooling::kSum;
    tc.spec.optimizer.kind = OptimizerKind::kSgd;
    tc.spec.optimizer.learning_rate = 0.05f;
    tc.placement = p;
    if (p == Placement::kCached) tc.cache.fraction = 0.5;
    c.tables.push_back(tc);
  }
  return c;
}

// Holds a stream back until open() (a dense model still running).
using Gate = gpu::StreamGate;

// Forward of batch 1 on a held-back stream A (its trainer overwrites the outputs with NaN first),
// then forward of batch 2 on an idle stream B, which the host waits for (batch 1 has only the `gpu`
// table and batch 2 only the `cpu` one, so B does not queue behind batch 1's lookups): batch 1's lookups still run
// after A's work. When they do not (a wait released by the later record on B), they run while A is held back and the
// NaN then lands on the outputs.
TEST(DeviceViewsOrder, ForwardOnTwoStreamsKeepsEachCallAfterItsOwnStream) {
  StoreConfig c = config(Placement::kGpu, 2);
  c.tables[1].placement = Placement::kCpu;
  StoreConfig only_gpu = c, only_cpu = c;
  only_gpu.tables.pop_back();
  only_cpu.tables.erase(only_cpu.tables.begin());
  auto store = Store::open(c).value();
  auto ref = open_reference_store(c).value();
  gpu::Device& dev = *store->device();
  gpu::Stream A = dev.create_stream().value(), B = dev.create_stream().value();
  std::mt19937_64 rng(3);
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    const std::int64_t id1 = 2 * round, id2 = id1 + 1;
    const KeyBatch k1 = uniform_batch(rng, only_gpu, 64, 3), k2 = uniform_batch(rng, only_cpu, 64, 3);
    ASSERT_TRUE(store->submit(id1, k1).is_ok());
    ASSERT_TRUE(store->submit(id2, k2).is_ok());
    ASSERT_TRUE(ref->submit(id1, k1).is_ok());
    Buffers out1 = make_buffers(only_gpu, k1), out2 = make_buffers(only_cpu, k2), want = make_buffers(only_gpu, k1);
    ASSERT_TRUE(ref->forward(id1, want.views).is_ok());
    ASSERT_TRUE(ref->discard(id1).is_ok());
    DeviceViews o1 = make_device_views(dev, out1), o2 = make_device_views(dev, out2);
    Gate gate;
    gate.hold(dev, A.view());
    poison(dev, A.view(), o1);
    ASSERT_TRUE(store->forward(id1, o1.views, A.view()).is_ok());
    ASSERT_TRUE(store->forward(id2, o2.views, B.view()).is_ok());
    ASSERT_TRUE(dev.synchronize(B.view()).is_ok());
    gate.open();
    ASSERT_TRUE(download(dev, A.view(), o1, out1).is_ok());
    EXPECT_TRUE(same_outputs(out1, want));
    ASSERT_TRUE(store->discard(id1).is_ok());
    ASSERT_TRUE(store->discard(id2).is_ok());
  }
}

// With accept_nonfinite_gradients, forward, backward and the next submit all return while the
// trainer's stream is still held back (its dense backward): no host sync on the trainer's queue,
// the staging entry backward just gave back included (gpu/staging.hpp).
TEST(DeviceViewsOrder, SubmitAfterAStreamOrderedBackwardDoesNotWaitForTheTrainer) {
  for (Placement p : {Placement::kGpu, Placement::kCached}) {
    SCOPED_TRACE(to_string(p));
    StoreConfig c = config(p);
    c.accept_nonfinite_gradients = true;
    auto store = Store::open(c).value();
    auto ref = open_reference_store(c).value();
    gpu::Device& dev = *store->device();
    gpu::Stream A = dev.create_stream().value();
    std::mt19937_64 rng(3);
    const int depth = 2, steps = 8;
    std::vector<KeyBatch> kb;
    for (int i = 0; i < steps + depth; ++i) kb.push_back(uniform_batch(rng, c, 64, 3));
    Buffers out = make_buffers(c, kb[0]), grads = make_buffers(c, kb[0]);
    fill_random(rng, grads);
    DeviceViews o = make_device_views(dev, out), g = make_device_views(dev, grads);
    upload(dev, A.view(), grads, g);
    ASSERT_TRUE(dev.synchronize(A.view()).is_ok());
    for (int i = 0; i < depth; ++i) ASSERT_TRUE(store->submit(i, kb[i]).is_ok());
    for (int i = 0; i < steps; ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(ref->submit(i, kb[i]).is_ok());
      Buffers ref_out = make_buffers(c, kb[i]);
      ASSERT_TRUE(ref->forward(i, ref_out.views).is_ok());
      ASSERT_TRUE(ref->backward(i, grads.cviews).is_ok());
      Gate gate;
      ASSERT_TRUE(store->forward(i, o.views, A.view()).is_ok());
      gate.hold(dev, A.view());  // the dense model
      ASSERT_TRUE(store->backward(i, g.cviews, A.view()).is_ok());
      ASSERT_TRUE(store->submit(i + depth, kb[i + depth]).is_ok());  // returns with the gate closed
      gate.open();
      ASSERT_TRUE(download(dev, A.view(), o, out).is_ok());
      EXPECT_TRUE(same_outputs(out, ref_out));
    }
    EXPECT_TRUE(same_state(snapshot(*store), snapshot(*ref)));
  }
}

// Two stream-ordered forwards of tables in host memory (cpu beside a gpu table, staged through the
// adaptor, whose scratch is double-buffered; offload, looked up on the device into the views)
// return while the trainer's stream is held back.
TEST(DeviceViewsOrder, TwoForwardsOfStagedTablesDoNotWaitForTheTrainer) {
  for (Placement p : {Placement::kCpu, Placement::kOffload}) {
    SCOPED_TRACE(to_string(p));
    StoreConfig c = config(p, 2);
    c.tables[1].placement = Placement::kGpu;
    auto store = Store::open(c).value();
    auto ref = open_reference_store(c).value();
    gpu::Device& dev = *store->device();
    gpu::Stream A = dev.create_stream().value();
    std::mt19937_64 rng(4);
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(round);
      std::vector<KeyBatch> kb;
      std::vector<Buffers> out, want;
      std::vector<DeviceViews> o;
      for (int i = 0; i < 2; ++i) {
        const std::int64_t id = 2 * round + i;
        kb.push_back(uniform_batch(rng, c, 64, 3));
        ASSERT_TRUE(store->submit(id, kb[i]).is_ok());
        ASSERT_TRUE(ref->submit(id, kb[i]).is_ok());
        out.push_back(make_buffers(c, kb[i]));
        want.push_back(make_buffers(c, kb[i]));
        ASSERT_TRUE(ref->forward(id, want[i].views).is_ok());
        ASSERT_TRUE(ref->discard(id).is_ok());
        o.push_back(make_device_views(dev, out[i]));
      }
      Gate gate;
      gate.hold(dev, A.view());
      for (int i = 0; i < 2; ++i) {
        poison(dev, A.view(), o[i]);
        ASSERT_TRUE(store->forward(2 * round + i, o[i].views, A.view()).is_ok());
      }
      gate.open();
      for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(download(dev, A.view(), o[i], out[i]).is_ok());
        EXPECT_TRUE(same_outputs(out[i], want[i]));
        ASSERT_TRUE(store->discard(2 * round + i).is_ok());
      }
    }
  }
}

// A trainer on two streams used alternately, each step's forward work still pending when its
// backward is called (no host sync inside a step), batches submitted two ahead: the same outputs
// and tables as the reference store.
TEST(DeviceViewsOrder, AlternatingStreamsWithForwardPendingAcrossBackwardMatchTheReference) {
  for (Placement p : {Placement::kGpu, Placement::kCached, Placement::kOffload}) {
    for (bool accept : {false, true}) {
      SCOPED_TRACE(std::string(to_string(p)) + (accept ? ", accept_nonfinite_gradients" : ""));
      StoreConfig c = config(p, 2);
      c.accept_nonfinite_gradients = accept;
      auto store = Store::open(c).value();
      auto ref = open_reference_store(c).value();
      gpu::Device& dev = *store->device();
      gpu::Stream streams[2] = {dev.create_stream().value(), dev.create_stream().value()};
      std::mt19937_64 rng(6);
      const int depth = 2, steps = 8;
      std::vector<KeyBatch> kb;
      for (int i = 0; i < steps + depth; ++i) kb.push_back(uniform_batch(rng, c, 64, 3));
      std::vector<Buffers> out, grads, want;
      std::vector<DeviceViews> o, g;
      for (int i = 0; i < steps; ++i) {
        out.push_back(make_buffers(c, kb[i]));
        want.push_back(make_buffers(c, kb[i]));
        grads.push_back(make_buffers(c, kb[i]));
        fill_random(rng, grads.back());
        o.push_back(make_device_views(dev, out.back()));
        g.push_back(make_device_views(dev, grads.back()));
      }
      for (int i = 0; i < depth; ++i) ASSERT_TRUE(store->submit(i, kb[i]).is_ok());
      for (int i = 0; i < steps; ++i) {
        SCOPED_TRACE(i);
        ASSERT_TRUE(ref->submit(i, kb[i]).is_ok());
        ASSERT_TRUE(ref->forward(i, want[i].views).is_ok());
        ASSERT_TRUE(ref->backward(i, grads[i].cviews).is_ok());
        const gpu::StreamView s = streams[i % 2].view();
        poison(dev, s, o[i]);
        ASSERT_TRUE(store->forward(i, o[i].views, s).is_ok());
        upload(dev, s, grads[i], g[i]);  // the dense backward, queued behind the lookups
        ASSERT_TRUE(store->backward(i, g[i].cviews, s).is_ok());
        poison(dev, s, g[i]);  // must run after the updates read the gradients
        ASSERT_TRUE(store->submit(i + depth, kb[i + depth]).is_ok());
      }
      for (int i = 0; i < steps; ++i) {
        ASSERT_TRUE(download(dev, streams[i % 2].view(), o[i], out[i]).is_ok());
        EXPECT_TRUE(same_outputs(out[i], want[i])) << "step " << i;
      }
      EXPECT_TRUE(same_state(snapshot(*store), snapshot(*ref)));
    }
  }
}

// More gradient views than one count launch takes (16): stream-ordered steps match the reference,
// and a NaN in the last view is refused naming its table.
TEST(DeviceViewsOrder, MoreThanSixteenGradientViews) {
  const StoreConfig c = config(Placement::kGpu, 20);
  auto store = Store::open(c).value();
  auto ref = open_reference_store(c).value();
  gpu::Device& dev = *store->device();
  gpu::Stream A = dev.create_stream().value();
  std::mt19937_64 rng(8);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const KeyBatch kb = uniform_batch(rng, c, 32, 2);
    ASSERT_TRUE(store->submit(i, kb).is_ok());
    ASSERT_TRUE(ref->submit(i, kb).is_ok());
    Buffers out = make_buffers(c, kb), want = make_buffers(c, kb), grads = make_buffers(c, kb);
    fill_random(rng, grads);
    ASSERT_TRUE(ref->forward(i, want.views).is_ok());
    ASSERT_TRUE(ref->backward(i, grads.cviews).is_ok());
    DeviceViews o = make_device_views(dev, out), g = make_device_views(dev, grads);
    if (i == 2) {  // first a refused backward with a NaN in the last view
      Buffers bad = grads;
      bad.data.back()[5] = std::numeric_limits<float>::quiet_NaN();
      DeviceViews gb = make_device_views(dev, bad);
      StepMode m;
      m.device = true;
      m.stream = A.view();
      ASSERT_TRUE(store->forward(i, o.views, A.view()).is_ok());
      upload(dev, A.view(), bad, gb);
      const Status st = store->backward(i, gb.cviews, A.view());
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find("t19"), std::string::npos) << st.message();
      ASSERT_TRUE(dev.synchronize(A.view()).is_ok());
    }
    StepMode m;
    m.device = true;
    m.stream = A.view();
    m.outputs = &o;
    m.grads = &g;
    ASSERT_TRUE(run_step(*store, i, grads, out, m).is_ok());
    EXPECT_TRUE(same_outputs(out, want));
  }
  EXPECT_TRUE(same_state(snapshot(*store), snapshot(*ref)));
}

// offload with `offload_gather: cpu`: a stream-ordered forward of device views copies the CPU's
// pooled outputs from the batch's own pinned memory, so a backward of an earlier batch with host
// gradients has no device read of host rows to wait for, and returns while the trainer's stream is
// held back; the held forward's outputs then equal the reference's (the rows it pooled on the CPU
// before the update). (Before, the backward waited for the trainer's stream.)
TEST(DeviceViewsOrder, OffloadCpuGatherBackwardDoesNotWaitForTheTrainersStream) {
  StoreConfig c = config(Placement::kOffload);
  c.offload_gather = OffloadGather::kCpu;
  auto store = Store::open(c).value();
  auto ref = open_reference_store(c).value();
  gpu::Device& dev = *store->device();
  gpu::Stream A = dev.create_stream().value();
  std::mt19937_64 rng(5);
  const KeyBatch k0 = uniform_batch(rng, c, 64, 3), k1 = uniform_batch(rng, c, 64, 3);
  for (Store* s : {store.get(), ref.get()}) {
    ASSERT_TRUE(s->submit(0, k0).is_ok());
    ASSERT_TRUE(s->submit(1, k1).is_ok());
  }
  Buffers out0 = make_buffers(c, k0), want0 = make_buffers(c, k0), grads = make_buffers(c, k0);
  Buffers out1 = make_buffers(c, k1), want1 = make_buffers(c, k1);
  fill_random(rng, grads);
  ASSERT_TRUE(ref->forward(0, want0.views).is_ok());
  ASSERT_TRUE(ref->forward(1, want1.views).is_ok());
  ASSERT_TRUE(ref->backward(0, grads.cviews).is_ok());
  ASSERT_TRUE(store->forward(0, out0.views).is_ok());
  DeviceViews o1 = make_device_views(dev, out1);
  Gate gate;
  gate.hold(dev, A.view());  // the trainer's stream, busy
  ASSERT_TRUE(store->forward(1, o1.views, A.view()).is_ok());
  auto backward = std::async(std::launch::async, [&] { return store->backward(0, grads.cviews); });
  const bool returned = backward.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "backward waited for the trainer's stream";
  gate.open();
  EXPECT_TRUE(backward.get().is_ok());
  ASSERT_TRUE(download(dev, A.view(), o1, out1).is_ok());
  EXPECT_TRUE(same_outputs(out0, want0));
  EXPECT_TRUE(same_outputs(out1, want1));
  ASSERT_TRUE(store->discard(1).is_ok());
}

}  // namespace
}  // namespace strata
