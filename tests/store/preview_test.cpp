// Store::preview: the keys of batches the trainer will submit later, which deepen the lookahead
// policy's window beyond the batches in flight. Previews are checked alike in every mode (and by
// the reference) and change nothing but which rows stay cached: outputs and table state must equal
// the reference whatever the previews say (kept, re-keyed, skipped, dropped, interleaved with
// batches never previewed), and a deep preview window must raise the hit rate where the batches
// in flight alone cannot.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>

#include "host/dedup.hpp"
#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

KeyBatch one_table_batch(const std::string& table, std::vector<Key> keys) {
  KeyBatch kb;
  JaggedKeys f;
  f.table = table;
  f.offsets = {0, static_cast<std::int64_t>(keys.size())};
  f.keys = std::move(keys);
  kb.features.push_back(std::move(f));
  return kb;
}

StoreConfig one_table_config(Placement placement, int preview) {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  c.cache.policy = cache::Policy::kLookahead;
  c.cache.lookahead = 1;
  c.cache.preview = preview;
  TableConfig t;
  t.spec.name = "user";
  t.spec.rows = 100;
  t.spec.dim = 4;
  t.spec.optimizer.kind = OptimizerKind::kAdagrad;
  t.placement = placement;
  if (placement == Placement::kCached || placement == Placement::kHybrid) t.cache.rows = 20;
  c.tables.push_back(t);
  return c;
}

bool contains(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

// Every check of preview(), in every placement and in the reference: a clear Status naming the
// batch and the value, and nothing changes (no preview recorded, no row touched, batches in flight
// unchanged).
class PreviewChecks : public ::testing::TestWithParam<int> {};  // a Placement, or -1: the reference

TEST_P(PreviewChecks, BadPreviewsAreRefusedAlikeAndChangeNothing) {
  const int p = GetParam();
  const Placement placement = p < 0 ? Placement::kCpu : static_cast<Placement>(p);
  auto open = [&](int preview) {
    return p < 0 ? open_reference_store(one_table_config(placement, preview))
                 : Store::open(one_table_config(placement, preview));
  };
  {
    auto off = open(0);
    ASSERT_TRUE(off.is_ok()) << off.status().to_string();
    Status st = (*off)->preview(1, one_table_batch("user", {1, 2}));
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(contains(st, "preview of batch 1")) << st.message();
    EXPECT_TRUE(contains(st, "cache.preview = 0")) << st.message();
    EXPECT_EQ((*off)->previewed(), 0);
  }
  auto s = open(2);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Store& store = **s;
  const Snapshot before = snapshot(store);

  Status st = store.preview(5, one_table_batch("item", {1}));
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(st, "preview of batch 5")) << st.message();
  EXPECT_TRUE(contains(st, "'item'")) << st.message();
  st = store.preview(5, one_table_batch("user", {3, 100}));
  EXPECT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "preview of batch 5")) << st.message();
  EXPECT_TRUE(contains(st, "100")) << st.message();
  st = store.preview(5, one_table_batch("user", {-1}));
  EXPECT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "-1")) << st.message();
  EXPECT_EQ(store.previewed(), 0);

  ASSERT_TRUE(store.preview(5, one_table_batch("user", {1, 2, 3})).is_ok());
  st = store.preview(5, one_table_batch("user", {1}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st, "must increase")) << st.message();
  EXPECT_TRUE(contains(st, "above 5")) << st.message();
  EXPECT_FALSE(store.preview(4, one_table_batch("user", {1})).is_ok());
  ASSERT_TRUE(store.preview(6, one_table_batch("user", {4})).is_ok());
  st = store.preview(7, one_table_batch("user", {5}));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(st, "cache.preview = 2")) << st.message();
  EXPECT_EQ(store.previewed(), 2);

  // A batch never previewed leaves the previews alone; a batch in flight cannot be previewed.
  ASSERT_TRUE(store.submit(3, one_table_batch("user", {7, 8})).is_ok());
  EXPECT_EQ(store.previewed(), 2);
  store.drop_previews();
  EXPECT_EQ(store.previewed(), 0);
  st = store.preview(3, one_table_batch("user", {7}));
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(contains(st, "in flight")) << st.message();
  EXPECT_EQ(store.previewed(), 0);
  ASSERT_TRUE(store.discard(3).is_ok());

  // Submitting a previewed id consumes its preview and those before it (skipped batches); a
  // failed submit consumes nothing.
  ASSERT_TRUE(store.preview(10, one_table_batch("user", {1})).is_ok());
  ASSERT_TRUE(store.preview(11, one_table_batch("user", {2})).is_ok());
  EXPECT_FALSE(store.submit(11, one_table_batch("user", {200})).is_ok());
  EXPECT_EQ(store.previewed(), 2);
  ASSERT_TRUE(store.submit(11, one_table_batch("user", {2, 9})).is_ok());  // other keys than previewed
  EXPECT_EQ(store.previewed(), 0);
  ASSERT_TRUE(store.discard(11).is_ok());
  ASSERT_TRUE(store.flush().is_ok());
  EXPECT_TRUE(same_state(before, snapshot(store)));
}

INSTANTIATE_TEST_SUITE_P(Placements, PreviewChecks, ::testing::Values(-1, 0, 1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param < 0 ? std::string("reference")
                                              : std::string(to_string(static_cast<Placement>(i.param)));
                         });

TEST(Preview, HorizonIsValidatedAndRoundTripsThroughJson) {
  StoreConfig c = one_table_config(Placement::kCached, -1);
  auto bad = Store::open(c);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_TRUE(contains(bad.status(), "cache preview -1")) << bad.status().message();
  c.cache.preview = kMaxPreview + 1;
  EXPECT_FALSE(Store::open(c).is_ok());
  c.cache.preview = 300;
  auto back = parse_store_config(to_json(c));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().cache.preview, 300);
  auto typo = parse_store_config(R"({"cache": {"previews": 4}, "tables": [{"name": "a", "rows": 10, "dim": 4}]})");
  EXPECT_FALSE(typo.is_ok());
}

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("strata_preview_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

// Randomized training where a trainer previews ahead as a data loader would, and also: previews
// keys other than those it then submits, previews batches it never submits, submits evaluation
// batches it never previewed (forward and discard), drops every preview, and flushes and saves
// mid-training. Every call must answer as the reference answers, every output and the final state
// must be bit-exact, and the checkpoint must load back to the same state.
TEST(Preview, RandomizedTrainingWithPreviewsMatchesTheReference) {
  std::int64_t previews_made = 0, rekeyed = 0, skipped = 0, evals = 0;
  for (int seed = 0; seed < 40 && !::testing::Test::HasFatalFailure(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 104729 + 5);
    StoreConfig config = random_config(rng, 1 + static_cast<int>(rng() % 3));
    const int steps = 24;
    std::vector<KeyBatch> batches, others;
    for (int i = 0; i < steps; ++i) {
      batches.push_back(random_batch(rng, config, 1 + static_cast<std::int64_t>(rng() % 24)));
      others.push_back(random_batch(rng, config, 1 + static_cast<std::int64_t>(rng() % 24)));
    }
    const int depth = 1 + static_cast<int>(rng() % 3);
    config.cache.policy = rng() % 4 ? cache::Policy::kLookahead : static_cast<cache::Policy>(rng() % 2);
    config.cache.lookahead = static_cast<int>(rng() % 4);
    config.cache.max_in_flight = std::max(depth + 1, config.cache.lookahead + 1);  // + 1: an evaluation batch
    config.cache.preview = 1 + static_cast<int>(rng() % 30);
    config.device.backend = BackendChoice::kEmu;
    config.device.emu_max_delay_us = rng() % 3 == 0 ? 20 : 0;
    for (auto& t : config.tables) {
      t.placement = rng() % 3 ? Placement::kCached : static_cast<Placement>(rng() % 5);
      if (t.placement != Placement::kCached && t.placement != Placement::kHybrid) continue;
      std::int64_t max_unique = 1;
      for (const auto* set : {&batches, &others})
        for (const auto& kb : *set)
          for (const auto& f : kb.features)
            if (f.table == t.spec.name)
              max_unique = std::max(max_unique, dedup_keys(f.keys.data(), f.num_keys()).size());
      // Room for the batches in flight plus an evaluation batch, barely: rows are evicted all the time.
      t.cache.rows = std::min(t.spec.rows, max_unique * (depth + 1) + static_cast<std::int64_t>(rng() % 3));
    }
    SCOPED_TRACE("policy " + std::string(cache::to_string(config.cache.policy)) + " lookahead " +
                 std::to_string(config.cache.lookahead) + " preview " + std::to_string(config.cache.preview) +
                 " depth " + std::to_string(depth));
    auto dev = Store::open(config);
    auto ref = open_reference_store(config);
    ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
    ASSERT_TRUE(ref.is_ok());
    Store& d = **dev;
    Store& r = *ref.value();

    // Both stores get every call; their answers must agree.
    auto both = [&](const std::function<Status(Store&)>& call) {
      const Status a = call(d), b = call(r);
      EXPECT_EQ(a.code(), b.code()) << a.to_string() << " vs " << b.to_string();
      EXPECT_EQ(d.previewed(), r.previewed());
      return a;
    };
    // Training batch i has id 2 i; odd ids are previewed and never submitted (skipped).
    std::int64_t next_preview = 0;  // the next training batch to preview
    auto preview_ahead = [&](int upto) {
      while (next_preview < std::min<std::int64_t>(upto, steps) && d.previewed() < config.cache.preview && rng() % 5) {
        const auto i = static_cast<std::size_t>(next_preview);
        if (rng() % 8 == 0 && d.previewed() + 1 < config.cache.preview) {
          ASSERT_TRUE(both([&](Store& s) { return s.preview(2 * next_preview - 1, others[i]); }).is_ok());
          ++skipped;
        }
        const bool rekey = rng() % 6 == 0;  // the loader's guess was wrong: other keys are submitted
        rekeyed += rekey;
        ASSERT_TRUE(
            both([&](Store& s) { return s.preview(2 * next_preview, rekey ? others[i] : batches[i]); }).is_ok());
        ++previews_made;
        ++next_preview;
      }
    };
    auto submit = [&](int i) {
      next_preview = std::max<std::int64_t>(next_preview, i + 1);
      const Status st = both([&](Store& s) { return s.submit(2 * i, batches[static_cast<std::size_t>(i)]); });
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    };
    const int mid = 1 + static_cast<int>(rng() % (steps - 2));
    const std::string ckpt_dev = temp_dir("dev" + std::to_string(seed)),
                      ckpt_ref = temp_dir("ref" + std::to_string(seed));
    preview_ahead(steps);
    for (int i = 0; i < std::min(depth, steps); ++i) submit(i);
    for (int i = 0; i < steps && !::testing::Test::HasFatalFailure(); ++i) {
      const KeyBatch& kb = batches[static_cast<std::size_t>(i)];
      Buffers out_dev = make_buffers(config, kb), out_ref = make_buffers(config, kb), grads = make_buffers(config, kb);
      ASSERT_TRUE(both([&](Store& s) { return s.forward(2 * i, &s == &d ? out_dev.views : out_ref.views); }).is_ok());
      ASSERT_EQ(out_dev.data, out_ref.data) << "step " << i;
      fill_random(rng, grads);
      ASSERT_TRUE(both([&](Store& s) { return s.backward(2 * i, grads.cviews); }).is_ok());
      if (rng() % 6 == 0) {  // an evaluation batch, never previewed: forward, then discard
        const KeyBatch& eval = others[static_cast<std::size_t>(i)];
        const std::int64_t id = 1000000 + i;
        ASSERT_TRUE(both([&](Store& s) { return s.submit(id, eval); }).is_ok());
        Buffers e_dev = make_buffers(config, eval), e_ref = make_buffers(config, eval);
        ASSERT_TRUE(both([&](Store& s) { return s.forward(id, &s == &d ? e_dev.views : e_ref.views); }).is_ok());
        ASSERT_EQ(e_dev.data, e_ref.data) << "evaluation after step " << i;
        ASSERT_TRUE(both([&](Store& s) { return s.discard(id); }).is_ok());
        ++evals;
      }
      if (rng() % 10 == 0) {  // the loader was reset
        d.drop_previews();
        r.drop_previews();
        next_preview = i + depth + 1;
      }
      if (i == mid) {
        ASSERT_TRUE(both([](Store& s) { return s.flush(); }).is_ok());
        ASSERT_TRUE(same_state(snapshot(d), snapshot(r)));
        ASSERT_TRUE(d.save(ckpt_dev).is_ok());
        ASSERT_TRUE(r.save(ckpt_ref).is_ok());
      }
      preview_ahead(i + depth + 1 + static_cast<int>(rng() % 40));
      if (i + depth < steps) submit(i + depth);
    }
    EXPECT_TRUE(same_state(snapshot(d), snapshot(r)));
    ASSERT_TRUE(d.load(ckpt_dev).is_ok());
    ASSERT_TRUE(r.load(ckpt_ref).is_ok());
    EXPECT_TRUE(same_state(snapshot(d), snapshot(r)));
    std::filesystem::remove_all(ckpt_dev);
    std::filesystem::remove_all(ckpt_ref);
  }
  // The run reached every path.
  EXPECT_GT(previews_made, 300);
  EXPECT_GT(rekeyed, 30);
  EXPECT_GT(skipped, 10);
  EXPECT_GT(evals, 30);
}

// A cyclic scan over 1000 rows, 50 per batch, through a 400-row cache, one batch in flight: with
// only the batches in flight in view no policy can tell which rows come back first, so the
// lookahead policy falls back to recency and frequency, which a scan defeats (every row is used
// once per cycle: it is always evicted just before its reuse). With the next 64 batches previewed
// (more than a cycle of 20) it evicts the rows reused last and keeps about 350 of the 1000 rows of
// the cycle, as Belady's optimum does: a hit rate near 35%. Outputs are the same either way.
TEST(Preview, ADeepPreviewWindowRaisesTheHitRateOfACyclicScan) {
  std::vector<std::vector<float>> outputs[2];
  cache::CacheStats stats[2];
  for (int with_preview = 0; with_preview < 2; ++with_preview) {
    StoreConfig c = one_table_config(Placement::kCached, with_preview ? 64 : 0);
    c.tables[0].spec.rows = 1000;
    c.tables[0].cache.rows = 400;
    c.cache.lookahead = 0;
    c.cache.max_in_flight = 1;
    auto s = Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    Store& store = **s;
    const int steps = 200, per_batch = 50;
    auto batch = [&](int i) {
      std::vector<Key> keys;
      for (int k = 0; k < per_batch; ++k) keys.push_back((i * per_batch + k) % 1000);
      return one_table_batch("user", keys);
    };
    int previewed_upto = 0;
    std::mt19937_64 rng(1);
    for (int i = 0; i < steps; ++i) {
      for (; with_preview && previewed_upto < steps && store.previewed() < 64; ++previewed_upto)
        ASSERT_TRUE(store.preview(previewed_upto, batch(previewed_upto)).is_ok());
      const KeyBatch kb = batch(i);
      ASSERT_TRUE(store.submit(i, kb).is_ok());
      Buffers out = make_buffers(c, kb), grads = make_buffers(c, kb);
      ASSERT_TRUE(store.forward(i, out.views).is_ok());
      fill_random(rng, grads);
      ASSERT_TRUE(store.backward(i, grads.cviews).is_ok());
      for (auto& o : out.data) outputs[with_preview].push_back(std::move(o));
    }
    stats[with_preview] = store.stats().cache.at(0).second;
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  const double accesses = 200 * 50;
  const double without = static_cast<double>(stats[0].hits) / accesses,
               with = static_cast<double>(stats[1].hits) / accesses;
  std::printf("cyclic scan hit rate: without previews %.4f, with 64 previewed %.4f\n", without, with);
  EXPECT_LT(without, 0.05);
  EXPECT_GT(with, 0.30);  // (400 - 50) / 1000 of every cycle after the first: 0.35 x 180 / 200
}

}  // namespace
}  // namespace strata
