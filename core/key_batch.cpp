#include "core/key_batch.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "core/simd.hpp"

namespace strata {

std::int64_t KeyBatch::total_keys() const noexcept {
  std::int64_t n = 0;
  for (const auto& f : features) n += f.num_keys();
  return n;
}

namespace {

// Offsets of length batch+1 starting at 0, non-decreasing, ending at the key count.
template <typename T>
Status check_offsets(const std::vector<T>& offsets, const std::string& who, std::int64_t expected_batch,
                     std::int64_t keys) {
  if (offsets.empty())
    return Status::invalid_argument(
        who + ": offsets are empty (expected batch+1 = " + std::to_string(expected_batch + 1) + " entries)");
  if (static_cast<std::int64_t>(offsets.size()) - 1 != expected_batch)
    return Status::invalid_argument(who + ": batch size " + std::to_string(offsets.size() - 1) +
                                    " (offsets of length " + std::to_string(offsets.size()) +
                                    ") differs from the batch size " + std::to_string(expected_batch) +
                                    " of the other tables");
  if (offsets.front() != 0)
    return Status::invalid_argument(who + ": offsets[0] is " + std::to_string(offsets.front()) + " (expected 0)");
  for (std::size_t b = 1; b < offsets.size(); ++b) {
    if (offsets[b] < offsets[b - 1])
      return Status::invalid_argument(who + ": offsets are not monotone: offsets[" + std::to_string(b) +
                                      "] = " + std::to_string(offsets[b]) + " < offsets[" + std::to_string(b - 1) +
                                      "] = " + std::to_string(offsets[b - 1]));
  }
  if (offsets.back() != keys)
    return Status::invalid_argument(who + ": offsets end at " + std::to_string(offsets.back()) +
                                    " (expected the key count " + std::to_string(keys) + ")");
  return Status::ok();
}

// Every key in [0, rows). A key k is in range when neither k nor rows - 1 - k has its top bit set (in unsigned
// arithmetic, so nothing overflows): one OR over all of them says whether every key is. A register of lanes at a
// time (GCC's vector extension; -O2 does not vectorize the plain loop): 64-bit lanes for int64 keys, 32-bit ones for
// int32 keys. Only when some key is bad is the first one looked for, to name it.
template <typename T>
Status check_keys(const std::vector<T>& keys, const std::string& who, std::int64_t rows) {
  const auto last_row = static_cast<std::uint64_t>(rows - 1);
  const std::size_t n = keys.size();
  std::size_t i = 0;
  std::uint64_t bits = 0;
  if constexpr (sizeof(T) == sizeof(std::uint64_t)) {
    using simd::kU64s;
    simd::U64s acc{};
    for (; i + kU64s <= n; i += kU64s) {
      simd::U64s v;
      std::memcpy(&v, keys.data() + i, sizeof v);
      acc |= v | (last_row - v);
    }
    for (int l = 0; l < kU64s; ++l) bits |= acc[l];
  } else {
    // In 32-bit lanes, against the last row an int32 can name: v | (last - v) has bit 31 set exactly when v is
    // negative or past it.
    constexpr int kLanes = static_cast<int>(sizeof(simd::U32s) / sizeof(std::uint32_t));
    const auto last32 = static_cast<std::uint32_t>(std::min<std::int64_t>(rows - 1, INT32_MAX));
    simd::U32s acc{};
    for (; i + kLanes <= n; i += kLanes) {
      simd::U32s v;
      std::memcpy(&v, keys.data() + i, sizeof v);
      acc |= v | (last32 - v);
    }
    std::uint32_t lanes = 0;
    for (int l = 0; l < kLanes; ++l) lanes |= acc[l];
    if (lanes >> 31) bits |= std::uint64_t{1} << 63;
  }
  for (; i < n; ++i) {
    const auto k = static_cast<std::uint64_t>(static_cast<std::int64_t>(keys[i]));
    bits |= k | (last_row - k);
  }
  const bool any = (bits >> 63) != 0;
  for (std::size_t j = 0; any && j < n; ++j) {
    const std::int64_t k = keys[j];
    if (k < 0 || k >= rows)
      return Status::out_of_range(who + ": key " + std::to_string(k) + " at position " + std::to_string(j) +
                                  " out of range [0, " + std::to_string(rows) + ")");
  }
  return Status::ok();
}

}  // namespace

Status validate(const JaggedKeys& f, const TableSpec& spec, std::int64_t expected_batch, bool any_key) {
  const std::string who = "table '" + spec.name + "'";
  if (!f.keys.empty() && !f.keys32.empty())
    return Status::invalid_argument(who + ": " + std::to_string(f.keys.size()) + " int64 keys and " +
                                    std::to_string(f.keys32.size()) +
                                    " int32 keys (expected one key width per feature: keys or keys32)");
  if (!f.offsets.empty() && !f.offsets32.empty())
    return Status::invalid_argument(who +
                                    ": int64 offsets and int32 offsets (expected one width per feature: offsets "
                                    "or offsets32)");
  const std::int64_t keys = f.num_keys();
  STRATA_RETURN_IF_ERROR(f.offsets32.empty() ? check_offsets(f.offsets, who, expected_batch, keys)
                                             : check_offsets(f.offsets32, who, expected_batch, keys));
  if (!f.weights.empty() && static_cast<std::int64_t>(f.weights.size()) != keys)
    return Status::invalid_argument(who + ": " + std::to_string(f.weights.size()) + " weights for " +
                                    std::to_string(keys) + " keys (expected none or one per key)");
  if (!any_key)
    STRATA_RETURN_IF_ERROR(f.keys32.empty() ? check_keys(f.keys, who, spec.rows)
                                            : check_keys(f.keys32, who, spec.rows));
  for (std::size_t i = 0; i < f.weights.size(); ++i) {
    if (!std::isfinite(f.weights[i]))
      return Status::invalid_argument(who + ": weight at position " + std::to_string(i) + " is not finite");
  }
  return Status::ok();
}

}  // namespace strata
