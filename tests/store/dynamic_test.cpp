// Dynamic tables (issue 36) in the production store against the reference store, bit for bit: randomized batches
// over a key space several times the capacity (eviction every few batches), keys at the ends of int64, duplicate
// keys and empty bags, two batches in flight (pinned rows, refusals when new keys cannot fit beside them),
// evaluation batches between training ones, admission thresholds, lru and lfu, TTL, unseen zeros, half-size rows
// with stochastic rounding, several features of one dynamic table beside a dense table. Each forward's outputs, each
// submit's outcome and, at the end, every key's row and state and the tables' counters must agree. The config's
// dynamic fields and their refusals are checked here too.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "core/row_math.hpp"
#include "dispatch/local_communicator.hpp"
#include "tests/store/dynamic_harness.hpp"

namespace strata {
namespace {

using namespace strata::testing;

class DynamicEquivalence : public ::testing::TestWithParam<std::tuple<Case, Placement>> {};

TEST_P(DynamicEquivalence, TrainsAsTheReferenceBitForBit) {
  const auto [k, placement] = GetParam();
  const StoreConfig c = config_of(k, placement);
  auto opened = Store::open(c);
  auto reference = open_reference_store(c);
  ASSERT_TRUE(opened.is_ok() && reference.is_ok()) << opened.status().to_string();
  Store& s = **opened;
  Store& r = **reference;
  std::mt19937_64 rng(0x5eed + static_cast<std::uint64_t>(k.admit_after) * 7 + static_cast<std::uint64_t>(k.ttl));
  const std::vector<Key> space = key_space(rng);
  std::map<std::int64_t, KeyBatch> in_flight;  // submitted, not yet retired (up to two)
  int refused = 0, evaluated = 0, trained = 0;
  const auto retire = [&](std::int64_t id) {
    const KeyBatch& kb = in_flight.at(id);
    Buffers a = make_buffers(c, kb), b = make_buffers(c, kb);
    ASSERT_TRUE(s.forward(id, a.views).is_ok());
    ASSERT_TRUE(r.forward(id, b.views).is_ok());
    ASSERT_TRUE(same_outputs(a, b)) << "batch " << id;
    if (!kb.train) {
      EXPECT_EQ(s.backward(id, a.cviews).code(), StatusCode::kFailedPrecondition);
      ASSERT_TRUE(s.discard(id).is_ok());
      ASSERT_TRUE(r.discard(id).is_ok());
      ++evaluated;
    } else {
      fill_random(rng, a);
      b = a;
      for (std::size_t i = 0; i < b.data.size(); ++i) b.cviews[i].data = b.data[i].data();
      ASSERT_TRUE(s.backward(id, a.cviews).is_ok());
      ASSERT_TRUE(r.backward(id, b.cviews).is_ok());
      ++trained;
    }
    in_flight.erase(id);
  };
  for (std::int64_t id = 0; id < 60; ++id) {
    KeyBatch kb = random_batch(rng, c, space);
    kb.train = id % 5 != 4;
    const Status x = s.submit(id, kb), y = r.submit(id, kb);
    ASSERT_EQ(x.code(), y.code()) << "batch " << id << ": " << x.to_string() << " vs " << y.to_string();
    if (x.is_ok()) {
      in_flight.emplace(id, kb);
    } else {
      ASSERT_EQ(x.code(), StatusCode::kResourceExhausted) << x.to_string();
      ++refused;
    }
    if (in_flight.size() == 2 || (!x.is_ok() && !in_flight.empty())) retire(in_flight.begin()->first);
    if (::testing::Test::HasFatalFailure()) return;
  }
  while (!in_flight.empty()) retire(in_flight.begin()->first);
  EXPECT_TRUE(same_table(s, r, 0));
  EXPECT_TRUE(same_table(s, r, 2));
  EXPECT_GT(trained, 20);
  EXPECT_GT(evaluated, 5);
  const DynamicStats st = s.stats().dynamic.at(0).second;
  EXPECT_GT(st.evictions + st.expirations, 0) << "the workload must evict";
  if (k.admit_after > 1) {
    EXPECT_GT(st.not_admitted, 0);
  }
  RecordProperty("refused", refused);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DynamicEquivalence,
    ::testing::Combine(
        ::testing::Values(
            Case{"lru", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kSgd, false},
            Case{"lru_admit3", 3, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kAdagrad, false},
            Case{"lfu", 1, Eviction::kLfu, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kRowwiseAdagrad, false},
            Case{"lfu_admit2_ttl", 2, Eviction::kLfu, 3, Unseen::kZeros, DType::kF32, OptimizerKind::kAdam, false},
            Case{"lru_ttl_bf16", 1, Eviction::kLru, 2, Unseen::kInitial, DType::kBF16, OptimizerKind::kAdagrad, false},
            Case{"features_fp16", 2, Eviction::kLru, 0, Unseen::kInitial, DType::kF16, OptimizerKind::kSgd, true}),
        ::testing::Values(Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu,
                          Placement::kHybrid)),
    [](const ::testing::TestParamInfo<std::tuple<Case, Placement>>& i) {
      return std::string(std::get<0>(i.param).name) + "_" + to_string(std::get<1>(i.param));
    });

TEST(DynamicConfig, ParsesWritesAndRefuses) {
  auto c = parse_store_config(R"({"tables": [{"name": "user", "kind": "dynamic", "capacity": 100, "dim": 4,
      "admit_after": 3, "eviction": "lfu", "evict_after_steps": 50, "unseen": "zeros"}]})");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const TableConfig& t = c.value().tables[0];
  ASSERT_TRUE(t.dynamic.has_value());
  EXPECT_EQ(t.spec.rows, 100);
  EXPECT_EQ(t.dynamic->admit_after, 3);
  EXPECT_EQ(t.dynamic->eviction, Eviction::kLfu);
  EXPECT_EQ(t.dynamic->evict_after_steps, 50);
  EXPECT_EQ(t.dynamic->unseen, Unseen::kZeros);
  const std::string j = to_json(c.value());
  auto again = parse_store_config(j);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(to_json(again.value()), j);
  const auto error = [](const std::string& json) { return parse_store_config(json).status().message(); };
  const std::string head = R"({"tables": [{"name": "user", "dim": 4, )";
  EXPECT_NE(error(head + R"("kind": "dynamic", "rows": 5}]})").find("a dynamic table has a capacity, not rows"),
            std::string::npos);
  EXPECT_NE(error(head + R"("rows": 5, "capacity": 5}]})").find("'capacity' is given but the table is dense"),
            std::string::npos);
  EXPECT_NE(error(head + R"("rows": 5, "admit_after": 2}]})").find("'admit_after' is given but the table is dense"),
            std::string::npos);
  EXPECT_NE(error(head + R"("kind": "sparse", "rows": 5}]})").find("kind 'sparse' (expected dense or dynamic)"),
            std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic"}]})").find("name, capacity and dim are required"), std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic", "capacity": 0}]})").find("rows"), std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic", "capacity": 4294967296}]})").find("capacity 4294967296 is past"),
            std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic", "capacity": 5, "admit_after": 0}]})").find("admit_after 0 is out"),
            std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic", "capacity": 5, "evict_after_steps": -1}]})")
                .find("evict_after_steps -1 is out of range"),
            std::string::npos);
  EXPECT_NE(error(head + R"("kind": "dynamic", "capacity": 5, "eviction": "fifo"}]})").find("unknown eviction 'fifo'"),
            std::string::npos);
}

// Row access by row id is refused for a dynamic table; keys_held and read_keys refuse a dense one; a key without a
// row is named; nothing changes.
TEST(DynamicStore, RowAccessIsByKeyAndNamesWhatIsWrong) {
  const StoreConfig c =
      config_of({"x", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kSgd, false});
  auto opened = Store::open(c);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  Store& s = **opened;
  std::vector<float> w(8 * 10);
  EXPECT_NE(s.read_rows(0, 0, 1, w.data(), nullptr).message().find("read_rows of a dynamic table"), std::string::npos);
  EXPECT_NE(s.write_rows(0, 0, 1, w.data(), nullptr).message().find("write_rows of a dynamic table"),
            std::string::npos);
  EXPECT_NE(s.keys_held(1).status().message().find("table 'item': keys_held of a dense table"), std::string::npos);
  EXPECT_EQ(s.keys_held(7).status().code(), StatusCode::kNotFound);
  KeyBatch kb;
  kb.features.push_back({"user", {0, 2}, {-5, std::numeric_limits<Key>::max()}, {}});
  ASSERT_TRUE(s.submit(1, kb).is_ok());
  auto held = s.keys_held(0);
  ASSERT_TRUE(held.is_ok());
  EXPECT_EQ(held.value(), (std::vector<Key>{-5, std::numeric_limits<Key>::max()}));
  const Status missing = s.read_keys(0, {-5, 3}, w.data(), nullptr);
  EXPECT_EQ(missing.message(), "table 'user': key 3 at position 1 has no row (expected keys that keys_held lists)");
  // A new key's row starts as dense row `key` would: the initializer's values of (seed, table, key).
  ASSERT_TRUE(s.read_keys(0, {-5}, w.data(), nullptr).is_ok());
  std::vector<float> expect(8);
  init_row(expect.data(), table_seed(0, table_name_hash("user")), -5, 8, 0.5f);
  EXPECT_EQ(0, std::memcmp(w.data(), expect.data(), 8 * sizeof(float)));
}

// A refusal an engine makes whatever the keys (cached: batches in flight at cache.max_in_flight) comes before admission
// and changes no index; the batch is accepted once one retires.
TEST(DynamicStore, AnEngineRefusalBeforeAdmissionChangesNothing) {
  StoreConfig c = config_of({"x", 1, Eviction::kLru, 0, Unseen::kInitial, DType::kF32, OptimizerKind::kSgd, false},
                            Placement::kCached);
  c.cache.max_in_flight = 1;
  auto opened = Store::open(c);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  Store& s = **opened;
  KeyBatch first, second;
  first.features.push_back({"user", {0, 2}, {7, 8}, {}});
  second.features.push_back({"user", {0, 2}, {9, -9}, {}});
  ASSERT_TRUE(s.submit(0, first).is_ok());
  const Status refused = s.submit(1, second);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_NE(refused.message().find("batch 1: 1 batches are already in flight"), std::string::npos) << refused.message();
  EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{7, 8}));
  EXPECT_EQ(s.stats().dynamic.at(0).second.admissions, 2);
  Buffers b = make_buffers(c, first);
  ASSERT_TRUE(s.forward(0, b.views).is_ok());
  ASSERT_TRUE(s.backward(0, b.cviews).is_ok());
  ASSERT_TRUE(s.submit(1, second).is_ok());
  EXPECT_EQ(s.keys_held(0).value(), (std::vector<Key>{-9, 7, 8, 9}));
  EXPECT_EQ(s.stats().dynamic.at(0).second.admissions, 4);
}

}  // namespace
}  // namespace strata
