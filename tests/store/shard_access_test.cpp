// This rank's shards (issue 33): Store::shard_info, read_shard and write_shard on thread ranks, for
// every sharding type at worlds of 2 and 3. shard_info describes exactly where dispatch puts a row
// (key k on rank k % world for row sharding; column slices split as evenly as possible), read_shard
// is the matching slice of the gathered read_rows, write_shard lands where read_rows finds it, and
// bad calls are refused naming the table without changing anything.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "store/store.hpp"
#include "tests/store/thread_ranks.hpp"

namespace strata {
namespace {

using dispatch::ShardingType;
using testing::on_ranks;

// One table per sharding type; `row` is hybrid (a cached inner shard), the others gpu. The state
// widths differ: sgd none, adagrad one block, adam two blocks split by column sharding.
StoreConfig four_tables() {
  StoreConfig c = testing::thread_rank_config(16 << 20);
  struct T {
    const char* name;
    std::int64_t rows;
    std::int32_t dim;
    ShardingType type;
    OptimizerKind kind;
    Placement placement;
  };
  for (const T& t : {T{"rep", 10, 4, ShardingType::kReplicated, OptimizerKind::kSgd, Placement::kGpu},
                     T{"tab", 7, 3, ShardingType::kTable, OptimizerKind::kAdagrad, Placement::kGpu},
                     T{"row", 11, 4, ShardingType::kRow, OptimizerKind::kAdagrad, Placement::kHybrid},
                     T{"col", 5, 7, ShardingType::kColumn, OptimizerKind::kAdam, Placement::kGpu}}) {
    TableConfig tc;
    tc.spec.name = t.name;
    tc.spec.rows = t.rows;
    tc.spec.dim = t.dim;
    tc.spec.optimizer.kind = t.kind;
    tc.placement = t.placement;
    tc.sharding.type = t.type;  // owner -1: table index % world (rank 1 for `tab`)
    if (t.placement == Placement::kHybrid) tc.cache.rows = 2;
    c.tables.push_back(tc);
  }
  return c;
}

const TableSpec& spec_of(const StoreConfig& c, int t) { return c.tables[static_cast<std::size_t>(t)].spec; }
std::int64_t state_dim(const TableSpec& s) { return optimizer_state_dim(s.optimizer.kind, s.dim); }

// Distinct exact values for element j of row g of table t (state: negative).
float weight_at(int t, std::int64_t g, std::int64_t j) { return static_cast<float>(1000 * t + 10 * g + j) + 0.5f; }
float state_at(int t, std::int64_t g, std::int64_t j) { return -weight_at(t, g, j); }

// Every row of table t as read_rows reads it (a collective: every rank calls it).
void gathered(Store& s, const StoreConfig& c, int t, std::vector<float>& w, std::vector<float>& st) {
  const TableSpec& spec = spec_of(c, t);
  w.assign(static_cast<std::size_t>(spec.rows * spec.dim), 0.0f);
  st.assign(static_cast<std::size_t>(spec.rows * state_dim(spec)), 0.0f);
  ASSERT_TRUE(s.read_rows(t, 0, spec.rows, w.data(), st.data()).is_ok());
}

// The global (row, element) of local element (i, j) of this rank's weights, and of its state (blocks of local_dim).
std::int64_t global_w(const ShardInfo& si, std::int64_t i, std::int64_t j) {
  return (si.row_start + i * si.row_step) * si.dim + si.col_offset + j;
}
std::int64_t global_s(const ShardInfo& si, std::int64_t sd, std::int64_t i, std::int64_t j) {
  const std::int64_t blk = j / si.local_dim, col = j % si.local_dim;
  return (si.row_start + i * si.row_step) * sd + blk * si.dim + si.col_offset + col;
}

// body(world, rank, store, table) for every table of four_tables() on each rank of worlds of 2 and 3.
template <class Body>
void each_table_on_worlds_of_2_and_3(Body body) {
  const StoreConfig c = four_tables();
  for (const int N : {2, 3}) {
    on_ranks(N, 10000, [&](int r, auto comm) {
      auto store = Store::open(c, comm);
      ASSERT_TRUE(store.is_ok()) << store.status().message();
      for (int t = 0; t < static_cast<int>(c.tables.size()); ++t) body(N, r, *store.value(), t);
    });
  }
}

TEST(ShardAccess, ShardInfoDescribesWhereDispatchPutsEachRow) {
  const StoreConfig c = four_tables();
  each_table_on_worlds_of_2_and_3([&](int N, int r, Store& store, int t) {
    std::vector<int> all;
    for (int q = 0; q < N; ++q) all.push_back(q);
    auto got = store.shard_info(t);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    const ShardInfo& si = got.value();
    const TableSpec& spec = spec_of(c, t);
    SCOPED_TRACE("world " + std::to_string(N) + " rank " + std::to_string(r) + " table " + spec.name);
    EXPECT_EQ(si.type, c.tables[static_cast<std::size_t>(t)].sharding.type);
    EXPECT_EQ(si.world, N);
    EXPECT_EQ(si.rank, r);
    EXPECT_EQ(si.rows, spec.rows);
    EXPECT_EQ(si.dim, spec.dim);
    std::int64_t rows = spec.rows, start = 0, step = 1;
    std::int32_t dim = spec.dim, col = 0;
    std::vector<int> replicas{r};
    if (t == 0) replicas = all;
    if (t == 1 && r != 1) rows = dim = 0, replicas.clear();
    if (t == 2) {  // keys 0..10 with k % N == r
      rows = 0;
      for (std::int64_t k = 0; k < spec.rows; ++k) rows += k % N == r;
      start = r, step = N;
    }
    if (t == 3) {  // 7 columns: 4+3 over 2 ranks, 3+2+2 over 3
      const std::vector<std::int32_t> widths =
          N == 2 ? std::vector<std::int32_t>{4, 3} : std::vector<std::int32_t>{3, 2, 2};
      dim = widths[static_cast<std::size_t>(r)];
      for (int q = 0; q < r; ++q) col += widths[static_cast<std::size_t>(q)];
    }
    EXPECT_EQ(si.local_rows, rows);
    EXPECT_EQ(si.local_dim, dim);
    if (rows > 0) {
      EXPECT_EQ(si.row_start, start);
      EXPECT_EQ(si.row_step, step);
      EXPECT_EQ(si.col_offset, col);
    }
    EXPECT_EQ(si.replicas, replicas);
  });
}

// Without a world: the whole table, replicated over a world of one (the store and the oracle).
TEST(ShardAccess, AStoreWithoutAWorldHoldsEveryTableWhole) {
  StoreConfig c = four_tables();
  for (auto& t : c.tables) t.sharding = {};
  c.tables[2].placement = Placement::kCached;
  for (bool reference : {false, true}) {
    auto store = reference ? open_reference_store(c) : Store::open(c);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    for (int t = 0; t < 4; ++t) {
      auto si = store.value()->shard_info(t);
      ASSERT_TRUE(si.is_ok()) << si.status().message();
      const TableSpec& spec = spec_of(c, t);
      EXPECT_EQ(si.value().type, ShardingType::kReplicated);
      EXPECT_EQ(si.value().world, 1);
      EXPECT_EQ(si.value().rank, 0);
      EXPECT_EQ(si.value().local_rows, spec.rows);
      EXPECT_EQ(si.value().local_dim, spec.dim);
      EXPECT_EQ(si.value().row_start, 0);
      EXPECT_EQ(si.value().row_step, 1);
      EXPECT_EQ(si.value().col_offset, 0);
      EXPECT_EQ(si.value().replicas, std::vector<int>{0});
      // read_shard is read_rows.
      std::vector<float> w(static_cast<std::size_t>(3 * spec.dim)), s(static_cast<std::size_t>(3 * state_dim(spec)));
      std::vector<float> rw = w, rs = s;
      ASSERT_TRUE(store.value()->read_shard(t, 1, 3, w.data(), s.data()).is_ok());
      ASSERT_TRUE(store.value()->read_rows(t, 1, 3, rw.data(), rs.data()).is_ok());
      EXPECT_EQ(w, rw);
      EXPECT_EQ(s, rs);
    }
    EXPECT_EQ(store.value()->shard_info(4).status().code(), StatusCode::kNotFound);
  }
}

// write_rows (local, the same rows on every rank) sets every element; read_shard must then give this rank's slice of
// the gathered read_rows.
TEST(ShardAccess, ReadShardIsTheMatchingSliceOfTheGatheredRows) {
  const StoreConfig c = four_tables();
  each_table_on_worlds_of_2_and_3([&](int, int r, Store& store, int t) {
    const TableSpec& spec = spec_of(c, t);
    const std::int64_t sd = state_dim(spec);
    std::vector<float> w(static_cast<std::size_t>(spec.rows * spec.dim)), s(static_cast<std::size_t>(spec.rows * sd));
    for (std::int64_t g = 0; g < spec.rows; ++g) {
      for (std::int64_t j = 0; j < spec.dim; ++j) w[static_cast<std::size_t>(g * spec.dim + j)] = weight_at(t, g, j);
      for (std::int64_t j = 0; j < sd; ++j) s[static_cast<std::size_t>(g * sd + j)] = state_at(t, g, j);
    }
    ASSERT_TRUE(store.write_rows(t, 0, spec.rows, w.data(), s.data()).is_ok());
    std::vector<float> gw, gs;
    gathered(store, c, t, gw, gs);
    EXPECT_EQ(gw, w);
    const ShardInfo si = store.shard_info(t).value();
    if (si.local_rows == 0) return;
    const std::int64_t lsd = optimizer_state_dim(spec.optimizer.kind, si.local_dim);
    // The whole shard, then a part of it from local row 1.
    for (const std::int64_t row0 : {std::int64_t{0}, std::int64_t{1}}) {
      const std::int64_t n = si.local_rows - row0;
      std::vector<float> lw(static_cast<std::size_t>(n * si.local_dim)), ls(static_cast<std::size_t>(n * lsd));
      ASSERT_TRUE(store.read_shard(t, row0, n, lw.data(), ls.data()).is_ok());
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < si.local_dim; ++j)
          ASSERT_EQ(lw[static_cast<std::size_t>(i * si.local_dim + j)],
                    gw[static_cast<std::size_t>(global_w(si, row0 + i, j))])
              << spec.name << " rank " << r << " local row " << row0 + i << " column " << j;
        for (std::int64_t j = 0; j < lsd; ++j)
          ASSERT_EQ(ls[static_cast<std::size_t>(i * lsd + j)],
                    gs[static_cast<std::size_t>(global_s(si, sd, row0 + i, j))])
              << spec.name << " rank " << r << " local row " << row0 + i << " state " << j;
      }
      // Weights only.
      std::vector<float> only(lw.size());
      ASSERT_TRUE(store.read_shard(t, row0, n, only.data(), nullptr).is_ok());
      EXPECT_EQ(only, lw);
    }
  });
}

// Each rank writes its own shards (values from their global places); the gathered read_rows then holds every element.
TEST(ShardAccess, WriteShardLandsWhereReadRowsFindsIt) {
  const StoreConfig c = four_tables();
  each_table_on_worlds_of_2_and_3([&](int, int, Store& store, int t) {
    const TableSpec& spec = spec_of(c, t);
    const std::int64_t sd = state_dim(spec);
    const ShardInfo si = store.shard_info(t).value();
    if (si.local_rows > 0) {
      const std::int64_t lsd = optimizer_state_dim(spec.optimizer.kind, si.local_dim), n = si.local_rows;
      std::vector<float> lw(static_cast<std::size_t>(n * si.local_dim)), ls(static_cast<std::size_t>(n * lsd));
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t j = 0; j < si.local_dim; ++j) {
          const std::int64_t e = global_w(si, i, j);
          lw[static_cast<std::size_t>(i * si.local_dim + j)] = weight_at(t, e / spec.dim, e % spec.dim);
        }
        for (std::int64_t j = 0; j < lsd; ++j) {
          const std::int64_t e = global_s(si, sd, i, j);
          ls[static_cast<std::size_t>(i * lsd + j)] = state_at(t, e / sd, e % sd);
        }
      }
      ASSERT_TRUE(store.write_shard(t, 0, n, lw.data(), ls.data()).is_ok());
    }
    std::vector<float> gw, gs;
    gathered(store, c, t, gw, gs);
    for (std::int64_t g = 0; g < spec.rows; ++g) {
      for (std::int64_t j = 0; j < spec.dim; ++j)
        ASSERT_EQ(gw[static_cast<std::size_t>(g * spec.dim + j)], weight_at(t, g, j)) << spec.name << " row " << g;
      for (std::int64_t j = 0; j < sd; ++j)
        ASSERT_EQ(gs[static_cast<std::size_t>(g * sd + j)], state_at(t, g, j)) << spec.name << " row " << g;
    }
  });
}

// Bags of one key each, as many as the largest table has rows: bag b of a table looks up row b % rows, so the
// first `rows` bags of each output are its rows in order.
constexpr std::int64_t kBags = 11;
KeyBatch every_row(const StoreConfig& c) {
  KeyBatch kb;
  for (const TableConfig& tc : c.tables) {
    JaggedKeys f;
    f.table = tc.spec.name;
    f.offsets.push_back(0);
    for (Key b = 0; b < kBags; ++b) {
      f.keys.push_back(b % tc.spec.rows);
      f.offsets.push_back(b + 1);
    }
    kb.features.push_back(std::move(f));
  }
  return kb;
}

// A forward of every row of every table (a collective), discarded: what the store serves for each row.
std::vector<std::vector<float>> served(Store& s, const StoreConfig& c, std::int64_t batch) {
  std::vector<std::vector<float>> out;
  std::vector<MatrixView> views;
  for (const TableConfig& tc : c.tables) out.emplace_back(static_cast<std::size_t>(kBags * tc.spec.dim), -1.0f);
  for (std::size_t t = 0; t < out.size(); ++t) views.push_back({out[t].data(), kBags, c.tables[t].spec.dim});
  const Status submitted = s.submit(batch, every_row(c));
  EXPECT_TRUE(submitted.is_ok()) << submitted.to_string();
  const Status forwarded = s.forward(batch, views);
  EXPECT_TRUE(forwarded.is_ok()) << forwarded.to_string();
  EXPECT_TRUE(s.discard(batch).is_ok());
  return out;
}

// Rows trained into the HBM cache (dirty, not yet written back) are what read_shard reads, and a weights-only
// write_shard is what the next forward serves (no stale cached row), state unchanged: gpu and hybrid shards of every
// type.
TEST(ShardAccess, TrainedCachedRowsAreReadAndWrittenThrough) {
  for (const Placement p : {Placement::kGpu, Placement::kHybrid}) {
    StoreConfig c = four_tables();
    for (TableConfig& tc : c.tables) {
      tc.placement = p;
      tc.cache.rows = p == Placement::kHybrid ? 3 : 0;
      tc.spec.optimizer.learning_rate = 0.25f;
    }
    on_ranks(2, 10000, [&](int r, auto comm) {
      auto opened = Store::open(c, comm);
      ASSERT_TRUE(opened.is_ok()) << opened.status().message();
      Store& store = *opened.value();
      std::vector<std::vector<float>> grads;
      std::vector<ConstMatrixView> gv;
      for (const TableConfig& tc : c.tables) grads.emplace_back(static_cast<std::size_t>(kBags * tc.spec.dim), 1.0f);
      for (std::size_t t = 0; t < grads.size(); ++t) gv.push_back({grads[t].data(), kBags, c.tables[t].spec.dim});
      std::vector<std::vector<float>> out = served(store, c, 1);  // batch 1's forward is discarded; train batch 2
      std::vector<MatrixView> ov;
      for (std::size_t t = 0; t < out.size(); ++t) ov.push_back({out[t].data(), kBags, c.tables[t].spec.dim});
      ASSERT_TRUE(store.submit(2, every_row(c)).is_ok());
      ASSERT_TRUE(store.forward(2, ov).is_ok());
      ASSERT_TRUE(store.backward(2, gv).is_ok());
      const std::vector<std::vector<float>> trained = served(store, c, 3);
      for (int t = 0; t < static_cast<int>(c.tables.size()); ++t) {
        const TableSpec& spec = spec_of(c, t);
        const std::size_t ut = static_cast<std::size_t>(t);
        ASSERT_NE(trained[ut], out[ut]) << spec.name << ": the step changed no row";
        const ShardInfo si = store.shard_info(t).value();
        std::vector<float> lw(static_cast<std::size_t>(si.local_rows * si.local_dim));
        if (si.local_rows > 0) {
          ASSERT_TRUE(store.read_shard(t, 0, si.local_rows, lw.data(), nullptr).is_ok());
        }
        for (std::int64_t i = 0; i < si.local_rows; ++i)
          for (std::int64_t j = 0; j < si.local_dim; ++j)
            ASSERT_EQ(lw[static_cast<std::size_t>(i * si.local_dim + j)],
                      trained[ut][static_cast<std::size_t>(global_w(si, i, j))])
                << to_string(p) << " " << spec.name << " rank " << r << " local row " << i << " column " << j;
        std::vector<float> gw, before;
        gathered(store, c, t, gw, before);
        for (std::int64_t i = 0; i < si.local_rows; ++i)
          for (std::int64_t j = 0; j < si.local_dim; ++j) {
            const std::int64_t e = global_w(si, i, j);
            lw[static_cast<std::size_t>(i * si.local_dim + j)] = weight_at(t, e / spec.dim, e % spec.dim);
          }
        if (si.local_rows > 0) {
          ASSERT_TRUE(store.write_shard(t, 0, si.local_rows, lw.data(), nullptr).is_ok());
        }
        std::vector<float> after;
        gathered(store, c, t, gw, after);
        EXPECT_EQ(after, before) << to_string(p) << " " << spec.name
                                 << ": a weights-only write_shard changed the state";
      }
      const std::vector<std::vector<float>> written = served(store, c, 4);
      for (int t = 0; t < static_cast<int>(c.tables.size()); ++t) {
        const TableSpec& spec = spec_of(c, t);
        for (std::int64_t g = 0; g < spec.rows; ++g)
          for (std::int64_t j = 0; j < spec.dim; ++j)
            ASSERT_EQ(written[static_cast<std::size_t>(t)][static_cast<std::size_t>(g * spec.dim + j)],
                      weight_at(t, g, j))
                << to_string(p) << " " << spec.name << " rank " << r << " row " << g << " column " << j;
      }
    });
  }
}

TEST(ShardAccess, BadCallsAreRefusedNamingTheTableAndChangeNothing) {
  const StoreConfig c = four_tables();
  on_ranks(2, 10000, [&](int r, auto comm) {
    auto opened = Store::open(c, comm);
    ASSERT_TRUE(opened.is_ok()) << opened.status().message();
    Store& store = *opened.value();
    std::vector<float> before_w, before_s;
    gathered(store, c, 2, before_w, before_s);
    std::vector<float> buf(64, 7.0f);
    // An unknown table.
    for (const int t : {-1, 4}) {
      EXPECT_EQ(store.shard_info(t).status().message(),
                "shard_info: table index " + std::to_string(t) + " out of range [0, 4)");
      EXPECT_EQ(store.read_shard(t, 0, 1, buf.data(), nullptr).message(),
                "read_shard: table index " + std::to_string(t) + " out of range [0, 4)");
      EXPECT_EQ(store.write_shard(t, 0, 1, buf.data(), nullptr).code(), StatusCode::kNotFound);
    }
    // A table this rank does not hold: `tab` lives on rank 1.
    if (r == 0) {
      const std::string why =
          "table 'tab': rank 0 of 2 holds none of it (table sharding; expected a table this rank holds)";
      EXPECT_EQ(store.read_shard(1, 0, 0, buf.data(), nullptr).message(), "read_shard: " + why);
      Status w = store.write_shard(1, 0, 1, buf.data(), nullptr);
      EXPECT_EQ(w.code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(w.message(), "write_shard: " + why);
    } else {
      EXPECT_TRUE(store.read_shard(1, 0, 7, buf.data(), nullptr).is_ok());
    }
    // Rows outside this rank's shard of `row` (6 local rows on rank 0, 5 on rank 1).
    const std::int64_t local = r == 0 ? 6 : 5;
    const std::string shard = " (rank " + std::to_string(r) + " of 2, row sharding)";
    for (const auto& [row0, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{local - 1, 2}, {-1, 1}, {0, -1}}) {
      const std::string range = "table 'row': local rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                                ") out of this rank's shard [0, " + std::to_string(local) + ")" + shard;
      Status rs = store.read_shard(2, row0, n, buf.data(), nullptr);
      EXPECT_EQ(rs.code(), StatusCode::kOutOfRange);
      EXPECT_EQ(rs.message(), "read_shard: " + range);
      EXPECT_EQ(store.write_shard(2, row0, n, buf.data(), buf.data()).message(), "write_shard: " + range);
    }
    // A null weights buffer.
    EXPECT_EQ(store.write_shard(2, 0, 2, nullptr, nullptr).message(),
              "write_shard: table 'row': weights is null (expected a buffer of 2 x 4 floats)");
    // Batches in flight: write_shard is refused, read_shard reads.
    KeyBatch kb;
    JaggedKeys f;
    f.table = "row";
    f.offsets = {0, 2};
    f.keys = {1, 2};
    kb.features.push_back(f);
    ASSERT_TRUE(store.submit(5, kb).is_ok());
    Status busy = store.write_shard(2, 0, 1, buf.data(), nullptr);
    EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(busy.message(), "write_shard with 1 batch(es) in flight (expected none: finish or discard them first)");
    EXPECT_TRUE(store.read_shard(2, 0, 1, buf.data(), nullptr).is_ok());
    ASSERT_TRUE(store.discard(5).is_ok());
    // Nothing changed.
    std::vector<float> after_w, after_s;
    gathered(store, c, 2, after_w, after_s);
    EXPECT_EQ(after_w, before_w);
    EXPECT_EQ(after_s, before_s);
  });
}

}  // namespace
}  // namespace strata
