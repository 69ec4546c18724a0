// cache::BasicPrefetcher's driving loop on its own, against hand-worked expectations (the
// equivalence tests drive both of their sides with the same prefetcher, so they cannot see a bug
// in the loop itself): refused prepares, deferral counts, FIFO planning of deferred batches,
// discards, failed submits of previewed batches, and flushes that fail half way.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cache/cache_planner.hpp"
#include "cache/prefetcher.hpp"
#include "tests/cache/planner_options.hpp"

namespace strata::cache {
namespace {

using P = BasicPrefetcher<CachePlanner>;

// Records what the prefetcher asks of it; refuses prepare() or one write_back() call on demand.
struct Exec final : P::Executor {
  bool refuse_staging = false;  // prepare() -> kResourceExhausted (defers)
  bool refuse_device = false;   // prepare() -> kUnavailable (an error)
  int fail_chunk = -1;          // the write_back() call (counting from 0) that fails
  int chunk_calls = 0;
  std::vector<std::int64_t> prepared, issued;
  std::vector<Transfer> written;

  Status prepare(P::Batch& b) override {
    prepared.push_back(b.id);
    if (refuse_staging) return Status::resource_exhausted("batch " + std::to_string(b.id) + ": no staging (test)");
    if (refuse_device) return Status::unavailable("batch " + std::to_string(b.id) + ": device lost (test)");
    return Status::ok();
  }
  void issue(P::Batch& b) override { issued.push_back(b.id); }
  std::size_t flush_rows(int) override { return 2; }
  Status write_back(int, const std::vector<Transfer>& rows) override {
    if (chunk_calls++ == fail_chunk) return Status::unavailable("write-back failed (test)");
    written.insert(written.end(), rows.begin(), rows.end());
    return Status::ok();
  }
};

// A batch of one table (table 0) and its unique keys.
struct B {
  UniqueKeys u;
  P::Batch b;
  B(std::int64_t id, std::vector<Key> keys) {
    u = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
    b.id = id;
    b.keys = {{0, &u}};
  }
};

// A prefetcher of one pool of `slots` slots serving table 0, driven by `e`.
std::unique_ptr<P> make(int lookahead, std::int64_t slots, Policy policy, Exec& e) {
  auto p = std::make_unique<P>(lookahead, 1);
  p->add_pool(std::make_unique<CachePlanner>(testing::pool_options(slots, policy, {{"t", 0}})), {0});
  p->set_executor(&e);
  return p;
}

// prepare() runs after every pool probed and before any commit: its refusal leaves the pools as
// they were. Deferral is counted once per batch, however many forwards it takes.
TEST(Prefetcher, RefusedPrepareChangesNoPlannerStateAndCountsOnce) {
  Exec e;
  auto p = make(0, 8, Policy::kLru, e);
  B a(1, {1, 2, 3});
  e.refuse_staging = true;
  ASSERT_TRUE(p->submit(a.b).is_ok());  // deferred, not an error
  EXPECT_TRUE(a.b.deferred);
  EXPECT_TRUE(a.b.executor_refused);
  EXPECT_FALSE(a.b.planned);
  EXPECT_EQ(p->planner(0).resident(), 0);
  EXPECT_EQ(p->planner(0).pinned(), 0);
  EXPECT_EQ(p->table_stats(0).accesses, 0);
  EXPECT_EQ(p->table_stats(0).deferred, 1);
  EXPECT_EQ(p->plan(a.b).code(), StatusCode::kResourceExhausted);  // the forward, still refused
  EXPECT_EQ(p->table_stats(0).deferred, 1);
  EXPECT_EQ(p->planner(0).pinned(), 0);
  e.refuse_staging = false;
  ASSERT_TRUE(p->plan(a.b).is_ok());
  EXPECT_FALSE(a.b.executor_refused);
  EXPECT_EQ(e.prepared, (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_EQ(e.issued, std::vector<std::int64_t>{1});
  EXPECT_EQ(p->planner(0).pinned(), 3);
  EXPECT_EQ(p->table_stats(0).accesses, 3);
  p->retire(a.b, true);
  EXPECT_EQ(p->in_flight(), 0);
  EXPECT_EQ(p->planner(0).pinned(), 0);
}

// A flush whose second chunk fails: the first chunk is clean, the failed chunk and the rest stay
// dirty, and the next flush writes exactly those.
TEST(Prefetcher, FlushFailureLeavesUnwrittenRowsDirty) {
  Exec e;
  auto p = make(0, 8, Policy::kLru, e);
  B a(1, {1, 2, 3, 4, 5});
  ASSERT_TRUE(p->submit(a.b).is_ok());
  ASSERT_TRUE(a.b.planned);
  p->retire(a.b, true);
  EXPECT_EQ(p->planner(0).dirty().size(), 5u);
  e.fail_chunk = 1;
  EXPECT_EQ(p->flush().code(), StatusCode::kUnavailable);
  ASSERT_EQ(e.written.size(), 2u);
  const std::vector<Transfer> dirty = p->planner(0).dirty();
  ASSERT_EQ(dirty.size(), 3u);
  for (const Transfer& w : e.written)
    for (const Transfer& d : dirty) EXPECT_FALSE(w.table == d.table && w.row == d.row) << "row " << w.row;
  e.written.clear();
  EXPECT_TRUE(p->flush().is_ok());
  ASSERT_EQ(e.written.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(e.written[i].row, dirty[i].row);
  EXPECT_TRUE(p->planner(0).dirty().empty());
  EXPECT_EQ(p->table_stats(0).writebacks, 5);
}

// 4 slots: A pins all 4, B (4 other rows) is deferred, C waits behind B (FIFO, even though C would
// not fit either). Retiring A plans B (writing A's dirty rows back) and defers C; retiring B plans C.
TEST(Prefetcher, DeferredBatchesArePlannedInOrderWhenBatchesRetire) {
  Exec e;
  auto p = make(0, 4, Policy::kLru, e);
  B a(1, {1, 2, 3, 4}), b(2, {5, 6, 7, 8}), c(3, {1});
  ASSERT_TRUE(p->submit(a.b).is_ok());
  ASSERT_TRUE(a.b.planned);
  ASSERT_TRUE(p->submit(b.b).is_ok());
  EXPECT_TRUE(b.b.deferred);
  EXPECT_FALSE(b.b.executor_refused);  // the pool refused
  ASSERT_TRUE(p->submit(c.b).is_ok());
  EXPECT_FALSE(c.b.planned);
  EXPECT_FALSE(c.b.deferred);  // never tried: B is in front
  EXPECT_EQ(p->oldest_pending(), &b.b);
  EXPECT_EQ(p->table_stats(0).deferred, 1);
  p->retire(a.b, true);
  EXPECT_TRUE(b.b.planned);
  EXPECT_TRUE(c.b.deferred);  // B pins every slot
  EXPECT_EQ(p->oldest_pending(), &c.b);
  std::size_t written_back = 0;
  for (const auto& part : b.b.parts) written_back += part.plan.writebacks.size();
  EXPECT_EQ(written_back, 4u);  // A's dirty rows, evicted by B
  p->retire(b.b, false);
  EXPECT_TRUE(c.b.planned);
  EXPECT_EQ(p->oldest_pending(), nullptr);
  EXPECT_EQ(e.issued, (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(p->table_stats(0).deferred, 2);  // B and C, once each
  p->retire(c.b, false);
  EXPECT_EQ(p->in_flight(), 0);
}

// Discarding a deferred batch that was never planned: out of the window and of in_flight, its
// deferral still counted; the batch behind it is not deferred, so only plan() or a retire plans it.
TEST(Prefetcher, DiscardOfDeferredBatch) {
  Exec e;
  auto p = make(0, 4, Policy::kLookahead, e);
  B a(1, {1, 2, 3, 4}), b(2, {5, 6, 7, 8}), c(3, {9});
  ASSERT_TRUE(p->submit(a.b).is_ok());
  ASSERT_TRUE(p->submit(b.b).is_ok());
  ASSERT_TRUE(b.b.deferred);
  ASSERT_TRUE(p->submit(c.b).is_ok());
  EXPECT_FALSE(c.b.planned);
  EXPECT_EQ(p->in_flight(), 3);
  p->discard(b.b);
  EXPECT_EQ(p->in_flight(), 2);
  EXPECT_FALSE(c.b.planned);
  EXPECT_EQ(p->oldest_pending(), &c.b);
  EXPECT_EQ(p->table_stats(0).deferred, 1);
  EXPECT_EQ(p->plan(c.b).code(), StatusCode::kResourceExhausted);  // A pins the 4 slots
  EXPECT_EQ(p->table_stats(0).deferred, 2);
  p->retire(a.b, false);
  EXPECT_TRUE(c.b.planned);
  EXPECT_EQ(e.issued, (std::vector<std::int64_t>{1, 3}));
  p->retire(c.b, false);
  EXPECT_EQ(p->planner(0).pinned(), 0);
  EXPECT_EQ(p->in_flight(), 0);
}

// submit(B) fails with the error of A's plan (A was pending in front of it): B is taken back and
// goes back to its preview (its keys differed from the preview's), A stays pending; submitted
// again, B keeps the preview's place (seq 0) and A is planned first.
TEST(Prefetcher, FailedSubmitTakesBackThePreviewedBatchOnly) {
  Exec e;
  auto p = make(1, 8, Policy::kLookahead, e);
  const std::vector<Key> previewed = {3, 4};
  p->preview(1, {0}, {dedup_keys(previewed.data(), 2)});
  B a(0, {1, 2});
  ASSERT_TRUE(p->submit(a.b).is_ok());
  EXPECT_FALSE(a.b.planned);  // lookahead 1: waits for one more batch
  EXPECT_EQ(a.b.seq, 1);
  B b(1, {5, 6});  // not the keys previewed
  e.refuse_device = true;
  const Status failed = p->submit(b.b);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.message().find("batch 0"), std::string::npos) << failed.to_string();  // A's error
  EXPECT_EQ(p->in_flight(), 1);
  EXPECT_EQ(p->oldest_pending(), &a.b);
  EXPECT_TRUE(a.b.executor_refused);
  EXPECT_FALSE(a.b.deferred);
  EXPECT_TRUE(e.issued.empty());
  e.refuse_device = false;
  ASSERT_TRUE(p->submit(b.b).is_ok());
  EXPECT_TRUE(a.b.planned);
  EXPECT_FALSE(b.b.planned);
  EXPECT_EQ(b.b.seq, 0);  // the preview's place
  EXPECT_EQ(p->in_flight(), 2);
  p->previews_done(1);
  p->retire(a.b, true);
  ASSERT_TRUE(p->plan(b.b).is_ok());
  EXPECT_EQ(e.issued, (std::vector<std::int64_t>{0, 1}));
  p->retire(b.b, true);
  EXPECT_EQ(p->in_flight(), 0);
  EXPECT_EQ(p->table_stats(0).deferred, 0);
}

// Misuse of the loop is a programmer error, caught before it becomes undefined behaviour: plan() of
// a batch that is neither planned nor pending would take the front of an empty queue; retire() of
// an unplanned batch would leave a dangling pointer in the queue.
TEST(PrefetcherDeathTest, PlanOfABatchNotSubmittedAborts) {
  Exec e;
  auto p = make(0, 8, Policy::kLru, e);
  B a(1, {1});
  EXPECT_DEATH((void)p->plan(a.b), "plan\\(\\) of a batch not submitted");
}

TEST(PrefetcherDeathTest, RetireOfAPendingBatchAborts) {
  Exec e;
  auto p = make(1, 8, Policy::kLru, e);
  B a(1, {1});
  ASSERT_TRUE(p->submit(a.b).is_ok());
  ASSERT_FALSE(a.b.planned);  // lookahead 1: pending
  EXPECT_DEATH(p->retire(a.b, true), "retire\\(\\) of a batch not planned");
}

// A prefetcher whose executor was never set refuses to plan or to flush: it cannot mark rows clean
// that nobody wrote back.
TEST(PrefetcherDeathTest, NoExecutorSetAbortsPlanAndFlush) {
  P p(0, 1);
  p.add_pool(std::make_unique<CachePlanner>(testing::pool_options(8, Policy::kLru, {{"t", 0}})), {0});
  B a(1, {1, 2});
  EXPECT_DEATH((void)p.submit(a.b), "set_executor");
  EXPECT_DEATH((void)p.flush(), "set_executor");
}

// The explicit PlanOnly executor: plans are made and nothing moves; a flush drops the dirty rows.
TEST(Prefetcher, PlanOnlyPlansAndFlushDropsDirtyRows) {
  P p(0, 1);
  p.add_pool(std::make_unique<CachePlanner>(testing::pool_options(8, Policy::kLru, {{"t", 0}})), {0});
  p.set_executor(&P::plan_only());
  B a(1, {1, 2, 3});
  ASSERT_TRUE(p.submit(a.b).is_ok());
  ASSERT_TRUE(a.b.planned);
  EXPECT_EQ(a.b.parts[0].plan.fills.size(), 3u);
  p.retire(a.b, true);
  EXPECT_EQ(p.planner(0).dirty().size(), 3u);
  ASSERT_TRUE(p.flush().is_ok());
  EXPECT_TRUE(p.planner(0).dirty().empty());
  EXPECT_EQ(p.planner(0).resident(), 3);
}

}  // namespace
}  // namespace strata::cache
