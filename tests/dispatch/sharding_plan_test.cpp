// ShardLayout: ownership, local rows, column slices and the initializer origin of shards, checked
// against brute force for every type and world size.

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "core/row_math.hpp"
#include "dispatch/shard_layout.hpp"

namespace strata::dispatch {
namespace {

TableSpec table(std::int64_t rows, std::int32_t dim) {
  TableSpec s;
  s.name = "t";
  s.rows = rows;
  s.dim = dim;
  s.init.seed = 5;
  return s;
}

TEST(ShardLayout, EveryRowAndColumnLivesExactlyWhereTheLayoutSays) {
  for (int world = 1; world <= 5; ++world)
    for (ShardingType type :
         {ShardingType::kReplicated, ShardingType::kTable, ShardingType::kRow, ShardingType::kColumn})
      for (std::int64_t rows : {1, 3, 17, 64}) {
        const TableSpec spec = table(rows, 7 + world);
        auto l = ShardLayout::make(spec, {type, -1}, world, 3);
        ASSERT_TRUE(l.is_ok()) << l.status().to_string();
        std::int64_t total_rows = 0, total_cols = 0;
        for (int r = 0; r < world; ++r) {
          if (type == ShardingType::kRow) total_rows += l->local_rows(r);
          if (type == ShardingType::kColumn) {
            EXPECT_EQ(l->col_offset(r), total_cols);
            total_cols += l->local_dim(r);
          }
        }
        if (type == ShardingType::kRow) {
          EXPECT_EQ(total_rows, rows);
        }
        if (type == ShardingType::kColumn) {
          EXPECT_EQ(total_cols, spec.dim);
        }
        if (type == ShardingType::kTable) {
          for (int r = 0; r < world; ++r) EXPECT_EQ(l->holds(r), r == 3 % world);  // default owner: table index % world
        }
        for (Key k = 0; k < rows; ++k) {
          if (l->to_all()) continue;
          const int o = l->owner_of(k);
          ASSERT_TRUE(o >= 0 && o < world);
          EXPECT_LT(l->local_row(k), l->local_rows(o));
          if (type == ShardingType::kRow) {
            EXPECT_EQ(l->local_row(k) * world + o, k);
          }
        }
        // local_range against brute force for every range.
        for (std::int64_t row0 = 0; row0 < rows; ++row0)
          for (std::int64_t n = 0; row0 + n <= rows; n += 1 + n / 3)
            for (int r = 0; r < world; ++r) {
              std::vector<std::int64_t> want;
              for (Key k = row0; k < row0 + n; ++k)
                if (l->to_all() || l->owner_of(k) == r) want.push_back(l->local_row(k));
              const auto [first, count] = l->local_range(r, row0, n);
              if (!l->holds(r)) continue;
              ASSERT_EQ(count, static_cast<std::int64_t>(want.size()))
                  << "world " << world << " rank " << r << " [" << row0 << ", +" << n << ")";
              for (std::int64_t i = 0; i < count; ++i) EXPECT_EQ(first + i, want[static_cast<std::size_t>(i)]);
            }
      }
}

TEST(ShardLayout, ShardsStartAsSlicesOfTheWholeTable) {
  const TableSpec whole = table(23, 10);
  const std::uint64_t seed = table_seed(whole.init.seed, table_name_hash(whole.name));
  for (ShardingType type : {ShardingType::kRow, ShardingType::kColumn, ShardingType::kTable}) {
    auto l = ShardLayout::make(whole, {type, -1}, 3, 0);
    ASSERT_TRUE(l.is_ok());
    for (int r = 0; r < 3; ++r) {
      if (!l->holds(r)) continue;
      const TableSpec s = l->shard_spec(whole, r);
      EXPECT_EQ(s.pooling, Pooling::kNone);
      const std::uint64_t shard_seed = table_seed(s.init.seed, table_name_hash(s.name));
      for (std::int64_t lr = 0; lr < s.rows; ++lr) {
        std::vector<float> mine(static_cast<std::size_t>(s.dim)), all(static_cast<std::size_t>(whole.dim));
        init_row(mine.data(), shard_seed, s.init.global_row(lr), s.dim, s.init.bound, s.init.col_offset);
        const std::int64_t g = type == ShardingType::kRow ? lr * 3 + r : lr;
        init_row(all.data(), seed, g, whole.dim, whole.init.bound);
        for (std::int32_t c = 0; c < s.dim; ++c)
          EXPECT_EQ(mine[static_cast<std::size_t>(c)], all[static_cast<std::size_t>(c + l->col_offset(r))]);
      }
    }
  }
}

TEST(ValidatePlan, NamesTheTableTheValueAndWhatWasExpected) {
  TableSpec s = table(10, 2);
  EXPECT_EQ(validate_plan(s, {ShardingType::kColumn, -1}, 3).message(),
            "table 't': column sharding over 3 ranks needs dim >= 3, got 2");
  EXPECT_EQ(validate_plan(s, {ShardingType::kTable, 4}, 2).message(),
            "table 't': table sharding owner rank 4 out of range [0, 2) for a world of 2 ranks");
  EXPECT_EQ(validate_plan(s, {ShardingType::kRow, 1}, 2).message(),
            "table 't': owner 1 is only meaningful for table sharding, not row");
  s.optimizer.kind = OptimizerKind::kRowwiseAdagrad;
  EXPECT_EQ(validate_plan(s, {ShardingType::kColumn, -1}, 2).message(),
            "table 't': column sharding cannot apply rowwise_adagrad (its accumulator spans the whole row); use row or "
            "table sharding");
  EXPECT_TRUE(validate_plan(s, {ShardingType::kRow, -1}, 2).is_ok());
  EXPECT_EQ(parse_sharding("diagonal").status().message(),
            "unknown sharding 'diagonal' (expected replicated, table, row or column)");
}

// A dynamic table's layout: made from its spec with one row more (the engines' row of keys without a row).
ShardLayout dynamic_layout(std::int64_t capacity, ShardingPlan plan, int world) {
  TableSpec s = table(capacity + 1, 4);
  auto l = ShardLayout::make(s, plan, world, 1);
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  return l.is_ok() ? l.value() : ShardLayout{};
}

TEST(DynamicLayout, KeyOwnerSpreadsSequentialAndRandomKeysEvenly) {
  const ShardLayout l = dynamic_layout(1000, {ShardingType::kRow, -1}, 4);
  std::mt19937_64 rng(3);
  for (const bool sequential : {true, false}) {
    std::vector<std::int64_t> per_rank(4, 0);
    constexpr std::int64_t kKeys = 200000;
    for (std::int64_t i = 0; i < kKeys; ++i) {
      const Key k = sequential ? i : static_cast<Key>(rng());
      const int o = l.key_owner(k);
      ASSERT_TRUE(o >= 0 && o < 4) << k;
      ++per_rank[static_cast<std::size_t>(o)];
    }
    for (int r = 0; r < 4; ++r)  // within 2% of an even share
      EXPECT_NEAR(static_cast<double>(per_rank[static_cast<std::size_t>(r)]), kKeys / 4.0, 0.02 * kKeys / 4.0)
          << (sequential ? "sequential" : "random") << " keys, rank " << r;
  }
  // Table sharding: every key to the owner.
  const ShardLayout t = dynamic_layout(10, {ShardingType::kTable, 2}, 3);
  for (const Key k : {std::numeric_limits<Key>::min(), Key{-1}, Key{0}, Key{7}, std::numeric_limits<Key>::max()})
    EXPECT_EQ(t.key_owner(k), 2);
}

TEST(DynamicLayout, ShardRowsMapOneToOneOntoTheCapacity) {
  for (int world = 1; world <= 5; ++world)
    for (const ShardingPlan plan : {ShardingPlan{ShardingType::kRow, -1}, ShardingPlan{ShardingType::kTable, -1},
                                    ShardingPlan{ShardingType::kTable, world - 1}})
      for (const std::int64_t capacity : {5, 6, 17, 64}) {
        const ShardLayout l = dynamic_layout(capacity, plan, world);
        std::int64_t total = 0;
        std::vector<int> hit(static_cast<std::size_t>(capacity), 0);
        for (int r = 0; r < world; ++r) {
          const std::int64_t n = l.key_capacity(r);
          if (plan.type == ShardingType::kTable) {
            EXPECT_EQ(n, r == (plan.owner >= 0 ? plan.owner : 1 % world) ? capacity : 0);
          }
          total += n;
          for (Key lr = 0; lr < n; ++lr) {
            const Key g = l.global_row(r, lr);
            ASSERT_TRUE(g >= 0 && g < capacity) << "world " << world << " rank " << r << " row " << lr << ": " << g;
            ++hit[static_cast<std::size_t>(g)];
          }
        }
        EXPECT_EQ(total, capacity) << "world " << world;
        for (std::int64_t g = 0; g < capacity; ++g)
          EXPECT_EQ(hit[static_cast<std::size_t>(g)], 1) << "world " << world << " global row " << g;
      }
}

TEST(ValidateDynamicPlan, RowOrTableShardingWithARowPerRank) {
  const TableSpec s = table(3, 4);
  EXPECT_TRUE(validate_dynamic_plan(s, {ShardingType::kRow, -1}, 3).is_ok());
  EXPECT_TRUE(validate_dynamic_plan(s, {ShardingType::kTable, 1}, 2).is_ok());
  EXPECT_TRUE(validate_dynamic_plan(s, {ShardingType::kColumn, -1}, 1).is_ok());  // a world of one: the whole table
  EXPECT_EQ(validate_dynamic_plan(s, {ShardingType::kColumn, -1}, 2).message(),
            "dynamic table 't': column sharding over 2 ranks cannot hold its keys (expected row sharding, by a hash of "
            "the key, or table sharding)");
  EXPECT_EQ(validate_dynamic_plan(s, {ShardingType::kReplicated, -1}, 2).message(),
            "dynamic table 't': replicated sharding over 2 ranks cannot hold its keys (expected row sharding, by a "
            "hash of the key, or table sharding)");
  const Status st = validate_dynamic_plan(s, {ShardingType::kRow, -1}, 4);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "dynamic table 't': capacity 3 is below the world size 4 (row sharding gives every rank a shard of "
            "capacity / ranks rows; expected a capacity of at least 4)");
  EXPECT_EQ(validate_dynamic_plan(s, {ShardingType::kTable, 2}, 2).message(),
            "table 't': table sharding owner rank 2 out of range [0, 2) for a world of 2 ranks");
}

}  // namespace
}  // namespace strata::dispatch
