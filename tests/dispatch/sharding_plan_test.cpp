// ShardLayout: ownership, local rows, column slices and the initializer origin of shards, checked
// against brute force for every type and world size.

#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace strata::dispatch
