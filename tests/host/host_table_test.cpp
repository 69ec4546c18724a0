#include "host/host_table.hpp"

#include "core/half.hpp"
#include "core/record_layout.hpp"
#include "tests/host/record_pads.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
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

INSTANTIATE_TEST_SUITE_P(Nodes, HostTableLayout, ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

using testing::half_bits_at;

// A half table starts as the fp32 table rounded to nearest even, element by element (its state
// too, when bf16), with the pads zero bits (the half after odd-dim weights or an odd-dim bf16
// state, and the words after); its records take record_words(record_shape(spec)) words,
// and host_footprint counts what create maps.
TEST(HalfTables, InitialRowsAreTheFp32RowsRoundedToNearestAndTheFootprintFollows) {
  Topology topo = Topology::fake(2);
  HostTableOptions o;
  o.block_rows_log2 = 6;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int dim : {5, 64}) {
      for (const auto& [opt, state_dtype] :
           {std::pair{OptimizerKind::kRowwiseAdagrad, DType::kF32}, std::pair{OptimizerKind::kAdagrad, DType::kBF16},
            std::pair{OptimizerKind::kAdam, DType::kF32}}) {
        TableSpec f32 = make_spec(1000, dim, opt);
        f32.init.bound = 3.0f;  // fp16 rounds values of several binades
        TableSpec spec = f32;
        spec.dtype = dtype;
        spec.state_dtype = state_dtype;
        const std::string what = std::string(to_string(dtype)) + " dim " + std::to_string(dim) + " " + to_string(opt) +
                                 " state " + to_string(state_dtype);
        auto a = HostTable::create(topo, f32, o);
        auto h = HostTable::create(topo, spec, o);
        ASSERT_TRUE(a.is_ok() && h.is_ok()) << what << ": " << h.status().to_string();
        const std::int64_t words = record_words(record_shape(spec));
        ASSERT_EQ(h->stride(), words) << what;
        ASSERT_LE(words, a->stride()) << what;  // (dim 5 adam: 13 words or 15 both pad to 16)
        const std::int64_t rw = element_words(dim, dtype);
        const std::int32_t sd = h->state_dim();
        for (std::int64_t r = 0; r < spec.rows; ++r) {
          for (int c = 0; c < dim; ++c)
            ASSERT_EQ(half_bits_at(h->row(r), c), narrow(dtype, a->row(r)[c], false, 0)) << what << " row " << r;
          ASSERT_EQ(static_cast<const void*>(h->state(r)), static_cast<const void*>(h->row(r) + rw)) << what;
          for (int c = 0; c < sd; ++c) {
            if (state_dtype == DType::kF32) {
              ASSERT_EQ(h->state(r)[c], a->state(r)[c]) << what;
            } else {
              ASSERT_EQ(half_bits_at(h->state(r), c), narrow(state_dtype, a->state(r)[c], false, 0)) << what;
            }
          }
          ASSERT_TRUE(testing::record_pads_are_zero(h->ref(), r)) << what;
        }
        EXPECT_EQ(h->bytes(), static_cast<std::size_t>(h->stride()) * 4 * 1024u) << what;  // whole row blocks
        const HostFootprint fp = host_footprint({spec}, o, 2, false);
        EXPECT_EQ(fp.record_bytes, h->bytes()) << what;
        EXPECT_EQ(fp.mapped_bytes, h->mapped_bytes()) << what;
      }
    }
  }
}

TEST(HostTable, RejectsBadSpec) {
  auto spec = make_spec(0, 4, OptimizerKind::kSgd);
  EXPECT_EQ(HostTable::create(Topology::fake(1), spec, {}).status().message(), "table 't': rows 0 must be > 0");
}

// ---- small tables packed into shared arenas (issue 16) ----

// Records each pinned range, so a test can check that every part of a table lies in one.
class RecordingPinner final : public Pinner {
 public:
  Status pin(void* addr, std::size_t len) override {
    std::lock_guard<std::mutex> lock(m_);
    ranges_[static_cast<char*>(addr)] = len;
    ++pins_;
    return Status::ok();
  }
  void unpin(void* addr, std::size_t len) noexcept override {
    std::lock_guard<std::mutex> lock(m_);
    auto it = ranges_.find(static_cast<char*>(addr));
    if (it != ranges_.end() && it->second == len)
      ranges_.erase(it);
    else
      bad_unpins_++;
  }
  const char* name() const noexcept override { return "recording"; }
  // Whether [p, p + len) lies inside one pinned range.
  bool covers(const void* p, std::size_t len) const {
    std::lock_guard<std::mutex> lock(m_);
    const char* c = static_cast<const char*>(p);
    auto it = ranges_.upper_bound(const_cast<char*>(c));
    if (it == ranges_.begin()) return false;
    --it;
    return c >= it->first && c + len <= it->first + it->second;
  }
  std::size_t live() const {
    std::lock_guard<std::mutex> lock(m_);
    return ranges_.size();
  }
  int pins() const { return pins_; }
  int bad_unpins() const { return bad_unpins_; }

 private:
  mutable std::mutex m_;
  std::map<char*, std::size_t> ranges_;
  int pins_ = 0;
  int bad_unpins_ = 0;
};

TEST(PackedTables, ThousandOneRowTablesShareOneArena) {
  Topology topo = Topology::fake(1);
  const std::size_t before = NumaArena::live_mapped_bytes();
  std::vector<HostTable> tables;
  std::vector<TableSpec> specs;
  {
    ArenaPacker packer;
    HostTableOptions o;
    o.packer = &packer;
    for (int t = 0; t < 1000; ++t) {
      TableSpec spec = make_spec(1, 16, OptimizerKind::kSgd);  // one 64-byte record
      spec.name = "t" + std::to_string(t);
      specs.push_back(spec);
      auto table = HostTable::create(topo, spec, o);
      ASSERT_TRUE(table.is_ok()) << table.status().to_string();
      tables.push_back(std::move(table).value());
    }
    EXPECT_EQ(packer.mapped_bytes(), ArenaPacker::kChunkBytes);
    EXPECT_EQ(host_footprint(specs, o, 1, true).mapped_bytes, ArenaPacker::kChunkBytes);
    EXPECT_EQ(host_footprint(specs, o, 1, true).packed_tables, 1000u);
    EXPECT_EQ(host_footprint(specs, o, 1, false).mapped_bytes, 1000 * ArenaPacker::kChunkBytes);
  }  // the packer goes first: the tables keep their arena
  // 64,000 bytes of rows in one 2 MiB arena (it was 1,000 arenas: 2 GiB).
  EXPECT_EQ(NumaArena::live_mapped_bytes() - before, ArenaPacker::kChunkBytes);
  std::set<const float*> seen;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const HostTable& table = tables[t];
    EXPECT_TRUE(table.packed());
    EXPECT_EQ(table.bytes(), 64u);
    EXPECT_EQ(table.mapped_bytes(), 64u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(table.row(0)) % ArenaPacker::kAlignment, 0u);
    EXPECT_TRUE(seen.insert(table.row(0)).second) << "table " << t << " aliases another";
    const auto seed = table_seed(3, table_name_hash(table.spec().name));
    for (int c = 0; c < 16; ++c) ASSERT_EQ(table.row(0)[c], initial_value(seed, 0, c, 0.1f)) << "table " << t;
  }
  // Writes to one table leave its neighbours alone.
  for (int c = 0; c < 16; ++c) tables[500].row(0)[c] = -1.0f;
  for (std::size_t t : {499u, 501u}) {
    const auto seed = table_seed(3, table_name_hash(tables[t].spec().name));
    for (int c = 0; c < 16; ++c) EXPECT_EQ(tables[t].row(0)[c], initial_value(seed, 0, c, 0.1f));
  }
  tables.clear();
  EXPECT_EQ(NumaArena::live_mapped_bytes(), before);
}

TEST(PackedTables, LargeTablesKeepArenasOfTheirOwn) {
  Topology topo = Topology::fake(1);
  ArenaPacker packer;
  HostTableOptions o;
  o.packer = &packer;
  // 4096 rows of 256 bytes = 1 MiB: at the threshold, so not packed.
  auto big = HostTable::create(topo, make_spec(4096, 64, OptimizerKind::kSgd), o);
  ASSERT_TRUE(big.is_ok());
  EXPECT_FALSE(big->packed());
  EXPECT_EQ(big->mapped_bytes(), NumaArena::kGranularity);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big->row(0)) % NumaArena::kGranularity, 0u);
  auto small = HostTable::create(topo, make_spec(4095, 64, OptimizerKind::kSgd), o);
  ASSERT_TRUE(small.is_ok());
  EXPECT_TRUE(small->packed());
  EXPECT_EQ(packer.mapped_bytes(), ArenaPacker::kChunkBytes);
  // A lower threshold keeps it out of the shared arenas.
  o.pack_below_bytes = 4096;
  auto unpacked = HostTable::create(topo, make_spec(4095, 64, OptimizerKind::kSgd), o);
  ASSERT_TRUE(unpacked.is_ok());
  EXPECT_FALSE(unpacked->packed());
}

TEST(PackedTables, InterleavedAndBoundSmallTablesKeepTheirNodes) {
  Topology topo = Topology::fake(3);
  ArenaPacker packer;
  HostTableOptions o;
  o.packer = &packer;
  o.block_rows_log2 = 3;  // 8-row blocks: a 100-row table has parts on all three nodes
  TableSpec spec = make_spec(100, 4, OptimizerKind::kRowwiseAdagrad);
  auto inter = HostTable::create(topo, spec, o);
  ASSERT_TRUE(inter.is_ok());
  EXPECT_TRUE(inter->packed());
  EXPECT_EQ(inter->ref().parts, 3);
  for (std::int64_t r = 0; r < 100; ++r) EXPECT_EQ(inter->node_of(r), static_cast<int>((r / 8) % 3));
  EXPECT_EQ(packer.mapped_bytes(), 3 * ArenaPacker::kChunkBytes);  // one shared arena per node
  o.interleave = false;
  o.node = 2;
  auto bound = HostTable::create(topo, spec, o);
  ASSERT_TRUE(bound.is_ok());
  EXPECT_EQ(bound->ref().parts, 1);
  for (std::int64_t r = 0; r < 100; ++r) EXPECT_EQ(bound->node_of(r), 2);
  EXPECT_EQ(packer.mapped_bytes(), 3 * ArenaPacker::kChunkBytes);  // went into node 2's arena
  const auto seed = table_seed(spec.init.seed, table_name_hash(spec.name));
  std::set<const float*> seen;
  for (std::int64_t r = 0; r < 100; ++r) {
    for (const HostTable* t : {&*inter, &*bound}) {
      ASSERT_TRUE(seen.insert(t->row(r)).second) << "row " << r << " aliases another";
      for (int c = 0; c < 4; ++c) ASSERT_EQ(t->row(r)[c], initial_value(seed, r, c, 0.1f));
      ASSERT_EQ(t->state(r)[0], 0.25f);
    }
  }
}

TEST(PackedTables, SharedArenasArePinnedWholeAndOnlyWithTheirPinner) {
  Topology topo = Topology::fake(2);
  RecordingPinner a, b;
  std::vector<HostTable> tables;
  {
    ArenaPacker packer;
    HostTableOptions o;
    o.packer = &packer;
    o.block_rows_log2 = 4;
    std::mt19937_64 rng(5);
    for (int t = 0; t < 200; ++t) {
      o.pinner = (t % 2) ? &a : &b;
      TableSpec spec = make_spec(1 + static_cast<std::int64_t>(rng() % 300), 1 + static_cast<int>(rng() % 40),
                                 static_cast<OptimizerKind>(rng() % 4));
      spec.name = "t" + std::to_string(t);
      auto table = HostTable::create(topo, spec, o);
      ASSERT_TRUE(table.is_ok()) << table.status().to_string();
      tables.push_back(std::move(table).value());
    }
  }
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const RecordingPinner& mine = (t % 2) ? a : b;
    const RecordingPinner& other = (t % 2) ? b : a;
    const RowRef ref = tables[t].ref();
    for (std::int64_t r = 0; r < tables[t].rows(); ++r) {
      const std::size_t len = static_cast<std::size_t>(ref.stride) * sizeof(float);
      ASSERT_TRUE(mine.covers(ref.row(r), len)) << "table " << t << " row " << r << " is not pinned";
      ASSERT_FALSE(other.covers(ref.row(r), len))
          << "table " << t << " row " << r << " shares the other pinner's arena";
    }
  }
  EXPECT_LT(a.pins() + b.pins(), 20);  // a few shared arenas, not one per table part
  tables.clear();
  EXPECT_EQ(a.live() + b.live(), 0u);
  EXPECT_EQ(a.bad_unpins() + b.bad_unpins(), 0);
}

// host_footprint is exact: it equals what creating the tables maps, for random sets of tables.
TEST(PackedTables, FootprintMatchesWhatCreateMaps) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 12; ++round) {
    const int nodes = 1 + static_cast<int>(rng() % 3);
    Topology topo = Topology::fake(nodes);
    HostTableOptions o;
    o.interleave = rng() % 2;
    o.node = static_cast<int>(rng() % static_cast<std::uint64_t>(nodes));
    o.block_rows_log2 = 6 + static_cast<std::int32_t>(rng() % 8);
    const bool packed = round % 4 != 3;
    std::vector<TableSpec> specs;
    for (int t = 0; t < 40; ++t) {
      const std::int64_t rows = (rng() % 8 == 0) ? 3000 + static_cast<std::int64_t>(rng() % 20000)
                                                 : 1 + static_cast<std::int64_t>(rng() % 2000);
      TableSpec spec = make_spec(rows, 1 + static_cast<int>(rng() % 70), static_cast<OptimizerKind>(rng() % 4));
      spec.name = "t" + std::to_string(t);
      specs.push_back(spec);
    }
    const std::size_t before = NumaArena::live_mapped_bytes();
    std::size_t record_bytes = 0;
    std::vector<HostTable> tables;
    {
      ArenaPacker packer;
      o.packer = packed ? &packer : nullptr;
      for (const auto& spec : specs) {
        auto t = HostTable::create(topo, spec, o);
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        record_bytes += t->bytes();
        tables.push_back(std::move(t).value());
      }
    }
    const HostFootprint f = host_footprint(specs, o, nodes, packed);
    EXPECT_EQ(NumaArena::live_mapped_bytes() - before, f.mapped_bytes) << "round " << round;
    EXPECT_EQ(f.record_bytes, record_bytes) << "round " << round;
  }
}

// Many tables just under the threshold: the packer's arenas hold at most twice their bytes (plus the
// open arenas of the search window), and the footprint model agrees with it exactly.
TEST(PackedTables, MidSizedTablesFillArenasAtLeastHalf) {
  Topology topo = Topology::fake(1);
  std::mt19937_64 rng(17);
  std::vector<TableSpec> specs;
  for (int t = 0; t < 150; ++t) {
    TableSpec spec =
        make_spec(1000 + static_cast<std::int64_t>(rng() % 3000), 64, OptimizerKind::kSgd);  // 256 KB..1 MB
    spec.name = "t" + std::to_string(t);
    specs.push_back(spec);
  }
  const std::size_t before = NumaArena::live_mapped_bytes();
  std::size_t records = 0;
  std::vector<HostTable> tables;
  ArenaPacker packer;
  HostTableOptions o;
  o.packer = &packer;
  for (const auto& spec : specs) {
    auto t = HostTable::create(topo, spec, o);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_TRUE(t->packed());
    records += t->bytes();
    tables.push_back(std::move(t).value());
  }
  const std::size_t mapped = NumaArena::live_mapped_bytes() - before;
  EXPECT_EQ(mapped, packer.mapped_bytes());
  EXPECT_GT(mapped, ArenaPacker::kFitWindow * ArenaPacker::kChunkBytes);  // the window matters here
  EXPECT_LE(mapped, 2 * records + ArenaPacker::kFitWindow * ArenaPacker::kChunkBytes);
  EXPECT_EQ(host_footprint(specs, o, 1, true).mapped_bytes, mapped);
}

TEST(PackedTables, PackerRefusesRegionsItCannotHold) {
  Topology topo = Topology::fake(1);
  ArenaPacker packer;
  EXPECT_EQ(packer.allocate(topo, 0, {}).status().message(), "ArenaPacker: region of 0 bytes (expected 1 to 2097152)");
  EXPECT_FALSE(packer.allocate(topo, ArenaPacker::kChunkBytes + 1, {}).is_ok());
  auto whole = packer.allocate(topo, ArenaPacker::kChunkBytes, {});
  ASSERT_TRUE(whole.is_ok());
  auto next = packer.allocate(topo, 1, {});
  ASSERT_TRUE(next.is_ok());
  EXPECT_NE(next->arena, whole->arena);
  EXPECT_EQ(next->bytes, ArenaPacker::kAlignment);
  EXPECT_EQ(packer.mapped_bytes(), 2 * ArenaPacker::kChunkBytes);
}

}  // namespace strata
