// Dynamic tables over a world of thread ranks where one rank differs (issue 36): a rank refusing a batch before
// admission, ranks that disagree on training, a device fault on one rank, a rank without the table's feature; and two
// batches in flight against the reference of the world (pins of batches in flight decide refusals and victims). Every
// rank must fail or succeed together, with nothing changed on a refusal, and never fall out of step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "store/detail/dynamic_state.hpp"
#include "tests/store/dynamic_harness.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata::testing {
namespace {

StoreConfig review_config() {
  StoreConfig c = thread_rank_config(64 << 20);
  TableConfig user;
  user.spec.name = "user";
  user.spec.rows = 10;
  user.spec.dim = 8;
  user.spec.init.bound = 0.5f;
  user.spec.optimizer.kind = OptimizerKind::kSgd;
  user.spec.optimizer.learning_rate = 0.25f;
  user.dynamic = DynamicSpec{1, Eviction::kLru, 0, Unseen::kInitial};
  user.placement = Placement::kGpu;
  user.sharding.type = dispatch::ShardingType::kRow;
  c.tables.push_back(user);
  return c;
}

KeyBatch batch_of(std::vector<Key> keys, bool train, const std::string& name = "user") {
  KeyBatch kb;
  kb.train = train;
  JaggedKeys f;
  f.table = name;
  f.keys = std::move(keys);
  f.offsets = {0, static_cast<std::int64_t>(f.keys.size())};
  kb.features.push_back(std::move(f));
  return kb;
}

// One rank refuses batch 0 before admission (a feature the store does not have); the other is valid. Both must fail
// batch 0; batch 1, valid on both, must then succeed on both.
TEST(DynamicWorldFaults, ARefusalBeforeAdmissionOnOneRankFailsEveryRankAndTheWorldGoesOn) {
  const StoreConfig c = review_config();
  std::vector<std::vector<StatusCode>> codes(2);
  std::vector<StatusCode> first(2);
  on_ranks(2, 3000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    auto opened = Store::open(c, comm);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    Store& s = **opened;
    const Status x0 = s.submit(0, r == 0 ? batch_of({1, 2}, true, "nope") : batch_of({1, 2}, true));
    first[static_cast<std::size_t>(r)] = x0.code();
    for (int id = 1; id <= 3; ++id) {
      const Status x = s.submit(id, batch_of({Key(10 * id + r), 7}, true));
      codes[static_cast<std::size_t>(r)].push_back(x.code());
      if (x.is_ok()) {
        EXPECT_TRUE(s.discard(id).is_ok());
      }
    }
  });
  EXPECT_EQ(first[0], StatusCode::kNotFound);
  EXPECT_NE(first[1], StatusCode::kOk);
  for (int r = 0; r < 2; ++r)
    for (StatusCode code : codes[static_cast<std::size_t>(r)]) EXPECT_EQ(code, StatusCode::kOk) << "rank " << r;
}

// The ranks disagree on whether batch 0 trains: it is refused on both with nothing changed (no clock ticked).
TEST(DynamicWorldFaults, RanksThatDisagreeOnTrainingAreRefusedWithNothingChanged) {
  const StoreConfig c = review_config();
  std::vector<std::int64_t> clock(2);
  std::vector<std::size_t> entries(2);
  std::vector<StatusCode> code(2);
  on_ranks(2, 3000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    auto opened = Store::open(c, comm);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    Store& s = **opened;
    const Status x = s.submit(0, batch_of({1, 2, 3, 4, 5, 6}, r == 0));
    code[static_cast<std::size_t>(r)] = x.code();
    detail::DynamicState st;
    ASSERT_TRUE(dynamic_cast<detail::DynamicAccess&>(s).read_dynamic(0, st).is_ok());
    clock[static_cast<std::size_t>(r)] = st.clock;
    entries[static_cast<std::size_t>(r)] = st.entries.size();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(code[static_cast<std::size_t>(r)], StatusCode::kOk) << "rank " << r;
    EXPECT_EQ(clock[static_cast<std::size_t>(r)], 0) << "rank " << r;
    EXPECT_EQ(entries[static_cast<std::size_t>(r)], 0u) << "rank " << r;
  }
}

KeyBatch concat(const std::vector<KeyBatch>& local, int bags) {
  KeyBatch g;
  g.train = local[0].train;
  JaggedKeys all;
  all.table = "user";
  all.offsets.push_back(0);
  for (const KeyBatch& kb : local) {
    const JaggedKeys& f = kb.features[0];
    for (int b = 0; b < bags; ++b) {
      for (std::int64_t p = f.offsets[static_cast<std::size_t>(b)]; p < f.offsets[static_cast<std::size_t>(b) + 1]; ++p)
        all.keys.push_back(f.keys[static_cast<std::size_t>(p)]);
      all.offsets.push_back(static_cast<std::int64_t>(all.keys.size()));
    }
  }
  g.features.push_back(std::move(all));
  return g;
}

// Two batches in flight (submit i, then forward/backward i - 1): the pins of batches in flight decide refusals and
// victims. World of 2, shards of 3 rows; against the reference of the world.
TEST(DynamicWorldFaults, TwoBatchesInFlightDecideAsTheReference) {
  for (const Placement pl : {Placement::kGpu, Placement::kHybrid})
    for (const dispatch::ShardingType type : {dispatch::ShardingType::kRow, dispatch::ShardingType::kTable}) {
      StoreConfig c = review_config();
      c.tables[0].placement = pl;
      if (pl == Placement::kHybrid) c.tables[0].cache.rows = 3;
      const int W = 2, bags = 3, steps = 60;
      c.tables[0].spec.rows = 10;
      c.tables[0].sharding.type = type;
      c.tables[0].dynamic = DynamicSpec{1, Eviction::kLru, 0, Unseen::kInitial};
      std::mt19937_64 rng(7);
      std::vector<std::vector<KeyBatch>> local(static_cast<std::size_t>(steps));
      std::vector<KeyBatch> global;
      std::vector<std::vector<Buffers>> grads(static_cast<std::size_t>(steps));
      for (int s = 0; s < steps; ++s) {
        for (int r = 0; r < W; ++r) {
          KeyBatch kb;
          kb.train = s % 7 != 6;
          kb.features.push_back(random_feature(rng, "user", bags, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -5, 99}));
          local[static_cast<std::size_t>(s)].push_back(kb);
          grads[static_cast<std::size_t>(s)].push_back(make_buffers(c, kb));
          fill_random(rng, grads[static_cast<std::size_t>(s)].back());
        }
        global.push_back(concat(local[static_cast<std::size_t>(s)], bags));
      }
      auto opened = open_reference_world(c, W);
      ASSERT_TRUE(opened.is_ok());
      Store& ref = **opened;
      std::vector<StatusCode> ref_code(static_cast<std::size_t>(steps));
      const auto finish_ref = [&](int i) {
        if (ref_code[static_cast<std::size_t>(i)] != StatusCode::kOk) return;
        Buffers out = make_buffers(c, global[static_cast<std::size_t>(i)]);
        ASSERT_TRUE(ref.forward(i, out.views).is_ok());
        if (!global[static_cast<std::size_t>(i)].train) {
          ASSERT_TRUE(ref.discard(i).is_ok());
          return;
        }
        Buffers g = make_buffers(c, global[static_cast<std::size_t>(i)]);
        std::size_t at = 0;
        for (int r = 0; r < W; ++r) {
          const auto& part = grads[static_cast<std::size_t>(i)][static_cast<std::size_t>(r)].data[0];
          std::copy(part.begin(), part.end(), g.data[0].begin() + static_cast<std::ptrdiff_t>(at));
          at += part.size();
        }
        ASSERT_TRUE(ref.backward(i, g.cviews).is_ok());
      };
      for (int i = 0; i < steps; ++i) {
        ref_code[static_cast<std::size_t>(i)] = ref.submit(i, global[static_cast<std::size_t>(i)]).code();
        if (i >= 1) finish_ref(i - 1);
      }
      finish_ref(steps - 1);
      int refused = 0;
      for (auto code : ref_code) refused += code != StatusCode::kOk;
      EXPECT_GT(refused, 0) << "pins of batches in flight must refuse some batch";
      EXPECT_LT(refused, steps / 2);
      detail::DynamicState want;
      ASSERT_TRUE(dynamic_cast<detail::DynamicAccess&>(ref).read_dynamic(0, want).is_ok());

      std::vector<detail::DynamicState> got(static_cast<std::size_t>(W));
      on_ranks(W, 20000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
        auto o = Store::open(c, comm);
        ASSERT_TRUE(o.is_ok()) << o.status().to_string();
        Store& s = **o;
        std::vector<StatusCode> code(static_cast<std::size_t>(steps));
        const auto finish = [&](int i) {
          if (code[static_cast<std::size_t>(i)] != StatusCode::kOk) return;
          const KeyBatch& kb = local[static_cast<std::size_t>(i)][static_cast<std::size_t>(r)];
          Buffers out = make_buffers(c, kb);
          ASSERT_TRUE(s.forward(i, out.views).is_ok());
          if (!kb.train) {
            ASSERT_TRUE(s.discard(i).is_ok());
          } else {
            ASSERT_TRUE(s.backward(i, grads[static_cast<std::size_t>(i)][static_cast<std::size_t>(r)].cviews).is_ok());
          }
        };
        for (int i = 0; i < steps; ++i) {
          const Status x = s.submit(i, local[static_cast<std::size_t>(i)][static_cast<std::size_t>(r)]);
          code[static_cast<std::size_t>(i)] = x.code();
          EXPECT_EQ(x.code(), ref_code[static_cast<std::size_t>(i)])
              << "rank " << r << " batch " << i << ": " << x.to_string();
          if (i >= 1) finish(i - 1);
        }
        finish(steps - 1);
        ASSERT_TRUE(dynamic_cast<detail::DynamicAccess&>(s).read_dynamic(0, got[static_cast<std::size_t>(r)]).is_ok());
        const std::vector<Key> keys = s.keys_held(0).value();
        std::vector<float> mine(keys.size() * 8), want_rows(keys.size() * 8);
        ASSERT_TRUE(s.read_keys(0, keys, mine.data(), nullptr).is_ok());
        ASSERT_TRUE(ref.read_keys(0, keys, want_rows.data(), nullptr).is_ok());
        for (std::size_t i = 0; i < mine.size(); ++i)
          EXPECT_NEAR(mine[i], want_rows[i], 1e-5f * (1 + std::fabs(want_rows[i]))) << "rank " << r << " at " << i;
      });
      std::vector<KeyIndex::Entry> all;
      for (int r = 0; r < W; ++r) {
        EXPECT_EQ(got[static_cast<std::size_t>(r)].clock, want.clock);
        all.insert(all.end(), got[static_cast<std::size_t>(r)].entries.begin(),
                   got[static_cast<std::size_t>(r)].entries.end());
      }
      ASSERT_EQ(all.size(), want.entries.size());
      for (std::size_t i = 0; i < all.size(); ++i) {
        EXPECT_EQ(all[i].key, want.entries[i].key) << i;
        EXPECT_EQ(all[i].row, want.entries[i].row) << i;
        EXPECT_EQ(all[i].last_use, want.entries[i].last_use) << i;
        EXPECT_EQ(all[i].count, want.entries[i].count) << i;
      }
    }
}

// A rank whose batch has no key of the dynamic table (no feature of it) while another's keys are this rank's.
TEST(DynamicWorldFaults, ARankWithoutTheTablesFeatureServesTheOthersKeys) {
  StoreConfig c = review_config();
  TableConfig item;
  item.spec.name = "item";
  item.spec.rows = 6;
  item.spec.dim = 4;
  item.placement = Placement::kGpu;
  c.tables.push_back(item);
  std::vector<std::vector<float>> outs(2);
  std::vector<std::size_t> held(2);
  on_ranks(2, 5000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    auto o = Store::open(c, comm);
    ASSERT_TRUE(o.is_ok()) << o.status().to_string();
    Store& s = **o;
    KeyBatch kb;
    kb.train = true;
    JaggedKeys it;
    it.table = "item";
    it.keys = {1};
    it.offsets = {0, 1};
    if (r == 0) kb.features.push_back(batch_of({1, 2, 3, 4, 5, 6, 7, 8}, true).features[0]);
    kb.features.push_back(it);
    const Status x = s.submit(0, kb);
    ASSERT_TRUE(x.is_ok());
    Buffers out = make_buffers(c, kb);
    ASSERT_TRUE(s.forward(0, out.views).is_ok());
    outs[static_cast<std::size_t>(r)] = out.data[0];
    Buffers g = make_buffers(c, kb);
    ASSERT_TRUE(s.backward(0, g.cviews).is_ok());
    held[static_cast<std::size_t>(r)] = s.keys_held(0).value().size();
  });
  EXPECT_EQ(held[0] + held[1], 8u);
  auto ref = open_reference_world(c, 2);
  KeyBatch kb = batch_of({1, 2, 3, 4, 5, 6, 7, 8}, true);
  ASSERT_TRUE((*ref)->submit(0, kb).is_ok());
  Buffers out = make_buffers(c, kb);
  ASSERT_TRUE((*ref)->forward(0, out.views).is_ok());
  EXPECT_EQ(out.data[0], outs[0]);
}

// A device fault on rank 0 (emu_fail_after_ops, at several points of a step): from then on rank 0's engine refuses at
// accepting(), before admission, or fails writing new rows. Every submit succeeds or fails on both ranks alike, and no
// rank falls out of step (an error saying the ranks disagree on the step would mean one did).
TEST(DynamicWorldFaults, ADeviceFaultOnOneRankFailsBothRanksInStep) {
  for (const int fail_at : {40, 80, 160}) {
    std::vector<std::vector<Status>> got(2);
    on_ranks(2, 3000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
      StoreConfig c = review_config();
      if (r == 0) c.device.emu_fail_after_ops = fail_at;
      auto o = Store::open(c, comm);
      ASSERT_TRUE(o.is_ok()) << o.status().to_string();
      Store& s = **o;
      for (int i = 0; i < 8; ++i) {
        KeyBatch kb = batch_of({Key(i), Key(i + 1), Key(100 + i)}, true);
        const Status x = s.submit(i, kb);
        got[static_cast<std::size_t>(r)].push_back(x);
        if (!x.is_ok()) continue;
        Buffers out = make_buffers(c, kb);
        if (s.forward(i, out.views).is_ok()) {
          (void)s.backward(i, out.cviews);
        } else {
          (void)s.discard(i);
        }
      }
    });
    bool failed = false;
    for (std::size_t i = 0; i < got[0].size() && i < got[1].size(); ++i) {
      EXPECT_EQ(got[0][i].is_ok(), got[1][i].is_ok()) << "fail at " << fail_at << ", batch " << i << ": "
                                                      << got[0][i].to_string() << " vs " << got[1][i].to_string();
      for (const auto& g : got)
        EXPECT_EQ(g[i].message().find("disagree on the step"), std::string::npos) << g[i].to_string();
      failed = failed || !got[0][i].is_ok();
    }
    EXPECT_TRUE(failed) << "fail at " << fail_at << ": the fault must be met";
  }
}

}  // namespace
}  // namespace strata::testing
