#include "host/host_table.hpp"

#include <gtest/gtest.h>

#include <set>

namespace strata {

TableSpec make_spec(std::int64_t rows, int dim, OptimizerKind opt) {
  TableSpec s;
  s.name = "t";
  s.rows = rows;
  s.dim = dim;
  s.init.bound = 0.1f;
  s.init.seed = 3;
  s.optimizer.kind = opt;
  s.optimizer.initial_accumulator = 0.25f;
  return s;
}

TEST(HostTable, RecordStride) {
  EXPECT_EQ(record_stride(1, 0), 1);
  EXPECT_EQ(record_stride(3, 1), 4);
  EXPECT_EQ(record_stride(5, 0), 8);
  EXPECT_EQ(record_stride(16, 0), 16);
  EXPECT_EQ(record_stride(128, 1), 144);
  EXPECT_EQ(record_stride(64, 128), 192);
}

class HostTableLayout : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(HostTableLayout, RowsAreDistinctInitialisedAndNodePlaced) {
  const auto [nodes, interleave] = GetParam();
  Topology topo = Topology::fake(nodes);
  const std::int64_t rows = 10000;  // not a multiple of the block size
  TableSpec spec = make_spec(rows, 5, OptimizerKind::kRowwiseAdagrad);
  HostTableOptions o;
  o.interleave = interleave;
  o.node = nodes - 1;
  o.block_rows_log2 = 7;
  auto t = HostTable::create(topo, spec, o);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  std::set<const float*> seen;
  std::vector<int> per_node(static_cast<std::size_t>(nodes), 0);
  const auto seed = table_seed(spec.init.seed, table_name_hash(spec.name));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = t->row(r);
    ASSERT_TRUE(seen.insert(row).second) << "row " << r << " aliases another row";
    for (int c = 0; c < 5; ++c) ASSERT_EQ(row[c], initial_value(seed, r, c, 0.1f));
    ASSERT_EQ(t->state(r)[0], 0.25f);
    per_node[static_cast<std::size_t>(t->node_of(r))]++;
  }
  if (interleave && nodes > 1) {
    for (int n = 0; n < nodes; ++n) EXPECT_GT(per_node[static_cast<std::size_t>(n)], rows / nodes - 200);
    EXPECT_NE(t->node_of(0), t->node_of(128));
  } else {
    EXPECT_EQ(per_node[static_cast<std::size_t>(interleave ? 0 : nodes - 1)], rows);
  }
  // reset() restores the initial values after a write.
  t->row(17)[2] = 42.0f;
  t->reset();
  EXPECT_EQ(t->row(17)[2], initial_value(seed, 17, 2, 0.1f));
}

INSTANTIATE_TEST_SUITE_P(Nodes, HostTableLayout,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

TEST(HostTable, RejectsBadSpec) {
  auto spec = make_spec(0, 4, OptimizerKind::kSgd);
  EXPECT_EQ(HostTable::create(Topology::fake(1), spec, {}).status().message(), "table 't': rows 0 must be > 0");
}

}  // namespace strata
