#pragma once
// WindowMap: the lookahead window of a slot pool. For each cache key, the sequence numbers of the
// batches pushed into the window (submitted or previewed) and not yet committed or dropped that use
// it. Batches are mostly pushed in increasing sequence number; a use may also be pushed below
// others of its key (a previewed batch whose keys changed when it was submitted keeps its place).
//
// An open-addressing hash map (linear probing, backward-shift deletion, doubling at half full) of
// entries holding the key, its first use, and a bit mask of its uses among the R sequence numbers
// after the first: R = 64 (32-byte entries) by default, or the window depth the map is built for
// rounded up to a multiple of 64, at most 320 (one 64-byte entry), so that a window of previews
// hundreds of batches deep stays in the masks. A use farther than R goes to a side list per key
// (ascending), and comes back into the mask as the first use advances. So pushing in order and
// consuming touch one entry. A key leaves the map with its last use. Not thread-safe.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>
#include <vector>

#include "cache/detail/cache_line_hint.hpp"
#include "core/row_math.hpp"

namespace strata::cache::detail {

class WindowMap {
 public:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();  ///< no use
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};                       ///< reserved key

  static constexpr std::int64_t kMaxReach = 320;  ///< batches a mask reaches at most (64-byte entries)

  /// A map whose masks reach `depth` batches beyond a key's first use (rounded up to a multiple
  /// of 64, in [64, kMaxReach]): uses farther apart than that go to the slower side list.
  explicit WindowMap(std::int64_t depth = 64)
      : words_(static_cast<std::size_t>(std::clamp<std::int64_t>((depth + 63) / 64, 1, kMaxReach / 64))),
        stride_(words_ == 1 ? 4 : (kMask + words_ + 7) / 8 * 8),
        reach_(64 * static_cast<std::int64_t>(words_)) {
    rehash(1024);
  }

  /// Batches beyond a key's first use its mask holds.
  std::int64_t reach() const noexcept { return reach_; }

  // Every operation takes the key's hash `hk` (mix64, as KeyMap::hash) along with the key.

  /// Adds a use of `k` at `seq` (not already one of its uses); true when `seq` is now its first
  /// use (it had none, or only later ones). O(1) when `seq` is above the key's first use, within
  /// reach() of it and no use is in the side list, else O(uses in the side list).
  bool push(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    if ((size_ + 1) * 2 > capacity()) rehash(capacity() * 2);
    for (std::size_t h = hk & mask_;; h = (h + 1) & mask_) {
      std::uint64_t* e = entry(h);
      if (e[kKey] == k) {
        const std::int64_t d = seq - front_of(e) - 1;
        if (d < 0) {
          push_front(e, seq);
          return true;
        }
        // Into the mask when in its reach and below the side list (every use in the mask stays
        // below every use in the side list), else into the side list.
        if (d < reach_ && (far_of(e) == 0 || seq < far_.find(k)->second.front()))
          e[kMask + static_cast<std::size_t>(d / 64)] |= std::uint64_t{1} << (d % 64);
        else
          add_far(e, seq);
        return false;
      }
      if (e[kKey] == kEmpty) {
        e[kKey] = k;
        e[kFront] = static_cast<std::uint64_t>(seq);
        e[kHashFar] = hk & 0xFFFFFFFFu;  // far count 0
        std::fill(e + kMask, e + kMask + words_, 0);
        ++size_;
        return true;
      }
    }
  }

  /// The first use of `k`, or kNone.
  std::int64_t front(std::uint64_t k, std::uint64_t hk) const noexcept {
    const std::size_t h = find(k, hk);
    return h == kMissing ? kNone : front_of(entry(h));
  }

  /// Removes the use of `k` at `seq` (if any); returns the first use left, or kNone.
  std::int64_t consume(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    const std::size_t h = find(k, hk);
    if (h == kMissing) return kNone;
    std::uint64_t* e = entry(h);
    if (front_of(e) == seq) return pop_front(h);
    remove_later(e, seq);
    return front_of(e);
  }

  /// What drop() did to a key.
  struct Dropped {
    bool was_front = false;      ///< the first use was `seq`
    std::int64_t front = kNone;  ///< the first use left, or kNone
  };
  /// Removes the use of `k` at `seq` (if any), as consume(), saying whether it was the first.
  Dropped drop(std::uint64_t k, std::uint64_t hk, std::int64_t seq) {
    const std::size_t h = find(k, hk);
    if (h == kMissing) return {};
    std::uint64_t* e = entry(h);
    if (front_of(e) != seq) {
      remove_later(e, seq);
      return {false, front_of(e)};
    }
    return {true, pop_front(h)};
  }

  /// Starts loading the home entry of hash `hk` into the cache (a hint).
  STRATA_CACHE_LINE_HINT void prefetch_line(std::uint64_t hk) const noexcept { __builtin_prefetch(entry(hk & mask_)); }
  /// As prefetch_line(), for a consume(): also the entry after the home one when it starts the next
  /// cache line (erasing a key's last use looks there).
  STRATA_CACHE_LINE_HINT void prefetch_consume_lines(std::uint64_t hk) const noexcept {
    const std::size_t h = hk & mask_;
    __builtin_prefetch(entry(h));
    if (stride_ == 4 && (h & 1) != 0) __builtin_prefetch(entry((h + 1) & mask_));
  }

  /// Keys with at least one use.
  std::size_t size() const noexcept { return size_; }

 private:
  // An entry is stride_ words: the key, its first use, the low 32 bits of its hash (its home, for
  // moves without rehashing) and the count of its uses in far_ (all beyond the mask's reach), then
  // words_ mask words: bit i of word w is a use at first + 1 + 64 w + i. 32 bytes (one mask word) or 64.
  static constexpr std::size_t kKey = 0, kFront = 1, kHashFar = 2, kMask = 3;
  static constexpr std::size_t kMissing = ~std::size_t{0};

  std::uint64_t* entry(std::size_t h) noexcept { return table_.data()->w + h * stride_; }
  const std::uint64_t* entry(std::size_t h) const noexcept { return table_.data()->w + h * stride_; }
  std::size_t capacity() const noexcept { return mask_ + 1; }
  static std::int64_t front_of(const std::uint64_t* e) noexcept { return static_cast<std::int64_t>(e[kFront]); }
  static std::uint32_t far_of(const std::uint64_t* e) noexcept { return static_cast<std::uint32_t>(e[kHashFar] >> 32); }
  static void add_far_count(std::uint64_t* e, std::int64_t n) noexcept {
    e[kHashFar] = (e[kHashFar] & 0xFFFFFFFFu) | (static_cast<std::uint64_t>(far_of(e) + n) << 32);
  }
  std::size_t home(const std::uint64_t* e) const noexcept { return e[kHashFar] & 0xFFFFFFFFu & mask_; }
  std::size_t find(std::uint64_t k, std::uint64_t hk) const noexcept {
    for (std::size_t h = hk & mask_;; h = (h + 1) & mask_) {
      if (entry(h)[kKey] == k) return h;
      if (entry(h)[kKey] == kEmpty) return kMissing;
    }
  }

  // A use beyond the mask's reach, into the side list in order (at the back when pushed in order).
  void add_far(std::uint64_t* e, std::int64_t seq) {
    auto& uses = far_[e[kKey]];
    uses.insert(std::upper_bound(uses.begin(), uses.end(), seq), seq);
    add_far_count(e, 1);
  }

  // A use below the first: it becomes the first, the old first and the mask's uses shift up, and
  // those pushed past the mask's reach go to the front of the side list (all below its uses).
  void push_front(std::uint64_t* e, std::int64_t seq) {
    std::vector<std::int64_t> uses{front_of(e)};  // the old first and the mask's uses, ascending
    for (std::size_t w = 0; w < words_; ++w)
      for (std::uint64_t m = e[kMask + w]; m != 0; m &= m - 1)
        uses.push_back(front_of(e) + 1 + 64 * static_cast<std::int64_t>(w) + __builtin_ctzll(m));
    e[kFront] = static_cast<std::uint64_t>(seq);
    std::fill(e + kMask, e + kMask + words_, 0);
    std::vector<std::int64_t> out;  // uses leaving the mask, ascending
    for (const std::int64_t use : uses) {
      const std::int64_t d = use - seq - 1;
      if (d < reach_)
        e[kMask + static_cast<std::size_t>(d / 64)] |= std::uint64_t{1} << (d % 64);
      else
        out.push_back(use);
    }
    if (out.empty()) return;
    auto& far = far_[e[kKey]];
    far.insert(far.begin(), out.begin(), out.end());
    add_far_count(e, static_cast<std::int64_t>(out.size()));
  }

  // Removes a use other than the first.
  void remove_later(std::uint64_t* e, std::int64_t seq) {
    const std::int64_t d = seq - front_of(e) - 1;
    if (d >= 0 && d < reach_) {
      std::uint64_t& word = e[kMask + static_cast<std::size_t>(d / 64)];
      const std::uint64_t bit = std::uint64_t{1} << (d % 64);
      if (word & bit) {
        word &= ~bit;
        return;
      }
    }
    if (far_of(e) == 0) return;
    auto it = far_.find(e[kKey]);
    auto& uses = it->second;
    for (auto u = uses.begin(); u != uses.end(); ++u) {
      if (*u != seq) continue;
      uses.erase(u);
      add_far_count(e, -1);
      if (far_of(e) == 0) far_.erase(it);
      return;
    }
  }

  // Shifts the mask down by `n` bits (1 <= n <= reach_): bit i takes bit i + n.
  void shift_down(std::uint64_t* e, std::int64_t n) const noexcept {
    if (words_ == 1) {  // the usual mask (BM_PlanBatch: the general loop cost lookahead 2-3%)
      e[kMask] = n == 64 ? 0 : e[kMask] >> n;
      return;
    }
    const std::size_t q = static_cast<std::size_t>(n / 64);
    const unsigned r = static_cast<unsigned>(n % 64);
    std::uint64_t* m = e + kMask;
    for (std::size_t w = 0; w < words_; ++w) {
      const std::uint64_t lo = w + q < words_ ? m[w + q] : 0;
      const std::uint64_t hi = w + q + 1 < words_ ? m[w + q + 1] : 0;
      m[w] = r == 0 ? lo : (lo >> r) | (hi << (64 - r));
    }
  }

  // Removes the first use; the next one (from the mask, else the side list) becomes the first, or
  // the key leaves. Returns the new first use.
  std::int64_t pop_front(std::size_t h) {
    std::uint64_t* e = entry(h);
    std::int64_t step = 0;  // 1 + the lowest set bit of the mask, or 0
    if (words_ == 1) {
      step = e[kMask] == 0 ? 0 : __builtin_ctzll(e[kMask]) + 1;
    } else {
      for (std::size_t w = 0; w < words_; ++w) {
        if (e[kMask + w] == 0) continue;
        step = 64 * static_cast<std::int64_t>(w) + __builtin_ctzll(e[kMask + w]) + 1;
        break;
      }
    }
    if (step != 0) {
      e[kFront] += static_cast<std::uint64_t>(step);
      shift_down(e, step);
    } else if (far_of(e) != 0) {
      auto it = far_.find(e[kKey]);
      auto& uses = it->second;
      e[kFront] = static_cast<std::uint64_t>(uses.front());
      uses.pop_front();
      add_far_count(e, -1);
    } else {
      erase_at(h);
      return kNone;
    }
    // Uses now within reach of the mask move into it (the side list is in increasing order).
    if (far_of(e) != 0) {
      auto it = far_.find(e[kKey]);
      auto& uses = it->second;
      while (!uses.empty() && uses.front() - front_of(e) - 1 < reach_) {
        const std::int64_t d = uses.front() - front_of(e) - 1;
        e[kMask + static_cast<std::size_t>(d / 64)] |= std::uint64_t{1} << (d % 64);
        uses.pop_front();
        add_far_count(e, -1);
      }
      if (far_of(e) == 0) far_.erase(it);
    }
    // Every use in the side list stays larger than every use in the mask: a push goes to the mask
    // only while the side list is empty, and the list feeds the mask from its smallest.
    return front_of(e);
  }

  void erase_at(std::size_t hole) noexcept {
    for (std::size_t j = (hole + 1) & mask_; entry(j)[kKey] != kEmpty; j = (j + 1) & mask_) {
      const std::size_t want = home(entry(j));
      if (((j - want) & mask_) >= ((j - hole) & mask_)) {
        std::copy(entry(j), entry(j) + stride_, entry(hole));
        hole = j;
      }
    }
    entry(hole)[kKey] = kEmpty;
    --size_;
  }

  void rehash(std::size_t cap) {
    std::vector<Line> old(cap * stride_ / 8);
    old.swap(table_);
    const std::size_t old_cap = old.size() * 8 / stride_;
    mask_ = cap - 1;
    for (std::size_t h = 0; h < cap; ++h) entry(h)[kKey] = kEmpty;
    for (std::size_t i = 0; i < old_cap; ++i) {
      const std::uint64_t* e = old.data()->w + i * stride_;
      if (e[kKey] == kEmpty) continue;
      std::size_t h = home(e);
      while (entry(h)[kKey] != kEmpty) h = (h + 1) & mask_;
      std::copy(e, e + stride_, entry(h));
    }
  }

  std::size_t words_;   // mask words per entry
  std::size_t stride_;  // words per entry
  std::int64_t reach_;  // 64 x words_
  struct alignas(64) Line {
    std::uint64_t w[8] = {};
  };
  std::vector<Line> table_;  // capacity x stride_ words (capacity >= 1024, a power of two)
  std::size_t mask_ = 0, size_ = 0;
  std::unordered_map<std::uint64_t, std::deque<std::int64_t>> far_;  // uses beyond the masks' reach
};

}  // namespace strata::cache::detail
