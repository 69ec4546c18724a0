#pragma once
// WindowMap: the lookahead window of a slot pool. For each cache key, the sequence numbers of the
// batches pushed into the window (submitted or previewed) and not yet committed or dropped that use
// it. Batches are mostly pushed in increasing sequence number; a use may also be pushed below
// others of its key (a previewed batch whose keys changed when it was submitted keeps its place).
//
// An open-addressing hash map (linear probing, backward-shift deletion, doubling at half full) of
// 32-byte entries: the key, its first use, and a bit mask of its uses among the 64 sequence
// numbers after the first. A use farther than that (only with more than 64 batches in the window)
// goes to a side list per key (ascending), and comes back into the mask as the first use advances.
// So pushing in order and consuming touch one entry. A key leaves the map with its last use. Not
// thread-safe.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>
#include <vector>

#include "cache/detail/prefetch.hpp"
#include "core/row_math.hpp"

namespace strata::cache::detail {

class WindowMap {
 public:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();  ///< no use
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};                      ///< reserved key

  WindowMap() { rehash(1024); }

  // Every operation takes the key's hash `hk` (mix64, as KeyMap::hash) along with the key.

  /// Adds a use of `k` at `seq` (not already one of its uses); true when `seq` is now its first
  /// use (it had none, or only later ones). O(1) when `seq` is above the key's first use, within
  /// 64 of it and no use is in the side list, else O(uses in the side list).
  bool push(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    if ((size_ + 1) * 2 > table_.size()) rehash(table_.size() * 2);
    for (std::size_t h = hk & mask_;; h = (h + 1) & mask_) {
      Entry& e = table_[h];
      if (e.key == k) {
        const std::int64_t d = seq - e.front - 1;
        if (d < 0) {
          push_front(e, seq);
          return true;
        }
        // Into the mask when in its reach and below the side list (every use in the mask stays
        // below every use in the side list), else into the side list.
        if (d < 64 && (e.far == 0 || seq < far_.find(e.key)->second.front()))
          e.later |= std::uint64_t{1} << d;
        else
          add_far(e, seq);
        return false;
      }
      if (e.key == kEmpty) {
        e.key = k;
        e.front = seq;
        e.later = 0;
        e.far = 0;
        e.hash = static_cast<std::uint32_t>(hk);
        ++size_;
        return true;
      }
    }
  }

  /// The first use of `k`, or kNone.
  std::int64_t front(std::uint64_t k, std::uint64_t hk) const noexcept {
    const std::size_t h = find(k, hk);
    return h == kMissing ? kNone : table_[h].front;
  }

  /// Removes the use of `k` at `seq` (if any); returns the first use left, or kNone.
  std::int64_t consume(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    const std::size_t h = find(k, hk);
    if (h == kMissing) return kNone;
    Entry& e = table_[h];
    if (e.front == seq) return pop_front(h);
    remove_later(e, seq);
    return e.front;
  }

  /// What drop() did to a key.
  struct Dropped {
    bool was_front = false;        ///< the first use was `seq`
    std::int64_t front = kNone;    ///< the first use left, or kNone
  };
  /// Removes the use of `k` at `seq` (if any), as consume(), saying whether it was the first.
  Dropped drop(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    const std::size_t h = find(k, hk);
    if (h == kMissing) return {};
    Entry& e = table_[h];
    if (e.front != seq) {
      remove_later(e, seq);
      return {false, e.front};
    }
    return {true, pop_front(h)};
  }

  /// Starts loading the home entry of hash `hk` into the cache (a hint).
  STRATA_PREFETCH_FN void prefetch(std::uint64_t hk) const noexcept { __builtin_prefetch(&table_[hk & mask_]); }
  /// As prefetch(), for a consume(): also the entry after the home one when it starts the next
  /// cache line (erasing a key's last use looks there).
  STRATA_PREFETCH_FN void prefetch_consume(std::uint64_t hk) const noexcept {
    const std::size_t h = hk & mask_;
    __builtin_prefetch(&table_[h]);
    if ((h & 1) != 0) __builtin_prefetch(&table_[(h + 1) & mask_]);
  }

  /// Keys with at least one use.
  std::size_t size() const noexcept { return size_; }

 private:
  struct alignas(32) Entry {
    std::uint64_t key = kEmpty;
    std::int64_t front = kNone;  // first use
    std::uint64_t later = 0;     // bit i: a use at front + 1 + i
    std::uint32_t far = 0;       // uses in far_[key] (all beyond the mask's reach)
    std::uint32_t hash = 0;      // low bits of the key's hash (its home), for moves without rehashing
  };
  static constexpr std::size_t kMissing = ~std::size_t{0};

  std::size_t home(const Entry& e) const noexcept { return e.hash & mask_; }

  std::size_t find(std::uint64_t k, std::uint64_t hk) const noexcept {
    for (std::size_t h = hk & mask_;; h = (h + 1) & mask_) {
      if (table_[h].key == k) return h;
      if (table_[h].key == kEmpty) return kMissing;
    }
  }

  // A use beyond the mask's reach, into the side list in order (at the back when pushed in order).
  void add_far(Entry& e, std::int64_t seq) {
    auto& uses = far_[e.key];
    uses.insert(std::upper_bound(uses.begin(), uses.end(), seq), seq);
    ++e.far;
  }

  // A use below the first: it becomes the first, the old first and the mask's uses shift up, and
  // those pushed past the mask's reach go to the front of the side list (all below its uses).
  void push_front(Entry& e, std::int64_t seq) {
    std::vector<std::int64_t> out;  // uses leaving the mask, ascending
    std::uint64_t later = 0;
    const auto place = [&](std::int64_t use) {
      const std::int64_t d = use - seq - 1;
      if (d < 64)
        later |= std::uint64_t{1} << d;
      else
        out.push_back(use);
    };
    place(e.front);
    for (std::uint64_t m = e.later; m != 0; m &= m - 1) place(e.front + 1 + __builtin_ctzll(m));
    e.front = seq;
    e.later = later;
    if (out.empty()) return;
    auto& uses = far_[e.key];
    uses.insert(uses.begin(), out.begin(), out.end());
    e.far += static_cast<std::uint32_t>(out.size());
  }

  // Removes a use other than the first.
  void remove_later(Entry& e, std::int64_t seq) {
    const std::int64_t d = seq - e.front - 1;
    if (d >= 0 && d < 64 && (e.later >> d & 1)) {
      e.later &= ~(std::uint64_t{1} << d);
      return;
    }
    if (e.far == 0) return;
    auto it = far_.find(e.key);
    auto& uses = it->second;
    for (auto u = uses.begin(); u != uses.end(); ++u) {
      if (*u != seq) continue;
      uses.erase(u);
      if (--e.far == 0) far_.erase(it);
      return;
    }
  }

  // Removes the first use; the next one (from the mask, else the side list) becomes the first, or
  // the key leaves. Returns the new first use.
  std::int64_t pop_front(std::size_t h) {
    Entry& e = table_[h];
    if (e.later != 0) {
      const int step = __builtin_ctzll(e.later) + 1;  // 1..64
      e.front += step;
      e.later = step == 64 ? 0 : e.later >> step;
    } else if (e.far != 0) {
      auto it = far_.find(e.key);
      auto& uses = it->second;
      e.front = uses.front();
      uses.pop_front();
      --e.far;
      // Uses now within reach of the mask move into it (the side list is in increasing order).
      while (!uses.empty() && uses.front() - e.front - 1 < 64) {
        e.later |= std::uint64_t{1} << (uses.front() - e.front - 1);
        uses.pop_front();
        --e.far;
      }
      if (e.far == 0) far_.erase(it);
    } else {
      erase_at(h);
      return kNone;
    }
    // Every use in the side list stays larger than every use in the mask: a push goes to the mask
    // only while the side list is empty, and the list feeds the mask from its smallest.
    return e.front;
  }

  void erase_at(std::size_t hole) noexcept {
    for (std::size_t j = (hole + 1) & mask_; table_[j].key != kEmpty; j = (j + 1) & mask_) {
      const std::size_t want = home(table_[j]);
      if (((j - want) & mask_) >= ((j - hole) & mask_)) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole] = Entry{};
    --size_;
  }

  void rehash(std::size_t cap) {
    std::vector<Entry> old(cap);
    old.swap(table_);
    mask_ = cap - 1;
    for (const Entry& e : old) {
      if (e.key == kEmpty) continue;
      std::size_t h = home(e);
      while (table_[h].key != kEmpty) h = (h + 1) & mask_;
      table_[h] = e;
    }
  }

  std::vector<Entry> table_;
  std::size_t mask_ = 0, size_ = 0;
  std::unordered_map<std::uint64_t, std::deque<std::int64_t>> far_;  // uses beyond the masks' reach
};

}  // namespace strata::cache::detail
