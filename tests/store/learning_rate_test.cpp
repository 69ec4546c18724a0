// Store::set_learning_rate: a rate set between steps (or while a batch is in flight) is used from
// the next backward on, in every placement mode, bit for bit as a store opened with that rate;
// bad rates and unknown tables are refused without change. Store::set_step: a store restored by
// hand (read_rows/write_rows, learning_rate/set_learning_rate, step/set_step) continues bit for bit
// as the uninterrupted one, Adam included; bad steps are refused without change.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "dispatch/local_communicator.hpp"
#include "tests/store/store_test_util.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata {
namespace {

using namespace strata::testing;

struct Mode {
  const char* name;
  Placement placement;
  bool world;      // opened as a rank of a world of one (the sharded engine)
  bool reference;  // the oracle itself
};

StoreConfig config_for(const Mode& m) {
  std::mt19937_64 rng(5);
  StoreConfig c = random_config(rng, 3);
  c.device.backend = BackendChoice::kEmu;
  for (auto& t : c.tables) {
    // Adam's bias correction depends on the store's step, which a store opened from copied rows
    // does not share; the rate enters every optimizer the same way (make_optimizer_step).
    if (t.spec.optimizer.kind == OptimizerKind::kAdam) t.spec.optimizer.kind = OptimizerKind::kAdagrad;
    t.placement = m.placement;
    // Small enough to evict over the run: one batch has at most 8 bags x 5 keys.
    if (m.placement == Placement::kCached || m.placement == Placement::kHybrid)
      t.cache.rows = std::min<std::int64_t>(t.spec.rows, 48);
  }
  return c;
}

Result<std::unique_ptr<Store>> open_mode(const Mode& m, const StoreConfig& c) {
  if (m.reference) return open_reference_store(c);
  if (!m.world) return Store::open(c);
  auto group = dispatch::make_local_group(1);
  if (!group) return group.status();
  return Store::open(c, std::shared_ptr<dispatch::Communicator>(std::move(group.value()[0])));
}

// One step of batch `id`; the rate change (when given) happens between forward and backward.
void step(Store& s, const StoreConfig& c, const KeyBatch& kb, std::int64_t id, std::mt19937_64& grad_rng,
          const std::function<void()>& between = {}) {
  Buffers out = make_buffers(c, kb);
  ASSERT_TRUE(s.submit(id, kb).is_ok());
  ASSERT_TRUE(s.forward(id, out.views).is_ok());
  if (between) between();
  fill_random(grad_rng, out);
  ASSERT_TRUE(s.backward(id, out.cviews).is_ok());
}

class LearningRate : public ::testing::TestWithParam<Mode> {};

TEST_P(LearningRate, SetBetweenStepsEqualsAStoreOpenedWithTheNewRate) {
  const Mode m = GetParam();
  const StoreConfig c = config_for(m);
  std::mt19937_64 rng(7);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 8; ++i) batches.push_back(random_batch(rng, c, 8));

  auto a = open_mode(m, c);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  Store& s = **a;
  std::mt19937_64 grads_a(9);
  for (int i = 0; i < 4; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads_a);
  // Batch 4 is in flight (forwarded) when the rates change: its backward uses the new ones.
  step(s, c, batches[4], 4, grads_a, [&] {
    ASSERT_TRUE(s.set_learning_rate(0.3f).is_ok());
    ASSERT_TRUE(s.set_learning_rate(c.tables[0].spec.name, 0.2f).is_ok());
  });
  for (int i = 5; i < 8; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads_a);
  EXPECT_EQ(s.learning_rate(c.tables[0].spec.name).value(), 0.2f);
  EXPECT_EQ(s.learning_rate(c.tables[1].spec.name).value(), 0.3f);
  EXPECT_EQ(s.config().tables[2].spec.optimizer.learning_rate, 0.3f);

  // The oracle: the reference at the old rate for 4 steps, its rows copied into a reference
  // opened with the new rates, which takes the rest.
  auto before = open_reference_store(c);
  std::mt19937_64 grads_r(9);
  for (int i = 0; i < 4; ++i) step(**before, c, batches[static_cast<std::size_t>(i)], i, grads_r);
  StoreConfig after_config = c;
  for (auto& t : after_config.tables) t.spec.optimizer.learning_rate = 0.3f;
  after_config.tables[0].spec.optimizer.learning_rate = 0.2f;
  auto after = open_reference_store(after_config);
  const Snapshot mid = snapshot(**before);
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    ASSERT_TRUE((*after)
                    ->write_rows(static_cast<int>(t), 0, c.tables[t].spec.rows, mid.weights[t].data(),
                                 mid.state[t].empty() ? nullptr : mid.state[t].data())
                    .is_ok());
  for (int i = 4; i < 8; ++i) step(**after, after_config, batches[static_cast<std::size_t>(i)], i, grads_r);
  EXPECT_TRUE(same_state(snapshot(**after), snapshot(s)));
}

// Adam (whose step counter the store keeps), with three batches in flight (forwarded) while the
// rates change: every mode equals the reference making the same calls.
TEST_P(LearningRate, AdamWithBatchesInFlightDuringTheChangeEqualsTheReference) {
  const Mode m = GetParam();
  StoreConfig c = config_for(m);
  for (auto& t : c.tables) t.spec.optimizer.kind = OptimizerKind::kAdam;
  std::mt19937_64 rng(11);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 8; ++i) batches.push_back(random_batch(rng, c, 4));
  auto run = [&](Store& s) {
    std::mt19937_64 grads(13);
    for (int i = 0; i < 3; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads);
    std::vector<Buffers> out;
    for (int i = 3; i < 6; ++i) {
      out.push_back(make_buffers(c, batches[static_cast<std::size_t>(i)]));
      ASSERT_TRUE(s.submit(i, batches[static_cast<std::size_t>(i)]).is_ok());
      ASSERT_TRUE(s.forward(i, out.back().views).is_ok());
    }
    ASSERT_TRUE(s.set_learning_rate(0.01f).is_ok());
    ASSERT_TRUE(s.set_learning_rate(c.tables[1].spec.name, 0.2f).is_ok());
    for (auto& o : out) {
      fill_random(grads, o);
      ASSERT_TRUE(s.backward(3 + static_cast<std::int64_t>(&o - out.data()), o.cviews).is_ok());
    }
    for (int i = 6; i < 8; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads);
  };
  auto got = open_mode(m, c);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  run(**got);
  auto want = open_reference_store(c);
  run(**want);
  EXPECT_EQ((*got)->step(), 8);
  EXPECT_TRUE(same_state(snapshot(**want), snapshot(**got)));
  // The rates mattered: a reference that kept the config's rate ends elsewhere.
  auto kept = open_reference_store(c);
  std::mt19937_64 grads(13);
  for (int i = 0; i < 8; ++i) step(**kept, c, batches[static_cast<std::size_t>(i)], i, grads);
  EXPECT_FALSE(same_state(snapshot(**kept), snapshot(**got)));
}

// A trainer's own checkpoint: after 4 steps (and a rate change), every row and its state, every
// rate and the step go into a new store, which continues as the store that was not interrupted.
// With Adam, whose bias correction reads the step: without set_step the rows diverge.
TEST_P(LearningRate, RowsRatesAndStepRestoredByHandContinueAsTheUninterruptedRun) {
  const Mode m = GetParam();
  const StoreConfig c = config_for(m);
  std::mt19937_64 rng(17);
  std::vector<KeyBatch> batches;
  for (int i = 0; i < 7; ++i) batches.push_back(random_batch(rng, c, 4));
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kRowwiseAdagrad}) {
    StoreConfig k = c;
    for (auto& t : k.tables) t.spec.optimizer.kind = kind;
    const auto train = [&](Store& s, int from, int to, std::mt19937_64& grads) {
      for (int i = from; i < to; ++i) {
        if (i == 2) {
          ASSERT_TRUE(s.set_learning_rate(k.tables[1].spec.name, 0.2f).is_ok());
        }
        step(s, k, batches[static_cast<std::size_t>(i)], i, grads);
      }
    };
    auto whole = open_mode(m, k);
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    std::mt19937_64 grads_whole(19);
    train(**whole, 0, 7, grads_whole);

    auto first = open_mode(m, k);
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    std::mt19937_64 grads(19);
    train(**first, 0, 4, grads);
    const Snapshot rows = snapshot(**first);
    std::vector<float> rates;
    for (const auto& t : k.tables) rates.push_back((*first)->learning_rate(t.spec.name).value());
    const std::int64_t steps = (*first)->step();
    ASSERT_EQ(steps, 4);

    auto resumed = open_mode(m, k);
    ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
    Store& r = **resumed;
    for (std::size_t t = 0; t < k.tables.size(); ++t) {
      ASSERT_TRUE(r.write_rows(static_cast<int>(t), 0, k.tables[t].spec.rows, rows.weights[t].data(),
                               rows.state[t].empty() ? nullptr : rows.state[t].data())
                      .is_ok());
      ASSERT_TRUE(r.set_learning_rate(k.tables[t].spec.name, rates[t]).is_ok());
    }
    EXPECT_EQ(r.step(), 0);  // write_rows restores rows only
    ASSERT_TRUE(r.set_step(steps).is_ok());
    EXPECT_EQ(r.step(), 4);
    train(r, 4, 7, grads);
    EXPECT_EQ(r.step(), 7);
    EXPECT_TRUE(same_state(snapshot(**whole), snapshot(r))) << to_string(kind);
  }
}

// A rate of 0 (in the config or set between steps) is an update of zero: every weight keeps its
// bits (a weight of -0.0 too, whose w - 0 * g with g < 0 would be +0.0), while Adagrad's and Adam's
// state still advance as the optimizer defines, and the step counts. Same bits as the reference.
TEST_P(LearningRate, ZeroRateKeepsEveryWeightAndAdvancesTheState) {
  const Mode m = GetParam();
  std::mt19937_64 rng(23);
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
    StoreConfig c = config_for(m);
    for (auto& t : c.tables) t.spec.optimizer.kind = kind;
    c.tables[0].spec.optimizer.learning_rate = 0.0f;  // from the config; the others by set_learning_rate
    std::vector<KeyBatch> batches;
    for (int i = 0; i < 3; ++i) batches.push_back(random_batch(rng, c, 8));
    const auto run = [&](Store& s) {
      for (std::size_t t = 0; t < c.tables.size(); ++t) {  // every weight -0.0: the sign of zero must stay
        const std::vector<float> minus_zero(static_cast<std::size_t>(c.tables[t].spec.rows * c.tables[t].spec.dim),
                                            -0.0f);
        ASSERT_TRUE(s.write_rows(static_cast<int>(t), 0, c.tables[t].spec.rows, minus_zero.data(), nullptr).is_ok());
      }
      ASSERT_TRUE(s.set_learning_rate(0.0f).is_ok());
      std::mt19937_64 grads(29);
      for (int i = 0; i < 3; ++i) step(s, c, batches[static_cast<std::size_t>(i)], i, grads);
    };
    auto got = open_mode(m, c);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    const Snapshot start = snapshot(**got);
    run(**got);
    EXPECT_EQ((*got)->step(), 3);
    for (const auto& t : c.tables) EXPECT_EQ((*got)->learning_rate(t.spec.name).value(), 0.0f);
    const Snapshot end = snapshot(**got);
    auto want = open_reference_store(c);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    run(**want);
    EXPECT_TRUE(same_state(snapshot(**want), end)) << to_string(kind);
    Snapshot kept = end;  // its weights as written, its state as trained
    for (auto& w : kept.weights) std::fill(w.begin(), w.end(), -0.0f);
    EXPECT_TRUE(same_state(kept, end)) << to_string(kind) << ": a weight changed at rate 0";
    if (kind != OptimizerKind::kSgd) {
      EXPECT_NE(start.state, end.state) << to_string(kind) << ": state did not advance";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, LearningRate,
    ::testing::Values(Mode{"reference", Placement::kCpu, false, true}, Mode{"cpu", Placement::kCpu, false, false},
                      Mode{"offload", Placement::kOffload, false, false},
                      Mode{"cached", Placement::kCached, false, false}, Mode{"gpu", Placement::kGpu, false, false},
                      Mode{"hybrid", Placement::kHybrid, false, false}, Mode{"gpu_world", Placement::kGpu, true, false},
                      Mode{"hybrid_world", Placement::kHybrid, true, false}),
    [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

TEST(LearningRateBadInput, RefusedNamingTableAndValueWithoutChange) {
  std::mt19937_64 rng(3);
  const StoreConfig c = random_config(rng, 2);
  auto opened = Store::open(c);
  ASSERT_TRUE(opened.is_ok());
  Store& s = **opened;
  const std::string name = c.tables[1].spec.name;
  for (float bad : {-0.5f, -1e-30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    const Status one = s.set_learning_rate(name, bad);
    EXPECT_EQ(one.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(one.message().find("set_learning_rate: table '" + name + "': learning_rate "), std::string::npos)
        << one.message();
    EXPECT_NE(one.message().find("(expected a finite number >= 0)"), std::string::npos) << one.message();
    const Status all = s.set_learning_rate(bad);
    EXPECT_EQ(all.code(), StatusCode::kInvalidArgument) << bad;
    for (const auto& t : c.tables) EXPECT_EQ(s.learning_rate(t.spec.name).value(), 0.05f);
  }
  EXPECT_NE(s.set_learning_rate(name, -0.5f).message().find("learning_rate -0.5 "), std::string::npos);
  const Status unknown = s.set_learning_rate("nope", 0.1f);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("set_learning_rate: unknown table 'nope'"), std::string::npos) << unknown.message();
  EXPECT_EQ(s.learning_rate("nope").status().code(), StatusCode::kNotFound);
  for (const auto& t : c.tables) EXPECT_EQ(s.learning_rate(t.spec.name).value(), 0.05f);
  // A tiny rate is a rate, and 0 an update of zero (-0.0 is held as 0: no rate is negative).
  EXPECT_TRUE(s.set_learning_rate(name, 1e-30f).is_ok());
  EXPECT_EQ(s.learning_rate(name).value(), 1e-30f);
  EXPECT_TRUE(s.set_learning_rate(name, -0.0f).is_ok());
  EXPECT_FALSE(std::signbit(s.learning_rate(name).value()));
  EXPECT_EQ(s.learning_rate(name).value(), 0.0f);
}

// A config's rate: -0.0 is held as 0 from open on (in the store and in the oracle), and a negative
// one is refused quoting it as written ("-0.5", not std::to_string's "-0.500000").
TEST(LearningRateBadInput, ConfigRateOfMinusZeroIsHeldAsZeroAndANegativeOneQuotedShortest) {
  std::mt19937_64 rng(4);
  StoreConfig c = random_config(rng, 2);
  c.tables[0].spec.optimizer.learning_rate = -0.0f;
  for (bool reference : {false, true}) {
    auto s = reference ? open_reference_store(c) : Store::open(c);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const float lr = (*s)->learning_rate(c.tables[0].spec.name).value();
    EXPECT_EQ(lr, 0.0f);
    EXPECT_FALSE(std::signbit(lr)) << reference;
    EXPECT_FALSE(std::signbit((*s)->config().tables[0].spec.optimizer.learning_rate)) << reference;
  }
  c.tables[0].spec.optimizer.learning_rate = -0.5f;
  const Status bad = Store::open(c).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("learning_rate -0.5 (expected a finite number >= 0"), std::string::npos)
      << bad.message();
}

TEST(SetStepBadInput, RefusedNamingTheStepWithoutChange) {
  std::mt19937_64 rng(3);
  const StoreConfig c = random_config(rng, 2);
  auto opened = Store::open(c);
  ASSERT_TRUE(opened.is_ok());
  Store& s = **opened;
  ASSERT_TRUE(s.set_step(5).is_ok());
  const Status negative = s.set_step(-1);
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.message(), "set_step: step -1 (expected a step count >= 0)");
  EXPECT_EQ(s.step(), 5);
  // With a batch in flight: its backward would take a step of either count.
  ASSERT_TRUE(s.submit(0, random_batch(rng, c, 2)).is_ok());
  const Status busy = s.set_step(9);
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("set_step with 1 batch(es) in flight"), std::string::npos) << busy.message();
  EXPECT_EQ(s.step(), 5);
  ASSERT_TRUE(s.discard(0).is_ok());
  ASSERT_TRUE(s.set_step(0).is_ok());
  EXPECT_EQ(s.step(), 0);
  // The next backward takes step + 1: a count it would overflow is refused (issue 29: the step
  // wrapped, and Adam's bias correction read a garbage t).
  const Status max = s.set_step(std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(max.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(max.message(),
            "set_step: step 9223372036854775807 (expected at most 9223372036854775806 = 2^63 - 2: the next backward "
            "takes step + 1)");
  EXPECT_EQ(s.step(), 0);
  // At the largest count, a backward is refused and leaves the batch in flight.
  ASSERT_TRUE(s.set_step(Store::kMaxStep).is_ok());
  const KeyBatch kb = random_batch(rng, c, 2);
  Buffers out = make_buffers(c, kb);
  ASSERT_TRUE(s.submit(1, kb).is_ok());
  ASSERT_TRUE(s.forward(1, out.views).is_ok());
  const Status last = s.backward(1, out.cviews);
  EXPECT_EQ(last.code(), StatusCode::kOutOfRange) << last.to_string();
  EXPECT_NE(last.message().find("backward at step 9223372036854775806, the largest step count"), std::string::npos)
      << last.message();
  EXPECT_EQ(s.step(), Store::kMaxStep);
  EXPECT_EQ(s.in_flight(), 1);
}

// Sharded over a world of several ranks, each rank applies the updates of its own shard: a rate
// change is a collective that every rank must make with the same table and rate at the same step.
class LearningRateWorld : public ::testing::Test {
 protected:
  static StoreConfig world_config(Placement p) {
    StoreConfig c;
    c.threads = 1;
    c.fake_numa_nodes = 1;
    c.huge_pages = false;
    c.device.backend = BackendChoice::kEmu;
    for (const char* name : {"user", "item"}) {
      TableConfig t;
      t.spec.name = name;
      t.spec.rows = 40;
      t.spec.dim = 4;
      t.spec.init.bound = 0.5f;
      t.spec.optimizer.kind = OptimizerKind::kAdagrad;
      t.spec.optimizer.learning_rate = 0.05f;
      t.spec.optimizer.initial_accumulator = 0.1f;
      t.placement = p;
      t.sharding.type = dispatch::ShardingType::kRow;  // each rank holds half the rows of each table
      if (p == Placement::kHybrid) t.cache.rows = 12;
      c.tables.push_back(t);
    }
    return c;
  }

  // Batch `i` (keys over every row of both tables); rank 0 brings it, the other ranks an empty one.
  static KeyBatch batch(int i) {
    KeyBatch kb;
    for (const char* name : {"user", "item"}) {
      JaggedKeys f;
      f.table = name;
      f.offsets = {0};
      for (int b = 0; b < 4; ++b) {
        for (int k = 0; k < 3; ++k) f.keys.push_back(static_cast<Key>((i * 7 + b * 11 + k * 13) % 40));
        f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
      }
      kb.features.push_back(std::move(f));
    }
    return kb;
  }

  // One step of batch `i` on `s`: rank 0's gradients are fixed numbers; other ranks' batch is empty.
  static void train_step(Store& s, int rank, int i) {
    const KeyBatch kb = rank == 0 ? batch(i) : KeyBatch{};
    std::vector<std::vector<float>> out(kb.features.size(), std::vector<float>(16));
    std::vector<MatrixView> views;
    std::vector<ConstMatrixView> grads;
    for (auto& o : out) views.push_back({o.data(), 4, 4});
    ASSERT_TRUE(s.submit(i, kb).is_ok());
    ASSERT_TRUE(s.forward(i, views).is_ok());
    for (auto& o : out)
      for (std::size_t x = 0; x < o.size(); ++x)
        o[x] = 0.01f * static_cast<float>((x * 5 + static_cast<std::size_t>(i)) % 9) - 0.04f;
    for (auto& o : out) grads.push_back({o.data(), 4, 4});
    ASSERT_TRUE(s.backward(i, grads).is_ok());
  }

  static std::vector<float> weights(Store& s, int table) {
    std::vector<float> w(40 * 4);
    EXPECT_TRUE(s.read_rows(table, 0, 40, w.data(), nullptr).is_ok());
    return w;
  }
};

TEST_F(LearningRateWorld, SameRateOnEveryRankTrainsAsTheReference) {
  for (Placement p : {Placement::kGpu, Placement::kHybrid}) {
    const StoreConfig c = world_config(p);
    // The oracle: one reference store taking the whole batches, with the same rate changes.
    auto ref = open_reference_store(c);
    ASSERT_TRUE(ref.is_ok());
    for (int i = 0; i < 6; ++i) {
      if (i == 2) {
        ASSERT_TRUE((*ref)->set_learning_rate(0.4f).is_ok());
      }
      if (i == 4) {
        ASSERT_TRUE((*ref)->set_learning_rate("item", 0.02f).is_ok());
      }
      train_step(**ref, 0, i);
    }
    std::vector<std::vector<float>> want = {weights(**ref, 0), weights(**ref, 1)};
    on_ranks(2, 20000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
      auto s = Store::open(c, comm);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      for (int i = 0; i < 6; ++i) {
        if (i == 2) {
          ASSERT_TRUE((*s)->set_learning_rate(0.4f).is_ok());
        }
        if (i == 4) {
          const Status set = (*s)->set_learning_rate("item", 0.02f);
          ASSERT_TRUE(set.is_ok()) << set.to_string();
        }
        train_step(**s, r, i);
      }
      EXPECT_EQ((*s)->learning_rate("user").value(), 0.4f);
      EXPECT_EQ((*s)->learning_rate("item").value(), 0.02f);
      // Every rank reads whole tables (read_rows is collective); the rows held by rank 1 were
      // updated at the new rates too.
      for (int t = 0; t < 2; ++t) {
        const std::vector<float> got = weights(**s, t);
        for (std::size_t x = 0; x < got.size(); ++x)
          ASSERT_NEAR(got[x], want[static_cast<std::size_t>(t)][x], 1e-6f)
              << to_string(p) << " rank " << r << " table " << t << " [" << x << "]";
      }
    });
  }
}

TEST_F(LearningRateWorld, RanksThatDisagreeAreRefusedOnEveryRankWithoutChange) {
  const StoreConfig c = world_config(Placement::kHybrid);
  std::vector<Status> rate(2), invalid(2), all_vs_one(2);
  std::vector<std::vector<float>> before(2), after(2);
  on_ranks(2, 20000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    const std::size_t ur = static_cast<std::size_t>(r);
    auto s = Store::open(c, comm);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    train_step(**s, r, 0);
    before[ur] = weights(**s, 0);
    // Another rate.
    rate[ur] = (*s)->set_learning_rate("user", r == 0 ? 0.1f : 0.2f);
    // A rate refused on rank 0 only.
    invalid[ur] = (*s)->set_learning_rate("user", r == 0 ? std::numeric_limits<float>::quiet_NaN() : 0.3f);
    // Every table on rank 0, one on rank 1.
    all_vs_one[ur] = r == 0 ? (*s)->set_learning_rate(0.1f) : (*s)->set_learning_rate("user", 0.1f);
    for (const char* t : {"user", "item"}) EXPECT_EQ((*s)->learning_rate(t).value(), 0.05f) << "rank " << r;
    // The world is still usable, and trains at the old rate on every rank.
    train_step(**s, r, 1);
    after[ur] = weights(**s, 0);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(rate[r].code(), StatusCode::kFailedPrecondition) << rate[r].to_string();
    EXPECT_EQ(rate[r].message(),
              "set_learning_rate: ranks disagree: rank 0 sets table 'user' to 0.1 at step 1, rank 1 sets table "
              "'user' to 0.2 at step 1 (every rank must set the same rate of the same table at the same step; no "
              "rate changed)");
    EXPECT_EQ(invalid[r].code(), StatusCode::kInvalidArgument) << invalid[r].to_string();
    EXPECT_NE(all_vs_one[r].message().find("rank 0 sets every table to 0.1 at step 1, rank 1 sets table 'user' to "
                                           "0.1 at step 1"),
              std::string::npos)
        << all_vs_one[r].message();
  }
  EXPECT_EQ(invalid[0].message(), "set_learning_rate: table 'user': learning_rate nan (expected a finite number >= 0)");
  EXPECT_NE(invalid[1].message().find("failed on another rank (rank 0: set_learning_rate: table 'user': "
                                      "learning_rate nan (expected a finite number >= 0))"),
            std::string::npos)
      << invalid[1].message();
  // Both ranks agree on the rows, which a reference at the old rate reproduces.
  EXPECT_EQ(before[0], before[1]);
  EXPECT_EQ(after[0], after[1]);
  auto ref = open_reference_store(c);
  train_step(**ref, 0, 0);
  train_step(**ref, 0, 1);
  const std::vector<float> want = weights(**ref, 0);
  for (std::size_t x = 0; x < want.size(); ++x) EXPECT_NEAR(after[0][x], want[x], 1e-6f) << x;
}

// set_step on a world: the ranks set the same step, or none changes.
TEST_F(LearningRateWorld, SetStepIsACollectiveThatRanksMustAgreeOn) {
  const StoreConfig c = world_config(Placement::kHybrid);
  std::vector<Status> same(2), differ(2), invalid(2);
  std::vector<std::int64_t> steps(2);
  on_ranks(2, 20000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    const std::size_t ur = static_cast<std::size_t>(r);
    auto s = Store::open(c, comm);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    train_step(**s, r, 0);
    same[ur] = (*s)->set_step(7);
    differ[ur] = (*s)->set_step(r == 0 ? 8 : 9);
    invalid[ur] = (*s)->set_step(-2);
    steps[ur] = (*s)->step();
    train_step(**s, r, 1);  // the world is still usable
  });
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(same[r].is_ok()) << same[r].to_string();
    EXPECT_EQ(steps[r], 7);
    EXPECT_EQ(differ[r].code(), StatusCode::kFailedPrecondition) << differ[r].to_string();
    EXPECT_NE(differ[r].message().find("ranks disagree on the step: rank 0 at set_step(8), rank 1 at set_step(9)"),
              std::string::npos)
        << differ[r].message();
    EXPECT_EQ(invalid[r].message(), "set_step: step -2 (expected a step count >= 0)");
  }
}

}  // namespace
}  // namespace strata
