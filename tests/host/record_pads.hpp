#pragma once
// Checks of a host record's pads (issue 31): the half after an odd number of half-size weights, the
// half after an odd number of half-size state elements, and the words after both, all zero as raw
// bits (a -0.0 word or half would pass a float comparison).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "host/row_ref.hpp"

namespace strata::testing {

/// The raw bits of 16-bit element c of the words at p.
inline std::uint16_t half_bits_at(const float* p, std::int64_t c) {
  std::uint16_t h;
  std::memcpy(&h, reinterpret_cast<const unsigned char*>(p) + 2 * c, sizeof h);
  return h;
}

/// Whether every pad bit of row r's record is zero.
inline ::testing::AssertionResult record_pads_are_zero(const RowRef& t, std::int64_t r) {
  if (t.dtype != DType::kF32 && t.dim % 2 != 0 && half_bits_at(t.row(r), t.dim) != 0)
    return ::testing::AssertionFailure() << "row " << r << ": the pad half after the weights is bits "
                                         << half_bits_at(t.row(r), t.dim);
  if (t.state_dtype != DType::kF32 && t.state_dim % 2 != 0 && half_bits_at(t.state(r), t.state_dim) != 0)
    return ::testing::AssertionFailure() << "row " << r << ": the pad half after the state is bits "
                                         << half_bits_at(t.state(r), t.state_dim);
  for (std::int64_t w = t.row_words() + t.state_words(); w < t.stride; ++w) {
    std::uint32_t bits;
    std::memcpy(&bits, t.row(r) + w, sizeof bits);
    if (bits != 0) return ::testing::AssertionFailure() << "row " << r << ": pad word " << w << " is bits " << bits;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
