// The geometry of world checkpoints (store/io/detail/reshard.hpp): boxes, tiling, and resharding by spans: the
// pieces a world of N ranks saves, read by the readers plan_table picks, packed per destination, exchanged and
// unpacked, give every rank of a world of M ranks exactly its shard, whatever N, M and both shardings.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "store/io/detail/reshard.hpp"
#include "store/store.hpp"
#include "tests/store/boxes.hpp"

namespace strata::detail {
namespace {

using dispatch::ShardingPlan;
using dispatch::ShardingType;

constexpr ShardingType kTypes[] = {ShardingType::kReplicated, ShardingType::kTable, ShardingType::kRow,
                                   ShardingType::kColumn};
constexpr OptimizerKind kKinds[] = {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad,
                                    OptimizerKind::kAdam};
constexpr int kTableIndex = 1;  // so that table-wise and whole pieces do not all land on rank 0

TableSpec spec_of(std::int64_t rows, std::int32_t dim, OptimizerKind kind) {
  TableSpec s;
  s.name = "t";
  s.rows = rows;
  s.dim = dim;
  s.optimizer.kind = kind;
  return s;
}

// Whether a world of `world` ranks can shard the table this way (validate_plan's rules).
bool fits(ShardingType type, std::int32_t dim, OptimizerKind kind, int world) {
  ShardingPlan plan;
  plan.type = type;
  return validate_plan(spec_of(1, dim, kind), plan, world).is_ok();
}

// The value of global row g, global column c, in block `block` of the record (0 the weights, 1.. the state blocks;
// rowwise_adagrad's one float is column `dim` of block 1): distinct and exact in fp32 for the sizes here.
float value(std::int64_t g, std::int32_t c, int block) { return static_cast<float>(g * 1000 + c * 10 + block); }

// The records of box `b` of a table of `dim` columns, as a piece file holds them.
std::vector<float> records_of(const Box& b, std::int32_t dim, OptimizerKind kind) {
  const std::int64_t width = record_floats(kind, b.cols);
  std::vector<float> out(static_cast<std::size_t>(b.rows * width));
  for (std::int64_t i = 0; i < b.rows; ++i) {
    const std::int64_t g = b.row_start + i * b.row_step;
    float* rec = out.data() + i * width;
    for (std::int32_t j = 0; j < b.cols; ++j) rec[j] = value(g, b.col_offset + j, 0);
    if (kind == OptimizerKind::kRowwiseAdagrad) {
      rec[b.cols] = value(g, dim, 1);
    } else {
      for (int s = 0; s < optimizer_state_dim(kind, 1); ++s)
        for (std::int32_t j = 0; j < b.cols; ++j) rec[b.cols + s * b.cols + j] = value(g, b.col_offset + j, s + 1);
    }
  }
  return out;
}

// The pieces a world of `world` ranks saves for a table sharded `type`: each holder's shard, a replicated table
// once (a whole piece, as a table-sharded one).
std::vector<Box> saved_pieces(ShardingType type, std::int64_t rows, std::int32_t dim, OptimizerKind kind, int world) {
  ShardingPlan plan;
  plan.type = type;
  Result<dispatch::ShardLayout> layout =
      dispatch::ShardLayout::make(spec_of(rows, dim, kind), plan, world, kTableIndex);
  EXPECT_TRUE(layout.is_ok()) << layout.status().to_string();
  std::vector<Box> pieces;
  if (type == ShardingType::kReplicated || type == ShardingType::kTable) {
    if (rows > 0) pieces.push_back(whole_box(rows, dim));
    return pieces;
  }
  for (int r = 0; r < world; ++r)
    if (!box_of(layout.value(), r).empty()) pieces.push_back(box_of(layout.value(), r));
  return pieces;
}

std::vector<std::string> names(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t k = 0; k < n; ++k) out.push_back("t.1.0000000000000001.r" + std::to_string(k) + ".tbl");
  return out;
}

struct Case {
  int n, m;
  ShardingType saved, target;
  std::int32_t dim;
  std::int64_t rows;
  OptimizerKind kind;
  std::string who() const {
    return std::to_string(n) + " ranks " + to_string(saved) + " -> " + std::to_string(m) + " ranks " +
           to_string(target) + ", rows " + std::to_string(rows) + ", dim " + std::to_string(dim) + ", " +
           strata::to_string(kind);
  }
};

// Moves the table of `c` by spans of `span` rows and checks every rank's window; returns whether any rank sent rows to
// another.
void reshard_and_check(const Case& c, std::int64_t span) {
  SCOPED_TRACE(c.who() + ", spans of " + std::to_string(span));
  const std::vector<Box> pieces = saved_pieces(c.saved, c.rows, c.dim, c.kind, c.n);
  ASSERT_TRUE(check_tiling("t", c.rows, c.dim, pieces, names(pieces.size())).is_ok());
  std::vector<std::vector<float>> files;
  for (const Box& b : pieces) files.push_back(records_of(b, c.dim, c.kind));
  ShardingPlan target;
  target.type = c.target;
  Result<TablePlan> planned = plan_table(spec_of(c.rows, c.dim, c.kind), target, kTableIndex, c.m, pieces);
  ASSERT_TRUE(planned.is_ok()) << planned.status().to_string();
  const TablePlan& p = planned.value();
  ASSERT_EQ(p.targets.size(), static_cast<std::size_t>(c.m));
  ASSERT_EQ(p.reader.size(), pieces.size());
  for (int r : p.reader) ASSERT_TRUE(r >= 0 && r < c.m);
  const auto m = static_cast<std::size_t>(c.m);
  std::vector<std::int64_t> next_local(m, 0);  // the spans cover each target's rows once, in order
  constexpr float kUnset = -1.0f;
  for (std::int64_t row0 = 0; row0 < std::max<std::int64_t>(c.rows, 1); row0 += span) {
    const std::int64_t n = std::min(span, c.rows - row0);
    // Each sender packs; its buffer holds exactly what span_bytes says (the guard stays untouched, nothing unset).
    std::vector<std::vector<float>> send(m);
    std::vector<std::vector<std::int64_t>> displs(m, std::vector<std::int64_t>(m + 1, 0));
    for (std::size_t from = 0; from < m; ++from) {
      for (std::size_t to = 0; to < m; ++to)
        displs[from][to + 1] = displs[from][to] + span_bytes(p, static_cast<int>(from), static_cast<int>(to), row0, n);
      send[from].assign(static_cast<std::size_t>(displs[from][m] / 4 + 8), kUnset);
      std::vector<const float*> recs(pieces.size(), nullptr);
      for (std::size_t k = 0; k < pieces.size(); ++k)
        if (p.reader[k] == static_cast<int>(from))
          recs[k] = files[k].data() + local_range(pieces[k], row0, n).first * record_floats(c.kind, pieces[k].cols);
      pack_span(p, static_cast<int>(from), row0, n, recs, send[from].data(), displs[from]);
      for (std::size_t i = 0; i < send[from].size(); ++i)
        ASSERT_EQ(send[from][i] == kUnset, i >= static_cast<std::size_t>(displs[from][m] / 4))
            << "rank " << from << " packed float " << i << " of " << displs[from][m] / 4;
    }
    // Each receiver gets its segment of every sender (what all_to_all_v does) and unpacks its window.
    for (std::size_t to = 0; to < m; ++to) {
      const Box& t = p.targets[to];
      std::vector<float> recv;
      std::vector<std::int64_t> recv_displs;
      for (std::size_t from = 0; from < m; ++from) {
        recv_displs.push_back(static_cast<std::int64_t>(recv.size()) * 4);
        recv.insert(recv.end(), send[from].begin() + displs[from][to] / 4,
                    send[from].begin() + displs[from][to + 1] / 4);
      }
      const auto run = local_range(t, row0, n);
      ASSERT_EQ(run.first, next_local[to]) << "rank " << to;
      next_local[to] += run.second;
      const std::int64_t sd = optimizer_state_dim(c.kind, t.cols);
      // Exactly one record per row and column of the window comes in.
      ASSERT_EQ(static_cast<std::int64_t>(recv.size()), run.second * record_floats(c.kind, t.cols)) << "rank " << to;
      std::vector<float> weights(static_cast<std::size_t>(run.second * t.cols), kUnset);
      std::vector<float> state(static_cast<std::size_t>(run.second * sd), kUnset);
      unpack_span(p, static_cast<int>(to), row0, n, recv.data(), recv_displs, weights.data(),
                  sd ? state.data() : nullptr);
      for (std::int64_t l = 0; l < run.second; ++l) {
        const std::int64_t g = t.row_start + (run.first + l) * t.row_step;
        for (std::int32_t j = 0; j < t.cols; ++j)
          ASSERT_EQ(weights[static_cast<std::size_t>(l * t.cols + j)], value(g, t.col_offset + j, 0))
              << "rank " << to << " row " << g << " column " << t.col_offset + j;
        for (std::int64_t s = 0; s < sd; ++s) {
          const float want =
              c.kind == OptimizerKind::kRowwiseAdagrad
                  ? value(g, c.dim, 1)
                  : value(g, t.col_offset + static_cast<std::int32_t>(s % t.cols), static_cast<int>(s / t.cols) + 1);
          ASSERT_EQ(state[static_cast<std::size_t>(l * sd + s)], want)
              << "rank " << to << " row " << g << " state " << s;
        }
      }
    }
  }
  for (std::size_t q = 0; q < m; ++q) EXPECT_EQ(next_local[q], p.targets[q].rows) << "rank " << q;
}

TEST(Reshard, EveryWorldAndShardingLoadsEveryOtherExactly) {
  int cases = 0;
  for (int n = 1; n <= 4; ++n)
    for (int m = 1; m <= 4; ++m)
      for (ShardingType saved : kTypes)
        for (ShardingType target : kTypes)
          for (std::int32_t dim : {1, 5, 8})
            for (std::int64_t rows : {0, 3, 11, 37})
              for (OptimizerKind kind : kKinds) {
                if (!fits(saved, dim, kind, n) || !fits(target, dim, kind, m)) continue;
                const Case c{n, m, saved, target, dim, rows, kind};
                for (std::int64_t span : {std::int64_t{1}, std::int64_t{7}, std::max<std::int64_t>(rows, 1)}) {
                  reshard_and_check(c, span);
                  if (::testing::Test::HasFatalFailure()) return;
                }
                ++cases;
              }
  EXPECT_GT(cases, 3000);
}

TEST(Reshard, AWorldLoadingItsOwnShardingReadsOnlyItsOwnPieces) {
  for (int n = 1; n <= 4; ++n)
    for (ShardingType type : {ShardingType::kTable, ShardingType::kRow, ShardingType::kColumn}) {
      SCOPED_TRACE(std::to_string(n) + " ranks " + to_string(type));
      const std::vector<Box> pieces = saved_pieces(type, 37, 8, OptimizerKind::kAdam, n);
      ShardingPlan plan;
      plan.type = type;
      Result<TablePlan> p = plan_table(spec_of(37, 8, OptimizerKind::kAdam), plan, kTableIndex, n, pieces);
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      EXPECT_FALSE(p.value().crosses);
    }
  // 4 ranks row-sharded into 2: each piece's rows all belong to its reader.
  ShardingPlan row;
  Result<TablePlan> p = plan_table(spec_of(37, 8, OptimizerKind::kAdagrad), row, kTableIndex, 2,
                                   saved_pieces(ShardingType::kRow, 37, 8, OptimizerKind::kAdagrad, 4));
  ASSERT_TRUE(p.is_ok());
  EXPECT_FALSE(p.value().crosses);
  EXPECT_EQ(p.value().reader, (std::vector<int>{0, 1, 0, 1}));
  // A whole piece into 2 row shards crosses; its reader is table 1's: rank 1.
  p = plan_table(spec_of(37, 8, OptimizerKind::kAdagrad), row, kTableIndex, 2, {whole_box(37, 8)});
  ASSERT_TRUE(p.is_ok());
  EXPECT_TRUE(p.value().crosses);
  EXPECT_EQ(p.value().reader, (std::vector<int>{1}));
}

TEST(Reshard, SpansHoldAboutThirtyTwoMebibytesPerReceivingRank) {
  ShardingPlan plan;  // row
  Result<TablePlan> p =
      plan_table(spec_of(int64_t{1} << 24, 64, OptimizerKind::kAdagrad), plan, 0, 4, {whole_box(int64_t{1} << 24, 64)});
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p.value().span_rows, (kSpanBytes / (128 * 4)) * 4);
  plan.type = ShardingType::kColumn;
  p = plan_table(spec_of(int64_t{1} << 24, 64, OptimizerKind::kAdagrad), plan, 0, 4, {whole_box(int64_t{1} << 24, 64)});
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p.value().span_rows, kSpanBytes / (32 * 4));
  p = plan_table(spec_of(5, 64, OptimizerKind::kAdagrad), plan, 0, 4, {whole_box(5, 64)});
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p.value().span_rows, 5);
}

TEST(Reshard, BoxesFollowTheShardLayoutAndShardInfoConvention) {
  ShardingPlan plan;  // row
  auto layout = dispatch::ShardLayout::make(spec_of(10, 8, OptimizerKind::kSgd), plan, 4, 0);
  ASSERT_TRUE(layout.is_ok());
  Box b = box_of(layout.value(), 1);
  EXPECT_EQ(b.rows, 3);
  EXPECT_EQ(b.row_start, 1);
  EXPECT_EQ(b.row_step, 4);
  EXPECT_EQ(describe(b), "rows 1 + 4i (3 rows), columns 0-7");
  ShardInfo s;
  s.type = ShardingType::kRow;
  s.world = 4;
  s.rank = 1;
  s.rows = 10;
  s.dim = 8;
  s.local_rows = 3;
  s.row_start = 1;
  s.row_step = 4;
  s.local_dim = 8;
  EXPECT_EQ(box_of(s), b);
  s.local_rows = 0;
  s.row_start = 0;
  EXPECT_EQ(box_of(s), Box{});
  plan.type = ShardingType::kColumn;
  layout = dispatch::ShardLayout::make(spec_of(10, 5, OptimizerKind::kSgd), plan, 4, 0);
  ASSERT_TRUE(layout.is_ok());
  EXPECT_EQ(describe(box_of(layout.value(), 1)), "rows 0-9, columns 2-2");
  plan.type = ShardingType::kTable;
  layout = dispatch::ShardLayout::make(spec_of(10, 5, OptimizerKind::kSgd), plan, 4, 2);
  ASSERT_TRUE(layout.is_ok());
  EXPECT_EQ(box_of(layout.value(), 1), Box{});
  EXPECT_EQ(box_of(layout.value(), 2), whole_box(10, 5));
}

TEST(Reshard, LocalRangeIsShardLayoutsRuleForEveryRowShard) {
  for (int world = 1; world <= 4; ++world)
    for (std::int64_t rows : {1, 3, 11}) {
      ShardingPlan plan;
      auto layout = dispatch::ShardLayout::make(spec_of(rows, 2, OptimizerKind::kSgd), plan, world, 0);
      ASSERT_TRUE(layout.is_ok());
      for (int r = 0; r < world; ++r)
        for (std::int64_t row0 = 0; row0 <= rows; ++row0)
          for (std::int64_t n = 0; row0 + n <= rows; ++n) {
            const Box b = box_of(layout.value(), r);
            const auto want =
                b.empty() ? std::make_pair(std::int64_t{0}, std::int64_t{0}) : layout.value().local_range(r, row0, n);
            EXPECT_EQ(local_range(b, row0, n), want)
                << "world " << world << " rank " << r << " rows [" << row0 << ", " << row0 + n << ")";
          }
    }
}

TEST(Reshard, CheckTilingRefusesGapsOverlapsAndWrongSteps) {
  const auto refused = [](const std::vector<Box>& pieces, const std::string& what) {
    const Status s = check_tiling("user", 11, 8, pieces, names(pieces.size()));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what;
    EXPECT_NE(s.message().find("table 'user'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("corrupt"), std::string::npos) << s.message();
    return s.message();
  };
  const std::vector<Box> rows4 = {row_box(11, 0, 4, 8), row_box(11, 1, 4, 8), row_box(11, 2, 4, 8),
                                  row_box(11, 3, 4, 8)};
  EXPECT_TRUE(check_tiling("user", 11, 8, rows4, names(4)).is_ok());
  EXPECT_TRUE(check_tiling("user", 11, 8, {whole_box(11, 8)}, names(1)).is_ok());
  EXPECT_TRUE(
      check_tiling("user", 3, 8, {row_box(3, 2, 4, 8), row_box(3, 0, 4, 8), row_box(3, 1, 4, 8)}, names(3)).is_ok());
  const std::vector<Box> cols3 = {column_box(11, 0, 3), column_box(11, 3, 3), column_box(11, 6, 2)};
  EXPECT_TRUE(check_tiling("user", 11, 8, cols3, names(3)).is_ok());

  // A gap: a row piece missing.
  std::vector<Box> gap = {rows4[0], rows4[1], rows4[3]};
  EXPECT_NE(refused(gap, "gap").find("do not cover rows 2 + 4i"), std::string::npos);
  // An overlap: a start twice.
  std::vector<Box> twice = {rows4[0], rows4[1], rows4[2], rows4[1]};
  const std::string overlap = refused(twice, "overlap");
  EXPECT_NE(overlap.find("piece 't.1.0000000000000001.r3.tbl' (rows 1 + 4i (3 rows), columns 0-7): overlaps"),
            std::string::npos)
      << overlap;
  // A wrong step.
  std::vector<Box> step = rows4;
  step[2] = row_box(11, 2, 5, 8);
  EXPECT_NE(refused(step, "step").find("row step 5 (expected the step 4"), std::string::npos);
  // A piece with the wrong row count for its start.
  std::vector<Box> count = rows4;
  count[3].rows = 3;
  EXPECT_NE(refused(count, "count").find("3 rows (expected 2"), std::string::npos);
  // A start outside the step.
  std::vector<Box> start = rows4;
  start[3] = row_box(11, 4, 4, 8);
  EXPECT_NE(refused(start, "start").find("first row 4"), std::string::npos);
  // A column range missing, in the middle and at the end.
  EXPECT_NE(refused({cols3[0], cols3[2]}, "columns").find("do not cover columns 3-5"), std::string::npos);
  EXPECT_NE(refused({cols3[0], cols3[1]}, "end").find("do not cover columns 6-7"), std::string::npos);
  // Overlapping columns.
  EXPECT_NE(refused({cols3[0], column_box(11, 2, 4), cols3[2]}, "column overlap").find("overlaps"), std::string::npos);
  // A column piece with part of the rows.
  EXPECT_NE(refused({cols3[0], column_box(10, 3, 3), cols3[2]}, "column rows").find("part of the rows"),
            std::string::npos);
  // Outside the table; no pieces at all.
  EXPECT_NE(refused({column_box(11, 6, 3)}, "outside").find("not a part of the table"), std::string::npos);
  EXPECT_NE(refused({}, "none").find("do not cover any row"), std::string::npos);
  EXPECT_TRUE(check_tiling("user", 0, 8, {}, {}).is_ok());
}

// A manifest's own numbers size nothing before they are checked: a table of 2^40 rows with one piece of step
// INT32_MAX once sized a vector of INT32_MAX starts (8 GiB; bad_alloc under a memory limit), and negative rows
// wrapped that size (length_error). Both are refused as corrupt, the first as the gap it is.
TEST(Reshard, CheckTilingRefusesImpossibleShapesBeforeSizingAnythingByThem) {
  Box huge_step = whole_box(1, 1);
  huge_step.row_step = std::numeric_limits<std::int32_t>::max();
  const Status gap = check_tiling("t", std::int64_t{1} << 40, 1, {huge_step}, {"f"});
  EXPECT_EQ(gap.code(), StatusCode::kDataLoss) << gap.to_string();
  EXPECT_NE(gap.message().find("table 't'"), std::string::npos) << gap.message();
  EXPECT_NE(gap.message().find("do not cover rows 1 + 2147483647i"), std::string::npos) << gap.message();

  const auto refused = [](std::int64_t rows, std::int32_t dim, const std::vector<Box>& pieces,
                          const std::string& what) {
    const Status s = check_tiling("user", rows, dim, pieces, names(pieces.size()));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
    for (const std::string& part : {std::string("table 'user'"), what, std::string("corrupt")})
      EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  refused(-5, 4, {row_box(3, 0, 4, 4)}, "rows -5");
  refused(-5, 4, {}, "rows -5");
  refused(3, 0, {whole_box(3, 0)}, "dim 0");
  refused(3, -2, {whole_box(3, -2)}, "dim -2");
}

}  // namespace
}  // namespace strata::detail
