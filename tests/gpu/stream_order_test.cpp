// Stream order on the emu device: a wait takes the record of an event in force when it is issued
// (as cudaStreamWaitEvent does), and the staging ring does not wait on the host for an entry whose
// last use still waits for another stream. Streams are held back by gates (host tasks blocked on a
// future), never by time.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "tests/gpu/stream_gate.hpp"

namespace strata::gpu {
namespace {

using Gate = StreamGate;

TEST(EmuEvents, AWaitIsNotReleasedByALaterRecordOnAnotherStream) {
  auto dev = make_emu_device().value();
  Stream a = dev->create_stream().value(), b = dev->create_stream().value(), c = dev->create_stream().value();
  Event e = dev->create_event().value();
  // Many rounds: under the old semantics c was released as soon as b ran its record, and its task
  // then ran before a's, in (nearly) every round.
  for (int round = 0; round < 50; ++round) {
    SCOPED_TRACE(round);
    Gate gate;
    std::atomic<bool> a_done{false}, c_early{false};
    gate.hold(*dev, a.view());
    dev->host_task(a.view(), [&] { a_done = true; });
    dev->record(e.view(), a.view());
    dev->wait(c.view(), e.view());  // the record on a
    dev->host_task(c.view(), [&] { c_early = !a_done.load(); });
    dev->record(e.view(), b.view());  // b is idle: this record completes at once
    ASSERT_TRUE(dev->synchronize(b.view()).is_ok());
    EXPECT_TRUE(dev->ready(e.view())) << "ready() and synchronize(event) follow the latest record";
    ASSERT_TRUE(dev->synchronize(e.view()).is_ok());
    gate.open();
    ASSERT_TRUE(dev->synchronize(c.view()).is_ok());
    ASSERT_TRUE(dev->synchronize(a.view()).is_ok());
    EXPECT_FALSE(c_early.load()) << "c's wait on the record on a was released by the later record on b";
  }
}

TEST(StagingRing, AnEntryStillInUseOnAnotherStreamIsNotWaitedFor) {
  auto dev = make_emu_device().value();
  Stream s = dev->create_stream().value();
  StagingRing pool(*dev);
  const StagingSizes want{256, 256, 256};
  auto first = pool.take(want);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  Staging* const first_entry = first->get();
  Gate gate;
  gate.hold(*dev, s.view());  // the caller's stream, busy (a dense backward)
  dev->record((*first)->done(), s.view());
  pool.give_back(std::move(first).value());
  // The only free entry's last use waits for the gate: a new entry, without waiting for it.
  EXPECT_EQ(pool.made_ahead(), 0u);
  auto second = pool.take(want);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_NE(second->get(), first_entry);
  EXPECT_EQ(pool.made_ahead(), 1u);  // made rather than wait (StoreStats' staging.ahead)
  gate.open();
  ASSERT_TRUE(dev->synchronize(s.view()).is_ok());
  pool.give_back(std::move(second).value());
  // Once done, the oldest free entry is reused.
  auto third = pool.take(want);
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  EXPECT_EQ(third->get(), first_entry);
  EXPECT_EQ(pool.made_ahead(), 1u);
}

}  // namespace
}  // namespace strata::gpu
