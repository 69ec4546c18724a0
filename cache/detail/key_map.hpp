#pragma once
// KeyMap: a fixed-capacity hash map from 64-bit cache keys to slots: the key->slot index of a slot
// pool. Sized so that it is at most half full.
//
// Layout: chunks of 8 entries, one cache line each (8 hash tags, then 8 slots), probed chunk by
// chunk from the key's home chunk. A chunk also counts the keys stored beyond it that passed it
// on the way (its overflow), so a lookup stops at the first chunk that has no such key and erasing
// needs neither tombstones nor moving other entries (the layout of F14 in folly). At most half
// full, a chunk rarely overflows, so a lookup, an insert or an erase touches one cache line (plus a
// small dense array of overflow counts) and compares the 8 tags at once.
//
// An entry holds the slot and 32 bits of the key's hash; the key itself lives in the slot's record,
// so lookups take a `key_of(slot)` callable to confirm a candidate whose tag matches (for a
// resident key, the record the caller reads next anyway; for an absent key it is almost never
// called). prefetch_line() and prefetch_record_line() let a caller walking many keys hide the cache
// misses.
// Not thread-safe.

#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cache/detail/cache_line_hint.hpp"
#include "core/row_math.hpp"

namespace strata::cache::detail {

class KeyMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  ///< a key that is never stored

  /// A map able to hold `max_entries` keys (at most 2^30).
  explicit KeyMap(std::int64_t max_entries) {
    std::size_t chunks = 2;
    while (chunks * kWidth < static_cast<std::size_t>(max_entries) * 2) chunks *= 2;
    chunks_.assign(chunks, Chunk{});
    overflow_.assign(chunks, 0);
    mask_ = chunks - 1;
  }

  /// The hash every operation takes along with its key (the same mix64 WindowMap uses, so a caller
  /// hashes each key once).
  static std::uint64_t hash(std::uint64_t k) noexcept { return mix64(k); }

  /// The slot of `k` (hash `h`), or -1. `key_of(slot)` returns the key stored in a slot's record,
  /// and a key no caller looks up (e.g. kEmpty) for slot -1.
  template <class KeyOf>
  __attribute__((always_inline)) inline std::int64_t find(std::uint64_t k, std::uint64_t h,
                                                          const KeyOf& key_of) const noexcept {
    const std::uint32_t tag = tag_of(h);
    const std::size_t c = h & mask_;
    const Chunk& ch = chunks_[c];
    const unsigned m = ch.match(tag);
    // The usual case without a branch on whether `k` is present (that is as good as random in a
    // planner): at most one tag match in the home chunk, and `k` there or nothing past it.
    const std::int32_t first = ch.slot[__builtin_ctz(m | 0x100u) & (kWidth - 1)];
    const std::int32_t candidate = m != 0 ? first : -1;
    const bool hit = key_of(candidate) == k;
    if (__builtin_expect((m & (m - 1)) == 0 && (hit | (overflow_[c] == 0)), 1)) return hit ? candidate : -1;
    return find_slow(k, tag, c, key_of);
  }

  /// Starts loading the home chunk of hash `h` into the cache (a hint; no effect on the contents).
  STRATA_CACHE_LINE_HINT void prefetch_line(std::uint64_t h) const noexcept { __builtin_prefetch(&chunks_[h & mask_]); }

  /// Once the home chunk of hash `h` is in cache (prefetch_line() earlier): starts loading the record of
  /// the first slot there whose tag matches, which find() will read to confirm it. `record(slot)`
  /// gives the record's address. A hint, like prefetch_line().
  template <class RecordOf>
  STRATA_CACHE_LINE_HINT void prefetch_record_line(std::uint64_t h, const RecordOf& record) const noexcept {
    const Chunk& ch = chunks_[h & mask_];
    const unsigned m = ch.match(tag_of(h));
    if (m != 0) {
      const std::int32_t slot = ch.slot[__builtin_ctz(m)];
      if (slot >= 0) __builtin_prefetch(record(slot));
    }
  }

  /// Inserts a key (hash `h`) that is not present, stored in `slot`.
  void insert(std::uint64_t h, std::int64_t slot) noexcept {
    for (std::size_t c = h & mask_;; c = (c + 1) & mask_) {
      Chunk& ch = chunks_[c];
      const unsigned free = ch.free();
      if (free != 0) {
        const unsigned i = static_cast<unsigned>(__builtin_ctz(free));
        ch.tag[i] = tag_of(h);
        ch.slot[i] = static_cast<std::int32_t>(slot);
        return;
      }
      ++overflow_[c];
    }
  }

  /// Removes the key of hash `h` stored in `slot`, if present.
  void erase(std::uint64_t h, std::int64_t slot) noexcept {
    const std::size_t home = h & mask_;
    std::size_t c = home;
    for (;; c = (c + 1) & mask_) {
      Chunk& ch = chunks_[c];
      const unsigned m = ch.holds(static_cast<std::int32_t>(slot));
      if (m != 0) {
        const unsigned i = static_cast<unsigned>(__builtin_ctz(m));
        ch.slot[i] = -1;
        ch.tag[i] = 0;
        break;
      }
      if (overflow_[c] == 0) return;
    }
    for (std::size_t p = home; p != c; p = (p + 1) & mask_) --overflow_[p];
  }

 private:
  static constexpr unsigned kWidth = 8;  // entries per chunk

  struct alignas(64) Chunk {
    std::uint32_t tag[kWidth] = {};                                // hash bits of the key in each entry
    std::int32_t slot[kWidth] = {-1, -1, -1, -1, -1, -1, -1, -1};  // -1: empty

    // Bit i set: tag[i] == t (empty entries may match; callers check the slot).
    unsigned match(std::uint32_t t) const noexcept { return eq_mask(tag, t); }
    // Bit i set: slot[i] == s.
    unsigned holds(std::int32_t s) const noexcept {
      return eq_mask(reinterpret_cast<const std::uint32_t*>(slot), static_cast<std::uint32_t>(s));
    }
    // Bit i set: entry i is empty.
    unsigned free() const noexcept { return holds(-1); }

    static unsigned eq_mask(const std::uint32_t* v, std::uint32_t x) noexcept {
#if defined(__SSE2__)
      const __m128i k = _mm_set1_epi32(static_cast<int>(x));
      const __m128i lo = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(v)), k);
      const __m128i hi = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(v + 4)), k);
      return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(lo)) |
                                   (_mm_movemask_ps(_mm_castsi128_ps(hi)) << 4));
#else
      unsigned m = 0;
      for (unsigned i = 0; i < kWidth; ++i) m |= static_cast<unsigned>(v[i] == x) << i;
      return m;
#endif
    }
  };

  static std::uint32_t tag_of(std::uint64_t h) noexcept { return static_cast<std::uint32_t>(h >> 32); }

  // find() past its usual case: several tag matches, or chunks overflowed.
  template <class KeyOf>
  __attribute__((noinline)) std::int64_t find_slow(std::uint64_t k, std::uint32_t tag, std::size_t c,
                                                   const KeyOf& key_of) const noexcept {
    for (;; c = (c + 1) & mask_) {
      const Chunk& q = chunks_[c];
      for (unsigned r = q.match(tag); r != 0; r &= r - 1) {
        const std::int32_t slot = q.slot[__builtin_ctz(r)];
        if (slot >= 0 && key_of(slot) == k) return slot;
      }
      if (overflow_[c] == 0) return -1;
    }
  }

  std::vector<Chunk> chunks_;
  std::vector<std::uint32_t> overflow_;  // per chunk: keys stored beyond it whose probe passed it
  std::size_t mask_ = 0;
};

}  // namespace strata::cache::detail
