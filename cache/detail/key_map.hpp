#pragma once
// KeyMap: a fixed-capacity open-addressing hash map from 64-bit cache keys to slots (linear
// probing, backward-shift deletion, so no tombstones). The key->slot index of a slot pool; sized
// at twice the pool's slots, so probes stay short at any fill.

#include <cstdint>
#include <vector>

#include "core/row_math.hpp"

namespace strata::cache::detail {

class KeyMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  /// A map able to hold `max_entries` keys (the key kEmpty is reserved).
  explicit KeyMap(std::int64_t max_entries) {
    std::size_t cap = 16;
    while (cap < static_cast<std::size_t>(max_entries) * 2) cap *= 2;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, -1);
    mask_ = cap - 1;
  }

  /// The value of `k`, or -1.
  std::int64_t find(std::uint64_t k) const noexcept {
    for (std::size_t h = home(k);; h = (h + 1) & mask_) {
      if (keys_[h] == k) return vals_[h];
      if (keys_[h] == kEmpty) return -1;
    }
  }

  /// Inserts a key that is not present.
  void insert(std::uint64_t k, std::int64_t v) noexcept {
    std::size_t h = home(k);
    while (keys_[h] != kEmpty) h = (h + 1) & mask_;
    keys_[h] = k;
    vals_[h] = v;
  }

  /// Removes `k` if present.
  void erase(std::uint64_t k) noexcept {
    std::size_t h = home(k);
    while (keys_[h] != k) {
      if (keys_[h] == kEmpty) return;
      h = (h + 1) & mask_;
    }
    // Backward shift: move later entries of the probe run into the hole when their home allows.
    std::size_t hole = h;
    for (std::size_t j = (hole + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      const std::size_t want = home(keys_[j]);
      if (((j - want) & mask_) >= ((j - hole) & mask_)) {
        keys_[hole] = keys_[j];
        vals_[hole] = vals_[j];
        hole = j;
      }
    }
    keys_[hole] = kEmpty;
    vals_[hole] = -1;
  }

 private:
  std::size_t home(std::uint64_t k) const noexcept { return static_cast<std::size_t>(mix64(k)) & mask_; }
  std::vector<std::uint64_t> keys_;
  std::vector<std::int64_t> vals_;
  std::size_t mask_ = 0;
};

}  // namespace strata::cache::detail
