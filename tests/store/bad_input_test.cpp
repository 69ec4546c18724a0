// Invariant 4 (validate before mutate): every bad input returns a Status that names the table, the
// value and what was expected, and leaves the store exactly as it was. Run against both the cpu
// store and the reference so every implementation rejects input the same way.
#include <gtest/gtest.h>

#include "dispatch/local_communicator.hpp"

#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

StoreConfig two_tables() {
  StoreConfig c;
  c.threads = 2;
  for (const char* name : {"user", "item"}) {
    TableConfig t;
    t.spec.name = name;
    t.spec.rows = 100;
    t.spec.dim = 4;
    t.spec.optimizer.kind = OptimizerKind::kAdagrad;
    c.tables.push_back(t);
  }
  return c;
}

KeyBatch good_batch() {
  KeyBatch kb;
  kb.features.push_back({"user", {0, 2, 3}, {1, 2, 99}, {}});
  kb.features.push_back({"item", {0, 0, 1}, {5}, {}});
  return kb;
}

using Opener = Result<std::unique_ptr<Store>> (*)(const StoreConfig&);
class BadInput : public ::testing::TestWithParam<Opener> {
 protected:
  void SetUp() override {
    auto s = GetParam()(two_tables());
    ASSERT_TRUE(s.is_ok());
    store_ = std::move(s).value();
    // One batch in flight (forwarded) so we can check it survives every rejected call.
    ASSERT_TRUE(store_->submit(7, good_batch()).is_ok());
    out_ = make_buffers(store_->config(), good_batch());
    ASSERT_TRUE(store_->forward(7, out_.views).is_ok());
    before_ = snapshot(*store_);
  }
  void ExpectUnchanged() {
    EXPECT_EQ(store_->in_flight(), 1);
    EXPECT_EQ(store_->step(), 0);
    EXPECT_TRUE(same_state(before_, snapshot(*store_)));
    // The batch in flight still completes.
    Buffers g = make_buffers(store_->config(), good_batch());
    fill_random(rng_, g);
    EXPECT_TRUE(store_->backward(7, g.cviews).is_ok());
  }
  Status submit_bad(KeyBatch kb) { return store_->submit(8, std::move(kb)); }

  std::unique_ptr<Store> store_;
  Buffers out_;
  Snapshot before_;
  std::mt19937_64 rng_{5};
};

TEST_P(BadInput, KeyOutOfRange) {
  auto kb = good_batch();
  kb.features[1].keys[0] = 100;
  Status s = submit_bad(kb);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "batch 8: table 'item': key 100 at position 0 out of range [0, 100)");
  ExpectUnchanged();
}

TEST_P(BadInput, NegativeKey) {
  auto kb = good_batch();
  kb.features[0].keys[2] = -4;
  EXPECT_EQ(submit_bad(kb).message(), "batch 8: table 'user': key -4 at position 2 out of range [0, 100)");
  ExpectUnchanged();
}

// int32 keys and offsets (JaggedKeys::keys32, offsets32) are checked as int64 ones are; a feature gives one width
// of each (issue 35).
TEST_P(BadInput, Int32KeysOutOfRangeAndMixedWidths) {
  auto kb = good_batch();
  kb.features[1].keys32 = {100};
  kb.features[1].keys.clear();
  EXPECT_EQ(submit_bad(kb).message(), "batch 8: table 'item': key 100 at position 0 out of range [0, 100)");
  kb.features[1].keys32 = {-1};
  EXPECT_EQ(submit_bad(kb).message(), "batch 8: table 'item': key -1 at position 0 out of range [0, 100)");
  kb = good_batch();
  kb.features[0].keys32 = {1, 2, 3};
  EXPECT_EQ(submit_bad(kb).message(),
            "batch 8: table 'user': 3 int64 keys and 3 int32 keys (expected one key width "
            "per feature: keys or keys32)");
  kb = good_batch();
  kb.features[0].offsets32 = {0, 2, 3};
  EXPECT_NE(submit_bad(kb).message().find("table 'user': int64 offsets and int32 offsets"), std::string::npos);
  kb = good_batch();
  kb.features[0].offsets.clear();
  kb.features[0].offsets32 = {0, 3, 2};
  EXPECT_NE(submit_bad(kb).message().find("table 'user': offsets are not monotone"), std::string::npos);
  kb.features[0].offsets32 = {0, 1, 2};
  EXPECT_EQ(submit_bad(kb).message(), "batch 8: table 'user': offsets end at 2 (expected the key count 3)");
  kb = good_batch();
  kb.features[1].offsets.clear();
  kb.features[1].offsets32 = {0, 1};
  EXPECT_NE(submit_bad(kb).message().find("table 'item': batch size 1"), std::string::npos);
  ExpectUnchanged();
}

TEST_P(BadInput, OffsetsNotMonotone) {
  auto kb = good_batch();
  kb.features[0].offsets = {0, 3, 2};
  EXPECT_NE(submit_bad(kb).message().find("table 'user': offsets are not monotone"), std::string::npos);
  ExpectUnchanged();
}

TEST_P(BadInput, OffsetsDoNotEndAtKeyCount) {
  auto kb = good_batch();
  kb.features[0].offsets = {0, 1, 2};
  EXPECT_EQ(submit_bad(kb).message(), "batch 8: table 'user': offsets end at 2 (expected the key count 3)");
  ExpectUnchanged();
}

TEST_P(BadInput, UnknownTable) {
  auto kb = good_batch();
  kb.features[1].table = "ads";
  EXPECT_EQ(submit_bad(kb).message(),
            "batch 8: unknown feature 'ads' (expected a table's name, or one of its features for a table that lists "
            "them)");
  ExpectUnchanged();
}

TEST_P(BadInput, TableTwiceAndMismatchedBatchSizes) {
  auto kb = good_batch();
  kb.features[1].table = "user";
  EXPECT_NE(submit_bad(kb).message().find("appears twice"), std::string::npos);
  kb = good_batch();
  kb.features[1].offsets = {0, 1};
  EXPECT_NE(submit_bad(kb).message().find("table 'item': batch size 1"), std::string::npos);
  ExpectUnchanged();
}

TEST_P(BadInput, DuplicateBatchId) {
  EXPECT_EQ(store_->submit(7, good_batch()).code(), StatusCode::kAlreadyExists);
  ExpectUnchanged();
}

TEST_P(BadInput, GradientsOfTheWrongShape) {
  Buffers g = make_buffers(store_->config(), good_batch());
  auto bad = g.cviews;
  bad[1].cols = 5;
  Status s = store_->backward(7, bad);
  EXPECT_EQ(s.message(), "batch 7, table 'item': gradient shape (2, 5) (expected (2, 4))");
  bad = g.cviews;
  bad.pop_back();
  EXPECT_NE(store_->backward(7, bad).message().find("1 gradient views for 2 features"), std::string::npos);
  bad = g.cviews;
  bad[0].rows = 3;
  EXPECT_FALSE(store_->backward(7, bad).is_ok());
  ExpectUnchanged();
}

TEST_P(BadInput, OutputsOfTheWrongShapeAndUnknownBatches) {
  auto views = out_.views;
  views[0].rows = 1;
  EXPECT_NE(store_->forward(7, views).message().find("output shape (1, 4) (expected (2, 4))"), std::string::npos);
  EXPECT_EQ(store_->forward(9, out_.views).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->backward(9, out_.cviews).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->discard(9).code(), StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_P(BadInput, BackwardBeforeForward) {
  ASSERT_TRUE(store_->submit(8, good_batch()).is_ok());
  Buffers g = make_buffers(store_->config(), good_batch());
  EXPECT_EQ(store_->backward(8, g.cviews).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->discard(8).is_ok());
  ExpectUnchanged();
}

TEST_P(BadInput, WritesWhileBatchesInFlight) {
  std::vector<float> w(4);
  EXPECT_EQ(store_->write_rows(0, 0, 1, w.data(), nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->read_rows(0, 99, 2, w.data(), nullptr).message(),
            "table 'user': rows [99, 101) out of range [0, 100)");
  EXPECT_EQ(store_->read_rows(5, 0, 1, w.data(), nullptr).code(), StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_P(BadInput, NullWeightsBufferNamesTheTable) {
  Status s = store_->read_rows(1, 3, 2, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "table 'item': read_rows weights is null (expected a buffer of 2 x 4 floats)");
  std::vector<float> state(8);
  EXPECT_EQ(store_->read_rows(0, 0, 2, nullptr, state.data()).message(),
            "table 'user': read_rows weights is null (expected a buffer of 2 x 4 floats)");
  ExpectUnchanged();
  // write_rows once nothing is in flight (else it is refused as busy first).
  const Snapshot trained = snapshot(*store_);
  s = store_->write_rows(0, 99, 1, nullptr, state.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "table 'user': write_rows weights is null (expected a buffer of 1 x 4 floats)");
  EXPECT_TRUE(same_state(trained, snapshot(*store_)));
  // Nothing to copy: no buffer needed.
  EXPECT_TRUE(store_->read_rows(0, 5, 0, nullptr, nullptr).is_ok());
  EXPECT_TRUE(store_->write_rows(0, 5, 0, nullptr, nullptr).is_ok());
  EXPECT_TRUE(same_state(trained, snapshot(*store_)));
}

Result<std::unique_ptr<Store>> open_as(StoreConfig c, Placement p) {
  for (auto& t : c.tables) t.placement = p;
  c.device.backend = BackendChoice::kEmu;
  return Store::open(c);
}
Result<std::unique_ptr<Store>> open_offload(const StoreConfig& c) { return open_as(c, Placement::kOffload); }
Result<std::unique_ptr<Store>> open_cached(const StoreConfig& c) { return open_as(c, Placement::kCached); }
Result<std::unique_ptr<Store>> open_gpu(const StoreConfig& c) { return open_as(c, Placement::kGpu); }
Result<std::unique_ptr<Store>> open_hybrid(const StoreConfig& c) { return open_as(c, Placement::kHybrid); }
// Sharded tables in a world of one rank: the dispatch path (agreement, exchange) with one rank.
Result<std::unique_ptr<Store>> open_sharded(const StoreConfig& config, Placement p) {
  StoreConfig c = config;
  for (auto& t : c.tables) t.placement = p;
  c.device.backend = BackendChoice::kEmu;
  auto group = dispatch::make_local_group(1);
  if (!group) return group.status();
  return Store::open(c, std::shared_ptr<dispatch::Communicator>(std::move(group.value()[0])));
}
Result<std::unique_ptr<Store>> open_sharded_gpu(const StoreConfig& c) { return open_sharded(c, Placement::kGpu); }
Result<std::unique_ptr<Store>> open_sharded_hybrid(const StoreConfig& c) { return open_sharded(c, Placement::kHybrid); }
Result<std::unique_ptr<Store>> open_cpu(const StoreConfig& c) { return Store::open(c); }

std::string store_name(const ::testing::TestParamInfo<Opener>& info) {
  static const char* const kNames[] = {"cpu", "reference", "offload",     "cached",
                                       "gpu", "hybrid",    "sharded_gpu", "sharded_hybrid"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(Stores, BadInput,
                         ::testing::Values(&open_cpu, &open_reference_store, &open_offload, &open_cached, &open_gpu,
                                           &open_hybrid, &open_sharded_gpu, &open_sharded_hybrid),
                         store_name);

TEST(BadConfig, ZeroRowsOrDimNamesTheTable) {
  auto c = two_tables();
  c.tables[1].spec.rows = 0;
  EXPECT_EQ(Store::open(c).status().message(), "table 'item': rows 0 must be > 0");
  c = two_tables();
  c.tables[0].spec.dim = 0;
  EXPECT_EQ(Store::open(c).status().message(), "table 'user': dim 0 must be > 0");
  c = two_tables();
  c.tables[1].spec.name = "user";
  EXPECT_NE(Store::open(c).status().message().find("defined twice"), std::string::npos);
  c.tables.clear();
  EXPECT_FALSE(Store::open(c).is_ok());
  c = two_tables();
  c.numa = NumaPolicy::kBind;
  c.numa_node = 7;
  c.fake_numa_nodes = 2;
  EXPECT_EQ(Store::open(c).status().message(), "numa_node 7 out of range [0, 2)");
}

// Every enum of a config holding a value outside the enum (a cast integer) is refused by validate,
// naming the table or field and the number, before any switch over it can misbehave.
TEST(BadConfig, OutOfRangeEnumsAreRefusedNamingTheFieldAndValue) {
  struct Case {
    void (*set)(StoreConfig&);
    const char* message;
  };
  const Case cases[] = {
      {[](StoreConfig& c) { c.tables[1].placement = static_cast<Placement>(9); },
       "table 'item': placement 9 is out of range (expected cpu, offload, cached, gpu or hybrid)"},
      {[](StoreConfig& c) { c.tables[1].spec.pooling = static_cast<Pooling>(9); },
       "table 'item': pooling 9 is out of range (expected sum, mean or none)"},
      {[](StoreConfig& c) { c.tables[0].spec.optimizer.kind = static_cast<OptimizerKind>(9); },
       "table 'user': optimizer kind 9 is out of range (expected sgd, adagrad, rowwise_adagrad or adam)"},
      {[](StoreConfig& c) { c.tables[0].spec.dtype = static_cast<DType>(9); },
       "table 'user': dtype 9 is out of range (expected fp32, fp16 or bf16)"},
      {[](StoreConfig& c) {
         c.tables[1].placement = Placement::kGpu;
         c.tables[1].sharding.type = static_cast<dispatch::ShardingType>(9);
       },
       "table 'item': sharding type 9 is out of range (expected replicated, table, row or column)"},
      {[](StoreConfig& c) { c.numa = static_cast<NumaPolicy>(9); },
       "numa 9 is out of range (expected auto, interleave or bind)"},
      {[](StoreConfig& c) { c.device.backend = static_cast<BackendChoice>(9); },
       "device backend 9 is out of range (expected auto, cuda or emu)"},
      {[](StoreConfig& c) { c.offload_gather = static_cast<OffloadGather>(-1); },
       "offload_gather -1 is out of range (expected device or cpu)"},
      {[](StoreConfig& c) { c.cache.policy = static_cast<cache::Policy>(9); },
       "cache policy 9 is not a policy (expected lru, lfu or lookahead)"},
  };
  for (const Case& k : cases) {
    StoreConfig c = two_tables();
    k.set(c);
    EXPECT_EQ(validate(c).code(), StatusCode::kInvalidArgument) << k.message;
    EXPECT_EQ(validate(c).message(), k.message);
    EXPECT_EQ(Store::open(c).status().message(), k.message);
  }
}

// threads is bounded (100,000 crashed inside oneTBB at open); the bound itself opens.
TEST(BadConfig, ThreadsAreBounded) {
  StoreConfig c = two_tables();
  c.threads = 100000;
  EXPECT_EQ(validate(c).message(), "threads 100000 must be in [0, 1024] (kernel worker threads; 0: all cores)");
  EXPECT_EQ(Store::open(c).status().code(), StatusCode::kInvalidArgument);
  c.threads = 1025;
  EXPECT_EQ(validate(c).code(), StatusCode::kInvalidArgument);
  c.threads = -1;
  EXPECT_EQ(validate(c).message(), "threads -1 must be in [0, 1024] (kernel worker threads; 0: all cores)");
  c.threads = 1024;  // kMaxThreads
  auto store = Store::open(c);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->submit(1, good_batch()).is_ok());
  Buffers out = make_buffers((*store)->config(), good_batch());
  EXPECT_TRUE((*store)->forward(1, out.views).is_ok());
  EXPECT_TRUE((*store)->backward(1, out.cviews).is_ok());
}

// A table name that cannot become a file name is refused at open, before anything trains: a name
// of 300 characters opened and trained, then save failed with "File name too long" (issue 29).
TEST(BadConfig, TableNamesThatCannotNameFilesAreRefusedAtOpen) {
  const std::string rule = " (expected 1 to 128 bytes of letters, digits, '_', '-' and '.', not starting with '.')";
  const std::pair<std::string, std::string> cases[] = {
      {std::string(300, 'i'), "table '" + std::string(32, 'i') + "...': name is 300 bytes long" + rule},
      {".item", "table '.item': name starts with '.'" + rule},
      {"it em", "table 'it em': name holds ' ' at byte 2" + rule},
  };
  for (const auto& [name, message] : cases) {
    StoreConfig c = two_tables();
    c.tables[1].spec.name = name;
    EXPECT_EQ(validate(c).message(), message);
    EXPECT_EQ(Store::open(c).status().message(), message);
    EXPECT_EQ(open_reference_store(c).status().message(), message);
    EXPECT_EQ(open_gpu(c).status().message(), message);
  }
}

// init.row_stride, row_offset and col_offset place a shard in its table: dispatch sets them on the
// specs of each rank's shard. A config that set row_stride = 0 opened and its forward differed
// from the reference (issue 29); every config is refused unless they are the whole table's.
TEST(BadConfig, ShardOriginIsNotAConfigField) {
  struct Case {
    std::int64_t row_stride, row_offset;
    std::int32_t col_offset;
  };
  for (const Case& k : {Case{0, 0, 0}, Case{2, 0, 0}, Case{-1, 0, 0}, Case{1, 5, 0}, Case{1, 0, 3}}) {
    StoreConfig c = two_tables();
    c.tables[0].spec.init.row_stride = k.row_stride;
    c.tables[0].spec.init.row_offset = k.row_offset;
    c.tables[0].spec.init.col_offset = k.col_offset;
    const std::string message =
        "table 'user': init.row_stride " + std::to_string(k.row_stride) + ", init.row_offset " +
        std::to_string(k.row_offset) + ", init.col_offset " + std::to_string(k.col_offset) +
        ": these place a shard in its table and are set by dispatch, not by a config (expected 1, 0, 0)";
    EXPECT_EQ(validate(c).code(), StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(validate(c).message(), message);
    EXPECT_EQ(Store::open(c).status().message(), message);
    EXPECT_EQ(open_reference_store(c).status().message(), message);
    EXPECT_EQ(open_gpu(c).status().message(), message);
    EXPECT_EQ(open_sharded_gpu(c).status().message(), "rank 0: " + message);
  }
}

// A table-wise owner must be a rank of the world: a `gpu` table owned by rank 5 opened in a store
// without a communicator (a world of one rank, where a 1-rank world refused it), and an owner of
// -5 was taken as -1, the default (issue 29).
TEST(BadConfig, ShardingOwnersOutsideTheWorldAreRefused) {
  for (Placement p : {Placement::kGpu, Placement::kHybrid}) {
    StoreConfig c = two_tables();
    c.device.backend = BackendChoice::kEmu;
    c.tables[1].placement = p;
    if (p == Placement::kHybrid) c.tables[1].cache.rows = 10;
    c.tables[1].sharding = {dispatch::ShardingType::kTable, 5};
    EXPECT_TRUE(validate(c).is_ok()) << validate(c).message();  // the world is known at open
    const std::string one_rank =
        "table 'item': table sharding owner rank 5 out of range [0, 1) for a world of 1 rank (a store opened "
        "without a communicator is one rank)";
    EXPECT_EQ(Store::open(c).status().message(), one_rank);
    c.tables[1].sharding.owner = 1;
    EXPECT_NE(Store::open(c).status().message().find("owner rank 1 out of range [0, 1)"), std::string::npos);
    c.tables[1].sharding.owner = 0;
    auto store = Store::open(c);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    for (auto type : {dispatch::ShardingType::kTable, dispatch::ShardingType::kRow}) {
      c.tables[1].sharding = {type, -5};
      const std::string negative =
          "table 'item': sharding owner -5 out of range (expected -1, the default, or for table sharding a rank "
          "in [0, world size))";
      EXPECT_EQ(validate(c).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(validate(c).message(), negative);
      EXPECT_EQ(Store::open(c).status().message(), negative);
      EXPECT_EQ(open_sharded(c, p).status().message(), "rank 0: " + negative);
    }
  }
}

}  // namespace
}  // namespace strata
