// Dynamic tables sharded over a world of thread ranks (issue 36): every rank trains on its own batches through a
// sharded store (gpu and hybrid placements, row and table sharding), and the reference store of the same world
// (open_reference_world(config, world): its shards side by side) trains on the ranks' batches concatenated in rank
// order. Admission, eviction, TTL and refusals are decisions, so they must agree exactly: the same batches refused,
// each shard's keys, rows, last uses and counts, the counters; the values are compared within a tolerance past one
// rank (gradients of one row from several ranks are summed in another order) and bit for bit on one.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "store/detail/dynamic_state.hpp"
#include "tests/store/dynamic_harness.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata::testing {
namespace {

struct WorldCase {
  int world;
  Case k;
  dispatch::ShardingType type;
};

std::string name_of(const WorldCase& w) {
  return std::string(w.k.name) + "_n" + std::to_string(w.world) + "_" + dispatch::to_string(w.type);
}

void PrintTo(const WorldCase& w, std::ostream* os) { *os << name_of(w); }

// config_of(k) on thread ranks: user and ad sharded by `type` (capacities grown with the world, so that every shard
// has a few rows and still evicts), item dense; gpu and hybrid (a 3-row cache) tables side by side.
StoreConfig world_config(const WorldCase& w) {
  StoreConfig c = thread_rank_config(64 << 20);
  const StoreConfig base = config_of(w.k);
  c.tables = base.tables;
  c.device.emu_max_delay_us = 20;
  c.tables[0].spec.rows = 7 * w.world;
  c.tables[2].spec.rows = 3 * w.world;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    TableConfig& tc = c.tables[t];
    tc.placement = t == 1 ? Placement::kGpu : Placement::kHybrid;
    if (tc.placement == Placement::kHybrid) tc.cache.rows = 3;
    if (tc.dynamic) tc.sharding.type = w.type;
  }
  return c;
}

// The ranks' batches as one: each feature's bags concatenated in rank order (a rank without it: no bags there).
KeyBatch concatenated(const std::vector<KeyBatch>& local, const std::vector<std::string>& names, int bags) {
  KeyBatch g;
  g.train = local[0].train;
  for (const std::string& name : names) {
    JaggedKeys all;
    all.table = name;
    all.offsets.push_back(0);
    bool any = false;
    for (const KeyBatch& kb : local) {
      const auto f =
          std::find_if(kb.features.begin(), kb.features.end(), [&](const JaggedKeys& x) { return x.table == name; });
      any = any || f != kb.features.end();
      for (int b = 0; b < bags; ++b) {
        if (f != kb.features.end())
          for (std::int64_t p = f->offsets[static_cast<std::size_t>(b)];
               p < f->offsets[static_cast<std::size_t>(b) + 1]; ++p)
            all.keys.push_back(f->keys[static_cast<std::size_t>(p)]);
        all.offsets.push_back(static_cast<std::int64_t>(all.keys.size()));
      }
    }
    if (any) g.features.push_back(std::move(all));
  }
  return g;
}

// Every rank's batch has every feature (item and ad: empty bags where random_batch left them out), so that the
// ranks' batches and the reference's agree on the features they have.
KeyBatch full(KeyBatch kb, const std::vector<std::string>& names, int bags) {
  for (const std::string& name : names) {
    if (std::any_of(kb.features.begin(), kb.features.end(), [&](const JaggedKeys& f) { return f.table == name; }))
      continue;
    JaggedKeys f;
    f.table = name;
    f.offsets.assign(static_cast<std::size_t>(bags) + 1, 0);
    kb.features.push_back(std::move(f));
  }
  std::stable_sort(kb.features.begin(), kb.features.end(), [&](const JaggedKeys& a, const JaggedKeys& b) {
    return std::find(names.begin(), names.end(), a.table) < std::find(names.begin(), names.end(), b.table);
  });
  return kb;
}

class DynamicWorld : public ::testing::TestWithParam<WorldCase> {};

TEST_P(DynamicWorld, ShardsDecideAsTheReferenceOfTheWorld) {
  const WorldCase w = GetParam();
  const StoreConfig c = world_config(w);
  const int W = w.world, bags = 3, steps = 40;
  std::vector<std::string> names;
  for (const TableConfig& t : c.tables)
    for (const std::string& n : feature_names(t)) names.push_back(n);

  // Every step's batches and gradients, drawn up front.
  std::mt19937_64 rng(0xd1ce + static_cast<std::uint64_t>(W) * 31 + static_cast<std::uint64_t>(w.k.admit_after));
  const std::vector<Key> space = key_space(rng);
  struct Step {
    std::vector<KeyBatch> local;
    KeyBatch global;
    std::vector<Buffers> grads;  // per rank
  };
  std::vector<Step> plan(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    Step& st = plan[static_cast<std::size_t>(s)];
    const bool train = s % 5 != 4;
    for (int r = 0; r < W; ++r) {
      st.local.push_back(full(random_batch(rng, c, space), names, bags));
      st.local.back().train = train;
      st.grads.push_back(make_buffers(c, st.local.back()));
      fill_random(rng, st.grads.back());
    }
    st.global = concatenated(st.local, names, bags);
  }

  // The reference of the world.
  auto opened = open_reference_world(c, W);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  Store& ref = **opened;
  std::vector<StatusCode> ref_code(static_cast<std::size_t>(steps));
  std::vector<Buffers> ref_out(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Step& st = plan[static_cast<std::size_t>(s)];
    const Status x = ref.submit(s, st.global);
    ref_code[static_cast<std::size_t>(s)] = x.code();
    if (!x.is_ok()) continue;
    Buffers out = make_buffers(c, st.global);
    ASSERT_TRUE(ref.forward(s, out.views).is_ok());
    if (!st.global.train) {
      ASSERT_TRUE(ref.discard(s).is_ok());
    } else {
      // The ranks' gradients, concatenated as their bags are.
      Buffers g = make_buffers(c, st.global);
      for (std::size_t f = 0; f < g.data.size(); ++f) {
        std::size_t at = 0;
        for (int r = 0; r < W; ++r) {
          const std::vector<float>& part = st.grads[static_cast<std::size_t>(r)].data[f];
          std::copy(part.begin(), part.end(), g.data[f].begin() + static_cast<std::ptrdiff_t>(at));
          at += part.size();
        }
      }
      ASSERT_TRUE(ref.backward(s, g.cviews).is_ok());
    }
    ref_out[static_cast<std::size_t>(s)] = std::move(out);
  }
  int refused = 0;
  for (StatusCode code : ref_code) refused += code != StatusCode::kOk;
  ASSERT_LT(refused, steps / 2) << "a workload the world can mostly admit";

  // The world, and what it decided.
  std::vector<detail::DynamicState> users(static_cast<std::size_t>(W)), ads(static_cast<std::size_t>(W));
  std::vector<std::vector<Key>> held(static_cast<std::size_t>(W));
  std::vector<std::vector<float>> held_rows(static_cast<std::size_t>(W));
  std::vector<DynamicStats> stats(static_cast<std::size_t>(W));
  // Past one rank: a few units of fp32 (sums in another order), or of bf16 (such a sum may round to the neighbouring
  // half value).
  const float tol = W == 1 ? 0.0f : w.k.dtype == DType::kF32 ? 1e-5f : 0x1p-6f;
  on_ranks(W, 60000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
    auto store = Store::open(c, comm);
    ASSERT_TRUE(store.is_ok()) << "rank " << r << ": " << store.status().to_string();
    Store& s = **store;
    for (int i = 0; i < steps; ++i) {
      const Step& st = plan[static_cast<std::size_t>(i)];
      const KeyBatch& kb = st.local[static_cast<std::size_t>(r)];
      const Status x = s.submit(i, kb);
      ASSERT_EQ(x.code(), ref_code[static_cast<std::size_t>(i)])
          << "rank " << r << " batch " << i << ": " << x.to_string();
      if (!x.is_ok()) continue;
      Buffers out = make_buffers(c, kb);
      ASSERT_TRUE(s.forward(i, out.views).is_ok());
      // This rank's bags of the reference's outputs.
      const Buffers& whole = ref_out[static_cast<std::size_t>(i)];
      for (std::size_t f = 0; f < out.data.size(); ++f) {
        std::size_t at = 0;
        for (int q = 0; q < r; ++q) at += st.grads[static_cast<std::size_t>(q)].data[f].size();
        for (std::size_t e = 0; e < out.data[f].size(); ++e) {
          const float a = out.data[f][e], b = whole.data[f][at + e];
          ASSERT_TRUE(tol == 0.0f ? std::memcmp(&a, &b, sizeof a) == 0 : std::fabs(a - b) <= tol * (1 + std::fabs(b)))
              << "rank " << r << " batch " << i << " feature " << f << " element " << e << ": " << a << " vs " << b;
        }
      }
      if (!kb.train) {
        ASSERT_TRUE(s.discard(i).is_ok());
      } else {
        ASSERT_TRUE(s.backward(i, st.grads[static_cast<std::size_t>(r)].cviews).is_ok());
      }
    }
    auto& access = dynamic_cast<detail::DynamicAccess&>(s);
    ASSERT_TRUE(access.read_dynamic(0, users[static_cast<std::size_t>(r)]).is_ok());
    ASSERT_TRUE(access.read_dynamic(2, ads[static_cast<std::size_t>(r)]).is_ok());
    auto keys = s.keys_held(0);
    ASSERT_TRUE(keys.is_ok());
    held[static_cast<std::size_t>(r)] = keys.value();
    held_rows[static_cast<std::size_t>(r)].resize(keys.value().size() * 8);
    ASSERT_TRUE(s.read_keys(0, keys.value(), held_rows[static_cast<std::size_t>(r)].data(), nullptr).is_ok());
    stats[static_cast<std::size_t>(r)] = s.stats().dynamic.at(0).second;
    // Keys, uses and rows crossed to other ranks at admission (none in a world of one: a rank's own share stays).
    const std::int64_t admission = s.stats().dispatch.admission_bytes;
    if (W == 1) {
      EXPECT_EQ(admission, 0);
    } else {
      EXPECT_GT(admission, 0) << "rank " << r;
    }
  });
  if (HasFatalFailure()) return;

  // Each shard as the reference's: the reference lists its shards' entries in rank order.
  auto& access = dynamic_cast<detail::DynamicAccess&>(ref);
  for (const int t : {0, 2}) {
    detail::DynamicState want;
    ASSERT_TRUE(access.read_dynamic(t, want).is_ok());
    std::vector<KeyIndex::Entry> got;
    std::string sketch;
    for (int r = 0; r < W; ++r) {
      const detail::DynamicState& x = (t == 0 ? users : ads)[static_cast<std::size_t>(r)];
      EXPECT_EQ(x.clock, want.clock) << "rank " << r;
      got.insert(got.end(), x.entries.begin(), x.entries.end());
      sketch.append(x.sketch.begin(), x.sketch.end());
    }
    ASSERT_EQ(got.size(), want.entries.size()) << "table " << t;
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].key, want.entries[i].key) << "table " << t << " entry " << i;
      EXPECT_EQ(got[i].row, want.entries[i].row) << "table " << t << " entry " << i;
      EXPECT_EQ(got[i].last_use, want.entries[i].last_use) << "table " << t << " entry " << i;
      EXPECT_EQ(got[i].count, want.entries[i].count) << "table " << t << " entry " << i;
    }
    EXPECT_EQ(sketch, std::string(want.sketch.begin(), want.sketch.end())) << "table " << t;
  }
  // Rows read through each rank's shard, and the counters summed over the ranks.
  DynamicStats sum;
  for (int r = 0; r < W; ++r) {
    const std::vector<Key>& keys = held[static_cast<std::size_t>(r)];
    std::vector<float> want(keys.size() * 8);
    ASSERT_TRUE(ref.read_keys(0, keys, want.data(), nullptr).is_ok());
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(held_rows[static_cast<std::size_t>(r)][i], want[i], tol * (1 + std::fabs(want[i])));
    sum += stats[static_cast<std::size_t>(r)];
  }
  const DynamicStats want = ref.stats().dynamic.at(0).second;
  EXPECT_EQ(sum.rows, want.rows);
  EXPECT_EQ(sum.admissions, want.admissions);
  EXPECT_EQ(sum.evictions, want.evictions);
  EXPECT_EQ(sum.expirations, want.expirations);
  EXPECT_EQ(sum.not_admitted, want.not_admitted);
  EXPECT_EQ(sum.unseen, want.unseen);
  EXPECT_GT(want.evictions + want.expirations, 0) << "the workload must evict";
  RecordProperty("refused", refused);
}

// A plan that cannot hold a dynamic table's keys is refused at open on every rank, naming the table and what it needs.
TEST(DynamicWorldConfig, RefusesPlansThatCannotHoldTheKeys) {
  const Case k{"x", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kSgd, false};
  const auto refusal = [&](dispatch::ShardingType type, std::int64_t capacity) {
    StoreConfig c = world_config({2, k, type});
    c.tables[0].spec.rows = capacity;
    std::vector<std::string> why(2);
    on_ranks(2, 20000, [&](int r, std::shared_ptr<dispatch::Communicator> comm) {
      why[static_cast<std::size_t>(r)] = Store::open(c, comm).status().message();
    });
    return why[0] + " | " + why[1];
  };
  // Every rank says so (each with its own rank's context).
  const auto twice = [](const std::string& both, const std::string& what) {
    const std::size_t first = both.find(what);
    return first != std::string::npos && both.find(what, first + 1) != std::string::npos;
  };
  EXPECT_TRUE(twice(refusal(dispatch::ShardingType::kColumn, 10),
                    "dynamic table 'user': column sharding over 2 ranks cannot hold its keys"));
  EXPECT_TRUE(twice(refusal(dispatch::ShardingType::kReplicated, 10), "replicated sharding over 2 ranks"));
  EXPECT_TRUE(
      twice(refusal(dispatch::ShardingType::kRow, 1), "dynamic table 'user': capacity 1 is below the world size 2"));
}

// The reference of a world of 2 holds its shards side by side, which no checkpoint describes: save and load are refused
// naming the table, nothing written or changed (before: save wrote one file of both shards that load refused).
TEST(DynamicWorldConfig, TheReferenceOfAWorldIsNotSaved) {
  const Case k{"x", 2, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kSgd, false};
  const StoreConfig c = world_config({2, k, dispatch::ShardingType::kRow});
  auto ref = open_reference_world(c, 2);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  const std::string dir = ::testing::TempDir() + "strata_reference_world_ckpt";
  for (const Status& st : {(*ref)->save(dir), (*ref)->load(dir)}) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
    EXPECT_NE(st.message().find("dynamic table 'user'"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("a reference of a world is not saved"), std::string::npos) << st.to_string();
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "a refused save writes nothing";
}

std::vector<WorldCase> world_cases() {
  const Case lru{"lru", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kAdagrad, false};
  const Case lfu{"lfu_admit2_ttl", 2, Eviction::kLfu, 3, Unseen::kZeros, DType::kF32, OptimizerKind::kSgd, true};
  const Case bf16{"lru_bf16", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kBF16, OptimizerKind::kSgd, false};
  return {{1, lru, dispatch::ShardingType::kRow},  {2, lfu, dispatch::ShardingType::kRow},
          {3, lru, dispatch::ShardingType::kRow},  {4, lfu, dispatch::ShardingType::kRow},
          {2, bf16, dispatch::ShardingType::kRow}, {3, lru, dispatch::ShardingType::kTable}};
}

INSTANTIATE_TEST_SUITE_P(Worlds, DynamicWorld, ::testing::ValuesIn(world_cases()),
                         [](const ::testing::TestParamInfo<WorldCase>& i) { return name_of(i.param); });

}  // namespace
}  // namespace strata::testing
