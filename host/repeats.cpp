#include "host/repeats.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "core/status.hpp"

namespace strata {

namespace {

// Key ranges are 2^shift keys wide, with shift at least kMinShift (a map of 2^17 int32 is 512 KB,
// within L2) and large enough for at most kMaxRanges ranges (a byte per position).
constexpr int kMinShift = 17;
constexpr std::int64_t kMaxRanges = 256;
constexpr std::int64_t kChunk = 16384;

int range_shift(std::int64_t key_space) {
  int s = kMinShift;
  while (((key_space - 1) >> s) + 1 > kMaxRanges) ++s;
  return s;
}

// Range r's positions (by_range[b, e)): link each use of a key to the one before, mark the
// repeated ones, and list the repeated keys with their positions ascending. `map` is all zeros on
// entry and on return.
void scan_range(RepeatsScratch& s, std::int64_t b, std::int64_t e, Key base, std::int32_t* map, std::uint8_t* repeated,
                UniqueKeys& out) {
  out.keys.clear();
  out.offsets.assign(1, 0);
  out.positions.clear();
  const Key* key = s.range_keys.data();
  std::int32_t* link = s.link.data();
  std::int32_t* next = s.next.data();
  bool any = false;
  for (std::int64_t i = b; i < e; ++i) {
    std::int32_t& m = map[key[i] - base];
    link[i] = m;  // (index + 1 - b) of the previous use, 0 = first
    next[i] = 0;
    if (m != 0) {
      next[b + m - 1] = static_cast<std::int32_t>(i - b + 1);
      any = true;
    }
    m = static_cast<std::int32_t>(i - b + 1);
  }
  for (std::int64_t i = b; i < e; ++i) map[key[i] - base] = 0;
  if (!any) return;
  // A first use with a next use starts a repeated key's chain.
  for (std::int64_t i = b; i < e; ++i) {
    if (link[i] != 0 || next[i] == 0) continue;
    out.keys.push_back(key[i]);
    for (std::int64_t j = i;; j = b + next[j] - 1) {
      const std::int32_t pos = s.by_range[static_cast<std::size_t>(j)];
      out.positions.push_back(pos);
      repeated[pos] = 1;
      if (next[j] == 0) break;
    }
    out.offsets.push_back(static_cast<std::int64_t>(out.positions.size()));
  }
}

}  // namespace

void find_repeats(const Key* keys, std::int64_t n, std::int64_t key_space, Repeats& out, RepeatsScratch& s) {
  STRATA_CHECK(n >= 0 && n < (std::int64_t{1} << 31) && key_space > 0);
  const int shift = range_shift(key_space);
  const std::int64_t ranges = ((key_space - 1) >> shift) + 1;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  out.repeated.assign(static_cast<std::size_t>(n), 0);
  out.ranges.resize(static_cast<std::size_t>(ranges));
  s.range.resize(static_cast<std::size_t>(n));
  s.by_range.resize(static_cast<std::size_t>(n));
  s.range_keys.resize(static_cast<std::size_t>(n));
  s.link.resize(static_cast<std::size_t>(n));
  s.next.resize(static_cast<std::size_t>(n));
  s.counts.assign(static_cast<std::size_t>(chunks * ranges), 0);
  s.start.assign(static_cast<std::size_t>(ranges + 1), 0);
  s.maps.resize(static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()));
  // 1. Each position's range, and counts per (chunk, range).
  const auto chunk_range = tbb::blocked_range<std::int64_t>(0, chunks, 1);
  tbb::parallel_for(chunk_range, [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t c = r.begin(); c < r.end(); ++c) {
      std::int64_t* count = &s.counts[static_cast<std::size_t>(c * ranges)];
      for (std::int64_t j = c * kChunk; j < std::min(n, (c + 1) * kChunk); ++j) {
        const auto g = static_cast<std::uint8_t>(keys[j] >> shift);
        s.range[static_cast<std::size_t>(j)] = g;
        ++count[g];
      }
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
        const auto to = static_cast<std::size_t>(cursor[s.range[static_cast<std::size_t>(j)]]++);
        s.by_range[to] = static_cast<std::int32_t>(j);
        s.range_keys[to] = keys[j];
      }
    }
  });
  // 3. Each range scanned with its thread's map.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, ranges, 1), [&](const tbb::blocked_range<std::int64_t>& r) {
    auto& map = s.maps[static_cast<std::size_t>(tbb::this_task_arena::current_thread_index())];
    if (map.size() < (std::size_t{1} << shift)) map.assign(std::size_t{1} << shift, 0);
    for (std::int64_t g = r.begin(); g < r.end(); ++g)
      scan_range(s, s.start[static_cast<std::size_t>(g)], s.start[static_cast<std::size_t>(g + 1)], g << shift, map.data(),
                 out.repeated.data(), out.ranges[static_cast<std::size_t>(g)]);
  });
}

}  // namespace strata
