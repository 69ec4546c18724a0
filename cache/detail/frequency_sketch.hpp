#pragma once
// FrequencySketch: how often each cache key was used lately, in bounded memory, surviving
// evictions: the frequency the lookahead policy falls back to for rows with no use in the window.
//
// A count-min sketch with conservative update and forward exponential decay (Cormode et al.,
// "Forward decay", ICDE 2009): a use at tick t adds 2^((t - base) / H) to the key's counters, so a
// key's estimate divided by 2^((now - base) / H) is its use count with each use weighted by
// 2^-(age / H): H is the half-life, in ticks (unique rows planned). Aging is continuous, so no
// periodic halving pass is needed, and the count of a key *as of its last use* (what add() returns)
// stays a valid rank between its uses: comparing keys last used at t_a and t_b by
// t + H * log2(count) orders them exactly as their decayed counts compare now (LRFU's combined
// recency and frequency, Lee et al. 2001). Counters are bfloat16; when the weight of a use would
// pass 2^64 every counter is scaled by 2^-64 (exact) and the base moves 64 half-lives on.
//
// Layout: the 4 counters of a key lie in one 64-byte line of 32 (one in each quarter, chosen by hash
// bits), so an update or a lookup touches one cache line (the blocked layout of Caffeine's sketch).
// About one line (32 counters, 64 bytes) per cache slot: with 8 counters per slot the many rows
// used once or twice (a Zipf tail) inflated the counts of the rows at the edge of the cache (up to
// 2 pp of hit rate in the hit-rate study while this was tuned; the kept figures are in
// results/2026-11-22-hit-rate-study/preview/README.md).
// Deterministic (fp32 adds, bfloat16 rounding, compares). Not thread-safe.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cache/detail/cache_line_hint.hpp"

namespace strata::cache::detail {

class FrequencySketch {
 public:
  static constexpr std::uint32_t kLevelsPerDoubling = 4;  ///< level = floor(4 * log2(count)), count >= 1
  static constexpr std::uint32_t kMaxLevel = 63;          ///< levels are capped here

  /// A sketch for a cache of `slots` rows (one line per slot, rounded up to a power of two, at
  /// least 1024 lines) with a half-life of `half_life` ticks (> 0).
  FrequencySketch(std::int64_t slots, std::uint64_t half_life) : half_life_(std::max<std::uint64_t>(1, half_life)) {
    std::size_t lines = 1024;
    while (lines < static_cast<std::size_t>(std::max<std::int64_t>(slots, 0))) lines *= 2;
    lines_.assign(lines, Line{});
    mask_ = lines - 1;
  }

  /// Starts counting the uses at tick `now` (non-decreasing between calls): sets their weight.
  void start(std::uint64_t now) {
    while (now - base_ >= 64 * half_life_) {
      // Every counter times 2^-64: its exponent down by 64 (flushed to 0 below that).
      for (Line& l : lines_)
        for (std::uint16_t& c : l.c) c = ((c >> 7) & 0xFF) <= 64 ? 0 : static_cast<std::uint16_t>(c - (64u << 7));
      base_ += 64 * half_life_;
    }
    weight_ = static_cast<float>(std::exp2(static_cast<double>(now - base_) / static_cast<double>(half_life_)));
  }

  /// Starts loading the line of hash `h` into the cache (a hint).
  STRATA_CACHE_LINE_HINT void prefetch_line(std::uint64_t h) const noexcept { __builtin_prefetch(&lines_[h & mask_]); }

  /// Counts a use of the key of hash `h` (mix64 of the key) at the tick given to start(); returns
  /// its level: floor(4 * log2(decayed count including this use)), capped at kMaxLevel.
  std::uint32_t add(std::uint64_t h) noexcept {
    Line& l = lines_[h & mask_];
    std::uint16_t* c[4];
    for (std::size_t i = 0; i < 4; ++i) c[i] = &l.c[8 * i + ((h >> (32 + 3 * i)) & 7)];
    // Non-negative bfloat16 values order as their bit patterns.
    const std::uint16_t est = std::min(std::min(*c[0], *c[1]), std::min(*c[2], *c[3]));
    const float now = to_float(est) + weight_;
    const std::uint16_t bits = to_bf16(now);
    for (std::uint16_t* x : c) *x = std::max(*x, bits);  // conservative update: raise only the counters below
    return level(to_float(bits) / weight_);
  }

  /// The level of a decayed count (>= 1): floor(4 * log2(count)) by the float's exponent and top
  /// two mantissa bits (piecewise linear in between powers of two: monotone), capped.
  static std::uint32_t level(float count) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &count, sizeof bits);
    const std::uint32_t l = (bits >> 21) - (127u << 2);  // count >= 1: (exponent - 127) * 4 + 2 mantissa bits
    return count < 1.0f ? 0 : std::min(l, kMaxLevel);
  }

  /// Half-life in ticks.
  std::uint64_t half_life() const noexcept { return half_life_; }

 private:
  // Counters are bfloat16 (the top half of an fp32, rounded to nearest even): 8 bits of exponent
  // cover the 2^64 range between rescalings, and 8 significant bits are plenty for 2 bits of log2
  // (a count stops growing near 2^8-2^9, level 32-36: rows that hot are never near eviction).
  static float to_float(std::uint16_t b) noexcept {
    const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static std::uint16_t to_bf16(float f) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }

  struct alignas(64) Line {
    std::uint16_t c[32] = {};  // a key's 4 counters: one in each quarter of 8
  };
  std::vector<Line> lines_;
  std::size_t mask_ = 0;
  std::uint64_t half_life_;
  std::uint64_t base_ = 0;  // tick of weight 1
  float weight_ = 1.0f;     // weight of a use at the current tick
};

}  // namespace strata::cache::detail
