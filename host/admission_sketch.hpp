#pragma once
// AdmissionSketch: a dynamic table's count of the uses of keys without a row (core/dynamic_spec.hpp,
// admit_after), bounded in memory: a count-min sketch of kDepth rows of 16-bit saturating counters,
// `width` (a power of two, at least the table's capacity and 64) counters a row. A key's estimate is
// the least of its kDepth counters, never below its true count since the last aging. Aging: when
// the uses added since the last halving reach 10 x width, every counter is halved (age(), which the
// caller calls after a batch's adds), so old counts fade. The key index and the reference store
// share this one sketch, so their admissions agree bit for bit.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/row_math.hpp"

namespace strata {

class AdmissionSketch {
 public:
  static constexpr int kDepth = 4;
  static constexpr std::uint32_t kMaxCount = 0xFFFF;

  AdmissionSketch() = default;
  explicit AdmissionSketch(std::int64_t capacity) : width_(width_for(capacity)) {
    counters_.assign(static_cast<std::size_t>(width_) * kDepth, 0);
  }
  /// The width of the sketch of a table of `capacity` rows: a power of two, at least the capacity and 64.
  static std::int64_t width_for(std::int64_t capacity) {
    std::int64_t w = 64;
    while (w < capacity) w *= 2;
    return w;
  }

  std::int64_t width() const noexcept { return width_; }
  /// The least of the key's counters.
  std::uint32_t estimate(std::int64_t key) const {
    std::uint32_t least = kMaxCount;
    for (int d = 0; d < kDepth; ++d) least = std::min<std::uint32_t>(least, counters_[slot(key, d)]);
    return least;
  }
  /// Adds `uses` to each of the key's counters, saturating at kMaxCount.
  void add(std::int64_t key, std::int64_t uses) {
    for (int d = 0; d < kDepth; ++d) {
      std::uint16_t& c = counters_[slot(key, d)];
      c = static_cast<std::uint16_t>(std::min<std::int64_t>(kMaxCount, c + uses));
    }
    added_ += uses;
  }
  /// Halves every counter when the uses added since the last halving reach 10 x width.
  void age() {
    if (added_ < 10 * width_) return;  // the aging threshold
    for (std::uint16_t& c : counters_) c = static_cast<std::uint16_t>(c >> 1);
    added_ = 0;
  }
  /// Its state for checkpoints: the uses added since the last halving (8 bytes), then the counters (2 bytes each, row
  /// by row), little endian.
  std::vector<std::uint8_t> state() const {
    std::vector<std::uint8_t> out;
    out.reserve(static_cast<std::size_t>(state_bytes()));
    for (int b = 0; b < 8; ++b) out.push_back(static_cast<std::uint8_t>(static_cast<std::uint64_t>(added_) >> (8 * b)));
    for (const std::uint16_t c : counters_) {
      out.push_back(static_cast<std::uint8_t>(c & 0xFF));
      out.push_back(static_cast<std::uint8_t>(c >> 8));
    }
    return out;
  }
  std::int64_t state_bytes() const noexcept { return 8 + 2 * static_cast<std::int64_t>(counters_.size()); }
  /// Restores what state() gave: false, nothing changed, when its size is another or its uses added reach the aging
  /// threshold (10 x width: a saved sketch is always below it).
  bool restore_state(const std::vector<std::uint8_t>& bytes) {
    if (static_cast<std::int64_t>(bytes.size()) != state_bytes()) return false;
    std::uint64_t added = 0;
    for (int b = 0; b < 8; ++b) added |= std::uint64_t{bytes[static_cast<std::size_t>(b)]} << (8 * b);
    if (added >= static_cast<std::uint64_t>(10 * width_)) return false;
    for (std::size_t c = 0; c < counters_.size(); ++c)
      counters_[c] = static_cast<std::uint16_t>(bytes[8 + 2 * c] | static_cast<unsigned>(bytes[9 + 2 * c]) << 8);
    added_ = static_cast<std::int64_t>(added);
    return true;
  }
  std::int64_t bytes() const noexcept { return static_cast<std::int64_t>(counters_.size() * sizeof(std::uint16_t)); }

 private:
  std::size_t slot(std::int64_t key, int d) const {
    const std::uint64_t h = mix64(static_cast<std::uint64_t>(key) ^ (0x9E3779B97F4A7C15ull * (d + 1)));
    return static_cast<std::size_t>(d) * static_cast<std::size_t>(width_) +
           static_cast<std::size_t>(h & static_cast<std::uint64_t>(width_ - 1));
  }

  std::int64_t width_ = 0;
  std::int64_t added_ = 0;
  std::vector<std::uint16_t> counters_;
};

}  // namespace strata
