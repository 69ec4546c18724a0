// The planner's internal structures (cache/detail/) against plain std:: references, on random
// operations that reach their rare paths: KeyMap full to its capacity (chunks overflowing into
// their neighbours, erased from under overflowing keys), WindowMap with uses more than 64 batches
// apart (the side list) and uses pushed in any order, FrequencySketch against exact decayed
// counts, EvictionOrder with entries out of order (the heap), buckets past the dense ones, aged
// ranks, windowed groups, stale entries and compaction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cache/detail/eviction_order.hpp"
#include "cache/detail/frequency_sketch.hpp"
#include "cache/detail/key_map.hpp"
#include "cache/detail/window_map.hpp"

namespace strata::cache::detail {
namespace {

TEST(KeyMap, FullToCapacityAgreesWithAReference) {
  for (const std::int64_t capacity : {1, 5, 8, 31, 200}) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(capacity));
    KeyMap map(capacity);
    std::unordered_map<std::uint64_t, std::int64_t> ref;  // key -> slot
    std::vector<std::uint64_t> slot_key(static_cast<std::size_t>(capacity), KeyMap::kEmpty);
    const auto key_of = [&](std::int32_t s) { return s < 0 ? KeyMap::kEmpty : slot_key[static_cast<std::size_t>(s)]; };
    // Keys from a small range, some sharing their low bits, so that chunks fill and overflow.
    const auto draw = [&] {
      return (rng() % 4 == 0) ? (rng() % 64) << 20 : rng() % (4 * static_cast<std::uint64_t>(capacity) + 16);
    };
    for (int step = 0; step < 20000; ++step) {
      const std::uint64_t k = draw();
      auto it = ref.find(k);
      ASSERT_EQ(map.find(k, KeyMap::hash(k), key_of), it == ref.end() ? -1 : it->second) << "step " << step;
      if (it != ref.end() && rng() % 2) {
        map.erase(KeyMap::hash(k), it->second);
        slot_key[static_cast<std::size_t>(it->second)] = KeyMap::kEmpty;
        ref.erase(it);
      } else if (it == ref.end() && static_cast<std::int64_t>(ref.size()) < capacity) {
        std::int64_t s = 0;
        while (slot_key[static_cast<std::size_t>(s)] != KeyMap::kEmpty) ++s;
        map.insert(KeyMap::hash(k), s);
        slot_key[static_cast<std::size_t>(s)] = k;
        ref[k] = s;
      }
    }
    for (const auto& [k, s] : ref) EXPECT_EQ(map.find(k, KeyMap::hash(k), key_of), s);
  }
}

// A mask reaches the window depth asked for, rounded up to 64, and at most 320 batches (a 64-byte
// entry), however deep the window (previews go up to 2^16 batches).
TEST(WindowMap, MaskReachFollowsTheDepthWithinBounds) {
  EXPECT_EQ(WindowMap().reach(), 64);
  EXPECT_EQ(WindowMap(0).reach(), 64);
  EXPECT_EQ(WindowMap(5).reach(), 64);
  EXPECT_EQ(WindowMap(65).reach(), 128);
  EXPECT_EQ(WindowMap(185).reach(), 192);
  EXPECT_EQ(WindowMap(1 << 16).reach(), WindowMap::kMaxReach);
}

TEST(WindowMap, UsesFarApartAgreeWithAReference) {
  // Masks of 64 uses (32-byte entries) and of 256 (64-byte entries, several words to shift).
  for (const std::int64_t depth : {64, 200}) {
    std::mt19937_64 rng(3);
    WindowMap w(depth);
    std::map<std::uint64_t, std::set<std::int64_t>> ref;
    std::int64_t seq = 0;
    std::map<std::int64_t, std::vector<std::uint64_t>> live;  // batches pushed, not consumed or dropped
    const auto check = [&](std::uint64_t k, std::int64_t s, bool consume) {
      auto& uses = ref[k];
      const bool was_front = !uses.empty() && *uses.begin() == s;
      uses.erase(s);
      const std::int64_t front = uses.empty() ? WindowMap::kNone : *uses.begin();
      if (consume) {
        EXPECT_EQ(w.consume(k, KeyMap::hash(k), s), front) << "depth " << depth << " key " << k << " seq " << s;
      } else {
        const WindowMap::Dropped d = w.drop(k, KeyMap::hash(k), s);
        EXPECT_EQ(d.was_front, was_front) << "key " << k << " seq " << s;
        EXPECT_EQ(d.front, front) << "key " << k << " seq " << s;
      }
    };
    for (int step = 0; step < 60000 && !HasFailure(); ++step) {
      const std::uint64_t op = rng() % 10;
      if (op < 4 || live.empty() || step < 400) {
        // A batch: a few hot keys and some of many cold ones (the map grows and rehashes);
        // sometimes a jump of more than 64 sequence numbers.
        seq += (rng() % 50 == 0) ? 60 + static_cast<std::int64_t>(rng() % 200) : 1;
        std::vector<std::uint64_t> keys;
        for (int i = 0; i < 6; ++i) {
          const std::uint64_t k = i < 3 ? rng() % 40 : 1000 + rng() % 5000;
          if (ref[k].count(seq)) continue;
          EXPECT_EQ(w.push(k, KeyMap::hash(k), seq), ref[k].empty());
          ref[k].insert(seq);
          keys.push_back(k);
        }
        live[seq] = keys;
      } else {
        // Mostly the oldest batch (as planning goes), sometimes any (a discard before planning).
        auto it = op < 8 ? live.begin() : std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
        const bool consume = op % 2;
        for (std::uint64_t k : it->second) check(k, it->first, consume);
        for (int i = 0; i < 2; ++i) check(rng() % 40, it->first, consume);  // keys the batch may not use
        live.erase(it);
      }
    }
    std::size_t keys = 0;
    for (const auto& [k, uses] : ref) {
      keys += !uses.empty();
      EXPECT_EQ(w.front(k, KeyMap::hash(k)), uses.empty() ? WindowMap::kNone : *uses.begin());
    }
    EXPECT_EQ(w.size(), keys);
  }
}

// Pushes in any order (a previewed batch re-keyed under its number goes below later batches, and
// its uses may land in the mask, before the first use, or among the side list's), mixed with
// consumes and drops of any use; front() and push()'s answer must follow a std::set.
TEST(WindowMap, PushesInAnyOrderAgreeWithAReference) {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::mt19937_64 rng(40 + seed);
    WindowMap w(seed < 4 ? 64 : 130);  // masks of one word, or of three
    std::map<std::uint64_t, std::set<std::int64_t>> ref;
    const std::int64_t span = seed % 2 ? 300 : 90;  // sequence numbers in use: beyond the mask's reach
    for (int step = 0; step < 80000 && !HasFailure(); ++step) {
      const std::uint64_t k = rng() % (seed < 2 ? 8 : 200);
      auto& uses = ref[k];
      std::int64_t seq = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(span));
      // Removals mostly hit a use (the first, as planning goes, or any), so keys keep few uses
      // spread over the span: the side list fills, the first use moves, pushes land everywhere.
      if (!uses.empty() && rng() % 4 != 0)
        seq = rng() % 2 ? *uses.begin() : *std::next(uses.begin(), static_cast<std::ptrdiff_t>(rng() % uses.size()));
      const std::uint64_t h = KeyMap::hash(k);
      if (rng() % 2 == 0) {
        if (uses.count(seq)) continue;
        const bool first = uses.empty() || seq < *uses.begin();
        ASSERT_EQ(w.push(k, h, seq), first) << "seed " << seed << " step " << step << " key " << k << " seq " << seq;
        uses.insert(seq);
      } else if (rng() % 2 == 0) {
        uses.erase(seq);
        ASSERT_EQ(w.consume(k, h, seq), uses.empty() ? WindowMap::kNone : *uses.begin())
            << "seed " << seed << " step " << step;
      } else {
        const bool was_front = !uses.empty() && *uses.begin() == seq;
        uses.erase(seq);
        const WindowMap::Dropped d = w.drop(k, h, seq);
        ASSERT_EQ(d.was_front, was_front) << "seed " << seed << " step " << step;
        ASSERT_EQ(d.front, uses.empty() ? WindowMap::kNone : *uses.begin()) << "seed " << seed << " step " << step;
      }
      ASSERT_EQ(w.front(k, h), uses.empty() ? WindowMap::kNone : *uses.begin()) << "seed " << seed << " step " << step;
    }
    std::size_t keys = 0;
    for (const auto& [k, uses] : ref) {
      keys += !uses.empty();
      EXPECT_EQ(w.front(k, KeyMap::hash(k)), uses.empty() ? WindowMap::kNone : *uses.begin());
    }
    EXPECT_EQ(w.size(), keys);
  }
}

// The decayed counts behind FrequencySketch levels, against exact ones (each use weighted
// 2^-(age / half_life), ages counted from the tick given to start()): a few keys (no collisions)
// get exactly the level of their exact count, give or take the bfloat16 rounding, across many
// rescalings of the counters; a crowd of colliding keys is never counted below its exact count.
TEST(FrequencySketch, LevelsFollowExactDecayedCounts) {
  for (const std::uint64_t half_life : {1u, 37u, 1000u}) {
    std::mt19937_64 rng(half_life);
    FrequencySketch sketch(64, half_life);
    constexpr int kKeys = 24;
    std::vector<double> exact(kKeys, 0.0);
    std::vector<std::uint64_t> last(kKeys, 0);
    std::uint64_t tick = 0;
    int checked = 0;
    for (int batch = 0; batch < 6000 && !HasFailure(); ++batch) {
      sketch.start(tick);
      for (int k = 0; k < kKeys; ++k) {
        // Key k is used in a batch with probability about 2^-(k % 6): a spread of counts.
        if (rng() % (1u << (k % 6)) != 0) continue;
        exact[static_cast<std::size_t>(k)] =
            1.0 + exact[static_cast<std::size_t>(k)] *
                      std::exp2(-static_cast<double>(tick - last[static_cast<std::size_t>(k)]) /
                                static_cast<double>(half_life));
        last[static_cast<std::size_t>(k)] = tick;
        const std::uint32_t got = sketch.add(KeyMap::hash(static_cast<std::uint64_t>(k) * 7919));
        const double c = exact[static_cast<std::size_t>(k)];
        if (c > 200) continue;  // bfloat16 counts stop growing near 2^8
        const auto want = static_cast<std::int64_t>(std::floor(4 * std::log2(c)));
        ASSERT_LE(std::abs(static_cast<std::int64_t>(got) - want), 1)
            << "half-life " << half_life << " batch " << batch << " key " << k << " exact " << c;
        ++checked;
      }
      tick += 1 + rng() % 20;  // beyond 64 half-lives many times over for the short half-lives
    }
    EXPECT_GT(checked, 10000);
  }
  // Collisions: 50,000 keys in 1,024 lines.
  FrequencySketch sketch(16, 1u << 20);
  std::unordered_map<std::uint64_t, int> uses;
  std::mt19937_64 rng(9);
  sketch.start(0);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t k = rng() % 50000;
    const int n = ++uses[k];
    const std::uint32_t got = sketch.add(KeyMap::hash(k));
    if (n <= 100) {
      ASSERT_GE(got + 1, static_cast<std::uint32_t>(std::floor(4 * std::log2(static_cast<double>(n))))) << "key " << k;
    }
  }
  EXPECT_EQ(FrequencySketch::level(1.0f), 0u);
  EXPECT_EQ(FrequencySketch::level(2.0f), 4u);
  EXPECT_EQ(FrequencySketch::level(3.0f), 6u);  // 4 * log2(3) = 6.34
  EXPECT_EQ(FrequencySketch::level(1e30f), FrequencySketch::kMaxLevel);
}

// Drives an EvictionOrder like a pool does: slots are queued with a rank, leave it (bumped
// versions) when pinned or evicted, and min() must always be the lowest live rank.
TEST(EvictionOrder, MinIsTheLowestLiveRank) {
  // Variants: lru-like (one bucket), lfu-like (buckets, some past the dense ones), lookahead-like
  // (some windowed entries), lookahead at a small cache (mostly windowed: the groups decide), and
  // the aged order of lookahead (a level buys `step` ticks; levels < 64), with and without
  // windowed entries, steps small and large against the spread of the ticks.
  for (int variant = 0; variant < 7; ++variant) {
    std::mt19937_64 rng(10 + static_cast<std::uint64_t>(variant));
    constexpr std::int32_t kSlots = 300;
    const std::uint64_t level_step = variant == 4 ? 1 : variant == 5 ? 7 : variant == 6 ? 40 : 0;
    EvictionOrder order(kSlots, level_step);
    std::vector<std::uint32_t> version(kSlots, 0);
    // Reference: slot -> rank. Ranked: (0, bucket, last, 0, 0), aged (0, last + bucket * step,
    // bucket, last, 0); windowed: (1, -next_use, uses, table, slot).
    using Rank = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
    std::map<std::int32_t, Rank> queued;
    std::uint64_t tick = 1;
    std::int64_t window = 0;
    for (int step = 0; step < 60000; ++step) {
      // Every other stretch of steps only queues and pins (stale entries pile up: compaction).
      const std::uint64_t op = (step / 10000) % 2 ? rng() % 7 : rng() % 10;
      const auto slot = static_cast<std::int32_t>(rng() % kSlots);
      if (op < 5) {
        // (Re)queue: mostly increasing ticks, sometimes an older one (out of order), sometimes a
        // bucket past the dense ones, sometimes (variant 2) a windowed rank.
        const std::uint32_t v = ++version[static_cast<std::size_t>(slot)];
        if (((variant == 2 || variant == 5) && rng() % 3 == 0) || (variant == 3 && rng() % 10 != 0)) {
          const std::int64_t next_use = window + static_cast<std::int64_t>(rng() % 4);
          const auto uses = static_cast<std::uint32_t>(rng() % 3);
          const auto table = static_cast<std::int32_t>(rng() % 2);
          order.push_windowed(next_use, uses, table, slot, v);
          queued[slot] = Rank{1, -next_use, uses, table, slot};
        } else {
          const std::uint64_t last = rng() % 8 == 0 ? tick - std::min<std::uint64_t>(tick - 1, rng() % 50) : ++tick;
          std::uint32_t bucket = 0;
          if (level_step != 0)
            bucket = static_cast<std::uint32_t>(rng() % 3 == 0 ? rng() % EvictionOrder::kAgedBuckets : rng() % 6);
          else if (variant > 0)
            bucket = rng() % 20 == 0 ? EvictionOrder::kDenseBuckets + static_cast<std::uint32_t>(rng() % 3)
                                     : static_cast<std::uint32_t>(rng() % 4);
          // Ticks are unique among queued slots (they are in a pool): skip a repeat.
          bool repeat = false;
          for (const auto& [s, r] : queued)
            repeat = repeat || (std::get<0>(r) == 0 &&
                                (level_step != 0 ? std::get<3>(r) : std::get<2>(r)) == static_cast<std::int64_t>(last));
          if (repeat) {
            queued.erase(slot);
            continue;
          }
          order.push_ranked(bucket, last, slot, v);
          queued[slot] = level_step != 0 ? Rank{0, static_cast<std::int64_t>(last + bucket * level_step), bucket,
                                                static_cast<std::int64_t>(last), 0}
                                         : Rank{0, bucket, static_cast<std::int64_t>(last), 0, 0};
        }
      } else if (op < 7) {
        ++version[static_cast<std::size_t>(slot)];  // pinned: leaves the order
        queued.erase(slot);
      } else if (op < 9) {
        const std::int32_t got = order.min(version.data());
        if (queued.empty()) {
          ASSERT_EQ(got, -1);
          continue;
        }
        auto best = queued.begin();
        for (auto it = queued.begin(); it != queued.end(); ++it)
          if (std::tie(it->second, it->first) < std::tie(best->second, best->first)) best = it;
        ASSERT_EQ(got, best->first) << "variant " << variant << " step " << step;
        ++version[static_cast<std::size_t>(got)];  // evicted
        queued.erase(best);
      } else {
        // Batch `window` is planned: the rows it uses next are pinned, then its group goes.
        for (auto it = queued.begin(); it != queued.end();) {
          if (std::get<0>(it->second) == 1 && -std::get<1>(it->second) <= window) {
            ++version[static_cast<std::size_t>(it->first)];
            it = queued.erase(it);
          } else {
            ++it;
          }
        }
        order.retire_window(window, version.data());
        ++window;
      }
      order.maybe_compact(version.data());
    }
  }
}

}  // namespace
}  // namespace strata::cache::detail
