// find_repeats against a std::map over random batches: every position flagged exactly when its key
// is used more than once, and each repeated key listed once, in its own key range, with all its
// positions ascending.
#include "host/repeats.hpp"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "host/topology.hpp"

namespace strata {
namespace {

void expect_repeats(const std::vector<Key>& keys, const Repeats& r) {
  std::map<Key, std::vector<std::int32_t>> uses;
  for (std::size_t j = 0; j < keys.size(); ++j) uses[keys[j]].push_back(static_cast<std::int32_t>(j));
  ASSERT_EQ(r.repeated.size(), keys.size());
  for (std::size_t j = 0; j < keys.size(); ++j)
    ASSERT_EQ(r.repeated[j], uses[keys[j]].size() > 1 ? 1 : 0) << "position " << j << " key " << keys[j];
  std::set<Key> listed;
  std::int64_t lo = 0;
  for (std::size_t g = 0; g < r.ranges.size(); ++g) {
    const UniqueKeys& u = r.ranges[g];
    ASSERT_EQ(u.offsets.size(), u.keys.size() + 1);
    ASSERT_EQ(u.offsets.front(), 0);
    ASSERT_EQ(u.offsets.back(), static_cast<std::int64_t>(u.positions.size()));
    for (std::size_t i = 0; i < u.keys.size(); ++i) {
      const Key k = u.keys[i];
      ASSERT_TRUE(listed.insert(k).second) << "key " << k << " listed twice";
      // Ranges are ascending and disjoint: a key never appears in a range before one of a smaller key.
      ASSERT_GE(k, lo) << "range " << g;
      const std::vector<std::int32_t> got(u.positions.begin() + u.offsets[i], u.positions.begin() + u.offsets[i + 1]);
      ASSERT_EQ(got, uses[k]) << "key " << k;
    }
    for (const Key k : u.keys) lo = std::max(lo, k);
  }
  std::size_t want_listed = 0;
  for (const auto& [k, p] : uses) want_listed += p.size() > 1;
  EXPECT_EQ(listed.size(), want_listed);
}

TEST(FindRepeats, EmptySingleAndAllTheSame) {
  Repeats r;
  RepeatsScratch s;
  find_repeats(static_cast<const Key*>(nullptr), 0, 10, r, s);
  EXPECT_TRUE(r.repeated.empty());
  for (const auto& u : r.ranges) EXPECT_TRUE(u.keys.empty());
  const std::vector<Key> one{9};
  find_repeats(one.data(), 1, 10, r, s);
  expect_repeats(one, r);
  const std::vector<Key> same(1000, 0);
  find_repeats(same.data(), 1000, 1, r, s);
  expect_repeats(same, r);
}

// Random batches of every size class and key space (one range, several, the most ranges with the
// largest maps at 2^28 rows, the hash dedup beyond, keys at both ends of each), few and many repeats, one hot key; the
// same scratch reused across all of them (its maps are never cleared, only re-tagged), in arenas of 1, 2 and 3 threads.
TEST(FindRepeats, MatchesAMapOnRandomBatches) {
  std::mt19937_64 rng(5);
  for (const int threads : {1, 2, 3}) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      Repeats r;
      RepeatsScratch s;
      for (int trial = 0; trial < 40; ++trial) {
        const std::int64_t spaces[] = {1,
                                       7,
                                       1000,
                                       (std::int64_t{1} << 17) + 1,
                                       2000000,
                                       std::int64_t{1} << 28,
                                       (std::int64_t{1} << 28) + 1,
                                       std::int64_t{1} << 40};
        const std::int64_t key_space = spaces[rng() % 8];
        const std::int64_t n = static_cast<std::int64_t>(rng() % 40000);
        const std::int64_t distinct =
            1 +
            static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(std::min<std::int64_t>(key_space, 2 * n + 1)));
        std::vector<Key> pool(static_cast<std::size_t>(distinct));
        for (auto& k : pool) k = static_cast<Key>(rng() % static_cast<std::uint64_t>(key_space));
        pool[0] = key_space - 1;
        if (distinct > 1) pool[1] = 0;
        std::vector<Key> keys(static_cast<std::size_t>(n));
        for (auto& k : keys) k = (rng() % 4 == 0) ? pool[0] : pool[rng() % pool.size()];
        find_repeats(keys.data(), n, key_space, r, s);
        expect_repeats(keys, r);
        if (HasFatalFailure()) return;
      }
    });
    if (HasFatalFailure()) return;
  }
}

// The map entries carry an epoch; when it wraps, the map is cleared rather than taking entries
// of 2^32 scans ago as current.
TEST(FindRepeats, EpochWrapClearsTheMaps) {
  Repeats r;
  RepeatsScratch s;
  const std::vector<Key> a{1, 2, 3, 4};
  tbb::task_arena arena(1);
  arena.execute([&] {
    find_repeats(a.data(), 4, 100, r, s);
    expect_repeats(a, r);
    for (auto& m : s.maps) m.epoch = std::numeric_limits<std::uint32_t>::max();  // next scan wraps
    const std::vector<Key> b{4, 5, 6, 1};
    find_repeats(b.data(), 4, 100, r, s);
    expect_repeats(b, r);
    const std::vector<Key> c{7, 8, 7, 2};
    find_repeats(c.data(), 4, 100, r, s);
    expect_repeats(c, r);
  });
}

// A small table's scratch is small: a map entry per row at most (it was 2^17 entries, 1 MB per
// thread and table, whatever the rows: 1,000 one-row cpu tables held 1 GB of scratch).
TEST(FindRepeats, ScratchOfASmallKeySpaceIsSmall) {
  // With a 4 MiB L2 the maps are 2^17 entries (1 MB, a quarter of it) until 256 ranges need more.
  const std::uint64_t l2 = std::uint64_t{4} << 20;
  EXPECT_EQ(find_repeats_map_entries(1, l2), 1);
  EXPECT_EQ(find_repeats_map_entries(1000, l2), 1000);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 17, l2), std::int64_t{1} << 17);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 24, l2), std::int64_t{1} << 17);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 27, l2), std::int64_t{1} << 19);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 28, l2), std::int64_t{1} << 20);
  EXPECT_EQ(find_repeats_map_entries((std::int64_t{1} << 28) + 1, l2), 0);
  // And whatever this machine's L2: a map entry per row at most.
  EXPECT_EQ(find_repeats_map_entries(1), 1);
  EXPECT_EQ(find_repeats_map_entries(1000), 1000);
  EXPECT_EQ(find_repeats_map_entries((std::int64_t{1} << 28) + 1), 0);
  Repeats r;
  RepeatsScratch s;
  tbb::task_arena arena(2);
  arena.execute([&] {
    const std::vector<Key> keys{0, 0, 0};
    find_repeats(keys.data(), 3, 1, r, s);
    expect_repeats(keys, r);
    const std::vector<Key> more{5, 9, 5, 0, 9};
    find_repeats(more.data(), 5, 10, r, s);
    expect_repeats(more, r);
  });
  for (const auto& m : s.maps) EXPECT_LE(m.last.size(), 10u);
}

// find_repeats_tables: each table's result is what find_repeats of that table alone says (every
// position flagged exactly when its key repeats in its own table, each repeated key once with its
// positions ascending), for tables of one row (every key repeats) to many, empty ones included,
// whose keys overlap as row ids (row 0 of each table is its own row); reused across calls.
TEST(FindRepeatsTables, EachTableMatchesAMapOfItsOwnKeys) {
  std::mt19937_64 rng(32);
  TablesRepeatsScratch scratch;
  for (const int threads : {1, 2}) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      for (int call = 0; call < 3; ++call) {
        const std::int64_t rows[] = {1, 3, 70000, 1, 5000, 300000, 2};
        const std::int64_t counts[] = {500, 0, 20000, 1, 3000, 40000, 9};
        std::vector<std::vector<Key>> keys;
        std::vector<TableKeys> tables;
        for (std::size_t i = 0; i < std::size(rows); ++i) {
          keys.emplace_back();
          for (std::int64_t j = 0; j < counts[i]; ++j)
            keys.back().push_back(rng() % 3 == 0 ? 0 : static_cast<Key>(rng() % static_cast<std::uint64_t>(rows[i])));
        }
        for (std::size_t i = 0; i < std::size(rows); ++i)
          tables.push_back({keys[i].data(), static_cast<std::int64_t>(keys[i].size()), rows[i]});
        std::vector<Repeats> out(std::size(rows));
        std::vector<Repeats*> ptrs;
        for (Repeats& r : out) ptrs.push_back(&r);
        find_repeats_tables(tables, ptrs, scratch);
        for (std::size_t i = 0; i < std::size(rows); ++i) {
          SCOPED_TRACE("table " + std::to_string(i) + ", call " + std::to_string(call));
          expect_repeats(keys[i], out[i]);
        }
      }
    });
  }
}

// int32 keys (read as they are) give what the same keys as int64 give: find_repeats on the maps and on the dedup path
// (a key space past the maps'), and find_repeats_tables with tables of either width side by side (issue 35).
TEST(FindRepeats, Int32KeysGiveTheInt64Results) {
  std::mt19937_64 rng(35);
  const auto same = [](const Repeats& a, const Repeats& b) {
    ASSERT_EQ(a.repeated, b.repeated);
    ASSERT_EQ(a.ranges.size(), b.ranges.size());
    for (std::size_t g = 0; g < a.ranges.size(); ++g) {
      EXPECT_EQ(a.ranges[g].keys, b.ranges[g].keys);
      EXPECT_EQ(a.ranges[g].offsets, b.ranges[g].offsets);
      EXPECT_EQ(a.ranges[g].positions, b.ranges[g].positions);
    }
  };
  for (const std::int64_t rows : {std::int64_t{7}, std::int64_t{70000}, std::int64_t{INT32_MAX}}) {
    std::vector<Key> wide(20000);
    for (Key& k : wide) k = static_cast<Key>(rng() % static_cast<std::uint64_t>(std::min<std::int64_t>(rows, 5000)));
    const std::vector<std::int32_t> narrow(wide.begin(), wide.end());
    Repeats a, b;
    RepeatsScratch sa, sb;
    find_repeats(wide.data(), static_cast<std::int64_t>(wide.size()), rows, a, sa);
    find_repeats(narrow.data(), static_cast<std::int64_t>(narrow.size()), rows, b, sb);
    SCOPED_TRACE("rows " + std::to_string(rows));
    same(a, b);
  }
  std::vector<Key> k0(3000), k1(500);
  for (Key& k : k0) k = static_cast<Key>(rng() % 1000);
  for (Key& k : k1) k = static_cast<Key>(rng() % 40);
  const std::vector<std::int32_t> n1(k1.begin(), k1.end());
  std::vector<Repeats> wide(2), mixed(2);
  std::vector<Repeats*> pw{&wide[0], &wide[1]}, pm{&mixed[0], &mixed[1]};
  TablesRepeatsScratch sw, sm;
  find_repeats_tables({{k0.data(), 3000, 1000}, {k1.data(), 500, 40}}, pw, sw);
  find_repeats_tables({{k0.data(), 3000, 1000}, {nullptr, 500, 40, n1.data()}}, pm, sm);
  same(wide[0], mixed[0]);
  same(wide[1], mixed[1]);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The maps are sized for the L2 cache (a quarter of it, 8 bytes an entry): 2^14 entries on a 512
// KiB L2, 2^15 on 1 MiB, 2^16 on 2 MiB, between 2^10 and 2^20 whatever the size given, and wider
// when a key space would need more than 256 ranges.
TEST(FindRepeats, MapsAreSizedForTheL2) {
  const std::uint64_t kib = 1024;
  EXPECT_EQ(find_repeats_map_entries(2000000, 512 * kib), std::int64_t{1} << 14);
  EXPECT_EQ(find_repeats_map_entries(2000000, 1024 * kib), std::int64_t{1} << 15);
  EXPECT_EQ(find_repeats_map_entries(2000000, 2048 * kib), std::int64_t{1} << 16);
  EXPECT_EQ(find_repeats_map_entries(2000000, 1), std::int64_t{1} << 13);  // 245 ranges, not 2^10 entries
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 16, 1), std::int64_t{1} << 10);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 24, 512 * kib), std::int64_t{1} << 16);  // 256 ranges
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 28, 1), std::int64_t{1} << 20);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 28, kib << 30), std::int64_t{1} << 20);
  EXPECT_EQ(find_repeats_map_entries(std::int64_t{1} << 26, kib << 30), std::int64_t{1} << 20);
  EXPECT_GT(Topology::l2_cache_bytes(), 0u);
}

// The L2 size changes how the keys are split into ranges, never which are repeated nor their
// positions: a tiny L2 (the smallest maps, the most ranges) and a huge one (the largest maps, the
// fewest) give the same repeats as a 512 KiB one, with one scratch reused across all of them (its
// maps grown, then used larger than needed), on 2 threads, hot keys at the ends of every range.
TEST(FindRepeats, TheL2SizeChangesTheRangesNotTheRepeats) {
  std::mt19937_64 rng(29);
  tbb::task_arena arena(2);
  arena.execute([&] {
    Repeats r;
    RepeatsScratch s;
    for (const std::int64_t key_space :
         {std::int64_t{1000}, 3 * (std::int64_t{1} << 17) + 5, std::int64_t{2000000}, std::int64_t{1} << 28}) {
      std::vector<Key> keys(30000);
      for (auto& k : keys) {
        const std::uint64_t pick = rng() % 8;
        const Key edge = static_cast<Key>((rng() % 64) << 10);  // a 2^10-key range boundary
        k = pick == 0   ? std::min<Key>(edge, key_space - 1)
            : pick == 1 ? std::min<Key>(edge + 1023, key_space - 1)
                        : static_cast<Key>(rng() % static_cast<std::uint64_t>(key_space));
      }
      std::map<Key, std::vector<std::int32_t>> want;
      std::size_t want_ranges = 0;
      for (const std::uint64_t l2 :
           {std::uint64_t{512} << 10, std::uint64_t{1}, std::uint64_t{1} << 40, std::uint64_t{64} << 10}) {
        s.l2_bytes = l2;
        find_repeats(keys.data(), static_cast<std::int64_t>(keys.size()), key_space, r, s);
        expect_repeats(keys, r);
        if (::testing::Test::HasFatalFailure()) return;
        std::map<Key, std::vector<std::int32_t>> got;
        for (const UniqueKeys& u : r.ranges)
          for (std::size_t i = 0; i < u.keys.size(); ++i)
            got[u.keys[i]].assign(u.positions.begin() + u.offsets[i], u.positions.begin() + u.offsets[i + 1]);
        const std::int64_t width = find_repeats_map_entries(key_space, l2);
        if (key_space > 1000) {
          EXPECT_EQ(r.ranges.size(), static_cast<std::size_t>((key_space + width - 1) / width)) << "L2 " << l2;
        }
        if (l2 == (std::uint64_t{512} << 10)) {
          want = got;
          want_ranges = r.ranges.size();
        } else {
          EXPECT_EQ(got, want) << "key space " << key_space << ", L2 " << l2 << " bytes";
        }
      }
      if (key_space == 2000000) {
        EXPECT_EQ(want_ranges, 123u);  // 2^14-key ranges
      }
    }
  });
}

}  // namespace
}  // namespace strata
