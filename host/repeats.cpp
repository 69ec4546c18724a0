#include "host/repeats.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "core/status.hpp"
#include "host/topology.hpp"

namespace strata {

namespace {

// Key ranges are 2^shift keys wide, with shift at least map_shift(L2) (a map of at most a quarter
// of the L2 cache: the map is read and written at random while the scan's other arrays stream
// through L2 too) and large enough for at most kMaxRanges ranges (a key's offset in its range then
// fits 32 bits). Maps are at most 2^kMaxShift entries (8 MB per thread): larger key spaces (more
// than 2^28 rows) are handled by a hash dedup instead. The map size only changes how keys are
// split into ranges, not which are repeated: every key of a range has its own entry, whatever the
// range's width. Issue 22 measured 1 MB maps against smaller ones on an AVX2 EPYC with a 512 KB L2
// (strata-bench cpu, 262k keys of 2M rows a step): find_repeats 2.2 -> 2.0 ms (uniform), 3.3 ->
// 2.8 ms (zipf 1.05). On the 2-core VM with 1 MB of L2 per core (strata-micro
// BM_StepFindRepeatsL2, three runs of medians): 2^17 entries 2.55-3.24 ms, 2^16 2.26-3.39 ms,
// 2^15 2.24-2.38 ms, 2^14 2.35-2.57 ms; a quarter of L2 is the best of these.
constexpr int kMinShift = 10;  // 8 KB maps at the least, whatever L2 is reported
constexpr int kMaxShift = 20;
constexpr std::int64_t kMaxRanges = 256;
constexpr std::int64_t kChunk = 16384;

// The widest range whose map (8 bytes an entry) fits in a quarter of an L2 of l2_bytes (0: this
// machine's), within [kMinShift, kMaxShift].
int map_shift(std::uint64_t l2_bytes) {
  const std::uint64_t l2 = l2_bytes > 0 ? l2_bytes : Topology::l2_cache_bytes();
  int s = kMinShift;
  while (s < kMaxShift && (std::uint64_t{8} << (s + 1)) <= l2 / 4) ++s;
  return s;
}

int range_shift(std::int64_t key_space, std::uint64_t l2_bytes) {
  int s = map_shift(l2_bytes);
  while (((key_space - 1) >> s) + 1 > kMaxRanges) ++s;
  return s;
}

// Range g's positions (by_range[b, e)), with a map from key offsets in the range to the last use:
// epoch << 32 | repeated << 31 | (index in the range + 1). The epoch tags the scan, so the map
// never needs clearing; the repeated bit says the key was seen twice already. Most keys are used
// once, so the usual step is a load, a compare and a store; a later use links the previous one to
// it (next) and, at a key's first repeat, records the key's first use as a head. Then each head's
// chain gives the key's positions, ascending.
void scan_range(RepeatsScratch& s, std::int64_t b, std::int64_t e, Key base, RepeatsScratch::Map& map,
                std::uint8_t* repeated, UniqueKeys& out) {
  out.keys.clear();
  out.offsets.assign(1, 0);
  out.positions.clear();
  if (++map.epoch == 0) {  // wrapped: stale entries could look current
    std::fill(map.last.begin(), map.last.end(), 0);
    map.epoch = 1;
  }
  constexpr std::uint64_t kSeenTwice = std::uint64_t{1} << 31;
  const std::uint64_t tag = std::uint64_t{map.epoch} << 32;
  std::uint64_t* last = map.last.data();
  const std::uint32_t* off = s.range_offsets.data() + b;
  std::int32_t* next = s.next.data() + b;  // next use (index + 1), 0 = none; set only for repeated keys
  std::vector<std::int32_t>& heads = map.heads;
  heads.clear();
  const std::int64_t m = e - b;
  for (std::int64_t i = 0; i < m; ++i) {
    std::uint64_t& l = last[off[i]];
    const std::uint64_t prev = l;
    if ((prev >> 32) != map.epoch) {
      l = tag | static_cast<std::uint64_t>(i + 1);
      continue;
    }
    const auto p = static_cast<std::int64_t>(prev & (kSeenTwice - 1)) - 1;
    if (!(prev & kSeenTwice)) heads.push_back(static_cast<std::int32_t>(p));
    next[p] = static_cast<std::int32_t>(i + 1);
    next[i] = 0;
    l = tag | kSeenTwice | static_cast<std::uint64_t>(i + 1);
  }
  const std::int32_t* pos = s.by_range.data() + b;
  for (const std::int32_t h : heads) {
    out.keys.push_back(base + off[h]);
    for (std::int64_t i = h;; i = next[i] - 1) {
      out.positions.push_back(pos[i]);
      repeated[pos[i]] = 1;
      if (next[i] == 0) break;
    }
    out.offsets.push_back(static_cast<std::int64_t>(out.positions.size()));
  }
}

// find_repeats by a full dedup (any order), for key spaces too large for the maps.
template <class K>
void repeats_by_dedup(const K* keys, std::int64_t n, Repeats& out, RepeatsScratch& s) {
  dedup_keys(keys, n, s.unique, s.dedup, DedupOrder::kAny);
  out.repeated.assign(static_cast<std::size_t>(n), 0);
  out.ranges.resize(1);
  UniqueKeys& r = out.ranges[0];
  r.keys.clear();
  r.offsets.assign(1, 0);
  r.positions.clear();
  const UniqueKeys& u = s.unique;
  for (std::int64_t i = 0; i < u.size(); ++i) {
    const std::int64_t p0 = u.offsets[static_cast<std::size_t>(i)], p1 = u.offsets[static_cast<std::size_t>(i) + 1];
    if (p1 - p0 < 2) continue;
    r.keys.push_back(u.keys[static_cast<std::size_t>(i)]);
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int32_t pos = u.positions[static_cast<std::size_t>(p)];
      r.positions.push_back(pos);
      out.repeated[static_cast<std::size_t>(pos)] = 1;
    }
    r.offsets.push_back(static_cast<std::int64_t>(r.positions.size()));
  }
}

}  // namespace

std::int64_t find_repeats_map_entries(std::int64_t key_space, std::uint64_t l2_bytes) noexcept {
  if (key_space <= 0) return 0;
  const int shift = range_shift(key_space, l2_bytes);
  return shift > kMaxShift ? 0 : std::min(std::int64_t{1} << shift, key_space);
}

namespace {

template <class K>
void find_repeats_of(const K* keys, std::int64_t n, std::int64_t key_space, Repeats& out, RepeatsScratch& s) {
  STRATA_CHECK(n >= 0 && n < (std::int64_t{1} << 31) && key_space > 0);
  const int shift = range_shift(key_space, s.l2_bytes);
  if (shift > kMaxShift) {
    repeats_by_dedup(keys, n, out, s);
    return;
  }
  const std::int64_t ranges = ((key_space - 1) >> shift) + 1;
  const Key mask = (Key{1} << shift) - 1;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  out.repeated.assign(static_cast<std::size_t>(n), 0);
  out.ranges.resize(static_cast<std::size_t>(ranges));
  s.by_range.resize(static_cast<std::size_t>(n));
  s.range_offsets.resize(static_cast<std::size_t>(n));
  s.next.resize(static_cast<std::size_t>(n));
  s.counts.assign(static_cast<std::size_t>(chunks * ranges), 0);
  s.start.assign(static_cast<std::size_t>(ranges + 1), 0);
  s.maps.resize(static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()));
  // 1. Each position's range, and counts per (chunk, range).
  const auto chunk_range = tbb::blocked_range<std::int64_t>(0, chunks, 1);
  tbb::parallel_for(chunk_range, [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t c = r.begin(); c < r.end(); ++c) {
      // Four sets of counters, so that runs of keys in one range do not chain increments.
      std::int32_t four[4][kMaxRanges] = {};
      const std::int64_t j0 = c * kChunk, j1 = std::min(n, (c + 1) * kChunk);
      std::int64_t j = j0;
      for (; j + 4 <= j1; j += 4) {
        ++four[0][keys[j] >> shift];
        ++four[1][keys[j + 1] >> shift];
        ++four[2][keys[j + 2] >> shift];
        ++four[3][keys[j + 3] >> shift];
      }
      for (; j < j1; ++j) ++four[0][keys[j] >> shift];
      std::int64_t* count = &s.counts[static_cast<std::size_t>(c * ranges)];
      for (std::int64_t g = 0; g < ranges; ++g) count[g] = four[0][g] + four[1][g] + four[2][g] + four[3][g];
    }
  });
  // counts[c][g] becomes where chunk c's positions of range g start in by_range.
  std::int64_t at = 0;
  for (std::int64_t g = 0; g < ranges; ++g) {
    s.start[static_cast<std::size_t>(g)] = at;
    for (std::int64_t c = 0; c < chunks; ++c) {
      std::int64_t& x = s.counts[static_cast<std::size_t>(c * ranges + g)];
      const std::int64_t here = x;
      x = at;
      at += here;
    }
  }
  s.start[static_cast<std::size_t>(ranges)] = at;
  // 2. Positions and keys scattered by range, ascending within each.
  tbb::parallel_for(chunk_range, [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t c = r.begin(); c < r.end(); ++c) {
      std::int64_t* cursor = &s.counts[static_cast<std::size_t>(c * ranges)];
      for (std::int64_t j = c * kChunk; j < std::min(n, (c + 1) * kChunk); ++j) {
        const Key k = keys[j];
        const auto to = static_cast<std::size_t>(cursor[k >> shift]++);
        s.by_range[to] = static_cast<std::int32_t>(j);
        s.range_offsets[to] = static_cast<std::uint32_t>(k & mask);
      }
    }
  });
  // 3. Each range scanned with its thread's map.
  // Offsets in a range are below the key space too: a table of 10 rows needs 10 entries, not 2^17
  // (1 MB per thread and table, which made 1,000 small cpu tables hold 1 GB). A map larger than
  // needed (left by an earlier call with another key space or L2 size) serves as it is.
  const auto entries = static_cast<std::size_t>(find_repeats_map_entries(key_space, s.l2_bytes));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, ranges, 1), [&](const tbb::blocked_range<std::int64_t>& r) {
    auto& map = s.maps[static_cast<std::size_t>(tbb::this_task_arena::current_thread_index())];
    if (map.last.size() < entries) {
      map.last.assign(entries, 0);
      map.epoch = 0;
    }
    for (std::int64_t g = r.begin(); g < r.end(); ++g)
      scan_range(s, s.start[static_cast<std::size_t>(g)], s.start[static_cast<std::size_t>(g + 1)], g << shift, map,
                 out.repeated.data(), out.ranges[static_cast<std::size_t>(g)]);
  });
}

}  // namespace

void find_repeats(const Key* keys, std::int64_t n, std::int64_t key_space, Repeats& out, RepeatsScratch& s) {
  find_repeats_of(keys, n, key_space, out, s);
}

void find_repeats(const std::int32_t* keys, std::int64_t n, std::int64_t key_space, Repeats& out, RepeatsScratch& s) {
  find_repeats_of(keys, n, key_space, out, s);
}

void find_repeats(const JaggedKeys& f, std::int64_t key_space, Repeats& out, RepeatsScratch& s) {
  if (f.keys32.empty()) {
    find_repeats_of(f.keys.data(), f.num_keys(), key_space, out, s);
  } else {
    find_repeats_of(f.keys32.data(), f.num_keys(), key_space, out, s);
  }
}

void find_repeats_tables(const std::vector<TableKeys>& tables, std::vector<Repeats*>& out, TablesRepeatsScratch& s) {
  const std::size_t nt = tables.size();
  STRATA_CHECK(out.size() == nt);
  s.key_base.assign(nt + 1, 0);
  s.pos_base.assign(nt + 1, 0);
  for (std::size_t i = 0; i < nt; ++i) {
    s.key_base[i + 1] = s.key_base[i] + tables[i].rows;
    s.pos_base[i + 1] = s.pos_base[i] + tables[i].n;
  }
  STRATA_CHECK(s.key_base[nt] <= kRepeatsTablesMaxRows);
  const std::int64_t n = s.pos_base[nt];
  STRATA_CHECK(n <= kRepeatsTablesMaxKeys);
  s.keys.resize(static_cast<std::size_t>(n));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nt, 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i < r.end(); ++i) {
      Key* to = s.keys.data() + s.pos_base[i];
      const Key base = s.key_base[i];
      const TableKeys& t = tables[i];
      if (t.keys32) {
        for (std::int64_t j = 0; j < t.n; ++j) to[j] = t.keys32[j] + base;
      } else {
        for (std::int64_t j = 0; j < t.n; ++j) to[j] = t.keys[j] + base;
      }
    }
  });
  for (std::size_t i = 0; i < nt; ++i) {
    Repeats& o = *out[i];
    o.repeated.resize(static_cast<std::size_t>(tables[i].n));
    o.ranges.resize(0);
  }
  if (n == 0) return;
  find_repeats(s.keys.data(), n, std::max<std::int64_t>(1, s.key_base[nt]), s.all, s.scratch);
  // Each table's flags, and each shared range's keys split by table (key and position made the
  // table's own again; a key's positions stay ascending). Range g goes to out[i].ranges[g].
  const std::size_t ranges = s.all.ranges.size();
  for (std::size_t i = 0; i < nt; ++i) out[i]->ranges.resize(ranges);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nt, 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i < r.end(); ++i)
      std::copy_n(s.all.repeated.begin() + s.pos_base[i], tables[i].n, out[i]->repeated.begin());
  });
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, ranges, 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t g = r.begin(); g < r.end(); ++g) {
      for (std::size_t i = 0; i < nt; ++i) {
        UniqueKeys& u = out[i]->ranges[g];
        u.keys.clear();
        u.offsets.assign(1, 0);
        u.positions.clear();
      }
      const UniqueKeys& a = s.all.ranges[g];
      for (std::int64_t k = 0; k < a.size(); ++k) {
        const Key key = a.keys[static_cast<std::size_t>(k)];
        const auto i = static_cast<std::size_t>(std::upper_bound(s.key_base.begin(), s.key_base.end(), key) -
                                                s.key_base.begin() - 1);
        UniqueKeys& u = out[i]->ranges[g];
        u.keys.push_back(key - s.key_base[i]);
        const auto base = static_cast<std::int32_t>(s.pos_base[i]);
        for (std::int64_t p = a.offsets[static_cast<std::size_t>(k)]; p < a.offsets[static_cast<std::size_t>(k) + 1];
             ++p)
          u.positions.push_back(a.positions[static_cast<std::size_t>(p)] - base);
        u.offsets.push_back(static_cast<std::int64_t>(u.positions.size()));
      }
    }
  });
}

}  // namespace strata
