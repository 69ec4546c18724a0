// The planner's internal structures (cache/detail/) against plain std:: references, on random
// operations that reach their rare paths: KeyMap full to its capacity (chunks overflowing into
// their neighbours, erased from under overflowing keys), WindowMap with uses more than 64 batches
// apart (the side list), EvictionOrder with entries out of order (the heap), buckets past the
// dense ones, windowed groups, stale entries and compaction.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cache/detail/eviction_order.hpp"
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
    const auto draw = [&] { return (rng() % 4 == 0) ? (rng() % 64) << 20 : rng() % (4 * static_cast<std::uint64_t>(capacity) + 16); };
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

TEST(WindowMap, UsesFarApartAgreeWithAReference) {
  std::mt19937_64 rng(3);
  WindowMap w;
  std::map<std::uint64_t, std::set<std::int64_t>> ref;
  std::int64_t seq = 0;
  std::map<std::int64_t, std::vector<std::uint64_t>> live;  // batches pushed, not consumed or dropped
  const auto check = [&](std::uint64_t k, std::int64_t s, bool consume) {
    auto& uses = ref[k];
    const bool was_front = !uses.empty() && *uses.begin() == s;
    uses.erase(s);
    const std::int64_t front = uses.empty() ? WindowMap::kNone : *uses.begin();
    if (consume) {
      EXPECT_EQ(w.consume(k, KeyMap::hash(k), s), front) << "key " << k << " seq " << s;
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

// Drives an EvictionOrder like a pool does: slots are queued with a rank, leave it (bumped
// versions) when pinned or evicted, and min() must always be the lowest live rank.
TEST(EvictionOrder, MinIsTheLowestLiveRank) {
  // Variants: lru-like (one bucket), lfu-like (buckets, some past the dense ones), lookahead-like
  // (some windowed entries), lookahead at a small cache (mostly windowed: the groups decide).
  for (int variant = 0; variant < 4; ++variant) {
    std::mt19937_64 rng(10 + static_cast<std::uint64_t>(variant));
    constexpr std::int32_t kSlots = 300;
    EvictionOrder order(kSlots);
    std::vector<std::uint32_t> version(kSlots, 0);
    // Reference: slot -> rank. Ranked: (0, bucket, last, 0, 0); windowed: (1, -next_use, uses, table, slot).
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
        if ((variant == 2 && rng() % 3 == 0) || (variant == 3 && rng() % 10 != 0)) {
          const std::int64_t next_use = window + static_cast<std::int64_t>(rng() % 4);
          const auto uses = static_cast<std::uint32_t>(rng() % 3);
          const auto table = static_cast<std::int32_t>(rng() % 2);
          order.push_windowed(next_use, uses, table, slot, v);
          queued[slot] = Rank{1, -next_use, uses, table, slot};
        } else {
          const std::uint64_t last = rng() % 8 == 0 ? tick - std::min<std::uint64_t>(tick - 1, rng() % 50) : ++tick;
          std::uint32_t bucket = 0;
          if (variant > 0) bucket = rng() % 20 == 0 ? EvictionOrder::kDenseBuckets + static_cast<std::uint32_t>(rng() % 3) : static_cast<std::uint32_t>(rng() % 4);
          // Ticks are unique among queued slots (they are in a pool): skip a repeat.
          bool repeat = false;
          for (const auto& [s, r] : queued) repeat = repeat || (std::get<0>(r) == 0 && std::get<2>(r) == static_cast<std::int64_t>(last));
          if (repeat) {
            queued.erase(slot);
            continue;
          }
          order.push_ranked(bucket, last, slot, v);
          queued[slot] = Rank{0, bucket, static_cast<std::int64_t>(last), 0, 0};
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
