#include "core/key_batch.hpp"

#include <cmath>
#include <cstring>

#include "core/simd.hpp"

namespace strata {

std::int64_t KeyBatch::total_keys() const noexcept {
  std::int64_t n = 0;
  for (const auto& f : features) n += f.num_keys();
  return n;
}

Status validate(const JaggedKeys& f, const TableSpec& spec, std::int64_t expected_batch) {
  const std::string who = "table '" + spec.name + "'";
  if (f.offsets.empty())
    return Status::invalid_argument(
        who + ": offsets are empty (expected batch+1 = " + std::to_string(expected_batch + 1) + " entries)");
  if (f.batch_size() != expected_batch)
    return Status::invalid_argument(who + ": batch size " + std::to_string(f.batch_size()) + " (offsets of length " +
                                    std::to_string(f.offsets.size()) + ") differs from the batch size " +
                                    std::to_string(expected_batch) + " of the other tables");
  if (f.offsets.front() != 0)
    return Status::invalid_argument(who + ": offsets[0] is " + std::to_string(f.offsets.front()) + " (expected 0)");
  for (std::size_t b = 1; b < f.offsets.size(); ++b) {
    if (f.offsets[b] < f.offsets[b - 1])
      return Status::invalid_argument(who + ": offsets are not monotone: offsets[" + std::to_string(b) +
                                      "] = " + std::to_string(f.offsets[b]) + " < offsets[" + std::to_string(b - 1) +
                                      "] = " + std::to_string(f.offsets[b - 1]));
  }
  if (f.offsets.back() != f.num_keys())
    return Status::invalid_argument(who + ": offsets end at " + std::to_string(f.offsets.back()) +
                                    " (expected the key count " + std::to_string(f.num_keys()) + ")");
  if (!f.weights.empty() && f.weights.size() != f.keys.size())
    return Status::invalid_argument(who + ": " + std::to_string(f.weights.size()) + " weights for " +
                                    std::to_string(f.keys.size()) + " keys (expected none or one per key)");
  // A key k is in range when neither k nor rows - 1 - k has its top bit set (in unsigned
  // arithmetic, so nothing overflows): one OR over all of them says whether every key is. A
  // register of lanes at a time (GCC's vector extension; -O2 does not vectorize the plain loop).
  // Only when some key is bad is the first one looked for, to name it.
  using simd::kU64s;
  const auto last_row = static_cast<std::uint64_t>(spec.rows - 1);
  const std::size_t n = f.keys.size(), n_vec = n / kU64s * kU64s;
  simd::U64s acc{};
  for (std::size_t i = 0; i < n_vec; i += kU64s) {
    simd::U64s v;
    std::memcpy(&v, f.keys.data() + i, sizeof v);
    acc |= v | (last_row - v);
  }
  std::uint64_t bits = 0;
  for (int l = 0; l < kU64s; ++l) bits |= acc[l];
  for (std::size_t i = n_vec; i < n; ++i) {
    const auto k = static_cast<std::uint64_t>(f.keys[i]);
    bits |= k | (last_row - k);
  }
  const bool any = (bits >> 63) != 0;
  for (std::size_t i = 0; any && i < n; ++i) {
    const Key k = f.keys[i];
    if (k < 0 || k >= spec.rows)
      return Status::out_of_range(who + ": key " + std::to_string(k) + " at position " + std::to_string(i) +
                                  " out of range [0, " + std::to_string(spec.rows) + ")");
  }
  for (std::size_t i = 0; i < f.weights.size(); ++i) {
    if (!std::isfinite(f.weights[i]))
      return Status::invalid_argument(who + ": weight at position " + std::to_string(i) + " is not finite");
  }
  return Status::ok();
}

}  // namespace strata
