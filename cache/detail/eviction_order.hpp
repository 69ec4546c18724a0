#pragma once
// EvictionOrder: the evictable (resident, unpinned) slots of a pool, or of one capped table, in
// the order the policy evicts them. Entries are queued lazily: each carries the slot's version
// when it was queued, and the pool bumps a slot's version whenever the slot leaves the order
// (pinned, evicted, dropped) or is queued again with a new rank, so an entry whose version is no
// longer the slot's is stale and skipped (the versions are a dense array of the pool, so that check
// rarely leaves the cache). An evictable slot has exactly one live entry. Stale
// entries are dropped as they reach the front, and all at once when they outnumber the slots.
//
// Ranks, lowest evicted first (cache/policy.hpp):
//  - ranked:   (bucket, last). lru: bucket 0; lfu: bucket = uses (capped). `last` (the tick of
//              the slot's last use) differs between slots, so this order is strict. Slots come in
//              increasing `last` almost always (a batch's rows retire in tick order, batches mostly
//              in plan order), so each bucket up to kDenseBuckets is a FIFO queue; a slot that comes
//              out of order, or whose bucket is larger, goes to a min-heap. The minimum is the
//              smaller of the lowest live queue front and the heap top. Queuing and evicting are
//              O(1) amortized on the usual path.
//  - aged:     (an EvictionOrder built with a level step > 0; lookahead rows with no use in the
//              window) ranked entries whose bucket is a frequency level < 64 (see
//              frequency_sketch.hpp) are ordered by (last + bucket * step, bucket, last): a level
//              buys `step` ticks of recency. Same FIFO queues (one per level, `last` increasing, so
//              the key too) and heap; the minimum is taken over the queue fronts, whose keys are
//              kept in a small array under a winner tree (the minimum's bucket at the root), so
//              a victim, or a stale front dropped, costs one leaf-to-root pass of 6 compares.
//  - windowed: lookahead rows used again in the window, evicted only when no ranked slot is
//              left: the farthest next use first, then fewer uses, then lower table, then lower
//              slot. One group per next use (a batch of the window); a group is sorted when a
//              victim is first needed from it after new entries came.
// Not thread-safe.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

#include "cache/detail/cache_line_hint.hpp"

namespace strata::cache::detail {

class EvictionOrder {
 public:
  static constexpr std::uint32_t kDenseBuckets = 64 * 64;  ///< buckets with a FIFO queue each

  static constexpr std::uint32_t kAgedBuckets = 64;  ///< buckets (levels) of an aged order

  /// An order for at most `capacity` evictable slots (sets when stale entries are compacted).
  /// `level_step` > 0 makes the ranked entries aged (buckets < kAgedBuckets, see above).
  explicit EvictionOrder(std::int64_t capacity, std::uint64_t level_step = 0)
      : limit_(3 * static_cast<std::size_t>(capacity > 0 ? capacity : 0) + 4096),
        step_(level_step),
        bits_(kDenseBuckets / 64, 0) {
    std::fill(std::begin(front_), std::end(front_), kNoFront);
    for (std::uint32_t i = 1; i < kAgedBuckets; ++i) {
      std::uint32_t leftmost = i;
      while (leftmost < kAgedBuckets) leftmost *= 2;
      winner_[i] = static_cast<std::uint8_t>(leftmost - kAgedBuckets);
    }
  }

  /// Starts loading the tail of a bucket's queue, where push_ranked() would write (a hint).
  STRATA_CACHE_LINE_HINT void prefetch_ranked_line(std::uint32_t bucket) const noexcept {
    if (bucket >= queues_.size()) return;
    const Queue& q = queues_[bucket];
    if (q.head < q.items.size()) __builtin_prefetch(q.items.data() + q.items.size());
  }

  /// Queues `slot` (whose version is now `version`) by (bucket, last).
  void push_ranked(std::uint32_t bucket, std::uint64_t last, std::int32_t slot, std::uint32_t version) {
    ++entries_;
    if (step_ != 0 && bucket >= kAgedBuckets) bucket = kAgedBuckets - 1;  // (callers cap levels; a guard)
    if (bucket < kDenseBuckets) {
      if (bucket >= queues_.size()) queues_.resize(bucket + 1);
      Queue& q = queues_[bucket];
      if (q.head == q.items.size()) {
        q.items.clear();
        q.head = 0;
        bits_[bucket / 64] |= std::uint64_t{1} << (bucket % 64);
        summary_ |= std::uint64_t{1} << (bucket / 64);
        q.items.emplace_back(last, slot, version);
        if (step_ != 0) set_front(bucket, last + bucket * step_);
        return;
      }
      if (q.items.back().last < last) {
        if (q.head >= 4096 && 2 * q.head >= q.items.size()) {
          q.items.erase(q.items.begin(), q.items.begin() + static_cast<std::ptrdiff_t>(q.head));
          q.head = 0;
        }
        q.items.emplace_back(last, slot, version);
        return;
      }
    }
    heap_.emplace_back(last, bucket, slot, version);
    std::push_heap(heap_.begin(), heap_.end(), HeapAfter{step_});
  }

  /// Queues `slot` (version `version`) as used again in the window, first at `next_use`.
  void push_windowed(std::int64_t next_use, std::uint32_t uses, std::int32_t table, std::int32_t slot,
                     std::uint32_t version) {
    ++entries_;
    // The group of `next_use`: binary search, as a window of previews holds hundreds of groups.
    auto it = std::lower_bound(groups_.begin(), groups_.end(), next_use,
                               [](const Group& g, std::int64_t v) { return g.next_use < v; });
    if (it == groups_.end() || it->next_use != next_use) {
      it = groups_.insert(it, Group{});
      it->next_use = next_use;
      if (!spare_.empty()) {
        it->items.swap(spare_.back());
        spare_.pop_back();
      }
    }
    it->items.emplace_back(uses, table, slot, version);
  }

  /// The slot to evict next (it stays queued until its version moves on), or -1 when none is
  /// evictable. `version`: the pool's slot versions.
  std::int32_t min(const std::uint32_t* version) {
    const std::int32_t ranked = step_ != 0 ? min_aged(version) : min_ranked(version);
    if (ranked >= 0) return ranked;
    while (!groups_.empty()) {
      Group& g = groups_.back();
      sort(g, version);
      while (g.head < g.items.size() && version[g.items[g.head].slot] != g.items[g.head].version) {
        ++g.head;
        --entries_;
      }
      if (g.head < g.items.size()) return g.items[g.head].slot;
      recycle(g);
      groups_.pop_back();
    }
    return -1;
  }

  /// Drops the stale entries of the window groups of next uses up to `seq` (batch `seq` was
  /// planned, so normally all of them), and the groups left empty.
  void retire_window(std::int64_t seq, const std::uint32_t* version) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      Group& g = groups_[i];
      if (g.next_use <= seq) filter(g, version);
      if (g.head == g.items.size()) {
        recycle(g);
        continue;
      }
      if (kept != i) std::swap(groups_[kept], g);
      ++kept;
    }
    groups_.resize(kept);
  }

  /// Drops every stale entry when they have piled up (keeps memory and scans bounded).
  void maybe_compact(const std::uint32_t* version) {
    if (entries_ <= limit_) return;
    for (std::uint32_t w = 0; w < bits_.size(); ++w) {
      for (std::uint64_t m = bits_[w]; m != 0; m &= m - 1) {
        const std::uint32_t b = 64 * w + static_cast<std::uint32_t>(__builtin_ctzll(m));
        Queue& q = queues_[b];
        std::size_t out = 0;
        for (std::size_t i = q.head; i < q.items.size(); ++i)
          if (version[q.items[i].slot] == q.items[i].version) q.items[out++] = q.items[i];
        entries_ -= q.items.size() - q.head - out;
        q.items.resize(out);
        q.head = 0;
        if (out == 0) {
          std::vector<Ranked>().swap(q.items);
          bits_[w] &= ~(std::uint64_t{1} << (b % 64));
          if (step_ != 0) set_front(b, kNoFront);
        } else if (step_ != 0) {
          set_front(b, q.items[0].last + b * step_);
        }
      }
      if (bits_[w] == 0) summary_ &= ~(std::uint64_t{1} << w);
    }
    const std::size_t before = heap_.size();
    heap_.erase(
        std::remove_if(heap_.begin(), heap_.end(), [&](const Heaped& h) { return version[h.slot] != h.version; }),
        heap_.end());
    entries_ -= before - heap_.size();
    std::make_heap(heap_.begin(), heap_.end(), HeapAfter{step_});
    retire_window(std::numeric_limits<std::int64_t>::max(), version);
  }

 private:
  // Entries have constructors so that emplace_back() writes them in place: a braced temporary is
  // stored field by field and copied as a whole, a store-forwarding stall on every push.
  struct Ranked {
    Ranked() = default;
    Ranked(std::uint64_t l, std::int32_t s, std::uint32_t v) noexcept : last(l), slot(s), version(v) {}
    std::uint64_t last;
    std::int32_t slot;
    std::uint32_t version;
  };
  // A line of its own (pools planned on different cores must not write the same line, and the
  // queue's end moves on every push).
  struct alignas(64) Queue {
    std::vector<Ranked> items;  // ascending `last`; [head, size) are queued
    std::size_t head = 0;
  };
  struct Heaped {
    Heaped() = default;
    Heaped(std::uint64_t l, std::uint32_t b, std::int32_t s, std::uint32_t v) noexcept
        : last(l), bucket(b), slot(s), version(v) {}
    std::uint64_t last;
    std::uint32_t bucket;
    std::int32_t slot;
    std::uint32_t version;
  };
  struct HeapAfter {     // std heap comparator: true when a comes after b (a min-heap on the rank)
    std::uint64_t step;  // 0: (bucket, last); else (last + bucket * step, bucket, last)
    bool operator()(const Heaped& a, const Heaped& b) const noexcept {
      if (step != 0) {
        const std::uint64_t ka = a.last + a.bucket * step, kb = b.last + b.bucket * step;
        if (ka != kb) return ka > kb;
      }
      return a.bucket != b.bucket ? a.bucket > b.bucket : a.last > b.last;
    }
  };
  struct Windowed {
    Windowed() = default;
    Windowed(std::uint32_t n, std::int32_t t, std::int32_t s, std::uint32_t v) noexcept
        : uses(n), table(t), slot(s), version(v) {}
    std::uint32_t uses;
    std::int32_t table;
    std::int32_t slot;
    std::uint32_t version;
    bool operator<(const Windowed& o) const noexcept {
      if (uses != o.uses) return uses < o.uses;
      if (table != o.table) return table < o.table;
      return slot < o.slot;
    }
  };
  struct Group {
    std::int64_t next_use = 0;
    std::vector<Windowed> items;  // [head, sorted) sorted and queued; [sorted, size) queued since
    std::size_t head = 0, sorted = 0;
  };

  // The lowest live ranked entry by (bucket, last), or -1.
  std::int32_t min_ranked(const std::uint32_t* version) {
    std::int32_t best = -1;
    std::uint32_t best_bucket = 0;
    std::uint64_t best_last = 0;
    while (summary_ != 0) {
      const std::uint32_t w = static_cast<std::uint32_t>(__builtin_ctzll(summary_));
      const std::uint32_t b = 64 * w + static_cast<std::uint32_t>(__builtin_ctzll(bits_[w]));
      Queue& q = queues_[b];
      while (q.head < q.items.size()) {
        if (q.head + 8 < q.items.size()) __builtin_prefetch(&version[q.items[q.head + 8].slot]);
        const Ranked& e = q.items[q.head];
        if (version[e.slot] == e.version) break;
        ++q.head;
        --entries_;
      }
      if (q.head < q.items.size()) {
        best = q.items[q.head].slot;
        best_bucket = b;
        best_last = q.items[q.head].last;
        break;
      }
      q.items.clear();
      q.head = 0;
      bits_[w] &= ~(std::uint64_t{1} << (b % 64));
      if (bits_[w] == 0) summary_ &= ~(std::uint64_t{1} << w);
    }
    clean_heap_top(version);
    if (!heap_.empty()) {
      const Heaped& h = heap_.front();
      if (best < 0 || h.bucket < best_bucket || (h.bucket == best_bucket && h.last < best_last)) best = h.slot;
    }
    return best;
  }

  // The lowest live ranked entry by (last + bucket * step, bucket, last), or -1. The queue fronts'
  // keys are in front_ (the winner tree's root is the bucket of the smallest); a stale front is
  // dropped only when it is the minimum (a live entry behind it has a larger key, so the minimum
  // over the fronts is still right).
  std::int32_t min_aged(const std::uint32_t* version) {
    std::int32_t best = -1;
    std::uint32_t best_bucket = 0;
    std::uint64_t best_key = 0, best_last = 0;
    for (;;) {
      const std::uint32_t b = winner_[1];
      const std::uint64_t key = front_[b];
      if (key == kNoFront) break;
      Queue& q = queues_[b];
      const Ranked& e = q.items[q.head];
      if (version[e.slot] == e.version) {
        best = e.slot;
        best_bucket = b;
        best_key = key;
        best_last = e.last;
        break;
      }
      ++q.head;
      --entries_;
      if (q.head < q.items.size()) {
        set_front(b, q.items[q.head].last + b * step_);
        continue;
      }
      q.items.clear();
      q.head = 0;
      bits_[0] &= ~(std::uint64_t{1} << b);
      if (bits_[0] == 0) summary_ &= ~std::uint64_t{1};
      set_front(b, kNoFront);
    }
    clean_heap_top(version);
    if (!heap_.empty()) {
      const Heaped& h = heap_.front();
      const std::uint64_t hk = h.last + h.bucket * step_;
      if (best < 0 || hk < best_key ||
          (hk == best_key && (h.bucket < best_bucket || (h.bucket == best_bucket && h.last < best_last))))
        best = h.slot;
    }
    return best;
  }

  // Sets the front key of aged bucket `b` (kNoFront: empty) and replays its matches up the winner
  // tree: node i (1..63) holds the bucket of the smaller front of its two subtrees (leaves 64..127
  // are the buckets; ties go to the lower bucket, as the rank says).
  void set_front(std::uint32_t b, std::uint64_t key) noexcept {
    front_[b] = key;
    const auto winner = [this](std::uint32_t node) {
      return node >= kAgedBuckets ? node - kAgedBuckets : winner_[node];
    };
    for (std::uint32_t i = (kAgedBuckets + b) / 2; i >= 1; i /= 2) {
      const std::uint32_t l = winner(2 * i), r = winner(2 * i + 1);
      winner_[i] = static_cast<std::uint8_t>(front_[r] < front_[l] ? r : l);
    }
  }

  void clean_heap_top(const std::uint32_t* version) {
    while (!heap_.empty() && version[heap_.front().slot] != heap_.front().version) {
      std::pop_heap(heap_.begin(), heap_.end(), HeapAfter{step_});
      heap_.pop_back();
      --entries_;
    }
  }

  // Brings the entries queued since the last sort into order.
  void sort(Group& g, const std::uint32_t* version) {
    if (g.sorted == g.items.size()) return;
    auto& v = g.items;
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(g.head));
    g.sorted -= g.head;
    g.head = 0;
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(g.sorted);
    const auto end = std::remove_if(mid, v.end(), [&](const Windowed& e) { return version[e.slot] != e.version; });
    entries_ -= static_cast<std::size_t>(v.end() - end);
    v.erase(end, v.end());
    std::sort(v.begin() + static_cast<std::ptrdiff_t>(g.sorted), v.end());
    std::inplace_merge(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(g.sorted), v.end());
    g.sorted = v.size();
  }

  // Drops a group's stale and consumed entries, keeping the rest in their order.
  void filter(Group& g, const std::uint32_t* version) {
    std::size_t out = 0, sorted = 0;
    for (std::size_t i = g.head; i < g.items.size(); ++i) {
      if (version[g.items[i].slot] != g.items[i].version) continue;
      if (i < g.sorted) ++sorted;
      g.items[out++] = g.items[i];
    }
    entries_ -= g.items.size() - g.head - out;
    g.items.resize(out);
    g.head = 0;
    g.sorted = sorted;
  }

  void recycle(Group& g) {
    entries_ -= g.items.size() - g.head;
    g.items.clear();
    g.head = g.sorted = 0;
    if (g.items.capacity() > 0 && spare_.size() < 16) spare_.push_back(std::move(g.items));
    g.items = {};
  }

  std::size_t entries_ = 0;  // queued entries, live and stale
  std::size_t limit_;
  std::uint64_t step_;                                          // aged: ticks of recency per level; 0: (bucket, last)
  static constexpr std::uint64_t kNoFront = ~std::uint64_t{0};  // front_ of an empty aged bucket
  // aged: key of each queue's front entry (kNoFront when empty), and the winner tree over them
  // (set_front); every key starts kNoFront, so node i starts with the lowest bucket under it.
  std::uint64_t front_[kAgedBuckets];
  std::uint8_t winner_[kAgedBuckets];
  std::vector<Queue> queues_;        // ranked: per bucket < kDenseBuckets
  std::vector<std::uint64_t> bits_;  // bit b: queues_[b] is not empty
  std::uint64_t summary_ = 0;        // bit w: bits_[w] != 0
  std::vector<Heaped> heap_;         // ranked, out of order or beyond the dense buckets
  std::vector<Group> groups_;        // windowed: ascending next use
  std::vector<std::vector<Windowed>> spare_;
};

}  // namespace strata::cache::detail
